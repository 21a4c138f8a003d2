#include "server/store/postgres_util.h"

#include <poll.h>

#include <cerrno>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace recal::store::internal::pg {
namespace {

// Type OIDs from catalog/pg_type.h, which only the server headers carry; they are fixed
// since PostgreSQL 7.
constexpr unsigned int kByteaOid = 17;
constexpr unsigned int kInt8Oid = 20;
constexpr unsigned int kTextOid = 25;
constexpr unsigned int kTextArrayOid = 1009;

constexpr int kBinary = 1;
// Oldest server with everything the schema uses (identity columns, ON CONFLICT).
constexpr int kMinServerVersion = 100000;

// libpq's multi-line messages ("...failed: Connection refused\n\tIs the server running...")
// on one line, without the password should a message ever quote it.
std::string Clean(absl::string_view message, const std::string& password) {
  std::string s(absl::StripAsciiWhitespace(message));
  s = absl::StrReplaceAll(s, {{"\n\t", " "}, {"\n", "; "}});
  if (!password.empty()) s = absl::StrReplaceAll(s, {{password, "***"}});
  return s;
}

// The password of a URI's user-info, for when libpq cannot parse the URI and so cannot say.
std::string UriPassword(absl::string_view uri) {
  const size_t scheme = uri.find("://");
  if (scheme == absl::string_view::npos) return "";
  absl::string_view rest = uri.substr(scheme + 3);
  rest = rest.substr(0, rest.find_first_of("/?"));
  const size_t at = rest.rfind('@');
  if (at == absl::string_view::npos) return "";
  absl::string_view userinfo = rest.substr(0, at);
  const size_t colon = userinfo.find(':');
  return colon == absl::string_view::npos ? "" : std::string(userinfo.substr(colon + 1));
}

uint64_t BigEndian(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Network byte order, as every integer of the binary formats.
void AppendInt32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(value >> (24 - 8 * i)));
}

}  // namespace

// ----------------------------------------------------------------------------- Params

void Params::Add(unsigned int type, absl::string_view value, bool null) {
  types_.push_back(type);
  values_.emplace_back(value);
  nulls_.push_back(null);
}

Params& Params::Text(absl::string_view text) {
  Add(kTextOid, text, false);  // the binary form of TEXT is its bytes
  return *this;
}

Params& Params::Bytes(absl::string_view bytes) {
  Add(kByteaOid, bytes, false);
  return *this;
}

Params& Params::Int64(int64_t value) {
  char be[8];
  const uint64_t u = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) be[i] = static_cast<char>(u >> (56 - 8 * i));
  Add(kInt8Oid, absl::string_view(be, sizeof(be)), false);
  return *this;
}

Params& Params::TextArray(const std::vector<std::string>& texts) {
  // array_recv's format: dimensions, a has-nulls flag, the element type; then each
  // dimension's size and lower bound; then each element's length and bytes.
  std::string array;
  AppendInt32(array, texts.empty() ? 0 : 1);
  AppendInt32(array, 0);
  AppendInt32(array, kTextOid);
  if (!texts.empty()) {
    AppendInt32(array, static_cast<uint32_t>(texts.size()));
    AppendInt32(array, 1);
  }
  for (const std::string& text : texts) {
    AppendInt32(array, static_cast<uint32_t>(text.size()));
    array += text;
  }
  Add(kTextArrayOid, array, false);
  return *this;
}

Params& Params::NullText() {
  Add(kTextOid, "", true);
  return *this;
}

Params& Params::NullInt64() {
  Add(kInt8Oid, "", true);
  return *this;
}

// ----------------------------------------------------------------------------- Result

int64_t Result::Int64(int row, int col) const {
  const char* p = PQgetvalue(res_.get(), row, col);
  const int n = PQgetlength(res_.get(), row, col);
  // Sign-extend int2/int4; int8 fills the word.
  switch (n) {
    case 2: return static_cast<int16_t>(BigEndian(p, 2));
    case 4: return static_cast<int32_t>(BigEndian(p, 4));
    case 8: return static_cast<int64_t>(BigEndian(p, 8));
    default: return 0;  // NULL
  }
}

