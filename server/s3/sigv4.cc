#include "server/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace recal::s3 {
namespace {

constexpr absl::string_view kAlgorithm = "AWS4-HMAC-SHA256";

bool IsUnreserved(unsigned char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

// RFC 7230 tchar: what an HTTP header name may contain.
bool IsTokenChar(unsigned char c) {
  return absl::ascii_isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) !=
                                       std::string_view::npos;
}

// SigV4 canonical header value: leading/trailing whitespace trimmed, runs of spaces and tabs
// collapsed to one space (get-header-value-trim in AWS's suite).
std::string CanonicalValue(absl::string_view v) {
  v = absl::StripAsciiWhitespace(v);
  std::string out;
  out.reserve(v.size());
  bool in_space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      if (!in_space) out.push_back(' ');
      in_space = true;
    } else {
      out.push_back(c);
      in_space = false;
    }
  }
  return out;
}

bool IsPayloadHash(absl::string_view h) { return h == kUnsignedPayload || IsSha256Hex(h); }

bool IsSignerHeader(absl::string_view lower) {
  return lower == "x-amz-date" || lower == "x-amz-content-sha256" || lower == "x-amz-security-token" ||
         lower == "authorization";
}

}  // namespace

std::string UriEncode(absl::string_view in, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(in.size() * 3);
  for (char ch : in) {
    const auto c = static_cast<unsigned char>(ch);
    if (IsUnreserved(c) || (keep_slash && c == '/')) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

std::string AmzDate(absl::Time t) { return absl::FormatTime("%Y%m%dT%H%M%SZ", t, absl::UTCTimeZone()); }

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len) == nullptr) {
    // Only an allocation failure or a broken libcrypto gets here; a wrong signature would
    // be worse than a crash (as in common/sha256.cc).
    std::fprintf(stderr, "recal: OpenSSL HMAC-SHA256 failed\n");
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

namespace {

// What SigV4 would sign ambiguously or what AWS refuses, found before anything is built:
// credentials, the scope's region and service, the method, the path and the payload hash.
absl::Status CheckSigningInput(const SigningRequest& request, const SigningParams& params) {
  const Credentials& creds = params.credentials;
  if (creds.access_key_id.empty() || creds.secret_access_key.empty()) {
    return absl::InvalidArgumentError("SigV4: no access key id or secret access key");
  }
  // The key id is written into the Authorization header's Credential=ID/scope.
  if (creds.access_key_id.find_first_of(std::string_view("/, \t\r\n\0", 7)) != std::string::npos) {
    return absl::InvalidArgumentError("SigV4: the access key id has '/', ',' or whitespace");
  }
  if (params.region.empty() || params.service.empty() || absl::StrContains(params.region, '/') ||
      absl::StrContains(params.service, '/')) {
    return absl::InvalidArgumentError(
        absl::StrCat("SigV4: bad region '", params.region, "' or service '", params.service, "'"));
  }
  if (request.method.empty() || !std::all_of(request.method.begin(), request.method.end(),
                                             [](char c) { return absl::ascii_isupper(c); })) {
    return absl::InvalidArgumentError(absl::StrCat("SigV4: bad method '", request.method, "'"));
  }
  if (request.path.empty() || request.path[0] != '/') {
    return absl::InvalidArgumentError("SigV4: the path must start with '/'");
  }
  if (!IsPayloadHash(request.payload_hash)) {
    return absl::InvalidArgumentError("SigV4: the payload hash is neither hex SHA-256 nor UNSIGNED-PAYLOAD");
  }
  return absl::OkStatus();
}

// Lowercase header name -> its canonical values, in the order given. Sorted by name, as
// the canonical request lists them.
using HeaderValues = std::map<std::string, std::vector<std::string>>;

// The caller's headers, canonical: lowercase names, a repeated name's values kept in the
// order given (get-header-key-duplicate, get-header-value-order). Refuses what could inject
// or forge a header, and anything but exactly one non-empty Host.
absl::StatusOr<HeaderValues> CanonicalRequestHeaders(const HeaderList& request_headers) {
  HeaderValues headers;
  for (const auto& [name, value] : request_headers) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) {
          return IsTokenChar(static_cast<unsigned char>(c));
        })) {
      return absl::InvalidArgumentError(absl::StrCat("SigV4: bad header name '", absl::CHexEscape(name), "'"));
    }
    if (value.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("SigV4: header ", name, " has a CR, LF or NUL"));
    }
    std::string lower = absl::AsciiStrToLower(name);
    if (IsSignerHeader(lower)) {
      return absl::InvalidArgumentError(absl::StrCat("SigV4: header ", name, " is the signer's to set"));
    }
    headers[std::move(lower)].push_back(CanonicalValue(value));
  }
  if (headers.count("host") == 0 || headers["host"].size() != 1 || headers["host"][0].empty()) {
    return absl::InvalidArgumentError("SigV4: exactly one non-empty Host header is required");
  }
  return headers;
}

