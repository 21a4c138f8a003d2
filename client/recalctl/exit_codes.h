// recalctl's exit codes (also in `recalctl --help` and docs/clients.md):
//   0  succeeded (health: the server is SERVING)
//   1  any other error (a refused request, a failed download, NOT_SERVING, ...)
//   2  bad usage: unknown command or flag, missing or malformed argument or data spec
//   3  server unreachable (UNAVAILABLE after the retries, or a call's deadline passed)
//   4  not found (no such job, model or local file)
//   5  the job failed (watch, run)
//   6  the job was cancelled (watch, run)
#pragma once

#include "absl/status/status.h"
#include "recal/v1/recal.pb.h"

namespace recal::ctl {

enum ExitCode : int {
  kOk = 0,
  kError = 1,
  kUsage = 2,
  kUnreachable = 3,
  kNotFound = 4,
  kJobFailed = 5,
  kJobCancelled = 6,
};

// The exit code for an error status (a failed job's status carries the job: 5 or 6).
int ExitCodeFor(const absl::Status& status);

// 0, 5 or 6 for a job that has ended; 1 for one that has not.
int ExitCodeForJob(const v1::Job& job);

}  // namespace recal::ctl
