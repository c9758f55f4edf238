"""tripwire.torch.guards_of against torch itself: the imported set decides as guard_manager.check.

Each case compiles a real function or nn.Module with ``torch.compile(backend="eager",
dynamic=False)``, imports its cache entry with ``guards_of`` (dropping exactly the kinds that wait
for the tensor engine, and asserting which those were), then applies random mutations to the
inputs -- swapped submodules and configs, changed config fields, training flags, dict keys and
order, lists, rebound globals, hooks -- and asserts, for every mutated input, that the tripwire
decision equals ``guard_manager.check``.

The oracle: ``gm.check(L) == gs.check(L)``. Nothing is dropped: TENSOR_MATCH, the dimension
markings, NO_TENSOR_ALIASING, torch's ``a is b`` lambda and the framework-state guards are imported
onto tripwire's kinds, and every case also mutates its tensors (shape, stride, dtype,
requires_grad, Parameter, copies and views, aliasing, marked dims) and torch's global state (grad
mode, default dtype, determinism, threads, autocast, a torch-function mode, a default device):
see ``Differential``.

Counts are bounded for CI (``TRIALS`` per case, ``gc_stress.scaled``); the long run is
``TRIPWIRE_TORCH_TRIALS=100000 python -m pytest tests/python/pytorch/test_torch_import.py -k differential``.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import enum
import functools
import gc
import os
import random
import subprocess
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import pytest

import gc_stress

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: E402

import torch_models  # noqa: E402
import tripwire as tw  # noqa: E402
import tripwire.torch as twt  # noqa: E402
from torch_models import GPT, MLP, Block, ConvNet, GPTConfig, Residual, act, act_twin  # noqa: E402
from tripwire.torch import _tree  # noqa: E402

pytestmark = pytest.mark.torch

TRIALS = gc_stress.scaled(int(os.environ.get("TRIPWIRE_TORCH_TRIALS", "1000")))
TENSOR_KINDS: set[str] = set()  # nothing is pending: tensor and ambient guards are imported


# =================================================================================================
# The models and functions torch compiles
# =================================================================================================
# The models (GPTConfig, GPT, Block, MLP, Attention, ConvNet, Residual, act) are the benchmark's
# own (bench/torch_models.py, on the path through pyproject's pytest pythonpath). The MLP reads
# its activation as a global of that module: set_global rebinds it there.


class Shared(nn.Module):
    """One Linear used in two places: torch guards block a's tree and `a is b`."""

    def __init__(self) -> None:
        super().__init__()
        lin = nn.Linear(4, 4)
        self.a = lin
        self.b = lin
        self.scale = 2.0

    def forward(self, x):
        return self.b(self.a(x)) * self.scale


@dataclasses.dataclass(frozen=True)
class Opt:
    scale: float = 2.0
    use_bias: bool = True
    mode: str = "sum"
    sizes: tuple = (1, 2)


def config_fn(x, cfg):
    y = x * cfg["opt"].scale
    if cfg["opt"].use_bias:
        y = y + 1
    for _name, spec in cfg["layers"].items():
        if spec["kind"] == "mul":
            y = y * spec["k"]
        else:
            y = y + spec["k"]
    for s in cfg["opt"].sizes:
        y = y + s
    if cfg["opt"].mode == "sum":
        y = y + len(cfg["tags"])
    return y + cfg["depth"]


def config_base() -> dict:
    return {
        "opt": Opt(),
        "layers": {"a": {"kind": "mul", "k": 2}, "b": {"kind": "add", "k": 0.5}},
        "tags": ["x", "y"],
        "depth": 3,
    }


class MyDict(dict):
    pass


def dicts_fn(x, d, t, od, dd, md):
    y = x
    for k, v in d.items():
        y = y + v * len(k)
    a, (b, c) = t
    y = y * a + b - c
    y = y + od["p"] + len(od) + dd["z"]
    for k in md:
        y = y + md[k]
    return y


SCALE = 2.0


def helper(t):
    return t + 1


def helper_twin(t):
    return t + 1


def make_closure(k: int) -> Callable:
    def inner(x, fn, n=3, *, m=4):
        return helper(x) * SCALE + k + n + m + fn(x)

    return inner


def with_defaults(t, a=2, *, b=3):
    return t * a + b


class Mode(enum.Enum):
    A = 1
    B = 2


GCFG = {"depth": 2}


def _scale_by(k: int) -> Callable:
    def clo(t):
        return t * k

    return clo


CLO = _scale_by(3)  # a closure read as a global: torch guards its code and its cell


class Holder:
    def __init__(self) -> None:
        self.v = 3
        self.items = [1, 2]

    def method(self, x):
        return x * self.v + self.items[1]


# =================================================================================================
# Compiling and importing
# =================================================================================================
@contextlib.contextmanager
def torch_compiling():
    """Normal collection thresholds while torch compiles: --gc-stress is for tripwire's engine
    (importing and checking stay under it), and tracing under it takes minutes."""
    old = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def compile_and_call(fn: Any, *args: Any) -> Any:
    """torch.compile fn, call it once; returns the guard manager of its (single) cache entry."""
    torch._dynamo.reset()
    with torch_compiling():
        torch.compile(fn, backend="eager", dynamic=False)(*args)
    gm = _tree.find_entry(_tree.resolve_target(fn), 0)
    assert len(_debug_get_cache_entry_list(_tree.resolve_target(fn).code)) == 1
    return gm


def root_aliasing_lambdas(gm) -> list:
    """torch's batched `a is b` root lambdas (dropped as OBJECT_ALIASING): the oracle runs them."""
    out = []
    for lg in [*gm.root.get_leaf_guards(), *gm.root.get_epilogue_lambda_guards()]:
        if type(lg).__name__ == "LAMBDA_GUARD" and " is " in lg.verbose_code_parts()[0].split("  #")[0]:
            out.append(lg)
    return out


def import_checked(obj, drop, expect_dropped: set[str], **kw) -> twt.ImportedGuardSet:
    gs = twt.guards_of(obj, drop=drop, **kw)
    rec = gs.torch_import
    kinds_dropped = {g.kind for g in rec.dropped}
    assert kinds_dropped == expect_dropped, rec.report()
    for g in rec.guards:
        assert g.outcome in ("native", "torch", "dropped", "unreachable"), g.line()
        if g.outcome == "dropped" and g.via != "TupleIteratorGetItemAccessor":
            assert g.why.startswith("pending"), g.line()  # only what waits for the tensor engine
    for kind, row in rec.coverage().items():
        assert row["total"] == sum(row[o] for o in twt.OUTCOMES), kind
    return gs


class PassThroughMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class Differential:
    """Runs mutations on a live state and compares the two decisions after each.

    Besides the case's own mutations, every run mutates the tensors among the locals (shape,
    stride, dtype, requires_grad, a Parameter for a Tensor, an equal copy, a view, aliasing one
    input to another, dims marked dynamic / maybe-dynamic / static) and torch's global state
    (grad mode, default dtype, deterministic algorithms, thread count, autocast, a torch-function
    mode, a default device)."""

    def __init__(self, gm, gs, make_locals: Callable[[], dict]) -> None:
        self.gm, self.gs, self.make_locals = gm, gs, make_locals
        self.decisions = collections.Counter()
        self.overrides: dict[str, Any] = {}  # locals replaced by the tensor mutations
        self.failed_kinds: collections.Counter = collections.Counter()  # tripwire's first failure

    def locals(self) -> dict:
        return {**self.make_locals(), **self.overrides}

    def compare(self, what: str) -> None:
        L = self.locals()
        want = self.gm.check(L)
        got = self.gs.check(L)
        self.decisions[want] += 1
        if not got:
            f = self.gs.why_not(L)
            self.failed_kinds[f.kind if f is not None else "?"] += 1
        if want != got:
            why_torch = self.gm.check_verbose(L).verbose_code_parts
            why_tw = self.gs.why_not(L)
            raise AssertionError(
                f"after {what}: torch {want}, tripwire {got}\n torch: {why_torch}\n tripwire: {why_tw}"
            )

    def tensor_mutations(self) -> list[Callable[[random.Random], Callable[[], None]]]:
        names = [k for k, v in self.make_locals().items() if isinstance(v, torch.Tensor)]
        if not names:
            return []

        def replace(name: str, value: Any) -> Callable[[], None]:
            old = self.overrides.get(name, _MISSING)
            self.overrides[name] = value

            def undo() -> None:
                if old is _MISSING:
                    self.overrides.pop(name, None)
                else:
                    self.overrides[name] = old

            return undo

        def current(rng: random.Random) -> tuple[str, torch.Tensor]:
            n = one_of(rng, names)
            return n, self.locals()[n]

        def t_shape(rng):
            n, t = current(rng)
            shape = list(t.shape) or [1]
            i = rng.randrange(len(shape))
            shape[i] = shape[i] + one_of(rng, (1, -1 if shape[i] > 1 else 2))
            return replace(n, torch.zeros(shape, dtype=t.dtype))

        def t_stride(rng):
            n, t = current(rng)
            if t.dim() >= 2:
                return replace(n, t.transpose(0, 1).contiguous().transpose(0, 1))
            return replace(
                n, torch.zeros(2 * max(t.numel(), 1), dtype=t.dtype)[::2][: t.numel()].reshape(t.shape)
            )

        def t_dtype(rng):
            n, t = current(rng)
            other = one_of(
                rng,
                (torch.int32, torch.int64) if not t.is_floating_point() else (torch.float64, torch.float16),
            )
            return replace(n, t.to(other))

        def t_requires_grad(rng):
            n, t = current(rng)
            if not t.is_floating_point():
                return replace(n, t.clone())
            return replace(n, t.detach().clone().requires_grad_(not t.requires_grad))

        def t_same(rng):  # an equal copy, or a view with the same sizes and strides
            n, t = current(rng)
            if rng.random() < 0.5 or t.dim() == 0:
                return replace(n, t.detach().clone())
            base = torch.zeros((t.shape[0] + 1, *t.shape[1:]), dtype=t.dtype)
            return replace(n, base[1:])

        def t_parameter(rng):
            n, t = current(rng)
            if not t.is_floating_point():
                return replace(n, t.clone())
            return replace(n, nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad))

        def t_alias(rng):
            a, b = one_of(rng, names), one_of(rng, names)
            return replace(a, self.locals()[b])

        def t_marked(rng):
            n, t = current(rng)
            c = t.detach().clone()
            if c.dim() > 0:
                mark = one_of(
                    rng,
                    (torch._dynamo.mark_dynamic, torch._dynamo.maybe_mark_dynamic, torch._dynamo.mark_static),
                )
                mark(c, rng.randrange(c.dim()))
            return replace(n, c)

        return [t_shape, t_stride, t_dtype, t_requires_grad, t_same, t_parameter, t_alias, t_marked]

    @staticmethod
    def state_mutations() -> list[Callable[[random.Random], Callable[[], None]]]:
        def enter(ctx: Any) -> Callable[[], None]:
            ctx.__enter__()
            return lambda: ctx.__exit__(None, None, None)

        def grad_mode(rng):
            return enter(torch.no_grad())

        def default_dtype(rng):
            old = torch.get_default_dtype()
            torch.set_default_dtype(one_of(rng, (torch.float64, torch.float32)))
            return lambda: torch.set_default_dtype(old)

        def deterministic(rng):
            old = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(not old)
            return lambda: torch.use_deterministic_algorithms(old)

        def threads(rng):
            old = torch.get_num_threads()
            torch.set_num_threads(one_of(rng, (1, old)))
            return lambda: torch.set_num_threads(old)

        def autocast(rng):
            return enter(torch.autocast("cpu", dtype=one_of(rng, (torch.bfloat16, torch.float16))))

        def function_mode(rng):
            return enter(PassThroughMode())

        def default_device(rng):
            return enter(torch.device("cpu"))

        return [grad_mode, default_dtype, deterministic, threads, autocast, function_mode, default_device]

    def run(
        self, mutations: list[Callable[[random.Random], Callable[[], None]]], trials: int, seed: int
    ) -> None:
        rng = random.Random(seed)
        mutations = [*mutations, *self.tensor_mutations(), *self.state_mutations()]
        self.compare("nothing")
        for t in range(trials):
            k = rng.choice((0, 1, 1, 1, 2, 2, 3))
            chosen = [rng.choice(mutations) for _ in range(k)]
            undos = []
            try:
                for m in chosen:
                    undos.append(m(rng))
                self.compare(f"trial {t}: " + ", ".join(getattr(m, "__name__", "?") for m in chosen))
            finally:
                for u in reversed(undos):
                    u()
        self.compare("all undone")
        # The mutations must reach both answers many times, or the comparison proves little.
        assert self.decisions[True] >= trials // 10 and self.decisions[False] >= trials // 10, self.decisions
        # The tensor and state mutations were decided by the imported tensor and state guards.
        if self.tensor_mutations() and trials >= 200:
            assert {"TENSOR_MATCH", "GLOBAL_STATE"} <= set(self.failed_kinds), self.failed_kinds


