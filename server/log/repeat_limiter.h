// How many lines one source (a peer) may write about one kind of event (a call refused as
// unauthenticated) in an interval: the first `burst` of each interval are written, the rest
// are counted and reported by one summary at the source's next event after the interval.
// Holds at most `max_sources` sources; beyond them the others share one entry. Thread-safe.
//   RepeatLimiter limiter(5, absl::Seconds(60));
//   WarnLimited(limiter, PeerHost(context->peer()), "audit", {{"peer", context->peer()}, ...});
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/log/log.h"

namespace recal::log {

class RepeatLimiter {
 public:
  struct Decision {
    bool write = false;             // write this event's line
    bool first_unwritten = false;   // the first event of this interval left unwritten
    int64_t suppressed_before = 0;  // events of this source left unwritten in its last interval
  };

  RepeatLimiter(int burst, absl::Duration interval, size_t max_sources = 10000)
      : burst_(burst), interval_(interval), max_sources_(max_sources) {}

  Decision Note(const std::string& source, absl::Time now);
  absl::Duration interval() const { return interval_; }

 private:
  struct Window {
    absl::Time start;
    int64_t events = 0;
  };
  const int burst_;
  const absl::Duration interval_;
  const size_t max_sources_;
  std::mutex mu_;
  std::map<std::string, Window> windows_;
};

// A warning `msg` from `source` (a peer), written if `limiter` lets it through; the first one
// it holds back says that further ones are counted, not logged; the source's next line after
// the interval is preceded by "<msg>: N more suppressed".
void WarnLimited(RepeatLimiter& limiter, const std::string& source, absl::string_view msg, const Fields& fields);

// A gRPC peer ("ipv4:10.0.0.1:5123", "ipv6:[::1]:5123") without its port: one client opening
// new connections is still one source.
std::string PeerHost(absl::string_view peer);

}  // namespace recal::log
