// recal-server's log: one line per event on stderr, as text or as JSON (one object a line:
// time, level, msg and the event's fields). Thread-safe; lines below the level are dropped.
//   log::Info("job started", {{"job_id", id}, {"device", device}});
#pragma once

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace recal::log {

enum class Level { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class Format { kText, kJson };

// A field's value as written; numbers are written as JSON numbers.
struct Value {
  Value(absl::string_view s) : text(s) {}
  Value(const char* s) : text(s) {}
  Value(const std::string& s) : text(s) {}
  template <typename N, typename = std::enable_if_t<std::is_arithmetic_v<N>>>
  Value(N n) : text(absl::StrCat(n)), number(true) {}
  std::string text;
  bool number = false;
};
using Fields = std::vector<std::pair<std::string, Value>>;

// A value a client sent (an id, a reference, an error message quoting one), as it may be
// logged: its first kMaxClientValueBytes bytes, then "…(N bytes, truncated)". Every
// client-supplied value goes through here, so that no request writes more than a line.
inline constexpr size_t kMaxClientValueBytes = 256;
std::string ClientValue(absl::string_view value);

// "text" | "json" and "debug" | "info" | "warning" | "error"; INVALID_ARGUMENT otherwise.
absl::Status Configure(absl::string_view format, absl::string_view level);
bool Enabled(Level level);

void Write(Level level, absl::string_view msg, const Fields& fields = {});
inline void Debug(absl::string_view msg, const Fields& fields = {}) { Write(Level::kDebug, msg, fields); }
inline void Info(absl::string_view msg, const Fields& fields = {}) { Write(Level::kInfo, msg, fields); }
inline void Warning(absl::string_view msg, const Fields& fields = {}) { Write(Level::kWarning, msg, fields); }
inline void Error(absl::string_view msg, const Fields& fields = {}) { Write(Level::kError, msg, fields); }

// One line, without the trailing newline (for tests).
std::string FormatLine(Format format, Level level, absl::string_view time, absl::string_view msg,
                   const Fields& fields);

}  // namespace recal::log