# -- mutation helpers ------------------------------------------------------------------------------
_MISSING = object()


def set_attr(obj: Any, name: str, value: Any) -> Callable[[], None]:
    """setattr with an undo; nn.Module attributes go where nn.Module.__setattr__ puts them."""
    old = obj.__dict__.get(name, _MISSING)
    registry = None
    if isinstance(obj, nn.Module):
        for reg in ("_modules", "_parameters", "_buffers"):
            if name in obj.__dict__[reg]:
                registry, old = reg, obj.__dict__[reg][name]
    setattr(obj, name, value)

    def undo() -> None:
        if registry is not None:
            if name in obj.__dict__:
                del obj.__dict__[name]
            obj.__dict__[registry][name] = old
        elif old is _MISSING:
            obj.__dict__.pop(name, None)
            if isinstance(obj, nn.Module):
                obj._modules.pop(name, None)
        else:
            object.__setattr__(obj, name, old) if not isinstance(old, nn.Module) else setattr(obj, name, old)

    return undo


def set_global(name: str, value: Any, g: dict | None = None) -> Callable[[], None]:
    """Rebind a global of this module (or of the module whose dict is ``g``); returns the undo."""
    if g is None:
        g = globals()
    old = g.get(name, _MISSING)
    g[name] = value

    def undo() -> None:
        if old is _MISSING:
            del g[name]
        else:
            g[name] = old

    return undo


def replace_dict(d: dict, items: list) -> Callable[[], None]:
    old = list(d.items())
    d.clear()
    d.update(items)

    def undo() -> None:
        d.clear()
        d.update(old)

    return undo


def submodules(m: nn.Module, kind: type | None = None) -> list[nn.Module]:
    return [s for s in m.modules() if kind is None or isinstance(s, kind)]


def one_of(rng: random.Random, values):
    return values[rng.randrange(len(values))]


# =================================================================================================
# The differential cases
# =================================================================================================
def test_differential_gpt():
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (2, 8))
    gm = compile_and_call(model, idx)
    gs = import_checked(model, twt.PENDING_KINDS, TENSOR_KINDS)
    rec = gs.torch_import
    assert {e.kind for e in rec.exemptions} == {"NO_TENSOR_ALIASING", "NN_MODULE_HOOKS", "DICT_TAG_SKIP"}
    assert (
        "NO_TENSOR_ALIASING" in gs.explain()
        and "skip_no_tensor_aliasing_guards_on_parameters" in gs.explain()
    )

    def cfg_field(rng):
        name, values = one_of(
            rng,
            [
                ("heads", (2, 8, 4.0, "4", 4)),
                ("causal", (False, 1, None, True)),
                ("d", (8, 16)),
                ("dropout", (0.1, 0.0)),
            ],
        )
        return set_attr(cfg, name, one_of(rng, values))

    def block_cfg(rng):
        b = one_of(rng, model.blocks)
        new = one_of(
            rng,
            [
                dataclasses.replace(cfg),
                dataclasses.replace(cfg, causal=not cfg.causal),
                cfg,
                types.SimpleNamespace(**dataclasses.asdict(cfg)),
            ],
        )
        return set_attr(b.attn, "cfg", new)

    def training(rng):
        m = one_of(rng, submodules(model))
        return set_attr(m, "training", one_of(rng, (True, False, 0)))

    def dropout_p(rng):
        m = one_of(rng, submodules(model, nn.Dropout))
        return set_attr(m, "p", one_of(rng, (0.1, 0.0, 0, float("0.0"))))

    def layernorm(rng):
        m = one_of(rng, submodules(model, nn.LayerNorm))
        name, values = one_of(
            rng,
            [
                ("eps", (1e-6, float("1e-05"), 1)),
                ("normalized_shape", ((16,), (16.0,), [16], (17,), (16, 1), (True * 16,))),
            ],
        )
        return set_attr(m, name, one_of(rng, values))

    def forward_attr(rng):
        m = one_of(rng, submodules(model))
        return set_attr(m, "forward", m.forward)

    def hook(rng):
        h = one_of(rng, submodules(model)).register_forward_hook(lambda *a: None)
        return h.remove

    def swap_blocks(rng):
        mods = model.blocks._modules
        return replace_dict(mods, [("0", mods["1"]), ("1", mods["0"])])

    def reorder_blocks(rng):
        mods = model.blocks._modules
        return replace_dict(mods, [("1", mods["1"]), ("0", mods["0"])])

    def grow_blocks(rng):
        mods = model.blocks._modules
        return replace_dict(mods, [*mods.items(), ("2", Block(cfg))])

    def fresh_submodule(rng):
        b = one_of(rng, model.blocks)
        name = one_of(rng, ("mlp", "ln1", "ln2"))
        new = MLP(cfg) if name == "mlp" else nn.LayerNorm(cfg.d)
        return set_attr(b, name, new)

    def other_type(rng):
        b = one_of(rng, model.blocks)
        return set_attr(b.mlp, "drop", one_of(rng, (nn.Identity(), nn.Dropout(0.0))))

    def rebind_act(rng):
        g = vars(torch_models)  # the MLP's globals
        return set_global("act", one_of(rng, (act_twin, types.FunctionType(act.__code__, g), act)), g)

    def delete_attr(rng):
        b = one_of(rng, model.blocks)
        old = b.attn.__dict__.pop("cfg", _MISSING)

        def undo():
            if old is not _MISSING:
                b.attn.__dict__["cfg"] = old

        return undo

    Differential(gm, gs, lambda: {"self": model, "idx": idx}).run(
        [
            cfg_field,
            block_cfg,
            training,
            dropout_p,
            layernorm,
            forward_attr,
            hook,
            swap_blocks,
            reorder_blocks,
            grow_blocks,
            fresh_submodule,
            other_type,
            rebind_act,
            delete_attr,
        ],
        TRIALS,
        seed=1,
    )


