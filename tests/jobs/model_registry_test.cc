// ModelRegistry over the real SQLite and blob stores and a fake runner: names and versions of
// uploads, every form of reference, ambiguity, and tenants that cannot see each other's models
// (tried as an attacker: a prefix or a name only another tenant has is NOT_FOUND, worded as
// for one nobody has).
#include "server/jobs/model_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "server/store/local_blob_store.h"
#include "tests/jobs/fake_runner.h"

namespace recal::jobs {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

class ModelRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = *store::OpenMetadataStore(tmp_.File("recal.db"));
    blobs_ = *store::LocalBlobStore::Open(tmp_.File("blobs"));
    models_ = std::make_unique<ModelRegistry>(metadata_.get(), blobs_.get(), 1 << 20, &runner_);
  }
  // name:version of what `reference` resolves to in `tenant`, or the status's code name.
  std::string Resolved(const std::string& tenant, const std::string& reference) {
    absl::StatusOr<v1::Model> model = models_->Resolve(tenant, reference);
    if (!model.ok()) return absl::StatusCodeToString(model.status().code());
    return absl::StrCat(model->name(), ":", model->version());
  }

  testing::TempDir tmp_;
  FakeRunner runner_;
  std::unique_ptr<store::MetadataStore> metadata_;
  std::unique_ptr<store::LocalBlobStore> blobs_;
  std::unique_ptr<ModelRegistry> models_;
};

TEST_F(ModelRegistryTest, NewBytesUnderANameAreItsNextVersionAndEveryReferenceFormResolves) {
  const std::string v1 = UploadAnyModel(*models_, "t", "first bytes", "rn50");
  const std::string v2 = UploadAnyModel(*models_, "t", "second bytes", "rn50");
  ASSERT_FALSE(v1.empty());
  ASSERT_FALSE(v2.empty());
  // The same bytes again under the same name, or another: the same model and version.
  EXPECT_EQ(UploadAnyModel(*models_, "t", "first bytes", "rn50"), v1);
  EXPECT_EQ(UploadAnyModel(*models_, "t", "first bytes", "other"), v1);
  EXPECT_EQ(Resolved("t", "other"), "NOT_FOUND");

  EXPECT_EQ(Resolved("t", "rn50"), "rn50:2");
  EXPECT_EQ(Resolved("t", "rn50:1"), "rn50:1");
  EXPECT_EQ(Resolved("t", v1), "rn50:1");
  EXPECT_EQ(Resolved("t", v1.substr(7)), "rn50:1");         // bare hex
  EXPECT_EQ(Resolved("t", v2.substr(0, 7 + 6)), "rn50:2");  // sha256: and 6 digits
  EXPECT_EQ(Resolved("t", v2.substr(7, 6)), "rn50:2");      // 6 digits
  EXPECT_EQ(Resolved("t", "rn50:3"), "NOT_FOUND");
  EXPECT_EQ(Resolved("t", "resnet"), "NOT_FOUND");
  EXPECT_EQ(Resolved("t", "rn50:0"), "INVALID_ARGUMENT");
  EXPECT_EQ(Resolved("t", "12345"), "NOT_FOUND");  // 5 hex digits: a name, which nobody has

  // An upload without a name gets the default one.
  EXPECT_FALSE(UploadAnyModel(*models_, "t", "unnamed bytes", "").empty());
  EXPECT_EQ(Resolved("t", store::kDefaultModelName), absl::StrCat(store::kDefaultModelName, ":1"));
}

v1::UploadHeader StageUpload(ModelRegistry& models, const std::string& tenant, const std::string& bytes) {
  v1::UploadHeader header;
  header.set_name("m");
  header.set_size(bytes.size());
  header.set_sha256(Sha256Hex(bytes));
  v1::UploadChunk chunk;
  chunk.set_data(bytes);
  EXPECT_TRUE(models.StartUpload(tenant, header).ok());
  EXPECT_TRUE(models.AppendChunk(tenant, header, chunk).ok());
  return header;
}

