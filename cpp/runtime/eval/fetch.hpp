// tripwire/cpp/runtime/eval/fetch.hpp -- evaluating one source step on a live object.
//
// A fetch returns the child value either borrowed (owned by the parent: a dict entry, a list
// slot, an object's type) or as a new reference. The evaluator decides whether a borrowed value
// is safe to use as is (nothing below it can run user code) or must be INCREF'd.
#pragma once

#include <cstdint>

#include <vector>

#include "core/ir.hpp"
#include "runtime/eval/locals.hpp"
#include "runtime/py.hpp"

namespace tripwire::runtime {

/// How a fetch ended.
enum class FetchStatus : std::uint8_t {
    Ok,       ///< value is set
    Missing,  ///< no such attribute/key/position/cell content; no Python error is set
    Error,    ///< a Python exception is set
};

/// Result of a fetch: `value` is borrowed unless `owned`.
struct Fetched {
    PyObject* value = nullptr;
    bool owned = false;
    FetchStatus status = FetchStatus::Missing;
};

/// Inline cache of one attribute step, valid while the type and its version tag are unchanged.
/// It caches *how* to find the attribute (CPython's own LOAD_ATTR specialisation idea), never
/// the value of an instance attribute.
struct AttrCache {
    enum class Mode : std::uint8_t {
        Unset,          ///< not filled yet (or invalidated; or undecidable without user code)
        InstanceDict,   ///< generic getattr, no data descriptor: look in the instance dict first
        Module,         ///< exact module: look in the module dict first
        FunctionField,  ///< exact function, a field its type exposes (`__defaults__`, `__code__`, ...)
        Member,         ///< an object slot a member descriptor serves (`hint` holds its offset)
        DictGetattr,    ///< absence only: a registered class `__getattr__` (`hint` holds its index)
        OwnDict,        ///< `__dict__` served by the interpreter's own getter: the instance dict
        ClassAttr,      ///< an attribute of a class (class_attr_value; `hint`: metatype's tag, 0 for `type`)
        CellContents,   ///< `cell_contents` of an exact cell: its contents
        ObjectClass,    ///< `__class__` through object's own getset: the object's type
        Generic,        ///< anything else: PyObject_GetAttr
    };
    /// The type the cache was filled for; for ClassAttr the class itself (the object read), whose
    /// type is `type`.
    PyTypeObject* type = nullptr;
    unsigned int version = 0;
    Mode mode = Mode::Unset;
    /// Entry index where the name was last found (dict_hint.hpp); also used by Item steps.
    Py_ssize_t hint = -1;
    /// The class of the MRO whose own dict holds the name, and that entry's hint: for ClassAttr,
    /// the class attribute; for InstanceDict, an exact function the name binds when the instance
    /// lacks it (method_function). Null otherwise. Borrowed: the MRO of `type` holds it while the
    /// version tag is unchanged.
    PyTypeObject* owner = nullptr;
    Py_ssize_t owner_hint = -1;
};

/// One step as the evaluator sees it: the core step plus its operand resolved to an object.
struct RuntimeStep {
    core::StepKind kind = core::StepKind::Attr;
    bool int_key = false;         ///< Item with an exact int key that fits a Py_ssize_t (list/tuple slots)
    PyObject* operand = nullptr;  ///< borrowed from the constant pool (interned str for names)
    Py_ssize_t index = 0;         ///< the position; for an Item step with `int_key`, the key's value
    AttrCache cache;
};

/// Set `step.int_key` and `step.index` when an Item step's key is an exact int that fits.
void prepare_int_key(RuntimeStep& step);

/// A source's root as the evaluator reads it, with its per-caller lookup hints.
struct RuntimeRoot {
    core::RootKind kind = core::RootKind::Local;
    PyObject* name = nullptr;  ///< interned str (borrowed)
    PyObject* cell = nullptr;  ///< the closure cell of a C[...] root (borrowed), or null
    Py_ssize_t hint = -1;      ///< dict entry hint for L[...] and G[...] lookups (dict_hint.hpp)
    Py_ssize_t slot = -1;      ///< argument index hint for L[...] read from a bound call
};

/// The root's value: L[...] from `locals` (a dict, incl. subclasses, read from its storage;
/// another mapping through __getitem__, KeyError meaning missing), G[...] from `globals` (a dict
/// or null), C[...] from its cell. Never leaves an error set unless status is Error.
Fetched fetch_root(RuntimeRoot& root, const Locals& locals, PyObject* globals);

/// `X()` of an exact weakref.ref: its referent, or None when dead (borrowed, as
/// PyWeakref_GetObject answers), read from the object without a call; null for anything else
/// (a subclass, a proxy: fetch_step decides). Inline: torch guards a model's weak references to
/// its flat weights (an RNN's) on every check. Py_REFCNT 0 is a referent being destroyed, dead.
inline PyObject* weakref_referent(PyObject* v) {
#ifdef Py_GIL_DISABLED
    (void)v;
    return nullptr;  // the referent is read under the object's lock there
#else
    if (!PyWeakref_CheckRefExact(v)) return nullptr;
    PyObject* o = reinterpret_cast<PyWeakReference*>(v)->wr_object;
    return Py_REFCNT(o) > 0 ? o : Py_None;
#endif
}

/// Fetch the child of `parent` along `step`. Never leaves an error set unless status is Error.
Fetched fetch_step(RuntimeStep& step, PyObject* parent);

/// The value at a source (a root, then steps) exactly as a guard set's check reads it: a new
/// reference, or null with a Python error set (LookupError naming what is missing, or the
/// exception a step raised). Holds every value on the way. The builder reads examples with it,
/// so a guard is built on what the engine will see.
Ref read_source(RuntimeRoot& root, std::vector<RuntimeStep>& steps, const Locals& locals, PyObject* globals);

/// getattr(obj, name) with the step's inline cache.
Fetched fetch_attr(AttrCache& cache, PyObject* obj, PyObject* name);

/// Reads CPython's getattr hook of classes that define __getattr__ (a probe class, once), which
/// fetch_attr compares module subclasses' tp_getattro with. GIL held; may run user code (a
/// collection); false with a Python error set.
bool init_getattr_hook();

/// CPython's getattr hook of classes that define __getattr__ (init_getattr_hook), or null.
extern getattrofunc g_getattr_hook;
/// forwarded_module_attr's work, out of line.
PyObject* forwarded_value(PyObject* obj, PyObject* name);
/// getattr(obj, name) for an instance of a module subclass whose class __getattr__ forwards,
/// `return getattr(self.<attr>, name)` (torch._VF's), read without calling it: borrowed, or null
/// when that is not known without user code (the facts not learnt yet, or changed, or not such a
/// module; fetch_attr then decides, calling the method and learning the facts). Its proof
/// includes the module dict's lack of `name`. Allocates nothing, runs no user code, sets no
/// error. Inline: a plain module's attribute pays one compare.
inline PyObject* forwarded_module_attr(PyObject* obj, PyObject* name) {
    return Py_TYPE(obj)->tp_getattro == g_getattr_hook && g_getattr_hook != nullptr
               ? forwarded_value(obj, name)
               : nullptr;
}

/// Whether `X.__dict__` of instances of `tp` is their own instance dict (the name resolves to
/// the interpreter's own getset or member descriptor, not a class-defined `__dict__`), cached in
/// `c` under the type's version tag. Runs no user code once cached for the type.
bool standard_instance_dict(AttrCache& c, PyTypeObject* tp);
/// The type's version tag, or 0 when it has none (it then changes on every modification, and
/// equal tags mean an unchanged type). Before 3.13 a tag counts only while
/// Py_TPFLAGS_VALID_VERSION_TAG is set: CPython zeroes the tag wherever it clears the flag, but the
/// converse does not hold. 3.11/3.12's assign_version_tag gives the type its tag before its bases
/// theirs, and when a base then gets none (the tag counter exhausted) it returns with this type's
/// tag set and the flag clear; PyType_Modified returns early on a type without the flag, so that
/// tag would survive every later modification. CPython's own caches test the flag too. 3.13 no
/// longer sets the flag, assigns the bases first, and resets the tag to 0.
inline unsigned int type_version(PyTypeObject* tp) {
#if PY_VERSION_HEX >= 0x030D0000
    return tp->tp_version_tag;
#else
    return (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ? tp->tp_version_tag : 0;
#endif
}

/// The object in the slot at `offset` of `obj` (AttrCache::Mode::Member), borrowed, or null when
/// the slot is empty.
inline PyObject* member_slot(PyObject* obj, Py_ssize_t offset) {
    return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
}

/// Whether `c` was filled for `tp` under its current version tag.
inline bool attr_cache_valid(const AttrCache& c, PyTypeObject* tp) {
    return c.type == tp && c.version != 0 && type_version(tp) == c.version;
}

/// The instance dict of `obj` if it already exists (borrowed), without creating it: null when it
/// does not exist yet (CPython keeps attributes inline until the dict is asked for), when the
/// object has none, or when it cannot be read without allocating (a managed dict on an
/// interpreter whose layout mirror is not verified, dict_hint.hpp). Allocates nothing and sets
/// no error, so it may run where references are borrowed.
PyObject* existing_instance_dict(PyObject* obj);

/// The field `name` (`__code__`, `__defaults__`, `__kwdefaults__`, `__closure__`, `__globals__`,
/// `__dict__`-free reads of the function object) of exact function `fn`, borrowed, as getattr
/// returns it (None for an unset optional field); null for other names. No user code.
PyObject* function_field(PyObject* fn, PyObject* name);
/// Whether getattr(obj, name) certainly finds nothing, decided without user code: instances of
/// obj's type use object.__getattribute__ (cached in `c` under the type's version tag), no
/// class of its MRO defines `name`, obj's own storage lacks it (instance_attr_absent), and either
/// the class has no `__getattr__`, or it is a registered one whose miss is known
/// (dict_getattr.hpp: nn.Module's) and misses. False when present, or when this cannot be decided
/// that way. `dict_memo`: instance_attr_absent's memo of the instance dict state last proved to
/// lack `name`. `fill`: whether a stale cache may be filled here (filling may run user code, a
/// colliding key in a class dict: never where references are borrowed); without it a stale cache
/// answers false.
bool attribute_certainly_absent(AttrCache& c, std::uint64_t& dict_memo, PyObject* obj, PyObject* name,
                                bool fill = true);
/// Whether getattr(obj, n) for each of the `count` exact str `names` is decided by obj's own
/// storage alone: instances of obj's type use object.__getattribute__ itself (no __getattr__) and
/// no class of its MRO defines any of the names (cached in `c` under the type's version tag, as
/// InstanceDict). Runs no user code once cached for the type. `fill` as attribute_certainly_absent's.
bool attributes_in_instance_storage(AttrCache& c, PyTypeObject* tp, PyObject* const* names, int count,
                                    bool fill = true);

/// The value of class attribute `name` that `c` (Mode::ClassAttr, valid for `cls`) locates in the
/// dict of its owner: an exact function (its __get__ without an instance is itself), an object
/// whose type has no __get__ now (itself), or an exact staticmethod's callable, borrowed; null
/// otherwise (the caller's generic path decides). Allocates nothing, runs no user code, sets no error.
PyObject* class_attr_value(AttrCache& c, PyObject* name);
/// Whether `c` holds the ClassAttr facts of class `cls` under its current version tag and its
/// metatype's: `type` (hint 0), or the metaclass whose version tag `hint` holds (tags are never
/// reused, so an equal tag is the same, unchanged metaclass; a class's `__class__` can be
/// reassigned between mutable metaclasses without a new tag of its own). Inline for the fast pass.
inline bool class_attr_cached(const AttrCache& c, PyObject* cls) {
    if (c.mode != AttrCache::Mode::ClassAttr || reinterpret_cast<PyObject*>(c.type) != cls ||
        c.version == 0 || type_version(reinterpret_cast<PyTypeObject*>(cls)) != c.version)
        return false;
    return Py_IS_TYPE(cls, &PyType_Type)
               ? c.hint == 0
               : c.hint > 0 && type_version(Py_TYPE(cls)) == static_cast<unsigned int>(c.hint);
}
/// The fast pass's reads of the modes OwnDict, CellContents, ObjectClass and ClassAttr, when `c` is valid for
/// `obj` (borrowed), else null; `*unclaimed` set for a value that is no entry of obj's dict (each
/// of them). Allocates nothing, runs no user code, sets no error. Out of line: see fast_pass.cpp.
[[gnu::noinline]] PyObject* rare_attr_value(AttrCache& c, PyObject* obj, PyObject* name, bool* unclaimed);
/// `obj.name.__func__` without the bound method: the exact function the class's MRO holds for
/// `name` when `c` (the `obj.name` step's cache, valid for obj's type, Mode::InstanceDict with an
/// owner) says getattr binds it, and obj's own storage lacks `name`. Borrowed, or null when that
/// is not decided so (the caller evaluates both steps). Allocates nothing, runs no user code,
/// sets no error.
[[gnu::noinline]] PyObject* method_function(AttrCache& c, PyObject* obj, PyObject* name);

/// A readable description of why a Missing fetch failed ("no attribute 'x'", "no key 'k'").
std::string describe_missing(const RuntimeStep& step, PyObject* parent);

}  // namespace tripwire::runtime
