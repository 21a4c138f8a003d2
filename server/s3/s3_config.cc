#include "server/s3/s3_config.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace recal::s3 {
namespace {

constexpr size_t kMaxCredentialFileBytes = 1 << 20;
constexpr size_t kMaxPrefixBytes = 900;

bool IsDefaultPort(absl::string_view scheme, int port) {
  return port == 0 || (scheme == "http" && port == 80) || (scheme == "https" && port == 443);
}

// NOT_FOUND when the file does not exist (the caller decides whether that matters).
absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string data;
  data.resize(kMaxCredentialFileBytes + 1);
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));
  data.resize(static_cast<size_t>(in.gcount()));
  if (data.size() > kMaxCredentialFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is over ", kMaxCredentialFileBytes, " bytes"));
  }
  return data;
}

std::string Trimmed(absl::string_view s) { return std::string(absl::StripAsciiWhitespace(s)); }

absl::Status CheckCredentials(const Credentials& c, absl::string_view source) {
  for (const std::string* v : {&c.access_key_id, &c.secret_access_key, &c.session_token}) {
    for (char ch : *v) {
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
        return absl::InvalidArgumentError(absl::StrCat("credentials from ", source, " contain a control character"));
      }
    }
  }
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("credentials from ", source, ": an access key id without a secret access key or the reverse"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Credentials> FromDirectory(const std::string& dir) {
  Credentials c;
  const std::pair<const char*, std::string*> files[] = {{"access_key_id", &c.access_key_id},
                                                        {"secret_access_key", &c.secret_access_key},
                                                        {"session_token", &c.session_token}};
  for (const auto& [name, value] : files) {
    const std::string path = absl::StrCat(dir, "/", name);
    auto data = ReadSmallFile(path);
    if (!data.ok()) {
      if (absl::IsNotFound(data.status()) && value == &c.session_token) continue;  // optional
      return absl::Status(data.status().code(),
                          absl::StrCat("S3 credentials directory ", dir, ": ", data.status().message()));
    }
    *value = Trimmed(*data);
  }
  if (absl::Status st = CheckCredentials(c, absl::StrCat("directory ", dir)); !st.ok()) return st;
  return c;
}

}  // namespace

std::string Endpoint::ToString() const {
  return IsDefaultPort(scheme, port) ? absl::StrCat(scheme, "://", host) : absl::StrCat(scheme, "://", host, ":", port);
}

std::string Endpoint::HostHeader() const {
  return IsDefaultPort(scheme, port) ? host : absl::StrCat(host, ":", port);
}

absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url) {
  const std::string quoted = absl::StrCat("'", absl::CHexEscape(url), "'");
  Endpoint e;
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "https://")) {
    e.scheme = "https";
  } else if (absl::ConsumePrefix(&rest, "http://")) {
    e.scheme = "http";
  } else {
    return absl::InvalidArgumentError(absl::StrCat("S3 endpoint ", quoted, ": must start with http:// or https://"));
  }
  absl::ConsumeSuffix(&rest, "/");
  if (rest.empty()) return absl::InvalidArgumentError(absl::StrCat("S3 endpoint ", quoted, ": no host"));
  absl::string_view host = rest;
  absl::string_view port;
  if (rest.front() == '[') {  // IPv6 literal
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("S3 endpoint ", quoted, ": unterminated '['"));
    }
    host = rest.substr(0, close + 1);
    absl::string_view after = rest.substr(close + 1);
    if (!after.empty() && !absl::ConsumePrefix(&after, ":")) {
      return absl::InvalidArgumentError(absl::StrCat("S3 endpoint ", quoted, ": a path, query or user info"));
    }
    port = after;
    for (char c : host.substr(1, host.size() - 2)) {
      if (!absl::ascii_isxdigit(c) && c != ':' && c != '.') {
        return absl::InvalidArgumentError(absl::StrCat("S3 endpoint ", quoted, ": bad IPv6 address"));
      }
    }
  } else {
    if (const size_t colon = rest.find(':'); colon != absl::string_view::npos) {
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
    }
    if (host.empty()) return absl::InvalidArgumentError(absl::StrCat("S3 endpoint ", quoted, ": no host"));
    // Letters, digits, '.', '-' only: rules out paths, queries, fragments and user info
    // ('/', '?', '#', '@'), which a configuration should not smuggle into every request.
    for (char c : host) {
      if (!absl::ascii_isalnum(c) && c != '.' && c != '-') {
        return absl::InvalidArgumentError(
            absl::StrCat("S3 endpoint ", quoted, ": only scheme://host[:port] is allowed"));
      }
    }
  }
  if (!port.empty() || absl::EndsWith(rest, ":")) {
    if (!absl::SimpleAtoi(port, &e.port) || e.port < 1 || e.port > 65535 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); })) {
      return absl::InvalidArgumentError(absl::StrCat("S3 endpoint ", quoted, ": bad port"));
    }
  }
  e.host = absl::AsciiStrToLower(host);
  return e;
}

