"""Torch leaf guards on Python values -> tripwire guard kinds: one ``leaf_*`` method per leaf kind
(``_rules.LEAF_RULES`` maps the kinds to them), each reading torch's printed parameters, checking
them against torch's own leaf object where they could be misread, and emitting the tripwire kind
that decides exactly as torch does; else it raises :class:`_Fallback` with why not. The tensor
and torch-state leaves are ``_torch_leaves``'s."""

from __future__ import annotations

import ast
import collections
import sys
import types
from collections.abc import Callable
from typing import Any

import tripwire._core as _core

from ..catalogue import GuardKind
from ..source import StepKind
from ._convert import ConverterBase, _Fallback, _Node
from ._printed import call_args, has_nan, has_zero, id_in, literal, n_from_len, parse, rhs_literal

_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_DICT_LEN_TYPES = (dict, collections.OrderedDict, collections.defaultdict)  # len() is dict's own


def _identity_constant(code: str, leaf: Any) -> Any:
    """The constant of torch's ``X == a.b.c`` when torch's EQUALS_MATCH on it is ``v is c``.

    torch's check is ``v is c or (type(v) is type(c) and v == c)``. For an instance of an
    immutable type (no class attribute can be assigned later) that inherits object's ``==``
    (``torch.dtype``, ``torch.layout``, ``torch.memory_format``), ``v == c`` of the same type is
    ``v is c``. The printed name is resolved through the module dicts of ``sys.modules`` only (no
    getattr, nothing runs), and torch's own leaf must accept the object found: by identity
    equality, that is torch's constant itself."""
    tree = parse(code)
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)):
        raise ValueError(f"not a comparison: {code}")
    names: list[str] = []
    rhs = tree.comparators[0]
    while isinstance(rhs, ast.Attribute):
        names.append(rhs.attr)
        rhs = rhs.value
    if not isinstance(rhs, ast.Name) or not names:
        raise _Fallback("the printed constant is neither a literal nor a module attribute")
    obj: Any = sys.modules.get(rhs.id)
    for name in reversed(names):
        if type(obj) is not types.ModuleType:
            raise _Fallback(f"the printed constant's {rhs.id!r} is not a loaded module")
        obj = vars(obj).get(name, _MISSING)
        if obj is _MISSING:
            raise _Fallback(f"the printed constant's {name!r} is not in its module's dict")
    t = type(obj)
    if not (type(t) is type and t.__flags__ & _IMMUTABLETYPE and t.__eq__ is _OBJECT_EQ):
        raise _Fallback(f"a {t.__name__} constant (its == is not identity on an immutable type)")
    if leaf(obj) is not True:
        raise _Fallback("the object the printed name resolves to does not pass torch's own guard")
    return obj


_MISSING = object()
_OBJECT_EQ: Any = object.__eq__
_IMMUTABLETYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: a static or immutable type, no attribute assignment


