"""Symbolic shape relations: the text of SHAPE guards, their structured form, and torch's code parts.

A relation relates *symbols*, which are sources (``L['x'].size()[0]``, ``L['n']``,
``L['self'].cfg.k``), with the arithmetic and comparisons torch's shape environment prints::

    ((6*L['x'].size()[0]) % 4) == 0
    (L['x'].size()[0] // 2) <= L['y'].size()[0]
    2 <= L['x'].size()[0] <= 1024
    not math.isnan(L['s'])
    Eq(Mod(L['x'].size()[0], 8), 0)

docs/guards.md (SHAPE) has the grammar and the semantics (Python's, exactly, with three documented
limits). The engine parses and evaluates relations in C++; this module finds their symbols,
prints them canonically, gives errors with offsets, and builds relations without text::

    from tripwire.shapes import sym, Range
    x0, y0 = sym("L['x'].size()[0]"), sym("L['y'].size()[0]")
    b.shape(x0 // 2 <= y0)
    b.shape(Range(2, x0, 1024))

``relations_from_torch(code_part)`` turns one code part of torch's shape guard (its verbose form,
with the ``# ...`` comment torch appends) into relations, for importing torch's guards.
"""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tripwire._core as _core

from .errors import GuardBuildError, ShapeSyntaxError
from .source import RootKind, Source, SourceParseError
from .source import _parse_text as _source_parse_text

__all__ = [
    "Abs",
    "Add",
    "And",
    "CleanDiv",
    "Eq",
    "Expr",
    "FloorDiv",
    "Ge",
    "Gt",
    "IntTrueDiv",
    "IsNan",
    "Le",
    "Lt",
    "Max",
    "Min",
    "Mod",
    "Mul",
    "Ne",
    "Not",
    "Or",
    "Pow",
    "PythonMod",
    "Range",
    "Relation",
    "ToFloat",
    "TrueDiv",
    "dynamic_relations",
    "parse",
    "relations_from_torch",
    "sym",
]

SymbolType = str  # "int" or "float"
_TYPE_CODES = {"int": 0, "float": 1}


@dataclass(frozen=True)
class Relation:
    """One parsed relation.

    Attributes:
        text: the relation as the engine evaluates it and failure reasons print it: the text given,
            without its comment, each symbol printed as tripwire prints sources
            (``L['x'].shape[0]`` and ``L['x'].size(0)`` become ``L['x'].size()[0]``).
        symbols: its distinct symbols, in order of first use.
        comment: the ``# ...`` comment after it (torch's source line), or None.
        original: the text as given.
    """

    text: str
    symbols: tuple[Source, ...]
    comment: str | None = None
    original: str = ""
    # (canonical begin, canonical end, original begin, original end) of each symbol occurrence
    _spans: tuple[tuple[int, int, int, int], ...] = field(default=(), repr=False, compare=False)

    def __init__(
        self,
        text: str,
        symbols: tuple[Source, ...],
        comment: str | None = None,
        original: str = "",
        _spans: tuple[tuple[int, int, int, int], ...] = (),
    ) -> None:
        # The fields go straight into the instance dict, as GuardSpec's do: the frozen dataclass's
        # generated __init__ calls object.__setattr__ per field, and a cold build of torch's code
        # parts makes one Relation per part. Assignment afterwards still raises FrozenInstanceError.
        d = self.__dict__
        d["text"] = text
        d["symbols"] = symbols
        d["comment"] = comment
        d["original"] = original
        d["_spans"] = _spans

    def __str__(self) -> str:
        return self.text

    def original_offset(self, offset: int) -> int:
        """The offset in ``original`` of offset ``offset`` in ``text``."""
        shift = len(self.original) - len(self.original.lstrip())  # leading blanks
        for cb, ce, ob, oe in self._spans:
            if offset < cb:
                break
            if offset < ce:
                return ob  # inside a symbol: its start
            shift = oe - ce
        return offset + shift

    def evaluate(self, values: Sequence[Any]) -> tuple[bool, str | None]:
        """(holds, error) of this relation on one value per symbol (exact ints or floats, in the
        order of ``symbols``), as a check evaluates it; ``error`` is what Python would have
        raised (the relation then does not hold)."""
        types = []
        for src, v in zip(self.symbols, values, strict=True):
            t = type(v)
            if t is not int and t is not float:
                raise GuardBuildError(f"shape symbol {src} is a {t.__name__}; a symbol is an int or a float")
            types.append(_TYPE_CODES[t.__name__])
        try:
            holds, error, _path = _core.evaluate_relation(self.text, types, list(values))
        except ShapeSyntaxError as e:
            raise ShapeSyntaxError(e.message, self.original_offset(e.offset), self.original) from None
        return holds, error

    def reason(self, values: Sequence[Any], error: str | None = None) -> str:
        """``"<text> is false with L['x'].size()[0] = 9"`` (or ``raised <error>``)."""
        head = f"{self.text} is false" if error is None else f"{self.text} raised {error}"
        pairs = ", ".join(f"{s} = {_short(v)}" for s, v in zip(self.symbols, values, strict=True))
        return f"{head} with {pairs}" if pairs else head


