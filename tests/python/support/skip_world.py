"""Differential runs of the skip of unchanged subtrees: random mutations of module-like trees, each
followed by checks of the same guard sets with the skip on, the skip off, the tree walk alone
(fast pass off) and the reference evaluator. Every check must agree.

A *world* is a small ``nn.Module``-like tree (classes made fresh per world, so class mutations do
not leak): modules with ``_modules``/``_parameters`` dicts and config attributes in their instance
``__dict__``, a config object shared by several modules, an object with ``__slots__``, one with a
property and a class attribute, an int-keyed table, and globals (a module object with constants
and a sub-module, a function with defaults, an int-keyed dict). Its guards are what Dynamo
installs on such a tree (read through ``__dict__`` as torch does, and through attributes), plus
residues (a predicate, HASATTR) that allocate, so that a collection can run mid-check.

Mutation kinds (``MUTATIONS``): instance-dict writes of new, equal-but-distinct and identical
values; reverts; ``__class__`` assignment; class attribute changes (a data descriptor shadowing an
instance attribute, a property swapped, a class constant); slot writes; mutable values inside an
unchanged dict (list contents, a shared config's attributes); a new object at a dead object's
address (entries removed, collected, and replaced by fresh equal objects); a computed attribute
(property, ``__getattr__``) changing its answer; instance-dict replacement; keys deleted and
reinserted; module globals, function defaults and code; int-keyed tables; and no change at all.

With ``gc_stress``, every other step runs the skipping check under ``gc.set_threshold(1)`` with a
finalizer in a reference cycle that applies a random mutation on each collection: mutations then
land mid-check (inside residues, which allocate). That check's answer is not compared (the tree
changed during it); the checks after it, with collections off, must all agree: a claim made
during a disturbed check must never make a later check pass falsely.

By hand (the 1M-step run of docs/cpp.md)::

    python tests/python/support/skip_world.py --steps 1000000 --seed 1 [--gc-stress] [--log-every 10000]

The million-step run under GC stress (bench/README.md, "A million steps under GC stress") took an
hour on a loaded 2-core machine: ``nice`` it and run it from a copy of the installed package.

The suite runs a bounded version (tests/python/engine/test_skip_unchanged.py).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gc_stress as stress_tools
import reference
import tripwire as tw
from tripwire import _core


class Disagreement(AssertionError):
    """Two evaluators answered differently on the same state."""


def _fresh_classes() -> types.SimpleNamespace:
    """The world's classes, new for every world (class mutations stay in it)."""

    class Module:
        def __init__(self) -> None:
            self.training = False
            self._parameters: dict[str, Any] = {}
            self._buffers: dict[str, Any] = {}
            self._modules: dict[str, Any] = {}

        def __getattr__(self, name: str) -> Any:
            d = self.__dict__
            for bucket in ("_parameters", "_buffers", "_modules"):
                if bucket in d and name in d[bucket]:
                    return d[bucket][name]
            raise AttributeError(name)

    class Linear(Module):
        pass

    class Block(Module):
        pass

    class Net(Module):
        pass

    class AltLinear(Module):  # same layout: a valid __class__ target
        pass

    class Param:
        def __init__(self, n: int) -> None:
            self.n = n

    class Cfg:
        def __init__(self) -> None:
            self.n_head = 4
            self.eps = 1e-5
            self.mode = "fast"

    class Slotted:
        __slots__ = ("a", "b")

        def __init__(self) -> None:
            self.a = 1
            self.b = "x"

    state = {"computed": 10}

    class WithProp:
        k = 5  # a class attribute read through an attribute source

        def __init__(self) -> None:
            self._x = 1

        @property
        def p(self) -> int:
            return self._x + state["computed"]

    def act_a(x: Any) -> Any:
        return x

    def act_b(x: Any) -> Any:
        return x

    def helper(x: Any, scale: float = 2.0, *, bias: float = 0.5) -> Any:
        return x * scale + bias

    def other_helper(x: Any, scale: float = 2.0, *, bias: float = 0.5) -> Any:
        return x - scale - bias

    return types.SimpleNamespace(**{k: v for k, v in locals().items() if k != "state"}, state=state)


