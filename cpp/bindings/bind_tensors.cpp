// tripwire/cpp/bindings/bind_tensors.cpp -- tensors, arrays, torch's state and constant types.
//
// The package (tripwire/tensors.py) installs the torch adapter and the Python readers, verifies
// and enables the numpy struct, and reads example values through these functions, so that a
// guard is built on what a check will read.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "core/ir.hpp"
#include "register.hpp"
#include "runtime/eval/constant_types.hpp"
#include "runtime/tensors/mode_flag.hpp"
#include "runtime/tensors/property_reader.hpp"
#include "runtime/tensors/readers.hpp"
#include "runtime/tensors/tensor_kinds.hpp"
#include "runtime/tensors/torch_state.hpp"

namespace nb = nanobind;

namespace tripwire::bindings {
namespace {

nb::object steal_or_throw(runtime::Ref r) {
    if (!r) throw nb::python_error();
    return nb::steal(r.release());
}

runtime::Ref optional(nb::handle h) { return h.is_none() ? runtime::Ref() : runtime::Ref::borrow(h.ptr()); }

runtime::ConstantCompare compare_named(const std::string& name) {
    if (name == "identity") return runtime::ConstantCompare::Identity;
    if (name == "tuple") return runtime::ConstantCompare::Tuple;
    if (name == "richcompare") return runtime::ConstantCompare::RichCompare;
    throw nb::value_error(("unknown comparison '" + name + "' (identity, tuple, richcompare)").c_str());
}

// numpy dtype equality for the constant registry: two simple dtypes (exact types already equal).
int numpy_dtype_equal(PyObject* a, PyObject* b) {
    return runtime::numpy_dtype_is_simple(a) && runtime::numpy_dtype_is_simple(b) &&
                   runtime::numpy_simple_dtypes_equal(a, b)
               ? 1
               : 0;
}

}  // namespace

void register_tensors(nb::module_& m) {
    nb::module_ testing = testing_module(m);
    m.def(
        "_install_torch_adapter",
        [](nb::handle capsule, const std::string& torch_version) {
            if (!runtime::install_torch_adapter(capsule.ptr(), torch_version.c_str()))
                throw nb::python_error();
        },
        nb::arg("table"), nb::arg("torch_version"),
        "Install the torch adapter's table (tripwire._torch_adapter.table). Once installed it stays.");
    m.def(
        "_set_plain_tensor_types",
        [](const nb::tuple& types) {
            std::vector<PyObject*> ptrs;
            for (nb::handle t : types) ptrs.push_back(t.ptr());
            return runtime::register_plain_tensor_types(ptrs.data(), static_cast<int>(ptrs.size()));
        },
        nb::arg("types"),
        "Tensor types whose SIZE/STRIDE/STORAGE_OFFSET steps may be read by the adapter (exact type; "
        "their size/stride/storage_offset must be TensorBase's): returns how many were kept.");
    testing.def(
        "read_tensor_property",
        [](nb::handle v, core::StepKind kind, std::int64_t index) -> nb::object {
            std::int64_t out = 0;
            switch (runtime::read_tensor_property(v.ptr(), kind, index, &out)) {
                case runtime::PropertyRead::Value: return nb::int_(out);
                case runtime::PropertyRead::Missing: return nb::str("missing");
                case runtime::PropertyRead::Unknown: break;
            }
            return nb::none();
        },
        nb::arg("value"), nb::arg("kind"), nb::arg("index"),
        "The C-level reader of a SIZE/STRIDE/STORAGE_OFFSET step: the int, 'missing', or None when it "
        "leaves the step to the generic (Python) path.");
    m.def(
        "applied_dispatch_keys",
        [](nb::handle v) -> nb::object {
            std::uint64_t keys = 0;
            if (!runtime::applied_key_set(v.ptr(), keys)) return nb::none();
            return nb::int_(keys);
        },
        nb::arg("value"), nb::sig("def applied_dispatch_keys(value: object) -> int | None"),
        "DISPATCH_KEY_SET_MATCH's reading of `value`: the raw bits of its DispatchKeySet with the "
        "current thread's include/exclude sets applied and the Python keys masked as torch's guards "
        "mask them, read through the torch adapter; None when `value` is not a DispatchKeySet the "
        "adapter reads (or no adapter is installed).");
    m.def(
        "dispatch_key_set_reader_installed",
        [] {
            const TwTorchAdapter* a = runtime::torch_adapter();
            return a != nullptr && a->dispatch_key_set_type != nullptr;
        },
        "Whether DISPATCH_KEY_SET_MATCH can be built: the torch adapter is installed and verified "
        "that it reads torch._C.DispatchKeySet objects as torch does.");
    m.def(
        "torch_adapter_installed", [] { return runtime::torch_adapter() != nullptr; },
        "Whether tensors and torch's state are read through the compiled torch adapter.");
    m.def(
        "_masks_python_keys",
        []() -> nb::object {
            switch (runtime::python_key_mask()) {
                case runtime::PythonKeyMask::Masked: return nb::bool_(true);
                case runtime::PythonKeyMask::Kept: return nb::bool_(false);
                case runtime::PythonKeyMask::Unknown: break;
            }
            return nb::none();
        },
        nb::sig("def _masks_python_keys() -> bool | None"),
        "Whether TENSOR_MATCH masks the Python dispatch keys now, on this thread, as torch's guards "
        "do: torch's own thread-local flag, read through its getter (_find_torch_mode_flag); None when the "
        "getter was not found (or is hidden): the engine then "
        "fails a key set carrying a Python key closed.");
    m.def(
        "_find_torch_mode_flag",
        [](nb::handle setter, std::uint64_t python_key_bits) {
            return runtime::find_torch_mode_flag(setter.ptr(), python_key_bits);
        },
        nb::arg("setter").none(), nb::arg("python_key_bits"),
        "Take torch's hidden getter of its per-thread 'dispatch mode without ignore_compile_internals' "
        "flag from the installed torch adapter (which finds it in libtorch_python.so) and verify it "
        "against `setter` (torch._C._dynamo.guards.set_is_in_mode_without_ignore_compile_internals). "
        "`python_key_bits`: the raw bits of the Python keys, registered either way. Whether it is verified.");
    testing.def(
        "hide_torch_mode_flag", [](bool on) { return runtime::hide_torch_mode_flag(on); }, nb::arg("on"),
        "Test switch: act as if torch's mode-flag getter had not been found (a stripped library). "
        "Returns the previous setting.");
    m.def(
        "_set_python_readers",
        [](nb::handle tensor, nb::handle array, nb::handle torch_state, nb::handle mode_stack,
           nb::handle default_device, nb::handle saved_hooks, nb::handle dual_level) {
            runtime::PythonReaders& r = runtime::python_readers();
            if (!tensor.is_none()) r.tensor = optional(tensor);
            if (!array.is_none()) r.array = optional(array);
            if (!torch_state.is_none()) r.torch_state = optional(torch_state);
            if (!mode_stack.is_none()) r.mode_stack = optional(mode_stack);
            if (!default_device.is_none()) r.default_device = optional(default_device);
            if (!saved_hooks.is_none()) r.saved_hooks = optional(saved_hooks);
            if (!dual_level.is_none()) r.dual_level = optional(dual_level);
        },
        nb::arg("tensor").none(), nb::arg("array").none(), nb::arg("torch_state").none(),
        nb::arg("mode_stack").none(), nb::arg("default_device").none(), nb::arg("saved_hooks").none(),
        nb::arg("dual_level").none(),
        "Register the Python readers used without the adapter or the numpy struct (None: keep).");
    m.def(
        "_enable_numpy_struct",
        [](nb::handle ndarray, nb::handle dtype, int descr_layout) {
            return runtime::enable_numpy_struct(ndarray.ptr(), dtype.ptr(), descr_layout);
        },
        nb::arg("ndarray"), nb::arg("dtype"), nb::arg("descr_layout"),
        "Read arrays of this type (numpy.ndarray) and dtypes (numpy.dtype) from their structs, with "
        "PyArray_Descr's layout `descr_layout` (1: numpy 1.x, 2: numpy 2.x); verified by the caller.");
    m.def(
        "_register_numpy_dtype",
        [](nb::handle dtype_type) {
            if (!PyType_Check(dtype_type.ptr())) throw nb::type_error("numpy.dtype expected");
            if (!runtime::register_constant_type(reinterpret_cast<PyTypeObject*>(dtype_type.ptr()),
                                                 runtime::ConstantCompare::Native, numpy_dtype_equal, true,
                                                 runtime::numpy_dtype_is_simple))
                throw nb::python_error();
        },
        nb::arg("dtype_type"),
        "Make simple numpy dtypes EQUALS_MATCH constants (after _enable_numpy_struct).");
    m.def(
        "_numpy_struct_probe",
        [](nb::handle array, nb::handle ndarray, nb::handle dtype, int descr_layout) -> nb::object {
            if (!PyType_Check(ndarray.ptr()) || !PyType_Check(dtype.ptr()))
                throw nb::type_error("numpy.ndarray and numpy.dtype expected");
            auto* dtype_type = reinterpret_cast<PyTypeObject*>(dtype.ptr());
            runtime::ArrayView a;
            runtime::DescrView d;
            if (!runtime::read_array_struct_of(array.ptr(), reinterpret_cast<PyTypeObject*>(ndarray.ptr()),
                                               dtype_type, descr_layout, a) ||
                !runtime::read_descr_of(a.descr, dtype_type, descr_layout, d))
                return nb::none();
            std::vector<std::int64_t> sizes(a.sizes, a.sizes + a.ndim),
                strides(a.strides, a.strides + a.ndim);
            const int bits = runtime::array_required_bits(a.flags);
            return nb::make_tuple(a.ndim, nb::tuple(nb::cast(sizes)), nb::tuple(nb::cast(strides)),
                                  (bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0,
                                  runtime::array_writeable(a.flags), nb::borrow(a.descr), a.itemsize,
                                  d.type_num, std::string(1, d.kind), std::string(1, d.type),
                                  std::string(1, d.byteorder));
        },
        nb::arg("array"), nb::arg("ndarray"), nb::arg("dtype"), nb::arg("descr_layout"),
        "What the struct reader sees in `array` before it is enabled (the layout check): the fields "
        "of read_array_fields, then its dtype's itemsize, type number, kind, type char and byte order "
        "as read from the dtype's struct.");
    testing.def(
        "numpy_dtype_fields",
        [](nb::handle d) -> nb::object {
            if (!runtime::is_numpy_dtype(d.ptr())) return nb::none();
            return nb::make_tuple(runtime::numpy_dtype_is_simple(d.ptr()));
        },
        nb::arg("dtype"), "(simple,) for a numpy dtype once the struct is enabled, else None.");
    m.def(
        "numpy_struct_enabled", [] { return runtime::numpy_ndarray_type() != nullptr; },
        "Whether arrays are read from their struct.");
    m.def(
        "read_tensor_fields",
        [](nb::handle v, bool native) {
            return steal_or_throw(runtime::read_tensor_fields(v.ptr(), native));
        },
        nb::arg("value").none(), nb::arg("native"),
        "(dispatch_keys, dtype, device_index, requires_grad, sizes, strides|None, storage_offset) as "
        "TENSOR_MATCH "
        "reads them: through the adapter (native) or the Python reader. None for a value it cannot read.");
    m.def(
        "read_array_fields",
        [](nb::handle v, bool native) { return steal_or_throw(runtime::read_array_fields(v.ptr(), native)); },
        nb::arg("value").none(), nb::arg("native"),
        "(ndim, sizes, strides, c_contiguous, f_contiguous, aligned, writeable, dtype) as ARRAY_MATCH reads "
        "them: from the struct (native) or the Python reader. None for a value it cannot read.");
    m.def(
        "read_shape",
        [](nb::handle v) -> nb::object {
            runtime::ShapeView s;
            switch (runtime::read_shape(v.ptr(), s)) {
                case runtime::ShapeRead::NotApplicable: return nb::str("not applicable");
                case runtime::ShapeRead::Unavailable: return nb::str("unavailable");
                case runtime::ShapeRead::Ok: break;
            }
            std::vector<std::int64_t> sizes(s.sizes, s.sizes + s.ndim);
            nb::object strides = nb::none();
            if (s.strides != nullptr)
                strides = nb::cast(std::vector<std::int64_t>(s.strides, s.strides + s.ndim));
            nb::object offset = s.has_storage_offset ? nb::cast(s.storage_offset) : nb::none();
            return nb::make_tuple(s.ndim, nb::tuple(nb::cast(sizes)),
                                  strides.is_none() ? strides : nb::tuple(strides), offset, s.stride_unit);
        },
        nb::arg("value").none(),
        "The C++ shape reader (runtime/tensors/readers.hpp read_shape): (ndim, sizes, strides|None, "
        "storage_offset|None, stride_unit), or 'not applicable' / 'unavailable'.");
    m.def(
        "dtype_code",
        [](nb::handle d) {
            const TwTorchAdapter* a = runtime::torch_adapter();
            return a != nullptr ? a->dtype_code(d.ptr()) : -1;
        },
        nb::arg("dtype"), "The c10::ScalarType of a torch.dtype through the adapter (-1 without it).");
    m.def(
        "torch_state_differences",
        [](const std::vector<std::int64_t>& want, const std::vector<std::int64_t>& now) {
            return runtime::torch_state_differences(want, now);
        },
        nb::arg("want"), nb::arg("now"),
        "The fields that differ between two torch global-state tuples, as GLOBAL_STATE names them.");
    m.def(
        "register_constant_type",
        [](nb::handle tp, const std::string& compare) {
            if (!PyType_Check(tp.ptr())) throw nb::type_error("register_constant_type needs a type");
            if (!runtime::register_constant_type(reinterpret_cast<PyTypeObject*>(tp.ptr()),
                                                 compare_named(compare), nullptr, false))
                throw nb::python_error();
        },
        nb::arg("type"), nb::arg("compare"),
        "Make instances of `type` EQUALS_MATCH constants, compared by 'identity', as a 'tuple' of constants, "
        "or "
        "by the type's own C 'richcompare' (static C types only).");
    m.def(
        "constant_types",
        [] {
            nb::list out;
            for (const runtime::ConstantType& c : runtime::constant_types()) {
                out.append(nb::make_tuple(nb::borrow(reinterpret_cast<PyObject*>(c.type)),
                                          runtime::constant_compare_name(c.compare), c.subclasses));
            }
            return out;
        },
        "[(type, comparison, subclasses)]: the registered constant types besides the built-in ones.");
}

}  // namespace tripwire::bindings
