#include "server/metrics/metrics.h"

#include <chrono>
#include <exception>

#include <grpcpp/server_context.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"
#include "server/log/log.h"

#ifndef RECAL_VERSION
#define RECAL_VERSION "unknown"
#endif

namespace recal::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

const prometheus::Histogram::BucketBoundaries kRpcSeconds = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5,
                                                              1,     5,     10,   60,   300};
const prometheus::Histogram::BucketBoundaries kQueueSeconds = {0.01, 0.1, 1, 5, 10, 30, 60, 300, 900, 3600};
const prometheus::Histogram::BucketBoundaries kJobSeconds = {1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 21600};

class ScrapedGauges : public prometheus::Collectable {
 public:
  explicit ScrapedGauges(std::vector<ScrapedGauge> gauges) : gauges_(std::move(gauges)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    for (const ScrapedGauge& gauge : gauges_) {
      prometheus::MetricFamily family;
      family.name = gauge.name;
      family.help = gauge.help;
      family.type = prometheus::MetricType::Gauge;
      if (gauge.by_label) {
        for (const auto& [label_value, value] : gauge.by_label()) {
          prometheus::ClientMetric metric;
          metric.label.push_back({gauge.label, label_value});
          metric.gauge.value = value;
          family.metric.push_back(std::move(metric));
        }
      } else {
        prometheus::ClientMetric metric;
        metric.gauge.value = gauge.value();
        family.metric.push_back(std::move(metric));
      }
      families.push_back(std::move(family));
    }
    return families;
  }

 private:
  std::vector<ScrapedGauge> gauges_;
};

class CallInterceptor : public grpc::experimental::Interceptor {
 public:
  CallInterceptor(Metrics* metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics), info_(info), start_(std::chrono::steady_clock::now()) {
    const std::string full = info->method() ? info->method() : "";  // "/package.Service/Method"
    const size_t slash = full.rfind('/');
    if (slash != std::string::npos && slash > 0) {
      service_ = full.substr(1, slash - 1);
      method_ = full.substr(slash + 1);
    } else {
      service_ = "unknown";
      method_ = full.empty() ? "unknown" : full;
    }
    if (metrics_) metrics_->GrpcStarted(service_, method_).Increment();
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      const std::string code = CodeName(status.error_code());
      if (metrics_) {
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        metrics_->GrpcHandled(service_, method_, code).Increment();
        metrics_->GrpcHandlingSeconds(service_, method_).Observe(seconds);
      }
      if (!status.ok() && status.error_code() != grpc::StatusCode::UNAUTHENTICATED) {
        grpc::ServerContextBase* context = info_->server_context();
        log::Write(FailureLevel(status.error_code()), "call failed",
                   {{"method", absl::StrCat("/", service_, "/", method_)},
                    {"peer", context ? context->peer() : std::string("unknown")},
                    {"code", code},
                    {"error", log::ClientValue(status.error_message())}});
      }
    }
    methods->Proceed();
  }

 private:
  // A lookup that finds nothing (GetModel, GetJob, GetUploadStatus ...) is an answer, not a
  // fault: the clients ask for a model's digest before every upload to learn whether it is
  // stored. INFO for those; a WARNING for every other failure.
  log::Level FailureLevel(grpc::StatusCode code) const {
    const bool lookup = service_ == "recal.v1.Recal" && absl::StartsWith(method_, "Get");
    return code == grpc::StatusCode::NOT_FOUND && lookup ? log::Level::kInfo : log::Level::kWarning;
  }

  static std::string CodeName(grpc::StatusCode code) {
    static const char* const kNames[] = {"OK",
                                         "CANCELLED",
                                         "UNKNOWN",
                                         "INVALID_ARGUMENT",
                                         "DEADLINE_EXCEEDED",
                                         "NOT_FOUND",
                                         "ALREADY_EXISTS",
                                         "PERMISSION_DENIED",
                                         "RESOURCE_EXHAUSTED",
                                         "FAILED_PRECONDITION",
                                         "ABORTED",
                                         "OUT_OF_RANGE",
                                         "UNIMPLEMENTED",
                                         "INTERNAL",
                                         "UNAVAILABLE",
                                         "DATA_LOSS",
                                         "UNAUTHENTICATED"};
    const int index = static_cast<int>(code);
    return index >= 0 && index < 17 ? kNames[index] : absl::StrCat(index);
  }

  Metrics* metrics_;
  grpc::experimental::ServerRpcInfo* info_;
  const std::chrono::steady_clock::time_point start_;
  std::string service_;
  std::string method_;
};

}  // namespace