@dataclass
class World:
    """One tree, its globals, its guard specs and guard set, and the ways to mutate it."""

    rng: random.Random
    c: types.SimpleNamespace
    net: Any
    f_locals: dict
    f_globals: dict
    specs: list
    gs: Any
    undo: list[Callable[[], None]] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    # A second set of DICT_VERSION guards on dicts the skip stamps (so that its state claims cover
    # them) and their structural guards; rebuilt (new stamps, new 3.12+ change flags, the old ones
    # released) now and then after it stopped holding, since a changed dict never gets its
    # stamp back.
    dv_specs: list = field(default_factory=list)
    dv: Any = None


def _linear(c: types.SimpleNamespace, i: int, cfg: Any) -> Any:
    m = c.Linear()
    m.__dict__["in_features"] = 16 + i  # a class property (m_class_attr) may shadow it for setattr
    m.out_features = 32 + i
    m.scale = 0.5 + i
    m.act = "relu" if i % 2 else "gelu"
    m.act_fn = c.act_a if i % 2 else c.act_b
    m.dims = [16 + i, 32 + i]
    m.shape = (1, i)
    m.bias_none = None
    m.cfg = cfg
    m.table = {1: "one", 2: i}
    m._parameters["weight"] = c.Param(i)
    m._parameters["bias"] = c.Param(i) if i % 3 else None
    m.__dict__
    return m


def build_world(seed: int, n_blocks: int = 3) -> World:
    rng = random.Random(seed)
    c = _fresh_classes()
    cfg = c.Cfg()
    net = c.Net()
    for b in range(n_blocks):
        blk = c.Block()
        blk._modules["fc"] = _linear(c, 2 * b, cfg)
        blk._modules["proj"] = _linear(c, 2 * b + 1, cfg)
        blk.depth = b
        net._modules[f"b{b}"] = blk
    net.slotted = c.Slotted()
    net.wp = c.WithProp()
    net.cfg = cfg
    mod = types.ModuleType("skip_world_mod")
    mod.CONST = 3
    mod.NAME = "m"
    mod.sub = types.ModuleType("skip_world_sub")
    mod.sub.X = 7
    f_globals = {"mod": mod, "helper": c.helper, "TABLE": {1: "a", 2: "b", 3: "c"}, "Cfg": c.Cfg}
    f_locals = {"self": net, "x": 1.0}
    b = tw.GuardBuilder(f_locals, f_globals)
    _declare(b, c, net, n_blocks)
    gs = b.build()
    w = World(rng, c, net, f_locals, f_globals, b.guards, gs)
    build_dict_versions(w)
    return w


def build_dict_versions(w: World) -> None:
    """(Re)build w.dv: DICT_VERSION on the root's `_modules`, a Linear's `_parameters`, the
    int-keyed globals table and the shared config's instance dict (where the builder accepts them:
    3.13 refuses an instance dict embedded in its object), with the guards that stamp them."""
    b = tw.GuardBuilder(w.f_locals, w.f_globals)
    d = "L['self'].__dict__"
    b.type_match("L['self']")
    fc = f"{d}['_modules']['b0'].__dict__['_modules']['fc'].__dict__"
    for src, structural in (
        (f"{d}['_modules']", "keys"),
        (f"{fc}['_parameters']", "keys"),
        ("G['TABLE']", "item"),
        (f"{d}['cfg'].__dict__", "keys"),
        (f"{fc}['table']", "item"),
    ):
        try:
            b.dict_version(src)
        except (tw.GuardBuildError, KeyError, AttributeError):
            continue  # not a dict now, or one that cannot be versioned
        if structural == "keys":
            b.dict_keys(src)
        else:
            b.equals(f"{src}[2]")
    w.dv_specs = b.guards
    w.dv = b.build()


