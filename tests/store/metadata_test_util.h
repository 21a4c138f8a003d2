// What the metadata store tests share: opening a store (a test failure if it does not
// open) and small models, jobs and events.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/store/metadata_store.h"

namespace recal::store::test {

inline std::unique_ptr<MetadataStore> OpenDb(const std::string& spec) {
  absl::StatusOr<std::unique_ptr<MetadataStore>> db = OpenMetadataStore(spec);
  EXPECT_TRUE(db.ok()) << db.status();
  return db.ok() ? std::move(*db) : nullptr;
}

inline v1::Model MakeModel(const std::string& id, const std::string& name, const std::string& tenant = "t") {
  v1::Model m;
  m.set_id(id);
  m.set_tenant(tenant);
  m.set_name(name);
  m.set_size(42);
  return m;
}

// "sha256:" + `hex`, padded with zeros to a full digest.
inline std::string DigestId(const std::string& hex) { return "sha256:" + hex + std::string(64 - hex.size(), '0'); }

// A store opened on a database from before schema v7 (models without names or versions) that
// held, in this creation order: DigestId("a1") "rn50", DigestId("b2") unnamed, DigestId("c3")
// "rn50" of tenant "t", and DigestId("d4") "rn50" of tenant "u". Each (tenant, name) counts
// from 1 in creation order; the unnamed one is kDefaultModelName's; new bytes go on from there.
inline void ExpectPreV7ModelsNumberedInCreationOrder(MetadataStore& store) {
  const auto version_of = [&](const std::string& tenant, const std::string& id) {
    absl::StatusOr<v1::Model> model = store.GetModel(tenant, id);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? absl::StrCat(model->name(), ":", model->version()) : "";
  };
  EXPECT_EQ(version_of("t", DigestId("a1")), "rn50:1");
  EXPECT_EQ(version_of("t", DigestId("c3")), "rn50:2");
  EXPECT_EQ(version_of("t", DigestId("b2")), absl::StrCat(kDefaultModelName, ":1"));
  EXPECT_EQ(version_of("u", DigestId("d4")), "rn50:1");
  EXPECT_EQ(store.GetModelVersion("t", "rn50", 0)->id(), DigestId("c3"));
  EXPECT_EQ(store.GetModelVersion("t", kDefaultModelName, 1)->id(), DigestId("b2"));
  v1::Model next;
  next.set_id(DigestId("e5"));
  next.set_tenant("t");
  next.set_name("rn50");
  EXPECT_EQ(store.PutModel(next)->version(), 3);
  next.set_tenant("u");
  EXPECT_EQ(store.PutModel(next)->version(), 2);
}

inline v1::Job MakeJob(const std::string& id, v1::JobState state, const std::string& request_id = "",
                       const std::string& model_id = "sha256:m", const std::string& tenant = "t") {
  v1::Job j;
  j.set_id(id);
  j.set_tenant(tenant);
  j.set_request_id(request_id);
  j.set_state(state);
  j.mutable_spec()->set_model_id(model_id);
  return j;
}

// A store opened on a database from before schema v6 holding the jobs "queued" (QUEUED,
// request_id "key") and "done" (SUCCEEDED) of tenant "t", without creation times: they count as
// active for max_active_jobs and in no minute for max_submissions_per_minute.
inline void ExpectPreV6JobsCountAsActiveButInNoMinute(MetadataStore& store) {
  EXPECT_EQ(store.FindJobByRequestId("t", "key")->id(), "queued");
  const int64_t now = absl::ToUnixMillis(absl::Now());
  JobQuota active;
  active.max_active_jobs = 2;
  active.now_ms = now;
  bool created = false;
  ASSERT_TRUE(store.CreateJob(MakeJob("new", v1::QUEUED), &created, {}, {}, active).ok());
  absl::StatusOr<v1::Job> over = store.CreateJob(MakeJob("over", v1::QUEUED), &created, {}, {}, active);
  EXPECT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();  // "queued" and "new"
  JobQuota minute;
  minute.max_submissions_per_minute = 2;
  minute.now_ms = now;
  ASSERT_TRUE(store.CreateJob(MakeJob("second", v1::QUEUED), &created, {}, {}, minute).ok());
  over = store.CreateJob(MakeJob("third", v1::QUEUED), &created, {}, {}, minute);
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_NE(over.status().message().find("submitted 2 jobs"), absl::string_view::npos) << over.status();
}

// A store opened on a database from before schema v8 holding the job "old" (QUEUED,
// request_id "key") and the model DigestId("a1"), "rn50" version 1, of tenant "t": the job's
// plan reads empty, the rest as before, and a new job ("new") stores its plan, "p\0\xff".
inline void ExpectPreV8JobsReadAnEmptyPlan(MetadataStore& store) {
  absl::StatusOr<std::string> plan = store.JobPlan("old");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(*plan, "");
  EXPECT_EQ(store.FindJobByRequestId("t", "key")->id(), "old");
  EXPECT_EQ(store.GetModelVersion("t", "rn50", 0)->id(), DigestId("a1"));
  const std::string new_plan("p\0\xff", 3);
  ASSERT_TRUE(store.CreateJob(MakeJob("new", v1::QUEUED), nullptr, {}, {}, {}, new_plan).ok());
  EXPECT_EQ(*store.JobPlan("new"), new_plan);
}

// A store opened on a database from before schema v9 (no reservations) that held tenant
// "t"'s model DigestId("a1") of 42 bytes: the model counts as before, nothing is reserved,
// and reservations are taken beside it against a limit.
inline void ExpectPreV9ModelsCountAndReservationsAreTakenBesideThem(MetadataStore& store) {
  absl::StatusOr<TenantUsage> usage = store.Usage("t");
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ(usage->model_bytes, 42);
  EXPECT_EQ(usage->reservations, 0);
  EXPECT_EQ(usage->stored_bytes, 42);
  const int64_t now = absl::ToUnixMillis(absl::Now());
  EXPECT_TRUE(store.Reserve({"t", UploadReservationKey("b2"), 58}, 100, now)->granted);
  EXPECT_FALSE(store.Reserve({"t", UploadReservationKey("c3"), 1}, 100, now)->granted);
  EXPECT_EQ(store.Usage("t")->stored_bytes, 100);
}

inline v1::JobEvent StateEvent(v1::JobState s) {
  v1::JobEvent e;
  e.set_state(s);
  return e;
}

inline std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.id());
  return ids;
}

}  // namespace recal::store::test
