// The commands that map onto one library call each.
#include "client/recalctl/commands.h"

#include <google/protobuf/struct.pb.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/recalctl/exit_codes.h"
#include "client/recalctl/output.h"

namespace recal::ctl {
namespace {

absl::StatusOr<v1::Artifact> ParseArtifact(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "model") return v1::MODEL;
  if (lower == "bn" || lower == "bn_buffers") return v1::BN_BUFFERS;
  if (lower == "report") return v1::REPORT;
  if (lower == "folded") return v1::FOLDED;
  return absl::InvalidArgumentError(absl::StrCat("--artifact must be model, bn, report or folded, not '", name, "'"));
}

// Bytes the tenant has keep the name and version of their first upload (docs/models.md: a
// model id names one model, so "delete this model" stays unambiguous): said even with -q,
// since it is not what --name asked for.
void NameKept(const v1::Model& model, const std::string& asked) {
  const std::string stored = absl::StrCat(model.name(), ":", model.version());
  std::fprintf(stderr,
               "recalctl: these bytes are stored already as %s (%s) and keep that name: a model keeps the name of "
               "its first upload, so it was not named '%s'. Use it as %s, or delete it (recalctl delete %s) and "
               "upload it again under the new name\n",
               stored.c_str(), model.id().c_str(), asked.c_str(), stored.c_str(), stored.c_str());
}

ConnectionFacts& Facts() {
  static ConnectionFacts* const facts = new ConnectionFacts();
  return *facts;
}

std::string Source(const std::string& from, absl::string_view what) {
  return from.empty() ? absl::StrCat("the default: ", what, " is not set") : absl::StrCat("from ", from);
}

// What the user does next, where the status alone does not say it.
std::string Hint(const absl::Status& status) {
  const ConnectionFacts& facts = Facts();
  const absl::string_view message = status.message();
  if (IsUnreachable(status)) {
    return absl::StrCat("; the address is ", Source(facts.server_from, "--server or RECAL_SERVER"),
                        ". Is recal-server running there? Start one with `recal-server --listen=", facts.server,
                        "` (build/bin/recal-server after a build), or point recalctl at yours: --server HOST:PORT "
                        "or RECAL_SERVER=HOST:PORT");
  }
  if (absl::IsUnauthenticated(status)) {
    if (facts.token_from.empty()) return "; recalctl sent no token: give --token or set RECAL_TOKEN";
    return absl::StrCat("; recalctl sent the token ", Source(facts.token_from, ""),
                        facts.token_from == "RECAL_TOKEN" ? " (--token overrides it)" : "",
                        ": is it the one the server's --auth_file grants?");
  }
  if (absl::IsNotFound(status) && absl::StartsWith(message, "no model")) {
    return " (`recalctl list --models` lists them)";
  }
  if (absl::IsNotFound(status) && absl::StartsWith(message, "no job")) return " (`recalctl list` lists your jobs)";
  return "";
}

}  // namespace

void SetConnectionFacts(ConnectionFacts facts) { Facts() = std::move(facts); }

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "recalctl: %s%s\n", std::string(status.message()).c_str(), Hint(status).c_str());
  return ExitCodeFor(status);
}

int UsageError(const absl::Status& status) {
  std::fprintf(stderr, "recalctl: %s\nRun 'recalctl --help' for usage.\n",
               std::string(status.message()).c_str());
  return kUsage;
}

void Emit(const Context& ctx, const google::protobuf::Message& message, const std::string& text) {
  const std::string out = ctx.json ? ToJson(message) : text;
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

int Upload(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({"name", "label"}); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(1, "one model file"); !s.ok()) return UsageError(s);
  auto labels = ctx.args.GetPairs("label");
  if (!labels.ok()) return UsageError(labels.status());
  const std::string& path = ctx.args.positional()[0];
  auto uploaded = ctx.client.UploadModel(
      path, ctx.args.Get("name"), *labels,
      [&](int64_t done, int64_t total) { ctx.progress.Transfer("upload " + path, done, total); });
  if (!uploaded.ok()) return Fail(uploaded.status());
  if (uploaded->already_present) {
    ctx.progress.Line("model " + uploaded->model.id() + " is on the server already; nothing sent");
  }
  if (const std::string name = ctx.args.Get("name"); !name.empty() && name != uploaded->model.name()) {
    NameKept(uploaded->model, name);
  }
  Emit(ctx, uploaded->model, ModelText(uploaded->model));
  return kOk;
}

namespace {

// What the server names its jobs: "job-" and 16 hex digits (never a model's reference unless
// a model was named so: --model says which is meant).
bool IsJobId(const std::string& s) {
  return s.size() == 20 && absl::StartsWith(s, "job-") &&
         std::all_of(s.begin() + 4, s.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

int DeleteJob(Context& ctx, const std::string& id) {
  auto deleted = ctx.client.DeleteJob(id);
  if (!deleted.ok()) return Fail(deleted.status());
  ctx.progress.Line(absl::StrCat("deleted job ", deleted->job().id(), " and ", FormatBytes(deleted->result_bytes()),
                                 " of results"));
  Emit(ctx, *deleted, JobText(deleted->job()));
  return kOk;
}

}  // namespace

int Delete(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({"model"}); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(1, "one job id or model (name, name:version or digest)"); !s.ok()) {
    return UsageError(s);
  }
  const std::string& target = ctx.args.positional()[0];
  if (IsJobId(target) && !ctx.args.Has("model")) return DeleteJob(ctx, target);
  auto deleted = ctx.client.DeleteModel(target);
  if (!deleted.ok()) return Fail(deleted.status());
  ctx.progress.Line(absl::StrCat("deleted ", deleted->name(), ":", deleted->version(), " (", deleted->id(), ")"));
  Emit(ctx, *deleted, ModelText(*deleted));
  return kOk;
}

int Usage(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({}); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(0, "nothing"); !s.ok()) return UsageError(s);
  auto usage = ctx.client.GetUsage();
  if (!usage.ok()) return Fail(usage.status());
  Emit(ctx, *usage, UsageText(*usage));
  return kOk;
}