std::string Result::Bytes(int row, int col) const {
  return std::string(PQgetvalue(res_.get(), row, col), static_cast<size_t>(PQgetlength(res_.get(), row, col)));
}

bool Result::Bool(int row, int col) const {
  return PQgetlength(res_.get(), row, col) == 1 && PQgetvalue(res_.get(), row, col)[0] != 0;
}

int64_t Result::Affected() const {
  int64_t n = 0;
  return absl::SimpleAtoi(PQcmdTuples(res_.get()), &n) ? n : 0;
}

// ------------------------------------------------------------------------- Connection

absl::StatusOr<Connection> Connection::Open(const std::string& uri) {
  char* parse_error = nullptr;
  PQconninfoOption* options = PQconninfoParse(uri.c_str(), &parse_error);
  if (options == nullptr) {
    const std::string why = parse_error != nullptr ? parse_error : "out of memory";
    PQfreemem(parse_error);
    return absl::InvalidArgumentError(
        absl::StrCat("not a PostgreSQL connection URI: ", Clean(why, UriPassword(uri))));
  }
  std::string host, hostaddr, port, dbname, user, password;
  for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    const absl::string_view key = o->keyword;
    if (key == "host") host = o->val;
    if (key == "hostaddr") hostaddr = o->val;
    if (key == "port") port = o->val;
    if (key == "dbname") dbname = o->val;
    if (key == "user") user = o->val;
    if (key == "password") password = o->val;
  }
  PQconninfoFree(options);
  if (host.empty()) host = hostaddr.empty() ? "the default socket" : hostaddr;
  std::string where = absl::StrCat(host, ":", port.empty() ? "5432" : port, "/", dbname.empty() ? user : dbname);

  // Keywords before "dbname" are defaults the URI may override: a store must not wait
  // forever for an unreachable host, and must read and write text as UTF-8 whatever the
  // database's encoding.
  const char* const keys[] = {"fallback_application_name", "connect_timeout", "client_encoding", "dbname", nullptr};
  const char* const values[] = {"recal", "10", "UTF8", uri.c_str(), nullptr};
  std::unique_ptr<PGconn, Finish> conn(PQconnectdbParams(keys, values, /*expand_dbname=*/1));
  if (conn == nullptr) return absl::ResourceExhaustedError("libpq could not allocate a connection");
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    return absl::UnavailableError(absl::StrCat("cannot connect to PostgreSQL at ", where, ": ",
                                               Clean(PQerrorMessage(conn.get()), password)));
  }
  if (PQserverVersion(conn.get()) < kMinServerVersion) {
    return absl::FailedPreconditionError(absl::StrCat("PostgreSQL at ", where, " is version ",
                                                      PQparameterStatus(conn.get(), "server_version"),
                                                      "; the metadata store needs 10 or newer"));
  }
  // Notices ("relation already exists, skipping") are not errors, and libpq would print
  // them on stderr.
  PQsetNoticeProcessor(conn.get(), [](void*, const char*) {}, nullptr);
  return Connection(std::move(conn), std::move(where), std::move(password));
}

absl::Status Connection::Reconnect() {
  PQreset(conn_.get());
  if (!ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reconnect to PostgreSQL at ", where_, ": ",
                                               Clean(PQerrorMessage(conn_.get()), password_)));
  }
  return absl::OkStatus();
}

absl::Status Connection::Lost(absl::string_view what) const {
  return absl::UnavailableError(absl::StrCat("lost the connection to PostgreSQL at ", where_, " in ", what, ": ",
                                             Clean(PQerrorMessage(conn_.get()), password_)));
}

