// A PT2 archive (torch.export.save) read without executing anything: the program's JSON
// (torch/_export/serde/schema.py) and its weights and constants as tensors over the raw
// bytes the archive stores. Pickled payloads (tensor subclasses, script objects) are
// refused, never unpickled. Everything an upload controls is bounded before it is read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/model_file.h"
#include "server/engine/tensor_view.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace recal::engine::exported {

struct ArchiveLimits {
  int64_t max_json_bytes = 256 << 20;  // models/<name>.json and each config file
  int max_json_depth = 64;             // the schema nests about 12 deep
};

// `text`, the archive's record `name` (models/<name>.json or a payload config), as JSON:
// INVALID_ARGUMENT naming the record when it is longer than limits.max_json_bytes, nests
// deeper than limits.max_json_depth (stopped while parsing: a JSON bomb never builds) or is
// not JSON. What Pt2Archive::Read parses every JSON record with.
absl::StatusOr<nlohmann::json> ParseArchiveJson(const std::string& name, absl::string_view text,
                                                const ArchiveLimits& limits);

// One weight or constant: the record that holds its storage and its view into it.
struct StoredTensor {
  std::string name;    // in the program's signature: "bn.weight"
  std::string record;  // "data/weights/weight_3"
  TensorView view;
};

// What a new archive changes of an old one (Pt2Archive::Rewritten).
struct ArchiveEdit {
  std::optional<nlohmann::json> program;         // replaces models/<name>.json
  std::optional<nlohmann::json> weights_config;  // replaces the weights' config
  // Stored tensors given new values of their own dtype and shape.
  std::vector<std::pair<std::string, at::Tensor>> values;
  // Records added under data/weights/ (by path_name), each a tensor's bytes in order.
  std::map<std::string, at::Tensor> added_weights;
  std::set<std::string> dropped_records;  // record names (StoredTensor::record)
};

class Pt2Archive {
 public:
  // INVALID_ARGUMENT naming what is wrong: not a PT2 archive, several programs in it,
  // a big-endian archive, JSON past the limits, pickled or malformed payloads, a weight or
  // constant whose record is missing or reaches past the archive, or whose view reaches past
  // its record (named, with the numbers). Reads no tensor data.
  static absl::StatusOr<Pt2Archive> Read(std::shared_ptr<ReadAdapter> file, const ArchiveLimits& limits);

  const nlohmann::json& program() const { return *program_; }
  // Parameters and persistent buffers (data/weights), and tensor constants and
  // non-persistent buffers (data/constants), by their names in the program's signature.
  const std::map<std::string, StoredTensor>& weights() const { return weights_; }
  const std::map<std::string, StoredTensor>& constants() const { return constants_; }
  // The weight or constant named `name`; nullptr when the archive holds none.
  const StoredTensor* Find(const std::string& name) const;

  // Records read for the tensors that view them, by record name: tensors loaded with one
  // cache share one copy of each record (a tied weight, or every constant torch stores in
  // one record, is read once). Dropping the cache drops nothing the tensors still view.
  using RecordCache = std::map<std::string, at::Tensor>;

  // The tensor over its record's bytes, on the CPU (its view was checked by Read); the
  // record is read once per `records`, or at every call without one.
  absl::StatusOr<at::Tensor> Load(const StoredTensor& stored, RecordCache* records = nullptr) const;

  // The archive with the named tensors (weights or constants) given new values of their
  // own dtype and shape, every other record copied as it is. torch.export.load reads it.
  absl::StatusOr<std::string> WithTensors(const std::vector<std::pair<std::string, at::Tensor>>& values) const;
  // The archive with `edit` applied, every other record copied as it is.
  absl::StatusOr<std::string> Rewritten(const ArchiveEdit& edit) const;
  // The weights' config as stored ({"config": {name: {path_name, tensor_meta, ...}}}).
  absl::StatusOr<nlohmann::json> WeightsConfig() const { return ReadJson(weights_config_record_); }

 private:
  Pt2Archive() = default;
  absl::StatusOr<std::string> ReadRecord(const std::string& name, int64_t limit) const;
  absl::StatusOr<nlohmann::json> ReadJson(const std::string& name) const;
  absl::Status ReadPayloadConfig(const std::string& config, const std::string& dir,
                                 std::map<std::string, StoredTensor>* into) const;
  // The size of `record`; INVALID_ARGUMENT when it is missing or reaches past the archive.
  absl::StatusOr<int64_t> RecordBytes(const std::string& record) const;

  std::shared_ptr<ReadAdapter> file_;
  // The zip's directory, read once (its own lock serialises record reads).
  std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
  ArchiveLimits limits_;
  std::shared_ptr<const nlohmann::json> program_;
  std::string program_record_;         // models/<name>.json
  std::string weights_config_record_;  // data/weights/<name>_weights_config.json
  std::map<std::string, StoredTensor> weights_;
  std::map<std::string, StoredTensor> constants_;
};

}  // namespace recal::engine::exported
