#include "server/log/log.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace recal::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
std::atomic<bool> g_json{false};
std::mutex g_mu;

const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarning: return "warning";
    case Level::kError: return "error";
  }
  return "info";
}

void AppendJsonString(std::string& out, absl::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

bool IsJsonNumber(const std::string& text) {
  double value = 0;
  return absl::SimpleAtod(text, &value) && std::isfinite(value);
}

// Text values with spaces, quotes or '=' are quoted so that a line splits back into fields.
void AppendTextValue(std::string& out, absl::string_view s) {
  if (!s.empty() && s.find_first_of(" \"=\t\n") == absl::string_view::npos) {
    out.append(s.data(), s.size());
  } else {
    AppendJsonString(out, s);
  }
}

}  // namespace

std::string ClientValue(absl::string_view value) {
  if (value.size() <= kMaxClientValueBytes) return std::string(value);
  // Not within a UTF-8 sequence: back off over its continuation bytes.
  size_t end = kMaxClientValueBytes;
  while (end > 0 && (static_cast<unsigned char>(value[end]) & 0xC0) == 0x80) --end;
  return absl::StrCat(value.substr(0, end), "\u2026(", value.size(), " bytes, truncated)");
}

absl::Status Configure(absl::string_view format, absl::string_view level) {
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(absl::StrCat("--log_format must be text or json, got '", format, "'"));
  }
  const std::string lower = absl::AsciiStrToLower(level);
  Level parsed;
  if (lower == "debug") {
    parsed = Level::kDebug;
  } else if (lower == "info") {
    parsed = Level::kInfo;
  } else if (lower == "warning" || lower == "warn") {
    parsed = Level::kWarning;
  } else if (lower == "error") {
    parsed = Level::kError;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_level must be debug, info, warning or error, got '", level, "'"));
  }
  g_json = format == "json";
  g_level = static_cast<int>(parsed);
  return absl::OkStatus();
}

bool Enabled(Level level) { return static_cast<int>(level) >= g_level.load(); }

std::string FormatLine(Format format, Level level, absl::string_view time, absl::string_view msg,
                   const Fields& fields) {
  std::string line;
  if (format == Format::kJson) {
    line = "{\"time\":";
    AppendJsonString(line, time);
    line += ",\"level\":";
    AppendJsonString(line, LevelName(level));
    line += ",\"msg\":";
    AppendJsonString(line, msg);
    for (const auto& [key, value] : fields) {
      line += ',';
      AppendJsonString(line, key);
      line += ':';
      if (value.number && IsJsonNumber(value.text)) {
        line += value.text;
      } else {
        AppendJsonString(line, value.text);
      }
    }
    line += '}';
    return line;
  }
  absl::StrAppend(&line, time, " ", absl::AsciiStrToUpper(LevelName(level)), " ", msg);
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&line, " ", key, "=");
    AppendTextValue(line, value.text);
  }
  return line;
}

void Write(Level level, absl::string_view msg, const Fields& fields) {
  if (!Enabled(level)) return;
  const std::string time = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::string line = FormatLine(g_json ? Format::kJson : Format::kText, level, time, msg, fields);
  line += '\n';
  std::lock_guard<std::mutex> lock(g_mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace recal::log
