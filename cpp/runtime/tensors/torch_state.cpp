// tripwire/cpp/runtime/tensors/torch_state.cpp -- torch's global state, mode stack, default device.
#include "runtime/tensors/torch_state.hpp"

#include <cstring>

#include "core/kind_data.hpp"
#include "runtime/eval/dict_hint.hpp"
#include "runtime/tensors/readers.hpp"

namespace tripwire::runtime {
namespace {

using core::BuiltinProbe;
namespace ts = core::torch_state;

constexpr int kStateCapacity = static_cast<int>(ts::kHeader + 3 * ts::kMaxAutocastDevices);
static_assert(sizeof(TwGlobalState::header) == ts::kHeader * sizeof(std::int64_t),
              "TwGlobalState mirrors the torch_state header");
static_assert(TW_MAX_AUTOCAST_DEVICES == ts::kMaxAutocastDevices, "one device limit");

// torch's rule (GlobalStateGuard::check): every field equal, an autocast device's dtype only while
// it is enabled. `now` has `n` entries.
bool state_equal(const std::int64_t* want, std::size_t want_n, const std::int64_t* now, std::size_t n) {
    if (want_n != n || n < ts::kHeader) return false;
    if (std::memcmp(want, now, ts::kHeader * sizeof(std::int64_t)) != 0) return false;
    const auto devices = static_cast<std::size_t>(now[ts::kAutocastDevices]);
    const std::int64_t* w = want + ts::kHeader;
    const std::int64_t* c = now + ts::kHeader;
    for (std::size_t i = 0; i < devices; ++i) {
        if (w[i] != c[i] || w[devices + i] != c[devices + i]) return false;  // device type, enabled
        if (w[devices + i] != 0 && w[2 * devices + i] != c[2 * devices + i]) return false;  // dtype
    }
    return true;
}

// torch.utils._device's namespace, for CURRENT_DEVICE (imported when the first default-device
// guard is bound; held for the process).
PyObject* g_device_ns = nullptr;
PyObject* g_current_device = nullptr;
Py_ssize_t g_current_device_hint = -1;

bool ensure_device_module() {
    if (g_device_ns != nullptr) return true;
    PyObject* mod = PyImport_ImportModule("torch.utils._device");
    if (mod == nullptr) return false;
    PyObject* ns = PyModule_GetDict(mod);
    Py_XINCREF(ns);
    Py_DECREF(mod);
    g_current_device = PyUnicode_InternFromString("CURRENT_DEVICE");
    if (ns == nullptr || g_current_device == nullptr) return false;
    g_device_ns = ns;
    return true;
}

// CURRENT_DEVICE (borrowed) without user code, or null when it cannot be read that way.
PyObject* current_device(bool* ok) {
    *ok = false;
    if (g_device_ns == nullptr) return nullptr;
    PyObject* v = dict_get_hinted(g_device_ns, g_current_device, &g_current_device_hint);
    if (v != nullptr) {
        *ok = true;
        return v;
    }
    if (!dict_has_only_str_keys(g_device_ns)) return nullptr;
    v = PyDict_GetItemWithError(g_device_ns, g_current_device);  // str keys only: no user code
    if (v == nullptr && PyErr_Occurred()) {
        PyErr_Clear();
        return nullptr;
    }
    *ok = v != nullptr;
    return v;
}

// torch.autograd.forward_ad, whose _current_level DUAL_LEVEL_MATCH reads (imported when the first
// dual-level guard is bound; held for the process, as torch's guard holds it).
PyObject* g_forward_ad = nullptr;
PyObject* g_current_level = nullptr;
Py_ssize_t g_current_level_hint = -1;

bool ensure_forward_ad_module() {
    if (g_forward_ad != nullptr) return true;
    PyObject* mod = PyImport_ImportModule("torch.autograd.forward_ad");
    if (mod == nullptr) return false;
    g_current_level = PyUnicode_InternFromString("_current_level");
    if (g_current_level == nullptr) {
        Py_DECREF(mod);
        return false;
    }
    g_forward_ad = mod;
    return true;
}

// forward_ad._current_level as torch's DUAL_LEVEL_MATCH reads it (PyObject_GetAttrString on the
// module, then an exact int), without user code: 1 with *level, 0 when the guard fails (not an
// exact int, or one outside int64: torch's PyLong_AsLongLong would fail there; tripwire fails
// rather than compare its -1), -1 when only Python can tell. On an exact module, getattr finds
// the module dict's entry (ModuleType defines no attribute of that name); a missing entry would
// call a module __getattr__, and a reassigned __class__ may define anything: Python then.
int current_dual_level(std::int64_t* level) {
    if (g_forward_ad == nullptr || !PyModule_CheckExact(g_forward_ad)) return -1;
    PyObject* ns = PyModule_GetDict(g_forward_ad);  // borrowed, never null for a module
    PyObject* v = dict_get_hinted(ns, g_current_level, &g_current_level_hint);
    if (v == nullptr) {
        if (!dict_has_only_str_keys(ns)) return -1;
        v = PyDict_GetItemWithError(ns, g_current_level);  // str keys only: no user code
        if (v == nullptr) {
            PyErr_Clear();
            return -1;
        }
    }
    if (!PyLong_CheckExact(v)) return 0;
    int overflow = 0;
    const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0) return 0;
    *level = x;
    return 1;
}

// torch.fx.GraphModule and object's __class__ descriptor, for the saved-tensor-hooks probe
// (imported when the first such guard is bound; held for the process).
PyObject* g_graph_module = nullptr;
PyObject* g_class_name = nullptr;
PyObject* g_object_class = nullptr;

bool ensure_graph_module() {
    if (g_graph_module != nullptr) return true;
    PyObject* mod = PyImport_ImportModule("torch.fx");
    if (mod == nullptr) return false;
    PyObject* gm = PyObject_GetAttrString(mod, "GraphModule");
    Py_DECREF(mod);
    if (gm == nullptr) return false;
    if (!PyType_Check(gm)) {
        Py_DECREF(gm);
        PyErr_SetString(PyExc_TypeError, "torch.fx.GraphModule is not a class");
        return false;
    }
    g_class_name = PyUnicode_InternFromString("__class__");
    if (g_class_name == nullptr) {
        Py_DECREF(gm);
        return false;
    }
    // object's own __class__ getset descriptor (borrowed from object's dict, which never dies).
    g_object_class = _PyType_Lookup(&PyBaseObject_Type, g_class_name);
    g_graph_module = gm;
    return true;
}

// isinstance(obj, torch.fx.GraphModule) as torch's saved_tensors_hooks_are_inlineable decides
// it, without user code: 1 or 0, or -1 when only Python can tell. isinstance with a plain class
// checks the type's MRO, then asks obj.__class__: that is the type itself unless the type
// overrides attribute lookup or __class__, or GraphModule's metaclass may define
// __instancecheck__.
int is_graph_module(PyObject* obj) {
    auto* gm = reinterpret_cast<PyTypeObject*>(g_graph_module);
    if (Py_TYPE(g_graph_module) != &PyType_Type) return -1;
    if (PyType_IsSubtype(Py_TYPE(obj), gm)) return 1;
    if (Py_TYPE(obj)->tp_getattro != PyObject_GenericGetAttr) return -1;
    if (g_object_class == nullptr || _PyType_Lookup(Py_TYPE(obj), g_class_name) != g_object_class) return -1;
    return 0;
}

// The saved-tensor-hooks probe through the adapter: 0 for None (no hooks, or hooks torch does
// not inline), 1 with the pair in *pack/*unpack (borrowed), -1 when only the Python reader can
// tell. Runs no user code. torch's `isinstance(pack, GM) and isinstance(unpack, GM)` never asks
// about unpack when pack is not one, so neither does this.
int saved_hooks_native(const TwTorchAdapter* a, PyObject** pack, PyObject** unpack) {
    if (g_graph_module == nullptr) return -1;
    const int top = a->saved_tensors_hooks_top(pack, unpack);
    if (top <= 0) return top;
    const int p = is_graph_module(*pack);
    if (p <= 0) return p;
    return is_graph_module(*unpack);
}

// The ids a saved-tensor-hooks snapshot names (g.n2, g.n3 at bind time).
std::int64_t pointer_bits(PyObject* p) {
    return static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(p));
}