def test_differential_cnn():
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(2, 3, 8, 8)
    gm = compile_and_call(model, x)
    gs = import_checked(model, twt.PENDING_KINDS, TENSOR_KINDS)
    assert gs.torch_import.coverage()["DictGuardManager"]["native"] == 4

    def conv_field(rng):
        m = one_of(rng, submodules(model, nn.Conv2d))
        name = one_of(rng, ("stride", "padding", "dilation"))
        return set_attr(m, name, one_of(rng, ((1, 1), (2, 2), (1.0, 1), [1, 1], (1,), (True, 1), (1, 1, 1))))

    def conv_other(rng):
        m = one_of(rng, submodules(model, nn.Conv2d))
        name, values = one_of(rng, [("padding_mode", ("zeros", "reflect")), ("groups", (1, 2, 1.0))])
        return set_attr(m, name, one_of(rng, values))

    def batchnorm(rng):
        m = one_of(rng, submodules(model, nn.BatchNorm2d))
        name, values = one_of(
            rng,
            [
                ("momentum", (0.1, None, 0.2)),
                ("eps", (1e-5, 1e-3)),
                ("training", (True, False)),
                ("track_running_stats", (True, False)),
            ],
        )
        return set_attr(m, name, one_of(rng, values))

    def relu(rng):
        m = one_of(rng, submodules(model, nn.ReLU))
        return set_attr(m, "inplace", one_of(rng, (True, False)))

    def swap_res(rng):
        mods = model.layers._modules
        return replace_dict(mods, [("0", mods["1"]), ("1", mods["0"])])

    def reorder_res(rng):
        mods = model.layers._modules
        return replace_dict(mods, [("1", mods["1"]), ("0", mods["0"])])

    def seq_change(rng):
        seq = one_of(rng, [model.stem, model.layers[0].body, model.layers[1].body])
        mods = seq._modules
        items = list(mods.items())
        i = rng.randrange(len(items))
        choice = rng.randrange(4)
        if choice == 0:  # the same type, fresh
            m = items[i][1]
            new = copy.deepcopy(m)
            items[i] = (items[i][0], new)
        elif choice == 1:
            items[i] = (items[i][0], nn.GELU())
        elif choice == 2:
            del items[i]
        else:
            items.append((str(len(items)), nn.Identity()))
        return replace_dict(mods, items)

    def fresh_res(rng):
        return replace_dict(model.layers._modules, [("0", Residual(8)), ("1", model.layers._modules["1"])])

    def training(rng):
        m = one_of(rng, submodules(model))
        return set_attr(m, "training", one_of(rng, (True, False)))

    def hook(rng):
        h = one_of(rng, submodules(model)).register_forward_pre_hook(lambda *a: None)
        return h.remove

    def forward_attr(rng):
        m = one_of(rng, submodules(model))
        return set_attr(m, "forward", m.forward)

    Differential(gm, gs, lambda: {"self": model, "x": x}).run(
        [
            conv_field,
            conv_other,
            batchnorm,
            relu,
            swap_res,
            reorder_res,
            seq_change,
            fresh_res,
            training,
            hook,
            forward_attr,
        ],
        TRIALS,
        seed=2,
    )


def test_differential_shared_submodule():
    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(2, 4)
    gm = compile_and_call(model, x)
    gs = import_checked(model, twt.PENDING_KINDS, TENSOR_KINDS)
    aliasing = [g for g in gs.torch_import.guards if g.kind == "OBJECT_ALIASING"]
    assert aliasing and all(g.outcome == "native" for g in aliasing), aliasing
    assert [s.kind for s in gs.guards if s.kind is tw.GuardKind.ALIAS]

    def replace_b(rng):
        return set_attr(model, "b", one_of(rng, (copy.deepcopy(model.a), model.a)))

    def replace_both(rng):
        lin = nn.Linear(4, 4)
        u1 = set_attr(model, "a", lin)
        u2 = set_attr(model, "b", one_of(rng, (lin, nn.Linear(4, 4))))

        def undo():
            u2()
            u1()

        return undo

    def scale(rng):
        return set_attr(model, "scale", one_of(rng, (2.0, 2, 3.0)))

    def training(rng):
        return set_attr(model.a, "training", one_of(rng, (True, False)))

    Differential(gm, gs, lambda: {"self": model, "x": x}).run(
        [replace_b, replace_both, scale, training], TRIALS, seed=3
    )


