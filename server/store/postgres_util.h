// A thin layer over libpq for PostgresMetadataStore: typed parameters and results in binary
// format (bytes, NULs and numbers arrive exactly as given, and values are never spliced into
// SQL text), libpq errors as absl::Status by SQLSTATE, a connection that can be reopened, and a
// transaction guard that rolls back unless committed. Not thread-safe: the store serialises
// all use of one Connection.
#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::store::internal::pg {

// The parameters $1, $2, ... of one statement, in the order they are added. Each carries
// its type, so the server never has to guess one from context (`$1 = 0` would be int4).
class Params {
 public:
  Params& Text(absl::string_view text);
  Params& Bytes(absl::string_view bytes);  // BYTEA
  Params& Int64(int64_t value);            // BIGINT
  Params& TextArray(const std::vector<std::string>& texts);  // TEXT[], one dimension (may be empty)
  Params& NullText();
  Params& NullInt64();

 private:
  friend class Connection;
  void Add(unsigned int type, absl::string_view value, bool null);
  std::vector<unsigned int> types_;  // Oid
  std::vector<std::string> values_;
  std::vector<bool> nulls_;
};

// The rows of one statement, read in binary format. Int64 reads int2/int4/int8 columns
// (cast anything else, e.g. SUM() is NUMERIC, to BIGINT in the SQL); Bytes reads TEXT and
// BYTEA alike.
class Result {
 public:
  int rows() const { return PQntuples(res_.get()); }
  bool IsNull(int row, int col) const { return PQgetisnull(res_.get(), row, col) != 0; }
  int64_t Int64(int row, int col) const;
  std::string Bytes(int row, int col) const;
  bool Bool(int row, int col) const;
  // The command tag ("COMMIT", "ROLLBACK", "INSERT 0 1", ...).
  std::string Tag() const { return PQcmdStatus(res_.get()); }
  // Rows an INSERT, UPDATE or DELETE touched.
  int64_t Affected() const;

 private:
  friend class Connection;
  struct Clear {
    void operator()(PGresult* r) const { PQclear(r); }
  };
  explicit Result(PGresult* res) : res_(res) {}
  std::unique_ptr<PGresult, Clear> res_;
};

class Connection {
 public:
  // Connects to a libpq URI or conninfo string. INVALID_ARGUMENT if it does not parse,
  // UNAVAILABLE (naming host, port and database, never the password) if no connection comes
  // up.
  static absl::StatusOr<Connection> Open(const std::string& uri);

  // One statement. Errors: UNAVAILABLE when the connection is lost, ALREADY_EXISTS for a
  // unique violation, ABORTED for a serialization failure or deadlock, INVALID_ARGUMENT for
  // text the database cannot hold (NUL bytes, invalid UTF-8), INTERNAL with the server's
  // message otherwise.
  absl::StatusOr<Result> Exec(const std::string& sql, const Params& params = Params());
  // Several statements without parameters (schema).
  absl::Status ExecScript(const std::string& sql);
  // Waits up to `timeout` for NOTIFY messages on the channels this connection LISTENs to;
  // returns how many arrived (0: none). UNAVAILABLE once the connection is lost.
  absl::StatusOr<int> AwaitNotifications(int timeout_ms);

  bool ok() const { return PQstatus(conn_.get()) == CONNECTION_OK; }
  // Drops the connection and opens it again with the same parameters; UNAVAILABLE if it
  // does not come up.
  absl::Status Reconnect();
  // Whether a COMMIT went out since the last ClearCommitSent: if the connection then broke,
  // the transaction may or may not have been applied, so the work must not be redone.
  bool commit_sent() const { return commit_sent_; }
  void ClearCommitSent() { commit_sent_ = false; }
  void MarkCommitSent() { commit_sent_ = true; }
  // "host:port/database", for messages.
  const std::string& where() const { return where_; }

 private:
  struct Finish {
    void operator()(PGconn* c) const { PQfinish(c); }
  };
  Connection(std::unique_ptr<PGconn, Finish> conn, std::string where, std::string password)
      : conn_(std::move(conn)), where_(std::move(where)), password_(std::move(password)) {}
  absl::Status Error(const PGresult* res, absl::string_view sql) const;
  absl::Status Lost(absl::string_view what) const;

  std::unique_ptr<PGconn, Finish> conn_;
  std::string where_;
  std::string password_;  // only to keep it out of messages
  bool commit_sent_ = false;
};

// BEGIN on construction; ROLLBACK on destruction unless Commit() succeeded. Every write
// runs in one, so that a connection lost before COMMIT has left nothing behind.
class Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(Connection* conn);
  Transaction(Transaction&& other) noexcept : conn_(std::exchange(other.conn_, nullptr)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();
  absl::Status Commit();

 private:
  explicit Transaction(Connection* conn) : conn_(conn) {}
  Connection* conn_;  // null once committed or rolled back
};

}  // namespace recal::store::internal::pg