// 1/0 natively; -1 when it cannot be decided natively (no adapter, CURRENT_DEVICE unreadable).
int native_match(const RuntimeGuard& g) {
    const TwTorchAdapter* a = torch_adapter();
    if (a == nullptr || g.via_python) return -1;
    switch (static_cast<BuiltinProbe>(g.n)) {
        case BuiltinProbe::TorchGlobalState:
            // Compiled when the guard was bound (bind_torch_probe); null: a snapshot the adapter
            // cannot hold (more autocast devices than it knows), which never matches.
            if (g.derived == nullptr) return 0;
            return a->global_state_matches(
                reinterpret_cast<const TwGlobalState*>(PyBytes_AS_STRING(g.derived)));
        case BuiltinProbe::TorchFunctionModeStack: {
            PyObject* want = g.b;  // a tuple of types
            const std::int64_t len = a->function_mode_stack_len();
            if (len != PyTuple_GET_SIZE(want)) return 0;
            for (std::int64_t i = 0; i < len; ++i) {
                PyObject* mode = a->function_mode_at(i);
                if (mode == nullptr ||
                    reinterpret_cast<PyObject*>(Py_TYPE(mode)) != PyTuple_GET_ITEM(want, i))
                    return 0;
            }
            return 1;
        }
        case BuiltinProbe::TorchDefaultDevice: {
            bool ok = false;
            PyObject* cur = current_device(&ok);
            if (!ok) return -1;
            if (g.b == Py_None) return cur == Py_None ? 1 : 0;
            std::int32_t type = 0, index = 0;
            if (cur == Py_None || a->read_device(cur, &type, &index) != 1) return 0;
            return type == g.n2 && index == g.n3 ? 1 : 0;
        }
        case BuiltinProbe::TorchSavedTensorsHooks: {
            PyObject* pack = nullptr;
            PyObject* unpack = nullptr;
            const int s = saved_hooks_native(a, &pack, &unpack);
            if (s < 0) return -1;
            if (g.b == Py_None) return s == 0 ? 1 : 0;
            return s == 1 && pointer_bits(pack) == g.n2 && pointer_bits(unpack) == g.n3 ? 1 : 0;
        }
        case BuiltinProbe::TorchDualLevel: {
            std::int64_t level = 0;
            const int r = current_dual_level(&level);
            if (r <= 0) return r;
            return level == g.n2 ? 1 : 0;
        }
        default: return 0;
    }
}