class RunningStats(nn.Module):
    """Reassigns a persistent and a non-persistent buffer in forward: torch guards
    _non_persistent_buffers_set with SET_CONTAINS ('scratch' in it) and SET_NOT_CONTAINS
    ('running' not in it), beside an EQUALS_MATCH on the whole set."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("running", torch.zeros(4))
        self.register_buffer("scratch", torch.zeros(4), persistent=False)

    def forward(self, x):
        self.running = self.running * 0.9 + x.mean()
        self.scratch = self.scratch + 1
        return self.lin(x) + self.running


class LyingSet(set):
    def __contains__(self, item: object) -> bool:
        return not set.__contains__(self, item)


def test_differential_buffer_reassigned_in_forward():
    torch.manual_seed(0)
    model = RunningStats()
    x = torch.randn(2, 4)
    gm = compile_and_call(model, x)
    gs = import_checked(model, twt.PENDING_KINDS, TENSOR_KINDS, fallback="refuse")
    rec = gs.torch_import
    contains = [g for g in rec.guards if g.kind == "SET_CONTAINS"]
    assert len(contains) == 2 and all(g.outcome == "native" for g in contains), rec.report()
    assert not [g for g in rec.guards if g.outcome == "torch"], rec.report()
    specs = [s for s in gs.guards if s.kind is tw.GuardKind.SET_CONTAINS]
    assert sorted(s.args for s in specs) == [("running", False), ("scratch", True)]

    def holder() -> dict:
        return model.__dict__

    def replace_set(value: Any) -> Callable[[], None]:
        d = holder()
        old = d["_non_persistent_buffers_set"]
        d["_non_persistent_buffers_set"] = value

        def undo() -> None:
            d["_non_persistent_buffers_set"] = old

        return undo

    def in_place(op: str, item: str) -> Callable[[], None]:
        s = holder()["_non_persistent_buffers_set"]
        if not isinstance(s, set):  # replaced by an earlier mutation of this trial
            return lambda: None
        before = set(s)
        getattr(s, op)(item)

        def undo() -> None:
            s.clear()
            s.update(before)

        return undo

    def make_persistent(rng):
        return in_place("discard", "scratch")

    def make_non_persistent(rng):
        return in_place("add", one_of(rng, ("running", "other")))

    def other_set(rng):
        cur = set(holder()["_non_persistent_buffers_set"])
        return replace_set(
            one_of(
                rng,
                (
                    set(cur),
                    cur | {"running"},
                    frozenset(cur),
                    LyingSet(cur),
                    LyingSet(cur | {"running"}),
                    sorted(cur),
                    dict.fromkeys(cur),
                    None,
                ),
            )
        )

    def replace_buffer(rng):
        # Into _buffers directly: nn.Module.__setattr__ would discard the name from the set, which
        # an earlier mutation of this trial may have replaced by a frozenset or a list.
        name = one_of(rng, ("running", "scratch"))
        return set_item(
            model._buffers,
            name,
            one_of(rng, (torch.zeros(4), torch.zeros(5), torch.zeros(4, dtype=torch.int64))),
        )

    def training(rng):
        return set_attr(model, "training", one_of(rng, (True, False)))

    diff = Differential(gm, gs, lambda: {"self": model, "x": x})
    diff.run([make_persistent, make_non_persistent, other_set, replace_buffer, training], TRIALS, seed=11)

    # The EQUALS_MATCH on the same set decides first on most of those values: each torch leaf is
    # also compared alone with its imported spec alone, on values that pass or fail only it.
    leaves = []
    stack = [_tree.walk(gm)]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        leaves += [lf for lf in node.leaves if type(lf).__name__ == "SET_CONTAINS"]
    assert len(leaves) == 2
    collider_answers = (True, False)

    class Collider:
        def __init__(self, target: str, answer: bool) -> None:
            self.target, self.answer = target, answer

        def __hash__(self) -> int:
            return hash(self.target)

        def __eq__(self, other: object) -> bool:
            return other is self or self.answer

    for lf in leaves:
        code = _tree.split_site(lf.verbose_code_parts()[0])[0]
        spec = next(sp for sp in specs if repr(sp.args[0]) in code and ("not " in code) is not sp.args[1])
        alone = tw.GuardSet([tw.GuardSpec(spec.kind, tw.Source.local("s"), spec.args, 0)])
        item = spec.args[0]
        values = [
            set(),
            {item},
            {"x"},
            {item, "x"},
            frozenset(),
            frozenset({item}),
            LyingSet(),
            LyingSet({item}),
        ]
        values += [{Collider(item, a)} for a in collider_answers] + [{1.0}, {(item,)}]
        for v in values:
            assert lf(v) is alone.check({"s": v}), (code, v)
        for v in ([item], {item: 1}, None, (item,)):  # not a set: torch's "not in" passes it
            assert alone.check({"s": v}) is False
            assert lf(v) is (not spec.args[1]), (code, v)


def test_differential_config_function():
    x = torch.ones(3)
    gm = compile_and_call(config_fn, x, config_base())
    gs = import_checked(config_fn, twt.PENDING_KINDS, TENSOR_KINDS)
    state: dict[str, Any] = {"cfg": config_base()}

    def value(rng):
        cfg = state["cfg"]
        spec = one_of(rng, list(cfg["layers"].values()))
        return set_item(spec, one_of(rng, ("kind", "k")), one_of(rng, ("mul", "add", 2, 0.5, 2.0, "2")))

    def opt(rng):
        cfg = state["cfg"]
        field, values = one_of(
            rng,
            [
                ("scale", (2.0, 2, 3.0)),
                ("use_bias", (True, False, 1)),
                ("mode", ("sum", "max")),
                ("sizes", ((1, 2), (1, 2, 3), [1, 2], (1, 2.0))),
            ],
        )
        cur = cfg["opt"] if isinstance(cfg["opt"], Opt) else Opt()
        return set_item(cfg, "opt", dataclasses.replace(cur, **{field: one_of(rng, values)}))

    def opt_type(rng):
        cfg = state["cfg"]
        return set_item(cfg, "opt", one_of(rng, (Opt(), types.SimpleNamespace(**dataclasses.asdict(Opt())))))

    def layers_keys(rng):
        layers = state["cfg"]["layers"]
        items = list(layers.items())
        choice = rng.randrange(4)
        if choice == 0:
            items.reverse()
        elif choice == 1:
            items.append(("c", {"kind": "mul", "k": 1}))
        elif choice == 2:
            items.pop()
        else:
            items[0] = ("z", items[0][1])
        return replace_dict(layers, items)

    def layers_type(rng):
        cfg = state["cfg"]
        kind = one_of(rng, (collections.OrderedDict, MyDict, dict))
        return set_item(cfg, "layers", kind(cfg["layers"]))

    def tags(rng):
        cfg = state["cfg"]
        return set_item(cfg, "tags", one_of(rng, (["x"], ["x", "y"], ("x", "y"), ["x", "y", "z"], [])))

    def depth(rng):
        return set_item(state["cfg"], "depth", one_of(rng, (3, 4, 3.0, True)))

    def extra_key(rng):
        return set_item(state["cfg"], "extra", 1)

    def missing_key(rng):
        cfg = state["cfg"]
        key = one_of(rng, ("tags", "depth"))
        old = cfg.pop(key, _MISSING)

        def undo():
            if old is not _MISSING:
                cfg[key] = old

        return undo

    Differential(gm, gs, lambda: {"x": x, "cfg": state["cfg"]}).run(
        [value, opt, opt_type, layers_keys, layers_type, tags, depth, extra_key, missing_key], TRIALS, seed=4
    )


def set_item(d: dict, key: Any, value: Any) -> Callable[[], None]:
    old = d.get(key, _MISSING)
    d[key] = value

    def undo() -> None:
        if old is _MISSING:
            del d[key]
        else:
            d[key] = old

    return undo


def test_differential_dicts_and_tuples():
    x = torch.ones(2)
    base = {
        "d": {"ab": 1, "c": 2.0},
        "t": (2, (3, 4)),
        "od": collections.OrderedDict(p=1),
        "dd": collections.defaultdict(int, z=3),
        "md": MyDict(u=1, w=2),
    }
    gm = compile_and_call(dicts_fn, x, *base.values())
    gs = import_checked(dicts_fn, twt.PENDING_KINDS, TENSOR_KINDS)
    kinds = gs.torch_import.coverage()
    assert kinds["DictGuardManager"]["native"] >= 2  # d, md (a heap dict subclass: its storage size)
    state = {k: copy.copy(v) for k, v in base.items()}

    def reset_state():
        for k, v in base.items():
            state[k] = copy.copy(v)

    def arg(rng):
        name = one_of(rng, list(state))
        old = state[name]
        state[name] = one_of(
            rng,
            {
                "d": [
                    {"ab": 1, "c": 2.0},
                    {"c": 2.0, "ab": 1},
                    {"ab": 1},
                    {"ab": 1, "c": 2},
                    MyDict(ab=1, c=2.0),
                    {"ab": 1, "c": 2.0, "e": 0},
                ],
                "t": [(2, (3, 4)), (2, [3, 4]), [2, (3, 4)], (2, (3, 4), 5), (2.0, (3, 4)), (2, (3, 5))],
                "od": [
                    collections.OrderedDict(p=1),
                    {"p": 1},
                    collections.OrderedDict(p=1, q=2),
                    collections.OrderedDict(p=2),
                ],
                "dd": [
                    collections.defaultdict(int, z=3),
                    {"z": 3},
                    collections.defaultdict(float, z=3),
                    collections.defaultdict(int, z=4),
                ],
                "md": [
                    MyDict(u=1, w=2),
                    MyDict(w=2, u=1),
                    {"u": 1, "w": 2},
                    MyDict(u=1),
                    MyDict(u=1, w=2, v=3),
                ],
            }[name],
        )

        def undo():
            state[name] = old

        return undo

    def mutate_md(rng):
        md = state["md"] = MyDict(state["md"])
        md[one_of(rng, ("u", "w", "v"))] = one_of(rng, (1, 2, 2.0))

        def undo():
            reset_state()

        return undo

    Differential(gm, gs, lambda: {"x": x, **state}).run([arg, mutate_md], TRIALS, seed=5)


def many_tensors(x0, x1, x2, x3, x4, x5, x6, x7, d, t):
    return x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + d["a"] + d["b"] + t[0] + t[1]


def test_differential_many_tensors_dicts_and_tuples():
    """Eight tensor arguments and tensors in a dict and a tuple: NO_TENSOR_ALIASING over all of
    them (aliasing one input to another must fail both sides), TENSOR_MATCH on each."""
    torch.manual_seed(0)
    xs = {f"x{i}": torch.randn(2, 3) for i in range(8)}
    d = {"a": torch.randn(2, 3), "b": torch.randn(2, 3)}
    t = (torch.randn(2, 3), torch.randn(2, 3))
    gm = compile_and_call(many_tensors, *xs.values(), d, t)
    gs = import_checked(many_tensors, twt.PENDING_KINDS, TENSOR_KINDS)
    cov = gs.torch_import.coverage()
    assert cov["TENSOR_MATCH"]["native"] == 12 and cov["NO_TENSOR_ALIASING"]["native"] == 12, cov
    state = {"d": dict(d), "t": t}

    def alias_in_containers(rng):
        old_d, old_t = state["d"], state["t"]
        pick = one_of(rng, ("d", "t"))
        if pick == "d":
            state["d"] = {"a": xs["x0"], "b": d["b"]}
        else:
            state["t"] = (t[0], one_of(rng, (d["a"], t[0])))

        def undo():
            state["d"], state["t"] = old_d, old_t

        return undo

    diff = Differential(gm, gs, lambda: {**xs, **state})
    diff.run([alias_in_containers], TRIALS, seed=12)
    if TRIALS >= 200:
        assert "NO_ALIAS" in diff.failed_kinds, diff.failed_kinds


def test_differential_globals_closures_defaults():
    x = torch.ones(2)
    inner = make_closure(5)
    gm = compile_and_call(inner, x, with_defaults)
    gs = import_checked(inner, twt.PENDING_KINDS, TENSOR_KINDS)
    srcs = {g.source for g in gs.torch_import.guards}
    assert "L['k']" in srcs  # torch reads a closure variable as a frame local
    assert any(s.startswith("G['helper']") for s in srcs) and "G['SCALE']" in srcs
    state = {"k": 5, "fn": with_defaults, "n": 3, "m": 4}
    added = gs.torch_import.added
    assert any("type(L['fn']) is function" in why for _, why in added), added

    def closure_value(rng):
        old = state["k"]
        state["k"] = one_of(rng, (5, 6, 5.0))

        def undo():
            state["k"] = old

        return undo

    def rebind(rng):
        name, values = one_of(
            rng,
            [
                ("SCALE", (2.0, 2, 3.0)),
                ("helper", (helper, helper_twin, types.FunctionType(helper.__code__, globals()))),
            ],
        )
        return set_global(name, one_of(rng, values))

    def fn_defaults(rng):
        fn = types.FunctionType(
            with_defaults.__code__, globals(), "with_defaults", with_defaults.__defaults__
        )
        fn.__kwdefaults__ = dict(with_defaults.__kwdefaults__)
        which = rng.randrange(3)
        if which == 0:
            fn.__defaults__ = one_of(rng, ((2,), (3,), (2.0,), None))
        elif which == 1:
            fn.__kwdefaults__ = one_of(rng, ({"b": 3}, {"b": 4}, None))
        old = state["fn"]
        state["fn"] = one_of(rng, (fn, helper_twin, with_defaults))

        def undo():
            state["fn"] = old

        return undo

    def args(rng):
        old = dict(state)
        state[one_of(rng, ("n", "m"))] = one_of(rng, (3, 4, 5))

        def undo():
            state.update(old)

        return undo

    Differential(gm, gs, lambda: {"x": x, **state}).run(
        [closure_value, rebind, fn_defaults, args], TRIALS, seed=6
    )


def test_differential_bound_method_and_code_object():
    h = Holder()
    x = torch.ones(2)
    gm = compile_and_call(h.method, x)
    gs = import_checked(h.method, twt.PENDING_KINDS, TENSOR_KINDS)
    gs_code = import_checked(Holder.method.__code__, twt.PENDING_KINDS, TENSOR_KINDS)
    assert [g.line() for g in gs.torch_import.guards] == [g.line() for g in gs_code.torch_import.guards]
    assert twt.frame_locals(h.method, x) == {"self": h, "x": x}

    def attr(rng):
        name, values = one_of(rng, [("v", (3, 4, 3.0)), ("items", ([1, 2], [1, 3], (1, 2), [1, 2, 3]))])
        return set_attr(h, name, one_of(rng, values))

    diff = Differential(gm, gs, lambda: {"self": h, "x": x})
    diff.run([attr], TRIALS // 4, seed=7)
    Differential(gm, gs_code, lambda: {"self": h, "x": x}).run([attr], TRIALS // 4, seed=8)


# =================================================================================================
# Mappings one at a time (where exactness is subtle)
# =================================================================================================
def test_container_equals_keeps_torchs_python_eq_semantics():
    model = ConvNet()
    x = torch.randn(1, 3, 8, 8)
    gm = compile_and_call(model, x)
    exact = twt.guards_of(model, drop=twt.PENDING_KINDS)
    strict = twt.guards_of(model, drop=twt.PENDING_KINDS, equals="strict")
    conv = model.stem[0]
    L = {"self": model, "x": x}
    undo = set_attr(conv, "stride", (1.0, 1))  # == (1, 1) for Python: torch passes
    try:
        assert gm.check(L) is True
        assert exact.check(L) is True
        assert strict.check(L) is False  # tripwire's type-exact EQUALS: documented as stricter
        f = strict.why_not(L)
        assert f.kind == "EQUALS_MATCH" and "stride" in f.source
    finally:
        undo()
    # The tuples are tripwire's own EQUALS_MATCH with python_eq (Python's ==) and the
    # saved-tensor-hooks lambda is tripwire's probe: no guard calls torch's leaf.
    torch_evaluated = exact.torch_import.by_outcome("torch")
    assert not torch_evaluated
    tuples = [s for s in exact._specs if s.kind is tw.GuardKind.EQUALS_MATCH and type(s.args[0]) is tuple]
    assert tuples and all(s.args[1:] == (True,) for s in tuples)
    assert "(Python ==)" in exact.explain()
    assert all(
        "stricter (equals='strict')" in g.why for g in strict.torch_import.guards if "stride ==" in g.code
    )


class PartialAct(nn.Module):
    """A functools.partial activation: Dynamo guards len(keywords) with DICT_LENGTH and puts no
    TYPE_MATCH on the keywords dict (a partial always holds an exact dict)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.2)

    def forward(self, x):
        return self.act(self.lin(x))


