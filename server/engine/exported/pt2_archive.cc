#include "server/engine/exported/pt2_archive.h"

#include <limits>
#include <set>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/exported/serialized_types.h"
#include "server/engine/torch_error.h"

namespace recal::engine::exported {
namespace {

using caffe2::serialize::PyTorchStreamReader;
using caffe2::serialize::PyTorchStreamWriter;
using nlohmann::json;

constexpr char kModelsDir[] = "models/";
constexpr char kWeightsDir[] = "data/weights/";
constexpr char kConstantsDir[] = "data/constants/";
// Written by the writer of the new archive itself: a fresh id for a new archive.
constexpr char kSerializationId[] = ".data/serialization_id";

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("PT2 archive: ", what));
}

// Thrown by the parser's callback to stop at a nesting no program has (a JSON bomb).
struct TooDeep {};

// `stored`'s view of the bytes of its record, sharing them.
absl::StatusOr<at::Tensor> ViewOver(const at::Tensor& bytes, const StoredTensor& stored) {
  const TensorView& view = stored.view;
  if (absl::Status fits = CheckViewFits(stored.name, view, bytes.numel(), stored.record); !fits.ok()) {
    return Invalid(fits.message());
  }
  if (bytes.numel() % static_cast<int64_t>(c10::elementSize(view.dtype)) != 0) {
    return Invalid(absl::StrCat(stored.record, " holds ", bytes.numel(), " bytes, not a whole number of ",
                                c10::toString(view.dtype), " elements"));
  }
  return bytes.view(view.dtype).as_strided(view.sizes, view.strides, view.storage_offset);
}

}  // namespace

absl::StatusOr<Pt2Archive> Pt2Archive::Read(std::shared_ptr<ReadAdapter> file, const ArchiveLimits& limits) {
  Pt2Archive archive;
  archive.file_ = std::move(file);
  archive.limits_ = limits;
  std::vector<std::string> records;
  try {
    archive.reader_ = std::make_shared<PyTorchStreamReader>(archive.file_);
    records = archive.reader_->getAllRecords();
  } catch (const std::exception& e) {
    return Invalid(absl::StrCat("not a readable zip archive: ", TorchErrorLine(e)));
  }
  std::vector<std::string> models;
  for (const std::string& name : records) {
    if (absl::StartsWith(name, kModelsDir) && absl::EndsWith(name, ".json")) models.push_back(name);
  }
  if (models.size() != 1) {
    return Invalid(absl::StrCat("holds ", models.size(), " programs (models/*.json); Recal takes an "
                                "archive of one, as torch.export.save(program, path) writes"));
  }
  const std::string& model = models.front();
  const std::string model_name = model.substr(sizeof(kModelsDir) - 1, model.size() - sizeof(kModelsDir) + 1 - 5);
  RECAL_ASSIGN_OR_RETURN(std::string format, archive.ReadRecord("archive_format", 64));
  if (format != "pt2") return Invalid(absl::StrCat("archive_format is '", format.substr(0, 16), "', not pt2"));
  auto byteorder = archive.ReadRecord("byteorder", 64);
  if (byteorder.ok() && *byteorder != "little") {
    return Invalid("a big-endian archive; save it on a little-endian machine");
  }
  RECAL_ASSIGN_OR_RETURN(json program, archive.ReadJson(model));
  archive.program_ = std::make_shared<const json>(std::move(program));
  archive.program_record_ = model;
  archive.weights_config_record_ = absl::StrCat(kWeightsDir, model_name, "_weights_config.json");
  for (const char* legacy : {"data/weights/", "data/constants/"}) {
    if (std::find(records.begin(), records.end(), absl::StrCat(legacy, model_name, ".pt")) !=
        records.end()) {
      return Invalid("stores its weights in the legacy pickled format; save it again with torch.export.save "
                     "of torch 2.6 or later");
    }
  }
  RECAL_RETURN_IF_ERROR(archive.ReadPayloadConfig(archive.weights_config_record_, kWeightsDir, &archive.weights_));
  RECAL_RETURN_IF_ERROR(archive.ReadPayloadConfig(
      absl::StrCat(kConstantsDir, model_name, "_constants_config.json"), kConstantsDir,
      &archive.constants_));
  return archive;
}

