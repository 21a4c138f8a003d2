// What the metadata store tests share: opening a store (a test failure if it does not
// open) and small models, jobs and events.
#pragma once

#include <memory>
#include <string>
#include <vector>

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
