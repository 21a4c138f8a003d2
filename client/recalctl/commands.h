// recalctl's commands. Each returns the process exit code (exit_codes.h) and prints its
// result on stdout, errors and progress on stderr.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "client/recalctl/args.h"
#include "client/recalctl/progress.h"
#include "recal/client.h"

namespace recal::ctl {

struct Context {
  const Args& args;
  bool json = false;
  Client& client;
  ProgressDisplay& progress;
};

// Where the connection's settings came from ("" for the default / none), for the hints
// Fail adds to what the server or gRPC said.
struct ConnectionFacts {
  std::string server;       // the address
  std::string server_from;  // "--server", "RECAL_SERVER" or ""
  std::string token_from;   // "--token", "RECAL_TOKEN" or ""
};
void SetConnectionFacts(ConnectionFacts facts);

// "recalctl: <message>" on stderr, with what to do where recalctl knows more than the
// message (no server answered, a refused token, a model or job not found); the exit code
// for the status.
int Fail(const absl::Status& status);
// The same for a usage error (exit code 2), with a pointer to --help.
int UsageError(const absl::Status& status);
// The result on stdout: `message` as JSON, or `text`.
void Emit(const Context& ctx, const google::protobuf::Message& message, const std::string& text);

int Upload(Context& ctx);
int Submit(Context& ctx);
int Get(Context& ctx);
int Delete(Context& ctx);  // delete JOB|REF: an ended job and its results, or a model
int Usage(Context& ctx);   // usage: what the tenant stores
int List(Context& ctx);
int Watch(Context& ctx);
int Cancel(Context& ctx);
int Download(Context& ctx);
int Run(Context& ctx);
int Health(Context& ctx);
int Report(Context& ctx);  // report_command.cc: report JOB

// Need no server, so they run before (and without) connecting.
int Token(const Args& args, bool json, bool quiet);
int ReportFromFile(const Args& args, bool json, bool quiet);  // report --from FILE

}  // namespace recal::ctl
