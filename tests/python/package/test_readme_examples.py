"""The README's examples run as written, and ``guards_of`` imports every torch.compile'd object a
user holds: the OptimizedModule, the module (user and built-in: nn.Linear and nn.Sequential,
whose ``forward`` torch compiles through ``wrap_inline``), bound methods, functions and what
``torch.compile(fn)`` returned. Each imported set decides as torch's ``guard_manager.check`` on
mutated inputs."""

from __future__ import annotations

import ast
import gc
import pathlib
import re
import types

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402
import torch.nn as nn  # noqa: E402

import tripwire as tw  # noqa: E402
import tripwire.torch as twt  # noqa: E402
from tripwire.torch import _tree  # noqa: E402

pytestmark = pytest.mark.torch

ROOT = pathlib.Path(__file__).resolve().parents[3]


def compiled(obj, *args):
    """torch.compile(obj) called once with args, under normal GC thresholds (torch traces)."""
    old = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        c = torch.compile(obj, backend="eager", dynamic=False)
        c(*args)
    finally:
        gc.set_threshold(*old)
    return c


class UserNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.scale = 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


class Holder:
    def __init__(self) -> None:
        self.k = 3

    def method(self, x):
        return x + self.k


def plain(x, n=2):
    return x * n


def agree(gs, obj, gm, args_list):
    """The imported set and torch's guard manager decide alike on each argument tuple."""
    decided = []
    for args in args_list:
        L = twt.frame_locals(obj, *args)
        assert gs.check(L) == gm.check(L), (obj, args, gs.why_not(L))
        decided.append(gs.check(L))
    assert True in decided and False in decided  # the inputs exercise both answers
    return decided


def tensor_variants(x):
    return [
        (x,),
        (x.clone(),),
        (x.double(),),
        (torch.randn(x.shape[0] + 1, *x.shape[1:]),),
        (x.t().contiguous().t(),) if x.dim() == 2 else (x,),
        (x.requires_grad_(False).detach().requires_grad_(True),),
    ]


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("make", [lambda: nn.Linear(3, 2), lambda: nn.Sequential(nn.Linear(3, 2), nn.ReLU())])
def test_builtin_modules_through_wrap_inline(make):
    m = make()
    x = torch.randn(4, 3)
    cm = compiled(m, x)
    for obj in (m, cm):
        gs = twt.guards_of(obj)
        target = _tree.resolve_target(obj)
        assert target.is_wrapped and target.wrapped is m
        gm = _tree.find_entry(target, 0)
        assert (
            "wrap_inline" in gs.torch_import.code_name and type(m).__qualname__ in gs.torch_import.code_name
        )
        assert twt.frame_locals(obj, x) == {"args": (x,), "kwargs": {}, "fn": m}
        agree(gs, obj, gm, tensor_variants(x))
        # Another module of the same class and shapes passes, as in torch; of other shapes not.
        twin, other = make(), nn.Linear(5, 2)
        for fn in (twin, other, nn.ReLU()):
            L = {"args": (x,), "kwargs": {}, "fn": fn}
            assert gs.check(L) == gm.check(L)
        assert gs.check({"args": (x,), "kwargs": {}, "fn": twin})
        assert not gs.check({"args": (x,), "kwargs": {}, "fn": other})


def test_wrap_inline_entries_are_told_apart_by_module():
    # nn.Linear and nn.Sequential share wrap_inline's code object, hence its cache: each import
    # takes only the entries whose guards on fn accept its own module.
    lin, seq = nn.Linear(3, 2), nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    x = torch.randn(4, 3)
    compiled(lin, x)
    compiled(seq, x)
    inline = _tree.resolve_target(lin).code
    assert inline is _tree.resolve_target(seq).code
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    assert len(_debug_get_cache_entry_list(inline)) == 2
    g_lin, g_seq = twt.guards_of(lin), twt.guards_of(seq)
    assert g_lin.torch_import.entries == 1 and g_seq.torch_import.entries == 1
    assert g_lin.check(twt.frame_locals(lin, x)) and not g_lin.check(twt.frame_locals(seq, x))
    assert g_seq.check(twt.frame_locals(seq, x)) and not g_seq.check(twt.frame_locals(lin, x))
    with pytest.raises(tw.TorchImportError, match="entry 1 is out of range: torch has 1 cache entry"):
        twt.guards_of(lin, entry=1)
    # Entries are told apart by type and identity on fn only: a Linear of other shapes gets the
    # Linear entry, whose guards then fail on it, as torch's do (never a false pass).
    other = nn.Linear(7, 7)
    L = twt.frame_locals(other, torch.randn(2, 7))
    assert not twt.guards_of(other).check(L)
    assert not _tree.find_entry(_tree.resolve_target(other), 0).check(L)
    # A class nothing compiled: no entry.
    with pytest.raises(tw.TorchImportError, match="no compiled cache entry for Tanh"):
        twt.guards_of(nn.Tanh())


