// Reads a source ahead on a background thread, so the forward pass does not wait on I/O
// (or on decoding) when it need not.
#pragma once

#include <memory>

#include "server/data/batch_source.h"

namespace recal::data {

// Wraps `inner` so that up to `depth` batches (at least 1) are read ahead on one
// background thread. Results come out in order, errors included: the first error (or
// the end of the data) is returned at its place in the sequence and again on every later
// call, and the background thread stops there. Destroying the wrapper early stops the
// thread after at most the one inner Next() call in progress; nothing leaks. Exceptions
// thrown by `inner` become INTERNAL errors. num_samples() and Describe() are taken from
// `inner` once, up front, so they never race with the thread; skipped_files() is the
// inner source's count as of the batch last returned (not of batches still queued).
// With `pin_memory` the batches are copied into page-locked memory on the thread (needs a
// CUDA build), so that copies to the device can be non-blocking.
std::unique_ptr<BatchSource> Prefetched(std::unique_ptr<BatchSource> inner, int depth, bool pin_memory = false);

}  // namespace recal::data
