// tripwire/cpp/adapters/torch/hidden_symbol.hpp -- a hidden function of a loaded torch library.
//
// torch keeps some functions the guards need out of its dynamic symbol table (hidden visibility:
// dlsym cannot see them) while its ELF symbol table (.symtab) still names them. hidden_function
// finds one there for the library that holds a given exported object, and makes sure the file on
// disk is the object in memory. Only the adapter uses it (the one place torch's private parts are
// read); each caller verifies what it found against torch's public API before it is used.
#pragma once

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace hidden_symbol {

// A GNU build-id note's descriptor inside [notes, notes + size): pointer and length, or null.
inline const unsigned char* build_id_in(const unsigned char* notes, std::size_t size, std::size_t* len) {
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

inline int inspect_loaded(dl_phdr_info* info, std::size_t /*size*/, void* data) {
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

// The address of the function `name` (a mangled name) in the file `path` loaded at `bias`, or
// null. The file's symbol table is read from a private read-only mapping; every offset is
// bounds-checked against the file's size.
inline void* function_in_file(const char* path, ElfW(Addr) bias, const char* name) {
    const std::size_t name_size = std::strlen(name) + 1;
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
                    sym.st_name >= strtab.sh_size || strtab.sh_size - sym.st_name < name_size ||
                    std::memcmp(names + sym.st_name, name, name_size) != 0)
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
    void* found = nullptr;
    if (value != 0) {
        dl_iterate_phdr(inspect_loaded, &obj);
        const bool same_id = obj.build_id == nullptr
                                 ? file_id == nullptr
                                 : file_id != nullptr && file_id_len == obj.build_id_len &&
                                       std::memcmp(file_id, obj.build_id, file_id_len) == 0;
        // The symbol's value plus the load bias is the function's address (an integer by ELF's rules).
        // NOLINTNEXTLINE(performance-no-int-to-ptr)
        if (obj.seen && obj.executable && same_id) found = reinterpret_cast<void*>(bias + value);
    }
    munmap(file, size);
    return found;
}

/// The function named `mangled` in the ELF symbol table of the loaded library that holds the
/// exported object `anchor`, or null (no such symbol, a stripped library, a file on disk that is
/// not the object in memory). Unverified: the caller checks the function against torch's own.
inline void* hidden_function(const void* anchor, const char* mangled) {
    Dl_info info{};
    link_map* map = nullptr;
    if (dladdr1(anchor, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 || map == nullptr ||
        info.dli_fname == nullptr)
        return nullptr;
    return function_in_file(info.dli_fname, map->l_addr, mangled);
}

}  // namespace hidden_symbol
