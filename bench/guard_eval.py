#!/usr/bin/env python
"""Guard evaluation benchmark: ``python bench/guard_eval.py`` (bench/README.md).

Three workloads, each one set of guards checked on a passing input, measured in one run against:

* ``tripwire``  -- ``GuardSet.check(f_locals)``, the engine.
* ``py-fn``     -- the same guards as a generated Python guard function in the style of Dynamo's
                   2024 guards.py (``if not (___check_type_id(L['m'].a0, 9471...)): return False``),
                   helpers as Python lambdas, no common-subexpression pass.
* ``py-fn+``    -- the same, with Dynamo's CSE pass (shared source prefixes hoisted into locals) and
                   C helpers (``___check_type_id`` as a C function): the strongest 2024-style function.
* ``C floor``   -- the same checks hand-written against the CPython C API (``_floor``,
                   bench/floor.c, built by bench/floor_build.py): fetch each value once, compare,
                   nothing else.
* ``torch``     -- torch's C++ guard manager (``torch.compile(fn, backend="eager")``) on an
                   equivalent function, all guards Dynamo installs (ambient state, the tensor input).
* ``torch-same``-- the same function compiled with a ``guard_filter_fn`` that keeps only the guards on
                   the sources tripwire guards (drops ambient/global-state guards and the tensor input).
* ``no-op``     -- ``def f(L): return True``: the cost of calling a Python function, the anchor.

See bench/README.md for what each column measures.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import platform
import re
import sys
import textwrap
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import _callgrind
import floor_build
from contenders import Contender, fmt_ns, measure, ratio_columns, table
from tripwire.builder import GuardBuilder
from tripwire.catalogue import GuardKind, GuardSpec, resolve
from tripwire.source import RootKind, Source, StepKind

# The test oracle (tests/oracle/reference.py, not part of the package) checks each workload's
# verdicts; a checkout's bench/ finds it beside tests/ (pytest puts it on the path itself).
_ORACLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests", "oracle")
if _ORACLE not in sys.path:
    sys.path.append(_ORACLE)
reference = importlib.import_module("reference")

__all__ = [
    "Workload",
    "build_workloads",
    "floor_plan",
    "main",
    "python_guard_fn",
    "python_guard_source",
]

WORKLOAD_NAMES = ("W1", "W2", "W3")


# =================================================================================================
# Workloads
# =================================================================================================
@dataclass
class Workload:
    """One benchmark case: the guards (built with GuardBuilder), a passing and a failing input."""

    name: str
    title: str
    what: str  # exactly which guards, in words
    builder: GuardBuilder
    f_locals: dict  # passing input (the example the guards were built from)
    f_locals_fail: dict  # one value changed near the end of the guard order
    torch_factory: Callable[..., Any] | None = (
        None  # (filtered: bool) -> (check, f_locals, f_locals_fail, gm)
    )
    extra: dict = field(default_factory=dict)


# -- W1: one object, 50 attributes of mixed types ------------------------------------------------------
class W1User:
    """A user-defined object stored in an attribute (TYPE_MATCH only)."""

    def __init__(self, k: int) -> None:
        self.k = k


class W1Config:
    """A plain object with 50 instance attributes (generic getattr, instance __dict__)."""


# One period of 10 attribute kinds; 50 attributes = 5 periods.
_W1_KINDS = ("int", "float", "str", "none", "bool", "tuple", "list", "user", "int", "str")
_W1_SCALARS = ("int", "float", "str", "none", "bool")


def _w1_value(kind: str, i: int) -> Any:
    if kind == "int":
        return 100 + i
    if kind == "float":
        return 0.25 + i
    if kind == "str":
        return f"mode{i}"
    if kind == "none":
        return None
    if kind == "bool":
        return i % 2 == 0
    if kind == "tuple":
        return (i, i + 1)
    if kind == "list":
        return [i, i + 1, i + 2]
    return W1User(i)


def _w1_object(cls: type, n: int = 50) -> Any:
    m = cls()
    for i in range(n):
        setattr(m, f"a{i}", _w1_value(_W1_KINDS[i % 10], i))
    return m


def build_w1(with_torch: bool) -> Workload:
    m = _w1_object(W1Config)
    f_locals = {"m": m, "x": 1.0}
    b = GuardBuilder(f_locals)
    b.type_match("L['m']")
    for i in range(50):
        src = f"L['m'].a{i}"
        b.type_match(src)
        if _W1_KINDS[i % 10] in _W1_SCALARS:
            b.equals(src)
    m_fail = _w1_object(W1Config)
    m_fail.a48 = 100 + 48 + 1  # the last int attribute: every earlier guard runs first
    n_eq = sum(1 for i in range(50) if _W1_KINDS[i % 10] in _W1_SCALARS)
    what = (
        f"TYPE_MATCH on L['m'] and on each of its 50 attributes L['m'].a0..a49, plus EQUALS_MATCH on "
        f"the {n_eq} scalar ones (int, float, str, None, bool); the other {50 - n_eq} (tuple, list, user "
        f"object) are TYPE_MATCH only: {1 + 50 + n_eq} guards on 51 sources"
    )
    return Workload(
        "W1",
        "one object with 50 mixed-type attributes",
        what,
        b,
        f_locals,
        {"m": m_fail, "x": 1.0},
        torch_factory=_torch_w1 if with_torch else None,
    )


# -- W2: an nn.Module-like tree without torch ------------------------------------------------------------
class Module:
    """The parts of torch.nn.Module that guards see: _parameters/_buffers/_modules dicts in the
    instance __dict__, ``training``, and a ``__getattr__`` that finds submodules (so, like
    nn.Module, the type does not use the plain generic getattr slot)."""

    def __init__(self) -> None:
        self.training = True
        self._parameters: dict[str, Any] = {}
        self._buffers: dict[str, Any] = {}
        self._modules: dict[str, Module] = {}

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for bucket in ("_parameters", "_buffers", "_modules"):
            if bucket in d and name in d[bucket]:
                return d[bucket][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class Parameter:
    """Stands in for a parameter tensor (not guarded beyond the _parameters keys)."""

    def __init__(self, *shape: int) -> None:
        self.shape = shape


def relu(x: Any) -> Any:
    return x


def gelu(x: Any) -> Any:
    return x


class Layer(Module):
    def __init__(self, i: int) -> None:
        super().__init__()
        self._parameters["weight"] = Parameter(16 + i, 16 + i)
        self._parameters["bias"] = Parameter(16 + i)
        self._buffers["running_mean"] = Parameter(16 + i)
        # 8 config attributes
        self.in_features = 16 + i
        self.out_features = 16 + i + 1
        self.use_bias = i % 2 == 0
        self.scale = 0.5
        self.act = "relu" if i % 3 else "gelu"
        self.act_fn = relu if i % 3 else gelu
        self.dims = [16 + i, 16 + i + 1]
        self.cfg = {"mode": "fast", "k": i}


class Net(Module):
    def __init__(self, n_layers: int = 12) -> None:
        super().__init__()
        for i in range(n_layers):
            self._modules[f"layer{i}"] = Layer(i)
        self.depth = n_layers
        self.eps = 1e-5


W2_LAYERS = 12


def _w2_guards(b: GuardBuilder, n_layers: int) -> None:
    s = "L['self']"
    b.type_match(s)
    b.equals(f"{s}.training")
    b.equals(f"{s}.depth")
    b.equals(f"{s}.eps")
    b.type_match(f"{s}._modules")
    b.dict_keys(f"{s}._modules")
    b.type_match(f"{s}._parameters")
    b.dict_keys(f"{s}._parameters")
    for i in range(n_layers):
        ly = f"{s}._modules['layer{i}']"
        b.type_match(ly)
        b.dict_contains(f"{ly}.__dict__", "forward", present=False)
        b.equals(f"{ly}.training")
        b.type_match(f"{ly}._modules")
        b.dict_keys(f"{ly}._modules")
        b.type_match(f"{ly}._parameters")
        b.dict_keys(f"{ly}._parameters")
        b.equals(f"{ly}.in_features")
        b.equals(f"{ly}.out_features")
        b.equals(f"{ly}.use_bias")
        b.equals(f"{ly}.scale")
        b.equals(f"{ly}.act")
        b.id_match(f"{ly}.act_fn")
        b.type_match(f"{ly}.dims")
        b.length(f"{ly}.dims")
        b.equals(f"{ly}.dims[0]")
        b.equals(f"{ly}.dims[1]")
        b.type_match(f"{ly}.cfg")
        b.dict_keys(f"{ly}.cfg")
        b.equals(f"{ly}.cfg['mode']")
        b.equals(f"{ly}.cfg['k']")
    b.type_match("L['x']")


def build_w2(with_torch: bool) -> Workload:
    net = Net(W2_LAYERS)
    f_locals = {"self": net, "x": 1.0}
    b = GuardBuilder(f_locals)
    _w2_guards(b, W2_LAYERS)
    net_fail = Net(W2_LAYERS)
    net_fail._modules[f"layer{W2_LAYERS - 1}"].cfg["k"] = -1  # the last layer's last guard
    what = (
        "Dynamo's guards on `self` for a 12-layer module tree, sources L['self']._modules['layerI'].attr: "
        "root: TYPE_MATCH self, EQUALS training/depth/eps, TYPE_MATCH+DICT_KEYS on _modules and "
        "_parameters; per layer (21): TYPE_MATCH layer, DICT_CONTAINS 'forward' not in layer.__dict__, "
        "EQUALS training/in_features/out_features/use_bias/scale/act, ID_MATCH act_fn, "
        "TYPE_MATCH+DICT_KEYS _modules and _parameters, TYPE_MATCH+LENGTH dims + EQUALS dims[0], dims[1], "
        "TYPE_MATCH+DICT_KEYS cfg + EQUALS cfg['mode'], cfg['k']; TYPE_MATCH on the input x"
    )
    return Workload(
        "W2",
        f"nn.Module-like tree, {W2_LAYERS} layers (no torch)",
        what,
        b,
        f_locals,
        {"self": net_fail, "x": 1.0},
        torch_factory=_torch_w2 if with_torch else None,
    )


# -- W3: a function of 20 mixed arguments -----------------------------------------------------------------
W3_ARGS: tuple[Any, ...] = (
    3,
    0.5,
    "relu",
    None,
    True,
    (1, 2, 3),
    [4, 5],
    {"lr": 0.1, "steps": 10},
    128,
    "mean",
    False,
    1e-5,
    ("a", "b"),
    [1.0, 2.0, 3.0],
    {"mode": "train", "k": 3, "flag": True},
    -1,
    None,
    "cpu",
    (64, 64),
    0,
)


def _w3_locals(args: tuple) -> dict:
    import copy

    # Interned names, as a frame's f_locals keys are (the code object's co_varnames).
    return {sys.intern(f"a{i}"): copy.deepcopy(v) for i, v in enumerate(args)}


def build_w3(with_torch: bool) -> Workload:
    f_locals = _w3_locals(W3_ARGS)
    b = GuardBuilder(f_locals)
    for i, v in enumerate(W3_ARGS):
        src = f"L['a{i}']"
        if type(v) in (tuple, list):
            b.type_match(src)
            b.length(src)
            for j in range(len(v)):
                b.equals(f"{src}[{j}]")
        elif type(v) is dict:
            b.type_match(src)
            b.dict_keys(src)
            for k in v:
                b.equals(f"{src}[{k!r}]")
        else:
            b.equals(src)
    fail = _w3_locals(W3_ARGS)
    fail["a19"] = 1
    what = (
        "Dynamo static mode on f(a0..a19): EQUALS_MATCH on each of the 13 scalar arguments (int, float, "
        "str, bool, None); TYPE_MATCH+LENGTH on the 5 tuples/lists plus EQUALS_MATCH on each element; "
        "TYPE_MATCH+DICT_KEYS on the 2 dicts plus EQUALS_MATCH on each value"
    )
    return Workload(
        "W3",
        "function of 20 mixed scalar/container arguments",
        what,
        b,
        f_locals,
        fail,
        torch_factory=_torch_w3 if with_torch else None,
    )


BUILDERS: dict[str, Callable[[bool], Workload]] = {"W1": build_w1, "W2": build_w2, "W3": build_w3}


def build_workloads(names=WORKLOAD_NAMES, with_torch: bool = False) -> list[Workload]:
    return [BUILDERS[n](with_torch) for n in names]


# =================================================================================================
# (a) The generated Python guard function, Dynamo 2024 style
# =================================================================================================
def _check_type_id(o, i):  # the shape of Dynamo's helper; replaced by a lambda below (see brief)
    return id(type(o)) == i


_PY_LITERAL_TYPES = (int, str, bool, type(None), bytes)


class _PyGen:
    """Turns GuardSpecs into `if not (...): return False` lines."""

    def __init__(self, c_helpers: bool) -> None:
        self.c_helpers = c_helpers
        self.closure: dict[str, Any] = {}
        if c_helpers:
            _floor = floor_build.load()
            self.closure["___check_type_id"] = _floor.check_type_id
            self.closure["___check_obj_id"] = _floor.check_obj_id
        else:
            self.closure["___check_type_id"] = lambda o, i: id(type(o)) == i
            self.closure["___check_obj_id"] = lambda o, i: id(o) == i
            self.closure["___dict_contains"] = lambda a, b: a in b
        self.closure["___isnan"] = math.isnan

    def const(self, c: Any) -> str:
        if type(c) in _PY_LITERAL_TYPES or (type(c) is float and math.isfinite(c)):
            return repr(c)
        if type(c) in (tuple, list) and all(self._is_literal(x) for x in c):
            return repr(c)
        name = f"___const_{len(self.closure)}"
        self.closure[name] = c
        return name

    def _is_literal(self, c: Any) -> bool:
        return type(c) in _PY_LITERAL_TYPES or (type(c) is float and math.isfinite(c))

    def expr(self, spec: GuardSpec, ref: str) -> str:
        k = spec.kind
        a = tuple(resolve(x) for x in spec.args)
        if k is GuardKind.TYPE_MATCH:
            return f"___check_type_id({ref}, {id(a[0])})"
        if k is GuardKind.ID_MATCH:
            return f"___check_obj_id({ref}, {id(a[0])})"
        if k is GuardKind.NONE:
            return f"{ref} is None"
        if k is GuardKind.NOT_NONE:
            return f"{ref} is not None"
        if k is GuardKind.TRUE:
            return f"{ref} is True"
        if k is GuardKind.FALSE:
            return f"{ref} is False"
        if k is GuardKind.EQUALS_MATCH:
            c = a[0]
            parts = [f"___check_type_id({ref}, {id(type(c))})"]
            if type(c) in (tuple, list):  # Dynamo: element types too, then ==
                parts.append(f"len({ref}) == {len(c)}")
                parts += [f"___check_type_id({ref}[{i}], {id(type(x))})" for i, x in enumerate(c)]
            if type(c) is float and math.isnan(c):
                parts.append(f"___isnan({ref})")
            elif c is None or type(c) is bool:
                parts.append(f"{ref} is {c!r}")
            else:
                parts.append(f"{ref} == {self.const(c)}")
            return " and ".join(parts)
        if k is GuardKind.LENGTH:
            return f"len({ref}) == {a[0]}"
        if k is GuardKind.DICT_KEYS:
            keys, ordered = a
            if ordered:
                return f"list(dict.keys({ref})) == {self.const(list(keys))}"
            return f"set(dict.keys({ref})) == {self.const(set(keys))}"
        if k is GuardKind.DICT_CONTAINS:
            key, present = a
            if self.c_helpers:
                return f"{self.const(key)} {'in' if present else 'not in'} {ref}"
            neg = "" if present else "not "
            return f"{neg}___dict_contains({self.const(key)}, {ref})"
        if k is GuardKind.HASATTR:
            name, present = a
            return f"{'' if present else 'not '}hasattr({ref}, {name!r})"
        raise NotImplementedError(f"py-fn generator: {k.name} is not used by the benchmark workloads")


def _uses_of(spec: GuardSpec) -> int:
    """How many times the generated expression spells the guard's source (for the CSE count)."""
    if spec.kind is GuardKind.EQUALS_MATCH:
        c = resolve(spec.args[0])
        n = 2
        if type(c) in (tuple, list):
            n += 1 + len(c)
        return n
    return 1


