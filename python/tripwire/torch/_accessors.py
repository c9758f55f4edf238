"""Torch accessors -> tripwire source steps: one ``acc_*`` method per accessor kind
(``_rules.ACCESSOR_RULES`` maps the kinds to them), each setting the child node's source or
raising :class:`_Blocked` with why tripwire has no step that reads what torch reads. Where a step
reads exactly what torch reads only for some types, a rule adds a precondition (a TYPE_MATCH torch
does not have: stricter, never laxer) or records how tripwire is stricter."""

from __future__ import annotations

import ast
import math
import re
import types
from typing import Any

from ..catalogue import GuardKind
from ..source import Source, StepKind
from ._convert import ConverterBase, _Blocked, _Node, _type_name
from ._printed import NO_KEY, subscript_key

# TensorPropertyGuardAccessor's property -> the C++ tensor step that reads what torch reads.
_TENSOR_PROPERTY_STEPS = {
    "SIZE": StepKind.TENSOR_SIZE,
    "STRIDE": StepKind.TENSOR_STRIDE,
    "STORAGE_OFFSET": StepKind.TENSOR_STORAGE_OFFSET,
}


def _standard_dict_type(t: type) -> bool:
    """Whether ``X.__dict__`` of an instance of t is the interpreter's instance dict."""
    if issubclass(t, type):
        return False
    for k in t.__mro__:
        d = k.__dict__.get("__dict__")
        if d is not None:
            return type(d).__name__ == "getset_descriptor"
    return False


