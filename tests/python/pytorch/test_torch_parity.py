"""Differential tests against PyTorch Dynamo's own guards (torch.compile, backend="eager").

For each small function below, Dynamo compiles it once on an example (``dynamic=False``,
``fullgraph=True`` so the whole function is one frame and one cache entry) and its C++ guard
manager ``gm`` is taken from the cache entry. tripwire builds guards for the same example, either
with ``guards_for`` or with an explicit ``GuardBuilder`` that mirrors the tree ``str(gm)`` prints.
Then, for every variant input, ``gs.check(v) == gm.check(v)``: Dynamo is the oracle.

Two extra checks keep the mirrors honest:

* structure: every tripwire guard has a Dynamo guard of a matching kind on the same source and
  every Dynamo guard on an ``L[...]`` source has a tripwire counterpart, except the pairs each case
  lists (with the reason) in ``tw_only`` / ``dynamo_only``;
* documented differences (``DIFFERENCES``): where tripwire and Dynamo legitimately disagree, the
  disagreement itself is asserted, so a change in either side's behaviour is noticed.

Notes on Dynamo's behaviour in torch 2.13 that these cases rely on (checked against ``str(gm)``):
with ``dynamic=False`` ints *and floats* are specialised (EQUALS_MATCH, which is type-exact, so
``1``, ``True``, ``1.0`` and int subclasses never match each other), a float NaN gets FLOAT_IS_NAN,
bools get TRUE/FALSE_MATCH, a dict read by constant keys gets TYPE_MATCH plus one guard per key
read (no key-set guard), a dict iterated with ``.items()`` gets a DictGuardManager (exact type,
length, each key by position, so key order matters), and a user object gets TYPE_MATCH plus
guards on the attributes read (through ``__dict__`` for an nn.Module). Tensors get TENSOR_MATCH and
DIMENSION_DYNAMIC_MARKING_GUARD, which tripwire's ``guards_for`` infers too (TENSOR_MATCH and
DIMENSION_MARKING): the variants change the tensor's shape, dtype, strides, grad and type as well.
"""

from __future__ import annotations

import collections
import enum
import math
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

import tripwire as tw

torch = pytest.importorskip("torch")

from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # noqa: E402

pytestmark = pytest.mark.torch

X = torch.ones(3)  # the tensor argument: every variant keeps a tensor of this type/shape/dtype


# -- the functions Dynamo compiles ------------------------------------------------------------------
def f_scalars(n, flag, name, nothing, ratio, x):
    out = x + n
    if flag:
        out = out * 2
    if name == "relu":
        out = out.relu()
    if nothing is None:
        out = out - 1
    return out * ratio


def f_nan(r, x):
    return x * r


def f_seq(xs, pair, x):
    out = x
    for v in xs:
        out = out + v
    a, b = pair
    if b == "add":
        out = out + a
    return out


def f_len(xs, unused, x):
    return x + len(xs)


def f_dict_get(cfg, x):
    out = x * cfg["scale"]
    if cfg["mode"] == "fast":
        out = out + 1
    if cfg["bias"]:
        out = out - 1
    return out


def f_dict_items(cfg, x):
    out = x
    for _k, v in cfg.items():
        out = out + v
    return out


def f_nested(spec, x):
    out = x
    for name, sizes in spec["layers"]:
        for s in sizes:
            out = out + s
        if name == "a":
            out = out * 2
    return out * spec["alpha"]


class Mode(enum.Enum):
    A = 1
    B = 2


def helper(t):
    return t + 1


def helper_twin(t):  # the same body, another code object
    return t + 1


def f_misc(mode, fn, r, fs, opt, x):
    out = fn(x)
    if mode is Mode.A:
        out = out * 2
    for i in r:
        out = out + i
    if 3 in fs:
        out = out - 1
    if opt[0] is None and opt[1]:
        out = out + 5
    return out


def _same_code_new_function():
    return types.FunctionType(helper.__code__, helper.__globals__, "helper_copy")


class CodeHolder:
    __code__ = helper.__code__

    def __call__(self, t):
        return t + 1


class Cfg:
    """A plain config object: Dynamo guards its type and the attributes the function reads."""

    def __init__(self, depth, use_bias):
        self.depth = depth
        self.use_bias = use_bias


class OtherCfg(Cfg):
    pass


class DuckCfg:
    def __init__(self, depth, use_bias):
        self.depth = depth
        self.use_bias = use_bias


def f_obj(m, x):
    out = x
    for _ in range(m.depth):
        out = out + 1
    if m.use_bias:
        out = out * 2
    return out


class Block(torch.nn.Module):
    depth = 2  # a class-level default, shadowed by the instance attribute set in __init__

    def __init__(self, depth, use_bias):
        super().__init__()
        self.depth = depth
        self.use_bias = use_bias

    def forward(self, x):
        out = x
        for _ in range(self.depth):
            out = out + 1
        if self.use_bias:
            out = out * 2
        return out