def python_guard_source(
    specs: list[GuardSpec], *, cse: bool = False, c_helpers: bool = False
) -> tuple[str, dict]:
    """Source text of a Dynamo-2024-style guard function for ``specs`` and its closure values.

    ``cse=True`` hoists every source prefix spelled more than once into a local (``_var0 = ...``),
    as Dynamo's PyExprCSEPass did; otherwise each guard spells its full source.
    """
    gen = _PyGen(c_helpers)
    ordered = sorted(specs, key=lambda s: s.index)
    lines: list[str] = []
    hoisted: dict[Source, str] = {}
    if cse:
        counts: dict[Source, int] = {}
        for s in ordered:
            if s.source is None:
                continue
            n = _uses_of(s)
            for p in s.source.prefixes():
                counts[p] = counts.get(p, 0) + n
        candidates = {p for p, n in counts.items() if n > 1}
    assigned: set[Source] = set()

    def render(src: Source) -> str:
        # Longest hoisted (already assigned) prefix, then the remaining steps.
        best, base = None, None
        for i, p in enumerate(src.prefixes()):
            if p in assigned:
                best, base = i, hoisted[p]
        if best is None:
            return str(src)
        text = base
        for st in src.steps[best:]:
            text = st.render(text)
        return text

    for s in ordered:
        if s.source is None:
            raise NotImplementedError("py-fn generator: sourceless guards are not used by the workloads")
        if cse:
            for p in s.source.prefixes():
                if p in candidates and p not in assigned:
                    name = f"_var{len(hoisted)}"
                    lines.append(f"{name} = {render(p)}")
                    hoisted[p] = name
                    assigned.add(p)
        lines.append(f"if not ({gen.expr(s, render(s.source))}):\n    return False")
    body = "\n".join(lines) + "\nreturn True"
    args = ", ".join(gen.closure)
    src = (
        f"def ___make_guard_fn({args}):\n"
        f"    def guard(L):\n{textwrap.indent(body, ' ' * 8)}\n"
        f"    return guard\n"
    )
    return src, gen.closure


