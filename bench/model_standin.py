"""Stand-in real-model workloads: the non-tensor guards torch.compile installs, re-declared in tripwire.

Three workloads, each a real function compiled with ``torch.compile(fn, backend="eager")``:

* ``GPT`` -- a small GPT (token and position embeddings, 6 blocks of LayerNorm, q/k/v/o attention,
  an MLP with GELU, dropout everywhere, one config object shared by every attention module);
* ``CNN`` -- a small residual CNN (a ``Sequential`` stem of Conv2d/BatchNorm2d/ReLU, 4 residual
  blocks of Conv2d/BatchNorm2d/ReLU in a ``Sequential``, adaptive pooling, a Linear head);
* ``FNCFG`` -- a function of a nested config (dataclasses holding a tuple, a list and a dict with
  an int key), an object probed with ``hasattr``, a global dict probed with an int key and a global
  closure with positional and keyword-only defaults.

How the tripwire guards are obtained: torch compiles the function once with a ``guard_filter_fn``
that drops its tensor guards (TENSOR_MATCH and the DIMENSION_DYNAMIC_MARKING guards derived from
it: tensor kinds are another issue's), then this module walks the printed guard tree of that
compile (``str(guard_manager)``) and declares, on the same sources (rebuilt from the accessors:
``.__dict__``, ``['k']``, ``.__code__``, ``.__defaults__[i]``, ``.__closure__[i].cell_contents``,
``list(dict.keys(X))[i]``...), the tripwire guard of the same meaning, with ``GuardBuilder``. So the
guard set is what Dynamo decided, shapes included that have no user-code-free form in tripwire
(Python probes for GLOBAL_STATE and friends, LAMBDA guards for object aliasing, HASATTR, DICT_CONTAINS
with an int key, ``__code__``/``__defaults__``/closure steps, hooks dicts of ``torch.nn.modules.module``
read through a module ``__dict__``). The same filtered torch compile is the like-for-like contender
(``torch-same``); an unfiltered compile is ``torch`` (every guard, tensors included).

Mapping (torch leaf guard -> tripwire): TYPE_MATCH, ID_MATCH, EQUALS_MATCH, TRUE/FALSE/NONE_MATCH,
NOT_NONE, LENGTH_CHECK, DICT_CONTAINS, NO_HASATTR (HASATTR present=False), DICT_VERSION one to one;
a ``DictGuardManager`` (which checks exact dict type and length itself, without leaf guards) ->
TYPE_MATCH(dict) + LENGTH on the dict; GLOBAL_STATE, TORCH_FUNCTION_MODE_STACK, DEFAULT_DEVICE and
the saved-tensor-hooks LAMBDA on the root -> GLOBAL_STATE with a Python probe reading the same
state; an epilogue LAMBDA (``A is B``, object aliasing) -> a sourceless LAMBDA evaluating the same
expression on f_locals and the globals. ``conversion_counts`` reports both sides per kind.

This module needs torch (the models are real ``nn.Module`` s); ``guard_eval.py`` lists these
workloads only when torch imports.
"""

from __future__ import annotations

import ast
import copy
import re
import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tripwire.builder import GuardBuilder

__all__ = ["MODEL_WORKLOADS", "StandIn", "build_standin", "convert_tree"]

MODEL_WORKLOADS = ("GPT", "CNN", "FNCFG")
DESCRIPTIONS = {
    "GPT": "a small GPT (embeddings, 6 blocks of LayerNorm, q/k/v/o attention, MLP, dropout, a shared config)",
    "CNN": "a small residual CNN (Conv2d, BatchNorm2d, ReLU, 4 residual blocks, Sequential, pooling, Linear)",
    "FNCFG": "a function of a nested config (dataclasses, a tuple, a list, an int-keyed dict), hasattr, a "
    "global dict, a global closure with defaults",
}