int Get(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({}); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(1, "one job id"); !s.ok()) return UsageError(s);
  auto job = ctx.client.Get(ctx.args.positional()[0]);
  if (!job.ok()) return Fail(job.status());
  Emit(ctx, *job, JobText(*job));
  return kOk;
}

int List(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({"state", "page_size", "page_token", "models", "name"}); !s.ok()) {
    return UsageError(s);
  }
  if (auto s = ctx.args.ExpectPositional(0, "no arguments"); !s.ok()) return UsageError(s);
  auto page_size = ctx.args.GetInt("page_size", 0);
  if (!page_size.ok()) return UsageError(page_size.status());
  if (ctx.args.GetBool("models") || ctx.args.Has("name")) {  // --name: a model's versions
    if (ctx.args.Has("state")) {
      return UsageError(absl::InvalidArgumentError("--state lists jobs, not models"));
    }
    auto models = ctx.client.ListModels(static_cast<int>(*page_size), ctx.args.Get("page_token"), ctx.args.Get("name"));
    if (!models.ok()) return Fail(models.status());
    Emit(ctx, *models, ModelsTable(*models));
    return kOk;
  }
  std::vector<v1::JobState> states;
  for (const std::string& name : ctx.args.GetAll("state")) {
    v1::JobState state;
    if (!v1::JobState_Parse(absl::AsciiStrToUpper(name), &state) || state == v1::JOB_STATE_UNSPECIFIED) {
      return UsageError(absl::InvalidArgumentError(absl::StrCat(
          "--state must be QUEUED, RUNNING, CANCELLING, SUCCEEDED, FAILED or CANCELLED, not '", name, "'")));
    }
    states.push_back(state);
  }
  auto jobs = ctx.client.List(states, static_cast<int>(*page_size), ctx.args.Get("page_token"));
  if (!jobs.ok()) return Fail(jobs.status());
  Emit(ctx, *jobs, JobsTable(*jobs));
  return kOk;
}

int Watch(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({"after_seq"}); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(1, "one job id"); !s.ok()) return UsageError(s);
  auto after_seq = ctx.args.GetInt("after_seq", 0);
  if (!after_seq.ok()) return UsageError(after_seq.status());
  auto job = ctx.client.Watch(
      ctx.args.positional()[0], [&](const v1::JobEvent& event) { ctx.progress.Event(event); }, *after_seq);
  if (!job.ok()) return Fail(job.status());
  Emit(ctx, *job, JobText(*job));
  return ExitCodeForJob(*job);
}

int Cancel(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({}); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(1, "one job id"); !s.ok()) return UsageError(s);
  auto job = ctx.client.Cancel(ctx.args.positional()[0]);
  if (!job.ok()) return Fail(job.status());
  Emit(ctx, *job, JobText(*job));
  return kOk;
}

int Download(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({"out", "artifact"}); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(1, "one job id"); !s.ok()) return UsageError(s);
  if (!ctx.args.Has("out")) return UsageError(absl::InvalidArgumentError("'download' needs -o PATH"));
  auto artifact = ParseArtifact(ctx.args.Get("artifact", "model"));
  if (!artifact.ok()) return UsageError(artifact.status());
  const std::string& job_id = ctx.args.positional()[0];
  const std::string path = ctx.args.Get("out");
  const std::string what = absl::StrCat("download ", absl::AsciiStrToLower(v1::Artifact_Name(*artifact)));
  auto downloaded = ctx.client.Download(job_id, *artifact, path, [&](int64_t done, int64_t total) {
    ctx.progress.Transfer(what, done, total);
  });
  if (!downloaded.ok()) return Fail(downloaded.status());
  // No response message describes a finished download; a Struct keeps the one JSON printer.
  google::protobuf::Struct result;
  auto& fields = *result.mutable_fields();
  fields["jobId"].set_string_value(job_id);
  fields["artifact"].set_string_value(v1::Artifact_Name(*artifact));
  fields["path"].set_string_value(path);
  // A double: exact up to 2^53 bytes (8 PiB), and a number like every other size printed.
  fields["size"].set_number_value(static_cast<double>(downloaded->size));
  fields["sha256"].set_string_value(downloaded->sha256);
  Emit(ctx, result,
       absl::StrCat("wrote ", path, " (", downloaded->size, " bytes, sha256 ", downloaded->sha256, ")\n"));
  return kOk;
}

int Health(Context& ctx) {
  if (auto s = ctx.args.AllowOnly({"service"}); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(0, "no arguments"); !s.ok()) return UsageError(s);
  auto status = ctx.client.Health(ctx.args.Get("service"));
  if (!status.ok()) return Fail(status.status());
  google::protobuf::Struct result;
  (*result.mutable_fields())["status"].set_string_value(*status);  // as grpc.health.v1's response
  Emit(ctx, result, *status + "\n");
  return *status == "SERVING" ? kOk : kError;
}

}  // namespace recal::ctl
