// Data in a bucket inside recal-worker, which has no network and no credentials: the
// objects the server found for the job (Recalibrate.remote_objects), read through the
// server. A read sends ReadRequest events and waits for the ReadReply messages the server
// writes on stdin (proto/recal/worker/v1/worker.proto); the server answers only for those
// objects and within their sizes (server/jobs/remote_reads.h), so nothing here can name
// another object or another endpoint.
#pragma once

#include <memory>

#include "recal/worker/v1/worker.pb.h"
#include "server/data_access/object_storage.h"
#include "server/worker/channel.h"
#include "server/worker/worker_task.h"

namespace recal::worker {

// Reads longer than kMaxReadRequestBytes (channel.h) are split. `send` must be safe to call from several threads (the decoding threads and the
// prefetcher read at once); replies are read from `replies` by whichever waiting reader
// gets there first, so no thread of its own is needed.
std::shared_ptr<data::ObjectStorage> RemoteObjects(const v1::RemoteObjects& objects, MessageReader* replies,
                                                   EventSink send);

}  // namespace recal::worker