_MODELS_SRC = """
import torch
from torch import nn
from dataclasses import dataclass, field


@dataclass
class GPTConfig:
    vocab: int = 128
    n_embd: int = 32
    n_head: int = 4
    n_layer: int = 6
    block: int = 16
    dropout: float = 0.0
    bias: bool = True


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.k = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.v = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.o = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        B, T, C = x.shape
        h = self.cfg.n_head
        q = self.q(x).view(B, T, h, C // h).transpose(1, 2)
        k = self.k(x).view(B, T, h, C // h).transpose(1, 2)
        v = self.v(x).view(B, T, h, C // h).transpose(1, 2)
        a = (q @ k.transpose(-2, -1)) * (1.0 / (C // h) ** 0.5)
        a = self.drop(a.softmax(-1))
        return self.o((a @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


class CNN(nn.Module):
    def __init__(self, c=16, n_blocks=4, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.layers = nn.Sequential(*[ResBlock(c) for _ in range(n_blocks)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def run_model(model, x):
    return model(x)


@dataclass
class Opt:
    lr: float = 0.1
    betas: tuple = (0.9, 0.99)
    schedule: dict = field(default_factory=lambda: {"warmup": 10, 3: "three"})


@dataclass
class Cfg:
    mode: str = "train"
    opt: Opt = field(default_factory=Opt)
    layers: list = field(default_factory=lambda: [16, 32])


def make_scale(k):
    def scale(x, factor=2.0, *, bias=0.5):
        return x * factor * k + bias

    return scale


scale = make_scale(3)
TABLE = {1: "a", 2: "b", 3: "c"}


class Holder:
    def __init__(self):
        self.flag = True
        self.extra = None


def run_cfg(x, cfg, h):
    if cfg.mode == "train":
        x = x * cfg.opt.lr
    x = x + cfg.opt.betas[0] + cfg.layers[1]
    if 3 in cfg.opt.schedule:
        x = x + 1
    if 2 in TABLE:
        x = x + 2
    if type(h) is Holder and hasattr(h, "missing"):
        x = x + 3
    if h.flag:
        x = scale(x)
    return x
"""

_NS_COUNTER = [0]


def _fresh_namespace() -> types.ModuleType:
    """The models and functions defined in a new module (new code objects: two compiles never
    share a cache entry, and the globals dict holds Dynamo's installed names for this compile)."""
    _NS_COUNTER[0] += 1
    name = f"tripwire_bench_models_{_NS_COUNTER[0]}"
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    exec(compile(_MODELS_SRC, f"<{name}>", "exec"), mod.__dict__)
    return mod


def _inputs(name: str, ns: types.ModuleType) -> tuple[Any, dict, dict]:
    """(function to compile, passing locals, failing locals) for workload `name`."""
    import torch

    torch.manual_seed(0)
    if name == "GPT":
        model = ns.GPT(ns.GPTConfig()).eval()
        x = torch.randint(0, 128, (2, 16))
        bad = copy.deepcopy(model)
        bad.blocks[5].mlp.drop.p = 0.5  # the last block's MLP dropout: a late EQUALS_MATCH
        return ns.run_model, {"model": model, "x": x}, {"model": bad, "x": x}
    if name == "CNN":
        model = ns.CNN().eval()
        x = torch.randn(1, 3, 8, 8)
        bad = copy.deepcopy(model)
        bad.layers[3].bn2.eps = 1e-3
        return ns.run_model, {"model": model, "x": x}, {"model": bad, "x": x}
    if name == "FNCFG":
        x = torch.ones(2)
        cfg, h = ns.Cfg(), ns.Holder()
        bad = ns.Cfg()
        bad.opt.schedule.pop(3)
        return ns.run_cfg, {"x": x, "cfg": cfg, "h": h}, {"x": x, "cfg": bad, "h": ns.Holder()}
    raise KeyError(name)


def fresh_locals(name: str, w: Any) -> dict:
    """A deep copy of workload `w`'s passing locals (the models and configs copied; torch's and
    tripwire's ID_MATCH'd globals are shared)."""
    return copy.deepcopy(w.f_locals)


def mutations(name: str) -> list:
    """Single mutations of a workload's locals, each breaking one guard torch installed."""
    if name == "FNCFG":
        return [
            lambda L: setattr(L["cfg"], "mode", "eval"),
            lambda L: setattr(L["cfg"].opt, "lr", 0.2),
            lambda L: L["cfg"].layers.append(1),
            lambda L: L["cfg"].opt.schedule.pop(3),
            lambda L: setattr(L["h"], "flag", False),
            lambda L: setattr(L["h"], "missing", 1),
            lambda L: setattr(L["cfg"].opt, "betas", (0.8, 0.99)),
            lambda L: None,
        ]
    if name == "CNN":
        return [
            lambda L: setattr(L["model"].layers[1].bn1, "eps", 1e-3),
            lambda L: setattr(L["model"].layers[2].bn1, "training", True),
            lambda L: L["model"].layers[0].__dict__.__setitem__("forward", None),
            lambda L: setattr(L["model"].stem[1], "momentum", 0.2),
            lambda L: None,
        ]
    if name == "GPT":
        return [
            lambda L: setattr(L["model"].blocks[2].attn.drop, "p", 0.3),
            lambda L: setattr(L["model"].cfg, "n_head", 8),
            lambda L: None,
        ]
    raise KeyError(name)