def python_guard_fn(
    specs: list[GuardSpec], *, cse: bool = False, c_helpers: bool = False
) -> Callable[[dict], bool]:
    """The generated guard function itself (``guard(L) -> bool``); ``.source`` holds its text."""
    src, closure = python_guard_source(specs, cse=cse, c_helpers=c_helpers)
    ns: dict[str, Any] = {}
    exec(compile(src, "<tripwire-bench-guard>", "exec"), ns)
    fn = ns["___make_guard_fn"](**closure)
    fn.source = src
    fn.guard_count = len(specs)
    return fn


# =================================================================================================
# (b) The C floor plan
# =================================================================================================
def floor_plan(specs: list[GuardSpec], f_locals: dict):
    """A ``_floor.Plan`` doing the same checks as ``specs``: each distinct source fetched
    once into a register at its first use (as a person writing straight-line C would keep it in a
    local), then compared. The example ``f_locals`` tells the plan which containers are dicts and
    which are lists (a person writing the code knows)."""
    F = floor_build.load()

    regs: dict[Source, int] = {}
    insns: list[tuple] = []

    def reg_of(src: Source) -> int:
        r = regs.get(src)
        if r is not None:
            return r
        r = len(regs)
        if not src.steps:
            if src.root is not RootKind.LOCAL:
                raise NotImplementedError("floor: only L[...] roots")
            regs[src] = r
            insns.append((F.OP_LOCAL, r, 0, sys.intern(src.name), 0))
            return r
        parent = src.parent
        pr = reg_of(parent)
        regs[src] = r
        st = src.steps[-1]
        if st.kind is StepKind.ATTR:
            insns.append((F.OP_ATTR, r, pr, sys.intern(st.arg), 0))
        elif st.kind in (StepKind.ITEM, StepKind.DICT_ITEM):
            pv = reference.fetch(parent, f_locals)
            if type(pv) is dict or st.kind is StepKind.DICT_ITEM:
                key = sys.intern(st.arg) if type(st.arg) is str else st.arg
                insns.append((F.OP_DICTGET, r, pr, key, 0))
            elif type(pv) in (list, tuple) and type(st.arg) is int and st.arg >= 0:
                insns.append((F.OP_SEQGET, r, pr, None, st.arg))
            else:
                insns.append((F.OP_GETITEM, r, pr, st.arg, 0))
        elif st.kind is StepKind.DICT:
            insns.append((F.OP_INSTDICT, r, pr, None, 0))
        else:
            raise NotImplementedError(f"floor: step {st.kind.name}")
        return r

    for s in sorted(specs, key=lambda s: s.index):
        r = reg_of(s.source)
        k = s.kind
        a = tuple(resolve(x) for x in s.args)
        if k is GuardKind.TYPE_MATCH:
            insns.append((F.OP_TYPE, 0, r, a[0], 0))
        elif k is GuardKind.ID_MATCH:
            insns.append((F.OP_ID, 0, r, a[0], 0))
        elif k in (GuardKind.NONE, GuardKind.TRUE, GuardKind.FALSE):
            obj = {GuardKind.NONE: None, GuardKind.TRUE: True, GuardKind.FALSE: False}[k]
            insns.append((F.OP_ID, 0, r, obj, 0))
        elif k is GuardKind.EQUALS_MATCH:
            if type(a[0]) not in (int, float, str, bool, type(None), bytes):
                raise NotImplementedError("floor: EQUALS_MATCH on scalars only")
            insns.append((F.OP_EQ, 0, r, a[0], 0))
        elif k is GuardKind.LENGTH:
            insns.append((F.OP_LEN, 0, r, None, a[0]))
        elif k is GuardKind.DICT_KEYS:
            if not a[1]:
                raise NotImplementedError("floor: ordered DICT_KEYS only")
            insns.append((F.OP_KEYS, 0, r, tuple(a[0]), 0))
        elif k is GuardKind.DICT_CONTAINS:
            insns.append((F.OP_CONTAINS, 0, r, a[0], int(a[1])))
        elif k is GuardKind.HASATTR:
            insns.append((F.OP_HASATTR, 0, r, sys.intern(a[0]), int(a[1])))
        elif k is GuardKind.ARRAY_MATCH:
            import struct

            e = a[1]
            any_ = -(1 << 63)
            dims = [any_ if x is None else x for x in e.sizes] + [any_ if x is None else x for x in e.strides]
            flags = (1 if e.c_contiguous else 0) | (2 if e.f_contiguous else 0) | (4 if e.aligned else 0)
            packed = struct.pack(f"<{3 + len(dims)}q", e.ndim, flags, int(e.writeable), *dims)
            dtype = reference.fetch(
                s.source, f_locals
            ).dtype  # the example's dtype object: compared by pointer
            insns.append((F.OP_ARRAY, 0, r, (a[0], dtype, packed), 0))
        else:
            raise NotImplementedError(f"floor: {k.name}")
    plan = F.Plan(insns)
    if plan.check_count != len(specs):
        raise AssertionError(f"floor plan has {plan.check_count} checks for {len(specs)} guards")
    return plan


