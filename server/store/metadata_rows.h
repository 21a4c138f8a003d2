// What every metadata backend shares: page tokens, page sizes, state filters, timestamps and
// stored protos that must parse. Internal to server/store.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/timestamp.pb.h"
#include "recal/v1/recal.pb.h"
#include "server/store/metadata_store.h"

namespace recal::store::internal::rows {

int ClampPageSize(int page_size);

// Page tokens carry the create_seq of the last item returned and which list they belong to;
// base64 keeps them opaque so clients do not start building their own.
std::string EncodePageToken(absl::string_view kind, int64_t last_seq);
// The create_seq to continue below; 0 for an empty token (start from the newest).
absl::StatusOr<int64_t> DecodePageToken(absl::string_view kind, const std::string& token);

// The distinct valid states of a filter, sorted; empty means "any state". nullopt when the
// caller asked for states but none is a JobState (proto3 enums from the wire may hold any
// int), i.e. nothing matches. Deduplicating also bounds the statement cache: at most one
// statement per filter size.
std::optional<std::vector<v1::JobState>> NormalizeStates(const std::vector<v1::JobState>& states);

void SetNow(google::protobuf::Timestamp* ts);

// What DeleteJob refuses (FAILED_PRECONDITION, saying what to do), given the job's state and
// parent and how many of its shards have not ended; OK when it may go.
absl::Status CheckDeletable(const std::string& id, v1::JobState state, const std::string& parent_id,
                            int64_t shards_not_ended);
// The states of a job that holds a worker (what MaxRunningJobs bounds): from its claim until
// its run has stopped.
inline constexpr v1::JobState kHoldingWorker[] = {v1::RUNNING, v1::CANCELLING};
bool HoldsWorker(v1::JobState state);
// Whether `tenant`, whose jobs hold `running` workers, may not have another (ClaimJob passes
// over its jobs). No `max_running`, or 0 for the tenant: never.
bool AtRunningBound(const MaxRunningJobs& max_running, const std::string& tenant, int64_t running);

// Sorts a sharded job's children, read in create_seq order, by shard index (stable: equal
// indexes stay in create_seq order).
void SortByShard(std::vector<v1::Job>& children);

// What PutModel needs of a model: an id and a tenant (INVALID_ARGUMENT otherwise).
absl::Status CheckNewModel(const v1::Model& model);
// The name a model is stored under: its own, or kDefaultModelName when it has none.
std::string StoredModelName(const v1::Model& model);
// The model as stored when its bytes are new to its tenant: under StoredModelName, as version
// `last_version` + 1, where `last_version` is the highest version the name ever had in the
// tenant (0: none). The one rule for numbering versions, for PutModel and migrations alike.
v1::Model AsNextVersion(v1::Model model, int64_t last_version);
// Schema version 7 numbers the models of an older database: `models` (all of them, in the
// order they were created) get AsNextVersion of their tenant and name in turn. Returns the
// last version of each (tenant, name), for the table that keeps them.
std::map<std::pair<std::string, std::string>, int64_t> NumberVersions(std::vector<v1::Model>& models);

// Reservations (MetadataStore::Reserve). What Reserve needs of one: a tenant, a key and
// bytes >= 0 (INVALID_ARGUMENT otherwise).
absl::Status CheckReservation(const Reservation& r);
// Whether `bytes` more fit under `limit` (0: no limit) beside what `usage` counts.
bool Fits(const TenantUsage& usage, int64_t bytes, int64_t limit);
// Whether a reservation touched at `touched_ms` is written again at `now_ms`
// (kReservationTouchEvery).
bool TouchIsDue(int64_t touched_ms, int64_t now_ms);
// The reservation PutModel turns into `model` (its id's digest's UploadReservationKey).
std::string UploadReservationOf(const v1::Model& model);

template <typename Message>
absl::StatusOr<Message> Parse(const std::string& bytes, absl::string_view what, absl::string_view id) {
  Message m;
  if (!m.ParseFromString(bytes)) {
    return absl::InternalError(absl::StrCat("stored ", what, " '", id, "' does not parse; the database is corrupt"));
  }
  return m;
}

}  // namespace recal::store::internal::rows
