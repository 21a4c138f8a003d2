// PT2 archives (torch.export.save; an upload's bytes, the input) as a load reads them:
// Pt2Archive::Read (server/engine/exported/pt2_archive.cc: the zip's directory through
// LibTorch's PyTorchStreamReader, archive_format, byteorder, the program's JSON, the weights'
// and constants' configs, every record's size against the archive), then every weight and
// constant as a tensor (Load, through one RecordCache as LoadExportedModel does), then what a
// finished job writes: the same archive with those tensors (WithTensors), read back as
// ExportedModel::CheckReloads reads it; and the archive folded (fold_batch_norm.cc: its
// program's JSON edited), read back.
//
// Contract: garbage is refused with INVALID_ARGUMENT and a message, never an exception, a
// crash or a read past the input; an archive that opens holds one program (a JSON object);
// each tensor that loads has the dtype, sizes and strides its config states; the archive
// WithTensors writes reads back with the same weights and constants, holding the same bytes.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "fuzz/fuzz_util.h"
#include "server/engine/exported/fold_batch_norm.h"
#include "server/engine/exported/pt2_archive.h"
#include "server/engine/model_file.h"

namespace {

using recal::engine::exported::Pt2Archive;
using recal::engine::exported::StoredTensor;
using recal::fuzz::CheckRefusal;

// The tensor's elements as integers of its element size: compared bit for bit (a NaN equals
// itself). nullopt for complex dtypes, which LibTorch does not view as integers.
std::optional<at::Tensor> Bits(const at::Tensor& t) {
  if (t.is_complex()) return std::nullopt;
  switch (t.element_size()) {
    case 1: return t.view(at::kByte);
    case 2: return t.view(at::kShort);
    case 4: return t.view(at::kInt);
    case 8: return t.view(at::kLong);
    default: return std::nullopt;
  }
}

// The tensors of `archive` (weights and constants) that load, by name; refusals checked. A
// constant named like a weight is left out: Find (what a load and WithTensors look up)
// gives the weight.
std::vector<std::pair<std::string, at::Tensor>> LoadAll(const Pt2Archive& archive) {
  std::vector<std::pair<std::string, at::Tensor>> loaded;
  Pt2Archive::RecordCache records;
  for (const auto* tensors : {&archive.weights(), &archive.constants()}) {
    for (const auto& [name, stored] : *tensors) {
      FUZZ_CHECK(stored.name == name && archive.Find(name) != nullptr, "Find(", name, ")");
      if (archive.Find(name) != &stored) continue;
      auto tensor = archive.Load(stored, &records);
      if (!tensor.ok()) {
        CheckRefusal(tensor.status(), "Load");
        FUZZ_CHECK(tensor.status().code() == absl::StatusCode::kInvalidArgument, tensor.status().ToString());
        continue;
      }
      FUZZ_CHECK(tensor->scalar_type() == stored.view.dtype, "dtype of ", name);
      FUZZ_CHECK(tensor->sizes() == at::IntArrayRef(stored.view.sizes), "sizes of ", name);
      FUZZ_CHECK(tensor->numel() == 0 || tensor->strides() == at::IntArrayRef(stored.view.strides), "strides of ", name);
      loaded.emplace_back(name, *tensor);
    }
  }
  return loaded;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto archive = Pt2Archive::Read(recal::engine::BytesReader(bytes), recal::engine::exported::ArchiveLimits{});
  if (!archive.ok()) {
    CheckRefusal(archive.status(), "Pt2Archive::Read");
    FUZZ_CHECK(archive.status().code() == absl::StatusCode::kInvalidArgument, archive.status().ToString());
    return 0;
  }
  FUZZ_CHECK(archive->program().is_object(), "the program is not a JSON object");
  const std::vector<std::pair<std::string, at::Tensor>> loaded = LoadAll(*archive);

  auto written = archive->WithTensors(loaded);
  if (!written.ok()) {  // a view the write cannot copy into (elements that overlap): a message
    CheckRefusal(written.status(), "WithTensors");
    return 0;
  }
  auto reread = Pt2Archive::Read(recal::engine::BytesReader(*written), recal::engine::exported::ArchiveLimits{});
  FUZZ_CHECK(reread.ok(), "what WithTensors wrote does not read back: ", reread.status().ToString());
  FUZZ_CHECK(reread->program() == archive->program(), "the program changed in the round trip");
  FUZZ_CHECK(reread->weights().size() == archive->weights().size() &&
                 reread->constants().size() == archive->constants().size(),
             "the tensors changed in the round trip");
  Pt2Archive::RecordCache records;
  for (const auto& [name, before] : loaded) {
    const StoredTensor* stored = reread->Find(name);
    FUZZ_CHECK(stored != nullptr, "the written archive lost ", name);
    auto after = reread->Load(*stored, &records);
    FUZZ_CHECK(after.ok(), "the written ", name, " does not load: ", after.status().ToString());
    auto a = Bits(before);
    auto b = Bits(*after);
    FUZZ_CHECK(a.has_value() == b.has_value() && (!a || at::equal(*a, *b)), "the bytes of ", name, " changed");
  }
  // Folding edits what it read: refused with a message, or an archive that reads back.
  auto folded = recal::engine::exported::FoldProgramBatchNorms(*archive);
  if (!folded.ok()) {
    CheckRefusal(folded.status(), "FoldProgramBatchNorms");
    return 0;
  }
  auto folded_archive = Pt2Archive::Read(recal::engine::BytesReader(folded->bytes), recal::engine::exported::ArchiveLimits{});
  FUZZ_CHECK(folded_archive.ok(), "the folded archive does not read back: ", folded_archive.status().ToString());
  FUZZ_CHECK(!folded->folded.empty(), "a fold that folded nothing");
  return 0;
}