def _declare(b: tw.GuardBuilder, c: types.SimpleNamespace, net: Any, n_blocks: int) -> None:
    s = "L['self']"

    def module(src: str, m: Any) -> None:
        b.type_match(src)
        d = f"{src}.__dict__"
        # `_parameters` and `table` as torch writes its dict items (dict.__getitem__: the
        # DictItem step, whose stamped dicts are fetched and stamped by one op), `_modules` with
        # the subscript (the Item step): both forms under every mutation.
        params = f"dict.__getitem__({d}, '_parameters')"
        table = f"dict.__getitem__({d}, 'table')"
        b.dict_contains(d, "forward", present=False)
        b.false(f"{d}['training']")
        b.type_match(f"{d}['_modules']")
        b.dict_keys(f"{d}['_modules']")
        b.type_match(params)
        b.dict_keys(params)
        if isinstance(m, c.Linear):
            for name in ("in_features", "out_features", "scale", "act"):
                b.equals(f"{d}[{name!r}]")
            b.id_match(f"{d}['act_fn']")
            b.none(f"{d}['bias_none']")
            b.type_match(f"{d}['dims']")
            b.length(f"{d}['dims']")
            b.equals(f"{d}['dims'][0]")
            b.type_match(f"{d}['shape']")
            b.length(f"{d}['shape']")
            b.equals(f"{d}['shape'][1]")
            b.type_match(f"{d}['cfg']")
            b.equals(f"{d}['cfg'].n_head")
            b.equals(f"{table}[2]")
            b.dict_contains(table, 1, present=True)
            b.type_match(f"{params}['weight']")
            if m._parameters["bias"] is None:
                b.none(f"{params}['bias']")
            else:
                b.type_match(f"{params}['bias']")
            b.equals(f"{src}.in_features")  # through getattr (the __getattr__-type inline cache)
        for i, (name, child) in enumerate(m._modules.items()):
            b.equals(f"list(dict.keys({d}['_modules']))[{i}]")
            # Both forms of a submodule's item: torch's (a fetch that steps over the module's
            # TYPE_MATCH when its type is unchanged) and the subscript.
            item = (
                f"dict.__getitem__({d}['_modules'], {name!r})" if i % 2 == 0 else f"{d}['_modules'][{name!r}]"
            )
            module(item, child)
        if "depth" in m.__dict__:
            b.equals(f"{d}['depth']")

    module(s, net)
    d = f"{s}.__dict__"
    b.equals(f"{d}['slotted'].a")  # a slot: member descriptor, a residue
    b.equals(f"{d}['wp'].p")  # a property computing its value: a residue
    b.equals(f"{d}['wp'].k")  # a class attribute
    b.equals(f"{d}['cfg'].eps")
    b.equals(f"{d}['cfg'].mode")
    b.type_match(f"{d}['_modules'][list(dict.keys({d}['_modules']))[0]]")
    b.id_match("G['mod']")
    b.equals("G['mod'].CONST")
    b.equals("G['mod'].NAME")
    b.equals("G['mod'].sub.X")
    b.id_match("G['helper'].__code__")
    b.equals("G['helper'].__defaults__[0]")
    b.equals("G['helper'].__kwdefaults__['bias']")
    b.type_match("G['TABLE']")
    b.equals("G['TABLE'][2]")
    b.dict_contains("G['TABLE']", 3, present=True)
    b.hasattr(f"{d}['cfg']", "missing", present=False)
    # Allocates GC-tracked objects: a collection (and its finalizers) can run mid-check.
    b.predicate(lambda v: len([[v], [v], {"v": v}, [v]]) == 4, "allocates", source=f"{d}['cfg']")
    b.type_match("L['x']")