// One tenant floods: beyond its max_concurrent_inspections its uploads wait, then fail
// RESOURCE_EXHAUSTED with their bytes still staged; another tenant's upload is inspected.
TEST_F(ModelRegistryTest, ATenantAtItsInspectionBoundWaitsWithoutHoldingUpAnother) {
  ModelRegistry models(metadata_.get(), blobs_.get(), 1 << 20, &runner_, [](const std::string& tenant) {
    TenantLimits limits;
    limits.max_concurrent_inspections = tenant == "a" ? 1 : 0;
    return limits;
  });
  models.SetInspectionWait(absl::Milliseconds(50));
  absl::Notification inspecting, release;
  runner_.before_inspect = [&]() -> absl::Status {
    if (!inspecting.HasBeenNotified()) {
      inspecting.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  };
  const v1::UploadHeader first = StageUpload(models, "a", "a's first model");
  absl::StatusOr<v1::Model> first_done;
  std::thread flood([&] { first_done = models.FinishUpload("a", first); });
  inspecting.WaitForNotification();

  const v1::UploadHeader second = StageUpload(models, "a", "a's second model");
  absl::StatusOr<v1::Model> refused = models.FinishUpload("a", second);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), AllOf(HasSubstr("max_concurrent_inspections"), HasSubstr("Retry")));
  auto staged = models.UploadStatus("a", second.sha256());
  ASSERT_TRUE(staged.ok());
  EXPECT_EQ(staged->committed_size(), second.size());  // nothing to send again

  EXPECT_TRUE(models.FinishUpload("b", StageUpload(models, "b", "b's model")).ok());
  release.Notify();
  flood.join();
  EXPECT_TRUE(first_done.ok()) << first_done.status();
  EXPECT_TRUE(models.FinishUpload("a", second).ok());  // the retry finishes what was staged
}

// Several clients of one tenant finish the same staged bytes at once (each saw them all
// committed): one inspects and stores the model, the others wait for it and get that model;
// none is told the upload is incomplete or corrupt, and it is inspected once.
TEST_F(ModelRegistryTest, ClientsFinishingTheSameBytesAtOnceGetOneModelInspectedOnce) {
  std::atomic<int> inspections{0};
  absl::Notification inspecting, release;
  runner_.before_inspect = [&]() -> absl::Status {
    if (++inspections == 1) {
      inspecting.Notify();
      release.WaitForNotification();
    }
    return absl::OkStatus();
  };
  const v1::UploadHeader header = StageUpload(*models_, "t", "the same bytes");
  constexpr int kClients = 3;
  std::vector<absl::StatusOr<v1::Model>> finished(kClients);
  std::vector<std::thread> clients;
  clients.emplace_back([&] { finished[0] = models_->FinishUpload("t", header); });
  inspecting.WaitForNotification();
  for (int i = 1; i < kClients; ++i) clients.emplace_back([&, i] { finished[i] = models_->FinishUpload("t", header); });
  absl::SleepFor(absl::Milliseconds(100));  // the late clients are waiting, not failing
  release.Notify();
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(finished[i].ok()) << i << ": " << finished[i].status();
    EXPECT_EQ(finished[i]->id(), finished[0]->id());
    EXPECT_EQ(finished[i]->version(), 1);
  }
  EXPECT_EQ(inspections.load(), 1);
}

// An answer of a host with no room for an inspection while `*full`.
std::function<absl::Status()> FullWhile(const bool* full) {
  return [full]() -> absl::Status {
    if (*full) return absl::ResourceExhaustedError("4 inspections are running on this host");
    return absl::OkStatus();
  };
}

// No room is not a verdict on the model.
void ExpectNoRoomNotRefused(const absl::StatusOr<v1::Model>& finished) {
  EXPECT_TRUE(absl::IsResourceExhausted(finished.status())) << finished.status();
  EXPECT_THAT(finished.status().message(), Not(HasSubstr("model refused")));
}

// This host had no room (the runner's bound, asked before the commit): not a refused model,
// and nothing committed: the bytes stay staged, counted as the tenant's, and finishing again
// is enough.
TEST_F(ModelRegistryTest, AFullHostLeavesTheUploadStagedNotABlobNoModelRefersTo) {
  bool host_full = true;
  runner_.reserve = FullWhile(&host_full);
  const v1::UploadHeader header = StageUpload(*models_, "t", "a model");
  ExpectNoRoomNotRefused(models_->FinishUpload("t", header));
  EXPECT_FALSE(blobs_->Has(header.sha256()));
  EXPECT_EQ(*blobs_->UploadedSize("t", header.sha256()), header.size());
  EXPECT_EQ(blobs_->UploadUsageOf("t")->bytes, header.size());
  host_full = false;
  EXPECT_TRUE(models_->FinishUpload("t", header).ok());
  EXPECT_TRUE(blobs_->Has(header.sha256()));
}

// A remote inspector's host had no room (its bound is the worker's, met after the commit):
// not a refused model; the same upload finishes later.
TEST_F(ModelRegistryTest, AFullHostIsNotARefusedModel) {
  bool host_full = true;
  runner_.before_inspect = FullWhile(&host_full);
  const v1::UploadHeader header = StageUpload(*models_, "t", "a model");
  ExpectNoRoomNotRefused(models_->FinishUpload("t", header));
  host_full = false;
  // The client resumes: nothing staged is left, it sends the bytes again, and the commit finds the blob.
  const v1::UploadHeader again = StageUpload(*models_, "t", "a model");
  EXPECT_TRUE(models_->FinishUpload("t", again).ok());
}

