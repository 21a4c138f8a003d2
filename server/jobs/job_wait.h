// Why a QUEUED job has not started (v1::JobWait, which GetJob shows): the store's counts of
// the queue around it and the one sentence that tells a person what it waits for.
#pragma once

#include <cstdint>

#include "recal/v1/recal.pb.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

// `tenant_max_running`: the job's tenant's bound on running jobs (0: none); `workers_here`:
// this process runs jobs itself (role all), so a worker exists whatever the store heard.
v1::JobWait DescribeWait(const v1::Job& job, const store::QueueCounts& counts, int64_t tenant_max_running,
                         bool workers_here);

}  // namespace recal::jobs