# -- mutations ----------------------------------------------------------------------------------------
def _modules_of(w: World) -> list[Any]:
    out = []
    stack = [w.net]
    while stack:
        m = stack.pop()
        out.append(m)
        stack.extend(m._modules.values())
    return out


def _linears(w: World) -> list[Any]:
    return [m for m in _modules_of(w) if type(m) in (w.c.Linear, w.c.AltLinear)]


def _new_value(rng: random.Random, old: Any) -> Any:
    """A different value of the same type, an equal but distinct object, or the same object."""
    r = rng.random()
    if r < 0.35:
        return old
    if type(old) is int:
        return int(str(old)) if r < 0.7 else old + rng.choice((1, -1))
    if type(old) is float:
        return float(repr(old)) if r < 0.7 else old + 0.5
    if type(old) is str:
        return "".join(list(old)) if r < 0.7 else old + "x"
    if type(old) is bool:
        return old if r < 0.7 else not old
    return old


def _restoring(w: World, undo: Callable[[], None]) -> None:
    w.undo.append(undo)


def m_dict_write(w: World) -> None:
    m = w.rng.choice(_linears(w))
    name = w.rng.choice(("in_features", "out_features", "scale", "act", "training"))
    old = m.__dict__[name]
    m.__dict__[name] = _new_value(w.rng, old)
    _restoring(w, lambda: m.__dict__.__setitem__(name, old))


def m_setattr(w: World) -> None:
    m = w.rng.choice(_linears(w))
    name = w.rng.choice(("in_features", "act", "scale"))
    old = m.__dict__[name]
    try:
        setattr(m, name, _new_value(w.rng, old))
    except AttributeError:  # a property (m_class_attr) shadows the instance attribute
        return
    _restoring(w, lambda: m.__dict__.__setitem__(name, old))


def m_class_assign(w: World) -> None:
    m = w.rng.choice(_linears(w))
    old = type(m)
    m.__class__ = w.c.AltLinear if old is w.c.Linear else w.c.Linear
    _restoring(w, lambda: setattr(m, "__class__", old))


def m_class_attr(w: World) -> None:
    r = w.rng.random()
    if r < 0.4:
        # A data descriptor on the class shadows the instance attribute for getattr (not for
        # __dict__ reads).
        w.c.Linear.in_features = property(lambda self: -1)
        _restoring(w, lambda: delattr(w.c.Linear, "in_features"))
    elif r < 0.7:
        old = w.c.WithProp.k
        w.c.WithProp.k = _new_value(w.rng, old) if w.rng.random() < 0.5 else old + 1
        _restoring(w, lambda: setattr(w.c.WithProp, "k", old))
    else:
        old_p = w.c.WithProp.__dict__["p"]
        w.c.WithProp.p = property(lambda self: self._x + 10)  # same answer, new descriptor
        if w.rng.random() < 0.5:
            w.c.WithProp.p = property(lambda self: -5)
        _restoring(w, lambda: setattr(w.c.WithProp, "p", old_p))


def m_slot(w: World) -> None:
    s = w.net.slotted
    old = s.a
    s.a = _new_value(w.rng, old) if w.rng.random() < 0.6 else old + 1
    _restoring(w, lambda: setattr(s, "a", old))


def m_mutable_inside(w: World) -> None:
    m = w.rng.choice(_linears(w))
    r = w.rng.random()
    if r < 0.3:
        m.dims.append(0)
        _restoring(w, lambda: m.dims.pop())
    elif r < 0.6:
        old = m.dims[0]
        m.dims[0] = _new_value(w.rng, old) if w.rng.random() < 0.5 else old + 1
        _restoring(w, lambda: m.dims.__setitem__(0, old))
    elif r < 0.8:
        cfg = w.net.cfg
        old = cfg.n_head
        cfg.n_head = old + 1 if w.rng.random() < 0.5 else int(str(old))
        _restoring(w, lambda: setattr(cfg, "n_head", old))
    else:
        t = m.table
        old = t[2]
        t[2] = _new_value(w.rng, old) if w.rng.random() < 0.5 else "changed"
        _restoring(w, lambda: t.__setitem__(2, old))


