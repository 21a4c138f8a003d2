// How this process starts recal-worker for jobs and upload inspections, from its options:
// where the binary is, the limits of its sandbox, the data it may read, and how many
// inspections may run on this host at once.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "server/app/server_options.h"
#include "server/jobs/worker_runner.h"

namespace recal::app {

// options.worker_binary, else recal-worker beside this executable.
std::string WorkerBinary(const ServerOptions& options);

// The runner's options for `binary`, inspections scratching under `scratch_root`. Data in a
// bucket is connected only where a data root names one (a server without any needs no
// object-storage configuration): that configuration's or connection's error otherwise.
// --worker_memory_cgroup: auto finds where the workers' memory cgroups go (jobs::
// WorkerCgroupParent; in cgroup v2 this process may move into a leaf group of its own), or
// why there are none; required refuses to start without (FAILED_PRECONDITION, with why);
// off makes none. Another value is INVALID_ARGUMENT.
absl::StatusOr<jobs::WorkerRunnerOptions> WorkerRunnerOptionsFor(const ServerOptions& options, std::string binary,
                                                                 std::string scratch_root);

}  // namespace recal::app
