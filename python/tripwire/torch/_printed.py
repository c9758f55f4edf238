"""Reading what torch printed: a leaf guard's parameters from its verbose code part.

torch 2.13's bindings expose a leaf guard's parameters only as the code it printed
(``___check_type_id(L['x'], 1234), type=<class 'int'>``, ``L['n'] == 3``, ``len(L['xs']) == 2``,
``___dict_contains('forward', ...)``). These functions parse that text with ``ast`` (never
``eval``); the converter checks every parsed value against torch's own leaf before using it.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable
from typing import Any

__all__ = [
    "NO_KEY",
    "call_args",
    "details",
    "has_nan",
    "has_zero",
    "id_in",
    "is_identity",
    "lambda_kind",
    "literal",
    "n_from_len",
    "parse",
    "rhs_literal",
    "subscript_key",
]


def literal(node: ast.AST) -> Any:
    """A Python literal as torch prints constants (``repr``), including ``inf`` and frozensets."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in ("inf", "nan"):
        return float(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = literal(node.operand)
        if type(v) not in (int, float, complex):
            raise ValueError("not a number")
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        a, b = literal(node.left), literal(node.right)
        if type(a) not in (int, float) or type(b) is not complex:
            raise ValueError("not a complex literal")
        return a + b if isinstance(node.op, ast.Add) else a - b
    if isinstance(node, ast.Tuple):
        return tuple(literal(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [literal(e) for e in node.elts]
    if isinstance(node, ast.Set):
        return {literal(e) for e in node.elts}
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("dict unpacking")
        return {literal(k): literal(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("frozenset", "set")
        and not node.keywords
        and len(node.args) <= 1
    ):
        items = literal(node.args[0]) if node.args else ()
        return frozenset(items) if node.func.id == "frozenset" else set(items)
    raise ValueError(f"not a literal: {ast.dump(node)[:60]}")


def parse(expr: str) -> ast.expr:
    return ast.parse(expr.strip(), mode="eval").body


def rhs_literal(code: str, op: type[ast.cmpop] = ast.Eq) -> Any:
    """The literal right of ``X == <literal>``."""
    tree = parse(code)
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], op)):
        raise ValueError(f"not a comparison: {code}")
    return literal(tree.comparators[0])


def call_args(code: str, names: tuple[str, ...]) -> list[ast.expr]:
    tree = parse(code)
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not):
        tree = tree.operand
    if isinstance(tree, ast.Tuple) and tree.elts:  # "___check_type_id(X, 1), type=..." is not Python
        tree = tree.elts[0]
    if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id in names):
        raise ValueError(f"not a call of {names}: {code}")
    return list(tree.args)


def id_in(code: str, names: tuple[str, ...], source: str) -> int:
    """The integer id in ``___check_type_id(<ref>, 1234), type=<class ...>``. torch appends the
    ``, type=...`` repr, which is not Python: the id is read from the longest prefix that parses
    as exactly such a call, so nothing in the reference or in the type's name is taken for it."""
    cuts = [m.start() for m in re.finditer(r", type=", code)] + [len(code)]
    for cut in cuts:
        try:
            tree = parse(code[:cut])
        except SyntaxError:
            continue
        if (
            isinstance(tree, ast.Call)
            and isinstance(tree.func, ast.Name)
            and tree.func.id in names
            and len(tree.args) == 2
            and isinstance(tree.args[1], ast.Constant)
            and type(tree.args[1].value) is int
        ):
            return tree.args[1].value
    raise ValueError(f"no id in {code} (source {source})")


def n_from_len(code: str) -> int:
    """``len(X) == n`` or ``not X`` (n = 0)."""
    tree = parse(code)
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not):
        return 0
    n = rhs_literal(code)
    if type(n) is not int:
        raise ValueError(code)
    return n


