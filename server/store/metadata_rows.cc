#include "server/store/metadata_rows.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace recal::store::internal::rows {
namespace {
constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
}  // namespace

int ClampPageSize(int page_size) {
  if (page_size <= 0) return kDefaultPageSize;
  return page_size > kMaxPageSize ? kMaxPageSize : page_size;
}

std::string EncodePageToken(absl::string_view kind, int64_t last_seq) {
  return absl::WebSafeBase64Escape(absl::StrCat(kind, ":", last_seq));
}

absl::StatusOr<int64_t> DecodePageToken(absl::string_view kind, const std::string& token) {
  if (token.empty()) return 0;
  std::string raw;
  int64_t seq = 0;
  if (absl::WebSafeBase64Unescape(token, &raw)) {
    absl::string_view rest(raw);
    if (absl::ConsumePrefix(&rest, kind) && absl::ConsumePrefix(&rest, ":") && absl::SimpleAtoi(rest, &seq) &&
        seq > 0) {
      return seq;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("page_token '", token.substr(0, 64), token.size() > 64 ? "...'" : "'",
                   " is not one this server returned for listing ", kind,
                   "; pass the next_page_token of the previous response, or empty to start over"));
}

std::optional<std::vector<v1::JobState>> NormalizeStates(const std::vector<v1::JobState>& states) {
  std::vector<v1::JobState> out;
  for (const v1::JobState s : states) {
    if (v1::JobState_IsValid(s)) out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty() && !states.empty()) return std::nullopt;
  return out;
}

void SetNow(google::protobuf::Timestamp* ts) {
  const int64_t nanos = absl::ToInt64Nanoseconds(absl::Now() - absl::UnixEpoch());
  ts->set_seconds(nanos / 1000000000);
  ts->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

absl::Status CheckDeletable(const std::string& id, v1::JobState state, const std::string& parent_id,
                            int64_t shards_not_ended) {
  if (!parent_id.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("job '", id, "' is a shard of job '", parent_id,
                                                      "'; delete that job, its shards go with it"));
  }
  const bool ended = state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
  if (!ended) {
    return absl::FailedPreconditionError(absl::StrCat("job '", id, "' is ", v1::JobState_Name(state),
                                                      "; cancel it first (recalctl cancel ", id,
                                                      ") and delete it once it has ended"));
  }
  if (shards_not_ended > 0) {
    return absl::FailedPreconditionError(absl::StrCat("job '", id, "' has ", shards_not_ended,
                                                      " shard(s) still stopping; delete it once they have ended"));
  }
  return absl::OkStatus();
}

bool HoldsWorker(v1::JobState state) {
  return std::find(std::begin(kHoldingWorker), std::end(kHoldingWorker), state) != std::end(kHoldingWorker);
}

bool AtRunningBound(const MaxRunningJobs& max_running, const std::string& tenant, int64_t running) {
  if (!max_running) return false;
  const int64_t bound = max_running(tenant);
  return bound > 0 && running >= bound;
}

void SortByShard(std::vector<v1::Job>& children) {
  std::stable_sort(children.begin(), children.end(),
                   [](const v1::Job& a, const v1::Job& b) { return a.shard() < b.shard(); });
}

absl::Status CheckNewModel(const v1::Model& model) {
  if (model.id().empty()) return absl::InvalidArgumentError("cannot store a model without an id");
  if (model.tenant().empty()) return absl::InvalidArgumentError("cannot store a model without a tenant");
  return absl::OkStatus();
}

std::string StoredModelName(const v1::Model& model) {
  return model.name().empty() ? std::string(kDefaultModelName) : model.name();
}

v1::Model AsNextVersion(v1::Model model, int64_t last_version) {
  model.set_name(StoredModelName(model));
  model.set_version(last_version + 1);
  return model;
}

std::map<std::pair<std::string, std::string>, int64_t> NumberVersions(std::vector<v1::Model>& models) {
  std::map<std::pair<std::string, std::string>, int64_t> last;
  for (v1::Model& model : models) {
    int64_t& version = last[{model.tenant(), StoredModelName(model)}];
    model = AsNextVersion(std::move(model), version);
    version = model.version();
  }
  return last;
}

absl::Status CheckReservation(const Reservation& r) {
  if (r.tenant.empty() || r.key.empty() || r.bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("a reservation needs a tenant, a key and bytes >= 0 (got '",
                                                   r.tenant, "', '", r.key, "', ", r.bytes, ")"));
  }
  return absl::OkStatus();
}

bool Fits(const TenantUsage& usage, int64_t bytes, int64_t limit) {
  return limit <= 0 || usage.stored_bytes + bytes <= limit;
}

bool TouchIsDue(int64_t touched_ms, int64_t now_ms) {
  return now_ms - touched_ms >= absl::ToInt64Milliseconds(kReservationTouchEvery);
}

std::string UploadReservationOf(const v1::Model& model) {
  return UploadReservationKey(std::string(absl::StripPrefix(model.id(), "sha256:")));
}

}  // namespace recal::store::internal::rows

namespace recal::store {

std::string UploadReservationKey(const std::string& sha256_hex) { return absl::StrCat("upload:", sha256_hex); }
std::string ResultsReservationKey(const std::string& job_id) { return absl::StrCat("results:", job_id); }

}  // namespace recal::store