class OtherBlock(Block):
    pass


def f_module(m, x):
    return m(x)


def _with(e: dict, **kw) -> dict:
    return {**e, **kw}


def _cfg_without(name: str) -> Cfg:
    c = Cfg(2, True)
    delattr(c, name)
    return c


def _block(depth=2, use_bias=True, **attrs) -> Block:
    m = Block(depth, use_bias)
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


def _block_eval() -> Block:
    return _block().eval()


def _block_with_forward() -> Block:
    m = _block()
    m.forward = lambda x: x  # an instance attribute shadows the class forward
    return m


def _block_without(name: str) -> Block:
    m = _block()
    delattr(m, name)
    return m


class S(str):
    pass


class I(int):
    pass


# -- tripwire guard sets ----------------------------------------------------------------------------
def _inferred(e: dict, **policy) -> tw.GuardSet:
    return tw.guards_for(e, policy=tw.Policy(**policy))


def _tw_tensor(b: tw.GuardBuilder) -> None:
    # Dynamo: TENSOR_MATCH and DIMENSION_DYNAMIC_MARKING_GUARD on the tensor argument.
    b.tensor_match("L['x']")
    b.dimension_marking("L['x']")


def _tw_len(e: dict) -> tw.GuardSet:
    # Dynamo: TYPE_MATCH + LENGTH_CHECK on xs (only len() is read), nothing on `unused`.
    b = tw.GuardBuilder(e)
    b.type_match("L['xs']")
    b.length("L['xs']")
    _tw_tensor(b)
    return b.build()


def _tw_dict_get(e: dict) -> tw.GuardSet:
    # Dynamo: TYPE_MATCH on cfg, then one guard per key read; no guard on the key set.
    b = tw.GuardBuilder(e)
    b.type_match("L['cfg']")
    b.true("L['cfg']['bias']")
    b.equals("L['cfg']['mode']")
    b.equals("L['cfg']['scale']")
    _tw_tensor(b)
    return b.build()


def _tw_obj(e: dict) -> tw.GuardSet:
    # Dynamo: TYPE_MATCH on m, then getattr guards on the attributes read.
    b = tw.GuardBuilder(e)
    b.type_match("L['m']")
    b.equals("L['m'].depth")
    b.true("L['m'].use_bias")
    _tw_tensor(b)
    return b.build()


def _tw_module(e: dict) -> tw.GuardSet:
    # Dynamo: TYPE_MATCH on m; its attributes are read from m.__dict__ (GetGenericDict accessor +
    # DictGetItem, printed as L['m'].depth), plus "'forward' not in m.__dict__".
    b = tw.GuardBuilder(e)
    b.type_match("L['m']")
    b.dict_contains("L['m'].__dict__", "forward", present=False)
    b.equals("L['m'].__dict__['depth']")
    b.true("L['m'].__dict__['use_bias']")
    _tw_tensor(b)
    return b.build()


# -- cases ------------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    fn: Callable
    example: dict
    build: Callable[[dict], tw.GuardSet]
    variants: dict[str, Callable[[dict], dict]]
    # (tripwire source, tripwire kind) with no Dynamo counterpart, each with its reason.
    tw_only: dict[tuple[str, str], str] = field(default_factory=dict)
    # (Dynamo source, Dynamo kind) with no tripwire counterpart, each with its reason.
    dynamo_only: dict[tuple[str, str], str] = field(default_factory=dict)
    # (tripwire source, kind) -> the (Dynamo source, kind) pairs that guard the same thing, where
    # they are not the same source with a kind from KIND_MAP.
    counterpart: dict[tuple[str, str], set[tuple[str, str]]] = field(default_factory=dict)
    # variant label -> why tripwire fails where Dynamo passes (stricter, never laxer).
    stricter: dict[str, str] = field(default_factory=dict)


BIG = 2**40  # not a cached small int (equal values are distinct objects), fits a tensor op
SCALARS_EX = dict(n=1, flag=True, name="relu", nothing=None, ratio=0.5, x=X)
SEQ_EX = dict(xs=[1, 2, BIG], pair=(2, "add"), x=X)
LEN_EX = dict(xs=[1, 2, 3], unused=5, x=X)
DICT_GET_EX = dict(cfg={"mode": "fast", "scale": 2, "bias": True}, x=X)
DICT_ITEMS_EX = dict(cfg={"a": 1, 1: 2, "c": 3.5}, x=X)
NESTED_EX = dict(spec={"layers": [("a", (1, 2)), ("b", (3,))], "alpha": 0.0}, x=X)


def _spec(layers=None, alpha=0.0) -> dict:
    """A fresh copy of NESTED_EX's spec, with the given parts replaced."""
    return {"layers": [("a", (1, 2)), ("b", (3,))] if layers is None else layers, "alpha": alpha}


MISC_EX = dict(mode=Mode.A, fn=helper, r=range(1), fs=frozenset({1, 3}), opt=(None, True), x=X)