TEST_F(ModelRegistryTest, UploadsUnderANameThatWouldNotReadBackAreRefusedBeforeAnyByte) {
  for (const std::string name : {"a:b", "deadbeef", "sha256", "x/y"}) {
    v1::UploadHeader header;
    header.set_name(name);
    header.set_size(5);
    header.set_sha256(Sha256Hex("bytes"));
    absl::StatusOr<std::optional<v1::Model>> started = models_->StartUpload("t", header);
    EXPECT_TRUE(absl::IsInvalidArgument(started.status())) << name << ": " << started.status();
  }
}

TEST_F(ModelRegistryTest, AnAmbiguousPrefixListsItsCandidatesAndALongerOneResolves) {
  // Digests that share 6 digits cannot be made by uploading; the store takes them as given.
  for (const char* last : {"1", "2"}) {
    v1::Model model;
    model.set_id(absl::StrCat("sha256:abcdef", std::string(57, '0'), last));
    model.set_tenant("t");
    model.set_name("twin");
    ASSERT_TRUE(metadata_->PutModel(model).ok());
  }
  absl::StatusOr<v1::Model> ambiguous = models_->Resolve("t", "abcdef");
  ASSERT_TRUE(absl::IsInvalidArgument(ambiguous.status())) << ambiguous.status();
  EXPECT_THAT(
      ambiguous.status().message(),
      AllOf(HasSubstr("ambiguous"), HasSubstr(absl::StrCat("sha256:abcdef", std::string(57, '0'), "1 (twin:1)")),
            HasSubstr(absl::StrCat("sha256:abcdef", std::string(57, '0'), "2 (twin:2)")), HasSubstr("more digits")));
  EXPECT_EQ(Resolved("t", absl::StrCat("sha256:abcdef", std::string(57, '0'), "2")), "twin:2");
  EXPECT_EQ(Resolved("t", absl::StrCat("abcdef", std::string(57, '0'), "1")), "twin:1");  // 64: the full id
}

TEST_F(ModelRegistryTest, AnotherTenantsNamesPrefixesAndIdsAreNotFoundWithoutAHint) {
  const std::string theirs = UploadAnyModel(*models_, "victim", "secret bytes", "secret-model");
  ASSERT_FALSE(theirs.empty());
  const std::string prefix = theirs.substr(7, 8);
  for (const std::string& reference :
       {std::string("secret-model"), std::string("secret-model:1"), prefix, theirs.substr(0, 7 + 8), theirs}) {
    absl::StatusOr<v1::Model> model = models_->Resolve("attacker", reference);
    ASSERT_TRUE(absl::IsNotFound(model.status())) << reference << ": " << model.status();
    EXPECT_THAT(model.status().message(), AllOf(Not(HasSubstr("victim")), Not(HasSubstr("secret bytes"))));
    EXPECT_TRUE(absl::IsNotFound(models_->Delete("attacker", reference).status())) << reference;
  }
  // Worded exactly as for a prefix nobody has.
  EXPECT_EQ(models_->Resolve("attacker", prefix).status().message(),
            absl::StrCat("no model's digest starts with ", prefix,
                         "; list your models to see their names and versions"));
  EXPECT_EQ(Resolved("victim", "secret-model"), "secret-model:1");  // still theirs
}

TEST_F(ModelRegistryTest, DeleteTakesAnyReferenceReturnsWhatItDeletedAndNeverReusesTheNumber) {
  const std::string v1 = UploadAnyModel(*models_, "t", "first bytes", "rn50");
  const std::string v2 = UploadAnyModel(*models_, "t", "second bytes", "rn50");
  absl::StatusOr<v1::Model> deleted = models_->Delete("t", "rn50");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->id(), v2);
  EXPECT_FALSE(blobs_->Has(v2.substr(7)));  // nobody else had its bytes
  EXPECT_EQ(Resolved("t", "rn50"), "rn50:1");
  EXPECT_EQ(UploadAnyModel(*models_, "t", "third bytes", "rn50").empty(), false);
  EXPECT_EQ(Resolved("t", "rn50"), "rn50:3");
  EXPECT_EQ(Resolved("t", "rn50:2"), "NOT_FOUND");
  ASSERT_TRUE(models_->Delete("t", v1.substr(7, 10)).ok());
  EXPECT_EQ(Resolved("t", "rn50:1"), "NOT_FOUND");
}

}  // namespace
}  // namespace recal::jobs