def _simple_rule(kind: GuardKind) -> Callable[..., tuple[list[int], str]]:
    """A leaf guard with no parameters that is the tripwire kind of the same meaning."""

    def rule(self: LeafRules, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        return [self.spec(kind, self._src(node), (), site)], ""

    return rule


# The `why` of an imported EQUALS_MATCH whose constant holds a float zero.
_SIGNED_ZERO = (
    "stricter: 0.0 and -0.0 are two values (torch's == matches them, though code specialised for "
    "one can tell the sign: 1 / (x * s), copysign, repr)"
)


def _looser_example(c: Any) -> Any:
    """A value torch's Python == accepts for c that tripwire's type-exact EQUALS does not."""

    def loosen(x: Any) -> Any:
        if type(x) is int:
            return float(x)
        if type(x) is tuple:
            return tuple(loosen(e) for e in x)
        if type(x) is list:
            return [loosen(e) for e in x]
        return x

    return loosen(c)


class LeafRules(ConverterBase):
    """The leaf rules of the converter for Python values (leaf guard -> guard kind)."""

    def leaf_type_match(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        t = self.ids.get(id_in(code, ("___check_type_id",), node.torch.source))
        if not isinstance(t, type):
            raise _Fallback("torch's expected type is not reachable (no live object for its id)")
        return [self.spec(GuardKind.TYPE_MATCH, self._src(node), (t,), site)], ""

    def leaf_id_match(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        i = id_in(code, ("___check_obj_id", "__check_obj_id"), node.torch.source)
        if i not in self.ids:
            raise _Fallback(
                "torch's object is not reachable (not weakly referenceable, so torch keeps no record of it)"
            )
        return [self.spec(GuardKind.ID_MATCH, self._src(node), (self.ids[i],), site)], ""

    leaf_none = _simple_rule(GuardKind.NONE)
    leaf_not_none = _simple_rule(GuardKind.NOT_NONE)
    leaf_true = _simple_rule(GuardKind.TRUE)
    leaf_false = _simple_rule(GuardKind.FALSE)

    def leaf_equals(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        src = self._src(node)
        try:
            c = rhs_literal(code)
        except ValueError:
            # `X == torch.bool`: a constant printed by name. Where its == is identity, torch's
            # guard is `v is c`, which is tripwire's ID_MATCH.
            return [self.spec(GuardKind.ID_MATCH, src, (_identity_constant(code, leaf),), site)], ""
        # The parsed constant must be one torch's own guard accepts (type-exact and ==).
        if leaf(c) is not True:
            raise _Fallback(f"the printed constant {c!r} does not pass torch's own guard")
        if type(c) in _SCALARS and not has_nan(c) and type(c) is not bool:
            # torch: v is c or (type(v) is type(c) and v == c). For these exact builtin types ==
            # is value equality, so this is tripwire's EQUALS_MATCH (also type-exact; stricter on
            # a float zero, whose sign it compares). A parsed
            # string is interned: the values it meets are often the interned literal itself, and
            # identity is the comparison's fast path (torch holds the example's own object).
            if type(c) is str:
                c = sys.intern(c)
            return [self.spec(GuardKind.EQUALS_MATCH, src, (c,), site)], _SIGNED_ZERO if has_zero(c) else ""
        if type(c) in (tuple, list, set, frozenset, dict) and not has_nan(c) and _core.is_constant(c):
            # A float zero inside: Python's == would match its other sign, so the type-exact form.
            zero = has_zero(c)
            if zero or self.equals == "strict":
                return [self.spec(GuardKind.EQUALS_MATCH, src, (c,), site)], (
                    _SIGNED_ZERO
                    if zero
                    else "stricter (equals='strict'): tripwire compares the elements type-exactly, torch "
                    f"with Python == (torch also accepts e.g. {_looser_example(c)!r})"
                )
            # torch: v is c or (type(v) is type(c) and v == c), Python's == on the elements
            # (True == 1, an element's own __eq__). EQUALS_MATCH with python_eq is exactly that,
            # decided without user code where the interpreter's comparisons decide it. A parsed
            # NaN is excluded above: torch's held NaN object equals itself by identity, ours is
            # another object.
            return [self.spec(GuardKind.EQUALS_MATCH, src, (c, True), site)], ""
        raise _Fallback(f"a {type(c).__name__} constant")

    def leaf_float_is_nan(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        # torch: type(v) is float and isnan(v); tripwire's EQUALS_MATCH(nan) is exactly that.
        return [self.spec(GuardKind.EQUALS_MATCH, self._src(node), (float("nan"),), site)], ""

    def leaf_length(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        n = n_from_len(code)
        t = node.exact_type
        # torch: PySequence_Length(v) == n (sq_length only). tripwire's LENGTH reads list/tuple
        # sizes and otherwise calls len(), which tries sq_length first: the same for sequences.
        if t is None or not issubclass(t, (list, tuple)):
            raise _Fallback(
                "torch's PySequence_Length differs from len() on values that are not known lists/tuples"
            )
        return [self.spec(GuardKind.LENGTH, self._src(node), (n,), site)], ""

    def leaf_dict_length(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        n = n_from_len(code)
        src = self._src(node)
        if n == 0:
            # torch: isinstance(v, dict) and PyDict_Size(v) == 0; DICT_KEYS(()) reads the storage.
            return [self.spec(GuardKind.DICT_KEYS, src, ((), True), site)], ""
        if node.exact_type in _DICT_LEN_TYPES:
            return [self.spec(GuardKind.LENGTH, src, (n,), site)], ""
        t = node.torch.example_type
        if t in _DICT_LEN_TYPES:
            # No TYPE_MATCH above (a functools.partial's keywords, a hook dict): pin the type the
            # value had at compile time, whose len() is the storage size torch reads. A value of
            # another dict type with that size fails here and passes torch: stricter, never laxer.
            return [
                self.spec(GuardKind.TYPE_MATCH, src, (t,), site),
                self.spec(GuardKind.LENGTH, src, (n,), site),
            ], (f"stricter: also requires type {t.__name__} (torch accepts any dict of that size)")
        raise _Fallback("torch reads the dict's storage size; len() may call an overridden __len__")

    def leaf_dict_contains(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        tree = parse(code)
        present = not (isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not))
        args = call_args(code, ("___dict_contains",))
        key = literal(args[0])
        # Check the parsed key and sense against torch's own guard.
        if leaf({key: None}) is not present or leaf({}) is present:
            raise _Fallback("the printed key does not reproduce torch's guard")
        src = self._src(node)
        if not present and not node.is_dict:
            raise _Fallback("torch's 'not in' passes any non-dict; tripwire's DICT_CONTAINS fails it")
        out = [self.spec(GuardKind.DICT_CONTAINS, src, (key, present), site)]
        if not present and type(key) is str and node.torch.accessor == "GetGenericDictGuardAccessor":
            x = self.nodes.get(id(node.torch.parent))
            if x is not None:
                self.type_lookup(x, key)
        return out, ""

    def class_dict_item(self, node: _Node) -> None:
        """A node Dynamo reached as ``dict(type(X).__mro__[k].__dict__)[name]`` (a class
        attribute it read, such as a property): Dynamo guards that entry, not the name's absence
        from the classes before ``k``, so a subclass shadowing it passed torch's guards. The same
        guards as :meth:`type_lookup`."""
        steps = [] if node.src is None else node.src.steps
        kinds = [s.kind for s in steps[-5:]]
        if kinds != [StepKind.TYPE, StepKind.TYPE_MRO, StepKind.ITEM, StepKind.TYPE_DICT, StepKind.DICT_ITEM]:
            return
        if type(steps[-1].arg) is not str:
            return
        tn = node.torch
        for _ in range(5):  # the DICT_ITEM node's torch ancestors up to X
            if tn.parent is None:
                return
            tn = tn.parent
        x = self.nodes.get(id(tn))
        if x is not None:
            self.type_lookup(x, steps[-1].arg)

    def type_lookup(self, parent: _Node, name: str) -> None:
        """Guard what ``X.name`` resolves to through ``type(X)``'s MRO (``parent`` is X's node),
        where Dynamo guarded only that ``name`` is not in ``X.__dict__``, or only the entry of
        the class that defined it. Dynamo inlines what it found on the class (a method's body, a
        class attribute's value, a property's getter) but guards the class dicts only where it
        read a value it specialised on: a method replaced on the class it came from, or the name
        shadowed on a class earlier in the MRO, passed torch's guards and ran stale code. Added
        here: the name absent from each class before the one that defines it, and that class's
        value (EQUALS_MATCH for a constant, ID_MATCH otherwise); absent from all of them if none
        does. Once per (type, name): the class dicts are shared by every object of the type, and
        each object's TYPE_MATCH pins it to that type. Stricter than torch, never laxer."""
        t = parent.exact_type
        if parent.src is None or not isinstance(t, type):
            return
        if (id(t), name) in self._type_lookups:
            return
        self._type_lookups.add((id(t), name))
        # Read from the type objects themselves (tp_mro, tp_dict): no metaclass code runs.
        mro_of, class_dict_of = type.__dict__["__mro__"].__get__, type.__dict__["__dict__"].__get__
        mro = mro_of(t)
        why = (
            f"Dynamo resolved .{name} through {t.__qualname__}'s MRO without guarding the lookup; "
            "a method or attribute replaced on the class it came from, or shadowed on a class "
            "before it, now fails"
        )
        # type(X).__mro__[0] is type(X) itself unless a metaclass's own mro() says otherwise; its
        # dict is then read without the MRO steps (the common case: a module's own forward).
        own_first = mro[0] is t and not any(
            "mro" in class_dict_of(m) for m in mro_of(type(t)) if m is not type
        )
        for i, cls in enumerate(mro):
            ns = class_dict_of(cls)
            if i == 0 and own_first:
                class_dict = parent.src.type().type_dict()
            else:
                class_dict = parent.src.type().type_mro().item(i).type_dict()
            if name not in ns:
                self.add_precondition(parent.src, GuardKind.DICT_CONTAINS, class_dict, (name, False), why)
                continue
            value = ns[name]
            kind = (
                GuardKind.EQUALS_MATCH
                if _core.is_constant(value) and not has_nan(value)
                else GuardKind.ID_MATCH
            )
            self.add_precondition(parent.src, kind, class_dict.dict_item(name), (value,), why)
            return

    def leaf_no_hasattr(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        _, name_expr = call_args(code, ("hasattr",))
        name = literal(name_expr)
        if type(name) is not str or not isinstance(parse(code), ast.UnaryOp):
            raise ValueError(code)
        # Check the parsed name and sense against torch's own guard.
        if (
            leaf(types.SimpleNamespace()) is not True
            or leaf(types.SimpleNamespace(**{name: None})) is not False
        ):
            raise _Fallback("the printed name does not reproduce torch's guard")
        # torch: not PyObject_HasAttr(v, name), which counts any exception as absent (the guard
        # passes); tripwire's HASATTR counts only AttributeError as absent and fails the guard on
        # any other exception a __getattr__ raises: stricter there, the same everywhere else.
        return [self.spec(GuardKind.HASATTR, self._src(node), (name, False), site)], (
            "stricter: an exception other than AttributeError from the lookup fails "
            "(torch's PyObject_HasAttr counts it as absent)"
        )

    def leaf_set_contains(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        # torch prints "set.__contains__(<ref>, <item!r>)", negated for SET_NOT_CONTAINS; its leaf
        # is PySet_Contains on any set or frozenset, subclasses included.
        tree = parse(code)
        present = not (isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not))
        call = tree.operand if isinstance(tree, ast.UnaryOp) else tree
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "__contains__"
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "set"
            and len(call.args) == 2
            and not call.keywords
        ):
            raise ValueError(f"not a call of set.__contains__: {code}")
        item = literal(call.args[1])
        try:
            hash(item)
        except TypeError:
            raise _Fallback("the printed item is unhashable") from None
        # Check the parsed item and sense against torch's own guard.
        if leaf({item}) is not present or leaf(frozenset((item,))) is not present or leaf(set()) is present:
            raise _Fallback("the printed item does not reproduce torch's guard")
        t = node.exact_type
        if not present and not (isinstance(t, type) and issubclass(t, (set, frozenset))):
            raise _Fallback("torch's 'not in' passes any non-set; tripwire's SET_CONTAINS fails it")
        return [self.spec(GuardKind.SET_CONTAINS, self._src(node), (item, present), site)], ""

    def leaf_dict_version(self, node: _Node, leaf: Any, code: str, site: str | None) -> tuple[list[int], str]:
        if sys.version_info >= (3, 12):
            raise _Fallback("torch's dict versions on 3.12+ come from its own watcher")
        if node.torch.example_type is not dict:
            raise _Fallback("tripwire's DICT_VERSION needs an exact dict")
        tag = rhs_literal(code)
        if type(tag) is not int:
            raise ValueError(code)
        # 3.11: both read ma_version_tag (PEP 509, a global counter): equal tags, same dict, unchanged.
        return [self.spec(GuardKind.DICT_VERSION, self._src(node), (tag,), site)], ""

    def leaf_tuple_iterator_len(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        n = rhs_literal(code)
        if type(n) is not int:
            raise ValueError(code)
        return [self.spec(GuardKind.TUPLE_ITERATOR_LEN, self._src(node), (n,), site)], ""

    def leaf_range_iterator(
        self, node: _Node, leaf: Any, code: str, site: str | None
    ) -> tuple[list[int], str]:
        start, stop, step = rhs_literal(code)
        if len(range(start, stop, step)) < 2:
            # torch compares (start, stop, step) of the rest literally; range equality (tripwire)
            # ignores them for 0 or 1 items left.
            raise _Fallback("torch compares start/stop/step even with fewer than 2 items left")
        return [self.spec(GuardKind.RANGE_ITERATOR, self._src(node), (start, stop, step), site)], ""