_TENSOR_TYPES = frozenset({"TENSOR_MATCH"})
# Framework state (torch's C++ probes; tripwire reaches it only through Python probes until a
# torch adapter exists) and object aliasing (an epilogue Python lambda in torch; ALIAS in tripwire
# once the tensors issue lands): left out of the "core" variants on both sides.
_AMBIENT_TYPES = frozenset(
    {
        "AUTOGRAD_SAVED_TENSORS_HOOKS",
        "GRAD_MODE",
        "DETERMINISTIC_ALGORITHMS",
        "GLOBAL_STATE",
        "TORCH_FUNCTION_STATE",
        "DEFAULT_DEVICE",
        "SHAPE_ENV",
        "DUPLICATE_INPUT",
    }
)


def _guard_filter(core: bool):
    drop = _TENSOR_TYPES | (_AMBIENT_TYPES if core else frozenset())

    def keep(entries):
        return [e.guard_type not in drop for e in entries]

    return keep


def compile_torch(name: str, filtered: bool, core: bool = False):
    """Compile workload `name` in a fresh namespace: (guard manager, passing locals, failing locals,
    globals dict). ``filtered`` drops torch's tensor guards (the like-for-like set); ``core`` also
    its framework-state and aliasing guards."""
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    ns = _fresh_namespace()
    fn, ok, bad = _inputs(name, ns)
    opts = {"guard_filter_fn": _guard_filter(core)} if filtered else None
    cfn = torch.compile(fn, backend="eager", options=opts) if opts else torch.compile(fn, backend="eager")
    cfn(*ok.values())
    entries = _debug_get_cache_entry_list(fn.__code__)
    if len(entries) != 1:
        raise RuntimeError(f"{name}: expected one cache entry, found {len(entries)}")
    return entries[0].guard_manager, ok, bad, fn.__globals__


# -- torch's printed tree -> tripwire guards ----------------------------------------------------------
_LINE = re.compile(r"^((?:\| )*)\+- (.*)$")
_COMMENT = re.compile(r"\s+#.*$")


@dataclass
class _Node:
    depth: int
    src: str | None  # the tripwire source; None for G itself and for pending accessor nodes
    pending: str = ""  # "defaults", "kwdefaults", "closure", "cell": a step that needs its child
    index: int = 0  # pending closure index


def _accessor_step(parent: _Node, accessed_by: str) -> _Node:
    """The tripwire source for a manager reached from `parent` through torch accessor `accessed_by`."""
    d = parent.depth + 1
    p = parent.src
    m = re.match(r"(\w+)(?:\((.*)\))?$", accessed_by)
    if m is None:
        raise ValueError(f"unknown accessor {accessed_by!r}")
    kind, arg = m.group(1), m.group(2)
    if kind == "FrameLocalsGuardAccessor":
        key = re.match(r"key='([^']+)'", arg or "")
        assert key, accessed_by
        return _Node(d, f"L['{key.group(1)}']")
    if kind == "GlobalsGuardAccessor":
        return _Node(d, None, pending="globals")
    if kind in (
        "DictGetItemGuardAccessor",
        "GetItemGuardAccessor",
        "TupleGetItemGuardAccessor",
        "ListGetItemGuardAccessor",
    ):
        key = ast.literal_eval(arg)
        if parent.pending == "globals":
            return _Node(d, f"G[{key!r}]")
        if parent.pending == "defaults":
            return _Node(d, f"{p}.__defaults__[{key}]")
        if parent.pending == "kwdefaults":
            return _Node(d, f"{p}.__kwdefaults__[{key!r}]")
        if parent.pending == "closure":
            return _Node(d, p, pending="cell", index=key)
        assert not parent.pending, (parent, accessed_by)
        return _Node(d, f"{p}[{key!r}]")
    if kind == "GetAttrGuardAccessor":
        if parent.pending == "cell" and arg == "cell_contents":
            return _Node(d, f"{p}.__closure__[{parent.index}].cell_contents")
        assert not parent.pending, (parent, accessed_by)
        if arg in ("__dict__", "__code__", "__defaults__", "__kwdefaults__", "__closure__"):
            return _Node(d, f"getattr({p}, {arg!r})")
        return _Node(d, f"{p}.{arg}")
    if kind == "GetGenericDictGuardAccessor":
        return _Node(d, f"{p}.__dict__")
    if kind == "CodeGuardAccessor":
        return _Node(d, f"{p}.__code__")
    if kind == "TypeGuardAccessor":
        return _Node(d, f"type({p})")
    if kind == "FuncDefaultsGuardAccessor":
        return _Node(d, p, pending="defaults")
    if kind == "FuncKwDefaultsGuardAccessor":
        return _Node(d, p, pending="kwdefaults")
    if kind == "ClosureGuardAccessor":
        return _Node(d, p, pending="closure")
    raise ValueError(f"accessor {kind} is not mapped")