def test_dict_length_without_a_type_match_is_native_and_pins_the_type():
    model = PartialAct()
    x = torch.randn(2, 4)
    gm = compile_and_call(model, x)
    gs = twt.guards_of(model)
    lengths = [g for g in gs.torch_import.guards if g.kind == "DICT_LENGTH"]
    assert lengths and all(g.outcome == "native" for g in lengths), gs.torch_import.report()
    assert all("stricter" in g.why for g in lengths)
    L = {"self": model, "x": x}
    assert gm.check(L) is True and gs.check(L) is True
    kw = model.act.keywords
    for do, undo in [
        (lambda: kw.__setitem__("inplace", False), lambda: kw.pop("inplace")),
        (lambda: kw.pop("negative_slope"), lambda: kw.__setitem__("negative_slope", 0.2)),
    ]:
        do()
        try:
            assert gm.check(L) is False and gs.check(L) is False
            assert gs.why_not(L).kind in ("LENGTH", "DICT_CONTAINS", "EQUALS_MATCH")
        finally:
            undo()
    # Another partial of the same size: both decide on its keywords' values, not on identity.
    old = model.act
    for other, expect in [
        (functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.2), True),
        (functools.partial(torch.nn.functional.leaky_relu, negative_slope=0.2, inplace=False), False),
    ]:
        model.act = other
        try:
            assert gm.check(L) is expect and gs.check(L) is expect
        finally:
            model.act = old


def test_equals_on_a_constant_printed_by_name_is_an_identity_guard():
    """torch prints `G['tns'].bool == torch.bool`: no literal. torch.dtype is immutable and its ==
    is object's (identity), so torch's guard is `v is torch.bool`, imported as ID_MATCH: every
    replacement of the global's attribute fails both, the original passes both."""
    import builtins

    tns = types.SimpleNamespace(bool=torch.bool)
    g = {"tns": tns, "__builtins__": builtins}
    exec("def f(x):\n    return x.to(tns.bool)\n", g)
    f = g["f"]
    x = torch.ones(3)
    gm = compile_and_call(f, x)
    gs = twt.guards_of(f, fallback="refuse")
    recs = [r for r in gs.torch_import.guards if r.kind == "EQUALS_MATCH" and "G['tns']" in r.code]
    assert len(recs) == 1 and recs[0].outcome == "native", gs.torch_import.report()
    assert "== torch.bool" in recs[0].code
    (spec,) = [gs._specs[i] for i in recs[0].guards]
    assert spec.kind is tw.GuardKind.ID_MATCH and spec.args[0] is torch.bool
    L = twt.frame_locals(f, x)
    assert gm.check(L) is True and gs.check(L) is True

    class DtypeLike:  # == says equal to everything: torch's type check refuses it, as ID_MATCH does
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    for other in (torch.float32, torch.uint8, "torch.bool", True, None, DtypeLike(), torch.strided):
        tns.bool = other
        assert gm.check(L) is False, other
        assert gs.check(L) is False, other
    tns.bool = torch.bool
    assert gm.check(L) is True and gs.check(L) is True


def test_a_constant_printed_by_name_is_identity_only_where_torch_is():
    from tripwire.torch import _leaves

    everything = lambda v: True
    assert _leaves._identity_constant("v == torch.float32", everything) is torch.float32
    assert _leaves._identity_constant("v == torch.strided", everything) is torch.strided
    assert _leaves._identity_constant("v == torch.nn.Module", everything) is nn.Module  # a class: type's ==
    refused = [
        "v == math.pi",  # float: == is value equality, not identity
        "v == torch.no_such_name",  # not in the module's dict
        "v == not_a_loaded_module.x",
        "v == torch.float32.is_floating_point",  # a method of a dtype: not reached through modules
        "v == torch.bool()",  # a call
    ]
    import math  # noqa: F401 - loaded, so "math.pi" resolves and is refused by its type

    for code in refused:
        with pytest.raises((_leaves._Fallback, ValueError)):
            _leaves._identity_constant(code, everything)
    # An enum member: its class is mutable (a later `__eq__` assignment would change torch's answer).
    ns = types.ModuleType("tw_test_enum_mod")
    ns.RED = enum.Enum("Color", "RED BLUE").RED
    sys.modules["tw_test_enum_mod"] = ns
    try:
        with pytest.raises(_leaves._Fallback, match="not identity on an immutable type"):
            _leaves._identity_constant("v == tw_test_enum_mod.RED", everything)
    finally:
        del sys.modules["tw_test_enum_mod"]
    # torch's own leaf must accept the object found.
    with pytest.raises(_leaves._Fallback):
        _leaves._identity_constant("v == torch.float32", lambda v: False)


def test_fallback_refuse_imports_a_convnet_with_nothing_left_to_torch():
    model = ConvNet()
    compile_and_call(model, torch.randn(1, 3, 8, 8))
    # Tuple equality is EQUALS_MATCH with python_eq and the saved-tensor-hooks lambda is the
    # GLOBAL_STATE probe torch_saved_tensors_hooks: nothing of this model needs torch, so refuse
    # does not raise (what does raise is pinned by the next test).
    gs = twt.guards_of(model, drop=twt.PENDING_KINDS, fallback="refuse")
    assert not gs.torch_import.by_outcome("torch")
    hooks = [g for g in gs.torch_import.guards if g.kind == "AUTOGRAD_SAVED_TENSORS_HOOKS"]
    assert len(hooks) == 1 and hooks[0].outcome == "native"


def test_not_importable_lists_each_guard_with_source_and_kind(monkeypatch):
    """With fallback="refuse", what has no tripwire form is listed (source, kind, why), nothing is
    imported, and a source in drop= drops the guards on it and below it."""
    model = Shared()
    compile_and_call(model, torch.randn(2, 4))
    twt.guards_of(model, fallback="refuse")  # everything has a tripwire form
    from tripwire.torch import _rules

    def no_form(*args):
        raise _rules._Fallback("no tripwire form (this test)")

    monkeypatch.setitem(_rules.LEAF_RULES, "TENSOR_MATCH", no_form)
    with pytest.raises(tw.GuardsNotImportable) as e:
        twt.guards_of(model, fallback="refuse")
    msg = str(e.value)
    assert {g.kind for g in e.value.guards} == {"TENSOR_MATCH"}
    for g in e.value.guards:
        assert g.outcome == "unsupported" and g.source and g.kind in msg
    gs = twt.guards_of(model, drop=("L['self']", "L['x']"), fallback="refuse")
    assert all(g.outcome == "dropped" for g in gs.torch_import.guards if g.source.startswith("L['self']"))
    assert not any(s.kind is tw.GuardKind.TENSOR_MATCH for s in gs.guards)


def test_drop_rejects_names_that_match_nothing():
    compile_and_call(config_fn, torch.ones(3), config_base())
    with pytest.raises(ValueError, match="neither a torch kind nor a source"):
        twt.guards_of(config_fn, drop=(*twt.PENDING_KINDS, "TENSOR_MACTH"))
    with pytest.raises(TypeError):
        twt.guards_of(config_fn, drop=(1,))
    with pytest.raises(ValueError):
        twt.guards_of(config_fn, drop=twt.PENDING_KINDS, equals="loose")


def test_dict_guard_manager_length_and_empty_dict():
    def f(x, d, e):
        for k, v in d.items():
            x = x + v
        for k in e:
            x = x + 1
        return x

    gm = compile_and_call(f, torch.ones(1), {"a": 1, "b": 2}, {})
    gs = import_checked(f, twt.PENDING_KINDS, TENSOR_KINDS)
    dict_checks = {g.source: g for g in gs.torch_import.guards if g.kind == "DictGuardManager"}
    assert dict_checks["L['d']"].code.endswith("len(L['d']) == 2")
    assert dict_checks["L['e']"].code.endswith("len(L['e']) == 0")
    for d, e in [
        ({"a": 1, "b": 2}, {}),
        ({"a": 1}, {}),
        ({"a": 1, "b": 2}, {"z": 1}),
        ({"a": 1, "b": 2, "c": 3}, {}),
        ({"a": 1, "b": 2}, MyDict()),
        (collections.OrderedDict(a=1, b=2), {}),
    ]:
        L = {"x": torch.ones(1), "d": d, "e": e}
        assert gs.check(L) == gm.check(L), (d, e)


