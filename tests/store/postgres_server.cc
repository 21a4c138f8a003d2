#include "tests/store/postgres_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#ifndef RECAL_POSTGRES_BIN
#define RECAL_POSTGRES_BIN "/usr/lib/postgresql/15/bin"
#endif

namespace recal::testing {
namespace {

constexpr char kSuperuser[] = "postgres";
constexpr auto kStartTimeout = std::chrono::seconds(30);
constexpr int kPortAttempts = 5;  // another process may take the free port before postgres binds it

std::string BinDir() {
  const char* env = std::getenv("RECAL_POSTGRES_BIN");
  return env != nullptr && *env != '\0' ? env : RECAL_POSTGRES_BIN;
}

std::string Tail(const std::string& path) {
  constexpr size_t kMax = 3000;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return s.size() > kMax ? s.substr(s.size() - kMax) : s;
}

// What `path` holds from byte `offset` on (the log of the latest start), at most its last 3000 bytes.
std::string Since(const std::string& path, uintmax_t offset) {
  constexpr uintmax_t kMax = 3000;
  std::ifstream in(path, std::ios::binary);
  in.seekg(0, std::ios::end);
  const uintmax_t size = in ? static_cast<uintmax_t>(in.tellg()) : 0;
  if (size <= offset) return "";
  in.seekg(static_cast<std::streamoff>(std::max(offset, size > kMax ? size - kMax : 0)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

uintmax_t SizeOf(const std::string& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  return error ? 0 : size;
}

// The state letter of /proc/PID/stat, and its parent; '\0' when there is no such process.
char StateOf(pid_t pid, pid_t* parent = nullptr) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return '\0';
  std::istringstream rest(stat.substr(name_end + 2));
  char state = '\0';
  pid_t ppid = 0;
  rest >> state >> ppid;
  if (parent != nullptr) *parent = ppid;
  return state;
}

std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    pid_t ppid = 0;
    if (StateOf(pid, &ppid) != '\0' && ppid == parent) children.push_back(pid);
  }
  return children;
}

// Whether every one of `pids` has exited (a zombie nobody reaps yet counts: it holds nothing).
bool AllGone(const std::vector<pid_t>& pids, std::chrono::steady_clock::duration within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    bool gone = true;
    for (const pid_t pid : pids) {
      const char state = StateOf(pid);
      gone = gone && (state == '\0' || state == 'Z' || state == 'X');
    }
    if (gone) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// waitpid with a deadline.
bool Reap(pid_t pid, std::chrono::steady_clock::duration within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (::waitpid(pid, nullptr, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

absl::Status Errno(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::StatusOr<int> FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) return Errno("binding a free port on 127.0.0.1");
  return ntohs(addr.sin_port);
}

// Whether another user can reach `dir` (every ancestor searchable by others), and its
// socket path fits sockaddr_un (108 bytes with ".s.PGSQL.NNNNN").
bool UsableBase(const std::string& dir, bool for_other_user) {
  if (dir.empty() || dir.size() > 64) return false;
  if (!for_other_user) return true;
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(dir, error);
  if (error) return false;
  for (std::filesystem::path p = absolute;; p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || (st.st_mode & S_IXOTH) == 0) return false;
    if (p == p.parent_path()) return true;
  }
}

struct Finish {
  void operator()(PGconn* c) const { PQfinish(c); }
};
struct Clear {
  void operator()(PGresult* r) const { PQclear(r); }
};

}  // namespace

absl::StatusOr<PostgresServer*> PostgresServer::Shared() {
  // Destroyed at exit, which stops the server.
  static std::unique_ptr<PostgresServer> server;
  static absl::Status error;
  static std::once_flag once;
  std::call_once(once, [] {
    absl::StatusOr<PostgresServer*> started = Create();
    if (started.ok()) {
      server.reset(*started);
    } else {
      error = started.status();
    }
  });
  if (!error.ok()) return error;
  return server.get();
}

absl::StatusOr<PostgresServer*> PostgresServer::Create() {
  const std::string bin = BinDir();
  for (const char* tool : {"initdb", "postgres"}) {
    const std::string path = absl::StrCat(bin, "/", tool);
    if (::access(path.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "no PostgreSQL server binary ", path,
          ": install the Debian package postgresql (scripts/debian-packages.txt) or set RECAL_POSTGRES_BIN to the "
          "directory holding initdb and postgres"));
    }
  }
  uid_t uid = ::geteuid();
  gid_t gid = ::getegid();
  const bool switch_user = uid == 0;
  if (switch_user) {
    // initdb and postgres refuse to run as root.
    struct passwd pw {};
    struct passwd* found = nullptr;
    char buf[4096];
    if (::getpwnam_r(kSuperuser, &pw, buf, sizeof(buf), &found) != 0 || found == nullptr) {
      return absl::NotFoundError(
          "running as root, which initdb refuses, and there is no 'postgres' system user to run PostgreSQL as "
          "(the Debian package postgresql creates it)");
    }
    uid = pw.pw_uid;
    gid = pw.pw_gid;
  }
  const char* tmpdir = std::getenv("TMPDIR");
  const std::string base = tmpdir != nullptr && UsableBase(tmpdir, switch_user) ? tmpdir : "/tmp";
  std::string dir = absl::StrCat(base, "/recal-pg-XXXXXX");
  if (::mkdtemp(dir.data()) == nullptr) return Errno(absl::StrCat("mkdtemp ", dir));
  if (switch_user && ::chown(dir.c_str(), uid, gid) != 0) {
    const absl::Status s = Errno(absl::StrCat("chown ", dir, " to postgres"));
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    return s;
  }
  std::unique_ptr<PostgresServer> server(new PostgresServer(dir, uid, gid, switch_user));
  server->owner_ = ::getpid();
  RECAL_RETURN_IF_ERROR(server->InitDb(bin));  // on error the destructor removes the directory
  RECAL_RETURN_IF_ERROR(server->Launch(bin, /*port=*/0));
  return server.release();
}

absl::StatusOr<pid_t> PostgresServer::Spawn(const std::vector<std::string>& argv, const std::string& log,
                                            bool die_with_parent) const {
  // Everything the child needs is made before fork: it may only make system calls.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Errno("fork");
  if (pid > 0) return pid;
  const int in = ::open("/dev/null", O_RDONLY);
  const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (in < 0 || out < 0 || ::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(out, 2) < 0) ::_exit(126);
  if (switch_user_ && (::setgroups(0, nullptr) != 0 || ::setgid(gid_) != 0 || ::setuid(uid_) != 0)) ::_exit(126);
  // After setuid, which would clear it. SIGQUIT is the postmaster's immediate shutdown.
  if (die_with_parent && (::prctl(PR_SET_PDEATHSIG, SIGQUIT) != 0 || ::getppid() != parent)) ::_exit(126);
  if (::chdir(dir_.c_str()) != 0) ::_exit(126);
  ::execv(args[0], args.data());
  ::_exit(127);
}

absl::Status PostgresServer::InitDb(const std::string& bin) {
  const std::string log = absl::StrCat(dir_, "/initdb.log");
  RECAL_ASSIGN_OR_RETURN(
      const pid_t pid,
      Spawn({absl::StrCat(bin, "/initdb"), "-D", absl::StrCat(dir_, "/data"), "-U", kSuperuser, "-A", "trust", "-E",
             "UTF8", "--locale=C", "--no-sync"},
            log, /*die_with_parent=*/false));
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return Errno("waitpid initdb");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("initdb failed (status ", status, ") in ", dir_, ":\n", Tail(log)));
  }
  return absl::OkStatus();
}