CASES = [
    Case(
        "scalars",
        f_scalars,
        SCALARS_EX,
        _inferred,
        {
            "same": lambda e: dict(e),
            "same values, new objects": lambda e: _with(e, name="".join(["re", "lu"]), ratio=float("0.5")),
            "same tensor shape, new tensor": lambda e: _with(e, x=torch.zeros(3)),
            "tensor shape changed": lambda e: _with(e, x=torch.ones(4)),
            "tensor dtype changed": lambda e: _with(e, x=torch.ones(3).long()),
            "tensor requires grad": lambda e: _with(e, x=torch.ones(3, requires_grad=True)),
            "tensor strided view": lambda e: _with(e, x=torch.ones(6)[::2]),
            "tensor -> parameter": lambda e: _with(e, x=torch.nn.Parameter(torch.ones(3))),
            "tensor on meta": lambda e: _with(e, x=torch.ones(3, device="meta")),
            "int changed": lambda e: _with(e, n=2),
            "int -> float": lambda e: _with(e, n=1.0),
            "int -> bool": lambda e: _with(e, n=True),
            "int -> int subclass": lambda e: _with(e, n=I(1)),
            "int -> str": lambda e: _with(e, n="1"),
            "bool flipped": lambda e: _with(e, flag=False),
            "bool -> int": lambda e: _with(e, flag=1),
            "bool -> None": lambda e: _with(e, flag=None),
            "str changed": lambda e: _with(e, name="gelu"),
            "str -> str subclass": lambda e: _with(e, name=S("relu")),
            "str -> bytes": lambda e: _with(e, name=b"relu"),
            "str case": lambda e: _with(e, name="RELU"),
            "None -> 0": lambda e: _with(e, nothing=0),
            "None -> False": lambda e: _with(e, nothing=False),
            "None -> tensor": lambda e: _with(e, nothing=X),
            "float changed": lambda e: _with(e, ratio=0.25),
            "float -> int": lambda e: _with(e, ratio=0),
            "float -> nan": lambda e: _with(e, ratio=math.nan),
            "float -> inf": lambda e: _with(e, ratio=math.inf),
            "float nearby": lambda e: _with(e, ratio=math.nextafter(0.5, 1.0)),
            "argument missing": lambda e: {k: v for k, v in e.items() if k != "n"},
            "everything changed": lambda e: dict(n=5, flag=False, name="x", nothing=1, ratio=2.0, x=X),
        },
        dynamo_only={},
    ),
    Case(
        "nan",
        f_nan,
        dict(r=math.nan, x=X),
        _inferred,
        {
            "another nan object": lambda e: _with(e, r=float("nan")),
            "negative nan": lambda e: _with(e, r=-math.nan),
            "zero": lambda e: _with(e, r=0.0),
            "inf": lambda e: _with(e, r=math.inf),
            "complex nan": lambda e: _with(e, r=complex(math.nan, 0.0)),
            "str nan": lambda e: _with(e, r="nan"),
        },
        # Dynamo's FLOAT_IS_NAN is tripwire's EQUALS_MATCH(nan) (NaN matches NaN).
        dynamo_only={},
    ),
    Case(
        "sequences",
        f_seq,
        SEQ_EX,
        _inferred,
        {
            "same": lambda e: dict(e),
            "equal copies": lambda e: _with(e, xs=list(e["xs"]), pair=tuple(list(e["pair"]))),
            "equal big int, new object": lambda e: _with(e, xs=[1, 2, int(str(BIG))]),
            "big int off by one": lambda e: _with(e, xs=[1, 2, BIG + 1]),
            "big int -> float": lambda e: _with(e, xs=[1, 2, float(BIG)]),
            "list longer": lambda e: _with(e, xs=[1, 2, BIG, 4]),
            "list shorter": lambda e: _with(e, xs=[1, 2]),
            "list empty": lambda e: _with(e, xs=[]),
            "list element changed": lambda e: _with(e, xs=[1, 5, BIG]),
            "list element int -> float": lambda e: _with(e, xs=[1, 2.0, BIG]),
            "list element int -> bool": lambda e: _with(e, xs=[True, 2, BIG]),
            "list -> tuple": lambda e: _with(e, xs=(1, 2, BIG)),
            "list -> list subclass": lambda e: _with(e, xs=collections.UserList([1, 2, BIG])),
            "tuple -> list": lambda e: _with(e, pair=[2, "add"]),
            "tuple longer": lambda e: _with(e, pair=(2, "add", None)),
            "tuple str changed": lambda e: _with(e, pair=(2, "sub")),
            "tuple int -> float": lambda e: _with(e, pair=(2.0, "add")),
            "tuple -> namedtuple": lambda e: _with(e, pair=collections.namedtuple("P", "a b")(2, "add")),
            "list -> None": lambda e: _with(e, xs=None),
        },
        dynamo_only={},
    ),
    Case(
        "len only",
        f_len,
        LEN_EX,
        _tw_len,
        {
            "same": lambda e: dict(e),
            "element changed (not read)": lambda e: _with(e, xs=[7, 8, 9]),
            "element type changed (not read)": lambda e: _with(e, xs=["a", None, 1.5]),
            "unused changed (not read)": lambda e: _with(e, unused="anything"),
            "longer": lambda e: _with(e, xs=[1, 2, 3, 4]),
            "shorter": lambda e: _with(e, xs=[1, 2]),
            "list -> tuple": lambda e: _with(e, xs=(1, 2, 3)),
            "list -> str of same length": lambda e: _with(e, xs="abc"),
        },
        dynamo_only={},
    ),
    Case(
        "dict read by key",
        f_dict_get,
        DICT_GET_EX,
        _tw_dict_get,
        {
            "same": lambda e: dict(e),
            "equal copy": lambda e: _with(e, cfg=dict(e["cfg"])),
            "str value changed": lambda e: _with(e, cfg={"mode": "slow", "scale": 2, "bias": True}),
            "int value changed": lambda e: _with(e, cfg={"mode": "fast", "scale": 3, "bias": True}),
            "int value -> float": lambda e: _with(e, cfg={"mode": "fast", "scale": 2.0, "bias": True}),
            "bool value flipped": lambda e: _with(e, cfg={"mode": "fast", "scale": 2, "bias": False}),
            "bool value -> int": lambda e: _with(e, cfg={"mode": "fast", "scale": 2, "bias": 1}),
            "read key removed": lambda e: _with(e, cfg={"mode": "fast", "scale": 2}),
            "read key renamed": lambda e: _with(e, cfg={"mode": "fast", "scale": 2, "bias_": True}),
            "unread key added": lambda e: _with(e, cfg={**e["cfg"], "extra": 0}),
            "keys reordered": lambda e: _with(e, cfg={"bias": True, "scale": 2, "mode": "fast"}),
            "dict -> OrderedDict": lambda e: _with(e, cfg=collections.OrderedDict(e["cfg"])),
            "dict -> list": lambda e: _with(e, cfg=[("mode", "fast")]),
        },
        dynamo_only={},
    ),
    Case(
        "dict iterated",
        f_dict_items,
        DICT_ITEMS_EX,
        _inferred,
        {
            "same": lambda e: dict(e),
            "equal copy": lambda e: _with(e, cfg=dict(e["cfg"])),
            "value changed": lambda e: _with(e, cfg={"a": 1, 1: 2, "c": 4.5}),
            "value int -> float": lambda e: _with(e, cfg={"a": 1.0, 1: 2, "c": 3.5}),
            "key added": lambda e: _with(e, cfg={"a": 1, 1: 2, "c": 3.5, "d": 0}),
            "key removed": lambda e: _with(e, cfg={"a": 1, 1: 2}),
            "str key renamed": lambda e: _with(e, cfg={"b": 1, 1: 2, "c": 3.5}),
            "int key -> bool key": lambda e: _with(e, cfg={"a": 1, True: 2, "c": 3.5}),
            "int key -> float key": lambda e: _with(e, cfg={"a": 1, 1.0: 2, "c": 3.5}),
            "keys reordered": lambda e: _with(e, cfg={"c": 3.5, 1: 2, "a": 1}),
            "dict -> OrderedDict": lambda e: _with(e, cfg=collections.OrderedDict(e["cfg"])),
            "empty dict": lambda e: _with(e, cfg={}),
        },
        dynamo_only={},
    ),
    Case(
        "nested containers",
        f_nested,
        NESTED_EX,
        _inferred,
        {
            "same": lambda e: dict(e),
            "equal deep copy": lambda e: _with(e, spec=_spec()),
            "deep int changed": lambda e: _with(e, spec=_spec(layers=[("a", (1, 9)), ("b", (3,))])),
            "deep tuple longer": lambda e: _with(e, spec=_spec(layers=[("a", (1, 2)), ("b", (3, 4))])),
            "inner tuple -> list": lambda e: _with(e, spec=_spec(layers=[["a", (1, 2)], ("b", (3,))])),
            "layer added": lambda e: _with(e, spec=_spec(layers=[("a", (1, 2)), ("b", (3,)), ("c", ())])),
            "layer name changed": lambda e: _with(e, spec=_spec(layers=[("b", (1, 2)), ("b", (3,))])),
            "float value changed": lambda e: _with(e, spec=_spec(alpha=1.0)),
            "float 0.0 -> -0.0": lambda e: _with(e, spec=_spec(alpha=-0.0)),
            "float 0.0 -> int 0": lambda e: _with(e, spec=_spec(alpha=0)),
            "read key removed": lambda e: _with(e, spec={"layers": _spec()["layers"]}),
        },
        tw_only={
            ("L['spec']", "DICT_KEYS"): "guards_for pins a dict's key list; Dynamo reads two keys by name",
        },
        dynamo_only={},
        stricter={
            "float 0.0 -> -0.0": "EQUALS_MATCH compares a zero's sign; Dynamo's == matches 0.0 with -0.0",
        },
    ),
    Case(
        "object attributes",
        f_obj,
        dict(m=Cfg(2, True), x=X),
        _tw_obj,
        {
            "same object": lambda e: dict(e),
            "new object, same values": lambda e: _with(e, m=Cfg(2, True)),
            "int attribute changed": lambda e: _with(e, m=Cfg(3, True)),
            "int attribute -> float": lambda e: _with(e, m=Cfg(2.0, True)),
            "bool attribute flipped": lambda e: _with(e, m=Cfg(2, False)),
            "bool attribute -> int": lambda e: _with(e, m=Cfg(2, 1)),
            "attribute missing": lambda e: _with(e, m=_cfg_without("use_bias")),
            "subclass instance": lambda e: _with(e, m=OtherCfg(2, True)),
            "duck-typed other class": lambda e: _with(e, m=DuckCfg(2, True)),
            "None": lambda e: _with(e, m=None),
        },
        dynamo_only={},
    ),
    Case(
        "nn.Module attributes",
        f_module,
        dict(m=_block(), x=X),
        _tw_module,
        {
            "same module": lambda e: dict(e),
            "new module, same values": lambda e: _with(e, m=_block()),
            "int attribute changed": lambda e: _with(e, m=_block(depth=3)),
            "int attribute -> bool": lambda e: _with(e, m=_block(depth=True, use_bias=True)),
            "bool attribute flipped": lambda e: _with(e, m=_block(use_bias=False)),
            "unread attribute added": lambda e: _with(e, m=_block(extra=5)),
            "training flag (not read)": lambda e: _with(e, m=_block_eval()),
            "forward overridden on the instance": lambda e: _with(e, m=_block_with_forward()),
            "attribute missing": lambda e: _with(e, m=_block_without("depth")),
            "subclass instance": lambda e: _with(e, m=OtherBlock(2, True)),
        },
        counterpart={
            ("L['m'].__dict__['depth']", "EQUALS_MATCH"): {("L['m'].depth", "EQUALS_MATCH")},
            ("L['m'].__dict__['use_bias']", "TRUE"): {("L['m'].use_bias", "TRUE_MATCH")},
        },
        dynamo_only={},
    ),
]
MIXED_KEYS = {("t", 1): 1, Mode.A: 2, "é\x00": 3, None: 4, 2.5: 5}