# =================================================================================================
# (c) torch 2.13's C++ guard manager on equivalent functions
# =================================================================================================
_TORCH_NS_COUNTER = [0]


def _torch_exec(src: str, name: str, extra: dict | None = None) -> Any:
    """Define ``name`` from source text in a fresh module namespace (a new code object each time,
    so two compiles never share a cache entry)."""
    _TORCH_NS_COUNTER[0] += 1
    modname = f"tripwire_bench_torch_{_TORCH_NS_COUNTER[0]}"
    mod = types.ModuleType(modname)
    mod.__dict__.update(extra or {})
    sys.modules[modname] = mod
    exec(compile(src, f"<{modname}>", "exec"), mod.__dict__)
    return mod.__dict__[name]


def _same_sources_filter(keep_roots: set[str]):
    """guard_filter_fn keeping only guards on local sources rooted at ``keep_roots``."""

    def filt(entries):
        out = []
        for e in entries:
            name = getattr(e, "name", "") or ""
            m = re.match(r"(?:L\[')?([A-Za-z_]\w*)", name)
            root = m.group(1) if m else ""
            out.append(bool(name) and not getattr(e, "is_global", False) and root in keep_roots)
        return out

    return filt


def _torch_compile_and_get(fn: Callable, args: tuple, code, filtered: bool, keep_roots: set[str]):
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    opts = {"guard_filter_fn": _same_sources_filter(keep_roots)} if filtered else None
    cfn = torch.compile(fn, backend="eager", options=opts) if opts else torch.compile(fn, backend="eager")
    cfn(*args)
    entries = _debug_get_cache_entry_list(code)
    if len(entries) != 1:
        raise RuntimeError(f"expected one cache entry for {code.co_name}, found {len(entries)}")
    return entries[0].guard_manager


