// RunServer: recal-server's life under signals.
#include <signal.h>

#include <memory>
#include <utility>

#include "common/status_macros.h"
#include "server/app/server.h"
#include "server/log/log.h"

namespace recal::app {

absl::Status RunServer(ServerOptions options) {
  // Signals are taken by one thread with sigwait, so block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<Server> server, Server::BuildAndStart(std::move(options)));
  int signal = 0;
  while (sigwait(&signals, &signal) == 0 && signal == SIGHUP) server->ReloadAuth();
  log::Info("recal-server: shutting down", {{"signal", signal}});
  server->Shutdown();
  return absl::OkStatus();
}

}  // namespace recal::app
