#include "server/engine/shard_statistics.h"

#include <cstring>
#include <map>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/formats/safetensors.h"
#include "common/mapped_file.h"

namespace recal::engine {
namespace {

constexpr char kFormat[] = "recal-shard-statistics/1";
// Per layer, "layer.<i>.counts": calls, refined_calls, calls_without_variance and the three
// accumulators' counts, as float64 (exact below 2^53).
constexpr int kCounts = 6;
constexpr const char* kParts[] = {"population", "call_means", "call_vars"};

std::string Key(size_t layer, absl::string_view what) { return absl::StrCat("layer.", layer, ".", what); }

// Float64 CPU tensors that outlive the call, and the entries that point into them.
class Entries {
 public:
  void Add(std::string name, const at::Tensor& values) {
    at::Tensor owned = values.to(at::kCPU, at::kDouble).contiguous();
    tensors_.push_back(owned);
    entries_.push_back({std::move(name), "F64", owned.sizes().vec(),
                        absl::string_view(static_cast<const char*>(owned.data_ptr()),
                                          owned.numel() * sizeof(double))});
  }
  const std::vector<formats::SafetensorsEntry>& entries() const { return entries_; }

 private:
  std::vector<at::Tensor> tensors_;
  std::vector<formats::SafetensorsEntry> entries_;
};

const Moments& Part(const LayerStats& stats, int i) {
  return i == 0 ? stats.population() : i == 1 ? stats.call_means() : stats.call_vars();
}

absl::StatusOr<at::Tensor> ReadTensor(absl::string_view file, const formats::SafetensorsHeader& header,
                                      const std::string& name, int64_t numel) {
  const formats::SafetensorsTensorInfo* info = header.Find(name);
  if (info == nullptr) return absl::InvalidArgumentError(absl::StrCat("no tensor ", name));
  if (info->dtype != formats::DType::kF64 || info->shape.size() != 1 || info->shape[0] != numel) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not ", numel, " float64 values"));
  }
  at::Tensor values = at::empty({numel}, at::kDouble);
  std::memcpy(values.data_ptr(), file.data() + header.data_offset + info->begin, numel * sizeof(double));
  return values;
}

absl::StatusOr<int64_t> Integer(const std::map<std::string, std::string>& metadata, const std::string& key) {
  auto found = metadata.find(key);
  int64_t value = 0;
  if (found == metadata.end() || !absl::SimpleAtoi(found->second, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat("no count ", key));
  }
  return value;
}

absl::StatusOr<ShardStatistics> Parse(absl::string_view file) {
  auto header = formats::ParseSafetensors(file);
  if (!header.ok()) return header.status();
  const std::map<std::string, std::string>& metadata = header->metadata;
  auto format = metadata.find("format");
  if (format == metadata.end() || format->second != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat("not a ", kFormat, " file"));
  }
  ShardStatistics statistics;
  auto batches = Integer(metadata, "batches");
  auto samples = Integer(metadata, "samples");
  auto layers = Integer(metadata, "layers");
  if (!batches.ok()) return batches.status();
  if (!samples.ok()) return samples.status();
  if (!layers.ok()) return layers.status();
  statistics.batches = *batches;
  statistics.samples = *samples;
  auto seconds = metadata.find("seconds");
  if (seconds == metadata.end() || !absl::SimpleAtod(seconds->second, &statistics.seconds)) {
    return absl::InvalidArgumentError("no seconds");
  }
  auto stopped = metadata.find("stopped_early");
  statistics.stopped_early = stopped != metadata.end() && stopped->second == "1";
  if (auto format = metadata.find("memory_format"); format != metadata.end()) {
    auto parsed = ParseMemoryFormat(format->second);
    if (!parsed.ok()) return parsed.status();
    statistics.memory_format = *parsed;
  }
  for (int64_t i = 0; i < *layers; ++i) {
    LayerTally layer;
    auto mean_key = metadata.find(Key(i, "mean_key"));
    auto var_key = metadata.find(Key(i, "var_key"));
    if (mean_key == metadata.end() || var_key == metadata.end()) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", i, " has no buffer keys"));
    }
    layer.mean_key = mean_key->second;
    layer.var_key = var_key->second;
    auto counts = ReadTensor(file, *header, Key(i, "counts"), kCounts);
    if (!counts.ok()) return counts.status();
    const double* c = counts->data_ptr<double>();
    layer.calls = static_cast<int64_t>(c[0]);
    layer.refined_calls = static_cast<int64_t>(c[1]);
    Moments parts[3];
    for (int p = 0; p < 3; ++p) {
      const double count = c[3 + p];
      if (!(count >= 0)) return absl::InvalidArgumentError(absl::StrCat("layer ", i, ": a negative count"));
      if (count == 0) continue;
      const formats::SafetensorsTensorInfo* info = header->Find(Key(i, absl::StrCat(kParts[p], ".mean")));
      const int64_t channels = info != nullptr && info->shape.size() == 1 ? info->shape[0] : 0;
      auto mean = ReadTensor(file, *header, Key(i, absl::StrCat(kParts[p], ".mean")), channels);
      auto m2 = ReadTensor(file, *header, Key(i, absl::StrCat(kParts[p], ".m2")), channels);
      if (!mean.ok()) return mean.status();
      if (!m2.ok()) return m2.status();
      parts[p].Add(count, *mean, *m2);
    }
    layer.stats = LayerStats::FromParts(layer.calls, static_cast<int64_t>(c[2]), std::move(parts[0]),
                                        std::move(parts[1]), std::move(parts[2]));
    statistics.layers.push_back(std::move(layer));
  }
  return statistics;
}

}  // namespace

absl::Status WriteShardStatistics(const std::string& path, const ShardStatistics& statistics) {
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"batches", absl::StrCat(statistics.batches)},
      {"samples", absl::StrCat(statistics.samples)},
      {"seconds", absl::StrCat(statistics.seconds)},
      {"stopped_early", statistics.stopped_early ? "1" : "0"},
      {"memory_format", MemoryFormatName(statistics.memory_format)},
      {"layers", absl::StrCat(statistics.layers.size())},
  };
  Entries entries;
  for (size_t i = 0; i < statistics.layers.size(); ++i) {
    const LayerTally& layer = statistics.layers[i];
    metadata[Key(i, "mean_key")] = layer.mean_key;
    metadata[Key(i, "var_key")] = layer.var_key;
    const LayerStats& stats = layer.stats;
    entries.Add(Key(i, "counts"),
                at::tensor({static_cast<double>(layer.calls), static_cast<double>(layer.refined_calls),
                            static_cast<double>(stats.calls_without_variance()), stats.population().count(),
                            stats.call_means().count(), stats.call_vars().count()},
                           at::kDouble));
    for (int p = 0; p < 3; ++p) {
      const Moments& part = Part(stats, p);
      if (part.count() == 0) continue;
      entries.Add(Key(i, absl::StrCat(kParts[p], ".mean")), part.mean());
      entries.Add(Key(i, absl::StrCat(kParts[p], ".m2")), part.m2());
    }
  }
  return formats::WriteSafetensors(path, entries.entries(), metadata);
}

absl::StatusOr<ShardStatistics> ReadShardStatistics(const std::string& path) {
  auto file = data::MappedFile::Open(path);
  if (!file.ok()) return file.status();
  auto statistics = Parse((*file)->bytes());
  if (!statistics.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shard statistics ", path, ": ", statistics.status().message()));
  }
  return statistics;
}

}  // namespace recal::engine