def m_address_reuse(w: World) -> None:
    """Remove an entry, collect, put a fresh equal object (possibly at the dead one's address)."""
    r = w.rng.random()
    if r < 0.4:
        m = w.rng.choice(_linears(w))
        if m._parameters["bias"] is None:
            return
        n = m._parameters["bias"].n
        del m._parameters["bias"]
        gc.collect()
        m._parameters["bias"] = w.c.Param(n)
    elif r < 0.7:
        m = w.rng.choice(_linears(w))
        old = m._parameters
        m.__dict__["_parameters"] = dict(old)  # a new dict with the same entries
        del old
        gc.collect()
    else:
        blk = w.rng.choice([m for m in _modules_of(w) if type(m) is w.c.Block])
        old = blk._modules["proj"]
        cfg = old.cfg
        i = old.in_features - 16
        del blk._modules["proj"]
        del old
        gc.collect()
        blk._modules["proj"] = _linear(w.c, i, cfg)  # a new module, maybe at the old address


def m_computed(w: World) -> None:
    st = w.c.state
    old = st["computed"]
    st["computed"] = old + 1 if w.rng.random() < 0.5 else old
    _restoring(w, lambda: st.__setitem__("computed", old))


def m_dict_replace(w: World) -> None:
    m = w.rng.choice(_modules_of(w))
    m.__dict__ = dict(m.__dict__)


def m_key_order(w: World) -> None:
    """Keys deleted and reinserted: the same entries in another order, or (both moved) in the
    original order under new tags."""
    m = w.rng.choice(_linears(w))
    params = m._parameters

    def reorder(first: str) -> None:
        v = params.pop(first)
        params[first] = v

    reorder("weight")
    if w.rng.random() < 0.5:
        reorder("bias")
    elif params and next(iter(params)) == "bias":
        _restoring(w, lambda: reorder("bias"))


def m_globals(w: World) -> None:
    r = w.rng.random()
    g = w.f_globals
    if r < 0.25:
        old = g["mod"].CONST
        g["mod"].CONST = _new_value(w.rng, old) if w.rng.random() < 0.5 else old + 1
        _restoring(w, lambda: setattr(g["mod"], "CONST", old))
    elif r < 0.4:
        old = g["mod"].sub.X
        g["mod"].sub.X = old + 1
        _restoring(w, lambda: setattr(g["mod"].sub, "X", old))
    elif r < 0.55:
        old = g["helper"].__defaults__
        g["helper"].__defaults__ = (3.0,) if w.rng.random() < 0.5 else (float(repr(old[0])),)
        _restoring(w, lambda: setattr(g["helper"], "__defaults__", old))
    elif r < 0.7:
        old = g["helper"].__code__
        g["helper"].__code__ = w.c.other_helper.__code__
        _restoring(w, lambda: setattr(g["helper"], "__code__", old))
    elif r < 0.85:
        t = g["TABLE"]
        old = t[2]
        t[2] = "z" if w.rng.random() < 0.5 else "".join(["b"])
        _restoring(w, lambda: t.__setitem__(2, old))
    else:
        t = g["TABLE"]
        if 3 in t:
            del t[3]
            _restoring(w, lambda: t.__setitem__(3, "c"))


def m_fixed_size(w: World) -> None:
    """The tuple `shape` (TYPE_MATCH + LENGTH, proved with its settled value) replaced by a
    longer or shorter tuple, a list of the same length, or an equal new tuple."""
    m = w.rng.choice(_linears(w))
    old = m.shape
    r = w.rng.random()
    if r < 0.3:
        m.shape = (*old, 0)
    elif r < 0.5:
        m.shape = old[:1]
    elif r < 0.8:
        m.shape = list(old)
    else:
        m.shape = tuple(list(old))
    _restoring(w, lambda: m.__dict__.__setitem__("shape", old))