// Calls a registered Python reader.
Ref call_reader(const Ref& reader, const char* what) {
    if (!reader) {
        PyErr_Format(PyExc_RuntimeError, "no Python reader for %s: torch support is not initialized", what);
        return Ref();
    }
    return Ref::steal(PyObject_CallNoArgs(reader.get()));
}

bool int_vector(PyObject* t, std::vector<std::int64_t>& out) {
    if (!PyTuple_Check(t)) {
        PyErr_SetString(PyExc_TypeError, "the torch state reader must return a tuple of ints");
        return false;
    }
    out.resize(static_cast<std::size_t>(PyTuple_GET_SIZE(t)));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) {
        out[static_cast<std::size_t>(i)] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (PyErr_Occurred()) return false;
    }
    return true;
}

int python_match(const RuntimeGuard& g) {
    PythonReaders& r = python_readers();
    switch (static_cast<BuiltinProbe>(g.n)) {
        case BuiltinProbe::TorchGlobalState: {
            const Ref now = call_reader(r.torch_state, "torch's global state");
            std::vector<std::int64_t> v;
            if (!now || !int_vector(now.get(), v)) return -1;
            return state_equal(g.data, g.data_size, v.data(), v.size()) ? 1 : 0;
        }
        case BuiltinProbe::TorchFunctionModeStack: {
            const Ref now = call_reader(r.mode_stack, "the torch-function mode stack");
            if (!now) return -1;
            if (!PyTuple_Check(now.get()) || PyTuple_GET_SIZE(now.get()) != PyTuple_GET_SIZE(g.b)) return 0;
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(g.b); ++i) {
                if (PyTuple_GET_ITEM(now.get(), i) != PyTuple_GET_ITEM(g.b, i)) return 0;
            }
            return 1;
        }
        case BuiltinProbe::TorchDefaultDevice: {
            const Ref now = call_reader(r.default_device, "the default device");
            if (!now) return -1;
            if (g.b == Py_None || now.get() == Py_None) return now.get() == g.b ? 1 : 0;
            if (!PyUnicode_CheckExact(now.get())) return 0;
            return PyUnicode_Compare(now.get(), g.b) == 0 ? 1 : 0;
        }
        case BuiltinProbe::TorchSavedTensorsHooks: {
            const Ref now = call_reader(r.saved_hooks, "the saved-tensor hooks");
            if (!now) return -1;
            if (g.b == Py_None || now.get() == Py_None) return now.get() == g.b ? 1 : 0;
            if (!PyTuple_CheckExact(now.get()) || PyTuple_GET_SIZE(now.get()) != 2) return 0;
            for (Py_ssize_t i = 0; i < 2; ++i) {
                PyObject* id = PyTuple_GET_ITEM(now.get(), i);
                if (!PyLong_CheckExact(id)) return 0;
                void* p = PyLong_AsVoidPtr(id);
                if (p == nullptr && PyErr_Occurred()) return -1;
                if (pointer_bits(static_cast<PyObject*>(p)) != (i == 0 ? g.n2 : g.n3)) return 0;
            }
            return 1;
        }
        case BuiltinProbe::TorchDualLevel: {
            const Ref now = call_reader(r.dual_level, "forward-AD's dual level");
            if (!now) return -1;
            if (!PyLong_CheckExact(now.get())) return 0;
            int overflow = 0;
            const long long x = PyLong_AsLongLongAndOverflow(now.get(), &overflow);
            if (x == -1 && PyErr_Occurred()) return -1;
            return overflow == 0 && x == g.n2 ? 1 : 0;
        }
        default: return 0;
    }
}

