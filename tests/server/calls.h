// The RPCs end-to-end tests make, as a client makes them (raw stubs: the tests see every
// status and message the server sends).
#pragma once

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "recal/v1/recal.grpc.pb.h"

namespace recal::testing {

// Sends header + chunks [from, to) of `bytes`, then ends the stream, or with `break_off`
// drops the connection instead (a broken upload).
grpc::Status Upload(v1::Recal::Stub& stub, const std::string& bytes, v1::Model* model, int64_t from = 0,
                    int64_t to = -1, std::string digest = "", bool break_off = false, int64_t chunk = 1 << 20);

// All of `bytes`, the stream ended, and the call cancelled 300 ms later, before the answer
// (a client that hangs up while the server inspects the archive or waits to).
grpc::Status UploadAndHangUp(v1::Recal::Stub& stub, const std::string& bytes);

// All of `bytes` as the model `name` (Upload names every model "resnet18").
grpc::Status UploadNamed(v1::Recal::Stub& stub, const std::string& bytes, const std::string& name, v1::Model* model);

// Pushes `batches` (one input each) into shard `shard` of the client-stream job `id`, then
// the message marked last; the call's status. part_bytes > 0: each batch in parts of that
// many bytes of data (PushBatchesRequest.batch_continues), as the clients send large ones.
grpc::Status PushAll(v1::Recal::Stub& stub, const std::string& id, int shard, const std::vector<v1::Tensor>& batches,
                     int64_t part_bytes = 0);

v1::SubmitJobRequest NpyJob(const std::string& model_id, const std::string& path, int batch_size);

// 32x32 center crops (resize 36) of an image folder with ImageNet's mean and std, 3 images a batch.
v1::SubmitJobRequest ImageJob(const std::string& model_id, const std::string& path,
                              v1::ImageFolderSource::OnBad on_bad = v1::ImageFolderSource::ON_BAD_UNSPECIFIED);

// A job that runs for a while: 200 synthetic batches of 32x3x96x96.
v1::SubmitJobRequest LongJob(const std::string& model_id);

// Every event of a watch from after_seq until the stream ends (at most `limit`).
std::vector<v1::JobEvent> Watch(v1::Recal::Stub& stub, const std::string& id, int64_t after_seq = 0,
                                size_t limit = 100000, grpc::Status* status = nullptr);

// The job as GetJob answers now (a test failure unless it answers OK).
v1::Job GetJob(v1::Recal::Stub& stub, const std::string& id);

v1::Job WaitForState(v1::Recal::Stub& stub, const std::string& id, v1::JobState state, double seconds = 120);

std::string Download(v1::Recal::Stub& stub, const std::string& id, v1::Artifact artifact,
                     grpc::Status* status = nullptr, int64_t offset = 0);

}  // namespace recal::testing
