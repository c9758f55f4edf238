""" "tripwire's own file": one definition (_package.is_own_file) for the install-site walk, the
frame hook and tripwire.torch.compile's route. Each is asked about the paths where a prefix or a
directory comparison would answer differently: a module of a subpackage (tripwire.torch's), the
demo (it plays the user), a sibling directory or file whose name starts with "tripwire", and a
path that leaves the package through "..". A route with a definition of its own (a prefix test,
a comparison of parent directories) fails here."""

from __future__ import annotations

import os
import types

import pytest

from tripwire import _package, builder
from tripwire import frame as twf

_PKG = _package._PKG_DIR
_PARENT = os.path.dirname(_PKG)

# (path, whether it is tripwire's own), answered without asking the engine.
CASES = [
    (os.path.join(_PKG, "_probe.py"), True),
    (os.path.join(_PKG, "torch", "_probe.py"), True),  # a subpackage's module: machinery too
    (os.path.join(_PKG, "torch", "deeper", "_probe.py"), True),
    (os.path.join(_PKG, "demo.py"), False),  # the demo plays the user
    (os.path.join(_PKG, "torch", "demo.py"), True),  # only the package's own demo is exempt
    (os.path.join(_PARENT, "tripwire_probe", "mod.py"), False),  # a sibling directory "tripwire*"
    (os.path.join(_PARENT, "tripwire_probe.py"), False),  # a sibling module "tripwire*.py"
    (_PKG + "2" + os.sep + "torch" + os.sep + "_probe.py", False),
    (os.path.join(_PKG, "..", "tripwire_probe", "mod.py"), False),  # leaves through ".."
    (os.path.join(_PKG, "torch", "..", "_probe.py"), True),  # ".." back into the package
    ("<frozen importlib._bootstrap>", False),
    ("_probe.py", os.getcwd() == _PKG),  # relative: resolved against the working directory
]
IDS = [p[len(_PARENT) + 1 :] if p.startswith(_PARENT + os.sep) else p for p, _ in CASES]
# Frozen importlib's code is Dynamo's own to skip (its trace rules), whatever tripwire answers.
FILE_CASES = [(p, own) for p, own in CASES if not p.startswith("<frozen ")]
FILE_IDS = [i for (p, _), i in zip(CASES, IDS) if not p.startswith("<frozen ")]


def _function_in(filename: str) -> types.FunctionType:
    """A function whose code claims ``filename`` (no file needs to exist there)."""
    ns: dict = {}
    exec(compile("def probe(x):\n    return x * 2 + 1\n", filename, "exec"), ns)
    return ns["probe"]


@pytest.mark.parametrize(("path", "own"), CASES, ids=IDS)
def test_is_own_file_and_the_install_site_walk(path: str, own: bool) -> None:
    assert _package.is_own_file(path) is own
    # The walk leaves out tripwire's own frames and frozen importlib's, nothing else.
    assert builder._is_machinery(path) is (own or path.startswith("<frozen "))


@pytest.mark.parametrize(("path", "own"), CASES, ids=IDS)
def test_frame_hook_skips_exactly_own_files(path: str, own: bool) -> None:
    seen: list[types.CodeType] = []
    hook = twf.Hook(lambda frame: seen.append(frame.code))
    fn = _function_in(path)
    got = hook(fn.__code__, {"x": 1}, fn.__globals__, {}, fn)
    if own:
        assert got == 1 and seen == []  # SKIP, the callback never asked
        assert twf.cache_of(fn, hook) is None
    else:
        assert got is None and seen == [fn.__code__]  # the callback decided (run the original)


@pytest.mark.parametrize(("path", "own"), FILE_CASES, ids=FILE_IDS)
def test_torch_compile_compiles_exactly_what_is_not_own(path: str, own: bool) -> None:
    """tripwire.torch.compile offers a frame to Dynamo exactly when the one definition says it is
    not tripwire's: its own files run uncompiled, every other file (the demo, a sibling
    "tripwire_probe") is compiled and served from its cache on the next call."""
    torch = pytest.importorskip("torch")
    import tripwire.torch as twt

    torch._dynamo.reset()
    try:
        fn = _function_in(path)
        compiled = twt.compile(fn, backend="eager")
        x = torch.arange(3.0)
        for _ in range(2):
            assert torch.equal(compiled(x), x * 2 + 1)
        c = (
            compiled._tripwire_compiled
            if hasattr(compiled, "_tripwire_compiled")
            else compiled.dynamo_ctx.compiled
        )
        cache = twf.cache_of(fn, c.caches)
        if own:
            assert fn.__code__ not in c.codes and cache is None
        else:
            assert fn.__code__ in c.codes and cache is not None and len(cache) == 1
    finally:
        torch._dynamo.reset()
    assert twf.current() is None
