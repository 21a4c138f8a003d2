// What only the PostgreSQL backend has: URIs, lost connections, schema versions in the
// database, text it cannot hold.
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/store/metadata_store.h"
#include "tests/store/metadata_test_util.h"
#include "tests/store/postgres_server.h"

namespace recal::store {
namespace {

using ::recal::store::test::MakeJob;
using ::recal::store::test::OpenDb;
using ::recal::store::test::StateEvent;
using ::recal::testing::PostgresServer;

class PostgresMetadataStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<PostgresServer*> server = PostgresServer::Shared();
    if (absl::IsNotFound(server.status())) GTEST_SKIP() << server.status().message();
    ASSERT_TRUE(server.ok()) << server.status();
    absl::StatusOr<std::string> uri = (*server)->NewDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    uri_ = *uri;
  }
  std::string uri_;
};

TEST_F(PostgresMetadataStoreTest, BothUriSchemesOpenIt) {
  ASSERT_TRUE(absl::StartsWith(uri_, "postgresql://"));
  auto db = OpenDb(uri_);
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->CreateJob(MakeJob("j", v1::QUEUED), nullptr).ok());
  auto short_scheme = OpenDb(absl::StrCat("postgres://", uri_.substr(std::strlen("postgresql://"))));
  ASSERT_NE(short_scheme, nullptr);
  EXPECT_EQ(short_scheme->GetJob("j")->id(), "j");
}

TEST_F(PostgresMetadataStoreTest, ReconnectsWhenTheServerDropsTheConnection) {
  auto db = OpenDb(uri_);
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->CreateJob(MakeJob("j", v1::QUEUED), nullptr).ok());
  // Ends every other session on the database and waits until they are gone, as a server
  // restart or a failover would.
  const std::string drop_others =
      "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
      "WHERE datname = current_database() AND pid <> pg_backend_pid()";
  ASSERT_TRUE(PostgresServer::Execute(uri_, drop_others).ok());
  absl::StatusOr<v1::Job> job = db->GetJob("j");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::QUEUED);
  // A write whose transaction never reached COMMIT is redone on the new connection.
  ASSERT_TRUE(PostgresServer::Execute(uri_, drop_others).ok());
  absl::StatusOr<v1::JobEvent> event = db->AppendEvent("j", StateEvent(v1::QUEUED));
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(event->seq(), 1);
  EXPECT_EQ(db->EventsAfter("j", 0, 0)->size(), 1u);
}

TEST_F(PostgresMetadataStoreTest, ADatabaseWithANewerSchemaIsRefused) {
  ASSERT_NE(OpenDb(uri_), nullptr);
  ASSERT_TRUE(PostgresServer::Execute(uri_, "UPDATE schema_version SET version = 99").ok());
  absl::StatusOr<std::unique_ptr<MetadataStore>> db = OpenMetadataStore(uri_);
  ASSERT_TRUE(absl::IsFailedPrecondition(db.status())) << db.status();
  EXPECT_NE(db.status().message().find("schema version 99"), absl::string_view::npos) << db.status();
}

// PostgreSQL TEXT cannot hold a NUL byte (SQLite's can): refused rather than cut short.
TEST_F(PostgresMetadataStoreTest, TextWithANulByteIsInvalidArgument) {
  auto db = OpenDb(uri_);
  ASSERT_NE(db, nullptr);
  const std::string id("j\0k", 3);
  EXPECT_TRUE(absl::IsInvalidArgument(db->CreateJob(MakeJob(id, v1::QUEUED), nullptr).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(db->GetJob(id).status()));
  EXPECT_TRUE(absl::IsNotFound(db->GetJob("j").status()));
}

// Needs no server: nothing listens on port 1.
TEST(PostgresMetadataStoreOpenTest, AnUnreachableServerIsUnavailableNamingItButNotThePassword) {
  for (const std::string scheme : {"postgresql", "postgres"}) {
    absl::StatusOr<std::unique_ptr<MetadataStore>> db =
        OpenMetadataStore(absl::StrCat(scheme, "://recal:s3cret-pw@127.0.0.1:1/recal"));
    ASSERT_FALSE(db.ok());
    EXPECT_TRUE(absl::IsUnavailable(db.status())) << db.status();
    EXPECT_NE(db.status().message().find("127.0.0.1:1/recal"), absl::string_view::npos) << db.status();
    EXPECT_EQ(db.status().message().find("s3cret"), absl::string_view::npos) << db.status();
  }
  absl::StatusOr<std::unique_ptr<MetadataStore>> bad = OpenMetadataStore("postgresql://recal:s3cret%zz@127.0.0.1/recal");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_EQ(bad.status().message().find("s3cret"), absl::string_view::npos) << bad.status();
}

}  // namespace
}  // namespace recal::store
