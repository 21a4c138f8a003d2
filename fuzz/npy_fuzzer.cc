// .npy files: the header parser (common/formats/npy.cc) on arbitrary bytes, then, for a file
// that parses, the data source the server reads it with (server/data/npy_source.cc: the file
// memory-mapped, a tensor view of its data, batches sliced along dim 0 and copied).
//
// Contract: garbage is refused with a message; a header that parses describes a dense C-order
// array whose data lies inside the file (offset past the header, size = product(shape) x
// element size); its batches hold exactly the file's bytes, in order.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include <ATen/Parallel.h>

#include "common/formats/dtype.h"
#include "common/formats/npy.h"
#include "fuzz/fuzz_util.h"
#include "server/data/sources.h"
#include "server/data/torch_dtype.h"

namespace {

using recal::fuzz::CheckRefusal;
namespace formats = recal::formats;

void CheckSlices(absl::string_view file, const formats::NpyHeader& header, int64_t batch_size) {
  const std::string path = recal::fuzz::ScratchDir() + "/input.npy";
  recal::fuzz::WriteFileOrDie(path, file);
  auto source = recal::data::OpenNpySource(path, batch_size);
  if (header.shape.empty()) {  // a 0-d array has no batch dimension
    CheckRefusal(source.status(), "a 0-d array as a data source");
    return;
  }
  FUZZ_CHECK(source.ok(), "a parsed .npy file does not open: ", source.status().ToString());
  const int64_t samples = header.shape[0];
  FUZZ_CHECK((*source)->num_samples() == samples, "num_samples");
  const int64_t row_bytes = samples == 0 ? 0 : header.data_size / samples;
  int64_t cursor = 0;
  for (int batches = 0; batches < 4; ++batches) {
    auto batch = (*source)->Next();
    FUZZ_CHECK(batch.ok(), "Next(): ", batch.status().ToString());
    if (!batch->has_value()) {
      FUZZ_CHECK(cursor == samples, "the source ended after ", cursor, " of ", samples, " samples");
      return;
    }
    FUZZ_CHECK(cursor < samples, "a batch past the end");
    const int64_t n = std::min(batch_size, samples - cursor);
    FUZZ_CHECK((*batch)->size() == 1, "one input per batch");
    const at::Tensor& t = (**batch)[0];
    FUZZ_CHECK(t.scalar_type() == recal::data::ToScalarType(header.dtype), "dtype");
    FUZZ_CHECK(t.is_contiguous(), "a batch must be contiguous");
    FUZZ_CHECK(t.dim() == static_cast<int64_t>(header.shape.size()) && t.size(0) == n, "batch shape");
    for (size_t d = 1; d < header.shape.size(); ++d) FUZZ_CHECK(t.size(d) == header.shape[d], "dim ", d);
    FUZZ_CHECK(static_cast<int64_t>(t.nbytes()) == n * row_bytes, "batch bytes");
    const char* expected = file.data() + header.data_offset + cursor * row_bytes;
    if (header.dtype == formats::DType::kBool) {
      // Bytes other than 0 and 1 are true (as numpy reads them); the copy may store them as 1.
      const auto* got = static_cast<const unsigned char*>(t.data_ptr());
      for (int64_t i = 0; i < n * row_bytes; ++i) {
        FUZZ_CHECK((got[i] != 0) == (expected[i] != 0), "bool element ", i, " of the batch at sample ", cursor);
      }
    } else if (n * row_bytes > 0) {
      FUZZ_CHECK(std::memcmp(t.data_ptr(), expected, static_cast<size_t>(n * row_bytes)) == 0,
                 "batch data differs from the file's bytes at sample ", cursor);
    }
    cursor += n;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto header = formats::ParseNpyHeader(bytes);
  auto file = formats::ParseNpyFile(bytes);
  if (!header.ok()) {
    CheckRefusal(header.status(), "ParseNpyHeader");
    CheckRefusal(file.status(), "ParseNpyFile of a file whose header does not parse");
    return 0;
  }
  FUZZ_CHECK(header->major_version >= 1 && header->major_version <= 3 && header->minor_version == 0, "version");
  FUZZ_CHECK(!header->fortran_order, "a Fortran-order header parsed");
  FUZZ_CHECK(header->data_offset >= 10 && static_cast<uint64_t>(header->data_offset) <= size,
             "data_offset ", header->data_offset, " outside the ", size, "-byte input");
  auto dense = formats::DenseByteSize(header->shape, header->dtype);
  FUZZ_CHECK(dense.ok() && *dense == header->data_size, "data_size ", header->data_size);
  for (int64_t d : header->shape) FUZZ_CHECK(d >= 0, "negative dim");

  if (!file.ok()) {
    CheckRefusal(file.status(), "ParseNpyFile");
    FUZZ_CHECK(size - static_cast<uint64_t>(header->data_offset) < static_cast<uint64_t>(header->data_size),
               "a file with all its data refused: ", file.status().ToString());
    return 0;
  }
  // The data slice lies inside the input.
  FUZZ_CHECK(static_cast<uint64_t>(file->data_offset) + static_cast<uint64_t>(file->data_size) <= size,
             "data [", file->data_offset, ", +", file->data_size, ") past the ", size, "-byte input");
  FUZZ_CHECK(file->data_offset == header->data_offset && file->shape == header->shape &&
                 file->dtype == header->dtype && file->descr == header->descr,
             "ParseNpyFile and ParseNpyHeader disagree");
  CheckSlices(bytes, *file, 1 + data[size - 1] % 3);
  return 0;
}