Metrics::Metrics(const std::string& role)
    : registry(std::make_shared<prometheus::Registry>()),
      grpc_started(BuildCounter()
                       .Name("grpc_server_started_total")
                       .Help("RPCs started on the server")
                       .Register(*registry)),
      grpc_handled(BuildCounter()
                       .Name("grpc_server_handled_total")
                       .Help("RPCs completed on the server, by status code")
                       .Register(*registry)),
      grpc_handling_seconds(BuildHistogram()
                                .Name("grpc_server_handling_seconds")
                                .Help("Time from an RPC's start to its status")
                                .Register(*registry)),
      jobs_submitted(BuildCounter()
                         .Name("recal_jobs_submitted_total")
                         .Help("Jobs accepted by SubmitJob (idempotent repeats not counted), by tenant")
                         .Register(*registry)),
      jobs_finished(BuildCounter()
                        .Name("recal_jobs_finished_total")
                        .Help("Jobs that reached a terminal state, by state and tenant")
                        .Register(*registry)),
      job_queue_wait_seconds(BuildHistogram()
                                 .Name("recal_job_queue_wait_seconds")
                                 .Help("Time from a job's submission to its (latest) start")
                                 .Register(*registry)
                                 .Add({}, kQueueSeconds)),
      job_duration_seconds(BuildHistogram()
                               .Name("recal_job_duration_seconds")
                               .Help("Time from a job's start to its terminal state")
                               .Register(*registry)
                               .Add({}, kJobSeconds)),
      batches_processed(BuildCounter()
                            .Name("recal_batches_processed_total")
                            .Help("Batches run through models by all jobs")
                            .Register(*registry)
                            .Add({})),
      samples_processed(BuildCounter()
                            .Name("recal_samples_processed_total")
                            .Help("Samples run through models by all jobs")
                            .Register(*registry)
                            .Add({})),
      upload_bytes(BuildCounter()
                       .Name("recal_upload_bytes_total")
                       .Help("Model bytes received by UploadModel, by tenant")
                       .Register(*registry)),
      download_bytes(BuildCounter()
                         .Name("recal_download_bytes_total")
                         .Help("Result bytes sent by DownloadResult, by tenant")
                         .Register(*registry)),
      worker_busy(BuildGauge()
                      .Name("recal_worker_busy")
                      .Help("Workers running a job, by device (several workers on a device add up)")
                      .Register(*registry)),
      watch_streams(BuildGauge()
                        .Name("recal_watch_streams")
                        .Help("WatchJob streams open")
                        .Register(*registry)
                        .Add({})),
      leases_expired(BuildCounter()
                         .Name("recal_leases_expired_total")
                         .Help("Running jobs taken back from a worker that stopped renewing its lease")
                         .Register(*registry)
                         .Add({})),
      leases_lost(BuildCounter()
                      .Name("recal_leases_lost_total")
                      .Help("Runs this process stopped because their lease went to another worker")
                      .Register(*registry)
                      .Add({})),
      unauthenticated_requests(BuildCounter()
                                   .Name("recal_unauthenticated_requests_total")
                                   .Help("Calls refused as UNAUTHENTICATED (no credential, or an unknown one)")
                                   .Register(*registry)
                                   .Add({})),
      build_info(BuildGauge()
                     .Name("recal_build_info")
                     .Help("Always 1; the version is a label")
                     .Register(*registry)
                     .Add({{"version", recal::Version()}, {"role", role}})) {
  build_info.Set(1);
}

void Metrics::AddTenant(const std::string& tenant) {
  JobsSubmitted(tenant);
  for (const char* state : {"SUCCEEDED", "FAILED", "CANCELLED"}) JobsFinished(state, tenant);
  UploadBytes(tenant);
  DownloadBytes(tenant);
}

prometheus::Counter& Metrics::JobsSubmitted(const std::string& tenant) { return jobs_submitted.Add({{"tenant", tenant}}); }

prometheus::Counter& Metrics::UploadBytes(const std::string& tenant) { return upload_bytes.Add({{"tenant", tenant}}); }

prometheus::Counter& Metrics::DownloadBytes(const std::string& tenant) {
  return download_bytes.Add({{"tenant", tenant}});
}

prometheus::Counter& Metrics::GrpcStarted(const std::string& service, const std::string& method) {
  return grpc_started.Add({{"grpc_service", service}, {"grpc_method", method}});
}

prometheus::Counter& Metrics::GrpcHandled(const std::string& service, const std::string& method,
                                          const std::string& code) {
  return grpc_handled.Add({{"grpc_service", service}, {"grpc_method", method}, {"grpc_code", code}});
}

prometheus::Histogram& Metrics::GrpcHandlingSeconds(const std::string& service, const std::string& method) {
  return grpc_handling_seconds.Add({{"grpc_service", service}, {"grpc_method", method}}, kRpcSeconds);
}

prometheus::Counter& Metrics::JobsFinished(const std::string& state, const std::string& tenant) {
  return jobs_finished.Add({{"state", state}, {"tenant", tenant}});
}

prometheus::Gauge& Metrics::WorkerBusy(const std::string& device) { return worker_busy.Add({{"device", device}}); }

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> Serve(const std::string& listen, Metrics* metrics,
                                                           std::vector<ScrapedGauge> scraped) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  exposer->RegisterCollectable(metrics->registry);
  metrics->scraped = std::make_shared<ScrapedGauges>(std::move(scraped));
  exposer->RegisterCollectable(metrics->scraped);
  return exposer;
}

int PortOf(const prometheus::Exposer& exposer) {
  const std::vector<int> ports = exposer.GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

grpc::experimental::Interceptor* ServerInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new CallInterceptor(metrics_, info);
}

}  // namespace recal::metrics