class AccessorRules(ConverterBase):
    """The accessor rules of the converter (accessor -> source step)."""

    def _need_parent_src(self, parent: _Node, kind: str) -> Source:
        if parent.src is None:
            raise _Blocked(
                "unsupported", f"{kind} under {parent.torch.source}, which has no tripwire source", kind
            )
        return parent.src

    def acc_frame_locals(self, parent: _Node, node: _Node) -> None:
        m = re.match(
            r"FrameLocalsGuardAccessor\(key=(.*), framelocals_idx=-?\d+\)$",
            node.torch.accessor_obj.repr(),
            re.S,
        )
        key = ast.literal_eval(m.group(1)) if m else None
        if type(key) is not str:
            raise _Blocked(
                "unsupported", "a frame local that is not named by a str", "FrameLocalsGuardAccessor"
            )
        node.src = Source.local(key)

    def acc_globals(self, parent: _Node, node: _Node) -> None:
        if self.f_globals is None:
            raise _Blocked("unsupported", "the globals dict of the frame is unknown", "GlobalsGuardAccessor")
        node.is_globals = True
        node.is_dict = True

    def _dict_key(self, node: _Node) -> Any:
        m = re.match(r"DictGetItemGuardAccessor\((.*)\)$", node.torch.accessor_obj.repr(), re.S)
        try:
            key = ast.literal_eval(m.group(1)) if m else None
        except (ValueError, SyntaxError):
            key = None
        if type(key) not in (str, int, bytes, float, bool, type(None)) or (
            type(key) is float and not math.isfinite(key)
        ):
            raise _Blocked(
                "unsupported", "a dict key tripwire's sources cannot name", "DictGetItemGuardAccessor"
            )
        return key

    def acc_dict_getitem(self, parent: _Node, node: _Node) -> None:
        key = self._dict_key(node)
        if parent.is_globals:
            if type(key) is not str:
                raise _Blocked(
                    "unsupported", "a global that is not named by a str", "DictGetItemGuardAccessor"
                )
            node.src = Source.global_(key)
            return
        if parent.role == "kwdefaults" and parent.func_src is not None and type(key) is str:
            node.src = parent.func_src.step(StepKind.KWDEFAULTS, key)
            return
        node.src = self._need_parent_src(parent, "DictGetItemGuardAccessor").dict_item(key)

    def acc_global_weakref(self, parent: _Node, node: _Node) -> None:
        m = re.match(r"GlobalWeakRefGuardAccessor\((.*)\)$", node.torch.accessor_obj.repr(), re.S)
        if not parent.is_globals or not m:
            raise _Blocked(
                "unsupported",
                "a global weak reference outside the globals dict",
                "GlobalWeakRefGuardAccessor",
            )
        node.src = Source.global_(m.group(1)).step(StepKind.WEAKREF_CALL)
        self.stricter.append((node.torch.source, "a weakref.proxy fails (torch follows proxies too)"))

    def acc_getattr(self, parent: _Node, node: _Node) -> None:
        name = node.torch.accessor_obj.get_attr_name()
        if parent.role == "cell" and name == "cell_contents" and parent.func_src is not None:
            node.src = parent.func_src.step(StepKind.CLOSURE_CELL, parent.cell_index)
            return
        node.src = self._need_parent_src(parent, "GetAttrGuardAccessor").attr(name)

    def acc_generic_getattr(self, parent: _Node, node: _Node) -> None:
        m = re.match(r"GenericGetAttrGuardAccessor\((.*)\)$", node.torch.accessor_obj.repr(), re.S)
        t = parent.exact_type
        plain = (
            t is not None
            and getattr(t, "__getattribute__", None) is object.__getattribute__
            and not hasattr(t, "__getattr__")
        )
        if not m or not plain:
            raise _Blocked(
                "unsupported",
                "object.__getattribute__ equals getattr only for a known type without "
                "__getattribute__/__getattr__ overrides",
                "GenericGetAttrGuardAccessor",
            )
        node.src = self._need_parent_src(parent, "GenericGetAttrGuardAccessor").attr(m.group(1))

    def acc_generic_dict(self, parent: _Node, node: _Node) -> None:
        src = self._need_parent_src(parent, "GetGenericDictGuardAccessor")
        node.src = src.step(StepKind.DICT)
        node.is_dict = True
        t = parent.exact_type
        if t is None or not _standard_dict_type(t):
            self.stricter.append(
                (
                    node.torch.source,
                    "tripwire's __dict__ step fails for types, for classes defining their own __dict__ "
                    "and for instance dicts that are dict subclasses (torch reads them)",
                )
            )

    def acc_getitem(self, parent: _Node, node: _Node) -> None:
        src = self._need_parent_src(parent, "GetItemGuardAccessor")
        key = subscript_key(node.torch.source)
        shown = re.match(r"GetItemGuardAccessor\((.*)\)$", node.torch.accessor_obj.repr(), re.S)
        if key is NO_KEY or not shown or shown.group(1) != str(key):
            raise _Blocked(
                "unsupported", "a __getitem__ key tripwire's sources cannot name", "GetItemGuardAccessor"
            )
        if parent.role == "defaults" and parent.func_src is not None and type(key) is int and key >= 0:
            node.src = parent.func_src.step(StepKind.DEFAULTS, key)
            return
        node.src = src.item(key)

    def _seq_item(self, parent: _Node, node: _Node, base: type, kind: str) -> None:
        m = re.match(rf"{kind}\((\d+)\)$", node.torch.accessor_obj.repr())
        if not m:
            raise _Blocked("unsupported", "an index tripwire cannot read", kind)
        i = int(m.group(1))
        if parent.role == "defaults" and parent.func_src is not None:
            node.src = parent.func_src.step(StepKind.DEFAULTS, i)
            return
        if parent.role == "closure" and parent.func_src is not None:
            node.src = self._need_parent_src(parent, kind).item(i)
            node.role, node.func_src, node.cell_index = "cell", parent.func_src, i
            return
        src = self._need_parent_src(parent, kind)
        # torch reads the list/tuple storage of any list/tuple subclass; tripwire's [i] calls
        # type(v).__getitem__. They agree when the type is known and does not override it.
        t = parent.exact_type
        if t is None:
            ex = parent.torch.example_type
            if ex is not base:
                raise _Blocked(
                    "unsupported",
                    f"{kind} on a value of unknown type (torch reads {base.__name__} storage)",
                    kind,
                )
            self.add_precondition(
                src,
                GuardKind.TYPE_MATCH,
                src,
                (base,),
                f"type({src}) is {base.__name__}: {kind} reads {base.__name__} storage, tripwire's [i] "
                f"calls __getitem__ (stricter: torch also accepts {base.__name__} subclasses here)",
            )
        elif not issubclass(t, base) or getattr(t, "__getitem__", None) is not base.__dict__["__getitem__"]:
            raise _Blocked("unsupported", f"{kind} on {_type_name(t)}, which overrides __getitem__", kind)
        elif t is not base:
            self.stricter.append(
                (node.torch.source, f"exact while {_type_name(t)}.__getitem__ stays {base.__name__}'s own")
            )
        node.src = src.item(i)

    def acc_list_getitem(self, parent: _Node, node: _Node) -> None:
        self._seq_item(parent, node, list, "ListGetItemGuardAccessor")

    def acc_tuple_getitem(self, parent: _Node, node: _Node) -> None:
        self._seq_item(parent, node, tuple, "TupleGetItemGuardAccessor")

    def acc_type(self, parent: _Node, node: _Node) -> None:
        node.src = self._need_parent_src(parent, "TypeGuardAccessor").type()

    def acc_type_dict(self, parent: _Node, node: _Node) -> None:
        # TYPE_DICT reads what torch reads, the type's tp_dict (an exact dict: CPython copies a
        # class body's namespace into a new dict). torch casts its value to a type unchecked; on a
        # value that is not a type tripwire's step is missing (the check fails).
        node.src = self._need_parent_src(parent, "TypeDictGuardAccessor").type_dict()
        node.exact_type, node.is_dict = dict, True

    def acc_type_mro(self, parent: _Node, node: _Node) -> None:
        # TYPE_MRO reads tp_mro, always an exact tuple (CPython converts what mro() returns).
        node.src = self._need_parent_src(parent, "TypeMROGuardAccessor").type_mro()
        node.exact_type = tuple

    def acc_tensor_property(self, parent: _Node, node: _Node) -> None:
        kind = "TensorPropertyGuardAccessor"
        src = self._need_parent_src(parent, kind)
        text = node.torch.accessor_obj.repr()
        m = re.match(r"TensorPropertyGuardAccessor<(?:TensorProperty::)?(\w+)>\((-?\d+)\)$", text)
        step = _TENSOR_PROPERTY_STEPS.get(m.group(1)) if m else None
        if m is None or step is None:
            raise _Blocked("unsupported", f"a tensor property tripwire does not know ({text})", kind)
        index = int(m.group(2))
        if step is StepKind.TENSOR_STORAGE_OFFSET:
            node.src = src.tensor_storage_offset()
        elif index < 0:
            raise _Blocked("unsupported", f"a negative dimension ({text})", kind)
        else:
            node.src = src.step(step, index)

    def acc_grad(self, parent: _Node, node: _Node) -> None:
        node.src = self._need_parent_src(parent, "GradGuardAccessor").grad()

    def acc_weakref_call(self, parent: _Node, node: _Node) -> None:
        node.src = self._need_parent_src(parent, "WeakRefCallGuardAccessor").step(StepKind.WEAKREF_CALL)
        self.stricter.append((node.torch.source, "a weakref.proxy fails (torch follows proxies too)"))

    def _function_like(self, parent: _Node, kind: str) -> Source:
        """torch's function accessors unwrap a bound method and then require a function; tripwire's
        steps read attributes of anything. Make the value a function (or a method of one)."""
        src = self._need_parent_src(parent, kind)
        t = parent.exact_type
        if t is types.FunctionType:
            return src
        ex = parent.torch.example_type if t is None else t
        if ex is types.FunctionType:
            self.add_precondition(
                src,
                GuardKind.TYPE_MATCH,
                src,
                (types.FunctionType,),
                f"type({src}) is function: torch's {kind} accepts only functions and bound methods "
                "(stricter: a bound method in place of the function fails)",
            )
            return src
        if ex is types.MethodType:
            if t is None:
                self.add_precondition(
                    src,
                    GuardKind.TYPE_MATCH,
                    src,
                    (types.MethodType,),
                    f"type({src}) is method: torch's {kind} unwraps bound methods (stricter: a plain "
                    "function in place of the method fails)",
                )
            self.add_precondition(
                src,
                GuardKind.TYPE_MATCH,
                src.attr("__func__"),
                (types.FunctionType,),
                f"type({src}.__func__) is function: torch's {kind} requires the method's function",
            )
            return src
        raise _Blocked("unsupported", f"{kind} on a {_type_name(ex)}", kind)

    def acc_code(self, parent: _Node, node: _Node) -> None:
        node.src = self._function_like(parent, "CodeGuardAccessor").step(StepKind.CODE)

    def acc_func_defaults(self, parent: _Node, node: _Node) -> None:
        f = self._function_like(parent, "FuncDefaultsGuardAccessor")
        node.src, node.role, node.func_src = f.attr("__defaults__"), "defaults", f

    def acc_func_kwdefaults(self, parent: _Node, node: _Node) -> None:
        f = self._function_like(parent, "FuncKwDefaultsGuardAccessor")
        node.src, node.role, node.func_src = f.attr("__kwdefaults__"), "kwdefaults", f

    def acc_closure(self, parent: _Node, node: _Node) -> None:
        f = self._function_like(parent, "ClosureGuardAccessor")
        node.src, node.role, node.func_src = f.attr("__closure__"), "closure", f

    def acc_dict_key(self, parent: _Node, node: _Node) -> None:
        node.src = self._need_parent_src(parent, "DictGuardManager").step(StepKind.DICT_KEY, node.torch.index)
        if parent.keys is not None:
            node.covered_by = parent.keys_guard

    def acc_dict_value(self, parent: _Node, node: _Node) -> None:
        src = self._need_parent_src(parent, "DictGuardManager")
        if parent.keys is not None:
            # The keys are checked in order (DICT_KEYS): the value at position i is the value of
            # key i, found by a storage lookup of that exact str/int key.
            node.src = src.dict_item(parent.keys[node.torch.index])
            return
        node.src = src.step(StepKind.DICT_VALUE, node.torch.index)
