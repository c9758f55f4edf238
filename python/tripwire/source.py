"""Sources: where a guarded value comes from, printed and parsed exactly as Dynamo prints them.

A :class:`Source` is a root (``L['x']`` a local or argument, ``G['name']`` a global read from the
globals dict given at build time, ``C['name']`` a closure cell given at build time) followed by
steps. Each step kind has one printed form; :func:`Source.parse` accepts exactly those forms.

=================  ==========================================  =================================
step               printed                                     meaning
=================  ==========================================  =================================
ATTR(name)         ``X.name``                                  ``getattr(X, name)``
ITEM(key)          ``X['k']`` / ``X[0]``                        ``X[key]`` (operator.getitem)
DICT_ITEM(key)     ``dict.__getitem__(X, 'k')``                 dict lookup that never calls an
                                                               overridden ``__getitem__`` and
                                                               never ``__missing__``
TYPE               ``type(X)``                                  ``type(X)``
DICT               ``X.__dict__``                               the instance dict (not for types)
TYPE_DICT          ``dict(X.__dict__)``                         the namespace dict of class X
                                                               itself (tp_dict; no lookup, so no
                                                               metaclass code); missing when X
                                                               is not a type
TYPE_MRO           ``X.__mro__``                                class X's MRO tuple (tp_mro, read
                                                               from the type); missing when X is
                                                               not a type
DEFAULTS(i)        ``X.__defaults__[i]``                        positional default i
KWDEFAULTS(k)      ``X.__kwdefaults__['k']``                    keyword-only default k
CODE               ``X.__code__``                               the function's code object
CLOSURE_CELL(i)    ``X.__closure__[i].cell_contents``           contents of closure cell i
WEAKREF_CALL       ``X()``                                      the referent of weakref X (a
                                                               ref subclass's __call__, e.g.
                                                               WeakMethod's, is not run)
DICT_KEY(i)        ``list(dict.keys(X))[i]``                    key at insertion position i
DICT_VALUE(i)      ``X[list(dict.keys(X))[i]]``                 value at insertion position i
SIZE(i)            ``X.size()[i]``                             size i of a tensor (``X.shape[i]``
                                                               for a numpy array); also parsed
                                                               from ``X.size(i)``
STRIDE(i)          ``X.stride()[i]``                           stride i of a tensor (numpy:
                                                               ``X.strides[i]``, in bytes); also
                                                               parsed from ``X.stride(i)``
STORAGE_OFFSET     ``X.storage_offset()``                      a tensor's storage offset (numpy
                                                               arrays have none: missing)
TENSOR_SIZE(i),    ``X.size()[i]``, ``X.stride()[i]``,          torch's TensorPropertyGuardAccessor
TENSOR_STRIDE(i),  ``X.storage_offset()``                      and GradGuardAccessor: the C++
TENSOR_STORAGE_    (printed as torch prints them; not          tensor's field through the torch
OFFSET, GRAD       parsed: ``Source.tensor_size(i)``, ...)    adapter, ``X.grad`` for GRAD
=================  ==========================================  =================================

In shape relations (``GuardBuilder.shape``), ``X.shape[i]`` is read as ``X.size()[i]`` too
(``Source.parse(text, shape_is_size=True)``), since torch prints either.
"""

from __future__ import annotations

import ast
import functools
import keyword
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, cast

import tripwire._core as _core

__all__ = ["RootKind", "Source", "SourceLike", "SourceParseError", "Step", "StepKind"]


class SourceParseError(ValueError):
    """A source string is not one of the printed forms tripwire understands."""


# The engine's own enums (cpp/core/ir.hpp, bound by cpp/bindings/bind_ir.cpp): one definition.
# RootKind: LOCAL (L['x'], the f_locals mapping passed to check()), GLOBAL (G['x'], the globals
# dict given at build time), CLOSURE (C['x'], a closure cell given at build time, read live).
RootKind = _core.RootKind
StepKind = _core.StepKind


