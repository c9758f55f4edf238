// tripwire/cpp/adapters/torch/global_state.cpp -- the torch adapter's reads of torch's global state.
//
// GLOBAL_STATE's snapshot (read_global_state, torch's accessors) and its per-check comparison
// (global_state_matches), with the private reads that comparison pays for on every check: at::Context's
// members, the thread-locals by address, the autocast cache flag in libtorch_cpu's TLS block. Each
// private read's load-time check is beside it (load_global_state runs them). The torch-function mode
// stack and the saved-tensor hooks are thread-local state read through the same per-thread cache.
#include <ATen/Config.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/autocast_mode.h>
#include <c10/core/AutogradState.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/PyInterpreter.h>

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#if AT_PARALLEL_OPENMP
#include <omp.h>
#endif

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "adapters/torch/adapter.hpp"

namespace tripwire::torch_adapter {

namespace {

namespace ts_layout {
// core::torch_state's layout (cpp/core/kind_data.hpp); kept in step by test_tensors.py, which
// compares this adapter's reading with the Python reader's field by field.
constexpr int kGradMode = 0, kTorchFunction = 1, kTorchFunctionAllDisabled = 2, kDeterministic = 3,
              kWarnOnly = 4, kAllowTf32 = 5, kFp16 = 6, kBf16 = 7, kNumThreads = 8, kDefaultDtype = 9,
              kCacheEnabled = 10, kDevices = 11, kHeader = 12;
}  // namespace ts_layout

// A private member named through explicit template instantiation, the one place the language does
// not check access: the compiler takes the member's place from the header torch was built with, so
// the read is sound only against those exact headers (the adapter is compiled against the installed
// torch's, and _core refuses it under any other torch version: readers.cpp install_torch_adapter).
// Each use is checked against its public accessor when the adapter loads.
template <typename Tag, typename Tag::type Member>
struct PrivateMember {
    friend typename Tag::type member_of(Tag) { return Member; }
};

// The autocast dispatch key of each autocast device: autocast is enabled on a device exactly when
// its key is not in the thread-local exclude set (at::autocast::is_autocast_enabled), so one read
// of the thread-local key sets answers for every device.
std::array<c10::DispatchKey, at::autocast::_AUTOCAST_SUPPORTED_DEVICES.size()> g_autocast_keys{};

}  // namespace

int read_global_state(int64_t* out, int capacity, int all_dtypes) noexcept {
    namespace L = ts_layout;
    const auto& devices = at::autocast::_AUTOCAST_SUPPORTED_DEVICES;
    const int n = static_cast<int>(devices.size());
    if (capacity < L::kHeader + 3 * n) return -1;
    try {
        auto& ctx = at::globalContext();
        const auto tf = at::impl::PythonTorchFunctionTLS::get_disabled_state();
        out[L::kGradMode] = c10::GradMode::is_enabled() ? 1 : 0;
        out[L::kTorchFunction] = tf == at::impl::TorchFunctionDisabledState::ENABLED ? 1 : 0;
        out[L::kTorchFunctionAllDisabled] = tf == at::impl::TorchFunctionDisabledState::ALL_DISABLED ? 1 : 0;
        out[L::kDeterministic] = ctx.deterministicAlgorithms() ? 1 : 0;
        out[L::kWarnOnly] = ctx.deterministicAlgorithmsWarnOnly() ? 1 : 0;
        out[L::kAllowTf32] = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
                                     at::Float32Precision::TF32
                                 ? 1
                                 : 0;
        out[L::kFp16] = static_cast<int64_t>(ctx.allowFP16ReductionCuBLAS());
        out[L::kBf16] = static_cast<int64_t>(ctx.allowBF16ReductionCuBLAS());
        out[L::kNumThreads] = at::get_num_threads();
        out[L::kDefaultDtype] = static_cast<int64_t>(c10::get_default_dtype_as_scalartype());
        out[L::kCacheEnabled] = at::autocast::is_autocast_cache_enabled() ? 1 : 0;
        out[L::kDevices] = n;
        const c10::DispatchKeySet excluded = c10::impl::tls_local_dispatch_key_set().excluded_;
        for (int i = 0; i < n; ++i) {
            const bool enabled = !excluded.has(g_autocast_keys[i]);
            out[L::kHeader + i] = static_cast<int64_t>(devices[i]);
            out[L::kHeader + n + i] = enabled ? 1 : 0;
            out[L::kHeader + 2 * n + i] =
                enabled || all_dtypes ? static_cast<int64_t>(at::autocast::get_autocast_dtype(devices[i]))
                                      : -1;
        }
        return L::kHeader + 3 * n;
    } catch (...) {
        return -1;
    }
}

namespace {

// The raw bits of the autocast keys of all autocast devices (every one excluded: all disabled).
uint64_t g_all_autocast_bits = 0;

// -- The per-check reading of torch's global state ---------------------------------------------
//
// GLOBAL_STATE is checked on every call, so global_state_matches reads each field the cheapest
// way that still reads what torch's own accessor returns:
//  - at::Context's fields directly (their accessors are out-of-line calls, and
//    float32Precision() hashes up to three keys of a string-free but hashed map per call). The
//    members are private: they are named through explicit template instantiation, the one
//    place the language does not check access. This is sound only against the exact headers
//    torch was built from: the adapter is compiled against the installed torch's headers and
//    _core refuses it under any other torch version (readers.cpp install_torch_adapter);
//    g_ctx_ok additionally requires each direct read to equal its accessor at load.
//  - the thread-locals torch keeps per thread (grad mode, torch-function state, the dispatch
//    key sets) through their addresses, looked up once per thread (ThreadLocals below) instead
//    of through one out-of-line call and one __tls_get_addr per field per check.
// read_global_state (snapshots and failure reasons) keeps torch's accessors.

using Fp32Key = std::pair<at::Float32Backend, at::Float32Op>;
using Fp32Map = std::unordered_map<Fp32Key, at::Float32Precision, c10::hash<Fp32Key>>;
struct CtxDeterministic {
    using type = bool at::Context::*;
    friend type member_of(CtxDeterministic);
};
struct CtxWarnOnly {
    using type = bool at::Context::*;
    friend type member_of(CtxWarnOnly);
};
struct CtxFp16 {
    using type = at::CuBLASReductionOption at::Context::*;
    friend type member_of(CtxFp16);
};
struct CtxBf16 {
    using type = at::CuBLASReductionOption at::Context::*;
    friend type member_of(CtxBf16);
};
struct CtxFp32 {
    using type = Fp32Map at::Context::*;
    friend type member_of(CtxFp32);
};
struct TfDisabled {
    using type = at::impl::TorchFunctionDisabledState at::impl::PythonTorchFunctionTLS::*;
    friend type member_of(TfDisabled);
};
template struct PrivateMember<CtxDeterministic, &at::Context::_deterministic_algorithms>;
template struct PrivateMember<CtxWarnOnly, &at::Context::_deterministic_algorithms_warn_only>;
template struct PrivateMember<CtxFp16, &at::Context::allow_fp16_reduction_cublas>;
template struct PrivateMember<CtxBf16, &at::Context::allow_bf16_reduction_cublas>;
template struct PrivateMember<CtxFp32, &at::Context::fp32_precision>;
template struct PrivateMember<TfDisabled, &at::impl::PythonTorchFunctionTLS::disabled_state_>;

// The process-wide context and the three precision entries float32Precision(CUDA, MATMUL) reads.
// Pointers to an unordered_map's elements stay valid until the element is erased (rehashing
// moves no node), and torch only ever assigns these entries. Null (g_ctx_ok false) when any
// direct read disagreed with its accessor at load: then the accessors are used.
at::Context* g_ctx = nullptr;
const at::Float32Precision* g_fp32_cuda_matmul = nullptr;
const at::Float32Precision* g_fp32_cuda_all = nullptr;
const at::Float32Precision* g_fp32_generic_all = nullptr;
bool g_ctx_ok = false;

// float32Precision(CUDA, MATMUL) == TF32, as torch 2.13's Context::float32Precision computes it
// (read from its compiled code: an entry NONE falls back to the backend's ALL entry, then to
// GENERIC's; DEFAULT falls back to the first of those that is neither NONE nor DEFAULT, else
// means TF32; CUDA has no BF16). Pinned against torch by
// test_torch_state.py::test_tf32_reading_follows_torch over every settable combination.
inline bool cuda_matmul_tf32_direct() {
    using P = at::Float32Precision;
    P p = *g_fp32_cuda_matmul;
    if (p == P::DEFAULT) {
        const P a = *g_fp32_cuda_all;
        if (a != P::NONE && a != P::DEFAULT) {
            p = a;
        } else {
            const P g = *g_fp32_generic_all;
            p = g != P::NONE && g != P::DEFAULT ? g : P::TF32;
        }
    } else if (p == P::NONE) {
        p = *g_fp32_cuda_all;
        if (p == P::NONE) p = *g_fp32_generic_all;
    }
    return p == P::TF32;  // CUDA's BF16 reads as NONE: not TF32 either way
}

bool cuda_matmul_tf32_accessor() {
    return at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
           at::Float32Precision::TF32;
}

void bind_context() {
    at::Context& ctx = at::globalContext();
    Fp32Map& map = ctx.*member_of(CtxFp32{});
    const auto entry = [&map](at::Float32Backend b, at::Float32Op op) -> const at::Float32Precision* {
        const auto it = map.find({b, op});
        return it == map.end() ? nullptr : &it->second;
    };
    g_fp32_cuda_matmul = entry(at::Float32Backend::CUDA, at::Float32Op::MATMUL);
    g_fp32_cuda_all = entry(at::Float32Backend::CUDA, at::Float32Op::ALL);
    g_fp32_generic_all = entry(at::Float32Backend::GENERIC, at::Float32Op::ALL);
    g_ctx = &ctx;
    g_ctx_ok = g_fp32_cuda_matmul != nullptr && g_fp32_cuda_all != nullptr && g_fp32_generic_all != nullptr &&
               ctx.*member_of(CtxDeterministic{}) == ctx.deterministicAlgorithms() &&
               ctx.*member_of(CtxWarnOnly{}) == ctx.deterministicAlgorithmsWarnOnly() &&
               ctx.*member_of(CtxFp16{}) == ctx.allowFP16ReductionCuBLAS() &&
               ctx.*member_of(CtxBf16{}) == ctx.allowBF16ReductionCuBLAS() &&
               cuda_matmul_tf32_direct() == cuda_matmul_tf32_accessor();
}

// One thread's torch thread-locals, by address. torch's thread_local objects never move while
// their thread lives (assignment keeps the address), so the addresses are looked up once per
// thread and reused while the same thread checks again. The cache holds one thread: it is
// keyed by the thread pointer, unique among live threads; a thread that looked them up clears
// the cache when it exits (ThreadExit, a thread_local destructor, which runs before the thread's
// TLS and its thread control block can be reused), and a forked child clears it (only the
// forking thread survives; another thread's control block may be reused there). Read and
// written only under the GIL, except the clearing at thread exit, which is one compare-exchange
// on `owner` (a thread clears only its own entry, which no other thread then uses).
struct ThreadLocals {
    std::atomic<std::uintptr_t> owner{0};
    const c10::AutogradState* autograd = nullptr;
    const at::impl::PythonTorchFunctionTLS* torch_function = nullptr;
    const c10::impl::PODLocalDispatchKeySet* dispatch = nullptr;
    // at::get_num_threads() is `lazy_init_num_threads(); return omp_get_max_threads();` in torch
    // 2.13's OpenMP build (ParallelOpenMP.cpp; its compiled code reads exactly that). The lazy
    // initialisation sets a per-thread flag that is never cleared, so once this thread has
    // called it (when its entry is filled), omp_get_max_threads() alone returns the same value,
    // without the __tls_get_addr of the flag. True when the two agreed at that moment.
    bool omp_threads = false;
    // at::autocast's cache flag in this thread's TLS block of libtorch_cpu (AutocastCacheFlag
    // below), or null: then is_autocast_cache_enabled() reads it.
    const bool* autocast_cache = nullptr;
    // The saved-tensor default hooks (get_tls_state() returns this thread's thread_local by
    // reference; set_tls_state assigns it in place).
    const at::impl::SavedTensorDefaultHooksTLS* saved_hooks = nullptr;
};
ThreadLocals g_tls;

// -- The autocast cache flag ----------------------------------------------------------------------
//
// is_autocast_cache_enabled() reads `thread_local bool cache_enabled` of an anonymous namespace in
// libtorch_cpu (autocast_mode.cpp): an out-of-line call and a __tls_get_addr on every check (18
// instructions of the ~115 the global state cost). No header names the variable, so its place in
// libtorch_cpu's TLS block is found once, by experiment, when the adapter loads: the bytes of this
// thread's block (dlinfo RTLD_DI_TLS_DATA) are compared before and after torch's own setter flips
// the flag and after it restores it; the flag is the one byte that changes, holding the accessor's
// value in both states, with nothing else changed. Each thread's block then holds its flag at that
// offset (one TLS image for every thread). When anything disagrees (no TLS segment, more than one
// byte changed, a value that is not the flag's), offset stays -1 and the accessor is used.
struct AutocastCacheFlag {
    void* library = nullptr;  // libtorch_cpu's handle (RTLD_NOLOAD: already loaded by torch)
    std::ptrdiff_t offset = -1;
};
AutocastCacheFlag g_cache_flag;

std::size_t tls_segment_size(std::size_t modid) {
    std::pair<std::size_t, std::size_t> q{modid, 0};
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
            auto* q = static_cast<std::pair<std::size_t, std::size_t>*>(data);
            if (info->dlpi_tls_modid != q->first) return 0;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                if (info->dlpi_phdr[i].p_type == PT_TLS) q->second = info->dlpi_phdr[i].p_memsz;
            }
            return 1;
        },
        &q);
    return q.second;
}

