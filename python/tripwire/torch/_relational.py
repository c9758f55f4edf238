"""Torch's relational leaves -> tripwire's relational guards: NO_TENSOR_ALIASING as NO_ALIAS,
OBJECT_ALIASING as ALIAS per ``a is b``, STORAGE_OVERLAPPING as one STORAGE_OVERLAPPING. They are
decided after the walk (``_rules.Converter.run``), once every node's source is known, because
their sources are printed text: :meth:`RelationalRules._relational_source` turns a printed
source into a tripwire source only where its steps read exactly what Python's evaluation of
torch's lambda reads."""

from __future__ import annotations

import ast
import collections
import weakref
from typing import Any

from ..catalogue import GuardKind
from ..source import Source, StepKind, dict_keys_owner
from ._convert import ConverterBase, _Fallback, _Node
from ._printed import call_args, parse

_PLAIN_DICTS = (dict, collections.OrderedDict)


def _is_keys_position(index: ast.AST, owner: ast.AST) -> bool:
    """Whether ``index`` is ``list(dict.keys(owner))[i]`` with a literal int i."""
    if not (isinstance(index, ast.Subscript) and isinstance(index.slice, ast.Constant)):
        return False
    keys_of = dict_keys_owner(index.value)
    return type(index.slice.value) is int and keys_of is not None and ast.dump(keys_of) == ast.dump(owner)


def cast_list(node: ast.expr) -> list[ast.expr]:
    """The elements of an ``ast.List`` (checked by the caller)."""
    return node.elts if isinstance(node, ast.List) else []