@dataclass
class _Conversion:
    torch_counts: Counter = field(default_factory=Counter)  # leaf guards of the torch tree, by kind
    tw_counts: Counter = field(default_factory=Counter)  # tripwire guards declared, by kind
    dict_managers: int = 0


def _probe_global_state():
    import torch

    return (
        torch.is_grad_enabled(),
        str(torch.get_default_dtype()),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        torch._C._is_torch_function_enabled(),
        torch.is_autocast_enabled("cpu"),
    )


def _probe_function_mode_stack():
    import torch

    return len(torch.overrides._get_current_function_mode_stack())


def _probe_default_device():
    import torch.utils._device as dev

    return None if dev.CURRENT_DEVICE is None else str(dev.CURRENT_DEVICE)


def _probe_saved_tensors_hooks():
    import torch

    return torch._C._autograd._top_saved_tensors_default_hooks(False) is None


_AMBIENT_PROBES = {
    "GLOBAL_STATE": _probe_global_state,
    "TORCH_FUNCTION_MODE_STACK": _probe_function_mode_stack,
    "DEFAULT_DEVICE": _probe_default_device,
}


def _alias_predicate(expr: str, f_globals: dict):
    """A sourceless LAMBDA for torch's epilogue aliasing guard ``A is B`` (torch's own expression,
    evaluated on f_locals and the globals)."""
    code = compile(f"lambda L: {expr}", "<alias guard>", "eval")
    return eval(code, {"G": f_globals})


def convert_tree(text: str, b: GuardBuilder, f_globals: dict) -> _Conversion:
    """Declare on builder `b` the tripwire equivalent of every non-tensor guard in torch's printed
    guard tree `text` (see the module docstring for the mapping)."""
    conv = _Conversion()
    stack: list[_Node] = []
    root_depth = None
    for raw in text.splitlines():
        m = _LINE.match(raw)
        if m is None:
            continue
        depth, body = len(m.group(1)) // 2, m.group(2)
        if body.startswith("RootGuardManager"):
            root_depth = depth
            stack = [_Node(depth, None, pending="root")]
            continue
        while stack and stack[-1].depth >= depth:
            stack.pop()
        if root_depth is not None and depth <= root_depth:
            # an epilogue guard printed after the root's subtree
            stack = [_Node(depth - 1, None, pending="root")]
        parent = stack[-1]
        head, _, rest = body.partition(": ")
        if head in ("GuardManager", "DictGuardManager"):
            acc = re.search(r"accessed_by=(\w+(?:\((?:[^()]|\([^()]*\))*\))?)", rest)
            assert acc, raw
            node = _accessor_step(parent, acc.group(1))
            stack.append(node)
            if head == "DictGuardManager":
                conv.dict_managers += 1
                b.type_match(node.src, dict)
                b.length(node.src)
                conv.tw_counts["TYPE_MATCH (dict manager)"] += 1
                conv.tw_counts["LENGTH (dict manager)"] += 1
            continue
        if head.startswith("KeyValueManager"):
            idx = int(re.search(r"index=(\d+)", body).group(1))
            stack.append(_Node(depth, parent.src, pending=f"kv{idx}"))
            continue
        if head in ("KeyManager", "ValueManager"):
            idx = int(parent.pending[2:])
            dsrc = parent.src
            src = (
                f"list(dict.keys({dsrc}))[{idx}]"
                if head == "KeyManager"
                else f"{dsrc}[list(dict.keys({dsrc}))[{idx}]]"
            )
            stack.append(_Node(depth, src))
            continue
        kind, code = head, _COMMENT.sub("", rest)
        conv.torch_counts[kind] += 1
        src = parent.src
        if kind in ("TENSOR_MATCH", "DIMENSION_DYNAMIC_MARKING_GUARD"):
            continue  # tensor guards: filtered out of the like-for-like set
        if kind == "TYPE_MATCH":
            b.type_match(src)
        elif kind == "ID_MATCH":
            b.id_match(src)
        elif kind == "EQUALS_MATCH":
            b.equals(src)
        elif kind == "TRUE_MATCH":
            b.true(src)
        elif kind == "FALSE_MATCH":
            b.false(src)
        elif kind == "NONE_MATCH":
            b.none(src)
        elif kind == "NOT_NONE":
            b.not_none(src)
        elif kind == "LENGTH_CHECK":
            b.length(src)
        elif kind == "DICT_VERSION":
            b.dict_version(src)
        elif kind == "DICT_CONTAINS":
            mm = re.match(r"(not )?___dict_contains\((.+), ", code)
            assert mm, code
            b.dict_contains(src, ast.literal_eval(mm.group(2)), present=not mm.group(1))
        elif kind == "NO_HASATTR":
            mm = re.search(r"hasattr\(.*, '([^']+)'\)", code)
            assert mm, code
            b.hasattr(src, mm.group(1), present=False)
        elif kind in _AMBIENT_PROBES:
            b.global_state(_AMBIENT_PROBES[kind], name=kind.lower())
        elif kind == "LAMBDA_GUARD" and "top_saved_tensors_hooks" in code:
            b.global_state(_probe_saved_tensors_hooks, name="saved_tensors_hooks")
        elif kind == "LAMBDA_GUARD":
            expr = code.strip()
            b.predicate(_alias_predicate(expr, f_globals), expr)
        else:
            raise ValueError(f"torch guard kind {kind} is not mapped: {raw}")
        conv.tw_counts[kind] += 1
    return conv