def test_every_leaf_kind_of_a_mixed_function():
    """Kinds beyond the models: NaN, bytes, complex, enum identity, weakref call, tuple and range
    iterators, sets, NO_HASATTR, DICT_CONTAINS on globals, closures of globals, dtype constants."""

    def f(x, r, nan, c, b, none, w, s, it, rit, o, dt, mode):
        y = x * r + c.real + len(b)
        if nan != nan:
            y = y + 1
        if none is None:
            y = y - 1
        y = y + w().v
        if 3 in s:
            y = y + 1
        y = y + next(it) + next(rit)
        if not hasattr(o, "missing"):
            y = y + 1
        if "depth" in GCFG:
            y = y * GCFG["depth"]
        if mode is Mode.A:
            y = y * 2
        return CLO(y).to(dt)

    h = Holder()
    args = (
        torch.ones(2),
        1.5,
        float("nan"),
        1 + 2j,
        b"ab",
        None,
        weakref.ref(h),
        {1, 3},
        iter((1, 2, 3)),
        iter(range(5)),
        Holder(),
        torch.float32,
        Mode.A,
    )
    gm = compile_and_call(f, *args)
    with pytest.raises(tw.GuardsNotImportable, match="TupleIteratorGetItemAccessor"):
        twt.guards_of(f, drop=twt.PENDING_KINDS)
    # tripwire has no step for a tuple iterator's next item: the EQUALS below it is dropped by name
    # (and the variants below never change the iterator's items, only how many are left).
    gs = import_checked(
        f, (*twt.PENDING_KINDS, "TupleIteratorGetItemAccessor"), TENSOR_KINDS | {"EQUALS_MATCH"}
    )
    assert [g.via for g in gs.torch_import.dropped if g.kind == "EQUALS_MATCH"] == [
        "TupleIteratorGetItemAccessor"
    ]
    cov = gs.torch_import.coverage()
    for kind in (
        "FLOAT_IS_NAN",
        "TUPLE_ITERATOR_LEN",
        "RANGE_ITERATOR_MATCH",
        "ID_MATCH",
        "DICT_CONTAINS",
        "NONE_MATCH",
        "SET_CONTAINS",
    ):
        assert cov[kind]["native"] >= 1, (kind, cov)
    assert cov["NO_HASATTR"]["native"] == 1, cov
    assert cov["SET_CONTAINS"]["torch"] == 0, cov
    names = ["x", "r", "nan", "c", "b", "none", "w", "s", "it", "rit", "o", "dt", "mode"]

    def L_of(vals):
        d = dict(zip(names, vals))
        d["it"] = iter(d["it"]) if isinstance(d["it"], tuple) else d["it"]
        return d

    variants = {
        "r": [1.5, 2.5, 1, float("nan")],
        "nan": [float("nan"), 0.0, "nan"],
        "c": [1 + 2j, 1 + 3j, complex(float("nan"), 2)],
        "b": [b"ab", b"ac", "ab", bytearray(b"ab")],
        "none": [None, 0],
        "w": [weakref.ref(h), weakref.ref(Holder()), lambda: h],
        "s": [{1, 3}, {3, 1}, {1, 3, 4}, frozenset({1, 3}), {1.0, 3}],
        "it": [(1, 2, 3), (1, 2), (1, 2, 3, 4)],
        "rit": [
            lambda: iter(range(5)),
            lambda: iter(range(6)),
            lambda: iter(range(1, 5)),
            lambda: iter([0, 1]),
        ],
        "o": [Holder(), types.SimpleNamespace(missing=1)],
        "dt": [torch.float32, torch.float64],
        "mode": [Mode.A, Mode.B, 1],
    }
    rng = random.Random(9)
    for _ in range(gc_stress.scaled(400, 10)):
        vals = list(args)
        for _ in range(rng.choice((0, 1, 2))):
            i = rng.randrange(1, len(names))
            vals[i] = one_of(rng, variants[names[i]])
        vals[8] = iter(vals[8]) if isinstance(vals[8], tuple) else iter((1, 2, 3))
        vals[9] = (
            vals[9]()
            if callable(vals[9]) and not isinstance(vals[9], type(iter(range(1))))
            else iter(range(5))
        )
        L = dict(zip(names, vals))
        assert gs.check(L) == gm.check(L), {k: v for k, v in L.items() if k != "x"}


class NoMissing:
    """An object whose __getattr__ says no to every name (Dynamo inlines it and guards what it reads)."""

    def __getattr__(self, name):
        raise AttributeError(name)


def test_no_hasattr_is_native():
    """torch's NO_HASATTR is tripwire's HASATTR(name, False). torch's PyObject_HasAttr also counts
    an exception other than AttributeError as absent, which tripwire's HASATTR fails on (recorded as
    stricter); Dynamo inlines a __getattr__ and guards what it reads, so a test cannot make one
    raise differently at check time."""

    def f(x, o):
        return x + 1 if not hasattr(o, "missing") else x - 1

    x = torch.ones(2)
    gm = compile_and_call(f, x, NoMissing())
    gs = twt.guards_of(f)
    (g,) = [g for g in gs.torch_import.guards if g.kind == "NO_HASATTR"]
    assert g.outcome == "native" and "stricter" in g.why, g.line()
    (spec,) = [gs._specs[i] for i in g.guards]
    assert spec.kind is tw.GuardKind.HASATTR and spec.args == ("missing", False)
    with_attr = NoMissing()
    with_attr.missing = None
    for o, expect in [(NoMissing(), True), (with_attr, False), (types.SimpleNamespace(), False)]:
        L = {"x": x, "o": o}
        assert gm.check(L) is expect and gs.check(L) is expect, o
    failure = gs.why_not({"x": x, "o": with_attr})
    assert failure.kind == "HASATTR" and failure.source == "L['o']", failure


def test_code_accessor_precondition_is_stricter_only_for_methods():
    """torch's CodeGuardAccessor unwraps a bound method; the imported set requires a function
    there (a guard the importer adds and records): stricter, never laxer."""
    x = torch.ones(2)
    inner = make_closure(1)
    gm = compile_and_call(inner, x, with_defaults)
    gs = twt.guards_of(inner, drop=twt.PENDING_KINDS)
    h = Holder()
    h.with_defaults = types.MethodType(lambda self, t, a=2, *, b=3: t, h)
    bound = types.MethodType(with_defaults, 1)  # same code and defaults, as a bound method
    L = {"x": x, "fn": bound, "k": 1, "n": 3, "m": 4}
    assert gm.check(L) is True and gs.check(L) is False
    fake = types.SimpleNamespace(__code__=with_defaults.__code__, __defaults__=(2,), __kwdefaults__={"b": 3})
    L["fn"] = fake  # an object exposing the function's code: torch fails it, so must tripwire
    assert gm.check(L) is False and gs.check(L) is False


# =================================================================================================
# Errors and the API
# =================================================================================================
def test_errors_for_missing_entries_and_bad_objects():
    def never_compiled(x):
        return x + 1

    with pytest.raises(tw.TorchImportError, match="no compiled cache entry"):
        twt.guards_of(never_compiled)
    compile_and_call(config_fn, torch.ones(3), config_base())
    with pytest.raises(tw.TorchImportError, match="out of range: torch has 1 cache entry"):
        twt.guards_of(config_fn, entry=1, drop=twt.PENDING_KINDS)
    with pytest.raises(TypeError, match="expected a function"):
        twt.guards_of(42)
    with pytest.raises(TypeError, match="entry must be an int"):
        twt.guards_of(config_fn, entry="0")
    with pytest.raises(ValueError, match="fallback"):
        twt.guards_of(config_fn, fallback="maybe")


def test_entries_in_lru_order_and_invalidated_entries():
    torch._dynamo.reset()
    cfn = torch.compile(config_fn, backend="eager", dynamic=False)
    a, b = config_base(), config_base()
    b["depth"] = 7
    with torch_compiling():
        cfn(torch.ones(3), a)
        cfn(torch.ones(3), b)  # a second entry (depth is specialised)
    newest = twt.guards_of(cfn, entry=0, drop=twt.PENDING_KINDS)
    oldest = twt.guards_of(config_fn, entry=1, drop=twt.PENDING_KINDS)
    assert newest.check({"x": torch.ones(3), "cfg": b}) and not newest.check({"x": torch.ones(3), "cfg": a})
    assert oldest.check({"x": torch.ones(3), "cfg": a}) and not oldest.check({"x": torch.ones(3), "cfg": b})
    assert newest.torch_import.entries == 2

    # An entry whose identity-matched object dies is invalidated by torch; so is the imported set.
    def make():
        class Local:
            def __init__(self) -> None:
                self.v = 2

        return Local()

    def call_it(x, o):
        return x * o.v

    o = make()
    torch._dynamo.reset()
    with torch_compiling():
        torch.compile(call_it, backend="eager", dynamic=False)(torch.ones(1), o)
    gs = twt.guards_of(call_it, drop=twt.PENDING_KINDS)
    assert gs.check({"x": torch.ones(1), "o": o})
    local_class = weakref.ref(type(o))
    del o
    gc.collect()
    entries = _debug_get_cache_entry_list(call_it.__code__)
    if local_class() is not None:
        # torch 2.13 on CPython 3.12 keeps the class alive (a script that imports only torch shows
        # it): then neither side may invalidate, and both must still decide.
        assert sys.version_info[:2] == (3, 12), "only torch on 3.12 was seen keeping the class"
        assert type(entries[0].guard_manager).__name__ != "DeletedGuardManagerWrapper"
        assert not gs.invalid
        return
    assert type(entries[0].guard_manager).__name__ == "DeletedGuardManagerWrapper"
    with pytest.raises(tw.TorchImportError, match="invalidated"):
        twt.guards_of(call_it)
    assert gs.invalid  # the class it TYPE_MATCHed died


def test_torch_is_imported_lazily():
    code = "import sys, tripwire, tripwire.torch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_frame_locals_matches_torchs_frame():
    inner = make_closure(7)
    L = twt.frame_locals(inner, torch.ones(1), with_defaults, m=9)
    assert L["k"] == 7 and L["n"] == 3 and L["m"] == 9 and L["fn"] is with_defaults
    model = Shared()
    assert twt.frame_locals(model, 1) == {"self": model, "x": 1}
    assert twt.frame_locals(torch.compile(model, backend="eager"), 1)["self"] is model
    with pytest.raises(TypeError):
        twt.frame_locals(3)


