// A thin RAII layer over the SQLite C API for MetadataStore: prepared statements cached per
// SQL text, bind/step/column helpers that turn SQLite errors into absl::InternalError with
// sqlite3_errmsg, and a transaction guard that rolls back unless committed.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::store::internal {

class Db;

// A cached prepared statement in use. Reset and unbound when it goes out of scope, so the
// cache can hand it out again (so never hold two Querys of the same SQL at once). Bind indices are 1-based,
// column indices 0-based.
class Query {
 public:
  Query(Db* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  Query(Query&& other) noexcept
      : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)), bind_rc_(other.bind_rc_) {}
  Query& operator=(Query&&) = delete;
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;
  ~Query();

  Query& Bind(int i, absl::string_view text);  // TEXT
  Query& BindBlob(int i, absl::string_view bytes);
  Query& Bind(int i, int64_t value);
  Query& BindNull(int i);

  // true: a row is available; false: done. Bind errors surface here.
  absl::StatusOr<bool> Step();
  // For statements that return no rows.
  absl::Status Run();

  int64_t Int64(int col) const;
  std::string Text(int col) const;
  std::string Blob(int col) const;

 private:
  Db* db_;
  sqlite3_stmt* stmt_;
  int bind_rc_ = SQLITE_OK;  // first bind failure, reported by Step
};

class Db {
 public:
  static absl::StatusOr<Db> Open(const std::string& path);
  Db(Db&& other) noexcept;
  Db& operator=(Db&& other) = delete;
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
  ~Db();

  // A statement for `sql`, prepared once and reused.
  absl::StatusOr<Query> Prepare(const std::string& sql);
  // Runs one or more statements that return no rows (schema, pragmas, BEGIN/COMMIT).
  absl::Status Exec(const std::string& sql);
  int64_t Changes() const { return sqlite3_changes64(db_); }

  // InternalError naming `what` and SQLite's message for the last failure.
  absl::Status Error(absl::string_view what) const;
  const std::string& path() const { return path_; }

 private:
  // A file the connection opened stays readable and writable after it is deleted or renamed
  // away, and another file may take its path: what this connection writes would then reach
  // no file anyone will open again. So every statement first checks that `path_` is still
  // the file opened (device and inode): DATA_LOSS naming it, before anything is written,
  // when it is not. The health check fails with it too (recal-server's NOT_SERVING).
  struct FileIdentity {
    uint64_t device = 0, inode = 0;
    bool known = false;      // the file existed at a statement: these are its numbers
    bool in_memory = false;  // nothing to check (or a URI, whose file is not `path_`)
  };
  absl::Status CheckFile();

  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_ = nullptr;
  std::string path_;
  FileIdentity file_;
  std::map<std::string, sqlite3_stmt*> statements_;
};

// BEGIN IMMEDIATE on construction (take the write lock up front, so a transaction that
// reads then writes cannot fail half-way with SQLITE_BUSY); ROLLBACK on destruction unless
// Commit() succeeded.
class Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(Db* db);
  Transaction(Transaction&& other) noexcept : db_(std::exchange(other.db_, nullptr)) {}
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();
  absl::Status Commit();

 private:
  explicit Transaction(Db* db) : db_(db) {}
  Db* db_;  // null once committed or rolled back
};

}  // namespace recal::store::internal
