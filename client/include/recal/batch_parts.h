// How one pushed batch becomes PushBatches messages: whole when it fits the server's message
// limit, else in parts (PushBatchesRequest.batch_continues) that the server joins into the
// same batch. The C++ client pushes this way; the Python package (recal/streams.py) the same.
#pragma once

#include <cstdint>
#include <vector>

#include "recal/v1/recal.pb.h"

namespace recal {

// The messages that carry one batch (its positional inputs, taken): one when their data fit
// `part_bytes`, else a first part with every input's dtype and shape, then the data, input
// after input, `part_bytes` per message. job_id, shard and last are left to the caller.
std::vector<v1::PushBatchesRequest> BatchMessages(std::vector<v1::Tensor>& inputs, int64_t part_bytes);

}  // namespace recal