def has_float(c: Any, pred: Callable[[float], bool]) -> bool:
    """Whether a float (or a complex component) anywhere in the constant ``c`` satisfies ``pred``."""
    if type(c) is float:
        return pred(c)
    if type(c) is complex:
        return pred(c.real) or pred(c.imag)
    if type(c) in (tuple, list, set, frozenset):
        return any(has_float(x, pred) for x in c)
    if type(c) is dict:
        return any(has_float(k, pred) or has_float(v, pred) for k, v in c.items())
    return False


def has_nan(c: Any) -> bool:
    return has_float(c, math.isnan)


def has_zero(c: Any) -> bool:
    """A float zero: torch's == matches 0.0 with -0.0, tripwire's EQUALS_MATCH does not."""
    return has_float(c, lambda x: x == 0.0)


NO_KEY: Any = object()


def subscript_key(source: str) -> Any:
    try:
        tree = parse(source)
        if isinstance(tree, ast.Subscript):
            key = literal(tree.slice)
            if type(key) in (str, int, bytes, float, bool, type(None)):
                return key
    except (SyntaxError, ValueError):
        pass
    return NO_KEY


def lambda_kind(parts: list[str]) -> str:
    """What a torch LAMBDA_GUARD is, from its code parts: the saved-tensor-hooks lambda, the
    batched `a is b` aliasing lambda, or another lambda."""
    if parts and parts[0].startswith("torch._functorch.aot_autograd.utils.top_saved_tensors_hooks ids =="):
        return "AUTOGRAD_SAVED_TENSORS_HOOKS"
    try:
        if parts and all(is_identity(p) for p in parts):
            return "OBJECT_ALIASING"
    except SyntaxError:
        pass
    return "LAMBDA_GUARD"


def is_identity(part: str) -> bool:
    tree = parse(part)
    return isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Is)


_TENSOR = re.compile(
    r"^check_tensor\((?P<src>.*), (?P<pytype>[\w.]+), (?P<keys>DispatchKeySet\(.*?\)), (?P<dtype>torch\.\w+), "
    r"device=(?P<device>[^,]+), requires_grad=(?P<rg>True|False), size=(?P<size>\[.*?\]), stride=(?P<stride>\[.*?\])\)$",
    re.S,
)


def details(kind: str, parts: list[str]) -> dict[str, Any] | None:
    """Parameters of a pending kind, parsed from torch's printed code parts (for the integration)."""
    code = "; ".join(parts)
    try:
        if kind == "TENSOR_MATCH":
            m = _TENSOR.match(code)
            if not m:
                return None
            size = [
                None if s.strip() == "None" else int(s) for s in m.group("size")[1:-1].split(",") if s.strip()
            ]
            stride = [
                None if s.strip() == "None" else int(s)
                for s in m.group("stride")[1:-1].split(",")
                if s.strip()
            ]
            device = m.group("device")
            return {
                "pytype": m.group("pytype"),
                "dispatch_keys": m.group("keys"),
                "dtype": m.group("dtype"),
                "device_index": None if device == "None" else int(device),
                "requires_grad": m.group("rg") == "True",
                "size": size,
                "stride": stride,
                "dynamic": tuple(i for i, s in enumerate(size) if s is None),
            }
        if kind == "DIMENSION_DYNAMIC_MARKING_GUARD":
            absent = [m.group(1) for p in parts if (m := re.search(r", '(\w+)'\) == False$", p))]
            return {"absent": absent}
        if kind == "NO_TENSOR_ALIASING":
            args = call_args(code, ("check_no_aliasing",))
            return {"sources": [ast.unparse(a) for a in args]}
        if kind == "OBJECT_ALIASING":
            pairs = []
            for p in parts:
                t = parse(p)
                assert isinstance(t, ast.Compare)
                pairs.append((ast.unparse(t.left), ast.unparse(t.comparators[0])))
            return {"pairs": pairs}
        if kind == "GLOBAL_STATE":
            m = re.search(r"against (\{.*\})$", code, re.S)
            return {"snapshot": json.loads(m.group(1))} if m else None
    except (ValueError, SyntaxError, AssertionError):
        return None
    return None