_ROOT_LETTER = {RootKind.LOCAL: "L", RootKind.GLOBAL: "G", RootKind.CLOSURE: "C"}
_LETTER_ROOT = {v: k for k, v in _ROOT_LETTER.items()}
# Steps whose argument is an integer position rather than a name or key.
_INDEX_STEPS = (
    StepKind.DEFAULTS,
    StepKind.CLOSURE_CELL,
    StepKind.DICT_KEY,
    StepKind.DICT_VALUE,
    StepKind.SIZE,
    StepKind.STRIDE,
    StepKind.TENSOR_SIZE,
    StepKind.TENSOR_STRIDE,
)
_NO_ARG_STEPS = (
    StepKind.TYPE,
    StepKind.DICT,
    StepKind.CODE,
    StepKind.WEAKREF_CALL,
    StepKind.STORAGE_OFFSET,
    StepKind.TENSOR_STORAGE_OFFSET,
    StepKind.GRAD,
    StepKind.TYPE_DICT,
    StepKind.TYPE_MRO,
)
# torch's TensorPropertyGuardAccessor / GradGuardAccessor, read from the C++ tensor through the
# torch adapter: printed as torch prints their sources, which is also how SIZE / STRIDE /
# STORAGE_OFFSET and the attribute ``grad`` print. ``parse`` reads that text as the Python-level
# steps; build these with ``Source.tensor_size`` etc. (docs/guards.md, "C++ tensor steps").
CPP_TENSOR_STEPS = frozenset(
    {StepKind.TENSOR_SIZE, StepKind.TENSOR_STRIDE, StepKind.TENSOR_STORAGE_OFFSET, StepKind.GRAD}
)
# Methods whose call prints like a tensor property step: ``X.size`` followed by a call prints as
# ``getattr(X, 'size')()`` so that it does not read back as SIZE.
_PROPERTY_METHODS = frozenset({"size", "stride", "storage_offset"})
# Key types accepted in ITEM / DICT_ITEM / KWDEFAULTS steps: literals that round-trip through repr.
_KEY_TYPES = (str, int, bytes, float, bool, type(None))
# Attribute names that print as another step kind (or not as Python at all) as ``X.name``; an ATTR
# step with one of these names prints as ``getattr(X, 'name')`` so that parse(str(s)) == s.
_RESERVED_ATTRS = frozenset(
    {"__dict__", "__code__", "__defaults__", "__kwdefaults__", "__closure__", "__mro__"}
)


def key_identity(arg: Any) -> tuple:
    """What makes two step arguments the same argument: the exact type and the value, and for a
    float also its sign (``0.0 == -0.0``, but a ``__getitem__`` may tell them apart). Step keys
    are finite (Step refuses NaN), so equal values are otherwise interchangeable."""
    if type(arg) is float:
        return (float, arg, math.copysign(1.0, arg))
    return (type(arg), arg)