EnvLookup ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadIniSection(absl::string_view text,
                                                                                absl::string_view section) {
  if (text.size() > kMaxCredentialFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat("an INI file over ", kMaxCredentialFileBytes, " bytes"));
  }
  std::vector<std::pair<std::string, std::string>> out;
  bool found = false;
  bool in_section = false;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);  // also a '\r' of CRLF files
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']') {
        return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": a section header without ']'"));
      }
      in_section = absl::StripAsciiWhitespace(line.substr(1, line.size() - 2)) == section;
      found = found || in_section;
      continue;
    }
    if (!in_section) continue;
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": neither [section] nor key = value"));
    }
    out.emplace_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq))),
                     Trimmed(line.substr(eq + 1)));
  }
  if (!found) return absl::NotFoundError(absl::StrCat("no section [", section, "]"));
  return out;
}

absl::StatusOr<Credentials> LoadCredentials(const S3Settings& settings, const EnvLookup& env) {
  if (!settings.credentials_dir.empty()) return FromDirectory(settings.credentials_dir);

  const auto key_id = env("AWS_ACCESS_KEY_ID");
  const auto secret = env("AWS_SECRET_ACCESS_KEY");
  if (key_id.has_value() || secret.has_value()) {
    Credentials c{Trimmed(key_id.value_or("")), Trimmed(secret.value_or("")),
                  Trimmed(env("AWS_SESSION_TOKEN").value_or(""))};
    if (absl::Status st = CheckCredentials(c, "$AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY"); !st.ok()) return st;
    return c;
  }

  std::string path;
  if (auto p = env("AWS_SHARED_CREDENTIALS_FILE"); p.has_value() && !p->empty()) {
    path = *p;
  } else if (auto home = env("HOME"); home.has_value() && !home->empty()) {
    path = absl::StrCat(*home, "/.aws/credentials");
  }
  std::string profile = settings.profile;
  if (profile.empty()) profile = env("AWS_PROFILE").value_or("");
  const bool named_profile = !profile.empty();
  if (profile.empty()) profile = "default";
  const std::string tried =
      absl::StrCat("no S3 credentials: no credentials directory configured, $AWS_ACCESS_KEY_ID is not set, and ",
                   path.empty() ? std::string("no shared credentials file ($HOME is not set)") : path);
  if (path.empty()) return absl::FailedPreconditionError(tried);
  auto text = ReadSmallFile(path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status()) && !named_profile) {
      return absl::FailedPreconditionError(absl::StrCat(tried, " does not exist"));
    }
    return absl::Status(text.status().code(), absl::StrCat("S3 shared credentials file: ", text.status().message()));
  }
  auto section = ReadIniSection(*text, profile);
  if (!section.ok()) {
    if (absl::IsNotFound(section.status()) && !named_profile) {
      return absl::FailedPreconditionError(absl::StrCat(tried, " has no [default] profile"));
    }
    return absl::Status(section.status().code(), absl::StrCat(path, ": ", section.status().message()));
  }
  Credentials c;
  for (const auto& [k, v] : *section) {
    if (k == "aws_access_key_id") c.access_key_id = v;
    if (k == "aws_secret_access_key") c.secret_access_key = v;
    if (k == "aws_session_token") c.session_token = v;
  }
  if (absl::Status st = CheckCredentials(c, absl::StrCat(path, " [", profile, "]")); !st.ok()) return st;
  return c;
}

