"""The public API under ``mypy --strict``, as a user's type checker sees it.

Two user scripts: one using the README's API must type-check cleanly; one breaking a specialized
function's signature (and other typed options) must be rejected exactly on the lines marked
``# E: <code>``. tripwire itself is read as an installed, typed package would be (its own
modules are checked by the project's mypy configuration, not under --strict here), and torch is
not analysed (``tw.torch.guards_of`` is typed by tripwire; torch's own sources take minutes).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[3]

PASSES = """
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tripwire as tw
import tripwire.frame as twf


def my_compiler(
    fn: Callable[..., Any], example_args: dict[str, Any], builder: tw.GuardBuilder
) -> Callable[..., Any]:
    builder.equals("L['n']")
    return fn


@tw.specialize(compiler=my_compiler, backend="mine", on_limit="evict")
def f(x: int, n: int) -> int:
    return x * n


@tw.specialize
def g(x: str, *, upper: bool = False) -> str:
    return x.upper() if upper else x


class Model:
    @tw.specialize(compiler=my_compiler)
    def forward(self, y: float) -> float:
        return y * 2


def main() -> None:
    total: int = f(1, 2) + f(x=3, n=4)
    text: str = g("a", upper=True)
    out: float = Model().forward(1.5)
    reasons: list[tw.Failure | None] = f.why_not(1, 3)
    explained: str = f.explain()
    entries: int = len(f.cache)

    b = tw.GuardBuilder({"x": 3, "cfg": {"mode": "fast"}})
    b.type_match("L['x']")
    b.equals("L['cfg']['mode']")
    gs = b.build()
    ok: bool = gs.check({"x": 4, "cfg": {"mode": "fast"}})
    failure = gs.why_not({"x": 4, "cfg": {"mode": "slow"}})
    reason: str | None = failure.reason if failure is not None else None
    print(gs.explain())

    cache = tw.Cache(recompile_limit=8, accumulated_limit=256, on_limit="fallback")
    cache.insert(gs, f)
    payload: Any = cache.lookup({"x": 4, "cfg": {"mode": "fast"}})
    data: bytes = gs.to_bytes()
    gs2: tw.GuardSet = tw.GuardSet.from_bytes(data)

    def compile_frame(frame: twf.Frame) -> Any:
        return twf.SKIP

    with twf.hooked(compile_frame, on_limit="run_only"):
        f(1, 2)

    s: tw.Summary = tw.summary()
    misses: int = sum(c.misses for c in s.caches)
    previous: bool = tw.record_recompiles(True)
    path: str = tw.report("report.html")
    store = tw.store.Directory()
    print(total, text, out, reasons, explained, entries, ok, reason, payload, gs2, misses, previous, path, store)


def torch_part(model: object) -> None:
    imported = tw.torch.guards_of(model)
    print(imported.explain())
"""

FAILS = """
from __future__ import annotations

import tripwire as tw
import tripwire.frame as twf


def compiler(fn: object, example_args: dict[str, object], builder: tw.GuardBuilder) -> object:
    return fn


@tw.specialize(compiler=lambda fn, args, b: fn)
def f(x: int, n: int) -> int:
    return x * n


class Model:
    @tw.specialize
    def forward(self, y: float) -> float:
        return y


f("a", 1)  # E: arg-type
f(1)  # E: call-arg
s: str = f(1, 2)  # E: assignment
f.why_not("a", 1)  # E: arg-type
Model().forward("y")  # E: arg-type
tw.Cache(on_limit="explode")  # E: arg-type
tw.specialize(on_limit="nope")  # E: call-overload
twf.Hook(lambda frame: None, on_limit="sometimes")  # E: arg-type
tw.specialize(compiler=compiler)  # E: arg-type
tw.torch.guards_of(f, equals="loose")  # E: arg-type
"""


def run_mypy(tmp_path: Path, source: str) -> tuple[int, str]:
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(source))
    config = tmp_path / "mypy.ini"
    # tripwire's own errors are silenced, as for any installed package; its types are not.
    config.write_text(
        "[mypy]\n[mypy-tripwire.*]\nignore_errors = True\n"
        "[mypy-torch.*]\nfollow_imports = skip\n[mypy-numpy.*]\nfollow_imports = skip\n"
    )
    env = dict(os.environ, MYPYPATH=str(ROOT / "python"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "--no-error-summary",
            "--show-error-codes",
            str(script),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=900,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_readme_api_passes_mypy_strict(tmp_path: Path) -> None:
    status, out = run_mypy(tmp_path, PASSES)
    assert status == 0, out


def test_mypy_strict_rejects_broken_calls(tmp_path: Path) -> None:
    status, out = run_mypy(tmp_path, FAILS)
    assert status == 1, out
    expected = {}
    for number, line in enumerate(textwrap.dedent(FAILS).splitlines(), 1):
        m = re.search(r"# E: ([\w-]+)$", line)
        if m:
            expected[number] = m.group(1)
    found: dict[int, set[str]] = {}
    for m in re.finditer(r"user_script\.py:(\d+): error: .*\[([\w-]+)\]$", out, re.MULTILINE):
        found.setdefault(int(m.group(1)), set()).add(m.group(2))
    assert set(found) == set(expected), out
    for number, code in expected.items():
        assert code in found[number], (number, out)