@dataclass(frozen=True, eq=False)
class Step:
    """One step of a source path: ``kind`` and its argument (a name, key or position).

    Two steps are equal when kind, the argument's exact type and the argument are equal: ``X[1]``,
    ``X[True]`` and ``X[1.0]`` are different sources (a custom ``__getitem__`` may tell them apart).
    """

    kind: StepKind
    arg: Any = None

    def __post_init__(self) -> None:
        kind = StepKind(self.kind)
        object.__setattr__(self, "kind", kind)
        if kind in _NO_ARG_STEPS:
            if self.arg is not None:
                raise ValueError(f"step {kind.name} takes no argument")
        elif kind in _INDEX_STEPS:
            if type(self.arg) is not int or self.arg < 0:
                raise ValueError(f"step {kind.name} needs a non-negative int position")
        elif kind is StepKind.ATTR:
            if type(self.arg) is not str or not self.arg:
                raise ValueError("ATTR step needs a non-empty attribute name")
        elif kind is StepKind.KWDEFAULTS:
            if type(self.arg) is not str:
                raise ValueError("KWDEFAULTS step needs a str name")
        else:  # ITEM, DICT_ITEM
            if type(self.arg) not in _KEY_TYPES:
                raise ValueError(
                    f"{kind.name} key must be one of str, int, bytes, float, bool, None; "
                    f"got {type(self.arg).__name__}"
                )
            if type(self.arg) is float and not math.isfinite(self.arg):
                raise ValueError(f"{kind.name} key must be a finite float (its repr must parse back)")

    def __eq__(self, other: object) -> bool:
        if type(other) is not Step:
            return NotImplemented
        return self.kind is other.kind and key_identity(self.arg) == key_identity(other.arg)

    def __hash__(self) -> int:
        return hash((self.kind, key_identity(self.arg)))

    @property
    def has_operand(self) -> bool:
        """Whether the argument is an object the engine compares with (a name or a key), rather
        than a position (``index``) or nothing."""
        return self.kind not in _INDEX_STEPS and self.kind not in _NO_ARG_STEPS

    @property
    def index(self) -> int:
        """The position of a positional step (DEFAULTS, CLOSURE_CELL, DICT_KEY, DICT_VALUE), else 0."""
        return self.arg if self.kind in _INDEX_STEPS else 0

    def render(self, base: str) -> str:
        """Print this step applied to the printed base source ``base``."""
        k, a = self.kind, self.arg
        if k is StepKind.ATTR:
            # The parser NFKC-normalises identifiers (``X.𝕊`` reads attribute 'S'): such names,
            # keywords and step dunders print through getattr() to parse back to themselves.
            plain = (
                a.isidentifier()
                and not keyword.iskeyword(a)
                and a not in _RESERVED_ATTRS
                and unicodedata.normalize("NFKC", a) == a
            )
            return f"{base}.{a}" if plain else f"getattr({base}, {a!r})"
        if k is StepKind.ITEM:
            return f"{base}[{a!r}]"
        if k is StepKind.DICT_ITEM:
            return f"dict.__getitem__({base}, {a!r})"
        if k is StepKind.TYPE:
            return f"type({base})"
        if k is StepKind.DICT:
            return f"{base}.__dict__"
        if k is StepKind.DEFAULTS:
            return f"{base}.__defaults__[{a}]"
        if k is StepKind.KWDEFAULTS:
            return f"{base}.__kwdefaults__[{a!r}]"
        if k is StepKind.CODE:
            return f"{base}.__code__"
        if k is StepKind.CLOSURE_CELL:
            return f"{base}.__closure__[{a}].cell_contents"
        if k is StepKind.WEAKREF_CALL:
            return f"{base}()"
        if k is StepKind.DICT_KEY:
            return f"list(dict.keys({base}))[{a}]"
        if k is StepKind.SIZE:
            return f"{base}.size()[{a}]"
        if k is StepKind.STRIDE:
            return f"{base}.stride()[{a}]"
        if k is StepKind.STORAGE_OFFSET or k is StepKind.TENSOR_STORAGE_OFFSET:
            return f"{base}.storage_offset()"
        if k is StepKind.TENSOR_SIZE:
            return f"{base}.size()[{a}]"
        if k is StepKind.TENSOR_STRIDE:
            return f"{base}.stride()[{a}]"
        if k is StepKind.GRAD:
            return f"{base}.grad"
        # As torch prints TypeDictSource / TypeMROSource.
        if k is StepKind.TYPE_DICT:
            return f"dict({base}.__dict__)"
        if k is StepKind.TYPE_MRO:
            return f"{base}.__mro__"
        return f"{base}[list(dict.keys({base}))[{a}]]"  # DICT_VALUE