def _torch_w1(filtered: bool):
    import torch

    lines = ["def w1_fn(x, m):", "    y = x + 1"]
    for i in range(50):
        kind = _W1_KINDS[i % 10]
        v = _w1_value(kind, i)
        if kind == "none":
            lines.append(f"    if m.a{i} is None: y = y + 1")
        elif kind == "bool":
            lines.append(f"    if m.a{i}: y = y + 1")
        elif kind in ("int", "float", "str"):
            lines.append(f"    if m.a{i} == {v!r}: y = y + 1")
        else:  # tuple, list, user object: realise the value (TYPE_MATCH, + LENGTH for sequences)
            lines.append(f"    if m.a{i} is not None: y = y + 1")
    lines.append("    return y")
    fn = _torch_exec("\n".join(lines), "w1_fn")
    m = _w1_object(W1Config)
    x = torch.ones(2)
    gm = _torch_compile_and_get(fn, (x, m), fn.__code__, filtered, {"m"})
    m_fail = _w1_object(W1Config)
    m_fail.a48 = 100 + 48 + 1
    return gm, {"x": x, "m": m}, {"x": x, "m": m_fail}


_TORCH_W2_SRC = """
import torch
from torch import nn

def relu(x):
    return x * 2

def gelu(x):
    return x * 3

class Layer(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2))
        self.bias = nn.Parameter(torch.zeros(2))
        self.register_buffer("running_mean", torch.zeros(2))
        self.in_features = 16 + i
        self.out_features = 16 + i + 1
        self.use_bias = i % 2 == 0
        self.scale = 0.5
        self.act = "relu" if i % 3 else "gelu"
        self.act_fn = relu if i % 3 else gelu
        self.dims = [16 + i, 16 + i + 1]
        self.cfg = {"mode": "fast", "k": i}

    def forward(self, x):
        if self.training:
            x = x + 1
        if self.use_bias:
            x = x + 1
        x = x + self.in_features + self.out_features
        if self.scale == 0.5:
            x = x * 2
        if self.act == "relu":
            x = x - 1
        x = self.act_fn(x)
        x = x + self.dims[0] + self.dims[1]
        # Iterating the keys makes Dynamo guard them (a DictGuardManager: exact type, length, each
        # key in order) -- torch's form of DICT_KEYS on these dicts.
        for k in self._modules.keys():
            x = x + 1
        for k in self._parameters.keys():
            x = x + 1
        for k in self.cfg.keys():
            x = x + 1
        if self.cfg["mode"] == "fast":
            x = x + self.cfg["k"]
        return x

class Net(nn.Module):
    def __init__(self, n_layers):
        super().__init__()
        for i in range(n_layers):
            self.add_module(f"layer{i}", Layer(i))
        self.depth = n_layers
        self.eps = 1e-5

    def forward(self, x):
        if self.training and self.depth > 0 and self.eps < 1:
            x = x + 1
        for k in self._modules.keys():
            x = x + 1
        for k in self._parameters.keys():
            x = x + 1
__CALLS__
        return x
"""


def _torch_w2(filtered: bool):
    import torch

    calls = "\n".join(f"        x = self.layer{i}(x)" for i in range(W2_LAYERS))
    net_cls = _torch_exec(_TORCH_W2_SRC.replace("__CALLS__", calls), "Net")
    net = net_cls(W2_LAYERS)
    x = torch.ones(2)
    gm = _torch_compile_and_get(net, (x,), net_cls.forward.__code__, filtered, {"self"})
    net_fail = net_cls(W2_LAYERS)
    getattr(net_fail, f"layer{W2_LAYERS - 1}").cfg["k"] = -1
    return gm, {"self": net, "x": x}, {"self": net_fail, "x": x}


