"""The skip of unchanged subtrees against tensor, array and relational guards (the merge of issue 9
into issue 10's fast pass).

- TENSOR_MATCH / ARRAY_MATCH / DIMENSION_MARKING are never covered by a dict-version claim:
  tensor and array metadata changes in place (``resize_``, ``transpose_``, ``requires_grad_``,
  ``arr.shape = ...``) without any dict write. Each test warms a module-like tree until the skip
  proves most guards, mutates a tensor or array in place, and requires a failure from the skipping
  engine, the engine without the skip, the tree walk and the reference alike.
- ALIAS / NO_ALIAS are decided after every source was read, on the identities read in this check:
  a source settled by an unchanged dict is the same live object (the dict holds it), and a source
  read before a residue ran user code is held by a strong reference (hold_relational), so a new
  object at a dead one's address cannot look aliased.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest

import tripwire as tw
from engine_switches import agree_with_and_without_skip
from gc_stress import scaled
from tripwire import _core


class Module:
    def __init__(self) -> None:
        self.training = False
        self._modules: dict[str, Any] = {}
        self._parameters: dict[str, Any] = {}
        self._buffers: dict[str, Any] = {}


class Box:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _tree(value: Any) -> tuple[Module, dict]:
    root = Module()
    for i in range(3):
        m = Module()
        m.k = i
        m._buffers["t"] = value if i == 1 else None
        root._modules[f"m{i}"] = m
    return root, {"self": root}


def _guards(f_locals: dict, match: str) -> tw.GuardSet:
    b = tw.GuardBuilder(f_locals)
    s = "L['self']"
    b.type_match(s)
    b.dict_keys(f"{s}.__dict__['_modules']")
    for i in range(3):
        m = f"{s}.__dict__['_modules']['m{i}']"
        b.type_match(m)
        b.false(f"{m}.__dict__['training']")
        b.equals(f"{m}.__dict__['k']")
        b.dict_keys(f"{m}.__dict__['_buffers']")
    t = f"{s}.__dict__['_modules']['m1'].__dict__['_buffers']['t']"
    getattr(b, match)(t)
    return b.build()


def _read_natively(match: str) -> bool:
    """Whether this build reads the guarded value without Python (then its guard has a fast form).

    Without the torch adapter (e.g. the sanitized build of scripts/asan-tests) tensors are read by
    Python readers, and arrays are when the struct's layout check refused this numpy: that guard
    is then a residue. Dimension
    markings are plain attributes, read natively in every build.
    """
    if match == "array_match":
        return tw.tensors.array_path().startswith("array struct")
    if match == "tensor_match":
        return tw._core.torch_adapter_installed()
    return True  # dimension_marking reads plain attributes


def _warm_and_mutate(value: Any, match: str, mutate: Any) -> None:
    root, f_locals = _tree(value)
    gs = _guards(f_locals, match)
    specs = list(gs.guards)
    for _ in range(3):
        assert gs.check(f_locals)
    # The skip is really at work on this tree (the other guards are proved by unchanged dicts),
    # and the tensor/array guard is on the fast path, not a residue, when this build reads it
    # natively (the mutation below must fail the check either way).
    assert gs._last_skipped_guards > 0, gs.explain()
    native = _read_natively(match)
    assert gs._last_fast_guards == len(gs) - (0 if native else 1), gs.explain()
    mutate(value)
    for _ in range(3):  # the first check after the change, and whatever claims it made
        assert agree_with_and_without_skip(gs, specs, f_locals) is False


def _torch() -> Any:
    return pytest.importorskip("torch")


@pytest.mark.torch
@pytest.mark.parametrize(
    "name",
    ["resize_", "transpose_", "requires_grad_", "t_", "unsqueeze_", "as_strided_"],
)
def test_tensor_mutated_in_place_under_an_unchanged_tree_fails(name: str) -> None:
    torch = _torch()
    mutations = {
        "resize_": lambda t: t.resize_(4, 3),
        "transpose_": lambda t: t.transpose_(0, 1),
        "requires_grad_": lambda t: t.requires_grad_(True),
        "t_": lambda t: t.t_(),
        "unsqueeze_": lambda t: t.unsqueeze_(0),
        "as_strided_": lambda t: t.as_strided_((3, 4), (1, 3)),
    }
    _warm_and_mutate(torch.zeros(3, 4), "tensor_match", mutations[name])


@pytest.mark.torch
def test_tensor_dynamic_marking_in_place_under_an_unchanged_tree_fails() -> None:
    torch = _torch()

    def mark(t: Any) -> None:
        torch._dynamo.mark_dynamic(t, 0)  # sets t._dynamo_dynamic_indices: no module dict write

    _warm_and_mutate(torch.zeros(3, 4), "dimension_marking", mark)


@pytest.mark.parametrize("name", ["shape", "writeable", "dtype"])
def test_array_mutated_in_place_under_an_unchanged_tree_fails(name: str) -> None:
    np = pytest.importorskip("numpy")

    # In-place metadata writes numpy 2.4-2.5 deprecate (still supported): exactly the mutations
    # no dict sees, so they stay in the test, with their warnings silenced.
    def shape(a: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            a.shape = (4, 3)

    def writeable(a: Any) -> None:
        a.flags.writeable = False

    def dtype(a: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            a.dtype = np.int64

    mutations = {"shape": shape, "writeable": writeable, "dtype": dtype}
    _warm_and_mutate(np.zeros((3, 4)), "array_match", mutations[name])


def _cfg_tree() -> tuple[Module, dict, Box]:
    cfg = Box(causal=True)
    root = Module()
    for i in range(3):
        m = Module()
        m.cfg = cfg
        root._modules[f"b{i}"] = m
    return root, {"self": root}, cfg


def _relational_guards(f_locals: dict, relation: str) -> tw.GuardSet:
    b = tw.GuardBuilder(f_locals)
    s = "L['self']"
    b.type_match(s)
    b.dict_keys(f"{s}.__dict__['_modules']")
    for i in range(3):
        m = f"{s}.__dict__['_modules']['b{i}']"
        b.type_match(m)
        b.false(f"{m}.__dict__['training']")
    c0 = f"{s}.__dict__['_modules']['b0'].__dict__['cfg']"
    b.type_match(c0)
    b.true(f"{c0}.__dict__['causal']")
    if relation == "alias":
        for i in (1, 2):
            b.alias(c0, f"{s}.__dict__['_modules']['b{i}'].__dict__['cfg']")
    else:
        b.no_alias(*(f"{s}.__dict__['_modules']['b{i}'].__dict__['_modules']" for i in range(3)))
    return b.build()


def test_alias_over_settled_sources_sees_a_replaced_config() -> None:
    """Dynamo's shared-config pattern: fields guarded on block 0, the others covered by ALIAS.
    Replacing block 2's config writes block 2's dict (its tag changes): the settled fetch of the
    other sources stays proved, the relation is decided on the identities read this check."""
    root, f_locals, cfg = _cfg_tree()
    gs = _relational_guards(f_locals, "alias")
    specs = list(gs.guards)
    for _ in range(3):
        assert gs.check(f_locals)
    assert gs._last_skipped_guards > 0, gs.explain()
    assert gs._last_fast_guards == len(gs), gs.explain()
    root._modules["b2"].cfg = Box(causal=True)  # equal fields, another object
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is False
    root._modules["b2"].cfg = cfg
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True
    # A mutation inside the shared config (no dict of the tree is written) keeps the alias true
    # but fails the field guard on block 0.
    cfg.causal = False
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is False


def test_no_alias_over_settled_sources_sees_a_shared_dict() -> None:
    root, f_locals, _ = _cfg_tree()
    gs = _relational_guards(f_locals, "no_alias")
    specs = list(gs.guards)
    for _ in range(3):
        assert gs.check(f_locals)
    assert gs._last_skipped_guards > 0, gs.explain()
    # Block 2 now shares block 0's _modules dict: only block 2's instance dict is written.
    root._modules["b2"].__dict__["_modules"] = root._modules["b0"]._modules
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is False


class Freer:
    """hasattr(g, 'missing') runs __getattr__ (a residue): it frees the object L['h'].x was and
    puts a fresh one at L['h'].x and L['s'].value, likely at the freed address."""

    def __init__(self, h: Box, s: Box) -> None:
        self.h, self.s = h, s

    def __getattr__(self, name: str) -> Any:
        if name in ("h", "s"):
            raise AttributeError(name)
        self.h.x = None
        gc.collect()
        fresh = Box()
        self.h.x = fresh
        self.s.value = fresh
        raise AttributeError(name)


def test_a_residue_that_frees_a_relational_source_cannot_make_it_look_aliased() -> None:
    """ALIAS(L['h'].x, L['s'].value) with a residue between the two reads. The check read the old
    L['h'].x before the residue: it must be compared as that object (held by a strong reference),
    not by an address a new object may now occupy. The walk reads the same way: both fail."""
    for _ in range(scaled(30)):
        h = Box(x=Box())
        s = Box(value=h.x)
        f_locals = {"h": h, "g": Box(), "s": s}
        b = tw.GuardBuilder(f_locals)
        b.type_match("L['h'].x")
        b.hasattr("L['g']", "missing")  # absent: a residue (getattr) on a user type
        b.alias("L['h'].x", "L['s'].value")
        gs = b.build()
        assert gs.check(f_locals)
        f_locals["g"] = Freer(h, s)
        assert gs.check(f_locals) is False
        h.x = Box()
        s.value = h.x
        was = _core.testing.set_fast_pass(False)
        try:
            assert gs.check(f_locals) is False
        finally:
            _core.testing.set_fast_pass(was)