def _mixed_replace(old, new, value=None):
    """MIXED_KEYS with key ``old`` renamed to ``new`` in place (order kept), its value optionally
    replaced."""
    out = {}
    for k, v in MIXED_KEYS.items():
        out[new if k == old and type(k) is type(old) else k] = v if value is None or k != old else value
    return out


CASES.append(
    Case(
        "dict iterated, keys of many types",
        f_dict_items,
        dict(cfg=MIXED_KEYS, x=X),
        _inferred,
        {
            "same": lambda e: dict(e),
            "equal copy": lambda e: _with(e, cfg=dict(MIXED_KEYS)),
            "tuple key item int -> float": lambda e: _with(e, cfg=_mixed_replace(("t", 1), ("t", 1.0))),
            "tuple key item int -> bool": lambda e: _with(e, cfg=_mixed_replace(("t", 1), ("t", True))),
            "tuple key item changed": lambda e: _with(e, cfg=_mixed_replace(("t", 1), ("t", 2))),
            "enum key -> its value": lambda e: _with(e, cfg=_mixed_replace(Mode.A, 1)),
            "enum key -> other member": lambda e: _with(e, cfg=_mixed_replace(Mode.A, Mode.B)),
            "str key without NUL": lambda e: _with(e, cfg=_mixed_replace("é\x00", "é")),
            "None key -> 0": lambda e: _with(e, cfg=_mixed_replace(None, 0)),
            "float key -> nearby float": lambda e: _with(e, cfg=_mixed_replace(2.5, math.nextafter(2.5, 3))),
            "value under tuple key changed": lambda e: _with(e, cfg=_mixed_replace(("t", 1), ("t", 1), 9)),
            "value under enum key -> float": lambda e: _with(e, cfg=_mixed_replace(Mode.A, Mode.A, 2.0)),
            "value under None key changed": lambda e: _with(e, cfg=_mixed_replace(None, None, 0)),
        },
        dynamo_only={},
        counterpart={
            # Dynamo names these values by key position, tripwire by the key itself.
            ("L['cfg'][None]", "EQUALS_MATCH"): {("L['cfg'][list(dict.keys(L['cfg']))[3]]", "EQUALS_MATCH")},
            ("L['cfg'][2.5]", "EQUALS_MATCH"): {("L['cfg'][list(dict.keys(L['cfg']))[4]]", "EQUALS_MATCH")},
        },
    )
)
CASES.append(
    Case(
        "enum, function, range, frozenset",
        f_misc,
        MISC_EX,
        _inferred,
        {
            "same": lambda e: dict(e),
            "other enum member": lambda e: _with(e, mode=Mode.B),
            "enum -> its value": lambda e: _with(e, mode=1),
            "function: new object, same code": lambda e: _with(e, fn=_same_code_new_function()),
            "function: same body, other code": lambda e: _with(e, fn=helper_twin),
            "function -> lambda": lambda e: _with(e, fn=lambda t: t + 1),
            "function -> object with that __code__": lambda e: _with(e, fn=CodeHolder()),
            "range: same start/stop/step": lambda e: _with(e, r=range(0, 1, 1)),
            "range longer": lambda e: _with(e, r=range(2)),
            # same items, other stop/step: both guard start, stop and step
            "range with the same items, other stop/step": lambda e: _with(e, r=range(0, 5, 10)),
            "empty range, other start/stop": lambda e: _with(e, r=range(5, 5)),
            "range -> list": lambda e: _with(e, r=[0]),
            "frozenset -> set": lambda e: _with(e, fs={1, 3}),
            "frozenset other element": lambda e: _with(e, fs=frozenset({1, 4})),
            "frozenset bigger": lambda e: _with(e, fs=frozenset({1, 3, 5})),
            "frozenset same, other order": lambda e: _with(e, fs=frozenset([3, 1])),
            "tuple bool flipped": lambda e: _with(e, opt=(None, False)),
            "tuple None -> 0": lambda e: _with(e, opt=(0, True)),
            "tuple -> list": lambda e: _with(e, opt=[None, True]),
        },
        tw_only={
            ("L['fn']", "TYPE_MATCH"): "guards_for adds TYPE_MATCH before CODE_MATCH; Dynamo's "
            "__code__ accessor fails on non-functions anyway (see the CodeHolder variant)",
        },
        dynamo_only={
            ("L['fs']", "SET_CONTAINS"): "implied by EQUALS_MATCH on the whole frozenset",
        },
        counterpart={
            ("L['mode']", "EQUALS_MATCH"): {("L['mode']", "ID_MATCH")},  # enum members: identity
            ("L['fn']", "CODE_MATCH"): {("L['fn'].__code__", "ID_MATCH")},
            # a range constant: Dynamo guards its type and start/stop/step (see DIFFERENCES)
            ("L['r']", "EQUALS_MATCH"): {
                ("L['r']", "TYPE_MATCH"),
                ("L['r'].start", "EQUALS_MATCH"),
                ("L['r'].stop", "EQUALS_MATCH"),
                ("L['r'].step", "EQUALS_MATCH"),
            },
        },
    )
)
CASES_BY_NAME = {c.name: c for c in CASES}