def m_none(w: World) -> None:
    pass


MUTATIONS: dict[str, Callable[[World], None]] = {
    "dict_write": m_dict_write,
    "setattr": m_setattr,
    "class_assign": m_class_assign,
    "class_attr": m_class_attr,
    "slot": m_slot,
    "mutable_inside": m_mutable_inside,
    "address_reuse": m_address_reuse,
    "computed": m_computed,
    "dict_replace": m_dict_replace,
    "key_order": m_key_order,
    "globals": m_globals,
    "fixed_size": m_fixed_size,
    "none": m_none,
}


def mutate(w: World) -> str:
    """Undo the pending mutations with probability 1/2 (so that the tree passes often), then
    apply one random mutation. Returns its kind."""
    if w.undo and w.rng.random() < 0.7:
        while w.undo:
            try:
                w.undo.pop()()
            except (AttributeError, KeyError, TypeError):  # already undone another way
                pass
    kind = w.rng.choice(list(MUTATIONS))
    MUTATIONS[kind](w)
    w.kinds[kind] = w.kinds.get(kind, 0) + 1
    return kind


# -- the comparison -----------------------------------------------------------------------------------
@dataclass
class RunStats:
    steps: int = 0
    checks: int = 0
    passes: int = 0
    skipped_guards: int = 0
    disturbed: int = 0  # checks during which a finalizer mutated the tree
    dv_passes: int = 0  # passing checks of the DICT_VERSION set
    worlds: int = 0
    kinds: dict[str, int] = field(default_factory=dict)


def answers(w: World, stats: RunStats | None = None) -> tuple[bool, bool, bool, bool]:
    """(skip on, skip off, tree walk only, reference) on the current state, in that order."""
    fast_was = _core.testing.set_fast_pass(True)
    try:
        skip = w.gs.check(w.f_locals)
        if stats is not None and skip:
            stats.skipped_guards += w.gs._last_skipped_guards
        skip_was = _core.testing.set_skip(False)
        try:
            noskip = w.gs.check(w.f_locals)
        finally:
            _core.testing.set_skip(skip_was)
        _core.testing.set_fast_pass(False)
        walk = w.gs.check(w.f_locals)
    finally:
        _core.testing.set_fast_pass(fast_was)
    ref = reference.check(w.specs, w.f_locals, w.f_globals)
    return skip, noskip, walk, ref


def dv_answers(w: World) -> tuple[bool, bool, bool, bool]:
    """The same four answers for the DICT_VERSION set."""
    fast_was = _core.testing.set_fast_pass(True)
    try:
        skip = w.dv.check(w.f_locals)
        skip_was = _core.testing.set_skip(False)
        try:
            noskip = w.dv.check(w.f_locals)
        finally:
            _core.testing.set_skip(skip_was)
        _core.testing.set_fast_pass(False)
        walk = w.dv.check(w.f_locals)
    finally:
        _core.testing.set_fast_pass(fast_was)
    return skip, noskip, walk, reference.check(w.dv_specs, w.f_locals, w.f_globals)


class _Disturber:
    """A finalizer in a reference cycle that mutates the world on every collection (re-arming)."""

    def __init__(self, w: World) -> None:
        self.w = w
        self.hits = 0
        self.armed = False
        self._plant()

    def _plant(self) -> None:
        cyc = _Cyc(self)
        del cyc

    def collected(self) -> None:
        if self.w is None:
            return
        if self.armed:
            self.hits += 1
            try:
                mutate(self.w)
            except Exception:
                pass
        self._plant()


class _Cyc:
    def __init__(self, owner: _Disturber) -> None:
        self.owner = owner
        self.me = self

    def __del__(self) -> None:
        self.owner.collected()