def test_user_module_its_optimized_module_and_forward():
    m = UserNet()
    x = torch.randn(4, 3)
    cm = compiled(m, x)
    for obj in (m, cm):
        target = _tree.resolve_target(obj)
        assert not target.is_wrapped and target.code is UserNet.forward.__code__
        gs = twt.guards_of(obj)
        gm = _tree.find_entry(target, 0)
        assert twt.frame_locals(obj, x) == {"self": m, "x": x}
        agree(gs, obj, gm, tensor_variants(x))
        m.scale = 3.0  # a changed attribute fails both
        assert gs.check({"self": m, "x": x}) == gm.check({"self": m, "x": x}) is False
        m.scale = 2.0


def test_bound_methods_user_and_builtin():
    h = Holder()
    x = torch.randn(3)
    compiled(h.method, x)
    gs = twt.guards_of(h.method)
    gm = _tree.find_entry(_tree.resolve_target(h.method), 0)
    agree(gs, h.method, gm, [(x,), (x.double(),), (torch.randn(5),)])
    # A bound method whose code Dynamo skips: torch compiles wrap_inline(seq.forward).
    seq = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    c = compiled(seq.forward, torch.randn(4, 3))
    for obj in (seq.forward, c):
        target = _tree.resolve_target(obj)
        assert target.is_wrapped and target.wrapped == seq.forward
        gs = twt.guards_of(obj)
        agree(gs, obj, _tree.find_entry(target, 0), tensor_variants(torch.randn(4, 3)))


def test_functions_and_what_torch_compile_returned():
    x = torch.randn(3)
    c = compiled(plain, x)
    for obj in (plain, c):
        gs = twt.guards_of(obj)
        gm = _tree.find_entry(_tree.resolve_target(obj), 0)
        assert _tree.resolve_target(obj).code is plain.__code__
        agree(gs, obj, gm, [(x,), (x, 3), (x.double(),), (torch.randn(2, 2),)])


def test_wrapped_accepts_only_by_identity_leaves():
    # The leaves read to tell entries apart run no user code: a module whose __getattr__ raises
    # or a lying __class__ does not reach them (TYPE_MATCH reads the C-level type).
    lin = nn.Linear(3, 2)
    compiled(lin, torch.randn(4, 3))

    class Liar(nn.Linear):
        @property
        def __class__(self):
            return nn.Linear

    liar = Liar(3, 2)
    with pytest.raises(tw.TorchImportError, match="no compiled cache entry"):
        twt.guards_of(liar)


# -- the README ----------------------------------------------------------------------------------
def _readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no python block"
    return blocks[0]


def _documented_results(block: str) -> list[tuple[str, object]]:
    """(expression, value) for each README line `expr  # literal` and each expression line
    followed by a comment line holding a literal."""
    out = []
    lines = block.splitlines()
    for i, line in enumerate(lines):
        code, _, comment = line.partition("#")
        code, comment = code.strip(), comment.strip()
        if not code:
            continue
        try:
            ast.parse(code, mode="eval")
        except SyntaxError:
            continue
        following = lines[i + 1].strip().lstrip("#").strip() if i + 1 < len(lines) else ""
        for cand in (comment, comment.split(":", 1)[0], following):
            try:
                value = ast.literal_eval(cand)
            except (ValueError, SyntaxError):
                continue
            out.append((code, value))
            break
    return out


def test_readme_python_block_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRIPWIRE_CACHE_DIR", str(tmp_path / "store"))
    block = _readme_block()
    model = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    compiled(model, x)
    calls = []

    def my_compiler(fn, example_args, builder):  # the trivial compiler: the function itself
        calls.append(fn.__name__)
        return fn

    def compile_frame(frame):
        calls.append(frame.code.co_name)
        return None

    ns = {
        "torch": torch,
        "my_compiler": my_compiler,
        "compiled_fn": lambda **kw: "compiled",
        "f_locals": {"x": 5, "cfg": {"mode": "fast"}},
        "compile_frame": compile_frame,
        "model": model,
        "x": x,
    }
    exec(compile(block, "README.md", "exec"), ns)
    assert isinstance(ns["gs"], twt.ImportedGuardSet)
    assert ns["gs"].check(twt.frame_locals(model, x))
    assert ns["gs2"].check({"x": 4, "cfg": {"mode": "fast"}})
    assert ns["cache"].lookup(ns["f_locals"]) == ns["compiled_fn"]
    results = _documented_results(block)
    assert len(results) >= 2, results
    # The documented results: the torch line on the imported set, the others on the set the
    # README builds first (gs2 answers as it did).
    imported = ns["gs"]
    for expr, value in results:
        ns["gs"] = imported if "torch" in expr else ns["gs2"]
        assert eval(expr, ns) == value, expr
    assert any("frame_locals" in expr for expr, _ in results)


def test_guide_tensor_reason_is_what_the_engine_says():
    text = (ROOT / "docs" / "guide.md").read_text()
    documented = re.search(r"# \"(L\['x'\]: TENSOR_MATCH [^\"]*)\"", text)
    assert documented is not None
    x = torch.randn(4, 8)
    b = tw.GuardBuilder({"x": x})
    b.tensor_match("L['x']", dynamic=(0,))
    gs = b.build()
    assert gs.why_not({"x": torch.randn(4, 9).half()}).reason == documented.group(1)


