// .safetensors files: the header parser (common/formats/safetensors.cc: length prefix, JSON
// through protobuf's parser, entries checked) on arbitrary bytes; for a file that parses, the
// data source the server reads it with (server/data/safetensors_source.cc: memory-mapped,
// tensor views, batches sliced along dim 0), and the writer (WriteSafetensors) round trip.
//
// Contract: garbage is refused with a message; a header that parses lists tensors sorted by
// name whose byte ranges lie inside the data section, do not overlap and match their shape and
// dtype; the batches hold exactly those bytes; what WriteSafetensors writes of them parses
// back to the same names, dtypes, shapes, bytes and metadata.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "common/formats/dtype.h"
#include "common/formats/safetensors.h"
#include "fuzz/fuzz_util.h"
#include "server/data/sources.h"
#include "server/data/torch_dtype.h"

namespace {

using recal::fuzz::CheckRefusal;
namespace formats = recal::formats;

absl::string_view DataOf(absl::string_view file, const formats::SafetensorsHeader& header,
                         const formats::SafetensorsTensorInfo& t) {
  return file.substr(static_cast<size_t>(header.data_offset + t.begin), static_cast<size_t>(t.end - t.begin));
}

void CheckSlices(absl::string_view file, const formats::SafetensorsHeader& header, int64_t batch_size) {
  const std::string path = recal::fuzz::ScratchDir() + "/input.safetensors";
  recal::fuzz::WriteFileOrDie(path, file);
  auto source = recal::data::OpenSafetensorsSource(path, {}, batch_size);
  bool servable = !header.tensors.empty();
  for (const auto& t : header.tensors) {
    servable = servable && !t.shape.empty() && t.shape[0] == header.tensors[0].shape[0];
  }
  if (!servable) {  // no tensors, a 0-d one, or dim 0 not shared
    CheckRefusal(source.status(), "tensors that cannot be batched");
    return;
  }
  FUZZ_CHECK(source.ok(), "a parsed safetensors file does not open: ", source.status().ToString());
  const int64_t samples = header.tensors[0].shape[0];
  int64_t cursor = 0;
  for (int batches = 0; batches < 4; ++batches) {
    auto batch = (*source)->Next();
    FUZZ_CHECK(batch.ok(), "Next(): ", batch.status().ToString());
    if (!batch->has_value()) {
      FUZZ_CHECK(cursor == samples, "the source ended after ", cursor, " of ", samples, " samples");
      return;
    }
    const int64_t n = std::min(batch_size, samples - cursor);
    FUZZ_CHECK(n > 0 && (*batch)->size() == header.tensors.size(), "batch inputs");
    for (size_t i = 0; i < header.tensors.size(); ++i) {
      const formats::SafetensorsTensorInfo& info = header.tensors[i];  // every tensor, sorted by name
      const at::Tensor& t = (**batch)[i];
      const int64_t row_bytes = (info.end - info.begin) / samples;
      FUZZ_CHECK(t.scalar_type() == recal::data::ToScalarType(info.dtype), "dtype of ", info.name);
      FUZZ_CHECK(t.dim() == static_cast<int64_t>(info.shape.size()) && t.size(0) == n, "shape of ", info.name);
      FUZZ_CHECK(t.is_contiguous() && static_cast<int64_t>(t.nbytes()) == n * row_bytes, "bytes of ", info.name);
      const char* expected = DataOf(file, header, info).data() + cursor * row_bytes;
      if (info.dtype == formats::DType::kBool) {
        // Bytes other than 0 and 1 are true; the copy may store them as 1.
        const auto* got = static_cast<const unsigned char*>(t.data_ptr());
        for (int64_t k = 0; k < n * row_bytes; ++k) {
          FUZZ_CHECK((got[k] != 0) == (expected[k] != 0), "bool element ", k, " of ", info.name);
        }
      } else if (n * row_bytes > 0) {
        FUZZ_CHECK(std::memcmp(t.data_ptr(), expected, static_cast<size_t>(n * row_bytes)) == 0,
                   "batch data of ", info.name, " differs from the file at sample ", cursor);
      }
    }
    cursor += n;
  }
}

void CheckRoundTrip(absl::string_view file, const formats::SafetensorsHeader& header) {
  std::vector<formats::SafetensorsEntry> entries;
  for (const auto& t : header.tensors) {
    entries.push_back({t.name, std::string(formats::SafetensorsDTypeName(t.dtype)), t.shape, DataOf(file, header, t)});
  }
  const std::string path = recal::fuzz::ScratchDir() + "/written.safetensors";
  absl::Status written = formats::WriteSafetensors(path, entries, header.metadata);
  if (!written.ok()) {
    // Only a name the writer cannot store (empty) may stop it.
    CheckRefusal(written, "WriteSafetensors");
    const bool empty_name = std::any_of(header.tensors.begin(), header.tensors.end(),
                                        [](const auto& t) { return t.name.empty(); });
    FUZZ_CHECK(empty_name, "WriteSafetensors refused a parsed file: ", written.ToString());
    return;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string back = ss.str();
  auto reparsed = formats::ParseSafetensors(back);
  FUZZ_CHECK(reparsed.ok(), "what WriteSafetensors wrote does not parse: ", reparsed.status().ToString());
  FUZZ_CHECK(reparsed->data_offset % 8 == 0, "the written header is not padded to 8 bytes");
  FUZZ_CHECK(reparsed->metadata == header.metadata, "metadata changed in the round trip");
  FUZZ_CHECK(reparsed->tensors.size() == header.tensors.size(), "tensor count changed in the round trip");
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const auto& a = header.tensors[i];
    const auto& b = reparsed->tensors[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape, "tensor ", i, " changed");
    FUZZ_CHECK(b.begin % formats::ElementSize(b.dtype) == 0, "tensor ", b.name, " is not aligned");
    FUZZ_CHECK(DataOf(file, header, a) == DataOf(back, *reparsed, b), "the bytes of ", a.name, " changed");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto header = formats::ParseSafetensors(bytes);
  if (!header.ok()) {
    CheckRefusal(header.status(), "ParseSafetensors");
    return 0;
  }
  FUZZ_CHECK(header->data_offset >= 8 && static_cast<uint64_t>(header->data_offset) <= size, "data_offset");
  const int64_t data_size = static_cast<int64_t>(size) - header->data_offset;
  int64_t previous_end = -1;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i < header->tensors.size(); ++i) {
    const auto& t = header->tensors[i];
    if (i > 0) FUZZ_CHECK(header->tensors[i - 1].name < t.name, "tensors not sorted by name");
    FUZZ_CHECK(header->Find(t.name) == &t, "Find(", t.name, ")");
    FUZZ_CHECK(t.name != "__metadata__", "__metadata__ as a tensor");
    FUZZ_CHECK(0 <= t.begin && t.begin <= t.end && t.end <= data_size,
               "tensor ", t.name, " [", t.begin, ", ", t.end, ") outside the ", data_size, "-byte data section");
    auto dense = formats::DenseByteSize(t.shape, t.dtype);
    FUZZ_CHECK(dense.ok() && *dense == t.end - t.begin, "size of ", t.name);
    ranges.emplace_back(t.begin, t.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (const auto& [begin, end] : ranges) {
    FUZZ_CHECK(begin >= previous_end || begin == end || previous_end < 0, "overlapping tensors");
    previous_end = std::max(previous_end, end);
  }
  CheckSlices(bytes, *header, 1 + data[size - 1] % 3);
  CheckRoundTrip(bytes, *header);
  return 0;
}