@dataclass(frozen=True)
class Source:
    """A root plus steps. Hashable; ``str(source)`` is the Dynamo-style printed form."""

    root: RootKind
    name: str
    steps: tuple[Step, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", RootKind(self.root))
        object.__setattr__(self, "steps", tuple(self.steps))
        if type(self.name) is not str:
            raise ValueError("root name must be a str")

    def __hash__(self) -> int:
        # Computed once: sources key the builder's and the encoder's tables.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.root, self.name, self.steps))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, Any]:
        # The fields only: the cached hash is seeded per process (str and enum hashes), so a
        # pickled one would be wrong in the process that loads it; the cached print is dropped
        # with it and recomputed on first use.
        return {"root": self.root, "name": self.name, "steps": self.steps}

    # -- construction -------------------------------------------------------------------------
    @staticmethod
    def local(name: str) -> Source:
        return Source(RootKind.LOCAL, name)

    @staticmethod
    def global_(name: str) -> Source:
        return Source(RootKind.GLOBAL, name)

    @staticmethod
    def closure(name: str) -> Source:
        return Source(RootKind.CLOSURE, name)

    def step(self, kind: StepKind, arg: Any = None) -> Source:
        """This source extended by one step."""
        return Source(self.root, self.name, (*self.steps, Step(kind, arg)))

    def attr(self, name: str) -> Source:
        return self.step(StepKind.ATTR, name)

    def item(self, key: Any) -> Source:
        return self.step(StepKind.ITEM, key)

    def dict_item(self, key: Any) -> Source:
        return self.step(StepKind.DICT_ITEM, key)

    def type(self) -> Source:
        return self.step(StepKind.TYPE)

    def type_dict(self) -> Source:
        """torch's ``TypeDictSource``: the namespace dict of the class this source holds (TYPE_DICT;
        prints ``dict(X.__dict__)``)."""
        return self.step(StepKind.TYPE_DICT)

    def type_mro(self) -> Source:
        """torch's ``TypeMROSource``: the MRO tuple of the class this source holds (TYPE_MRO;
        prints ``X.__mro__``)."""
        return self.step(StepKind.TYPE_MRO)

    def tensor_size(self, dim: int) -> Source:
        """torch's ``TensorPropertySource(SIZE, dim)``: the C++ ``sym_size(dim)`` of a tensor
        (TENSOR_SIZE; prints ``X.size()[dim]``)."""
        return self.step(StepKind.TENSOR_SIZE, dim)

    def tensor_stride(self, dim: int) -> Source:
        """torch's ``TensorPropertySource(STRIDE, dim)``: the C++ ``sym_stride(dim)`` (TENSOR_STRIDE)."""
        return self.step(StepKind.TENSOR_STRIDE, dim)

    def tensor_storage_offset(self) -> Source:
        """torch's ``TensorPropertySource(STORAGE_OFFSET)``: the C++ ``sym_storage_offset()``."""
        return self.step(StepKind.TENSOR_STORAGE_OFFSET)

    def grad(self) -> Source:
        """torch's ``GradSource``: the C++ ``grad()`` field of a tensor (GRAD; prints ``X.grad``)."""
        return self.step(StepKind.GRAD)

    @property
    def reads_cpp_tensor(self) -> bool:
        """Whether a step reads the C++ tensor through the torch adapter (TENSOR_SIZE, ...)."""
        return any(s.kind in CPP_TENSOR_STEPS for s in self.steps)

    @property
    def parent(self) -> Source | None:
        """The source one step shorter, or None for a root."""
        if not self.steps:
            return None
        return Source(self.root, self.name, self.steps[:-1])

    def prefixes(self) -> list[Source]:
        """The root and every longer prefix, ending with this source."""
        return [Source(self.root, self.name, self.steps[:i]) for i in range(len(self.steps) + 1)]

    def printed_prefixes(self) -> list[str]:
        """``[str(p) for p in self.prefixes()]``, without making the prefixes."""
        # Computed once per object, like the print: the encoder's recipe and the reader facts
        # of a SHAPE symbol both ask for them.
        texts = self.__dict__.get("_prefixes")
        if texts is None:
            texts = self._print_prefixes()
            object.__setattr__(self, "_prefixes", texts)
        return list(texts)

    def _print_prefixes(self) -> tuple[str, ...]:
        base = f"{_ROOT_LETTER[self.root]}[{self.name!r}]"
        texts = [base]
        steps = self.steps
        last = len(steps) - 1
        for i, s in enumerate(steps):
            texts.append(s.render(base))
            # As __str__ prints it: `X.size` followed by a call prints through getattr().
            if (
                i < last
                and s.kind is StepKind.ATTR
                and s.arg in _PROPERTY_METHODS
                and steps[i + 1].kind is StepKind.WEAKREF_CALL
            ):
                base = f"getattr({base}, {s.arg!r})"
            else:
                base = texts[-1]
        return tuple(texts)

    # -- printing and parsing -----------------------------------------------------------------
    def __str__(self) -> str:
        # Computed once per object, like the hash: relations print their symbols per occurrence,
        # and explain() and failure reasons print them again.
        text = self.__dict__.get("_text")
        if text is None:
            text = self._print()
            object.__setattr__(self, "_text", text)
        return text

    def _print(self) -> str:
        text = f"{_ROOT_LETTER[self.root]}[{self.name!r}]"
        for i, s in enumerate(self.steps):
            if (
                s.kind is StepKind.ATTR
                and s.arg in _PROPERTY_METHODS
                and i + 1 < len(self.steps)
                and self.steps[i + 1].kind is StepKind.WEAKREF_CALL
            ):
                # `X.size()` would read back as a tensor property step.
                text = f"getattr({text}, {s.arg!r})"
            else:
                text = s.render(text)
        return text

    def __repr__(self) -> str:
        return f"Source({str(self)!r})"

    @staticmethod
    def parse(text: SourceLike, *, shape_is_size: bool = False) -> Source:
        """Parse a printed source such as ``"L['self'].layers[0].weight"``.

        Raises :class:`SourceParseError` for anything that is not a printed form listed in
        this module's docstring. With ``shape_is_size``, ``X.shape[i]`` is the SIZE step (as in
        shape relations); otherwise it is the attribute ``shape`` and its item ``i``.
        """
        if isinstance(text, Source):
            return text
        if type(text) is not str:
            if not isinstance(text, str):
                raise TypeError(f"a source is a str or Source, not {type(text).__name__}")
            text = str(text)
        return _parse_text(text, shape_is_size)


def clear_memos() -> None:
    """Empty this module's memo of parsed sources (builder.clear_build_memos)."""
    _parse_text.cache_clear()


@functools.lru_cache(maxsize=4096)
def _parse_text(text: str, shape_is_size: bool) -> Source:
    """Source.parse of an exact str, memoised (a Source is immutable; errors are not cached)."""
    fast = _parse_plain(text, shape_is_size)
    if fast is not None:
        return fast
    return _parse_ast(text, shape_is_size)


# The plain printed forms (what torch prints for shape symbols, and most guard sources), read
# without Python's compiler (whose AST builder is not re-entrant: a finalizer that parses a source
# in the middle of ast.parse makes the outer call raise SystemError on 3.11, test_reentrancy.py): a root ``L['x']`` / ``G['x']`` / ``C['x']`` with a printable-ASCII
# name, then steps ``.name`` (an ASCII identifier that is neither a keyword nor a dunder),
# ``['key']`` (printable ASCII), ``[i]``, ``.size()[i]``, ``.stride()[i]``, ``.size(i)``,
# ``.stride(i)``, ``.storage_offset()`` and, in shape relations, ``.shape[i]`` (``i``: decimal,
# no sign, at most 18 digits). Anything else (blanks inside, other quotes, escapes, calls,
# dunders) goes to _parse_ast; tests/python/sources/test_source.py checks both give the same Source.
_KEY = r"'([ -&(-\[\]-~]*)'"
_INT = r"(0|[1-9][0-9]{0,17})"
_PLAIN_ROOT = re.compile(rf"([LGC])\[{_KEY}\]")
_PLAIN_STEP = re.compile(
    rf"\.(?:(size|stride)\(\)\[{_INT}\]|(size|stride)\({_INT}\)|(storage_offset)\(\)"
    rf"|(shape)\[{_INT}\]|([A-Za-z_][A-Za-z0-9_]*))|\[(?:{_KEY}|{_INT})\]"
)
_PROPERTY_STEP = {"size": StepKind.SIZE, "stride": StepKind.STRIDE}


def _plain_step(kind: StepKind, arg: Any) -> Step:
    # The arguments were checked by the grammar above (what Step.__post_init__ checks).
    st = object.__new__(Step)
    d = st.__dict__  # the frozen dataclass's fields, written as its __init__ would leave them
    d["kind"] = kind
    d["arg"] = arg
    return st


def _parse_plain(text: str, shape_is_size: bool) -> Source | None:
    """Source.parse of a plain printed form (above), or None for any other text."""
    text = text.strip()
    m = _PLAIN_ROOT.match(text)
    if m is None:
        return None
    steps: list[Step] = []
    pos = m.end()
    end = len(text)
    match = _PLAIN_STEP.match
    as_printed = True  # the text is what __str__ prints: no `.size(i)`, `.stride(i)`, `.shape[i]`
    while pos < end:
        s = match(text, pos)
        if s is None:
            return None
        pos = s.end()
        prop, prop_i, call, call_i, offset, shape, shape_i, attr, key, item = s.groups()
        if prop is not None:
            steps.append(_plain_step(_PROPERTY_STEP[prop], int(prop_i)))
        elif call is not None:
            as_printed = False
            steps.append(_plain_step(_PROPERTY_STEP[call], int(call_i)))
        elif offset is not None:
            steps.append(_plain_step(StepKind.STORAGE_OFFSET, None))
        elif shape is not None:
            as_printed = False
            if shape_is_size:
                steps.append(_plain_step(StepKind.SIZE, int(shape_i)))
            else:
                steps += (_plain_step(StepKind.ATTR, "shape"), _plain_step(StepKind.ITEM, int(shape_i)))
        elif attr is not None:
            if attr.startswith("__") or keyword.iskeyword(attr):
                return None
            if shape_is_size and attr == "shape" and text.startswith("[", pos):
                return None  # `.shape[k]` with a k other than a position: Python's parser refuses it
            steps.append(_plain_step(StepKind.ATTR, attr))
        else:
            steps.append(_plain_step(StepKind.ITEM, key if key is not None else int(item)))
    src = object.__new__(Source)
    object.__setattr__(src, "root", _LETTER_ROOT[m.group(1)])
    object.__setattr__(src, "name", m.group(2))
    object.__setattr__(src, "steps", tuple(steps))
    if as_printed:
        # Every other plain form prints as written (the grammar admits no quote, backslash or
        # non-ASCII character in a name or key, no leading zero, no dunder, no call after an
        # attribute): __str__'s cache, filled without printing. test_source checks it equals _print.
        object.__setattr__(src, "_text", text)
    return src


def _parse_ast(text: str, shape_is_size: bool) -> Source:
    """Source.parse by Python's parser: every printed form."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise SourceParseError(f"cannot parse source {text!r}: {e.msg}") from None
    except UnicodeEncodeError as e:  # the parser reads UTF-8: a lone surrogate is no source
        raise SourceParseError(f"cannot parse source {text!r}: {e.reason} ({e.object[e.start]!a})") from None
    try:
        return _Parser(text, shape_is_size).node(tree)
    except SourceParseError:
        raise
    except (ValueError, RecursionError) as e:  # a Step/Source rejected a parsed argument
        raise SourceParseError(f"cannot parse source {text!r}: {e}") from None


SourceLike = Source | str


def dict_keys_owner(node: ast.AST) -> ast.AST | None:
    """If node is ``list(dict.keys(B))``, return B."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "list"
        and len(node.args) == 1
        and not node.keywords
    ):
        inner = node.args[0]
        if (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and isinstance(inner.func.value, ast.Name)
            and inner.func.value.id == "dict"
            and inner.func.attr == "keys"
            and len(inner.args) == 1
            and not inner.keywords
        ):
            return inner.args[0]
    return None