def test_split_site_and_literals():
    from tripwire.torch._printed import literal as _literal
    from tripwire.torch._printed import parse as _parse
    from tripwire.torch._tree import split_site

    assert split_site("L['x'] == 3" + " " * 50 + "  # y = x + n  # f.py:12 in f") == (
        "L['x'] == 3",
        "f.py:12 in f",
    )
    assert split_site("L['s'] == 'a  # b'  # y  # g.py:1 in g") == ("L['s'] == 'a  # b'", "g.py:1 in g")
    code, site = split_site(
        "___check_type_id(L['t'], 1), type=<class 'tuple'>  # y  # g.py:3 in h (HINT: type tuple)"
    )
    assert code == "___check_type_id(L['t'], 1), type=<class 'tuple'>" and site == "g.py:3 in h"
    assert _literal(_parse("(1, -2.5, inf, 1+2j, b'x', None, frozenset({1}), {2: [3]})")) == (
        1,
        -2.5,
        float("inf"),
        1 + 2j,
        b"x",
        None,
        frozenset({1}),
        {2: [3]},
    )
    with pytest.raises(ValueError):
        _literal(_parse("torch.float32"))


# =================================================================================================
# Adversarial
# =================================================================================================
def test_without_torchs_identity_records_every_guard_still_decides_exactly(monkeypatch):
    """If the objects behind torch's ids cannot be found, TYPE_MATCH and ID_MATCH fall back to
    calling torch's own leaf: slower, never different."""
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(1, 3, 8, 8)
    gm = compile_and_call(model, x)
    monkeypatch.setattr(_tree, "identity_objects", lambda gm: {})
    gs = import_checked(model, twt.PENDING_KINDS, TENSOR_KINDS)
    cov = gs.torch_import.coverage()
    assert cov["TYPE_MATCH"]["torch"] == cov["TYPE_MATCH"]["total"] and cov["ID_MATCH"]["native"] == 0
    assert all(
        "no live object" in g.why or "not reachable" in g.why
        for g in gs.torch_import.by_outcome("torch")
        if g.kind in ("TYPE_MATCH", "ID_MATCH")
    )

    def swap(rng):
        mods = model.layers._modules
        return replace_dict(
            mods,
            one_of(rng, [[("0", mods["1"]), ("1", mods["0"])], [("0", nn.Identity()), ("1", mods["1"])]]),
        )

    def conv(rng):
        return set_attr(one_of(rng, submodules(model, nn.Conv2d)), "stride", one_of(rng, ((1, 1), (2, 2))))

    Differential(gm, gs, lambda: {"self": model, "x": x}).run([swap, conv], TRIALS // 4, seed=11)


def test_unreadable_dict_manager_length_is_reported_not_guessed(monkeypatch):
    from tripwire.torch import _rules
    from tripwire.torch._layout import LayoutUnknown

    def unreadable(mgr):
        raise LayoutUnknown("a torch whose DictGuardManager layout is unknown")

    compile_and_call(
        dicts_fn,
        torch.ones(2),
        {"ab": 1, "c": 2.0},
        (2, (3, 4)),
        collections.OrderedDict(p=1),
        collections.defaultdict(int, z=3),
        MyDict(u=1, w=2),
    )
    monkeypatch.setattr(_rules, "dict_manager_length", unreadable)
    with pytest.raises(tw.GuardsNotImportable) as e:
        twt.guards_of(dicts_fn, drop=twt.PENDING_KINDS)
    assert {g.kind for g in e.value.guards} == {"DictGuardManager"}
    assert all("not readable" in g.why and g.code.endswith("== ?") for g in e.value.guards)
    gs = twt.guards_of(dicts_fn, drop=(*twt.PENDING_KINDS, "DictGuardManager"))
    assert {g.source for g in gs.torch_import.dropped if g.kind == "DictGuardManager"} == {
        "L['d']",
        "L['md']",
    }


def test_lying_eq_inside_a_tuple_decides_as_torch():
    """torch's EQUALS on a tuple runs the elements' __eq__; equals='exact' imports it as
    EQUALS_MATCH with python_eq, whose fast form leaves an int subclass to Python's ==, so a lying
    element decides as in torch; equals='strict' (type-exact) refuses it."""

    class Liar(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    model = ConvNet()
    x = torch.randn(1, 3, 8, 8)
    gm = compile_and_call(model, x)
    exact = twt.guards_of(model, drop=twt.PENDING_KINDS)
    strict = twt.guards_of(model, drop=twt.PENDING_KINDS, equals="strict")
    L = {"self": model, "x": x}
    for value in [(Liar(5), 1), (1, Liar(9)), (Liar(1), Liar(1))]:
        undo = set_attr(model.stem[0], "padding", value)
        try:
            assert exact.check(L) == gm.check(L), value
            assert strict.check(L) is False
        finally:
            undo()


def test_hostile_attributes_fail_both_sides():
    """A config whose attribute raises, or whose __getattr__ answers anything: tripwire reads it
    as torch does (getattr), and an exception fails the guard on both sides."""
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (1, 4))
    gm = compile_and_call(model, idx)
    gs = twt.guards_of(model, drop=twt.PENDING_KINDS)
    lam = root_aliasing_lambdas(gm)

    class Raising:
        causal = True

        @property
        def heads(self):
            raise RuntimeError("no heads today")

    class Anything:
        def __getattr__(self, name):
            return getattr(cfg, name)

    calls = []

    class Counting:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(cfg, name)

    for hostile in (Raising(), Anything(), Counting(), dataclasses.replace(cfg)):
        for b in model.blocks:
            undo = set_attr(b.attn, "cfg", hostile)
            try:
                L = {"self": model, "idx": idx}
                assert gm.check(L) == (gs.check(L) and all(f(L) for f in lam)), hostile
            finally:
                undo()


def test_odd_keys_and_strings_in_printed_code():
    """Keys and constants that look like the printed code's own syntax (a comment marker, quotes,
    parentheses, `, type=`) are read from torch's objects or checked against torch's guard."""
    weird = {"a  # b": 1, "x') == 1 or ('": 2, ", type=<class 'int'>": 3, "(HINT: no)": 4}

    def f(x, d, s):
        for k, v in d.items():
            x = x + v
        if s == "  # not a comment":
            x = x + 1
        return x + d["a  # b"]

    gm = compile_and_call(f, torch.ones(1), dict(weird), "  # not a comment")
    gs = import_checked(f, twt.PENDING_KINDS, TENSOR_KINDS)
    assert not gs.torch_import.by_outcome("torch")
    for d, s in [
        (dict(weird), "  # not a comment"),
        ({**weird, "x') == 1 or ('": 5}, "  # not a comment"),
        (dict(weird), "not a comment"),
        (dict(reversed(list(weird.items()))), "  # not a comment"),
    ]:
        L = {"x": torch.ones(1), "d": d, "s": s}
        assert gs.check(L) == gm.check(L), (d, s)


def test_threads_share_an_imported_set_that_calls_torch(monkeypatch):
    import threading

    from tripwire.torch import _rules

    def no_form(*args):
        raise _rules._Fallback("no tripwire form (this test)")

    model = ConvNet()
    x = torch.randn(1, 3, 8, 8)
    gm = compile_and_call(model, x)
    # Every guard of this model has a tripwire form now: take EQUALS_MATCH's away, so the stride
    # tuples are checked by torch's own leaf objects, called from several threads.
    monkeypatch.setitem(_rules.LEAF_RULES, "EQUALS_MATCH", no_form)
    gs = twt.guards_of(model, drop=twt.PENDING_KINDS)
    assert gs.torch_import.by_outcome("torch")
    L_ok = {"self": model, "x": x}
    other = copy.deepcopy(model)
    other.stem[0].stride = (2, 2)
    L_bad = {"self": other, "x": x}
    errors = []

    def run():
        try:
            for i in range(gc_stress.scaled(300, 10)):
                assert gs.check(L_ok) is True
                assert gs.check(L_bad) is False
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert gm.check(L_ok) and not gm.check(L_bad)


def test_imported_set_outlives_torchs_cache(monkeypatch):
    """An imported set that calls torch's leaf guards keeps torch's tree alive: after
    torch._dynamo.reset() (which also deletes the globals Dynamo installed, so the guards on those
    now fail) every guard still evaluates, and torch's own guards answer as before."""
    from tripwire.torch import _rules

    def no_form(*args):
        raise _rules._Fallback("no tripwire form (this test)")

    model = ConvNet()
    x = torch.randn(1, 3, 8, 8)
    compile_and_call(model, x)
    # Every guard of this model has a tripwire form now: take EQUALS_MATCH's away, so the
    # dilation tuples are torch's own leaf objects, which must outlive torch's cache.
    monkeypatch.setitem(_rules.LEAF_RULES, "EQUALS_MATCH", no_form)
    gs = twt.guards_of(model, drop=twt.PENDING_KINDS)
    assert gs.torch_import.by_outcome("torch")
    other = copy.deepcopy(model)
    other.stem[0].dilation = (2, 2)
    assert gs.check({"self": model, "x": x}) and not gs.check({"self": other, "x": x})
    torch._dynamo.reset()
    gc.collect()
    assert _debug_get_cache_entry_list(ConvNet.forward.__code__) == []
    ok = gs.failures({"self": model, "x": x})
    bad = gs.failures({"self": other, "x": x})
    installed = ("G['__import_torch_dot_nn_dot", "dict.__getitem__(G['__builtins_dict___")
    assert ok and all(f.source.startswith(installed) for f in ok), ok
    extra = [f for f in bad if not f.source.startswith(installed)]
    assert [(f.kind, "'dilation'" in f.source) for f in extra] == [("LAMBDA", True)], extra


def test_torchs_laxness_is_inherited_and_recorded():
    """torch 2.13 guards no hook dict (skip_nnmodule_hook_guards) and exempts parameters from its
    no-aliasing check: the imported set decides as torch (a hook passes) and says so."""
    torch.manual_seed(0)
    model = ConvNet()
    x = torch.randn(1, 3, 8, 8)
    gm = compile_and_call(model, x)
    gs = twt.guards_of(model, drop=twt.PENDING_KINDS)
    L = {"self": model, "x": x}
    handles = [
        model.stem[0].register_forward_hook(lambda *a: None),
        nn.modules.module.register_module_forward_pre_hook(lambda *a: None),
    ]
    try:
        assert gm.check(L) is True and gs.check(L) is True
    finally:
        for h in handles:
            h.remove()
    ex = {e.kind: e for e in gs.torch_import.exemptions}
    assert "L['self']" in ex["NN_MODULE_HOOKS"].sources
    params = ex["NO_TENSOR_ALIASING"].sources
    assert params and all("_parameters[" in s for s in params)
    text = gs.explain()
    assert "skip_nnmodule_hook_guards" in text and "skip_no_tensor_aliasing_guards_on_parameters" in text


def test_dict_manager_length_is_read_and_verified():
    from torch._C._dynamo.guards import RootGuardManager
    from torch._dynamo.guards import GuardManagerType

    from tripwire.torch._layout import LayoutUnknown, dict_manager_length

    root = RootGuardManager()
    kinds = (dict, collections.OrderedDict, MyDict, lambda items: collections.defaultdict(int, items))
    for n in range(0, 40, 3):
        for i, kind in enumerate(kinds):
            example = kind({f"k{j}": j for j in range(n)})
            mgr = root.framelocals_manager(
                key=(f"d{n}_{i}", 0),
                source=f"L['d{n}_{i}']",
                example_value=example,
                guard_manager_enum=GuardManagerType.DICT_GUARD_MANAGER,
            )
            assert dict_manager_length(mgr) == n
    # Any other manager is refused before anything is read.
    plain = root.framelocals_manager(
        key=("plain", 0),
        source="L['plain']",
        example_value={"a": 1},
        guard_manager_enum=GuardManagerType.GUARD_MANAGER,
    )
    with pytest.raises(LayoutUnknown):
        dict_manager_length(plain)


def test_imported_tensor_guards_are_torchs_parameters():
    """TENSOR_MATCH is what tripwire itself would build from the example (type, dispatch keys as
    torch normalised them, dtype, device, requires_grad, sizes, strides); markings, aliasing and
    global state likewise."""
    from tripwire import tensors
    from tripwire.catalogue import resolve

    torch.manual_seed(0)
    model = Shared()
    x = torch.randn(2, 4)
    compile_and_call(model, x)
    gs = twt.guards_of(model)
    assert not gs.torch_import.dropped
    by = collections.defaultdict(list)
    for spec in gs.guards:
        by[spec.kind.name].append(spec)
    tx = next(s for s in by["TENSOR_MATCH"] if str(s.source) == "L['x']")
    assert resolve(tx.args[0]) is torch.Tensor and tx.args[1] == tensors.expect_tensor(x)
    tw_ = next(s for s in by["TENSOR_MATCH"] if "weight" in str(s.source))
    assert resolve(tw_.args[0]) is nn.Parameter and tw_.args[1] == tensors.expect_tensor(model.a.weight)
    assert all(s.args[0].attrs == (None,) * 5 for s in by["DIMENSION_MARKING"])
    # torch's `L['self']._modules['b'] is L['self']._modules['a']`, read through the same
    # __dict__ steps as the guards below those modules
    ((b, a),) = [(str(s.source), str(s.args[0])) for s in by["ALIAS"]]
    assert b.endswith("'_modules'), 'b')") and a.endswith("'_modules'), 'a')"), (b, a)
    state = next(s for s in by["GLOBAL_STATE"] if s.args[0] == "torch_global_state")
    assert gs.check({"self": model, "x": x})
    with torch.no_grad():
        assert gs.why_not({"self": model, "x": x}).kind == "GLOBAL_STATE"
    assert state.args[1][0] == 1  # grad mode at compile time


def test_mode_stack_and_default_device_snapshots_only_when_torchs_leaf_passes():
    """torch prints no snapshot of its mode stack: it is read at import only when torch's own leaf
    passes then; imported elsewhere, torch's leaf decides (exact, recorded)."""

    def f(x):
        return x + 1

    x = torch.ones(2)
    with PassThroughMode():
        gm = compile_and_call(f, x)
        inside = twt.guards_of(f)
    outside = twt.guards_of(f)
    kinds = {g.kind: g.outcome for g in inside.torch_import.guards}
    assert kinds["TORCH_FUNCTION_MODE_STACK"] == "native"
    assert {g.kind: g.outcome for g in outside.torch_import.guards}["TORCH_FUNCTION_MODE_STACK"] == "torch"
    L = {"x": x}
    for gs in (inside, outside):
        assert gm.check(L) is False and gs.check(L) is False
        assert gs.why_not(L).kind in ("GLOBAL_STATE", "LAMBDA")
        with PassThroughMode():
            assert gm.check(L) is True and gs.check(L) is True


def duplicate_inputs(a, b, c):
    return a * 2 + b + c


def test_differential_duplicate_input():
    """Compiled with the same tensor passed twice: torch's DUPLICATE_INPUT `a is b` lambda becomes
    an ALIAS (NO_TENSOR_ALIASING then covers the distinct ones); un-aliasing fails both sides."""
    a, c = torch.randn(3), torch.randn(3)
    gm = compile_and_call(duplicate_inputs, a, a, c)
    gs = import_checked(duplicate_inputs, twt.PENDING_KINDS, TENSOR_KINDS)
    assert [s.kind for s in gs.guards if s.kind is tw.GuardKind.ALIAS]
    state = {"a": a, "b": a, "c": c}

    def unalias(rng):
        old = state["b"]
        state["b"] = one_of(rng, (a.clone(), c, a))

        def undo():
            state["b"] = old

        return undo

    diff = Differential(gm, gs, lambda: dict(state))
    diff.run([unalias], TRIALS, seed=13)
    if TRIALS >= 200:
        assert "ALIAS" in diff.failed_kinds, diff.failed_kinds


def test_the_python_reader_path_imports_the_same_guards():
    # A build without the torch adapter reads tensors through Python (tripwire.tensors
    # _read_tensor): about 90x slower per check of gpt's set (bench/README.md, "Without the torch
    # adapter"), which is why the default build includes the adapter whenever torch
    # imports (CMakeLists.txt, TRIPWIRE_TORCH_ADAPTER=AUTO). That cost must come from the readers
    # alone: guards_of imports the same guards, by kind and source, with the same answers, and
    # explain() names the path each tensor guard takes. (No timing here: bench/real_models.py.)
    from engine_switches import python_readers

    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (2, 8))
    compile_and_call(model, idx)
    native = twt.guards_of(model, drop=twt.PENDING_KINDS)
    with python_readers(True):
        slow = twt.guards_of(model, drop=twt.PENDING_KINDS)
    key = lambda gs: collections.Counter((g.kind.name, str(g.source)) for g in gs.guards)
    assert key(slow) == key(native)
    assert collections.Counter(g.kind.name for g in slow.guards)["TENSOR_MATCH"] > 0
    L = twt.frame_locals(model, idx)
    other = dict(L, idx=idx.to(torch.float64))
    for f_locals in (L, other):
        assert slow.check(f_locals) == native.check(f_locals)
    assert native.check(L) and not native.check(other)
    tensor_lines = lambda gs: [
        line  # the guard lines, not the summary ("TENSOR_MATCH: 38 = 38 native")
        for line in gs.explain().splitlines()
        if line.lstrip().startswith("TENSOR_MATCH:") and ", installed at " in line
    ]
    assert len(tensor_lines(slow)) == len(tensor_lines(native)) > 0
    if tw.tensors.adapter_status().startswith("torch adapter"):
        assert all("[torch adapter]" in line for line in tensor_lines(native))
    assert all("[python reader: no torch adapter]" in line for line in tensor_lines(slow))