def _short(v: Any) -> str:
    try:
        r = repr(v)
    except ValueError:  # an int past the interpreter's digit limit
        return f"<int of {v.bit_length()} bits>"
    return r if len(r) <= 60 else r[:28] + "..." + r[-28:]


def parse(relation: str | Expr | Relation) -> Relation:
    """Parse a relation (text, or an :class:`Expr` from the structured form).

    Raises :class:`tripwire.ShapeSyntaxError` (a ValueError) with the offset of the problem for
    text tripwire cannot parse, including a source it does not know. Type errors (which depend on
    the symbols' types) are found when the relation is checked on an example
    (``GuardBuilder.shape``)."""
    if isinstance(relation, Relation):
        return relation
    if isinstance(relation, Expr):
        relation = relation.relation_text()
    if not isinstance(relation, str):
        raise TypeError(f"a relation is a str or a tripwire.shapes.Expr, not {type(relation).__name__}")
    return _parse_text(str(relation))


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str) -> Relation:
    """parse() of an exact str, memoised: a JIT that recompiles a function sees the same texts
    again (a Relation is immutable; errors are not cached)."""
    return _parse_symbols(text)


def clear_memos() -> None:
    """Empty this module's memo of parsed relations (builder.clear_build_memos)."""
    _parse_text.cache_clear()


def _parse_symbols(text: str) -> Relation:
    """parse() of an exact str: the engine's parser finds the symbols' extents, the source parser
    (python/tripwire/source.py) reads each one."""
    try:
        code_end, spans, raw_symbols = _core.parse_relation(text)
    except ShapeSyntaxError as e:
        raise ShapeSyntaxError(e.message, e.offset, text) from None
    canonical: list[Source] = []
    as_printed = True  # every symbol written as tripwire prints it (torch's text is)
    for k, raw in enumerate(raw_symbols):
        try:
            src = _source_of_symbol(raw, True)
        except SourceParseError as e:
            first = next(begin for begin, _end, j in spans if j == k)
            raise ShapeSyntaxError(str(e), first, text) from None
        canonical.append(src)
        if as_printed and str(src) != raw:
            as_printed = False
    lead = len(text) - len(text.lstrip())
    comment = text[code_end:].strip()
    comment = comment[1:].strip() if comment.startswith("#") else comment
    if as_printed:
        # The canonical text is the code as given, each symbol where it was (what the loop below
        # computes when every printed symbol has its raw text's length). The distinct raw texts
        # are distinct sources: equal sources print the same, and each prints as its raw text.
        out_spans = [(begin - lead, end - lead, begin, end) for begin, end, _k in spans]
        return Relation(text[:code_end].strip(), tuple(canonical), comment or None, text, tuple(out_spans))
    # Rebuild the text with canonical symbols, remembering where each one came from.
    out: list[str] = []
    out_spans = []
    pos = 0
    length = 0
    for begin, end, k in spans:
        piece = text[pos:begin]
        out.append(piece)
        length += len(piece)
        printed = str(canonical[k])
        out_spans.append((length - lead, length - lead + len(printed), begin, end))
        out.append(printed)
        length += len(printed)
        pos = end
    out.append(text[pos:code_end])
    # Distinct by equality, in order of first use (a dict: identity first, then hash and ==).
    symbols = tuple(dict.fromkeys(canonical))
    return Relation("".join(out).strip(), symbols, comment or None, text, tuple(out_spans))