def test_frame_md_states_the_hooks_default_on_limit():
    import inspect

    default = inspect.signature(tw.frame.Hook).parameters["on_limit"].default
    text = " ".join((ROOT / "docs" / "frame.md").read_text().split())
    assert f'`on_limit="{default}"` (the default)' in text


def test_a_misspelt_drop_name_gets_did_you_mean():
    m = nn.Linear(3, 2)
    compiled(m, torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"drop='TENSOR_MACH' is neither .*; did you mean 'TENSOR_MATCH'"):
        twt.guards_of(m, drop=["TENSOR_MACH"])
    with pytest.raises(ValueError, match=r"did you mean \"L\['fn'\]\""):
        twt.guards_of(m, drop=["L['fm']"])
    with pytest.raises(ValueError, match=r"drop='zzzzqqqq' is neither .*; kinds: "):  # nothing close
        twt.guards_of(m, drop=["zzzzqqqq"])
    gs = twt.guards_of(m)
    with pytest.raises(ValueError, match=r"\['TENSOR_MACH'\]; did you mean 'TENSOR_MATCH'"):
        gs.to_bytes(drop=["TENSOR_MACH"])
    b = tw.GuardBuilder({"x": 3})
    b.type_match("L['x']")
    with pytest.raises(ValueError, match=r"did you mean 'TYPE_MATCH'"):
        b.build().to_bytes(drop=["TYPE_MACH"])
    with pytest.raises(ValueError, match=r"did you mean \"L\['x'\]\""):
        b.build().to_bytes(drop=["L['y']"])


# -- the guide ------------------------------------------------------------------------------------
class GuideNet(nn.Module):
    """The guide's `model`: layers, no `cache` attribute, a forward torch compiles."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8)])

    def forward(self, x):
        return self.layers[0](x)


def _guide_blocks() -> dict[str, str]:
    """The guide's python blocks by the section they are in (``"1"``, ``"2b"``, ...)."""
    text = (ROOT / "docs" / "guide.md").read_text()
    out = {}
    for section in re.split(r"\n## ", text)[1:]:
        number = section.split(".", 1)[0]
        blocks = re.findall(r"```python\n(.*?)```", section, re.S)
        if blocks:
            out[number] = "\n".join(blocks)
    return out


def test_guide_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = _guide_blocks()
    assert {"1", "2b", "3", "7", "8", "9", "10"} <= set(blocks), sorted(blocks)
    model, x = GuideNet(), torch.randn(4, 8)
    cfg = types.SimpleNamespace(dtype=torch.float16, a=[1])
    cfg.b = cfg.a
    base = {"model": model, "x": x, "w": torch.randn(3, 3), "arr": np.zeros(3), "cfg": cfg}

    ns = dict(base)
    exec(compile(blocks["1"], "guide §1", "exec"), ns)
    f_locals = ns["f_locals"]
    ns["new_locals"] = {**f_locals, "n": 4}
    exec(compile(blocks["3"], "guide §3", "exec"), ns)
    assert ns["f"].source == "L['n']" and not ns["gs"].check(ns["new_locals"])

    ns = dict(base)
    exec(compile(blocks["2b"], "guide §2b", "exec"), ns)

    calls = []
    ns = {"tw": tw, "my_compiler": lambda fn, example_args, builder: calls.append(fn) or fn}
    exec(compile(blocks["7"], "guide §7", "exec"), ns)
    ns["f"](model, x)
    assert calls

    def f(x, n):
        return x * n

    seen = []
    ns = {"tw": tw, "f": f, "x": 2, "my_transform": lambda code: seen.append(code) or code}
    exec(compile(blocks["8"], "guide §8", "exec"), ns)
    assert seen == [f.__code__]

    # §9 lists alternatives: each on the set it applies to.
    b = tw.GuardBuilder({"n": 3, "f": lambda: 0})
    b.equals("L['n']")
    b.id_match("L['f']")
    gs = b.build()
    lines = [ln for ln in blocks["9"].splitlines() if ln.strip() and not ln.startswith(("from ", "import "))]
    assert lines[0].startswith("data = gs.to_bytes()")
    ns = {"tw": tw, "gs": tw.GuardSet.from_bytes(gs.to_bytes(drop=["L['f']"]))}
    exec(compile("\n".join(lines[:2]), "guide §9", "exec"), ns)
    assert ns["gs2"].check({"n": 3}) and not ns["gs2"].check({"n": 4})
    exec(compile(lines[2], "guide §9", "exec"), {"gs": gs})
    lin = nn.Linear(3, 2)
    compiled(lin, torch.randn(4, 3))
    exec(compile(lines[3], "guide §9", "exec"), {"imported": twt.guards_of(lin)})

    ns = dict(base)
    exec(compile(blocks["10"], "guide §10", "exec"), ns)
    assert ns["gs"].check(twt.frame_locals(model, x)) and isinstance(ns["gs"], twt.ImportedGuardSet)
