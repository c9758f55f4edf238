// tripwire/cpp/runtime/tensors/mode_flag.cpp -- finding torch's hidden per-thread mode-flag getter.
#include "runtime/tensors/mode_flag.hpp"

#include <atomic>
#include <cstddef>
#include <cstring>

#if defined(__linux__)
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace tripwire::runtime {
namespace {

using ModeFlagGetter = bool (*)();
// Set once by find_torch_mode_flag (GIL held), read by every check.
std::atomic<ModeFlagGetter> g_getter{nullptr};
std::atomic<std::uint64_t> g_python_key_bits{0};
std::atomic<bool> g_hidden{false};

#if defined(__linux__)
constexpr char kGetter[] = "_ZN5torch6dynamo47get_is_in_mode_without_ignore_compile_internalsEv";
// Any exported symbol of libtorch_python.so names the file and its load bias (here a variable
// that the extension module torch._C links against).
constexpr char kAnchor[] = "THPVariableClass";

// A GNU build-id note's descriptor inside [notes, notes + size): pointer and length, or null.
const unsigned char* build_id_in(const unsigned char* notes, std::size_t size, std::size_t* len) {
    std::size_t at = 0;
    while (size - at >= sizeof(Elf64_Nhdr)) {
        Elf64_Nhdr nh{};
        std::memcpy(&nh, notes + at, sizeof nh);
        at += sizeof nh;
        const std::size_t name_sz = (std::size_t{nh.n_namesz} + 3U) & ~std::size_t{3};
        const std::size_t desc_sz = (std::size_t{nh.n_descsz} + 3U) & ~std::size_t{3};
        if (name_sz > size - at || desc_sz > size - at - name_sz) return nullptr;
        if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 && std::memcmp(notes + at, "GNU", 4) == 0) {
            *len = nh.n_descsz;
            return notes + at + name_sz;
        }
        at += name_sz + desc_sz;
    }
    return nullptr;
}

// What the loaded object (found by its load bias) says about itself: its build id and whether
// an address (relative to the bias) lies in one of its executable segments.
struct LoadedObject {
    ElfW(Addr) bias = 0;
    ElfW(Addr) symbol = 0;  // relative to the bias
    bool seen = false;
    bool executable = false;
    const unsigned char* build_id = nullptr;
    std::size_t build_id_len = 0;
};

int inspect_loaded(dl_phdr_info* info, std::size_t /*size*/, void* data) {
    auto* obj = static_cast<LoadedObject*>(data);
    if (info->dlpi_addr != obj->bias || info->dlpi_name == nullptr || info->dlpi_name[0] == '\0') return 0;
    obj->seen = true;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) != 0 && obj->symbol >= ph.p_vaddr &&
            obj->symbol - ph.p_vaddr < ph.p_memsz)
            obj->executable = true;
        if (ph.p_type == PT_NOTE && obj->build_id == nullptr) {
            // The loader maps the notes at the load bias plus their address: an address as an integer.
            // NOLINTNEXTLINE(performance-no-int-to-ptr)
            const auto* notes = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
            obj->build_id = build_id_in(notes, ph.p_memsz, &obj->build_id_len);
        }
    }
    return 1;
}

