"""torch's shape-environment guards -> SHAPE relations: the Python path's epilogue lambda
(``SHAPE_ENV``) and the optional C++ path's ``SYMBOLIC_SHAPE_GUARD``, both imported from the
relations torch prints (docs/torch.md, "Shape guards"), each symbol typed from the tree."""

from __future__ import annotations

import re
from typing import Any

from .. import shapes
from ..catalogue import GuardKind
from ..errors import ShapeSyntaxError
from ..source import Source, StepKind
from ._convert import ConverterBase, _Node

# torch's default (Python) path puts every shape-environment guard in one epilogue lambda on the
# root (guards.py GuardBuilder.SHAPE_ENV, add_python_lambda_leaf_guard_to_root); its code parts
# are the relations as torch prints them. Imported as SHAPE relations (docs/torch.md, "Shape
# guards"); a part tripwire's syntax does not cover leaves the whole lambda to torch's own object.
SHAPE_ENV = "SHAPE_ENV"
# torch's optional C++ path (enable_cpp_symbolic_shape_guards) installs the same relations as one
# relational leaf fed by IndexedGuardAccessors; imported the same way (Converter.cpp_shape_guard).
CPP_SHAPE_GUARD = "SYMBOLIC_SHAPE_GUARD"
_SIZE_STEPS = (StepKind.SIZE, StepKind.STRIDE, StepKind.STORAGE_OFFSET)


class ShapeRules(ConverterBase):
    """The shape rules of the converter (shape-environment guards -> SHAPE relations)."""

    def cpp_shape_guard(
        self, node: _Node, leaf: Any, codes: list[tuple[str, str | None]], code: str, site: str | None
    ) -> None:
        """torch's SYMBOLIC_SHAPE_GUARD (``enable_cpp_symbolic_shape_guards``) as SHAPE relations.

        The same leaf hangs under every symbol's node; the first occurrence imports its code parts
        (torch's ``verbose_python`` text, the relations its generated C function evaluates), the
        others share them. The relations mean what torch's Python path means: NaN fails
        ``not math.isnan(s)`` (torch's C++ function prints ``~std::isnan(s)``, which is always true;
        docs/torch.md, "Shape guards"), and arithmetic is exact (torch's C++ is unchecked int64).
        There is no torch object to fall back to (the leaf is fed by its accessors), so a part
        outside tripwire's syntax makes it unsupported."""
        tn = node.torch
        done = self._relational.get(id(leaf))
        if done is not None:
            ids = self._cpp_shape_ids[done]
            self.record(tn, CPP_SHAPE_GUARD, code, "native", ids, site=site, why="shared with the first")
            return
        # A node below the tuple accessor has no tripwire source; the relations need none.
        self.shape_env(node, leaf, codes, code, site, kind=CPP_SHAPE_GUARD)
        last = self.records[-1][0]
        if last.outcome == "native" and last.guards:
            self._relational[id(leaf)] = last.guards[0]
            self._cpp_shape_ids[last.guards[0]] = last.guards

    def shape_env(
        self,
        node: _Node,
        leaf: Any,
        codes: list[tuple[str, str | None]],
        code: str,
        site: str | None,
        kind: str = SHAPE_ENV,
    ) -> None:
        """torch's shape-environment lambda as SHAPE relations: one per relation of each code part
        (a top-level ``and`` split, so a failure names the conjunct), each installed at the user
        line torch printed for it. All or nothing: a part tripwire cannot parse leaves the whole
        lambda to torch's own guard object (fallback="torch") or reports it (fallback="refuse")."""
        tn = node.torch
        parts = [c for c, _ in codes]
        try:
            rels = [(rel, s) for c, s in codes for rel in shapes.relations_from_torch(c)]
        except ShapeSyntaxError as e:
            reason = f"a shape relation tripwire's syntax does not cover: {e}"
            if self.fallback == "torch" and kind == SHAPE_ENV:
                i = self.torch_leaf(node, leaf, SHAPE_ENV, code, site)
                self.record(tn, SHAPE_ENV, code, "torch", (i,), why=reason, site=site)
            else:
                if kind != SHAPE_ENV:
                    reason += " (torch's C++ shape guard is fed by its accessors: no torch object to call)"
                self.record(tn, kind, code, "unsupported", why=reason, site=site)
            return
        floats = {m.group(1) for p in parts for m in re.finditer(r"isnan\((L\[.*?\]|G\[.*?\])\)", p)}
        ids = [
            self.spec(
                GuardKind.SHAPE,
                None,
                (rel.text, rel.symbols, tuple(self.symbol_type(sym, floats) for sym in rel.symbols)),
                s or site,
            )
            for rel, s in rels
        ]
        guessed = sorted({str(sym) for rel, _ in rels for sym in rel.symbols if self._typed(sym) is None})
        why = (
            f"{len(ids)} SHAPE relations from {len(parts)} code parts; each symbol must have the "
            "type of its example (torch's TYPE_MATCH or TENSOR_MATCH checks it too)"
        )
        if guessed:
            why += "; typed from the relations (no TYPE_MATCH on them): " + ", ".join(guessed)
        self.record(tn, kind, code, "native", tuple(ids), why=why, site=site)

    def _typed(self, sym: Source) -> str | None:
        """A symbol's type when the tree says it: a size, stride or storage offset is an int; a
        value with an exact TYPE_MATCH/ID_MATCH of int or float is that."""
        if sym.steps and sym.steps[-1].kind in _SIZE_STEPS:
            return "int"
        text = str(sym)
        for n in self.nodes.values():
            if n.torch.source == text and n.exact_type in (int, float):
                return n.exact_type.__name__
        return None

    def symbol_type(self, sym: Source, floats: set[str]) -> str:
        """int or float: from the tree (`_typed`), else float when torch guards it against NaN
        (only float symbols get `not math.isnan(s)`), else int. A wrong guess makes tripwire
        stricter, never laxer: a value of another type fails the relation."""
        t = self._typed(sym)
        if t is not None:
            return t
        return "float" if str(sym) in floats else "int"