def run(
    seed: int,
    steps: int,
    *,
    gc_stress: bool = False,
    world_steps: int = 2000,
    log=None,
    log_every: int = 50_000,
) -> RunStats:
    """`steps` mutation+check steps over fresh worlds of `world_steps` steps each; raises
    Disagreement on the first disagreement."""
    stats = RunStats()
    rng = random.Random(seed)
    w = None
    left = 0
    t0 = time.time()
    disturber = None
    while stats.steps < steps:
        if w is None or left == 0 or w.gs.invalid:
            if disturber is not None:
                disturber.w = None
            w = build_world(rng.randrange(1 << 30), n_blocks=rng.choice((1, 2, 3)))
            stats.worlds += 1
            left = world_steps
            disturber = _Disturber(w) if gc_stress else None
        kind = mutate(w)
        stats.kinds[kind] = stats.kinds.get(kind, 0) + 1
        if disturber is not None and stats.steps % 2 == 1:
            # A check during which collections mutate the tree: its answer is not compared.
            old = gc.get_threshold()
            hits = disturber.hits
            disturber.armed = True
            stress_tools.drain_free_lists()  # allocations served from free lists start no collection
            gc.set_threshold(1)
            try:
                w.gs.check(w.f_locals)
                w.dv.check(w.f_locals)
            finally:
                gc.set_threshold(*old)
                disturber.armed = False
            stats.disturbed += disturber.hits != hits
        gc_was = gc.isenabled()
        gc.disable()
        try:
            got = answers(w, stats)
        finally:
            if gc_was:
                gc.enable()
        stats.checks += 4
        stats.passes += got[0]
        if len(set(got)) != 1:
            raise Disagreement(
                f"seed {seed}, step {stats.steps}, after {kind!r}: skip on {got[0]}, skip off {got[1]}, "
                f"walk {got[2]}, reference {got[3]}; why_not: {w.gs.why_not(w.f_locals)}"
            )
        gc_was = gc.isenabled()
        gc.disable()
        try:
            got = dv_answers(w)
        finally:
            if gc_was:
                gc.enable()
        stats.checks += 4
        stats.dv_passes += got[0]
        if len(set(got)) != 1:
            raise Disagreement(
                f"seed {seed}, step {stats.steps}, after {kind!r}, DICT_VERSION set: skip on {got[0]}, "
                f"skip off {got[1]}, walk {got[2]}, reference {got[3]}; why_not: {w.dv.why_not(w.f_locals)}"
            )
        if not got[0] and w.rng.random() < 0.5:
            build_dict_versions(w)
        stats.steps += 1
        left -= 1
        if left == 0 and disturber is not None:
            disturber.w = None  # let the world go
        if log is not None and stats.steps % log_every == 0:
            log(f"{stats.steps} steps, {stats.passes} passes, {time.time() - t0:.0f}s")
    if disturber is not None:
        disturber.w = None
    gc.collect()
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gc-stress", action="store_true")
    ap.add_argument("--log-every", type=int, default=50_000, help="print progress every N steps")
    a = ap.parse_args(argv)
    if not _core._skip_enabled():
        print("the skip is not enabled on this interpreter (tag reading unverified)", file=sys.stderr)
        return 2
    t0 = time.time()
    st = run(
        a.seed, a.steps, gc_stress=a.gc_stress, log=lambda m: print(m, flush=True), log_every=a.log_every
    )
    print(
        f"OK: {st.steps} steps ({st.checks} checks) on {st.worlds} worlds, Python {sys.version.split()[0]}, "
        f"seed {a.seed}, gc_stress={a.gc_stress}: zero disagreements; {st.passes} passing steps "
        f"({st.dv_passes} of the DICT_VERSION set), {st.skipped_guards} guards skipped in them, {st.disturbed} checks disturbed mid-check; "
        f"{time.time() - t0:.0f}s"
    )
    print("mutations:", ", ".join(f"{k} {v}" for k, v in sorted(st.kinds.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
