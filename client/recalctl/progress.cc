#include "client/recalctl/progress.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/recalctl/output.h"

namespace recal::ctl {
namespace {

constexpr int kBarWidth = 24;
// Plain (non-terminal) progress lines: at most one per this long, state changes aside.
constexpr absl::Duration kPlainInterval = absl::Seconds(3);
constexpr absl::Duration kTtyInterval = absl::Milliseconds(100);

std::string Bar(int64_t done, int64_t total) {
  if (total <= 0) return "";
  const int filled = static_cast<int>(kBarWidth * std::min<double>(1.0, static_cast<double>(done) / total));
  return absl::StrCat("[", std::string(filled, '#'), std::string(kBarWidth - filled, '-'), "] ");
}

}  // namespace

void ProgressDisplay::Show(const std::string& text, bool important) {
  if (!enabled_) return;
  const absl::Time now = absl::Now();
  if (!important && now - last_shown_ < (tty_ ? kTtyInterval : kPlainInterval)) return;
  last_shown_ = now;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    bar_open_ = true;
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void ProgressDisplay::EndBar() {
  if (bar_open_) std::fputc('\n', stderr);
  bar_open_ = false;
}

void ProgressDisplay::Line(const std::string& text) {
  if (!enabled_) return;
  EndBar();
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

void ProgressDisplay::Transfer(const std::string& what, int64_t done, int64_t total, const char* unit) {
  const bool bytes = std::string(unit) == "bytes";
  const bool first = what != transfer_;
  if (first) {
    EndBar();
    transfer_ = what;
    transfer_start_ = absl::Now();
  }
  const bool finished = total > 0 && done >= total;
  const double seconds = absl::ToDoubleSeconds(absl::Now() - transfer_start_);
  // Too short a time says nothing about the rate (the first chunk leaves in microseconds).
  const double rate = seconds >= 0.25 ? done / seconds : 0;
  std::string text = absl::StrCat(what, " ", Bar(done, total));
  if (bytes) {
    absl::StrAppend(&text, FormatBytes(done), total > 0 ? absl::StrCat(" / ", FormatBytes(total)) : "");
    if (rate > 0) absl::StrAppend(&text, "  ", FormatBytes(static_cast<int64_t>(rate)), "/s");
  } else {
    absl::StrAppend(&text, done, total > 0 ? absl::StrCat("/", total) : "", " ", unit);
    if (rate > 0) absl::StrAppendFormat(&text, "  %.1f %s/s", rate, unit);
  }
  if (rate > 0 && total > done) absl::StrAppend(&text, "  ETA ", FormatDuration((total - done) / rate));
  Show(text, first || finished);
  if (finished) EndBar();
}

void ProgressDisplay::Event(const v1::JobEvent& event) {
  if (event.has_snapshot()) {
    // Only the job's id: a watch from seq 0 replays every state change after it, and a
    // resumed one continues where the display already is.
    job_id_ = event.snapshot().id();
    // Why it waits, unless only for the moment an idle worker takes to claim it.
    const v1::JobWait& wait = event.snapshot().wait();
    if (event.snapshot().has_wait() && wait.cause() != v1::JobWait::STARTING) {
      Line(absl::StrCat("job ", job_id_, " waits: ", wait.reason()));
    }
    return;
  }
  switch (event.kind_case()) {
    case v1::JobEvent::kState:
      EndBar();
      Show(absl::StrCat("job ", job_id_, ": ", v1::JobState_Name(event.state())), true);
      EndBar();
      break;
    case v1::JobEvent::kProgress: {
      const v1::JobProgress& p = event.progress();
      std::string text =
          absl::StrCat("job ", job_id_, " ", Bar(p.batches_done(), p.batches_total()), p.batches_done(), "/",
                       p.batches_total() > 0 ? absl::StrCat(p.batches_total()) : "?", " batches");
      if (p.samples_per_second() > 0) {
        absl::StrAppendFormat(&text, "  %.1f samples/s", p.samples_per_second());
      }
      if (p.eta_seconds() > 0) absl::StrAppend(&text, "  ETA ", FormatDuration(p.eta_seconds()));
      if (p.rel_std_error() >= 0) absl::StrAppendFormat(&text, "  rel.err %.2g", p.rel_std_error());
      Show(text, false);
      break;
    }
    case v1::JobEvent::kSummary:
      Line(absl::StrCat("job ", job_id_, ": ", event.summary().layers_recalibrated(),
                        " BatchNorm layers recalibrated from ", event.summary().batches(), " batches (",
                        event.summary().samples(), " samples); per layer: recalctl report ", job_id_));
      // Said once a job, whatever the batches: what Recal did to the data (a cast).
      for (const std::string& note : event.summary().notes()) Line(absl::StrCat("job ", job_id_, ": note: ", note));
      break;
    case v1::JobEvent::kFailure:
      Line(absl::StrCat("job ", job_id_, " failed: ", event.failure().message()));
      break;
    default:
      break;
  }
}

}  // namespace recal::ctl
