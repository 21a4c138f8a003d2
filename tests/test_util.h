// Helpers shared by the data-layer tests: a scratch directory, raw file I/O, and running
// Debian's python3 to make real files with numpy / torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace recal::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(absl::string_view name) const;
  std::vector<std::string> List() const;  // file names, sorted

 private:
  std::string path_;
};

// What a program run to its end left: exit code (128 + signal if killed), stdout, stderr.
struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `binary` (a path, or a name looked up on PATH) with `args` (no shell), RECAL_SERVER /
// RECAL_TOKEN unset unless given in `env` ("NAME=value").
Result RunBinary(const std::string& binary, const std::vector<std::string>& args,
                 const std::vector<std::string>& env = {});

void WriteBytes(const std::string& path, absl::string_view bytes);
std::string ReadBytes(const std::string& path);

// Runs `script` with RECAL_PYTHON; the script gets the directory as sys.argv[1]. Returns
// the exit status (0 = success).
int RunPython(const std::string& script, const std::string& dir);
// RunPython with tests/fixtures first on sys.path: its modules (exported_programs, reference,
// image_folders, ...) import by name.
int RunFixturesPython(const std::string& script, const std::string& dir);

// Small image folders for image-folder jobs, made by tests/fixtures/image_folders.py with
// RECAL_PYTHON and PIL; returns RunPython's status. Under `dir`:
//   root/imgs/      kImageFolderImages JPEGs and PNGs, 30 to 120 pixels a side, RGB, gray,
//                   RGBA and palette, in nested folders, and a .txt file (not an image file)
//   root/with_bad/  the same plus c/x.jpg, a text file
//   outside/imgs/   the same as root/imgs (for a folder outside the data root `dir`/root)
inline constexpr int64_t kImageFolderImages = 6;  // image_folders.IMAGES
int MakeImageFolders(const std::string& dir);

// Little-endian bytes of a vector of trivially copyable values.
template <typename T>
std::string BytesOf(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The same bytes, viewed in place (for SafetensorsEntry, which does not own its bytes).
template <typename T>
absl::string_view ViewOf(const std::vector<T>& v) {
  return absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A .npy file: magic, version, header dict (padded so the data is 64-byte aligned), data.
std::string NpyFile(absl::string_view dict, absl::string_view data, int major_version = 1);

}  // namespace recal::testing