@pytest.fixture(scope="module")
def compiled(request):
    """(case, Dynamo's guard manager for it), parametrized indirectly by case name.

    Module-scoped so each case is compiled once while pytest runs the tests that share it (pytest
    groups items by a module-scoped parameter). Dynamo's cache is reset before compiling and at
    teardown; the guard manager must not outlive its fixture: ``torch._dynamo.reset()`` deletes
    the ``__builtins_dict___N`` globals that its ``G[...]`` guards read (e.g. the ID_MATCH on
    ``len`` or ``range``), after which those guards fail with a KeyError.
    """
    case = CASES_BY_NAME[request.param]
    torch._dynamo.reset()
    cfn = torch.compile(case.fn, backend="eager", dynamic=False, fullgraph=True)
    cfn(**case.example)
    entries = _debug_get_cache_entry_list(case.fn.__code__)
    assert len(entries) == 1
    gm = entries[0].guard_manager
    assert gm.check(dict(case.example))
    yield case, gm
    torch._dynamo.reset()


def each_case(test):
    return pytest.mark.parametrize("compiled", list(CASES_BY_NAME), indirect=True)(test)


# -- reading Dynamo's guard tree --------------------------------------------------------------------
_LINE = re.compile(r"^((?:\| )*)\+- (.*)$")
_SOURCE = re.compile(r"source=(.+?), (?:accessed_by|type)=")
# A dict key by position, or something below it (Dynamo guards a tuple key's items, an enum key's
# _name_...): all of it is what tripwire's DICT_KEYS pins on the dict.
_KEY_SOURCE = re.compile(r"^list\(dict\.keys\((.*?)\)\)\[\d+\]")


