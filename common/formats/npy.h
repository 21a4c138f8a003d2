// The .npy header (numpy's np.save format, versions 1.0, 2.0 and 3.0): magic, version,
// header length, then a Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': ...}.
// Only what maps to a dense little-endian C-order tensor is accepted; everything else is
// rejected with a message that says how to convert the array in numpy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/formats/dtype.h"

namespace recal::formats {

struct NpyHeader {
  int major_version = 0;
  int minor_version = 0;
  std::string descr;  // as written, e.g. "<f4"
  DType dtype = DType::kF32;
  bool fortran_order = false;  // always false in a header that parsed: Fortran order is rejected
  std::vector<int64_t> shape;  // empty for a 0-d array
  int64_t data_offset = 0;     // bytes from the start of the file to the first element
  int64_t data_size = 0;       // bytes of array data: product(shape) * element size
};

// Parses the header at the start of `bytes`, which may be just the header or the whole
// file. Does not look at the array data. Messages do not name the file: callers add it.
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes);

// ParseNpyHeader on a whole file, plus a check that the array data is all there.
absl::StatusOr<NpyHeader> ParseNpyFile(absl::string_view file);

// For a file read by ranges (an object in a bucket), where only its start is in memory:
// how many bytes from the start the header takes (data_offset), from the fixed prefix
// (magic, version, length) at the start of `prefix`, which needs at most 12 bytes.
absl::StatusOr<int64_t> NpyHeaderSize(absl::string_view prefix);
// ParseNpyFile for a file of `file_size` bytes of which `header` holds the first
// NpyHeaderSize() or more.
absl::StatusOr<NpyHeader> ParseNpyHeaderOfFile(absl::string_view header, int64_t file_size);

}  // namespace recal::formats
