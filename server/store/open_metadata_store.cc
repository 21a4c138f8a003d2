#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/store/metadata_store.h"
#include "server/store/postgres_metadata_store.h"
#include "server/store/sqlite_metadata_store.h"

namespace recal::store {

absl::StatusOr<std::unique_ptr<MetadataStore>> OpenMetadataStore(const std::string& spec, int postgres_connections) {
  absl::string_view rest = spec;
  if (absl::StartsWith(spec, "postgresql://") || absl::StartsWith(spec, "postgres://")) {
    auto postgres = PostgresMetadataStore::Open(spec, postgres_connections);
    if (!postgres.ok()) return postgres.status();
    return std::unique_ptr<MetadataStore>(*std::move(postgres));
  }
  absl::ConsumePrefix(&rest, "sqlite:");
  if (rest.empty()) return absl::InvalidArgumentError(absl::StrCat("store '", spec, "' names no file"));
  auto sqlite = SqliteMetadataStore::Open(std::string(rest));
  if (!sqlite.ok()) return sqlite.status();
  return std::unique_ptr<MetadataStore>(*std::move(sqlite));
}

}  // namespace recal::store