// A saved-tensor-hooks value: None, or the ids of the pair.
Ref hooks_ids(PyObject* pack, PyObject* unpack) {
    Ref p = Ref::steal(PyLong_FromVoidPtr(pack));
    Ref u = Ref::steal(PyLong_FromVoidPtr(unpack));
    if (!p || !u) return Ref();
    return Ref::steal(PyTuple_Pack(2, p.get(), u.get()));
}

const char* device_type_name(std::int64_t t) {
    switch (t) {
        case 0: return "cpu";
        case 1: return "cuda";
        case 8: return "maia";
        case 9: return "xla";
        case 12: return "xpu";
        case 13: return "mps";
        case 15: return "hpu";
        case 18: return "ipu";
        case 19: return "mtia";
        case 20: return "privateuseone";
        default: return "device";
    }
}

}  // namespace

bool torch_probe_pure(const RuntimeGuard& g) {
    // torch's global state is checked on every call: straight to the adapter. g.derived is set
    // only when the guard was bound through the adapter (bind_torch_probe), which then stays.
    if (g.n == static_cast<std::int64_t>(BuiltinProbe::TorchGlobalState) && g.derived != nullptr) {
        return torch_adapter()->global_state_matches(
                   reinterpret_cast<const TwGlobalState*>(PyBytes_AS_STRING(g.derived))) == 1;
    }
    return native_match(g) == 1;
}

bool torch_default_device_none() {
    bool ok = false;
    PyObject* cur = current_device(&ok);
    return ok && cur == Py_None;
}

int torch_probe_matches(const RuntimeGuard& g) {
    if (!g.via_python) {
        const int r = native_match(g);
        if (r >= 0) return r;
    }
    return python_match(g);
}

