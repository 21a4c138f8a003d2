// The batches of a client-stream job inside recal-worker: PushedBatch messages that the
// server relays on the worker's stdin (checked there already), as tensors.
#pragma once

#include <memory>

#include "server/data/batch_source.h"
#include "server/worker/channel.h"

namespace recal::worker {

// Reads from `reader` until a batch marked last; the tensors keep their pushed dtype
// (the caller normalises, data::Normalized).
std::unique_ptr<data::BatchSource> PushedBatches(MessageReader* reader);

}  // namespace recal::worker
