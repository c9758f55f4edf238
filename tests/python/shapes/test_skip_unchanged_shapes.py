"""SHAPE symbols under the fast program and the skip of unchanged subtrees (the merge of issue 11
into issue 10's fast program).

- A symbol is read afresh on every check: a node that is a symbol is never settled by the skip,
  its Symbol op follows its fetch outside every jump, and SIZE/STRIDE/STORAGE_OFFSET symbols are
  read by the C-level reader (TensorProp), never claimed. Each test warms a module-like tree until
  the skip proves most guards, changes a symbol's source (an array or tensor resized in place, which
  no dict sees; an int in an instance dict), and requires a failure from the skipping engine, the
  engine without the skip, the tree walk and the reference alike.
- Symbols are copied into the check's frame as they are read: a residue (a LAMBDA) that runs user
  code between two symbol reads sees a later symbol's new value, as the walk and the reference do,
  and cannot invalidate an earlier one (nothing borrowed is kept in the frame).
- The relations are decided after every symbol was read, on the fast program and on the walk.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest

import reference
import tripwire as tw
from engine_switches import agree_with_and_without_skip
from gc_stress import scaled
from tripwire import _core


class Module:
    def __init__(self) -> None:
        self.training = False
        self._modules: dict[str, Any] = {}
        self._buffers: dict[str, Any] = {}


class Box:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


T = "L['self'].__dict__['_modules']['m1'].__dict__['_buffers']['t']"
K = "L['self'].__dict__['_modules']['m2'].__dict__['k']"


def _tree(value: Any) -> tuple[Module, dict]:
    root = Module()
    for i in range(3):
        m = Module()
        m.k = i
        m._buffers["t"] = value if i == 1 else None
        root._modules[f"m{i}"] = m
    return root, {"self": root}


def _guards(f_locals: dict, relation: str) -> tw.GuardSet:
    b = tw.GuardBuilder(f_locals)
    s = "L['self']"
    b.type_match(s)
    b.dict_keys(f"{s}.__dict__['_modules']")
    for i in range(3):
        m = f"{s}.__dict__['_modules']['m{i}']"
        b.type_match(m)
        b.false(f"{m}.__dict__['training']")
        b.dict_keys(f"{m}.__dict__['_buffers']")
    b.shape(relation)
    return b.build()


def _warm(gs: tw.GuardSet, f_locals: dict) -> None:
    fast_before = gs._fast_pass_count
    for _ in range(3):
        assert gs.check(f_locals)
    # The skip is at work on this tree, and the checks passed on the fast program with no residue
    # (the symbols were read by Symbol / TensorProp ops, not by the walk's code).
    assert gs._last_skipped_guards > 0, gs.explain()
    assert gs._fast_pass_count - fast_before == 3, gs.fast_path_summary()
    assert gs._last_fast_guards == len(gs), gs.fast_path_summary()  # the SHAPE relation included
    assert gs.fast_path_fraction == 1.0, gs.fast_path_summary()


def _warm_and_change(value: Any, relation: str, change: Any, root_change: bool = False) -> None:
    root, f_locals = _tree(value)
    gs = _guards(f_locals, relation)
    specs = list(gs.guards)
    _warm(gs, f_locals)
    change(root if root_change else value)
    for _ in range(3):  # the first check after the change, and whatever claims it made
        assert agree_with_and_without_skip(gs, specs, f_locals) is False
    fails = gs._shape_info["relations"][0][3]
    assert fails > 0, gs.explain()  # the relation failed, not some other guard


def _reshape(a: Any, shape: tuple) -> None:
    # numpy 2.4-2.5 deprecate writing arr.shape (still supported): an in-place change no dict sees.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        a.shape = shape


def test_array_reshaped_in_place_under_an_unchanged_tree_fails_the_relation() -> None:
    np = pytest.importorskip("numpy")
    tw.tensors.ensure_numpy()
    _warm_and_change(np.zeros((3, 4)), f"{T}.size()[0] == 3", lambda a: _reshape(a, (4, 3)))


def test_array_stride_changed_in_place_under_an_unchanged_tree_fails_the_relation() -> None:
    np = pytest.importorskip("numpy")
    tw.tensors.ensure_numpy()
    # (3, 4) float64: strides (32, 8); reshaped to (2, 6): strides (48, 8).
    _warm_and_change(np.zeros((3, 4)), f"{T}.stride()[0] == 32", lambda a: _reshape(a, (2, 6)))


@pytest.mark.torch
@pytest.mark.parametrize("name", ["resize_", "t_", "unsqueeze_", "as_strided_"])
def test_tensor_changed_in_place_under_an_unchanged_tree_fails_the_relation(name: str) -> None:
    torch = pytest.importorskip("torch")
    tw.tensors.ensure_torch()
    if not _core.torch_adapter_installed():
        pytest.skip("the torch adapter is not built: no C-level reader")
    changes = {
        "resize_": lambda t: t.resize_(4, 3),
        "t_": lambda t: t.t_(),
        "unsqueeze_": lambda t: t.unsqueeze_(0),
        "as_strided_": lambda t: t.as_strided_((3, 4), (1, 3)),
    }
    relation = (
        f"{T}.size()[0] * {T}.size()[1] == 12 and {T}.size()[0] == 3 and {T}.stride()[0] == 4"
        f" and {T}.storage_offset() == 0"
    )
    _warm_and_change(torch.zeros(3, 4), relation, changes[name])


def test_int_symbol_changed_in_an_instance_dict_fails_the_relation() -> None:
    np = pytest.importorskip("numpy")
    tw.tensors.ensure_numpy()

    def change(root: Module) -> None:
        root._modules["m2"].k = 7  # an instance dict write: its tag changes

    _warm_and_change(np.zeros((3, 4)), f"{K} == {T}.size()[1] - 2", change, root_change=True)


def test_int_symbol_of_a_settled_module_attribute_changed_fails_the_relation() -> None:
    """A symbol fetched from an exact module (a settling step: the skip may prove its value by the
    module dict's tag) is still read afresh; setattr on the module changes it."""
    import types

    mod = types.ModuleType("cfg_mod")
    mod.n = 4  # type: ignore[attr-defined]
    mod.flag = True  # type: ignore[attr-defined]
    f_locals = {"cfg": mod, "x": 2}
    b = tw.GuardBuilder(f_locals)
    b.id_match("L['cfg']")
    b.true("L['cfg'].flag")
    b.shape("L['cfg'].n == 2 * L['x']")
    gs = b.build()
    specs = list(gs.guards)
    _warm(gs, f_locals)
    mod.n = 5  # type: ignore[attr-defined]
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is False
    mod.n = 4  # type: ignore[attr-defined]
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True


def test_a_symbol_is_never_settled_even_with_guards_on_its_node() -> None:
    """A symbol node with identity-implied guards of its own (EQUALS on an int is one): without
    the merge's rule a settled fetch would jump over them and reuse the claimed value. The value is
    the same object in that case, but the rule keeps the Symbol op outside every jump: pinned by
    the relation failing as soon as the dict changes, and passing the program on the fast path."""
    box = Box(n=3, m=3)
    f_locals = {"d": {"n": 3, "m": 3}, "box": box}
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['d']")
    b.dict_keys("L['d']")
    b.type_match("L['d']['n']")
    b.shape("L['d']['n'] == L['d']['m']")
    gs = b.build()
    specs = list(gs.guards)
    _warm(gs, f_locals)
    f_locals["d"]["m"] = 4
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is False
    f_locals["d"]["m"] = 3
    f_locals["d"]["n"] = 4
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is False


# -- residues between symbol reads --------------------------------------------------------------
def test_a_residue_between_symbol_reads_changes_a_later_symbol() -> None:
    """L['a'] is read, then a LAMBDA on L['box'] runs and rewrites L['box'].n, then L['box'].n is
    read: the relation sees the new value, on the fast program (a residue in place), the walk and
    the reference alike."""
    box = Box(n=3)
    state = {"write": 3}

    def rewrite(b: Box) -> bool:
        b.n = state["write"]
        return True

    f_locals = {"a": 3, "box": box}
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['a']")
    b.predicate(rewrite, "rewrites n", source="L['box']")
    b.shape("L['a'] == L['box'].n")
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True
    residues_before = gs._residue_pass_count
    assert gs.check(f_locals)
    assert gs._residue_pass_count == residues_before + 1  # decided with the residue in place
    state["write"] = 4
    for _ in range(3):
        box.n = 3  # the lambda rewrites it during the check
        assert agree_with_and_without_skip(gs, specs, f_locals) is False
    fails = gs._shape_info["relations"][0][3]
    assert fails > 0, gs.explain()
    state["write"] = 3
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True


@pytest.mark.parametrize("size", ["array", "int"])
def test_a_residue_resizing_a_later_array_fails_the_relation(size: str) -> None:
    """The LAMBDA reshapes the array whose size is a later symbol (read by TensorProp after the
    residue, or by the walk)."""
    np = pytest.importorskip("numpy")
    tw.tensors.ensure_numpy()
    arr = np.zeros((3, 4))
    state = {"shape": (3, 4)}

    def reshape(_: Any) -> bool:
        _reshape(arr, state["shape"])
        return True

    f_locals = {"a": 3, "g": Box(), "x": arr}
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['a']")
    b.predicate(reshape, "reshapes x", source="L['g']")
    b.shape("L['a'] == L['x'].size()[0]" if size == "array" else "L['a'] * 4 == L['x'].size()[1] * 3")
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True
    state["shape"] = (4, 3)
    for _ in range(3):
        _reshape(arr, (3, 4))
        assert agree_with_and_without_skip(gs, specs, f_locals) is False
    state["shape"] = (3, 4)
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True


class _BigSource:
    def __init__(self) -> None:
        self.big = 2**70 + 1


def test_a_residue_freeing_an_earlier_symbols_value_keeps_its_copy() -> None:
    """L['c'].big (an int beyond int64, copied exactly into the frame) is read, then a LAMBDA
    replaces it (the old int object dies) and collects. The relation is decided on the value read
    (as the walk and the reference decide); nothing borrowed survives in the frame (ASan would see
    a use after free)."""
    for _ in range(scaled(30)):
        c = _BigSource()
        armed = [False]

        def replace(_: Any, c: _BigSource = c, armed: list = armed) -> bool:
            if armed[0]:
                c.big = 5  # the old 2**70 + 1 object loses its last reference
                gc.collect()
            return True

        f_locals = {"c": c, "g": Box()}
        b = tw.GuardBuilder(f_locals)
        b.type_match("L['c']")
        b.shape("L['c'].big > 2**64")
        b.predicate(replace, "replaces c.big", source="L['g']")
        gs = b.build()
        specs = list(gs.guards)
        armed[0] = True
        decisions = []
        for mode in ("fast", "walk", "reference"):
            c.big = 2**70 + 1 + len(decisions)  # a fresh object each time
            if mode == "fast":
                decisions.append(gs.check(f_locals))
            elif mode == "walk":
                was = _core.testing.set_fast_pass(False)
                try:
                    decisions.append(gs.check(f_locals))
                finally:
                    _core.testing.set_fast_pass(was)
            else:
                decisions.append(reference.check(specs, f_locals))
            assert c.big == 5  # the residue ran
        assert decisions == [True, True, True], decisions


def test_a_symbol_of_the_wrong_type_after_a_residue_fails() -> None:
    """The fast program cannot store a str as an int symbol: after a residue ran it decides the
    failure itself (never a pass on a missing symbol)."""
    box = Box(n=3)
    armed = [False]

    def spoil(b: Box) -> bool:
        if armed[0]:
            b.n = "3"
        return True

    f_locals = {"box": box}
    b = tw.GuardBuilder(f_locals)
    b.predicate(spoil, "spoils n", source="L['box']")
    b.shape("L['box'].n == 3")
    gs = b.build()
    specs = list(gs.guards)
    armed[0] = True
    for _ in range(3):
        box.n = 3
        assert agree_with_and_without_skip(gs, specs, f_locals) is False


def test_explain_has_the_fast_path_summary_and_the_shape_section() -> None:
    np = pytest.importorskip("numpy")
    tw.tensors.ensure_numpy()
    _, f_locals = _tree(np.zeros((3, 4)))
    gs = _guards(f_locals, f"{T}.size()[0] == 3")
    _warm(gs, f_locals)
    text = gs.explain()
    assert "shape relations (checked after every source)" in text
    assert "[shape symbol s0]" in text
    summary = gs.fast_path_summary()
    assert summary.startswith("fast path:") and "proved by unchanged dicts" in summary


class _Sized:
    """A symbol behind a property: its fetch has no form free of user code (a residue subtree,
    evaluated by the walk's code inside the fast program, which stores the symbol in its frame)."""

    def __init__(self, n: int) -> None:
        self._n = n

    @property
    def n(self) -> int:
        return self._n


def test_symbols_stored_by_residue_subtrees_and_by_the_program_meet_in_one_frame() -> None:
    np = pytest.importorskip("numpy")
    tw.tensors.ensure_numpy()

    class Sub(np.ndarray):
        """Not exactly numpy.ndarray: the C-level reader leaves it to the walk's fetch."""

    f_locals = {"p": _Sized(3), "a": 3, "x": np.zeros((3, 4)).view(Sub), "y": np.zeros((3, 2))}
    b = tw.GuardBuilder(f_locals)
    b.type_match("L['a']")
    b.shape("L['p'].n == L['a'] == L['x'].size()[0] == L['y'].size()[0]")
    gs = b.build()
    specs = list(gs.guards)
    for _ in range(3):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True
    residues_before = gs._residue_pass_count
    assert gs.check(f_locals)
    assert gs._residue_pass_count == residues_before + 1  # the property and the subclass: residues
    for key, value in (
        ("p", _Sized(4)),
        ("x", np.zeros((4, 4)).view(Sub)),
        ("y", np.zeros((4, 2))),
        ("a", 4),
    ):
        changed = dict(f_locals, **{key: value})
        for _ in range(2):
            assert agree_with_and_without_skip(gs, specs, changed) is False, key
    for _ in range(2):
        assert agree_with_and_without_skip(gs, specs, f_locals) is True
