// recalctl report: a finished job's RunReport (the REPORT artifact, or a file already
// downloaded) as a table, as JSON, or as an HTML page with plots.
#include <google/protobuf/util/json_util.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "client/recalctl/commands.h"
#include "client/recalctl/exit_codes.h"
#include "client/recalctl/output.h"
#include "client/recalctl/report_html.h"
#include "client/recalctl/report_text.h"
#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"

namespace recal::ctl {
namespace {

// A directory of our own under $TMPDIR for the downloaded report, removed with what it holds
// when this goes out of scope (the report is read into memory first).
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Make() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/recalctl-report.XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("cannot make a scratch directory like ", pattern,
                                              " for the downloaded report: set TMPDIR to a writable directory"));
    }
    return ScratchDir(pattern);
  }
  ScratchDir(ScratchDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir() {
    std::error_code ignored;  // nothing to do about a leftover temporary file but leave it
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

absl::StatusOr<v1::RunReport> ReadReportFile(const std::string& path) {
  RECAL_ASSIGN_OR_RETURN(auto file, data::MappedFile::Open(path));
  v1::RunReport report;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // a newer server's report still reads
  const auto parsed = google::protobuf::util::JsonStringToMessage(std::string(file->bytes()), &report, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a RunReport in JSON (", parsed.message().as_string(),
                     "): pass a file written by 'recalctl download JOB --artifact report' or 'recalctl run --report'"));
  }
  return report;
}

absl::StatusOr<v1::RunReport> DownloadReport(Context& ctx, const std::string& job_id) {
  RECAL_ASSIGN_OR_RETURN(ScratchDir scratch, ScratchDir::Make());
  const std::string path = scratch.path() + "/report.json";
  RECAL_RETURN_IF_ERROR(
      ctx.client
          .Download(job_id, v1::REPORT, path,
                    [&](int64_t done, int64_t total) { ctx.progress.Transfer("download report", done, total); })
          .status());
  return ReadReportFile(path);
}

// --top N, --all, --warn_rel_error E. INVALID_ARGUMENT: usage.
absl::StatusOr<ReportViewOptions> ViewOptions(const Args& args) {
  ReportViewOptions options;
  RECAL_ASSIGN_OR_RETURN(const int64_t top, args.GetInt("top", options.top));
  RECAL_ASSIGN_OR_RETURN(options.warn_rel_error, args.GetDouble("warn_rel_error", options.warn_rel_error));
  if (args.Has("top") && args.GetBool("all")) {
    return absl::InvalidArgumentError("--top N and --all contradict each other: give one");
  }
  if (top < 1) return absl::InvalidArgumentError("--top must be at least 1 (--all shows every layer)");
  if (!(options.warn_rel_error > 0)) {  // NaN too
    return absl::InvalidArgumentError("--warn_rel_error must be a positive fraction, e.g. 0.05");
  }
  options.top = args.GetBool("all") ? 0 : static_cast<int>(std::min<int64_t>(top, std::numeric_limits<int>::max()));
  return options;
}

// The flags both forms take, and the positional arguments of each. INVALID_ARGUMENT: usage.
absl::StatusOr<ReportViewOptions> CheckArgs(const Args& args) {
  RECAL_RETURN_IF_ERROR(args.AllowOnly({"top", "all", "from", "html", "warn_rel_error"}));
  const bool from_file = args.Has("from");
  RECAL_RETURN_IF_ERROR(
      args.ExpectPositional(from_file ? 0 : 1, from_file ? "no job id with --from FILE" : "one job id"));
  return ViewOptions(args);
}

// The report in hand: with --html the page, and its path on stdout (the page holds the
// table); else the table. --output=json: the RunReport either way.
int Show(const Args& args, bool json, const ReportViewOptions& options, const v1::RunReport& report,
         const std::string& source) {
  std::string text;
  if (args.Has("html")) {
    const std::string html_path = args.Get("html");
    if (auto s = WriteFileAtomically(html_path, ReportHtml(report, options, source)); !s.ok()) return Fail(s);
    text = absl::StrCat("wrote: ", html_path, "\n");
  } else {
    text = ReportText(report, options);
  }
  const std::string out = json ? ToJson(report) : text;
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return kOk;
}

}  // namespace

int Report(Context& ctx) {
  if (ctx.args.Has("from")) return ReportFromFile(ctx.args, ctx.json, /*quiet=*/false);
  auto options = CheckArgs(ctx.args);
  if (!options.ok()) return UsageError(options.status());
  const std::string& job_id = ctx.args.positional()[0];
  auto report = DownloadReport(ctx, job_id);
  if (!report.ok()) return Fail(report.status());
  return Show(ctx.args, ctx.json, *options, *report, absl::StrCat("job ", job_id));
}

int ReportFromFile(const Args& args, bool json, bool /*quiet: nothing to report progress on*/) {
  auto options = CheckArgs(args);
  if (!options.ok()) return UsageError(options.status());
  auto report = ReadReportFile(args.Get("from"));
  if (!report.ok()) return Fail(report.status());
  return Show(args, json, *options, *report, args.Get("from"));
}

}  // namespace recal::ctl
