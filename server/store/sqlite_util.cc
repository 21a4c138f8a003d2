#include "server/store/sqlite_util.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recal::store::internal {

Query::~Query() {
  if (stmt_ == nullptr) return;
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
}

Query& Query::Bind(int i, absl::string_view text) {
  const int rc = sqlite3_bind_text64(stmt_, i, text.data(), text.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Query& Query::BindBlob(int i, absl::string_view bytes) {
  // A null pointer would bind NULL, not an empty blob.
  const int rc =
      sqlite3_bind_blob64(stmt_, i, bytes.empty() ? "" : bytes.data(), bytes.size(), SQLITE_TRANSIENT);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Query& Query::Bind(int i, int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, i, value);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Query& Query::BindNull(int i) {
  const int rc = sqlite3_bind_null(stmt_, i);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

absl::StatusOr<bool> Query::Step() {
  if (bind_rc_ != SQLITE_OK) {
    return absl::InternalError(
        absl::StrCat("SQLite bind failed in `", sqlite3_sql(stmt_), "`: ", sqlite3_errstr(bind_rc_)));
  }
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Error(absl::StrCat("`", sqlite3_sql(stmt_), "`"));
}

absl::Status Query::Run() {
  absl::StatusOr<bool> row = Step();
  if (!row.ok()) return row.status();
  return absl::OkStatus();
}

int64_t Query::Int64(int col) const { return sqlite3_column_int64(stmt_, col); }

std::string Query::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  if (p == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
}

std::string Query::Blob(int col) const {
  const void* p = sqlite3_column_blob(stmt_, col);
  if (p == nullptr) return "";
  return std::string(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
}

absl::StatusOr<Db> Db::Open(const std::string& path) {
  sqlite3* raw = nullptr;
  // NOMUTEX: MetadataStore serialises all use of the connection with its own mutex.
  const int rc = sqlite3_open_v2(path.c_str(), &raw,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  Db db(raw, path);  // closes `raw` on every return, also on failure
  db.file_.in_memory = path.empty() || path == ":memory:" || absl::StartsWith(path, "file:");
  if (rc != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("cannot open database '", path,
                                            "': ", raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc),
                                            "; check that its directory exists and is writable"));
  }
  sqlite3_extended_result_codes(raw, 1);
  return db;
}

absl::Status Db::CheckFile() {
  if (file_.in_memory) return absl::OkStatus();
  struct stat now;
  const bool present = ::stat(path_.c_str(), &now) == 0;
  if (present && !file_.known) {  // SQLite creates the file at its first statement, not at open
    file_ = {static_cast<uint64_t>(now.st_dev), static_cast<uint64_t>(now.st_ino), true, false};
  }
  if (!file_.known && !present && errno == ENOENT) return absl::OkStatus();
  if (present && static_cast<uint64_t>(now.st_dev) == file_.device && static_cast<uint64_t>(now.st_ino) == file_.inode) {
    return absl::OkStatus();
  }
  const std::string what = present ? "was replaced by another file"
                                   : absl::StrCat("is gone (", std::strerror(errno), ")");
  return absl::DataLossError(absl::StrCat(
      "the database file '", path_, "' ", what, " while the server ran: nothing more is read from or written to it. "
      "Put the file back (or restore it from a backup) and restart the server"));
}

Db::Db(Db&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)),
      path_(std::move(other.path_)),
      file_(other.file_),
      statements_(std::move(other.statements_)) {
  other.statements_.clear();
}

Db::~Db() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  if (db_ != nullptr) sqlite3_close(db_);
}

absl::StatusOr<Query> Db::Prepare(const std::string& sql) {
  if (absl::Status file = CheckFile(); !file.ok()) return file;
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v3(db_, sql.c_str(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &stmt,
                           nullptr) != SQLITE_OK) {
      return Error(absl::StrCat("cannot prepare `", sql, "`"));
    }
    it = statements_.emplace(sql, stmt).first;
  }
  return Query(this, it->second);
}

absl::Status Db::Exec(const std::string& sql) {
  if (absl::Status file = CheckFile(); !file.ok()) return file;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
    return Error(absl::StrCat("`", sql, "`"));
  }
  return absl::OkStatus();
}

absl::Status Db::Error(absl::string_view what) const {
  return absl::InternalError(
      absl::StrCat("SQLite error in ", what, " on '", path_, "': ", sqlite3_errmsg(db_)));
}

absl::StatusOr<Transaction> Transaction::Begin(Db* db) {
  if (absl::Status s = db->Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  return absl::StatusOr<Transaction>(Transaction(db));
}

Transaction::~Transaction() {
  if (db_ != nullptr) (void)db_->Exec("ROLLBACK");
}

absl::Status Transaction::Commit() {
  Db* db = std::exchange(db_, nullptr);
  if (absl::Status s = db->Exec("COMMIT"); !s.ok()) {
    // A failed COMMIT can leave the transaction open; end it so the next one can begin.
    (void)db->Exec("ROLLBACK");
    return s;
  }
  return absl::OkStatus();
}

}  // namespace recal::store::internal
