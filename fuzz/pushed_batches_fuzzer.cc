// A PushBatches message (recal.v1.PushBatchesRequest, serialized: the input) along its whole
// way: the server's checks (server/jobs/stream_feed.cc, StreamFeed::Push), the relay to the
// worker over the pipe framing (server/worker/channel.cc), and the worker turning it into
// tensors (server/worker/pushed_batches.cc) and normalising them (server/data/normalization.cc)
// as recal-worker does. The job's normalisation (ClientStreamSource, from SubmitJob) travels in
// the same input as field 15 of the message (not an API field; absent or not a
// ClientStreamSource: none).
//
// Contract: a malformed tensor (dtype, shape, byte count, size, channels) is refused by the
// server with a message; a batch the server accepted is accepted by the worker and becomes
// float32 tensors of the pushed shapes holding the pushed values.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/unknown_field_set.h>

#include "fuzz/fuzz_util.h"
#include "recal/v1/recal.pb.h"
#include "server/data/normalization.h"
#include "server/jobs/stream_feed.h"
#include "server/worker/channel.h"
#include "server/worker/pushed_batches.h"

namespace {

constexpr int64_t kMaxBatchBytes = int64_t{1} << 20;       // the server's --max_batch_bytes, here
constexpr int64_t kMaxMessageBytes = int64_t{64} << 20;    // recal-worker's --max_message_bytes default
constexpr int kNormalisationField = 15;                    // of the input, beside PushBatchesRequest's own

struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  google::protobuf::SetLogHandler(nullptr);  // no line per string field with invalid UTF-8
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  recal::v1::PushBatchesRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;  // gRPC would not deliver it
  recal::v1::ClientStreamSource normalisation;
  const google::protobuf::UnknownFieldSet& extra = request.GetReflection()->GetUnknownFields(request);
  for (int i = 0; i < extra.field_count(); ++i) {
    const google::protobuf::UnknownField& field = extra.field(i);
    if (field.number() == kNormalisationField && field.type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED &&
        !normalisation.ParseFromString(field.length_delimited())) {
      normalisation.Clear();
    }
  }

  // The server: check and queue.
  recal::jobs::StreamFeed feed(normalisation, kMaxBatchBytes);
  feed.set_deadline(std::chrono::steady_clock::now(), std::chrono::hours(1), "--stream_idle_seconds");  // never wait for more
  google::protobuf::RepeatedPtrField<recal::v1::Tensor> inputs = request.inputs();  // Push takes them; kept to compare
  const absl::Status pushed = feed.Push(inputs, request.last());
  if (!pushed.ok()) {
    recal::fuzz::CheckRefusal(pushed, "StreamFeed::Push");
    FUZZ_CHECK(pushed.code() == absl::StatusCode::kInvalidArgument ||
                   pushed.code() == absl::StatusCode::kResourceExhausted,
               pushed.ToString());
    return 0;
  }
  if (request.inputs().empty() && !request.last()) return 0;  // names the job only: nothing queued
  auto queued = feed.Next();
  FUZZ_CHECK(queued.ok() && queued->has_value(), "an accepted batch is not queued: ", queued.status().ToString());

  // The relay: one length-delimited message on the worker's input.
  Fd pipe{::memfd_create("pushed", 0)};
  FUZZ_CHECK(pipe.fd >= 0, "memfd_create");
  FUZZ_CHECK(recal::worker::WriteMessage(pipe.fd, **queued).ok(), "WriteMessage");
  ::lseek(pipe.fd, 0, SEEK_SET);
  recal::worker::MessageReader reader(pipe.fd, kMaxMessageBytes);

  // The worker, as worker_task.cc opens a client stream's data.
  auto source = recal::data::Normalized(
      recal::worker::PushedBatches(&reader),
      {normalisation.scale(), {normalisation.mean().begin(), normalisation.mean().end()},
       {normalisation.std().begin(), normalisation.std().end()}});
  auto batch = source->Next();
  FUZZ_CHECK(batch.ok(), "the worker refuses a batch the server accepted: ", batch.status().ToString());
  if (request.inputs().empty()) {  // only "last"
    FUZZ_CHECK(!batch->has_value(), "a batch out of nothing");
    return 0;
  }
  FUZZ_CHECK(batch->has_value() && (*batch)->size() == static_cast<size_t>(request.inputs_size()), "inputs");
  const bool plain = normalisation.scale() <= 0 && normalisation.mean().empty() && normalisation.std().empty();
  for (int i = 0; i < request.inputs_size(); ++i) {
    const recal::v1::Tensor& in = request.inputs(i);
    const at::Tensor& t = (**batch)[i];
    FUZZ_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), "input ", i, " is not contiguous float32");
    FUZZ_CHECK(std::vector<int64_t>(t.sizes().begin(), t.sizes().end()) ==
                   std::vector<int64_t>(in.shape().begin(), in.shape().end()),
               "input ", i, " changed shape");
    if (!plain) continue;
    if (in.dtype() == recal::v1::Tensor::FLOAT32) {
      FUZZ_CHECK(std::memcmp(t.data_ptr(), in.data().data(), in.data().size()) == 0, "input ", i, " changed bytes");
    } else if (in.dtype() == recal::v1::Tensor::UINT8) {
      const float* values = t.data_ptr<float>();
      for (size_t k = 0; k < in.data().size(); ++k) {
        FUZZ_CHECK(values[k] == static_cast<unsigned char>(in.data()[k]), "input ", i, " element ", k);
      }
    }
  }
  return 0;
}
