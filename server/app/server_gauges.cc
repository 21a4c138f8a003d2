#include "server/app/server_gauges.h"

#include <map>
#include <string>
#include <utility>

namespace recal::app {

std::vector<metrics::ScrapedGauge> ServerGauges(const jobs::JobManager* jobs,
                                                const jobs::InspectionSlots* host_inspections,
                                                jobs::ModelRegistry* models, const auth::Authenticator* auth,
                                                const store::DiskFloor* disk) {
  std::vector<metrics::ScrapedGauge> gauges = {
      {"recal_jobs_queued", "Jobs waiting for a worker", [jobs] { return double(jobs->queued()); }},
      {"recal_jobs_running", "Jobs on a worker", [jobs] { return double(jobs->running()); }},
      {"recal_inspections_running", "Upload inspections running on this host",
       [host_inspections] { return double(host_inspections->running()); }},
      {"recal_inspections_queued", "Uploads waiting for an inspection slot (the host's or their tenant's)",
       [host_inspections, models] {
         return double(host_inspections->queued() + models->tenant_inspections().queued());
       }},
      {"recal_inspections_refused", "Uploads refused RESOURCE_EXHAUSTED for want of an inspection slot since start",
       [host_inspections, models] {
         return double(host_inspections->refused() + models->tenant_inspections().refused());
       }}};
  // The disk uploads are staged on: what is free (-1 when it cannot be read), and the floor.
  gauges.push_back({"recal_disk_free_bytes", "Free bytes on the disk uploads are staged on", [disk] {
                      const absl::StatusOr<int64_t> free = disk->FreeBytes();
                      return free.ok() ? double(*free) : -1.0;
                    }});
  gauges.push_back({"recal_min_free_disk_bytes",
                    "Free bytes uploads must leave on that disk (--min_free_disk_bytes; 0: no floor)",
                    [disk] { return double(disk->min_free_bytes()); }});
  // Per tenant, as its quota counts: models and results as stored (whichever blob store), and
  // the bytes reserved for its unfinished uploads and results being stored (every process's).
  metrics::ScrapedGauge store_bytes{
      "recal_store_bytes", "Bytes a tenant stores: models, results, unfinished uploads and results being stored"};
  store_bytes.label = "tenant";
  store_bytes.by_label = [auth, models] {
    std::map<std::string, double> bytes;
    for (const std::string& tenant : auth->Tenants()) {
      if (auto usage = models->Usage(tenant); usage.ok()) bytes[tenant] = static_cast<double>(usage->stored_bytes());
    }
    return bytes;
  };
  gauges.push_back(std::move(store_bytes));
  return gauges;
}

}  // namespace recal::app