@dataclass
class StandIn:
    """One stand-in workload: the tripwire builder, inputs and torch's guard managers."""

    name: str
    builder: GuardBuilder
    f_locals: dict
    f_locals_fail: dict
    gm_same: Any  # torch, tensor guards filtered out: the guards tripwire took
    conversion: _Conversion
    tree_text: str


def _cache_path(name: str, core: bool) -> str:
    import hashlib
    import os
    import platform

    import torch

    key = hashlib.sha256(f"{_MODELS_SRC}{torch.__version__}{platform.python_version()}".encode()).hexdigest()[
        :12
    ]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bench")
    return os.path.join(root, f"standin-{name}-{'core' if core else 'full'}-{key}.json")


def _globals_recipe(f_globals: dict, ns_names: set[str]) -> dict[str, str]:
    """How to recreate the names Dynamo installed in the globals (modules, the builtins dict)."""
    import builtins

    out = {}
    for k, v in f_globals.items():
        if k in ns_names:
            continue
        if isinstance(v, types.ModuleType):
            out[k] = "module:" + v.__name__
        elif v is builtins.__dict__:
            out[k] = "builtins"
        else:
            raise ValueError(f"cannot record the installed global {k!r}: {type(v).__name__}")
    return out


def build_standin(name: str, core: bool = False, *, from_cache: bool = False) -> StandIn:
    """Compile `name` with torch (tensor guards filtered; with ``core``, framework-state and
    aliasing guards too), and declare its guards in tripwire. The printed tree and the globals
    Dynamo installed are cached in build/bench/; ``from_cache`` rebuilds the same guard set from
    that cache without compiling (for the callgrind child processes: torch.compile under valgrind
    takes many minutes), then ``gm_same`` is None."""
    import importlib
    import json
    import os

    path = _cache_path(name, core)
    if from_cache and os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
        ns = _fresh_namespace()
        _, ok, bad = _inputs(name, ns)
        import builtins

        for k, recipe in data["globals"].items():
            ns.__dict__[k] = (
                builtins.__dict__ if recipe == "builtins" else importlib.import_module(recipe[7:])
            )
        f_globals = ns.__dict__
        b = GuardBuilder(ok, f_globals=f_globals)
        conv = convert_tree(data["tree"], b, f_globals)
        return StandIn(name, b, ok, bad, None, conv, data["tree"])
    gm, ok, bad, f_globals = compile_torch(name, filtered=True, core=core)
    text = str(gm)
    b = GuardBuilder(ok, f_globals=f_globals)
    conv = convert_tree(text, b, f_globals)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        ns_names = set(compile(_MODELS_SRC, "<models>", "exec").co_names) | {
            "__builtins__",
            "__name__",
            "__doc__",
        }
        ns_names |= {
            k for k in f_globals if not k.startswith("__import_") and not k.startswith("__builtins_dict")
        }
        with open(path, "w") as f:
            json.dump({"tree": text, "globals": _globals_recipe(f_globals, ns_names)}, f)
    except (OSError, ValueError):
        pass  # no cache: the callgrind children compile
    return StandIn(name, b, ok, bad, gm, conv, text)


def conversion_counts(s: StandIn) -> str:
    """Per kind: torch's leaf guards (filtered compile) and the tripwire guards declared for them."""
    kinds = sorted(set(s.conversion.torch_counts) | set(s.conversion.tw_counts))
    return ", ".join(
        f"{k} {s.conversion.torch_counts.get(k, 0)}/{s.conversion.tw_counts.get(k, 0)}" for k in kinds
    )