absl::StatusOr<S3Config> MakeS3Config(const S3Settings& settings, const EnvLookup& env) {
  S3Config config;
  config.region = settings.region;
  if (config.region.empty()) config.region = env("AWS_REGION").value_or("");
  if (config.region.empty()) config.region = env("AWS_DEFAULT_REGION").value_or("");
  if (config.region.empty()) config.region = "us-east-1";
  for (char c : config.region) {
    if (!absl::ascii_isalnum(c) && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat("S3 region '", absl::CHexEscape(config.region), "'"));
    }
  }
  if (settings.endpoint.empty()) {
    config.endpoint = Endpoint{"https", absl::StrCat("s3.", config.region, ".amazonaws.com"), 0};
    config.addressing = Addressing::kVirtualHost;
  } else {
    auto endpoint = ParseEndpoint(settings.endpoint);
    if (!endpoint.ok()) return endpoint.status();
    config.endpoint = *std::move(endpoint);
    config.addressing = Addressing::kPath;
  }
  if (settings.addressing == "path") {
    config.addressing = Addressing::kPath;
  } else if (settings.addressing == "virtual") {
    config.addressing = Addressing::kVirtualHost;
  } else if (!settings.addressing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 addressing '", settings.addressing, "': expected 'path' or 'virtual'"));
  }
  auto creds = LoadCredentials(settings, env);
  if (!creds.ok()) return creds.status();
  config.credentials = *std::move(creds);
  return config;
}

std::string S3Location::ToString() const { return absl::StrCat("s3://", bucket, "/", prefix); }

absl::Status ValidateBucketName(absl::string_view b) {
  const std::string quoted = absl::StrCat("'", absl::CHexEscape(b), "'");
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("S3 bucket name ", quoted, ": ", why));
  };
  if (b.size() < 3 || b.size() > 63) return bad("must be 3 to 63 characters");
  for (char c : b) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '.' && c != '-') {
      return bad("only lowercase letters, digits, '.' and '-' are allowed");
    }
  }
  if (!absl::ascii_isalnum(b.front()) || !absl::ascii_isalnum(b.back())) {
    return bad("must start and end with a letter or digit");
  }
  if (absl::StrContains(b, "..")) return bad("must not contain \"..\"");
  if (absl::StartsWith(b, "xn--") || absl::StartsWith(b, "sthree-") || absl::EndsWith(b, "-s3alias") ||
      absl::EndsWith(b, "--ol-s3")) {
    return bad("reserved prefix or suffix");
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(b, '.');
  if (parts.size() == 4 && std::all_of(parts.begin(), parts.end(), [](absl::string_view p) {
        return !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return absl::ascii_isdigit(c); });
      })) {
    return bad("must not look like an IP address");
  }
  return absl::OkStatus();
}

absl::Status ValidateObjectKey(absl::string_view key) {
  if (key.empty() || key.size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("S3 key of ", key.size(), " bytes (must be 1 to 1024)"));
  }
  if (key.find_first_of(absl::string_view("\0\r\n", 3)) != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("S3 key '", absl::CHexEscape(key), "' has a NUL, CR or LF"));
  }
  return absl::OkStatus();
}

absl::StatusOr<S3Location> ParseS3Url(absl::string_view url) {
  const std::string quoted = absl::StrCat("'", absl::CHexEscape(url.substr(0, 200)), "'");
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(absl::StrCat("S3 location ", quoted, ": must start with s3://"));
  }
  for (char c : rest) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat("S3 location ", quoted, ": a control character"));
    }
    if (c == '?' || c == '#' || c == '\\') {
      return absl::InvalidArgumentError(absl::StrCat("S3 location ", quoted, ": '", std::string(1, c),
                                                     "' is not allowed (a URL's query, fragment or a backslash)"));
    }
  }
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (loc.bucket.empty()) return absl::InvalidArgumentError(absl::StrCat("S3 location ", quoted, ": no bucket"));
  if (absl::Status st = ValidateBucketName(loc.bucket); !st.ok()) return st;
  if (slash == absl::string_view::npos) return loc;
  std::vector<absl::string_view> segments;
  for (absl::string_view seg : absl::StrSplit(rest.substr(slash + 1), '/')) {
    if (seg.empty() || seg == ".") continue;
    if (seg == "..") {
      return absl::InvalidArgumentError(absl::StrCat("S3 location ", quoted, ": a \"..\" segment"));
    }
    segments.push_back(seg);
  }
  if (!segments.empty()) loc.prefix = absl::StrCat(absl::StrJoin(segments, "/"), "/");
  if (loc.prefix.size() > kMaxPrefixBytes) {
    return absl::InvalidArgumentError(absl::StrCat("S3 location ", quoted, ": a prefix over ", kMaxPrefixBytes, " bytes"));
  }
  return loc;
}

}  // namespace recal::s3
