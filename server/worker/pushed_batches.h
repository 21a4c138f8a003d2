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

// For a CUDA device: each batch of `inner` copied into page-locked memory as it is read, so
// that its copy to the device does not block (files get that from data::Prefetched). Inline,
// not on a thread: one waiting on stdin for a batch that never comes would keep the worker
// from exiting when its job ends early (target_rel_error).
std::unique_ptr<data::BatchSource> Pinned(std::unique_ptr<data::BatchSource> inner);

}  // namespace recal::worker