class RelationalRules(ConverterBase):
    """The relational rules of the converter (aliasing, overlap, and their printed sources)."""

    def relational(self, node: _Node, leaf: Any, kind: str, codes: list, code: str, site: str | None) -> None:
        """NO_TENSOR_ALIASING / OBJECT_ALIASING, once every node's source is known."""
        tn = node.torch
        # torch installs STORAGE_OVERLAPPING as two leaves (the overlapping and the other tensors)
        # sharing one checker and one printed code: one tripwire guard for both.
        key: object = ("STORAGE_OVERLAPPING", code) if kind == "STORAGE_OVERLAPPING" else id(leaf)
        done = self._relational.get(key)
        if done is not None:  # the same torch leaf under another tensor's node
            self.record(tn, kind, code, "native", (done,), site=site, why="shared with the first")
            return
        self._called_refs = []
        try:
            if kind == "NO_TENSOR_ALIASING":
                args = call_args(code.split("; ")[0], ("check_no_aliasing",))
                srcs = [self._relational_source(ast.unparse(a)) for a in args]
                if len(srcs) < 2:
                    raise _Fallback("fewer than two sources")
                ids = [self.spec(GuardKind.NO_ALIAS, srcs[0], (tuple(srcs[1:]),), site)]
                why = "torch's sources only (its parameter exemption: see the exemptions)"
            elif kind == "STORAGE_OVERLAPPING":
                ids, why = [self._storage_overlapping(code.split("; ")[0], site)], ""
            else:
                ids = []
                for c, _ in codes:
                    t = parse(c)
                    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Is)):
                        raise _Fallback(f"not an `a is b`: {c}")
                    a = self._relational_source(ast.unparse(t.left))
                    b = self._relational_source(ast.unparse(t.comparators[0]))
                    ids.append(self.spec(GuardKind.ALIAS, a, (b,), site))
                why = ""
            # Each `X()` the relation reads is a WEAKREF_CALL of X, which is Python's call only
            # when X is a weak reference whose __call__ is weakref.ref's own: part of this guard.
            for ref in dict.fromkeys(self._called_refs):
                ids.append(self.spec(GuardKind.TYPE_MATCH, ref, (weakref.ref,), site))
                self.stricter.append(
                    (str(ref), "type(X) is weakref.ref: torch's lambda calls X(), whatever X is")
                )
            self._relational[key] = ids[0]
            self.record(tn, kind, code, "native", tuple(ids), why=why, site=site)
        except (_Fallback, ValueError, KeyError, SyntaxError, IndexError) as e:
            if self.fallback == "torch":
                i = self.torch_leaf(node, leaf, kind, code, site)
                self._relational[key] = i
                self.record(tn, kind, code, "torch", (i,), why=str(e), site=site)
            else:
                self.record(tn, kind, code, "unsupported", why=str(e), site=site)

    def _storage_overlapping(self, code: str, site: str | None) -> int:
        """``check_overlapping(overlapping=[...], non_overlapping=[...])`` as one STORAGE_OVERLAPPING."""
        t = parse(code)
        if not (
            isinstance(t, ast.Call)
            and isinstance(t.func, ast.Name)
            and t.func.id == "check_overlapping"
            and not t.args
            and [k.arg for k in t.keywords] == ["overlapping", "non_overlapping"]
            and all(isinstance(k.value, ast.List) for k in t.keywords)
        ):
            raise _Fallback(f"not a check_overlapping form tripwire reads: {code}")
        groups = [[self._relational_source(ast.unparse(e)) for e in cast_list(k.value)] for k in t.keywords]
        srcs = groups[0] + groups[1]
        if len(srcs) < 2 or len(set(srcs)) != len(srcs) or len(groups[0]) == 1:
            raise _Fallback(f"an overlap relation tripwire does not build: {code}")
        return self.spec(GuardKind.STORAGE_OVERLAPPING, srcs[0], (tuple(srcs[1:]), len(groups[0])), site)

    def _relational_source(self, printed: str) -> Source:
        """The tripwire source of a source torch's lambda reads. A node of the walk gives it; else
        it is built from the printed expression, only where a step reads exactly what Python's
        evaluation of the lambda reads: a frame local ``L['name']``, a global ``G['name']``,
        ``.attr`` (getattr), ``[key]`` (``dict.__getitem__`` on a node known to hold exact dicts,
        else operator.getitem: what Python's subscript calls), and ``X()`` (the referent of a weak
        reference; the caller adds ``type(X) is weakref.ref``, see relational()). A missing value
        fails the relation, as an exception in torch's lambda fails its guard."""
        n = self.by_source.get(printed)
        if n is not None and n.src is not None:
            return n.src
        tree = parse(printed)
        if isinstance(tree, ast.Attribute):
            return self._relational_source(ast.unparse(tree.value)).attr(tree.attr)
        if isinstance(tree, ast.Subscript) and isinstance(tree.slice, ast.Constant):
            base = ast.unparse(tree.value)
            key = tree.slice.value
            if base == "L" and type(key) is str:
                return Source.parse(printed)
            if base == "G" and type(key) is str and self.f_globals is not None:
                return Source.global_(key)
            parent = self.by_source.get(base)
            if parent is not None and parent.src is not None and parent.exact_type is dict:
                return parent.src.dict_item(key)
            if type(key) in (str, int, bytes, bool, type(None)) and base not in ("L", "G"):
                return self._relational_source(base).item(key)
        if isinstance(tree, ast.Subscript) and _is_keys_position(tree.slice, tree.value):
            # X[list(dict.keys(X))[i]]: the value at insertion position i. Exact when X's node is
            # a DictGuardManager of dict or OrderedDict (its type guard is in the same set, and
            # both subscript through dict's own lookup, which DICT_VALUE's storage read equals).
            parent = self.by_source.get(ast.unparse(tree.value))
            if parent is not None and parent.src is not None and parent.exact_type in _PLAIN_DICTS:
                return parent.src.step(StepKind.DICT_VALUE, tree.slice.slice.value)  # type: ignore[attr-defined]
        if isinstance(tree, ast.Call) and not tree.args and not tree.keywords:
            ref = self._relational_source(ast.unparse(tree.func))
            self._called_refs.append(ref)
            return ref.step(StepKind.WEAKREF_CALL)
        raise _Fallback(f"{printed} is not a source this import reads exactly")