// The getter's address in the file `path` loaded at `bias`, or null. The file's symbol table is
// read from a private read-only mapping; every offset is bounds-checked against the file's size.
ModeFlagGetter getter_in_file(const char* path, ElfW(Addr) bias) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    void* file = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > static_cast<off_t>(sizeof(Elf64_Ehdr)))
        file = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (file == MAP_FAILED) return nullptr;
    const auto size = static_cast<std::size_t>(st.st_size);
    const auto* base = static_cast<const unsigned char*>(file);
    const auto in_file = [size](std::uint64_t off, std::uint64_t len) {
        return off <= size && len <= size - off;
    };
    Elf64_Ehdr eh{};
    std::memcpy(&eh, base, sizeof eh);
    ElfW(Addr) value = 0;
    const unsigned char* file_id = nullptr;
    std::size_t file_id_len = 0;
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 && eh.e_ident[EI_CLASS] == ELFCLASS64 &&
        eh.e_shentsize == sizeof(Elf64_Shdr) &&
        in_file(eh.e_shoff, std::uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr))) {
        const auto* sh = reinterpret_cast<const Elf64_Shdr*>(base + eh.e_shoff);
        for (unsigned i = 0; i < eh.e_shnum; ++i) {
            if (sh[i].sh_type == SHT_NOTE && file_id == nullptr && in_file(sh[i].sh_offset, sh[i].sh_size))
                file_id = build_id_in(base + sh[i].sh_offset, sh[i].sh_size, &file_id_len);
            if (value != 0 || sh[i].sh_type != SHT_SYMTAB || sh[i].sh_entsize != sizeof(Elf64_Sym) ||
                sh[i].sh_link >= eh.e_shnum)
                continue;
            const Elf64_Shdr& strtab = sh[sh[i].sh_link];
            if (!in_file(sh[i].sh_offset, sh[i].sh_size) || !in_file(strtab.sh_offset, strtab.sh_size))
                continue;
            const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + sh[i].sh_offset);
            const char* names = reinterpret_cast<const char*>(base + strtab.sh_offset);
            for (std::size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
                const Elf64_Sym& sym = syms[k];
                if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value == 0 ||
                    sym.st_name >= strtab.sh_size || strtab.sh_size - sym.st_name < sizeof(kGetter) ||
                    std::memcmp(names + sym.st_name, kGetter, sizeof(kGetter)) != 0)
                    continue;
                value = sym.st_value;
                break;
            }
        }
    }
    // The file on disk must be the object in memory (a library replaced after it was loaded has
    // other addresses): the same build id, and the symbol inside an executable segment.
    LoadedObject obj;
    obj.bias = bias;
    obj.symbol = value;
    ModeFlagGetter found = nullptr;
    if (value != 0) {
        dl_iterate_phdr(inspect_loaded, &obj);
        const bool same_id = obj.build_id == nullptr
                                 ? file_id == nullptr
                                 : file_id != nullptr && file_id_len == obj.build_id_len &&
                                       std::memcmp(file_id, obj.build_id, file_id_len) == 0;
        // The symbol's value plus the load bias is the function's address (an integer by ELF's rules).
        // NOLINTNEXTLINE(performance-no-int-to-ptr)
        if (obj.seen && obj.executable && same_id) found = reinterpret_cast<ModeFlagGetter>(bias + value);
    }
    munmap(file, size);
    return found;
}

ModeFlagGetter locate_getter(const char* module_path) {
    // The module is loaded (torch is imported): RTLD_NOLOAD only takes a reference to it, and its
    // handle's lookup scope holds the libtorch_python.so it was linked against.
    void* handle = dlopen(module_path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) return nullptr;
    void* anchor = dlsym(handle, kAnchor);
    Dl_info info{};
    link_map* map = nullptr;
    ModeFlagGetter found = nullptr;
    if (anchor != nullptr && dladdr1(anchor, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) != 0 &&
        map != nullptr && info.dli_fname != nullptr)
        found = getter_in_file(info.dli_fname, map->l_addr);
    dlclose(handle);  // the module stays loaded: Python holds its own reference
    return found;
}
#else
ModeFlagGetter locate_getter(const char*) { return nullptr; }
#endif

}  // namespace

bool find_torch_mode_flag(const char* module_path, PyObject* setter, std::uint64_t python_key_bits) {
    g_python_key_bits.store(python_key_bits, std::memory_order_relaxed);
    if (g_getter.load(std::memory_order_acquire) != nullptr) return true;
    if (module_path == nullptr || module_path[0] == '\0' || setter == nullptr || setter == Py_None)
        return false;
    const ModeFlagGetter get = locate_getter(module_path);
    if (get == nullptr) return false;
    // The getter must read the flag torch's setter sets: both ways, then the value put back.
    const bool was = get();
    bool ok = true;
    for (const bool v : {!was, was}) {
        PyObject* r = PyObject_CallOneArg(setter, v ? Py_True : Py_False);
        if (r == nullptr) PyErr_Clear();
        ok = ok && r != nullptr && get() == v;
        Py_XDECREF(r);
    }
    if (ok) g_getter.store(get, std::memory_order_release);
    return ok;
}

PythonKeyMask python_key_mask() {
    const ModeFlagGetter get = g_getter.load(std::memory_order_acquire);
    if (get == nullptr || g_hidden.load(std::memory_order_relaxed)) return PythonKeyMask::Unknown;
    return get() ? PythonKeyMask::Kept : PythonKeyMask::Masked;
}

std::uint64_t python_key_bits() { return g_python_key_bits.load(std::memory_order_relaxed); }

bool hide_torch_mode_flag(bool on) { return g_hidden.exchange(on, std::memory_order_relaxed); }

}  // namespace tripwire::runtime