def _torch_w3(filtered: bool):
    import torch

    params = ", ".join(f"a{i}" for i in range(len(W3_ARGS)))
    lines = [f"def w3_fn(x, {params}):", "    y = x + 1"]
    for i, v in enumerate(W3_ARGS):
        a = f"a{i}"
        if v is None:
            lines.append(f"    if {a} is None: y = y + 1")
        elif type(v) is bool:
            lines.append(f"    if {a}: y = y + 1")
        elif type(v) in (int, float, str):
            lines.append(f"    if {a} == {v!r}: y = y + 1")
        elif type(v) in (tuple, list):
            for j, e in enumerate(v):
                lines.append(f"    if {a}[{j}] == {e!r}: y = y + 1")
        else:  # dict: iterating the keys makes Dynamo guard them (DictGuardManager: type, length, keys)
            lines.append(f"    for k in {a}.keys(): y = y + 1")
            for k, e in v.items():
                lines.append(f"    if {a}[{k!r}] == {e!r}: y = y + 1")
    lines.append("    return y")
    fn = _torch_exec("\n".join(lines), "w3_fn")
    x = torch.ones(2)
    args = _w3_locals(W3_ARGS)
    gm = _torch_compile_and_get(fn, (x, *args.values()), fn.__code__, filtered, set(args))
    fail = _w3_locals(W3_ARGS)
    fail["a19"] = 1
    return gm, {"x": x, **args}, {"x": x, **fail}


def torch_guard_count(gm) -> dict[str, int]:
    """Leaf guards in a torch guard manager, by walking the tree (``get_leaf_guards`` per manager,
    ``get_child_managers`` for accessors, plus epilogue lambda guards). ``code_parts`` counts the
    printed lines (one leaf guard object can print several, e.g. DIMENSION_DYNAMIC_MARKING)."""
    out = {
        "leaf": 0,
        "ambient": 0,
        "global": 0,
        "local": 0,
        "code_parts": 0,
        "managers": 0,
        "dict_managers": 0,
    }

    def walk(mgr, where: str) -> None:
        out["managers"] += 1
        if type(mgr).__name__ == "DictGuardManager":
            out["dict_managers"] += 1  # checks exact dict type + length itself, no leaf guard for it
        for lg in mgr.get_leaf_guards():
            out["leaf"] += 1
            out[where] += 1
            try:
                out["code_parts"] += len(lg.verbose_code_parts())
            except Exception:  # noqa: BLE001 - older/newer bindings
                out["code_parts"] += 1
        children = list(mgr.get_child_managers())
        if hasattr(mgr, "get_key_value_managers"):  # DictGuardManager: (key, value) managers per position
            for pair in mgr.get_key_value_managers().values():
                children += [m for m in pair if m is not None]
        for child in children:
            src = ""
            try:
                src = child.get_source()
            except Exception:  # noqa: BLE001
                pass
            w = where
            if where == "ambient":
                w = "global" if src.startswith("G") else "local"
            walk(child, w)

    root = gm.root
    walk(root, "ambient")
    try:
        n_epi = len(root.get_epilogue_lambda_guards())
    except Exception:  # noqa: BLE001
        n_epi = 0
    out["leaf"] += n_epi
    out["ambient"] += n_epi
    out["managers"] -= 1  # the root
    return out


# =================================================================================================
# Timing
# =================================================================================================
# Contender and measure: bench/contenders.py (shared with real_models.py and tensor_guards.py).


# =================================================================================================
# Running one workload
# =================================================================================================
def _noop(L):
    return True


def _correctness(name: str, check: Callable, ok_locals: Any, bad_locals: Any) -> None:
    got_ok, got_bad = check(ok_locals), check(bad_locals)
    if got_ok is not True or got_bad is not False:
        raise AssertionError(
            f"{name}: passing input -> {got_ok!r}, failing input -> {got_bad!r} (want True, False)"
        )


def prepare(w: Workload, *, torch_ok: bool, log, only: set[str] | None = None) -> dict:
    """Build every contender for workload ``w`` and assert each answers True on the passing input
    and False on the failing one (outside any timing). ``only`` limits which are built."""
    want = (lambda name: True) if only is None else (lambda name: name in only)
    specs_built = w.builder.guards
    gs = w.builder.build()  # timed
    gs_probe = w.builder.build()  # used for the pass/fail assertions (keeps `gs`'s fail counters clean)
    specs = list(gs.guards)
    assert len(specs) == len(gs) == len(specs_built)
    if (
        reference.check(specs_built, w.f_locals, w.builder.f_globals) is not True
        or reference.check(specs_built, w.f_locals_fail, w.builder.f_globals) is not False
    ):
        raise AssertionError(f"{w.name}: the reference evaluator disagrees with the workload's inputs")
    _correctness(f"{w.name} tripwire", gs_probe.check, w.f_locals, w.f_locals_fail)

    n = len(gs)
    for _ in range(3):  # warm: inline caches, hints and the skip's claims, as in steady use
        gs.check(w.f_locals)
    contenders = [
        Contender(
            "tripwire",
            gs.check,
            w.f_locals,
            n,
            f"{gs.node_count} sources; fast path {gs._fast_guard_count}/{n} ({100 * gs.fast_path_fraction:.1f}%)"
            f", {gs._last_skipped_guards} skipped",
        )
    ]
    pyfn = python_guard_fn(specs)
    pyfn_plus = python_guard_fn(specs, cse=True, c_helpers=True)
    pyfn_source, pyfn_plus_source = pyfn.source, pyfn_plus.source
    _correctness(f"{w.name} py-fn", pyfn, w.f_locals, w.f_locals_fail)
    _correctness(f"{w.name} py-fn+", pyfn_plus, w.f_locals, w.f_locals_fail)
    if want("py-fn"):
        contenders.append(Contender("py-fn", pyfn, w.f_locals, n, "lambda helpers, no CSE"))
    if want("py-fn+"):
        contenders.append(Contender("py-fn+", pyfn_plus, w.f_locals, n, "CSE + C helpers"))
    plan = floor_plan(specs, w.f_locals)
    _correctness(f"{w.name} C floor", floor_plan(specs, w.f_locals).check, w.f_locals, w.f_locals_fail)
    if want("C floor"):
        contenders.append(
            Contender("C floor", plan.check, w.f_locals, plan.check_count, f"{plan.insn_count} insns")
        )
    torch_info: dict[str, Any] = {}
    if torch_ok and w.torch_factory is not None:
        for filtered, label in ((False, "torch"), (True, "torch-same")):
            if not want(label):
                continue
            t0 = time.perf_counter()
            try:
                gm, ok_l, bad_l = w.torch_factory(filtered)
            except Exception as e:  # noqa: BLE001 - report and go on without this column
                log(f"  {label}: compile failed: {type(e).__name__}: {e}")
                continue
            # check() on a failing input bumps torch's fail counters and may reorder its accessors;
            # check_verbose() does not, so the passing-path order stays the compiled one.
            ok = gm.check(ok_l)
            bad = gm.check_verbose(bad_l).result
            if ok is not True or bad is not False:
                raise AssertionError(f"{w.name} {label}: passing -> {ok!r}, failing -> {bad!r}")
            counts = torch_guard_count(gm)
            torch_info[label] = {"counts": counts, "compile_s": time.perf_counter() - t0, "gm": gm}
            note = (
                f"{counts['leaf']} leaf guards ({counts['ambient']} ambient, {counts['global']} on G, "
                f"{counts['local']} on L) + {counts['dict_managers']} dict managers"
            )
            contenders.append(Contender(label, gm.check, ok_l, counts["leaf"], note))
    if want("no-op"):
        contenders.append(Contender("no-op", _noop, w.f_locals, 0, "def f(L): return True"))
    return {
        "workload": w,
        "gs": gs,
        "contenders": contenders,
        "torch": torch_info,
        "pyfn_source": pyfn_source,
        "pyfn_plus_source": pyfn_plus_source,
    }


