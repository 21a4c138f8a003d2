#include "tests/server/calls.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "common/sha256.h"
#include "recal/batch_parts.h"
#include "tests/server/server_process.h"

namespace recal::testing {

namespace {

// How an upload's client ends its call: it waits for the answer, or goes away before the
// end of its bytes (a broken upload), or after it (hangs up while the server inspects).
enum class Ending { kAnswer, kBreakOff, kHangUp };

// Sends header (naming the model `name`) + chunks [from, to) of `bytes`, then ends as `ending` says.
grpc::Status UploadPart(v1::Recal::Stub& stub, const std::string& bytes, const std::string& name, v1::Model* model,
                        int64_t from, int64_t to, std::string digest, Ending ending, int64_t chunk) {
  if (to < 0) to = bytes.size();
  grpc::ClientContext context;
  auto writer = stub.UploadModel(&context, model);
  v1::UploadModelRequest header;
  header.mutable_header()->set_name(name);
  header.mutable_header()->set_size(bytes.size());
  header.mutable_header()->set_sha256(digest.empty() ? Sha256Hex(bytes) : digest);
  writer->Write(header);
  for (int64_t offset = from; offset < to; offset += chunk) {
    v1::UploadModelRequest part;
    part.mutable_chunk()->set_offset(offset);
    part.mutable_chunk()->set_data(bytes.substr(offset, std::min<int64_t>(chunk, to - offset)));
    if (!writer->Write(part)) break;
  }
  if (ending != Ending::kBreakOff) writer->WritesDone();
  if (ending != Ending::kAnswer) {
    // Let the server take what was sent before the call goes.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    context.TryCancel();
  }
  return writer->Finish();
}

}  // namespace

grpc::Status Upload(v1::Recal::Stub& stub, const std::string& bytes, v1::Model* model, int64_t from, int64_t to,
                    std::string digest, bool break_off, int64_t chunk) {
  return UploadPart(stub, bytes, "resnet18", model, from, to, std::move(digest),
                    break_off ? Ending::kBreakOff : Ending::kAnswer, chunk);
}

grpc::Status UploadAndHangUp(v1::Recal::Stub& stub, const std::string& bytes) {
  v1::Model model;
  return UploadPart(stub, bytes, "resnet18", &model, 0, -1, "", Ending::kHangUp, 1 << 20);
}

grpc::Status UploadNamed(v1::Recal::Stub& stub, const std::string& bytes, const std::string& name, v1::Model* model) {
  return UploadPart(stub, bytes, name, model, 0, -1, "", Ending::kAnswer, 1 << 20);
}

grpc::Status PushAll(v1::Recal::Stub& stub, const std::string& id, int shard, const std::vector<v1::Tensor>& batches,
                     int64_t part_bytes) {
  grpc::ClientContext context;
  v1::PushBatchesResponse pushed;
  auto writer = stub.PushBatches(&context, &pushed);
  bool open = true;
  for (size_t b = 0; b < batches.size() && open; ++b) {
    std::vector<v1::Tensor> inputs = {batches[b]};
    for (v1::PushBatchesRequest& message : BatchMessages(inputs, part_bytes > 0 ? part_bytes : INT64_MAX)) {
      message.set_job_id(id);
      message.set_shard(shard);
      if (!(open = writer->Write(message))) break;
    }
  }
  v1::PushBatchesRequest last;
  last.set_job_id(id);
  last.set_shard(shard);
  last.set_last(true);
  writer->Write(last);
  writer->WritesDone();
  return writer->Finish();
}

v1::SubmitJobRequest NpyJob(const std::string& model_id, const std::string& path, int batch_size) {
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model_id);
  request.mutable_spec()->set_batch_size(batch_size);
  request.mutable_spec()->mutable_data()->mutable_tensor_file()->set_format(v1::TensorFileSource::NPY);
  request.mutable_spec()->mutable_data()->mutable_tensor_file()->set_path(path);
  return request;
}

v1::SubmitJobRequest ImageJob(const std::string& model_id, const std::string& path,
                              v1::ImageFolderSource::OnBad on_bad) {
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model_id);
  request.mutable_spec()->set_batch_size(3);
  v1::ImageFolderSource* folder = request.mutable_spec()->mutable_data()->mutable_image_folder();
  folder->set_path(path);
  folder->set_resize(36);
  folder->set_crop(32);
  for (float m : {0.485f, 0.456f, 0.406f}) folder->add_mean(m);
  for (float s : {0.229f, 0.224f, 0.225f}) folder->add_std(s);
  folder->set_on_bad(on_bad);
  return request;
}

// A job that runs for a while: 200 synthetic batches of 32x3x96x96.
v1::SubmitJobRequest LongJob(const std::string& model_id) {
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model_id);
  request.mutable_spec()->set_batch_size(32);
  auto* synthetic = request.mutable_spec()->mutable_data()->mutable_synthetic();
  for (int64_t d : {3, 96, 96}) synthetic->add_sample_shape(d);
  return request;
}

// Every event of a watch from after_seq until the stream ends (at most `limit`).
std::vector<v1::JobEvent> Watch(v1::Recal::Stub& stub, const std::string& id, int64_t after_seq, size_t limit,
                                grpc::Status* status) {
  grpc::ClientContext context;
  v1::WatchJobRequest request;
  request.set_id(id);
  request.set_after_seq(after_seq);
  auto reader = stub.WatchJob(&context, request);
  std::vector<v1::JobEvent> events;
  v1::JobEvent event;
  while (events.size() < limit && reader->Read(&event)) events.push_back(event);
  if (events.size() >= limit) context.TryCancel();
  grpc::Status finished = reader->Finish();
  if (status) *status = finished;
  return events;
}

v1::Job GetJob(v1::Recal::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  const grpc::Status status = stub.GetJob(&context, request, &job);
  EXPECT_TRUE(status.ok()) << id << ": " << status.error_message();
  return job;
}

v1::Job WaitForState(v1::Recal::Stub& stub, const std::string& id, v1::JobState state, double seconds) {
  return PollJob(stub, id, [state](const v1::Job& job) { return job.state() == state; }, seconds);
}

std::string Download(v1::Recal::Stub& stub, const std::string& id, v1::Artifact artifact, grpc::Status* status,
                     int64_t offset) {
  grpc::ClientContext context;
  v1::DownloadResultRequest request;
  request.set_job_id(id);
  request.set_artifact(artifact);
  request.set_offset(offset);
  auto reader = stub.DownloadResult(&context, request);
  std::string bytes;
  v1::DownloadResultChunk chunk;
  while (reader->Read(&chunk)) bytes += chunk.data();
  grpc::Status finished = reader->Finish();
  if (status) *status = finished;
  return bytes;
}

}  // namespace recal::testing