bool bind_torch_probe(RuntimeGuard& g, bool native, Ref& keep) {
    g.via_python = !native;
    if (static_cast<BuiltinProbe>(g.n) == BuiltinProbe::TorchDualLevel) {
        if (native && !ensure_forward_ad_module()) return false;
        int overflow = 0;
        const long long level = PyLong_CheckExact(g.b) ? PyLong_AsLongLongAndOverflow(g.b, &overflow) : 0;
        if (!PyLong_CheckExact(g.b) || overflow != 0) {
            PyErr_SetString(PyExc_TypeError, "a dual-level snapshot is an int (within int64)");
            return false;
        }
        g.n2 = level;
        return true;
    }
    if (static_cast<BuiltinProbe>(g.n) == BuiltinProbe::TorchSavedTensorsHooks) {
        if (native && !ensure_graph_module()) return false;
        if (g.b == Py_None) return true;
        if (!PyTuple_CheckExact(g.b) || PyTuple_GET_SIZE(g.b) != 2 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(g.b, 0)) || !PyLong_CheckExact(PyTuple_GET_ITEM(g.b, 1))) {
            PyErr_SetString(PyExc_TypeError, "a saved-tensor-hooks snapshot is None or a tuple of two ids");
            return false;
        }
        void* pack = PyLong_AsVoidPtr(PyTuple_GET_ITEM(g.b, 0));
        if (pack == nullptr && PyErr_Occurred()) return false;
        void* unpack = PyLong_AsVoidPtr(PyTuple_GET_ITEM(g.b, 1));
        if (unpack == nullptr && PyErr_Occurred()) return false;
        g.n2 = pointer_bits(static_cast<PyObject*>(pack));
        g.n3 = pointer_bits(static_cast<PyObject*>(unpack));
        return true;
    }
    if (native && static_cast<BuiltinProbe>(g.n) == BuiltinProbe::TorchGlobalState) {
        const std::int64_t devices = g.data[ts::kAutocastDevices];
        if (devices > TW_MAX_AUTOCAST_DEVICES) return true;  // g.derived stays null: never matches
        // The adapter compares devices by position: the snapshot must list this torch's
        // autocast devices in its order, else it can never match.
        std::int64_t now[kStateCapacity];
        const int n = torch_adapter()->read_global_state(now, kStateCapacity, 1);
        if (n < 0 || now[ts::kAutocastDevices] != devices ||
            std::memcmp(now + ts::kHeader, g.data + ts::kHeader,
                        static_cast<std::size_t>(devices) * sizeof(std::int64_t)) != 0)
            return true;
        keep = Ref::steal(PyBytes_FromStringAndSize(nullptr, sizeof(TwGlobalState)));
        if (!keep) return false;
        auto* c = reinterpret_cast<TwGlobalState*>(PyBytes_AS_STRING(keep.get()));
        std::memset(c, 0, sizeof(TwGlobalState));
        std::memcpy(c->header, g.data, sizeof(c->header));
        c->n_devices = static_cast<std::int32_t>(devices);
        const std::int64_t* d = g.data + ts::kHeader;
        for (std::int64_t i = 0; i < devices; ++i) {
            c->device_types[i] = static_cast<std::int32_t>(d[i]);
            if (d[devices + i] != 0) c->autocast_enabled_mask |= std::uint64_t{1} << i;
            c->dtypes[i] = static_cast<std::int32_t>(d[2 * devices + i]);
        }
        g.derived = keep.get();
        return true;
    }
    if (static_cast<BuiltinProbe>(g.n) != BuiltinProbe::TorchDefaultDevice) return true;
    if (native && !ensure_device_module()) return false;
    if (g.b == Py_None) return true;
    if (!PyUnicode_Check(g.b)) {
        PyErr_SetString(PyExc_TypeError, "a default-device snapshot is None or a device string");
        return false;
    }
    if (!native) return true;
    const char* text = PyUnicode_AsUTF8(g.b);
    if (text == nullptr) return false;
    std::int32_t type = 0, index = 0;
    if (torch_adapter()->parse_device(text, &type, &index) != 1) {
        PyErr_Format(PyExc_ValueError, "torch does not accept the device %s", text);
        return false;
    }
    g.n2 = type;
    g.n3 = index;
    return true;
}

