// What the metadata store tests share: opening a store (a test failure if it does not
// open) and small models, jobs and events.
#pragma once

#include <memory>
#include <string>
#include <vector>

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
