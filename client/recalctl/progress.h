// Progress on stderr, so that stdout holds the result alone: on a terminal one line
// redrawn in place with a bar, the rate and the ETA; otherwise (a log, a pipe) plain
// lines, state changes always and progress at most every few seconds.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"

namespace recal::ctl {

class ProgressDisplay {
 public:
  // `enabled` false (--quiet): nothing is shown. `tty`: stderr is a terminal.
  ProgressDisplay(bool enabled, bool tty) : enabled_(enabled), tty_(tty) {}
  ~ProgressDisplay() { EndBar(); }
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  // Bytes or batches of `what` ("upload model.pt"): done of total (0: unknown).
  void Transfer(const std::string& what, int64_t done, int64_t total, const char* unit = "bytes");
  void Event(const v1::JobEvent& event);
  // A message line of its own.
  void Line(const std::string& text);

 private:
  void Show(const std::string& text, bool important);
  void EndBar();

  const bool enabled_;
  const bool tty_;
  bool bar_open_ = false;
  absl::Time last_shown_ = absl::InfinitePast();
  std::string transfer_;  // what the current transfer is
  absl::Time transfer_start_;
  std::string job_id_;
};

}  // namespace recal::ctl
