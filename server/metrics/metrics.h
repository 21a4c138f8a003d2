// recal-server's Prometheus metrics: one Metrics owns the registry and every family; main
// makes it and passes a pointer down (null everywhere means "no metrics": unit tests,
// recal-run). Serve() exposes them over HTTP at /metrics, with gauges computed at scrape
// time (queue length, running jobs, bytes each tenant stores).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace recal::metrics {

struct Metrics {
  // `role`: the process's --role, a label of recal_build_info.
  explicit Metrics(const std::string& role = "all");

  prometheus::Counter& GrpcStarted(const std::string& service, const std::string& method);
  prometheus::Counter& GrpcHandled(const std::string& service, const std::string& method,
                                   const std::string& code);
  prometheus::Histogram& GrpcHandlingSeconds(const std::string& service, const std::string& method);
  // Job and byte counters carry the tenant (a bounded set: the auth file's tenants).
  prometheus::Counter& JobsSubmitted(const std::string& tenant);
  prometheus::Counter& JobsFinished(const std::string& state, const std::string& tenant);
  prometheus::Counter& UploadBytes(const std::string& tenant);
  prometheus::Counter& DownloadBytes(const std::string& tenant);
  // Makes the tenant's series (at zero), so that they exist before the first job.
  void AddTenant(const std::string& tenant);
  prometheus::Gauge& WorkerBusy(const std::string& device);

  std::shared_ptr<prometheus::Registry> registry;

  prometheus::Family<prometheus::Counter>& grpc_started;
  prometheus::Family<prometheus::Counter>& grpc_handled;
  prometheus::Family<prometheus::Histogram>& grpc_handling_seconds;

  prometheus::Family<prometheus::Counter>& jobs_submitted;
  prometheus::Family<prometheus::Counter>& jobs_finished;
  prometheus::Histogram& job_queue_wait_seconds;
  prometheus::Histogram& job_duration_seconds;
  prometheus::Counter& batches_processed;
  prometheus::Counter& samples_processed;
  prometheus::Family<prometheus::Counter>& upload_bytes;
  prometheus::Family<prometheus::Counter>& download_bytes;
  prometheus::Family<prometheus::Gauge>& worker_busy;
  prometheus::Gauge& watch_streams;
  // Cluster: jobs a reaper put back because their worker stopped renewing its lease, and
  // runs this process abandoned because its lease went to another worker.
  prometheus::Counter& leases_expired;
  prometheus::Counter& leases_lost;
  // Calls refused as UNAUTHENTICATED (no credential, an unknown one): counted each, while
  // their log lines are limited per peer.
  prometheus::Counter& unauthenticated_requests;
  prometheus::Gauge& build_info;

  // The gauges Serve() computes at scrape time (the exposer only holds a weak pointer).
  std::shared_ptr<prometheus::Collectable> scraped;
};

// A gauge whose value is read when scraped: one value, or with `by_label` one series per
// value of the label `label` (e.g. per tenant: a bounded set).
struct ScrapedGauge {
  std::string name;
  std::string help;
  std::function<double()> value;
  std::string label;
  std::function<std::map<std::string, double>()> by_label;
};

// Serves `metrics` and `scraped` on `listen` (host:port; port 0 = any free port). The
// returned exposer must be destroyed before anything the `scraped` callbacks read.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> Serve(const std::string& listen, Metrics* metrics,
                                                           std::vector<ScrapedGauge> scraped);
int PortOf(const prometheus::Exposer& exposer);

// Counts calls (grpc_server_*) and logs failed ones (peer, method, code, message), except
// UNAUTHENTICATED ones: the API's audit line is their record, limited per peer. `metrics`
// may be null: then it only logs.
class ServerInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit ServerInterceptorFactory(Metrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;

 private:
  Metrics* metrics_;
};

}  // namespace recal::metrics