class _Parser:
    """Turns the ast of a printed source back into a Source; rejects everything else."""

    def __init__(self, text: str, shape_is_size: bool = False) -> None:
        self.text = text
        self.shape_is_size = shape_is_size

    def fail(self, why: str) -> SourceParseError:
        return SourceParseError(f"cannot parse source {self.text!r}: {why}")

    def const(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) in _KEY_TYPES:
            return node.value
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) in (int, float)
        ):
            return -cast(float, node.operand.value)
        raise self.fail("keys must be str, int, bytes, float, bool or None literals")

    def index(self, node: ast.AST) -> int:
        v = self.const(node)
        if type(v) is not int or v < 0:
            raise self.fail("positions must be non-negative int literals")
        return v

    def node(self, n: ast.AST) -> Source:
        # Roots: L['x'], G['x'], C['x']
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in _LETTER_ROOT:
            if isinstance(n.slice, ast.Name):  # L[x]: the name unquoted
                raise self.fail(f"root names are str literals; did you mean {n.value.id}[{n.slice.id!r}]?")
            name = self.const(n.slice)
            if type(name) is not str:
                raise self.fail("root names are str literals")
            return Source(_LETTER_ROOT[n.value.id], name)
        if isinstance(n, ast.Attribute):
            # X.__closure__[i].cell_contents
            if (
                n.attr == "cell_contents"
                and isinstance(n.value, ast.Subscript)
                and isinstance(n.value.value, ast.Attribute)
                and n.value.value.attr == "__closure__"
            ):
                return self.node(n.value.value.value).step(StepKind.CLOSURE_CELL, self.index(n.value.slice))
            if n.attr == "__dict__":
                return self.node(n.value).step(StepKind.DICT)
            if n.attr == "__code__":
                return self.node(n.value).step(StepKind.CODE)
            if n.attr == "__mro__":
                return self.node(n.value).step(StepKind.TYPE_MRO)
            if n.attr in ("__defaults__", "__kwdefaults__", "__closure__"):
                raise self.fail(f"{n.attr} must be indexed")
            return self.node(n.value).attr(n.attr)
        if isinstance(n, ast.Subscript):
            base = n.value
            # X.size()[i], X.stride()[i]; X.shape[i] in shape relations.
            if (
                isinstance(base, ast.Call)
                and isinstance(base.func, ast.Attribute)
                and base.func.attr in ("size", "stride")
                and not base.args
                and not base.keywords
            ):
                kind = StepKind.SIZE if base.func.attr == "size" else StepKind.STRIDE
                return self.node(base.func.value).step(kind, self.index(n.slice))
            if self.shape_is_size and isinstance(base, ast.Attribute) and base.attr == "shape":
                return self.node(base.value).step(StepKind.SIZE, self.index(n.slice))
            if isinstance(base, ast.Attribute) and base.attr == "__defaults__":
                return self.node(base.value).step(StepKind.DEFAULTS, self.index(n.slice))
            if isinstance(base, ast.Attribute) and base.attr == "__kwdefaults__":
                key = self.const(n.slice)
                if type(key) is not str:
                    raise self.fail("__kwdefaults__ keys are str literals")
                return self.node(base.value).step(StepKind.KWDEFAULTS, key)
            owner = dict_keys_owner(base)
            if owner is not None:  # list(dict.keys(B))[i]
                return self.node(owner).step(StepKind.DICT_KEY, self.index(n.slice))
            if isinstance(n.slice, ast.Subscript):  # B[list(dict.keys(B))[i]]
                owner = dict_keys_owner(n.slice.value)
                if owner is not None:
                    b = self.node(base)
                    if self.node(owner) != b:
                        raise self.fail("dict value position must index the same dict")
                    return b.step(StepKind.DICT_VALUE, self.index(n.slice.slice))
            return self.node(base).item(self.const(n.slice))
        if isinstance(n, ast.Call) and not n.keywords:
            f = n.func
            # X.size(i), X.stride(i), X.storage_offset()
            if isinstance(f, ast.Attribute) and f.attr in ("size", "stride") and len(n.args) == 1:
                kind = StepKind.SIZE if f.attr == "size" else StepKind.STRIDE
                return self.node(f.value).step(kind, self.index(n.args[0]))
            if isinstance(f, ast.Attribute) and f.attr == "storage_offset" and not n.args:
                return self.node(f.value).step(StepKind.STORAGE_OFFSET)
            if isinstance(f, ast.Name) and f.id == "type" and len(n.args) == 1:
                return self.node(n.args[0]).type()
            if (
                isinstance(f, ast.Name)
                and f.id == "dict"
                and len(n.args) == 1
                and isinstance(n.args[0], ast.Attribute)
                and n.args[0].attr == "__dict__"
            ):
                return self.node(n.args[0].value).step(StepKind.TYPE_DICT)
            if isinstance(f, ast.Name) and f.id == "getattr" and len(n.args) == 2:
                name = self.const(n.args[1])
                if type(name) is not str:
                    raise self.fail("getattr names are str literals")
                return self.node(n.args[0]).attr(name)
            if (
                isinstance(f, ast.Attribute)
                and isinstance(f.value, ast.Name)
                and f.value.id == "dict"
                and f.attr == "__getitem__"
                and len(n.args) == 2
            ):
                return self.node(n.args[0]).dict_item(self.const(n.args[1]))
            if not n.args:
                return self.node(f).step(StepKind.WEAKREF_CALL)
        raise self.fail(self.expected(n))

    def expected(self, n: ast.AST) -> str:
        """What was expected instead of ``n``, with a corrected source when one is obvious (a bare
        name as the root: ``x`` -> ``L['x']``, ``self.w`` -> ``L['self'].w``). No AST dump: the
        reader wrote text."""
        text = ast.unparse(n)
        shown = text if len(text) <= 60 else text[:57] + "..."
        why = (
            f"unsupported expression `{shown}`: a source is L['name'], G['name'] or C['name'] "
            "followed by .attr, [key], [index] and the other printed steps (docs/guards.md)"
        )
        whole = self.text.strip()
        if isinstance(n, ast.Name) and n.id not in _LETTER_ROOT and whole.startswith(n.id):
            # The bare name is the whole source's root (the parser recursed to it first).
            why += f"; did you mean L[{n.id!r}]{whole[len(n.id) :]}?"
        return why