def dynamo_tree(gm) -> set[tuple[str, str]]:
    """{(source, leaf guard kind)} from ``str(gm)``; a DictGuardManager adds (source, "DICT")."""
    out: set[tuple[str, str]] = set()
    owners: dict[int, str | None] = {}
    for line in str(gm).splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        depth, body = len(m.group(1)) // 2, m.group(2)
        if "GuardManager" in body.split(":")[0] or body.startswith(("KeyManager", "ValueManager")):
            s = _SOURCE.search(body)
            owners[depth] = s.group(1) if s else None
            if body.startswith("DictGuardManager") and s:
                out.add((s.group(1), "DICT"))
        elif body.startswith("KeyValueManager"):
            owners[depth] = None
        else:
            owner = owners.get(depth - 1)
            if owner is not None:
                out.add((owner, body.split(":")[0]))
    return out


# tripwire kind -> the Dynamo leaf kinds (or "DICT": a DictGuardManager) that guard the same thing.
KIND_MAP = {
    "TYPE_MATCH": {"TYPE_MATCH", "TENSOR_MATCH", "DICT"},  # TENSOR_MATCH implies the type
    "EQUALS_MATCH": {"EQUALS_MATCH", "FLOAT_IS_NAN"},  # EQUALS_MATCH(nan) matches NaN
    "LENGTH": {"LENGTH_CHECK", "DICT"},
    "TRUE": {"TRUE_MATCH"},
    "FALSE": {"FALSE_MATCH"},
    "NONE": {"NONE_MATCH"},
    "DICT_CONTAINS": {"DICT_CONTAINS"},
    "DICT_KEYS": {"DICT"},  # a DictGuardManager guards every key by position
    "TENSOR_MATCH": {"TENSOR_MATCH"},
    "DIMENSION_MARKING": {"DIMENSION_DYNAMIC_MARKING_GUARD"},
    "NO_ALIAS": {"NO_TENSOR_ALIASING"},
}