_source_of_symbol = _source_parse_text


def relations_from_torch(code_part: str) -> list[Relation]:
    """The relations of one code part of torch's shape guard, a new list.

    Accepts what torch 2.13 prints in its shape-environment code parts, verbose or not: a
    relation, optionally followed by the ``# ...`` comment torch appends (the user's source line,
    or why the guard exists). A top-level conjunction (``2 <= s and s <= 1024``, how the
    non-verbose form prints a range) becomes one relation per conjunct, so a failure names the
    conjunct that is false; a chained comparison (``2 <= s <= 1024``) stays one relation. Every
    relation keeps the part's comment. Raises ShapeSyntaxError for text tripwire cannot use."""
    return list(_conjuncts(parse(code_part)))


def _conjuncts(rel: Relation) -> tuple[Relation, ...]:
    """One relation per conjunct of a top-level ``and`` (each with ``rel``'s comment), or ``(rel,)``."""
    if " and " not in rel.text and "And(" not in rel.text:
        return (rel,)
    try:
        tree = ast.parse(rel.text, mode="eval").body
    except SyntaxError:
        return (rel,)
    if not (isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And)):
        return (rel,)
    out = []
    for value in tree.values:
        segment = ast.get_source_segment(rel.text, value)
        if segment is None:
            return (rel,)
        part = parse(segment)
        out.append(Relation(part.text, part.symbols, rel.comment, part.original, part._spans))
    return tuple(out)