// This thread's TLS block of libtorch_cpu (allocated by the accessor call first), or null.
unsigned char* torch_cpu_tls_block() {
    (void)at::autocast::is_autocast_cache_enabled();
    void* block = nullptr;
    if (g_cache_flag.library == nullptr || dlinfo(g_cache_flag.library, RTLD_DI_TLS_DATA, &block) != 0)
        return nullptr;
    return static_cast<unsigned char*>(block);
}

void find_autocast_cache_flag() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&at::autocast::is_autocast_cache_enabled), &info) == 0 ||
        info.dli_fname == nullptr)
        return;
    g_cache_flag.library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    std::size_t modid = 0;
    if (g_cache_flag.library == nullptr || dlinfo(g_cache_flag.library, RTLD_DI_TLS_MODID, &modid) != 0 ||
        modid == 0)
        return;
    const std::size_t size = tls_segment_size(modid);
    unsigned char* block = torch_cpu_tls_block();
    if (size == 0 || block == nullptr) return;
    const bool was = at::autocast::is_autocast_cache_enabled();
    const std::vector<unsigned char> before(block, block + size);
    at::autocast::set_autocast_cache_enabled(!was);
    const std::vector<unsigned char> flipped(block, block + size);
    const bool now = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(was);
    const std::vector<unsigned char> after(block, block + size);
    if (now == was || before != after) return;
    std::ptrdiff_t at = -1;
    for (std::size_t i = 0; i < size; ++i) {
        if (before[i] == flipped[i]) continue;
        if (at != -1) return;  // more than one byte changed
        at = static_cast<std::ptrdiff_t>(i);
    }
    if (at < 0 || before[at] != (was ? 1 : 0) || flipped[at] != (now ? 1 : 0)) return;
    g_cache_flag.offset = at;
}