def _is_input(source: str) -> bool:
    return source.startswith("L[") or bool(_KEY_SOURCE.match(source))


# -- the tests --------------------------------------------------------------------------------------
def _mismatches(case: Case, gm) -> list[str]:
    gs = case.build(dict(case.example))
    bad = []
    for label, make in case.variants.items():
        v = make(dict(case.example))
        ours, theirs = gs.check(v), gm.check(v)
        if label in case.stricter:
            if (ours, theirs) != (False, True):
                bad.append(
                    f"{label}: tripwire={ours} dynamo={theirs} (expected stricter: {case.stricter[label]})"
                )
        elif ours != theirs:
            why = gs.why_not(v)
            bad.append(f"{label}: tripwire={ours} dynamo={theirs} ({why.reason if why else 'passes'})")
    return bad


@each_case
def test_check_agrees_with_dynamo(compiled):
    case, gm = compiled
    assert _mismatches(case, gm) == []


@each_case
def test_variants_exercise_both_answers(compiled):
    """Each case has variants Dynamo accepts and variants it rejects (no vacuous agreement)."""
    case, gm = compiled
    answers = {gm.check(make(dict(case.example))) for make in case.variants.values()}
    assert answers == {True, False}


@each_case
def test_guard_structure_mirrors_dynamo(compiled):
    """Every tripwire guard has a Dynamo counterpart on the same source, and vice versa."""
    case, gm = compiled
    theirs = {(s, k) for s, k in dynamo_tree(gm) if _is_input(s)}
    ours = {(str(g.source), g.kind.name) for g in case.build(dict(case.example)).guards}
    assert theirs, "no guards parsed from str(gm)"

    def dynamo_side(src: str, kind: str) -> set[tuple[str, str]]:
        if (src, kind) in case.counterpart:
            return case.counterpart[(src, kind)]
        return {(src, k) for k in KIND_MAP[kind]}

    missing_in_dynamo = [
        (src, kind)
        for src, kind in sorted(ours)
        if not dynamo_side(src, kind) & theirs and (src, kind) not in case.tw_only
    ]
    assert missing_in_dynamo == []

    covered = set().union(*(dynamo_side(src, kind) for src, kind in ours))
    missing_in_tripwire = []
    for src, kind in sorted(theirs):
        key = _KEY_SOURCE.match(src)
        if key:  # a DictGuardManager's key at position i <-> tripwire's DICT_KEYS on the dict
            found = (key.group(1), "DICT_KEYS") in ours
        else:
            found = (src, kind) in covered
        if not found and (src, kind) not in case.dynamo_only:
            missing_in_tripwire.append((src, kind))
    assert missing_in_tripwire == []


# -- documented differences -------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    case: str  # whose compiled function and example are used
    label: str
    build: Callable[[dict], tw.GuardSet]  # the tripwire guards compared
    make: Callable[[dict], dict]
    tripwire: bool
    dynamo: bool
    why: str