# -- the structured form -------------------------------------------------------------------------
_BINARY_TEXT = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "floordiv": "//",
    "mod": "%",
    "truediv": "/",
    "pow": "**",
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
}
_BOOL_OPS = ("eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "isnan")


class Expr:
    """A shape expression built without text: symbols (:func:`sym`), numbers, Python operators
    (``+ - * // % / ** -x abs()``, comparisons, ``&`` ``|`` ``~`` for and/or/not) and the functions
    of this module. It prints as the text syntax (``str(e)``) and is passed to
    ``GuardBuilder.shape`` like text. An Expr has no truth value: use ``&``, ``|``, ``~`` or
    And/Or/Not rather than Python's ``and``/``or``/``not``."""

    __slots__ = ("_args", "_op")
    __hash__ = None  # type: ignore[assignment]  # == builds a relation

    def __init__(self, op: str, args: tuple) -> None:
        self._op = op
        self._args = args

    # -- printing
    def relation_text(self) -> str:
        """The text of this expression, as a relation (no outer parentheses)."""
        return self._text(top=True)

    def __str__(self) -> str:
        return self._text(top=True)

    def __repr__(self) -> str:
        return f"Expr({self._text(top=True)!r})"

    def _text(self, top: bool = False) -> str:
        op, a = self._op, self._args
        if op == "sym":
            return str(a[0])
        if op == "const":
            return _literal(a[0])
        if op in _BINARY_TEXT:
            body = f"{_arg(a[0])} {_BINARY_TEXT[op]} {_arg(a[1])}"
        elif op == "neg":
            body = f"-{_arg(a[0])}"
        elif op in ("and", "or"):
            body = f" {op} ".join(_arg(x) for x in a)
        elif op == "not":
            body = f"not {_arg(a[0])}"
        elif op == "range":
            lo, x, hi = a
            body = f"{_arg(lo)} <= {_arg(x)}" + ("" if hi is None else f" <= {_arg(hi)}")
        else:  # calls
            return f"{op}({', '.join(_arg(x, call=True) for x in a)})"
        return body if top else f"({body})"

    # -- operators
    def __add__(self, o: Any) -> Expr:
        return Expr("add", (self, _expr(o)))

    def __radd__(self, o: Any) -> Expr:
        return Expr("add", (_expr(o), self))

    def __sub__(self, o: Any) -> Expr:
        return Expr("sub", (self, _expr(o)))

    def __rsub__(self, o: Any) -> Expr:
        return Expr("sub", (_expr(o), self))

    def __mul__(self, o: Any) -> Expr:
        return Expr("mul", (self, _expr(o)))

    def __rmul__(self, o: Any) -> Expr:
        return Expr("mul", (_expr(o), self))

    def __floordiv__(self, o: Any) -> Expr:
        return Expr("floordiv", (self, _expr(o)))

    def __rfloordiv__(self, o: Any) -> Expr:
        return Expr("floordiv", (_expr(o), self))

    def __mod__(self, o: Any) -> Expr:
        return Expr("mod", (self, _expr(o)))

    def __rmod__(self, o: Any) -> Expr:
        return Expr("mod", (_expr(o), self))

    def __truediv__(self, o: Any) -> Expr:
        return Expr("truediv", (self, _expr(o)))

    def __rtruediv__(self, o: Any) -> Expr:
        return Expr("truediv", (_expr(o), self))

    def __pow__(self, o: Any) -> Expr:
        return Expr("pow", (self, _expr(o)))

    def __rpow__(self, o: Any) -> Expr:
        return Expr("pow", (_expr(o), self))

    def __neg__(self) -> Expr:
        return Expr("neg", (self,))

    def __pos__(self) -> Expr:
        return self

    def __abs__(self) -> Expr:
        return Expr("abs", (self,))

    def __eq__(self, o: object) -> Expr:  # type: ignore[override]
        return Expr("eq", (self, _expr(o)))

    def __ne__(self, o: object) -> Expr:  # type: ignore[override]
        return Expr("ne", (self, _expr(o)))

    def __lt__(self, o: Any) -> Expr:
        return Expr("lt", (self, _expr(o)))

    def __le__(self, o: Any) -> Expr:
        return Expr("le", (self, _expr(o)))

    def __gt__(self, o: Any) -> Expr:
        return Expr("gt", (self, _expr(o)))

    def __ge__(self, o: Any) -> Expr:
        return Expr("ge", (self, _expr(o)))

    def __and__(self, o: Any) -> Expr:
        return Expr("and", (self, _expr(o)))

    def __rand__(self, o: Any) -> Expr:
        return Expr("and", (_expr(o), self))

    def __or__(self, o: Any) -> Expr:
        return Expr("or", (self, _expr(o)))

    def __ror__(self, o: Any) -> Expr:
        return Expr("or", (_expr(o), self))

    def __invert__(self) -> Expr:
        return Expr("not", (self,))

    def __bool__(self) -> bool:
        raise TypeError(
            "a tripwire shape expression has no truth value: combine relations with & | ~ "
            "or And/Or/Not, and pass them to GuardBuilder.shape"
        )


def _literal(v: Any) -> str:
    if type(v) is bool:
        return "True" if v else "False"
    if type(v) is int:
        return str(v) if v >= 0 else f"({v})"
    if math.isnan(v):
        return "math.nan"
    if math.isinf(v):
        return "math.inf" if v > 0 else "(-math.inf)"
    r = repr(v)
    return r if v >= 0 and not r.startswith("-") else f"({r})"


def _arg(e: Expr, call: bool = False) -> str:
    return e._text(top=call)


def _expr(v: Any) -> Expr:
    if isinstance(v, Expr):
        return v
    if isinstance(v, Source):
        return Expr("sym", (v,))
    if type(v) in (int, float, bool):
        return Expr("const", (v,))
    if isinstance(v, str):
        raise TypeError(f"use sym({v!r}) to make a source a symbol")
    raise TypeError(f"a shape expression takes ints, floats, symbols and expressions, not {type(v).__name__}")


def sym(source: str | Source) -> Expr:
    """The symbol whose value is read from ``source`` (``"L['x'].size()[0]"``; ``.shape[i]`` and
    ``.size(i)`` mean the same size)."""
    return Expr("sym", (Source.parse(source, shape_is_size=True),))


def _call(name: str, *args: Any) -> Expr:
    return Expr(name, tuple(_expr(a) for a in args))


def _fold(op: str, args: tuple) -> Expr:
    if not args:
        raise TypeError(f"{op} needs at least one operand")
    return functools.reduce(lambda a, b: Expr(op, (a, b)), (_expr(a) for a in args))


def Eq(a: Any, b: Any) -> Expr:
    """``a == b``"""
    return _expr(a) == _expr(b)


def Ne(a: Any, b: Any) -> Expr:
    """``a != b``"""
    return _expr(a) != _expr(b)


def Lt(a: Any, b: Any) -> Expr:
    """``a < b``"""
    return _expr(a) < _expr(b)


def Le(a: Any, b: Any) -> Expr:
    """``a <= b``"""
    return _expr(a) <= _expr(b)


def Gt(a: Any, b: Any) -> Expr:
    """``a > b``"""
    return _expr(a) > _expr(b)


def Ge(a: Any, b: Any) -> Expr:
    """``a >= b``"""
    return _expr(a) >= _expr(b)


def And(*args: Any) -> Expr:
    """``a and b and ...`` (short-circuit, left to right)."""
    return Expr("and", tuple(_expr(a) for a in args)) if len(args) > 1 else _fold("and", args)


def Or(*args: Any) -> Expr:
    """``a or b or ...`` (short-circuit, left to right)."""
    return Expr("or", tuple(_expr(a) for a in args)) if len(args) > 1 else _fold("or", args)


def Not(a: Any) -> Expr:
    """``not a``"""
    return ~_expr(a)


def Add(*args: Any) -> Expr:
    """``a + b + ...`` (left to right)."""
    return _fold("add", args)


def Mul(*args: Any) -> Expr:
    """``a * b * ...`` (left to right)."""
    return _fold("mul", args)


def FloorDiv(a: Any, b: Any) -> Expr:
    """``a // b``: floor division (Python's)."""
    return _expr(a) // _expr(b)


CleanDiv = FloorDiv


def Mod(a: Any, b: Any) -> Expr:
    """``a % b``: the result has the divisor's sign (Python's)."""
    return _expr(a) % _expr(b)


PythonMod = Mod


def TrueDiv(a: Any, b: Any) -> Expr:
    """``a / b``: a float."""
    return _expr(a) / _expr(b)


def IntTrueDiv(a: Any, b: Any) -> Expr:
    """``IntTrueDiv(a, b)``: ``a / b`` of two ints, correctly rounded."""
    return _call("IntTrueDiv", a, b)


def Pow(a: Any, b: Any) -> Expr:
    """``a ** b`` of ints, with a natural exponent."""
    return _expr(a) ** _expr(b)


def Min(*args: Any) -> Expr:
    """``min(a, b, ...)`` (operands of one type)."""
    return _call("min", *args)


def Max(*args: Any) -> Expr:
    """``max(a, b, ...)`` (operands of one type)."""
    return _call("max", *args)


def Abs(a: Any) -> Expr:
    """``abs(a)``"""
    return abs(_expr(a))


def ToFloat(a: Any) -> Expr:
    """``float(a)``"""
    return _call("float", a)


def IsNan(a: Any) -> Expr:
    """``math.isnan(a)``"""
    return _call("math.isnan", a)


def Range(lo: Any, x: Any, hi: Any = None) -> Expr:
    """``lo <= x`` or ``lo <= x <= hi`` (chained, as torch prints ranges; ``hi=None`` is unbounded)."""
    return Expr("range", (_expr(lo), _expr(x), None if hi is None else _expr(hi)))


# -- dynamic dimensions --------------------------------------------------------------------------
def dynamic_relations(
    f_locals: Any,
    dynamic: Any,
    *,
    duck: bool = True,
    specialize_zero_one: bool = True,
    read: Callable[[Source], Any] | None = None,
) -> list[str]:
    """The relations Dynamo installs for dimensions marked dynamic, on the example ``f_locals``.

    ``dynamic`` maps a local name (``"x"``) or a printed source (``"L['batch']['ids']"``, read
    with ``read``; ``read`` is required for sources below a local) to the dimensions of its tensor
    or array that are dynamic (an int, an iterable of ints, or ``"all"``/``True``). Keys naming
    one source are merged. For each such dimension of size ``n`` on the example, in order:

    * with ``specialize_zero_one`` (Dynamo's default), a size 0 or 1 is specialised:
      ``L['x'].size()[d] == n``;
    * with ``duck`` (Dynamo's duck sizing), a size seen before on an earlier dynamic dimension
      becomes an equality with that dimension (``L['y'].size()[0] == L['x'].size()[1]``);
    * otherwise a range: ``2 <= L['x'].size()[d]`` (``0 <= ...`` without 0/1 specialisation),
      with no upper bound.

    Static dimensions are not covered here: TENSOR_MATCH / ARRAY_MATCH check them.
    """
    if not isinstance(dynamic, dict):
        raise TypeError("dynamic must map a local name or a printed source to its dynamic dimensions")
    # One entry per source, in order of first mention; its dimensions in order, each once.
    per_source: dict[Source, tuple[Any, list[int] | None]] = {}
    for key, dims in dynamic.items():
        if type(key) is not str:
            raise TypeError(f"a dynamic key is a local name or a printed source, not {key!r}")
        if key.isidentifier():
            if key not in f_locals:
                raise GuardBuildError(f"dynamic names {key!r}, which is not a local")
            src, value = Source.local(key), f_locals[key]
        else:
            src = Source.parse(key)
            if src.root is RootKind.LOCAL and not src.steps:
                if src.name not in f_locals:
                    raise GuardBuildError(f"dynamic names {key!r}, which is not a local")
                value = f_locals[src.name]
            elif read is None:
                raise GuardBuildError(f"dynamic names {key!r}: a source below a local needs read=")
            else:
                value = read(src)
        everything = dims is True or (type(dims) is str and dims == "all")
        if src in per_source:
            _, known = per_source[src]
            if known is None or everything:
                per_source[src] = (value, None)
            else:
                known.extend(d for d in _dims(dims) if d not in known)
        else:
            per_source[src] = (value, None if everything else list(dict.fromkeys(_dims(dims))))
    out: list[str] = []
    seen: dict[int, Source] = {}
    for base, (value, dim_list) in per_source.items():
        shape = _shape_of(value)
        if shape is None:
            raise GuardBuildError(f"dynamic names {base}, which has no shape (a {type(value).__name__})")
        for d in range(len(shape)) if dim_list is None else dim_list:
            if not 0 <= d < len(shape):
                raise GuardBuildError(f"{base} has no dimension {d} (its rank is {len(shape)})")
            src = base.step(_core.StepKind.SIZE, d)
            n = int(shape[d])
            if specialize_zero_one and n in (0, 1):
                out.append(f"{src} == {n}")
            elif duck and n in seen:
                out.append(f"{src} == {seen[n]}")
            else:
                seen.setdefault(n, src)
                out.append(f"{2 if specialize_zero_one else 0} <= {src}")
    return out


def _dims(dims: Any) -> list[int]:
    if isinstance(dims, int):
        return [dims]
    if not isinstance(dims, Iterable):
        raise TypeError("dynamic dimensions are an int, an iterable of ints, 'all' or True")
    out = []
    for d in dims:
        if type(d) is not int:
            raise TypeError(f"a dimension is an int, not {d!r}")
        out.append(d)
    return out


def _shape_of(value: Any) -> tuple | None:
    """The sizes of a tensor or array, read as the SIZE step reads them (``v.shape`` for a numpy
    array, ``v.size()`` otherwise); None when it has none."""
    try:
        if any(f"{t.__module__}.{t.__name__}" == "numpy.ndarray" for t in type(value).__mro__):
            sizes = value.shape
        else:
            size = getattr(value, "size", None)
            if not callable(size):
                return None
            sizes = size()
        t = tuple(sizes)
    except Exception:  # noqa: BLE001 - not a tensor or array
        return None
    return t if all(type(n) is int for n in t) else None