Ref torch_probe_value(BuiltinProbe p, bool native) {
    const TwTorchAdapter* a = torch_adapter();
    if (!native) {
        PythonReaders& r = python_readers();
        switch (p) {
            case BuiltinProbe::TorchGlobalState: return call_reader(r.torch_state, "torch's global state");
            case BuiltinProbe::TorchFunctionModeStack:
                return call_reader(r.mode_stack, "the torch-function mode stack");
            case BuiltinProbe::TorchDefaultDevice: return call_reader(r.default_device, "the default device");
            case BuiltinProbe::TorchSavedTensorsHooks:
                return call_reader(r.saved_hooks, "the saved-tensor hooks");
            case BuiltinProbe::TorchDualLevel: return call_reader(r.dual_level, "forward-AD's dual level");
            default: return Ref::borrow(Py_None);
        }
    }
    if (a == nullptr) return Ref::borrow(Py_None);
    switch (p) {
        case BuiltinProbe::TorchGlobalState: {
            std::int64_t now[kStateCapacity];
            const int n = a->read_global_state(now, kStateCapacity, 1);
            if (n < 0) {
                PyErr_SetString(PyExc_RuntimeError, "torch has more autocast devices than tripwire reads");
                return Ref();
            }
            Ref t = Ref::steal(PyTuple_New(n));
            for (int i = 0; t && i < n; ++i) {
                PyObject* x = PyLong_FromLongLong(now[i]);
                if (x == nullptr) return Ref();
                PyTuple_SET_ITEM(t.get(), i, x);
            }
            return t;
        }
        case BuiltinProbe::TorchFunctionModeStack: {
            const std::int64_t len = a->function_mode_stack_len();
            Ref t = Ref::steal(PyTuple_New(len));
            for (std::int64_t i = 0; t && i < len; ++i) {
                PyObject* mode = a->function_mode_at(i);
                PyObject* type = mode != nullptr ? reinterpret_cast<PyObject*>(Py_TYPE(mode)) : Py_None;
                PyTuple_SET_ITEM(t.get(), i, Py_NewRef(type));
            }
            return t;
        }
        case BuiltinProbe::TorchDefaultDevice: {
            if (!ensure_device_module()) return Ref();
            bool ok = false;
            PyObject* cur = current_device(&ok);
            if (!ok || cur == Py_None) return Ref::borrow(Py_None);
            return Ref::steal(PyObject_Str(cur));
        }
        case BuiltinProbe::TorchSavedTensorsHooks: {
            if (!ensure_graph_module()) return Ref();
            PyObject* pack = nullptr;
            PyObject* unpack = nullptr;
            const int s = saved_hooks_native(a, &pack, &unpack);
            if (s < 0) return call_reader(python_readers().saved_hooks, "the saved-tensor hooks");
            return s == 0 ? Ref::borrow(Py_None) : hooks_ids(pack, unpack);
        }
        case BuiltinProbe::TorchDualLevel: {
            if (!ensure_forward_ad_module()) return Ref();
            std::int64_t level = 0;
            if (current_dual_level(&level) == 1) return Ref::steal(PyLong_FromLongLong(level));
            return call_reader(python_readers().dual_level, "forward-AD's dual level");
        }
        default: return Ref::borrow(Py_None);
    }
}

std::vector<std::string> torch_state_differences(const std::vector<std::int64_t>& want,
                                                 const std::vector<std::int64_t>& now) {
    std::vector<std::string> out;
    if (want.size() < ts::kHeader || now.size() < ts::kHeader) {
        out.emplace_back("layout");
        return out;
    }
    for (std::size_t f = 0; f < ts::kHeader; ++f) {
        if (want[f] != now[f]) out.emplace_back(ts::field_name(f));
    }
    if (want.size() != now.size() || want[ts::kAutocastDevices] != now[ts::kAutocastDevices]) return out;
    const auto devices = static_cast<std::size_t>(now[ts::kAutocastDevices]);
    const std::int64_t* w = want.data() + ts::kHeader;
    const std::int64_t* c = now.data() + ts::kHeader;
    for (std::size_t i = 0; i < devices; ++i) {
        const std::string dev = std::string("autocast(") + device_type_name(c[i]) + ")";
        if (w[i] != c[i]) out.push_back(dev + "_device");
        if (w[devices + i] != c[devices + i]) out.push_back(dev + "_enabled");
        if (w[devices + i] != 0 && w[2 * devices + i] != c[2 * devices + i]) out.push_back(dev + "_dtype");
    }
    return out;
}

}  // namespace tripwire::runtime