absl::StatusOr<std::string> Pt2Archive::ReadRecord(const std::string& name, int64_t limit) const {
  try {
    if (!reader_->hasRecord(name)) return Invalid(absl::StrCat("has no ", name));
    const size_t size = reader_->getRecordSize(name);
    if (size > static_cast<size_t>(limit)) {
      return Invalid(absl::StrCat(name, " is ", size, " bytes, more than the ", limit, " allowed"));
    }
    std::string bytes(size, '\0');
    reader_->getRecord(name, bytes.data(), size);
    return bytes;
  } catch (const std::exception& e) {
    return Invalid(absl::StrCat("cannot read ", name, ": ", TorchErrorLine(e)));
  }
}

absl::StatusOr<json> ParseArchiveJson(const std::string& name, absl::string_view text, const ArchiveLimits& limits) {
  if (text.size() > static_cast<size_t>(limits.max_json_bytes)) {
    return Invalid(absl::StrCat(name, " is ", text.size(), " bytes, more than the ", limits.max_json_bytes, " allowed"));
  }
  const int max_depth = limits.max_json_depth;
  try {
    return json::parse(text.begin(), text.end(), [max_depth](int depth, json::parse_event_t, json&) {
      if (depth > max_depth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    return Invalid(absl::StrCat(name, " nests deeper than ", max_depth, " levels"));
  } catch (const json::exception& e) {
    return Invalid(absl::StrCat(name, " is not valid JSON: ", e.what()));
  }
}

absl::StatusOr<json> Pt2Archive::ReadJson(const std::string& name) const {
  RECAL_ASSIGN_OR_RETURN(std::string text, ReadRecord(name, limits_.max_json_bytes));
  return ParseArchiveJson(name, text, limits_);
}

absl::Status Pt2Archive::ReadPayloadConfig(const std::string& config, const std::string& dir,
                                           std::map<std::string, StoredTensor>* into) const {
  RECAL_ASSIGN_OR_RETURN(json root, ReadJson(config));
  try {
    for (const auto& [fqn, meta] : root.at("config").items()) {
      if (meta.value("use_pickle", false)) {
        return Invalid(absl::StrCat("'", fqn, "' is pickled (a tensor subclass or script object); Recal ",
                                    "never unpickles an upload: export a model of plain tensors"));
      }
      const json& tensor_meta = meta.at("tensor_meta");
      StoredTensor stored;
      stored.name = fqn;
      stored.record = dir + meta.at("path_name").get<std::string>();
      TensorView& view = stored.view;
      RECAL_ASSIGN_OR_RETURN(view.dtype, ScalarTypeOf(SchemaInt(tensor_meta.at("dtype"))));
      RECAL_ASSIGN_OR_RETURN(view.sizes, ConcreteInts(tensor_meta.at("sizes")));
      RECAL_ASSIGN_OR_RETURN(view.strides, ConcreteInts(tensor_meta.at("strides")));
      RECAL_ASSIGN_OR_RETURN(std::vector<int64_t> offset, ConcreteInts(json::array({tensor_meta.at("storage_offset")})));
      view.storage_offset = offset.front();
      if (SchemaInt(tensor_meta.value("layout", json(kStridedLayout))) != kStridedLayout) {
        return Invalid(absl::StrCat("'", fqn, "' is not a strided (dense) tensor"));
      }
      // Every weight and constant, read by the program or not, before any is loaded.
      RECAL_ASSIGN_OR_RETURN(int64_t record_bytes, RecordBytes(stored.record));
      if (absl::Status fits = CheckViewFits(fqn, view, record_bytes, stored.record); !fits.ok()) {
        return Invalid(fits.message());
      }
      into->emplace(fqn, std::move(stored));
    }
  } catch (const json::exception& e) {
    return Invalid(absl::StrCat(config, " is malformed: ", e.what()));
  }
  return absl::OkStatus();
}

const StoredTensor* Pt2Archive::Find(const std::string& name) const {
  auto found = weights_.find(name);
  if (found != weights_.end()) return &found->second;
  found = constants_.find(name);
  return found != constants_.end() ? &found->second : nullptr;
}

absl::StatusOr<int64_t> Pt2Archive::RecordBytes(const std::string& record) const {
  try {
    absl::StatusOr<int64_t> bytes = RecordInArchive(*reader_, record, file_->size());
    if (!bytes.ok()) return Invalid(bytes.status().message());
    return bytes;
  } catch (const std::exception& e) {
    return Invalid(absl::StrCat("cannot read ", record, ": ", TorchErrorLine(e)));
  }
}

absl::StatusOr<at::Tensor> Pt2Archive::Load(const StoredTensor& stored, RecordCache* records) const {
  if (records != nullptr) {
    auto read = records->find(stored.record);
    if (read != records->end()) return ViewOver(read->second, stored);
  }
  RECAL_ASSIGN_OR_RETURN(int64_t bytes, RecordBytes(stored.record));
  try {
    at::Tensor record = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
    if (bytes > 0) reader_->getRecord(stored.record, record.data_ptr(), static_cast<size_t>(bytes));
    if (records != nullptr) records->emplace(stored.record, record);
    return ViewOver(record, stored);
  } catch (const std::exception& e) {
    return Invalid(absl::StrCat("cannot read ", stored.record, ": ", TorchErrorLine(e)));
  }
}

absl::StatusOr<std::string> Pt2Archive::WithTensors(
    const std::vector<std::pair<std::string, at::Tensor>>& values) const {
  ArchiveEdit edit;
  edit.values = values;
  return Rewritten(edit);
}

absl::StatusOr<std::string> Pt2Archive::Rewritten(const ArchiveEdit& edit) const {
  std::map<std::string, std::vector<std::pair<const StoredTensor*, at::Tensor>>> by_record;
  for (const auto& [name, value] : edit.values) {
    const StoredTensor* stored = Find(name);
    if (stored == nullptr) return absl::InternalError(absl::StrCat("no tensor ", name, " in the archive"));
    by_record[stored->record].emplace_back(stored, value);
  }
  std::map<std::string, std::string> replaced_json;
  if (edit.program) replaced_json[program_record_] = edit.program->dump();
  if (edit.weights_config) replaced_json[weights_config_record_] = edit.weights_config->dump();
  std::string out;
  try {
    PyTorchStreamWriter writer([&out](const void* data, size_t n) {
      out.append(static_cast<const char*>(data), n);
      return n;
    });
    for (const std::string& name : reader_->getAllRecords()) {
      if (name == kSerializationId || edit.dropped_records.count(name) > 0) continue;
      if (auto json_text = replaced_json.find(name); json_text != replaced_json.end()) {
        writer.writeRecord(name, json_text->second.data(), json_text->second.size());
        continue;
      }
      auto [data, size] = reader_->getRecord(name);
      auto changed = by_record.find(name);
      if (changed != by_record.end()) {
        for (const auto& [stored, value] : changed->second) {
          const at::Tensor record = at::from_blob(data.get(), {static_cast<int64_t>(size)}, at::kByte);
          RECAL_ASSIGN_OR_RETURN(at::Tensor view, ViewOver(record, *stored));
          view.copy_(value.to(stored->view.dtype).reshape(view.sizes()));
        }
      }
      writer.writeRecord(name, data.get(), size);
    }
    for (const auto& [path_name, value] : edit.added_weights) {
      const at::Tensor bytes = value.contiguous().cpu();
      writer.writeRecord(absl::StrCat(kWeightsDir, path_name), bytes.data_ptr(), bytes.nbytes());
    }
    writer.writeEndOfFile();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot write the PT2 archive: ", TorchErrorLine(e)));
  }
  return out;
}

}  // namespace recal::engine::exported