def run_workload(w: Workload, *, repeat: int, target_s: float, torch_ok: bool, log) -> dict:
    res = prepare(w, torch_ok=torch_ok, log=log)
    gc.collect()
    measure(res["contenders"], repeat, target_s)
    return res


# =================================================================================================
# Instruction counts (callgrind): a noise-free second opinion on a busy machine
# =================================================================================================
def _callgrind_child(workload: str, contender: str, n: int, torch_ok: bool) -> None:
    """Run inside valgrind: build one contender, warm it up, then n checks inside
    ``_floor.repeat_call`` (the only function whose cost callgrind collects)."""
    _floor = floor_build.load()

    if torch_ok:
        _torch_available(lambda m: None)
    w = BUILDERS[workload](torch_ok)
    res = prepare(w, torch_ok=torch_ok, log=lambda m: None, only={contender})
    c = next(c for c in res["contenders"] if c.name == contender)
    for _ in range(50):
        c.check(c.f_locals)
    gc.collect()
    gc.disable()
    _floor.repeat_call(c.check, c.f_locals, n)


def callgrind_count(workload: str, contender: str, n: int, torch_ok: bool, out_dir: str) -> float | None:
    """Instructions per check of one contender, measured by callgrind (None if it failed)."""
    out = os.path.join(out_dir, f"callgrind.{workload}.{contender.replace(' ', '_')}.out")
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
        "from guard_eval import _callgrind_child; "
        f"_callgrind_child({workload!r}, {contender!r}, {n}, {torch_ok!r})"
    )
    found = _callgrind.totals(["-c", code], out)
    return None if not found else found[0] / n


# =================================================================================================
# Reporting
# =================================================================================================
TARGETS = {  # on W2: (contender, bound on tripwire time / contender time, how to read it)
    "torch": (1 / 3, "tripwire <= 1/3 of torch's time"),
    "C floor": (1.5, "tripwire <= 1.5x the C floor"),
    "py-fn": (1 / 10, ">= 10x faster than the generated Python function"),
}


def report(results: list[dict], *, repeat: int) -> str:
    out = []
    with_ir = any(c.instructions for res in results for c in res["contenders"])
    header = ["workload", "contender", "guards", "min ns", "median ns", "tw/x (min)", "tw/x (med)"]
    if with_ir:
        header += ["instr/check", "tw/x (instr)"]
    header.append("notes")
    rows = []
    for res in results:
        w = res["workload"]
        cs = res["contenders"]
        tw = cs[0]
        for c in cs:
            row = [
                w.name,
                c.name,
                "-" if c.guards is None else str(c.guards),
                fmt_ns(c.min),
                fmt_ns(c.median),
                *ratio_columns(tw, c),
            ]
            if with_ir:
                ok = c.instructions and tw.instructions
                row += [
                    f"{c.instructions:,.0f}" if c.instructions else "-",
                    f"{tw.instructions / c.instructions:.3f}" if ok else "-",
                ]
            row.append(c.note)
            rows.append(row)
        rows.append([""] * len(header))
    rows.pop()
    out.append(
        f"ns per check on a passing input; min and median over {repeat} repeats (round-robin), "
        "tw/x = tripwire's time / contender's time (below 1: tripwire is faster)"
        + (
            "; instr/check = instructions per check counted by callgrind (includes the call from C)"
            if with_ir
            else ""
        )
    )
    out.append(table(rows, header, right={2, 3, 4, 5, 6, 7, 8} if with_ir else {2, 3, 4, 5, 6}))
    out.append("")
    # The targets on W2.
    for res in results:
        w = res["workload"]
        if w.name != "W2":
            continue
        by = {c.name: c for c in res["contenders"]}
        tw = by["tripwire"]
        out.append("Targets on W2:")
        for name, (bound, text) in TARGETS.items():
            names = (
                [name]
                + ([f"{name}-same"] if name == "torch" else [])
                + (["py-fn+"] if name == "py-fn" else [])
            )
            for nm in names:
                if nm not in by:
                    out.append(f"  {text} [{nm}]: not measured")
                    continue
                c = by[nm]
                r_min, r_med = tw.min / c.min, tw.median / c.median
                ok = r_min <= bound and r_med <= bound
                verdict = "MET" if ok else ("met on min only" if r_min <= bound else "MISSED")
                line = f"  {text} [vs {nm}]: tw/x = {r_min:.3f} (min), {r_med:.3f} (median) -> {verdict}"
                if c.instructions and tw.instructions:
                    r_ir = tw.instructions / c.instructions
                    line += f"; instructions {r_ir:.3f} -> {'MET' if r_ir <= bound else 'MISSED'}"
                out.append(line)
    return "\n".join(out)