DIFFERENCES = [
    # guards_for guards every input fully; Dynamo guards only what the function reads. f_len reads
    # len(xs) and never reads `unused`. (The explicit mirror _tw_len agrees with Dynamo on these.)
    Difference(
        "len only",
        "element changed, guards_for",
        _inferred,
        lambda e: _with(e, xs=[7, 8, 9]),
        False,
        True,
        "guards_for pins list elements; Dynamo only len(xs)",
    ),
    Difference(
        "len only",
        "unread argument changed, guards_for",
        _inferred,
        lambda e: _with(e, unused=6),
        False,
        True,
        "guards_for guards every argument; Dynamo only those read",
    ),
    # Policy(per_arg={"unused": "skip"}) removes the second difference (test_policy_skip_...)
    # but not the first.
    Difference(
        "len only",
        "element changed, guards_for skip unused",
        lambda e: _inferred(e, per_arg={"unused": "skip"}),
        lambda e: _with(e, xs=[7, 8, 9]),
        False,
        True,
        "guards_for pins list elements; Dynamo only len(xs)",
    ),
    # A dict read by constant keys: Dynamo guards the keys read, guards_for the whole key list
    # (DICT_KEYS, ordered by default, as Dynamo's DictGuardManager does for an iterated dict).
    Difference(
        "dict read by key",
        "unread key added, guards_for",
        _inferred,
        lambda e: _with(e, cfg={"mode": "fast", "scale": 2, "bias": True, "extra": 0}),
        False,
        True,
        "guards_for DICT_KEYS; Dynamo has no key-set guard for keyed reads",
    ),
    Difference(
        "dict read by key",
        "keys reordered, guards_for",
        _inferred,
        lambda e: _with(e, cfg={"bias": True, "scale": 2, "mode": "fast"}),
        False,
        True,
        "guards_for DICT_KEYS is ordered by default",
    ),
    Difference(
        "dict read by key",
        "unread key added, guards_for unordered",
        lambda e: _inferred(e, dict_keys_ordered=False),
        lambda e: _with(e, cfg={"mode": "fast", "scale": 2, "bias": True, "extra": 0}),
        False,
        True,
        "an unordered DICT_KEYS still pins the key set",
    ),
    Difference(
        "nested containers",
        "unread key added",
        _inferred,
        lambda e: _with(e, spec={**e["spec"], "extra": 1}),
        False,
        True,
        "guards_for DICT_KEYS; Dynamo reads 'layers' and 'alpha' by name",
    ),
    # An nn.Module's attributes: Dynamo reads them from the instance __dict__. A plain getattr
    # (the f_obj mirror style, L['m'].depth in tripwire) also accepts a value that comes from the
    # class, which Dynamo's __dict__ accessor rejects; the _tw_module mirror uses __dict__ and
    # agrees (see the "attribute missing" variant of the nn.Module case).
    Difference(
        "nn.Module attributes",
        "attribute moved to the class, getattr mirror",
        _tw_obj,
        lambda e: _with(e, m=_block_without("depth")),  # Block.depth == 2 remains
        True,
        False,
        "getattr finds a class attribute; Dynamo reads m.__dict__",
    ),
]


@pytest.mark.parametrize(
    ("compiled", "diff"),
    [pytest.param(d.case, d, id=f"{d.case}: {d.label}") for d in DIFFERENCES],
    indirect=["compiled"],
)
def test_documented_difference(compiled, diff):
    case, gm = compiled
    gs = diff.build(dict(case.example))
    v = diff.make(dict(case.example))
    assert diff.tripwire != diff.dynamo  # a "difference" that is not one belongs in CASES
    assert (gs.check(v), gm.check(v)) == (diff.tripwire, diff.dynamo), diff.why


@pytest.mark.parametrize("compiled", ["len only"], indirect=True)
def test_policy_skip_matches_dynamo_on_an_unread_argument(compiled):
    case, gm = compiled
    gs = _inferred(dict(case.example), per_arg={"unused": "skip"})
    for unused in (6, "other", None, [1, 2]):
        v = _with(case.example, unused=unused)
        assert gs.check(v) is gm.check(v) is True


# -- failure explanations ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("compiled", "make", "source"),
    [
        pytest.param("scalars", lambda e: _with(e, n=2), "L['n']", id="int"),
        pytest.param(
            "dict read by key",
            lambda e: _with(e, cfg={"mode": "slow", "scale": 2, "bias": True}),
            "L['cfg']['mode']",
            id="dict value",
        ),
        pytest.param("sequences", lambda e: _with(e, xs=[1, 5, BIG]), "L['xs'][1]", id="list element"),
        pytest.param("object attributes", lambda e: _with(e, m=Cfg(3, True)), "L['m'].depth", id="attribute"),
    ],
    indirect=["compiled"],
)
def test_why_not_names_the_source_dynamo_names(compiled, make, source):
    case, gm = compiled
    gs = case.build(dict(case.example))
    v = make(dict(case.example))
    info = gm.check_verbose(v)
    assert not info.result
    parts = [p.split("#")[0].strip() for p in info.verbose_code_parts]
    assert len(parts) == 1
    assert parts[0].startswith(f"{source} == ")  # Dynamo's EQUALS_MATCH code part on that source

    failure = gs.why_not(v)
    assert failure is not None
    assert failure.source == source
    assert failure.kind == "EQUALS_MATCH"