std::uintptr_t thread_pointer() {
#if defined(__x86_64__) && defined(__linux__)
    std::uintptr_t tp = 0;
    asm("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#elif defined(__aarch64__)
    return reinterpret_cast<std::uintptr_t>(__builtin_thread_pointer());
#else
    return 0;  // no cache: every check looks the thread-locals up
#endif
}

// Set when this thread's ThreadExit ran: Python code run by a later thread_local destructor
// (torch's mode stack drops its modes) may still check guards on this thread; it must not refill
// the cache, which nothing would clear afterwards. Trivially destructible, so readable until the
// thread's TLS is freed.
thread_local bool t_exiting = false;

struct ThreadExit {
    bool armed = false;
    ~ThreadExit() {
        t_exiting = true;
        std::uintptr_t me = thread_pointer();
        if (me != 0) g_tls.owner.compare_exchange_strong(me, 0);
    }
};
thread_local ThreadExit t_exit;

void forget_thread_locals() { g_tls.owner.store(0); }

// The lookup when the cache holds another thread (or none). Out of line: kept out of the callers'
// hot code, which is then only the thread-pointer comparison of thread_locals().
[[gnu::noinline]] const ThreadLocals& refill_thread_locals(std::uintptr_t me) {
    g_tls.owner.store(0);
    g_tls.autograd = &c10::AutogradState::get_tls_state();
    g_tls.torch_function = &at::impl::PythonTorchFunctionTLS::get_state();
    g_tls.dispatch = &c10::impl::raw_local_dispatch_key_set;
    g_tls.saved_hooks = &at::SavedTensorDefaultHooks::get_tls_state();
#if AT_PARALLEL_OPENMP
    g_tls.omp_threads = at::get_num_threads() == omp_get_max_threads();
#endif
    g_tls.autocast_cache = nullptr;
    if (g_cache_flag.offset >= 0) {
        unsigned char* block = torch_cpu_tls_block();
        const bool* flag =
            block != nullptr ? reinterpret_cast<const bool*>(block + g_cache_flag.offset) : nullptr;
        // The same reading as the accessor's on this thread, or the accessor stays.
        if (flag != nullptr && *flag == at::autocast::is_autocast_cache_enabled())
            g_tls.autocast_cache = flag;
    }
    if (me != 0 && !t_exiting) {
        t_exit.armed = true;  // constructs this thread's ThreadExit: its destructor clears the entry
        g_tls.owner.store(me);
    }
    return g_tls;  // uncached (owner 0): valid for this call, on this thread, under the GIL
}

// This thread's entry, looked up now if the cache holds another thread's. Inlined into both callers
// (global_state_matches, saved_tensors_hooks_top): as a call, the global state measured 138
// instructions per check instead of 128 (bench/global_state_instructions.py).
[[gnu::always_inline]] inline const ThreadLocals& thread_locals() {
    const std::uintptr_t me = thread_pointer();
    if (me != 0 && g_tls.owner.load(std::memory_order_relaxed) == me) return g_tls;
    return refill_thread_locals(me);
}

}  // namespace