// The headers the signer sets, other than Authorization: added both to the request (`out`)
// and to what is signed (`headers`).
absl::Status AddSignerHeaders(const SigningRequest& request, const Credentials& creds, const std::string& amz_date,
                              HeaderValues& headers, SignedRequest& out) {
  if (creds.session_token.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
    return absl::InvalidArgumentError("SigV4: the session token has a CR, LF or NUL");
  }
  const auto add = [&](const char* name, const std::string& value) {
    out.headers_to_add.emplace_back(name, value);
    headers[name].push_back(value);
  };
  add("x-amz-date", amz_date);
  if (request.add_content_sha256_header) add("x-amz-content-sha256", request.payload_hash);
  // Signed, as STS requires (post-sts-header-before in AWS's suite).
  if (!creds.session_token.empty()) add("x-amz-security-token", creds.session_token);
  return absl::OkStatus();
}

// Keys and values encoded (nothing kept, not even '/'), sorted by key then value.
std::string CanonicalQuery(const HeaderList& request_query) {
  std::vector<std::pair<std::string, std::string>> query;
  query.reserve(request_query.size());
  for (const auto& [k, v] : request_query) query.emplace_back(UriEncode(k, false), UriEncode(v, false));
  std::sort(query.begin(), query.end());
  std::vector<std::string> parts;
  parts.reserve(query.size());
  for (const auto& [k, v] : query) parts.push_back(absl::StrCat(k, "=", v));
  return absl::StrJoin(parts, "&");
}

// Sets out.canonical_request (and the encoded path and query it holds, which the URL must
// carry); returns the signed headers' names, "host;x-amz-date".
std::string CanonicalRequest(const SigningRequest& request, const HeaderValues& headers, SignedRequest& out) {
  std::string canonical_headers;
  std::vector<absl::string_view> names;
  for (const auto& [name, values] : headers) {
    absl::StrAppend(&canonical_headers, name, ":", absl::StrJoin(values, ","), "\n");
    names.push_back(name);
  }
  const std::string signed_headers = absl::StrJoin(names, ";");
  out.encoded_query = CanonicalQuery(request.query);
  out.encoded_path = UriEncode(request.path, /*keep_slash=*/true);
  out.canonical_request = absl::StrCat(request.method, "\n", out.encoded_path, "\n", out.encoded_query, "\n",
                                       canonical_headers, "\n", signed_headers, "\n", request.payload_hash);
  return signed_headers;
}

// "20150830/us-east-1/s3/aws4_request".
std::string CredentialScope(absl::string_view date, const SigningParams& params) {
  return absl::StrCat(date, "/", params.region, "/", params.service, "/aws4_request");
}

std::string StringToSign(absl::string_view amz_date, absl::string_view scope, absl::string_view canonical_request) {
  return absl::StrCat(kAlgorithm, "\n", amz_date, "\n", scope, "\n", Sha256Hex(canonical_request));
}

// The secret, narrowed to one day, region and service.
std::string SigningKey(const SigningParams& params, absl::string_view date) {
  const std::string k_date = HmacSha256(absl::StrCat("AWS4", params.credentials.secret_access_key), date);
  const std::string k_region = HmacSha256(k_date, params.region);
  const std::string k_service = HmacSha256(k_region, params.service);
  return HmacSha256(k_service, "aws4_request");
}

std::string AuthorizationHeader(absl::string_view access_key_id, absl::string_view scope,
                                absl::string_view signed_headers, absl::string_view signature) {
  return absl::StrCat(kAlgorithm, " Credential=", access_key_id, "/", scope, ", SignedHeaders=", signed_headers,
                      ", Signature=", signature);
}

}  // namespace

absl::StatusOr<SignedRequest> SignV4(const SigningRequest& request, const SigningParams& params) {
  RECAL_RETURN_IF_ERROR(CheckSigningInput(request, params));
  RECAL_ASSIGN_OR_RETURN(HeaderValues headers, CanonicalRequestHeaders(request.headers));
  const std::string amz_date = AmzDate(params.time);
  const std::string date = amz_date.substr(0, 8);
  SignedRequest out;
  RECAL_RETURN_IF_ERROR(AddSignerHeaders(request, params.credentials, amz_date, headers, out));
  const std::string signed_headers = CanonicalRequest(request, headers, out);
  const std::string scope = CredentialScope(date, params);
  out.string_to_sign = StringToSign(amz_date, scope, out.canonical_request);
  out.signature = absl::BytesToHexString(HmacSha256(SigningKey(params, date), out.string_to_sign));
  out.authorization = AuthorizationHeader(params.credentials.access_key_id, scope, signed_headers, out.signature);
  out.headers_to_add.emplace_back("Authorization", out.authorization);
  return out;
}

}  // namespace recal::s3
