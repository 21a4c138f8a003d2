// The driver of the <target>_replay binaries of the default build (any compiler, no
// libFuzzer): runs a fuzz target's LLVMFuzzerTestOneInput on every file given, and on every
// file under every directory given (recursively, in sorted order), so that the inputs kept
// under fuzz/regressions/<target>/ and fuzz/corpus/<target>/ are tested by ctest without
// clang. A contract violation aborts (the failing file is printed first); a missing
// directory counts as empty (a target with no regressions yet has none).
//
//   npy_replay fuzz/regressions/npy fuzz/corpus/npy
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    std::error_code error;
    if (fs::is_directory(arg, error)) {
      for (const auto& entry : fs::recursive_directory_iterator(arg)) {
        if (entry.is_regular_file() && entry.path().filename().string()[0] != '.') files.push_back(entry.path());
      }
    } else if (fs::exists(arg, error)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s does not exist: no inputs there\n", argv[i]);
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
      return 2;
    }
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.c_str(), bytes.size());
    // A copy of its own, so that ASan (when the build has it) sees reads past the input.
    std::vector<uint8_t> copy(bytes.begin(), bytes.end());
    LLVMFuzzerTestOneInput(copy.data(), copy.size());
  }
  std::fprintf(stderr, "replay: %zu inputs, all passed\n", files.size());
  return 0;
}