class _Zeros(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pair = (0.0, 1)

    def forward(self, x, s):
        # torch.tensor(self.pair) makes Dynamo guard the whole tuple (an EQUALS_MATCH on a
        # container); s is guarded as a scalar.
        return 1 / (x * s) + 1 / (x * torch.tensor(self.pair)[0])


def test_a_float_zero_is_imported_with_its_sign_and_recorded_as_stricter():
    """torch's EQUALS_MATCH matches 0.0 with -0.0 (==), yet the code it guards computes +inf for
    one and -inf for the other. tripwire's EQUALS_MATCH compares the sign: the imported guards on
    a zero fail on the other zero (a scalar, and a tuple: type-exact EQUALS, not python_eq), and
    each says so in its `why`. Other values still decide as torch does."""
    model, x = _Zeros(), torch.ones(2)
    gm = compile_and_call(model, x, 0.0)
    gs = twt.guards_of(model)
    L = {"self": model, "x": x, "s": 0.0}
    assert gs.check(L) is True and gm.check(L) is True
    for s, pair, src in [
        (-0.0, (0.0, 1), "L['s']"),
        (0.0, (-0.0, 1), "dict.__getitem__(L['self'].__dict__, 'pair')"),
    ]:
        undo = set_attr(model, "pair", pair)
        try:
            other = {"self": model, "x": x, "s": s}
            assert gm.check(other) is True  # torch's guard passes; its code is wrong there
            assert gs.check(other) is False
            assert str(gs.why_not(other).source) == src
            assert not torch.equal(model(x, s), model(x, 0.0))
        finally:
            undo()
    zeros = [g for g in gs.torch_import.guards if "0.0" in g.code and g.kind == "EQUALS_MATCH"]
    assert len(zeros) == 2
    assert all(g.outcome == "native" and "0.0 and -0.0 are two values" in g.why for g in zeros)
    assert "0.0 and -0.0 are two values" in gs.explain()
    for s, pair, torch_passes in [(1.0, (0.0, 1), False), (0.0, (0.0, 2), False), (0.0, (0, 1), True)]:
        # (0, 1) == (0.0, 1) for torch's ==; the type-exact tuple guard refuses it (and
        # torch.tensor((0, 1)) is an int64 tensor: another graph)
        undo = set_attr(model, "pair", pair)
        try:
            v = {"self": model, "x": x, "s": s}
            assert gm.check(v) is torch_passes
            assert gs.check(v) is False
        finally:
            undo()
