// tripwire/tests/fuzz/replay_main.cpp -- run a fuzz target without libFuzzer, as a plain test.
//
//   fuzz_program_replay [FILE_OR_DIR...] [--random N] [--seed S]
// Feeds every file (directories: every file inside, sorted) to LLVMFuzzerTestOneInput, then N
// pseudo-random inputs (default 20000) from a fixed seed. A bug aborts; success prints a summary.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::size_t run_file(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    return 1;
}

}  // namespace

int main(int argc, char** argv) {
    long n_random = 20000;
    unsigned long seed = 20240601;
    std::size_t n_files = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--random" && i + 1 < argc) {
            n_random = std::strtol(argv[++i], nullptr, 10);
        } else if (arg == "--seed" && i + 1 < argc) {
            seed = std::strtoul(argv[++i], nullptr, 10);
        } else if (std::filesystem::is_directory(arg)) {
            std::vector<std::filesystem::path> files;
            for (const auto& e : std::filesystem::directory_iterator(arg)) {
                if (e.is_regular_file()) files.push_back(e.path());
            }
            std::sort(files.begin(), files.end());
            for (const auto& p : files) n_files += run_file(p);
        } else if (std::filesystem::is_regular_file(arg)) {
            n_files += run_file(arg);
        } else {
            std::fprintf(stderr, "replay: no such file or directory: %s\n", arg.c_str());
            return 2;
        }
    }
    std::mt19937_64 rng(seed);
    std::vector<std::uint8_t> buf;
    for (long i = 0; i < n_random; ++i) {
        buf.resize(rng() % 512);
        for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
        // Bias some bytes towards the decoder's "well-formed" branches: clear the high bit.
        if (i % 2 == 0) {
            for (auto& b : buf) b &= 0x7F;
        }
        LLVMFuzzerTestOneInput(buf.data(), buf.size());
    }
    std::printf("replay: %zu files, %ld random inputs (seed %lu): no failures\n", n_files, n_random, seed);
    return 0;
}