absl::Status Connection::Error(const PGresult* res, absl::string_view sql) const {
  if (!ok()) return Lost(sql);
  const char* state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
  const char* primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  const char* detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
  const absl::string_view code = state != nullptr ? state : "";
  std::string message = absl::StrCat(
      "PostgreSQL error in ", sql, " on ", where_, ": ",
      Clean(primary != nullptr ? primary : PQresultErrorMessage(res), password_),
      detail != nullptr ? absl::StrCat(" (", Clean(detail, password_), ")") : "", code.empty() ? "" : " [",
      code, code.empty() ? "" : "]");
  if (code == "23505") return absl::AlreadyExistsError(message);                  // unique_violation
  if (code == "40001" || code == "40P01") return absl::AbortedError(message);     // serialization, deadlock
  if (code == "22021" || code == "22P05") return absl::InvalidArgumentError(message);  // bad text
  // connection exceptions, the server shutting down or starting up
  if (absl::StartsWith(code, "08") || absl::StartsWith(code, "57P")) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

absl::StatusOr<Result> Connection::Exec(const std::string& sql, const Params& params) {
  const size_t n = params.types_.size();
  std::vector<const char*> values(n);
  std::vector<int> lengths(n);
  const std::vector<int> formats(n, kBinary);
  for (size_t i = 0; i < n; ++i) {
    values[i] = params.nulls_[i] ? nullptr : params.values_[i].data();
    lengths[i] = static_cast<int>(params.values_[i].size());
  }
  Result result(PQexecParams(conn_.get(), sql.c_str(), static_cast<int>(n), params.types_.data(), values.data(),
                             lengths.data(), formats.data(), kBinary));
  const std::string quoted = absl::StrCat("`", sql, "`");
  if (result.res_ == nullptr) return Lost(quoted);
  const ExecStatusType status = PQresultStatus(result.res_.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Error(result.res_.get(), quoted);
  return result;
}

absl::Status Connection::ExecScript(const std::string& sql) {
  Result result(PQexec(conn_.get(), sql.c_str()));
  if (result.res_ == nullptr) return Lost("a script");
  const ExecStatusType status = PQresultStatus(result.res_.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Error(result.res_.get(), "a script");
  return absl::OkStatus();
}

// ------------------------------------------------------------------------ Transaction

absl::StatusOr<Transaction> Transaction::Begin(Connection* conn) {
  absl::StatusOr<Result> begun = conn->Exec("BEGIN");
  if (!begun.ok()) return begun.status();
  return absl::StatusOr<Transaction>(Transaction(conn));
}

Transaction::~Transaction() {
  if (conn_ != nullptr && conn_->ok()) (void)conn_->Exec("ROLLBACK");
}

absl::Status Transaction::Commit() {
  Connection* conn = std::exchange(conn_, nullptr);
  conn->MarkCommitSent();
  absl::StatusOr<Result> committed = conn->Exec("COMMIT");
  if (!conn->ok()) {
    return absl::UnavailableError(absl::StrCat("lost the connection to PostgreSQL at ", conn->where(),
                                               " during COMMIT: the transaction may or may not have been applied"));
  }
  if (!committed.ok()) return committed.status();
  // COMMIT of a transaction that had failed ends it with ROLLBACK and no error.
  if (committed->Tag() != "COMMIT") {
    return absl::AbortedError(absl::StrCat("PostgreSQL at ", conn->where(), " rolled the transaction back"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Connection::AwaitNotifications(int timeout_ms) {
  PGconn* conn = conn_.get();
  auto drain = [conn] {
    int count = 0;
    while (PGnotify* notify = PQnotifies(conn)) {
      PQfreemem(notify);
      ++count;
    }
    return count;
  };
  if (int already = drain(); already > 0) return already;
  const int fd = PQsocket(conn);
  if (fd < 0) return Lost("waiting for notifications");
  pollfd waiting{fd, POLLIN, 0};
  const int ready = ::poll(&waiting, 1, timeout_ms);
  if (ready < 0 && errno != EINTR) return Lost("waiting for notifications");
  if (ready <= 0) return 0;
  if (PQconsumeInput(conn) == 0) return Lost("reading notifications");
  return drain();
}

}  // namespace recal::store::internal::pg
