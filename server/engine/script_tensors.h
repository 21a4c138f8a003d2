// The tensors a TorchScript archive stores, checked against the records that hold their bytes
// before torch::jit::load makes them. LibTorch sizes a storage by the element count its pickle
// claims, not by its record (a 16-byte record claiming 1000 floats gives a tensor over the
// heap beyond it), sets views without checking them against the storage, and copies every
// storage to a GPU while loading: nothing of an archive may reach LibTorch unchecked.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "server/engine/model_file.h"

namespace recal::engine {

// Unpickles data.pkl (parameters, buffers and attributes of every module) and constants.pkl
// (the code's tensor constants) with storages that hold no bytes, and checks every tensor:
// its storage's record exists and lies inside the archive, the storage is no larger than its
// record, and the view lies inside the storage. Reads no tensor data. INVALID_ARGUMENT names
// the tensor by its path in the module ("layer1.0.bn1.weight", "CONSTANTS.c0") and the numbers.
absl::Status CheckScriptTensors(const std::shared_ptr<ReadAdapter>& file);

}  // namespace recal::engine
