// The gauges recal-server's /metrics computes when scraped: jobs queued and running, upload
// inspections, the upload disk's free space and floor, and each tenant's stored bytes as its
// quota counts them.
#pragma once

#include <vector>

#include "server/auth/authenticator.h"
#include "server/jobs/inspection_slots.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/model_registry.h"
#include "server/metrics/metrics.h"
#include "server/store/disk_floor.h"

namespace recal::app {

// Every argument must outlive the exposer serving the gauges. `host_inspections`: the slots
// of the inspections running on this host; `disk`: the floor of the disk uploads are staged on.
std::vector<metrics::ScrapedGauge> ServerGauges(const jobs::JobManager* jobs,
                                                const jobs::InspectionSlots* host_inspections,
                                                jobs::ModelRegistry* models, const auth::Authenticator* auth,
                                                const store::DiskFloor* disk);

}  // namespace recal::app
