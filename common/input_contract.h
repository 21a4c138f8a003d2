// A model's input contract (recal.v1.ModelInput: the shapes, dtypes and dynamic dimensions a
// torch.export program was exported for, or the tensor arguments of a TorchScript forward)
// and the one check of data against it. Without LibTorch, so that the same check refuses a
// job at submit in recal-server, every batch in the engine and the data up front in
// recal-run, with the same words: the input, the dimension, the size the data gives, what
// the program was exported for, and the fix.
//
// The rules are torch's (ExportedProgram.module(): torch/_export/utils.py,
// _check_input_constraints_for_graph): a fixed size must match; a dynamic one must lie in
// its Dim's range, where a lower bound of 2 or less is not enforced (export specialises 0
// and 1, and lets them pass at run time); dims that share a Dim agree, in one input or
// across inputs. A derived dim (2*d + 1) must be met by an integer d, which torch's own
// check lets through with a fraction.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <google/protobuf/repeated_ptr_field.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "recal/v1/recal.pb.h"

namespace recal {

using ModelInputs = google::protobuf::RepeatedPtrField<v1::ModelInput>;

// What data gives for one positional input: its sizes and its dtype by torch's name
// ("float32").
struct TensorShape {
  std::vector<int64_t> sizes;
  std::string dtype;
};

// OK when `batch` (one tensor per positional input, dim 0 the batch) fits `inputs`; else
// INVALID_ARGUMENT naming the input, the dimension, the size the batch gives, the size or
// range the program was exported for, and what to change. A floating batch for another
// floating dtype fits: the engine casts it (CastNotes). Empty `inputs` (a model stored
// before contracts) accept any batch.
absl::Status CheckBatch(const ModelInputs& inputs, const std::vector<TensorShape>& batch);

// What a data source will give, known before it is read.
struct DataShape {
  std::vector<TensorShape> samples;  // per input: one sample's sizes (no batch dim), dtype as the model gets it
  std::optional<int64_t> count;      // samples in the data, when known
};

// CheckBatch for the batches `data` makes: one of `batch_size` samples (fewer when the data
// holds fewer), and the last, partial one when the data's count is known and a run of at
// most `max_batches` reaches it.
absl::Status CheckData(const ModelInputs& inputs, const DataShape& data, int64_t batch_size, int64_t max_batches);

// One line per input whose floating data will be cast to the program's floating dtype
// ("input 'x': float64 data is cast to float32, the dtype the program was exported with").
std::vector<std::string> CastNotes(const ModelInputs& inputs, const std::vector<TensorShape>& samples);

// The dtype data of `dtype` reaches the model in: the server's data layer makes uint8,
// float16 and float32 inputs float32 (server/data/normalization.h); the rest pass unchanged.
std::string DtypeReachingModel(absl::string_view dtype);

// "x: float32 [any, 3, 32, 32]": an input as the program declares it, for messages.
std::string DescribeInput(const v1::ModelInput& input);

}  // namespace recal
