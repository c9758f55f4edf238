"""The package's layers (docs/cpp.md, "Package layout"): no module imports from a layer above its
own, no import circle, every module placed. Read from the source text with ``ast``: nothing of
the package is imported here, so a module that would fail to import still gets checked."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "python" / "tripwire"


def _layers() -> dict[str, int]:
    """{module (dotted below tripwire, a subpackage by its name): layer} from the docs' table."""
    text = (ROOT / "docs" / "cpp.md").read_text()
    section = text.split("## Package layout", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    for line in section.splitlines():
        m = re.match(r"\| (\d+) [a-z]+ \| ([^|]+) \|", line)
        if m:
            for name in re.findall(r"`([\w.]+)`", m.group(2)):
                assert name not in layers, f"{name} is in two layers"
                layers[name] = int(m.group(1))
    assert layers, "docs/cpp.md has no package layout table"
    return layers


def _module_name(path: Path) -> str:
    """'guard_set', 'torch._rules', '__init__' (the package's own), 'torch' (a subpackage's)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _placed(module: str, layers: dict[str, int]) -> int | None:
    """The layer of a module: its own row, else its top-level subpackage's."""
    if module in layers:
        return layers[module]
    return layers.get(module.split(".")[0])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, tripwire module) for every import the module runs, at any depth (function-level
    imports included), except under ``if TYPE_CHECKING:``. ``from . import x`` names module x
    when x is a module of the package, else the package itself."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    # The package a relative import of level 1 starts from, as a list of parts below tripwire.
    here = module.split(".") if is_package and module != "__init__" else module.split(".")[:-1]
    if module == "__init__":
        here = []
    out: list[tuple[int, str]] = []

    def target(parts: list[str], name: str | None) -> str:
        base = ".".join(parts)
        if name is not None:
            candidate = f"{base}.{name}" if base else name
            where = PACKAGE / Path(*candidate.split("."))
            # A module, a subpackage, or the extension module (_core: its stub stands for it).
            if any(where.with_suffix(s).exists() for s in (".py", ".pyi")) or any(
                (where / f"__init__{s}").exists() for s in (".py", ".pyi")
            ):
                return candidate
        return base or "__init__"

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here[: len(here) - (node.level - 1)] if node.level > 1 else list(here)
                if node.module:
                    parts = parts + node.module.split(".")
                for alias in node.names:
                    out.append((node.lineno, target(parts, alias.name)))
            elif node.module and (node.module == "tripwire" or node.module.startswith("tripwire.")):
                parts = node.module.split(".")[1:]
                for alias in node.names:
                    out.append((node.lineno, target(parts, alias.name)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tripwire" or alias.name.startswith("tripwire."):
                    out.append((node.lineno, target(alias.name.split(".")[1:], None)))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_in_a_layer() -> None:
    layers = _layers()
    missing = [_module_name(p) for p in _modules() if _placed(_module_name(p), layers) is None]
    assert not missing, f"add these modules to docs/cpp.md's package layout: {missing}"


def test_no_module_imports_from_a_higher_layer() -> None:
    layers = _layers()
    upward = []
    for path in _modules():
        module = _module_name(path)
        own = _placed(module, layers)
        for line, imported in _imports(path):
            if imported == "_core":  # the extension module: below every layer
                continue
            theirs = _placed(imported, layers)
            assert theirs is not None, f"{module}:{line} imports {imported}, which no layer holds"
            if own is not None and theirs > own:
                upward.append(f"{module} (layer {own}), line {line}: imports {imported} (layer {theirs})")
    assert not upward, "\n".join(upward)


def test_no_import_circle() -> None:
    graph: dict[str, set[str]] = {}
    for path in _modules():
        module = _module_name(path)
        graph.setdefault(module, set()).update(m for _, m in _imports(path) if m != module and m != "_core")
    # Depth-first search; a back edge closes a circle.
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                circles.append(stack[stack.index(n) :] + [n])
            elif n not in state:
                walk(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from . import guard_set\n", ["guard_set"]),
        ("from .guard_set import GuardSet\n", ["guard_set"]),
        ("def f():\n    from .serialization import dumps\n", ["serialization"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .guard_set import GuardSet\n", []),
        ("import tripwire.store\n", ["store"]),
        ("from . import __version__\n", ["__init__"]),
    ],
)
def test_the_import_reader_sees_each_form(tmp_path: Path, source: str, expected: list[str]) -> None:
    """The checker itself: each import form is read (so an upward import cannot hide in one)."""
    path = PACKAGE / "_layers_probe.py"
    assert not path.exists()
    try:
        path.write_text(source)
        assert [m for _, m in _imports(path)] == expected
    finally:
        path.unlink()