int global_state_matches(const TwGlobalState* want) noexcept {
    namespace L = ts_layout;
    const auto& devices = at::autocast::_AUTOCAST_SUPPORTED_DEVICES;
    const int n = static_cast<int>(devices.size());
    // header[kDevices] equals n_devices: the core compiles both from one snapshot (torch_state.cpp).
    if (want->n_devices != n) return 0;
    try {
        const int64_t* h = want->header;
        // Thread-local state first, then the process-wide context.
        const ThreadLocals& tls = thread_locals();
        if (h[L::kGradMode] != (tls.autograd->get_grad_mode() ? 1 : 0)) return 0;
        const auto tf = tls.torch_function->*member_of(TfDisabled{});
        if (h[L::kTorchFunction] != (tf == at::impl::TorchFunctionDisabledState::ENABLED ? 1 : 0)) return 0;
        if (h[L::kTorchFunctionAllDisabled] !=
            (tf == at::impl::TorchFunctionDisabledState::ALL_DISABLED ? 1 : 0))
            return 0;
        const bool cache_enabled =
            tls.autocast_cache != nullptr ? *tls.autocast_cache : at::autocast::is_autocast_cache_enabled();
        if (h[L::kCacheEnabled] != (cache_enabled ? 1 : 0)) return 0;
        const c10::DispatchKeySet excluded = tls.dispatch->excluded();
        uint64_t enabled = 0;
        if ((excluded.raw_repr() & g_all_autocast_bits) != g_all_autocast_bits) {  // some device enabled
            for (int i = 0; i < n; ++i) {
                if (!excluded.has(g_autocast_keys[i])) enabled |= uint64_t{1} << i;
            }
        }
        if (enabled != want->autocast_enabled_mask) return 0;
        for (int i = 0; enabled != 0 && i < n; ++i) {
            if (((enabled >> i) & 1) != 0 &&
                want->dtypes[i] != static_cast<int32_t>(at::autocast::get_autocast_dtype(devices[i])))
                return 0;
        }
        if (h[L::kDefaultDtype] != static_cast<int64_t>(c10::get_default_dtype_as_scalartype())) return 0;
#if AT_PARALLEL_OPENMP
        if (h[L::kNumThreads] != (tls.omp_threads ? omp_get_max_threads() : at::get_num_threads())) return 0;
#else
        if (h[L::kNumThreads] != at::get_num_threads()) return 0;
#endif
        if (!g_ctx_ok) {
            auto& ctx = at::globalContext();
            if (h[L::kDeterministic] != (ctx.deterministicAlgorithms() ? 1 : 0)) return 0;
            if (h[L::kWarnOnly] != (ctx.deterministicAlgorithmsWarnOnly() ? 1 : 0)) return 0;
            if (h[L::kFp16] != static_cast<int64_t>(ctx.allowFP16ReductionCuBLAS())) return 0;
            if (h[L::kBf16] != static_cast<int64_t>(ctx.allowBF16ReductionCuBLAS())) return 0;
            return h[L::kAllowTf32] == (cuda_matmul_tf32_accessor() ? 1 : 0) ? 1 : 0;
        }
        const at::Context& ctx = *g_ctx;
        if (h[L::kDeterministic] != (ctx.*member_of(CtxDeterministic{}) ? 1 : 0)) return 0;
        if (h[L::kWarnOnly] != (ctx.*member_of(CtxWarnOnly{}) ? 1 : 0)) return 0;
        if (h[L::kFp16] != static_cast<int64_t>(ctx.*member_of(CtxFp16{}))) return 0;
        if (h[L::kBf16] != static_cast<int64_t>(ctx.*member_of(CtxBf16{}))) return 0;
        return h[L::kAllowTf32] == (cuda_matmul_tf32_direct() ? 1 : 0) ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

int64_t function_mode_stack_len() noexcept { return at::impl::PythonTorchFunctionTLS::stack_len(); }

PyObject* function_mode_at(int64_t i) noexcept {
    try {
        if (i < 0 || i >= at::impl::PythonTorchFunctionTLS::stack_len()) return nullptr;
        return at::impl::PythonTorchFunctionTLS::get_stack_at(i)->ptr(getPyInterpreter());
    } catch (...) {
        return nullptr;
    }
}

int saved_tensors_hooks_top(PyObject** pack, PyObject** unpack) noexcept {
    try {
        // get_tls_state() returns the thread-local by reference (its address is cached per thread
        // with the others, ThreadLocals): no copy of the stack and no incref through the
        // interpreter (get_hooks() would copy the pair). A non-empty stack
        // implies torch initialized the hooks (push_hooks asserts it), so this reads what
        // get_hooks(/*ignore_is_tracing=*/true) returns.
        const auto& stack = thread_locals().saved_hooks->stack;
        if (stack.empty()) return 0;
        const auto& top = stack.top();
        *pack = top.first.ptr(getPyInterpreter());
        *unpack = top.second.ptr(getPyInterpreter());
        return 1;
    } catch (...) {
        return -1;  // never "empty": the caller falls back to the Python reader
    }
}

void load_global_state() noexcept {
    for (std::size_t i = 0; i < g_autocast_keys.size(); ++i) {
        g_autocast_keys[i] = at::autocast::get_autocast_dispatch_key_from_device_type(
            at::autocast::_AUTOCAST_SUPPORTED_DEVICES[i]);
        g_all_autocast_bits |= c10::DispatchKeySet(g_autocast_keys[i]).raw_repr();
    }
    try {
        bind_context();
    } catch (...) {
        g_ctx_ok = false;  // the accessors then read the context
    }
    try {
        find_autocast_cache_flag();
    } catch (...) {
        g_cache_flag.offset = -1;  // the accessor reads it
    }
    pthread_atfork(nullptr, nullptr, forget_thread_locals);
}

std::ptrdiff_t autocast_cache_flag_offset() noexcept { return g_cache_flag.offset; }

}  // namespace tripwire::torch_adapter