absl::Status PostgresServer::Launch(const std::string& bin, int fixed_port) {
  const std::string log = absl::StrCat(dir_, "/postgres.log");
  // The same port again: a crashed server's backends may hold its shared memory for a moment
  // yet, or a connection its port; those pass, so try again until the deadline.
  const auto give_up = std::chrono::steady_clock::now() + kStartTimeout;
  for (int attempt = 1;; ++attempt) {
    int port = fixed_port;
    if (port == 0) {
      RECAL_ASSIGN_OR_RETURN(port, FreePort());
    }
    const uintmax_t log_offset = SizeOf(log);
    // Durability against a machine crash is not under test here, and fsync would make every
    // commit wait for disk; commits stay synchronous, so a crash of PostgreSQL alone (Stop
    // with kCrash) loses nothing it acknowledged.
    RECAL_ASSIGN_OR_RETURN(
        const pid_t pid,
        Spawn({absl::StrCat(bin, "/postgres"), "-D", absl::StrCat(dir_, "/data"), "-p", absl::StrCat(port), "-k",
               dir_, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off"},
              log, /*die_with_parent=*/true));
    const std::string ping =
        absl::StrCat("host=127.0.0.1 port=", port, " user=", kSuperuser, " dbname=postgres connect_timeout=2");
    const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      if (PQping(ping.c_str()) == PQPING_OK) {
        pid_ = pid;
        port_ = port;
        return absl::OkStatus();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!exited) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return absl::DeadlineExceededError(
          absl::StrCat("postgres did not accept connections within 30 s:\n", Since(log, log_offset)));
    }
    const std::string output = Since(log, log_offset);
    const bool in_use = absl::StrContains(output, "Address already in use");
    if (fixed_port == 0 && in_use && attempt < kPortAttempts) continue;
    if (fixed_port != 0 && std::chrono::steady_clock::now() < give_up &&
        (in_use || absl::StrContains(output, "is still in use") || absl::StrContains(output, "already exists"))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    return absl::InternalError(absl::StrCat("postgres exited at start-up:\n", output));
  }
}

absl::Status PostgresServer::Stop(Shutdown how) {
  if (pid_ <= 0) return absl::FailedPreconditionError("the test PostgreSQL is not running");
  const pid_t postmaster = std::exchange(pid_, -1);
  if (how == Shutdown::kFast) {
    ::kill(postmaster, SIGINT);
    if (!Reap(postmaster, std::chrono::seconds(30))) {
      ::kill(postmaster, SIGKILL);
      ::waitpid(postmaster, nullptr, 0);
      return absl::DeadlineExceededError("the test PostgreSQL did not shut down within 30 s; killed");
    }
    return absl::OkStatus();
  }
  // Its children, before they are orphaned and so no longer known as its own.
  const std::vector<pid_t> children = ChildrenOf(postmaster);
  ::kill(postmaster, SIGKILL);
  ::waitpid(postmaster, nullptr, 0);
  // They notice the postmaster's death (every wait of theirs watches for it) and exit; the
  // next postmaster refuses to start while they still hold the old shared memory.
  if (AllGone(children, std::chrono::seconds(10))) return absl::OkStatus();
  for (const pid_t child : children) ::kill(child, SIGKILL);
  if (AllGone(children, std::chrono::seconds(5))) return absl::OkStatus();
  return absl::DeadlineExceededError("backends of the killed test PostgreSQL outlived it by 15 s");
}

absl::Status PostgresServer::Start() {
  if (pid_ > 0) return absl::OkStatus();
  return Launch(BinDir(), port_);
}

absl::Status PostgresServer::Restart(Shutdown how) {
  RECAL_RETURN_IF_ERROR(Stop(how));
  return Start();
}

std::string PostgresServer::Uri(const std::string& database) const {
  return absl::StrCat("postgresql://", kSuperuser, "@127.0.0.1:", port_, "/", database);
}

absl::StatusOr<std::string> PostgresServer::NewDatabase() {
  const std::string name = absl::StrCat("test_", databases_.fetch_add(1) + 1);
  RECAL_RETURN_IF_ERROR(Execute(Uri("postgres"), absl::StrCat("CREATE DATABASE ", name)));
  return Uri(name);
}

absl::Status PostgresServer::Execute(const std::string& uri, const std::string& sql) {
  std::unique_ptr<PGconn, Finish> conn(PQconnectdb(uri.c_str()));
  if (conn == nullptr || PQstatus(conn.get()) != CONNECTION_OK) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the test PostgreSQL: ", conn ? PQerrorMessage(conn.get()) : "no memory"));
  }
  PQsetNoticeProcessor(conn.get(), [](void*, const char*) {}, nullptr);
  std::unique_ptr<PGresult, Clear> res(PQexec(conn.get(), sql.c_str()));
  const ExecStatusType status = res ? PQresultStatus(res.get()) : PGRES_FATAL_ERROR;
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    return absl::InternalError(absl::StrCat("`", sql, "`: ", PQerrorMessage(conn.get())));
  }
  return absl::OkStatus();
}

void PostgresServer::Remove() {
  if (::getpid() != owner_) return;  // a forked child's exit
  if (pid_ > 0) {
    ::kill(pid_, SIGQUIT);  // immediate shutdown: nothing here needs to survive
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

PostgresServer::~PostgresServer() { Remove(); }

}  // namespace recal::testing
