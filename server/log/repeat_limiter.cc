#include "server/log/repeat_limiter.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recal::log {
namespace {
// The entry every source shares once max_sources are held.
constexpr absl::string_view kOthers = "(other peers)";
}  // namespace

RepeatLimiter::Decision RepeatLimiter::Note(const std::string& source, absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(source);
  if (it == windows_.end() && windows_.size() >= max_sources_) {
    // Make room from ended windows that suppressed nothing (those that did still owe a summary).
    for (auto old = windows_.begin(); old != windows_.end();) {
      const bool ended = now - old->second.start >= interval_ && old->second.events <= burst_;
      old = ended ? windows_.erase(old) : std::next(old);
    }
    if (windows_.size() >= max_sources_) it = windows_.try_emplace(std::string(kOthers), Window{now}).first;
  }
  if (it == windows_.end()) it = windows_.emplace(source, Window{now}).first;
  Window& window = it->second;
  Decision decision;
  if (now - window.start >= interval_) {
    decision.suppressed_before = window.events > burst_ ? window.events - burst_ : 0;
    window = Window{now};
  }
  decision.write = ++window.events <= burst_;
  decision.first_unwritten = window.events == burst_ + 1;
  return decision;
}

void WarnLimited(RepeatLimiter& limiter, const std::string& source, absl::string_view msg, const Fields& fields) {
  const RepeatLimiter::Decision decision = limiter.Note(source, absl::Now());
  if (decision.suppressed_before > 0) {
    Warning(absl::StrCat(msg, ": ", decision.suppressed_before, " more suppressed"),
            {{"peer", source}, {"suppressed", decision.suppressed_before}});
  }
  if (decision.write) {
    Warning(msg, fields);
  } else if (decision.first_unwritten) {
    Warning(absl::StrCat(msg, ": further ones from this peer are counted, not logged, for the interval"),
            {{"peer", source}, {"interval", absl::FormatDuration(limiter.interval())}});
  }
}

std::string PeerHost(absl::string_view peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return std::string(peer);
  const size_t colon = peer.rfind(':');
  const size_t bracket = peer.rfind(']');
  if (colon == absl::string_view::npos || colon < 5 || (bracket != absl::string_view::npos && colon < bracket)) {
    return std::string(peer);
  }
  return std::string(peer.substr(0, colon));
}

}  // namespace recal::log
