// A throwaway PostgreSQL server for tests: initdb into a fresh temporary directory, then
// `postgres` listening on 127.0.0.1 (a free port) and on a socket in that directory, with
// fsync off and trust authentication; stopped and removed when the test binary exits (or,
// should it crash, when the thread that started it ends). As root it runs as the `postgres`
// system user, since initdb refuses root. Starting takes about a second, so there is one
// server per test binary and a fresh database per test. Tests of outages stop it and start it
// again (Stop, Start, Restart): on the same port and data directory, so every URI stays valid
// and every database is still there (commits are synchronous: a crash of PostgreSQL loses
// nothing it acknowledged; fsync is off, which only an operating-system crash would expose).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recal::testing {

class PostgresServer {
 public:
  // The binary's server, started by the first call (make it from the test's main thread).
  // NOT_FOUND when something it needs is missing (the server binaries; as root, the
  // `postgres` user): tests skip with that message. Any other error means the server would
  // not start, and fails the test.
  static absl::StatusOr<PostgresServer*> Shared();

  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  // A new empty database; its libpq URI ("postgresql://postgres@127.0.0.1:PORT/NAME").
  absl::StatusOr<std::string> NewDatabase();

  // Runs `sql` (one or more statements, no parameters) on the database at `uri`, for tests
  // that reach past the store.
  static absl::Status Execute(const std::string& uri, const std::string& sql);

  // How Stop ends the server.
  enum class Shutdown {
    // SIGINT to the postmaster: it ends every session, writes a checkpoint and exits.
    kFast,
    // SIGKILL to the postmaster alone, as a crash: its backends and helpers exit once they
    // see it gone (waited for, up to 10 s, then killed), connections break without a word,
    // and the next Start runs crash recovery.
    kCrash,
  };
  // Stops the server, keeping its data directory and port; until Start, connections are
  // refused. Call Stop and Start from the thread that called Shared() (the postmaster dies
  // with the thread that forked it), while no other test of the binary uses the server.
  absl::Status Stop(Shutdown how);
  // Starts the stopped server again on the same port and data directory, and waits until it
  // accepts connections (crash recovery done).
  absl::Status Start();
  absl::Status Restart(Shutdown how);
  bool running() const { return pid_ > 0; }

 private:
  PostgresServer(std::string dir, uid_t uid, gid_t gid, bool switch_user)
      : dir_(std::move(dir)), uid_(uid), gid_(gid), switch_user_(switch_user) {}
  static absl::StatusOr<PostgresServer*> Create();
  absl::Status InitDb(const std::string& bin);
  // Starts postgres on `port` (0: a free one, another if that is taken meanwhile) and waits
  // until it accepts connections.
  absl::Status Launch(const std::string& bin, int port);
  // fork + exec of argv[0] as the server's user, output appended to `log`.
  absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log,
                              bool die_with_parent) const;
  std::string Uri(const std::string& database) const;
  // Stops the server at once and removes its directory (at exit).
  void Remove();

  std::string dir_;
  uid_t uid_;
  gid_t gid_;
  bool switch_user_;  // run as uid_/gid_ (we are root)
  pid_t owner_ = 0;   // the process that started it; a forked child must not stop it
  pid_t pid_ = -1;    // the postmaster
  int port_ = 0;
  std::atomic<int> databases_{0};
};

}  // namespace recal::testing
