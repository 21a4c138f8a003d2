// The safetensors format: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"k": "v"}}, then the raw little-endian tensor bytes. Offsets are
// relative to the end of the header.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/formats/dtype.h"

namespace recal::formats {

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // byte range in the data section (after the header)
  int64_t end = 0;
};

struct SafetensorsHeader {
  int64_t data_offset = 0;                     // bytes from the start of the file to the data section
  std::vector<SafetensorsTensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;  // "__metadata__" (string values only)

  const SafetensorsTensorInfo* Find(absl::string_view name) const;
};

// Parses and validates the header of a whole safetensors file: every entry's dtype is
// known, its byte range lies inside the file, matches product(shape) * element size, and
// no two ranges overlap. Messages do not name the file: callers add it.
absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file);

// For a file read by ranges (an object in a bucket), where only its start is in memory:
// how many bytes from the start the header takes (8 + the declared JSON length, within the
// 100 MiB limit), from the first 8 bytes of `prefix`.
absl::StatusOr<int64_t> SafetensorsHeaderSize(absl::string_view prefix);
// ParseSafetensors for a file of `file_size` bytes of which `header` holds the first
// SafetensorsHeaderSize() or more.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view header, int64_t file_size);

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "F64", "BF16", ...
  std::vector<int64_t> shape;
  absl::string_view bytes;  // dense, row-major, little-endian; not owned
};

// Writes `entries` (unique, non-empty names, not "__metadata__") as a safetensors file,
// atomically (common/atomic_file.h). The header lists tensors sorted by name, after
// "__metadata__" when `metadata` is not empty, and is padded with spaces to a multiple of 8
// bytes. Tensor data is laid out largest element size first, then by name, so every tensor
// is aligned to its element size (as the reference implementation does).
absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace recal::formats