def describe(results: list[dict]) -> str:
    out = []
    for res in results:
        w = res["workload"]
        out.append(f"{w.name}: {w.title}. {len(res['gs'])} guards on {res['gs'].node_count} sources.")
        out.append(textwrap.fill(w.what, 100, initial_indent="    ", subsequent_indent="    "))
        for label, info in res["torch"].items():
            c = info["counts"]
            out.append(
                f"    {label}: {c['leaf']} leaf guards ({c['ambient']} ambient on the root, {c['global']} under G, "
                f"{c['local']} under L; {c['code_parts']} printed code parts; {c['managers']} managers, of which "
                f"{c['dict_managers']} DictGuardManagers that check exact type + length themselves); "
                f"compiled in {info['compile_s']:.1f}s"
            )
    return "\n".join(out)


def environment() -> str:
    bits = [f"Python {platform.python_version()} ({platform.python_implementation()})", platform.machine()]
    try:
        bits.append(f"{os.cpu_count()} CPUs")
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        bits.append(f"torch {torch.__version__}")
    except Exception:  # noqa: BLE001
        bits.append("torch: not importable")
    from tripwire import __version__

    bits.append(f"tripwire {__version__}")
    return ", ".join(bits)


# =================================================================================================
# Entry point
# =================================================================================================
def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python bench/guard_eval.py",
        description="Guard evaluation benchmark: tripwire vs a generated Python guard function, a "
        "hand-written C floor, torch's C++ guard manager and a no-op call (see bench/README.md).",
    )
    p.add_argument(
        "--workload",
        "-w",
        action="append",
        choices=WORKLOAD_NAMES,
        help="run only this workload (repeatable); default: all",
    )
    p.add_argument("--repeat", "-r", type=int, default=15, help="repeats per contender (default 15)")
    p.add_argument(
        "--time", type=float, default=0.02, help="target seconds per repeat per contender (default 0.02)"
    )
    p.add_argument("--quick", action="store_true", help="5 repeats of ~5 ms: a smoke run")
    p.add_argument("--no-torch", action="store_true", help="skip the torch columns even if torch imports")
    p.add_argument("--json", metavar="PATH", help="also write the raw samples as JSON")
    p.add_argument(
        "--show-python", action="store_true", help="print the generated py-fn/py-fn+ source of each workload"
    )
    p.add_argument(
        "--instructions",
        type=int,
        nargs="?",
        const=2000,
        default=0,
        metavar="N",
        help="also count instructions per check with valgrind's callgrind (N checks per "
        "contender, default 2000): a noise-free second opinion; slow, torch under valgrind slower",
    )
    return p.parse_args(argv)


def _torch_available(log) -> bool:
    try:
        import torch  # noqa: F401
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: F401
    except Exception as e:  # noqa: BLE001
        log(f"torch columns skipped: torch is not importable ({type(e).__name__}: {e})")
        return False
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
    return True


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.quick:
        args.repeat = min(args.repeat, 5)
        args.time = min(args.time, 0.005)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    torch_ok = not args.no_torch and _torch_available(log)
    if args.no_torch:
        log("torch columns skipped (--no-torch)")
    names = tuple(args.workload) if args.workload else WORKLOAD_NAMES
    log(f"environment: {environment()}")
    results = []
    for w in build_workloads(names, with_torch=torch_ok):
        log(f"{w.name}: {w.title} ...")
        res = run_workload(w, repeat=args.repeat, target_s=args.time, torch_ok=torch_ok, log=log)
        results.append(res)
        if args.show_python:
            print(f"# ---- {w.name} py-fn ----\n{res['pyfn_source']}")
            print(f"# ---- {w.name} py-fn+ ----\n{res['pyfn_plus_source']}")
    if args.instructions:
        import shutil
        import tempfile

        if shutil.which("valgrind") is None:
            log("--instructions: valgrind not found, skipped")
        else:
            out_dir = tempfile.mkdtemp(prefix="tripwire-callgrind-")
            log(f"callgrind: {args.instructions} checks per contender, outputs in {out_dir}")
            for res in results:
                for c in res["contenders"]:
                    is_torch = c.name.startswith("torch")
                    c.instructions = callgrind_count(
                        res["workload"].name, c.name, args.instructions, is_torch, out_dir
                    )
                    log(
                        f"  {res['workload'].name} {c.name}: {c.instructions and round(c.instructions)} instructions/check"
                    )
    print(f"tripwire guard benchmark -- {environment()}")
    print(describe(results))
    print()
    print(report(results, repeat=args.repeat))
    if args.json:
        data = {
            "environment": environment(),
            "repeat": args.repeat,
            "workloads": [
                {
                    "name": r["workload"].name,
                    "guards": len(r["gs"]),
                    "sources": r["gs"].node_count,
                    "contenders": [
                        {
                            "name": c.name,
                            "guards": c.guards,
                            "number": c.number,
                            "ns": c.samples,
                            "note": c.note,
                        }
                        for c in r["contenders"]
                    ],
                    "torch_counts": {k: v["counts"] for k, v in r["torch"].items()},
                }
                for r in results
            ],
        }
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
