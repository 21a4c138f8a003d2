#include "client/recalctl/output.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/time_util.h>

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/input_contract.h"
#include "common/json_numbers.h"
#include "recal/data.h"

namespace recal::ctl {
namespace {

std::string Time(const google::protobuf::Timestamp& t) {
  return google::protobuf::util::TimeUtil::ToString(t);
}

std::string ProgressText(const v1::JobProgress& p) {
  std::string text =
      absl::StrCat(p.batches_done(), "/", p.batches_total() > 0 ? absl::StrCat(p.batches_total()) : "?",
                   " batches, ", p.samples_done(), " samples");
  if (p.samples_per_second() > 0) absl::StrAppendFormat(&text, ", %.1f samples/s", p.samples_per_second());
  return text;
}

}  // namespace

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  std::string json;
  // Printing a well-formed message cannot fail; an empty object is the safe fallback.
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) json = "{}\n";
  json = Int64FieldsAsNumbers(json, *message.GetDescriptor());
  if (json.empty() || json.back() != '\n') json += '\n';
  return json;
}

std::string JobText(const v1::Job& job) {
  std::string text = absl::StrCat("id: ", job.id(), "\nstate: ", v1::JobState_Name(job.state()), "\n");
  if (job.has_wait()) absl::StrAppend(&text, "waiting: ", job.wait().reason(), "\n");
  absl::StrAppend(&text, "model: ", job.spec().model_id(), "\n");
  absl::StrAppend(&text, "data: ", DataSourceToSpec(job.spec().data()), "\n");
  absl::StrAppend(&text, "batch_size: ", job.spec().batch_size(), "\n");
  absl::StrAppend(&text, "progress: ", ProgressText(job.progress()), "\n");
  if (!job.device().empty()) absl::StrAppend(&text, "device: ", job.device(), "\n");
  absl::StrAppend(&text, "attempts: ", job.attempts(), "\n");
  if (job.has_create_time()) absl::StrAppend(&text, "created: ", Time(job.create_time()), "\n");
  if (job.has_start_time()) absl::StrAppend(&text, "started: ", Time(job.start_time()), "\n");
  if (job.has_end_time()) absl::StrAppend(&text, "ended: ", Time(job.end_time()), "\n");
  if (job.has_error()) {
    absl::StrAppend(&text,
                    "error: ", absl::StatusCodeToString(static_cast<absl::StatusCode>(job.error().code())),
                    ": ", job.error().message(), "\n");
  }
  return text;
}

std::string ModelText(const v1::Model& model) {
  std::string text = absl::StrCat("id: ", model.id(), "\nname: ", model.name(), "\nversion: ", model.version(),
                                  "\nreference: ", model.name(), ":", model.version(), "\nsize: ", model.size(),
                                  "\nbatchnorm_layers: ", model.layers_size(), "\n");
  for (const v1::ModelInput& input : model.inputs()) absl::StrAppend(&text, "input: ", DescribeInput(input), "\n");
  for (const auto& [key, value] : model.labels()) absl::StrAppend(&text, "label: ", key, "=", value, "\n");
  if (model.has_create_time()) absl::StrAppend(&text, "created: ", Time(model.create_time()), "\n");
  return text;
}

std::string UsageText(const v1::Usage& usage) {
  const auto line = [](absl::string_view what, int64_t count, int64_t bytes) {
    return absl::StrCat(what, ": ", count, " (", bytes, " bytes)\n");
  };
  std::string text = absl::StrCat("tenant: ", usage.tenant(), "\nstored_bytes: ", usage.stored_bytes());
  if (usage.max_stored_bytes() > 0) absl::StrAppend(&text, " of max_stored_bytes ", usage.max_stored_bytes());
  absl::StrAppend(&text, "\n", line("models", usage.models(), usage.model_bytes()),
                  line("results", usage.results(), usage.result_bytes()),
                  line("unfinished_uploads", usage.uploads(), usage.upload_bytes()),
                  "reserved_bytes: ", usage.reserved_bytes(),
                  " (unfinished uploads' whole sizes and results being stored: counted until stored)\n",
                  "active_jobs: ", usage.active_jobs(), "\n");
  return text;
}

std::string JobsTable(const v1::ListJobsResponse& jobs) {
  std::string text = absl::StrFormat("%-36s  %-10s  %-14s  %s\n", "ID", "STATE", "BATCHES", "CREATED");
  for (const v1::Job& job : jobs.jobs()) {
    absl::StrAppendFormat(&text, "%-36s  %-10s  %-14s  %s\n", job.id(), v1::JobState_Name(job.state()),
                          absl::StrCat(job.progress().batches_done(), "/", job.progress().batches_total()),
                          job.has_create_time() ? Time(job.create_time()) : "");
  }
  if (!jobs.next_page_token().empty()) {
    absl::StrAppend(&text, "next_page_token: ", jobs.next_page_token(), "\n");
  }
  return text;
}

std::string ModelsTable(const v1::ListModelsResponse& models) {
  // Name and version first: what a person refers to a model by; the digest's first 12 hex
  // digits are a prefix any command takes too.
  std::string text = absl::StrFormat("%-32s  %-19s  %10s  %6s  %s\n", "NAME:VERSION", "DIGEST", "SIZE", "LAYERS",
                                     "CREATED");
  for (const v1::Model& model : models.models()) {
    absl::StrAppendFormat(&text, "%-32s  %-19s  %10s  %6d  %s\n", absl::StrCat(model.name(), ":", model.version()),
                          model.id().substr(0, 19), FormatBytes(model.size()), model.layers_size(),
                          model.has_create_time() ? Time(model.create_time()) : "");
  }
  if (!models.next_page_token().empty()) {
    absl::StrAppend(&text, "next_page_token: ", models.next_page_token(), "\n");
  }
  return text;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1000) return absl::StrCat(bytes, " B");
  const char* units[] = {"kB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1000 && unit < 3) {
    value /= 1000;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, units[unit]);
}

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || std::isinf(seconds)) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

}  // namespace recal::ctl
