// What one shard of a sharded recalibration measured: every layer's accumulators in
// float64, to be merged exactly (Chan) with the other shards' into one result. A shard's
// statistics travel between processes as a safetensors file of float64 tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/layer_stats.h"
#include "server/engine/options.h"

namespace recal::engine {

struct LayerTally {
  std::string mean_key;  // state_dict keys of the layer's buffers
  std::string var_key;
  int64_t calls = 0;
  int64_t refined_calls = 0;
  LayerStats stats;
};

struct ShardStatistics {
  int64_t batches = 0;
  int64_t samples = 0;
  double seconds = 0;
  bool stopped_early = false;
  // The layout the shard's forward ran in (what kAuto chose there): the merged report's.
  MemoryFormat memory_format = MemoryFormat::kAuto;
  std::vector<LayerTally> layers;  // every layer the shard knew, excluded and unused ones too
};

// Atomically; tensors are copied to the CPU.
absl::Status WriteShardStatistics(const std::string& path, const ShardStatistics& statistics);
// INVALID_ARGUMENT for a file that is not a whole, consistent statistics file.
absl::StatusOr<ShardStatistics> ReadShardStatistics(const std::string& path);

}  // namespace recal::engine
