// The first message of an UploadModel stream (recal.v1.UploadModelRequest, serialized: the
// input). RecalService::UploadModel (server/api/recal_service.cc) only checks that the
// message is a header and hands it to ModelRegistry::StartUpload (server/jobs/model_registry.cc:
// size, the tenant's quota, the digest's form through BlobStore::UploadedSize, which makes it
// a file name); those are the functions fuzzed here, against a real SQLite metadata store and
// blob store in a scratch directory. An accepted header is then driven as the service does:
// GetUploadStatus, one chunk (the header's name bytes, up to the declared size) at offset 0,
// and the end of the stream (FinishUpload: the digest verified, then inspection, which this
// target's inspector refuses, so nothing is ever stored as a model).
//
// Contract: a bad header (no header, a name CheckModelName refuses, size <= 0 or over the
// limit, a digest that is not 64 lowercase hex, so never a path) is refused with a message; an accepted one leads to a
// partial upload inside the store and to a clear error at the end, never to a stored model.
#include <cstdint>
#include <memory>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "common/sha256.h"
#include "fuzz/fuzz_util.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/model_inspector.h"
#include "server/jobs/model_ref.h"
#include "server/jobs/model_registry.h"
#include "server/store/local_blob_store.h"
#include "server/store/sqlite_metadata_store.h"

namespace {

constexpr char kTenant[] = "fuzz";
constexpr int64_t kMaxModelBytes = int64_t{1} << 20;
constexpr int64_t kMaxStoredBytes = int64_t{1} << 19;

class RefusingInspector final : public recal::jobs::ModelInspector {
 public:
  absl::StatusOr<recal::v1::Model> Inspect(const std::string&) override {
    return absl::InvalidArgumentError("the upload fuzz target inspects no model");
  }
};

struct Server {
  std::unique_ptr<recal::store::SqliteMetadataStore> metadata;
  std::unique_ptr<recal::store::BlobStore> blobs;
  RefusingInspector inspector;
  std::unique_ptr<recal::jobs::ModelRegistry> models;
};

Server& TheServer() {
  static Server* server = [] {
    auto* s = new Server;
    const std::string dir = recal::fuzz::ScratchDir();
    auto metadata = recal::store::SqliteMetadataStore::Open(dir + "/recal.db");
    auto blobs = recal::store::LocalBlobStore::Open(dir + "/store");
    FUZZ_CHECK(metadata.ok() && blobs.ok(), "cannot open the stores in ", dir);
    s->metadata = *std::move(metadata);
    s->blobs = *std::move(blobs);
    s->models = std::make_unique<recal::jobs::ModelRegistry>(
        s->metadata.get(), s->blobs.get(), kMaxModelBytes, &s->inspector,
        [](const std::string&) { return recal::jobs::TenantLimits{.max_stored_bytes = kMaxStoredBytes}; });
    return s;
  }();
  return *server;
}

bool Is(const absl::Status& s, absl::StatusCode a, absl::StatusCode b) { return s.code() == a || s.code() == b; }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // no line per string field with invalid UTF-8
  TheServer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  recal::v1::UploadModelRequest message;
  if (!message.ParseFromArray(data, static_cast<int>(size))) return 0;  // gRPC would not deliver it
  if (!message.has_header()) return 0;  // RecalService::UploadModel: "the first message of an upload is its header"
  const recal::v1::UploadHeader& header = message.header();
  Server& server = TheServer();

  auto start = server.models->StartUpload(kTenant, header);
  if (!start.ok()) {
    recal::fuzz::CheckRefusal(start.status(), "StartUpload");
    FUZZ_CHECK(Is(start.status(), absl::StatusCode::kInvalidArgument, absl::StatusCode::kResourceExhausted),
               start.status().ToString());
    return 0;
  }
  FUZZ_CHECK(recal::jobs::CheckModelName(recal::jobs::ModelNameOf(header)).ok(), "name '", header.name(),
             "' accepted");
  FUZZ_CHECK(header.size() > 0 && header.size() <= kMaxStoredBytes, "size ", header.size(), " accepted");
  FUZZ_CHECK(recal::IsSha256Hex(header.sha256()), "digest '", header.sha256(), "' accepted");
  FUZZ_CHECK(!start->has_value(), "a model is stored, yet the inspector refuses every model");

  auto status = server.models->UploadStatus(kTenant, header.sha256());
  FUZZ_CHECK(status.ok() && status->committed_size() == 0, "GetUploadStatus: ", status.status().ToString());

  recal::v1::UploadChunk chunk;
  chunk.set_offset(0);
  chunk.set_data(header.name().substr(0, static_cast<size_t>(header.size())));
  const absl::Status appended = server.models->AppendChunk(kTenant, header, chunk);
  FUZZ_CHECK(appended.ok(), "the first chunk of an accepted upload: ", appended.ToString());
  auto after = server.models->UploadStatus(kTenant, header.sha256());
  FUZZ_CHECK(after.ok() && after->committed_size() == static_cast<int64_t>(chunk.data().size()), "committed size");

  auto finished = server.models->FinishUpload(kTenant, header);
  FUZZ_CHECK(!finished.ok(), "a model was stored");
  recal::fuzz::CheckRefusal(finished.status(), "FinishUpload");
  const bool complete = static_cast<int64_t>(chunk.data().size()) == header.size();
  FUZZ_CHECK(finished.status().code() ==
                 (complete ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kFailedPrecondition),
             finished.status().ToString());
  FUZZ_CHECK(!server.blobs->Has(header.sha256()), "a refused upload left a blob");

  // Leave the store as it was, so every input runs against the same state.
  FUZZ_CHECK(server.blobs->DiscardUpload(kTenant, header.sha256()).ok(), "DiscardUpload");
  return 0;
}
