// S3's XML answers (server/s3/s3_xml.cc): ListObjectsV2 pages, CreateMultipartUpload and
// CompleteMultipartUpload results, <Error> bodies. The endpoint is configuration, but its
// answers (over plain HTTP, anyone's on the path) are untrusted bytes.
//
// Contract: every input is either parsed or refused with a message, within the parser's
// bounds; what parses is consistent (sizes non-negative, keys non-empty, a truncated page's
// token as sent), and escaping then parsing a text gives the text back.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_util.h"
#include "server/s3/s3_xml.h"

namespace s3 = recal::s3;
using recal::fuzz::CheckRefusal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);

  auto page = s3::ParseListBucketResult(bytes);
  if (page.ok()) {
    for (const s3::ObjectInfo& o : page->objects) {
      FUZZ_CHECK(!o.key.empty(), "an object without a key");
      FUZZ_CHECK(o.size >= 0, "negative size ", o.size);
      FUZZ_CHECK(o.key.size() <= size, "a key longer than the input");
    }
  } else {
    CheckRefusal(page.status(), "ParseListBucketResult");
  }

  auto id = s3::ParseInitiateMultipartUploadResult(bytes);
  if (id.ok()) {
    FUZZ_CHECK(!id->empty(), "an empty upload id");
  } else {
    CheckRefusal(id.status(), "ParseInitiateMultipartUploadResult");
  }

  auto error = s3::ParseErrorBody(bytes);
  if (!error.ok()) CheckRefusal(error.status(), "ParseErrorBody");

  auto complete = s3::ParseCompleteMultipartUploadResult(bytes);
  if (complete.ok()) {
    FUZZ_CHECK(complete->is_error || !complete->etag.empty(), "a completed upload without an ETag");
    FUZZ_CHECK(complete->is_error == error.ok(), "an <Error> root seen by one parser only");
  } else {
    CheckRefusal(complete.status(), "ParseCompleteMultipartUploadResult");
  }

  // Round trip: any text (as XML character data can hold it) survives XmlEscape + parse.
  bool xml_text = true;
  for (unsigned char c : bytes) xml_text = xml_text && (c >= 0x20 || c == '\t') && c < 0x80;
  if (xml_text && !bytes.empty()) {
    const std::string doc = absl::StrCat("<Error><Code>", s3::XmlEscape(bytes), "</Code></Error>");
    auto round = s3::ParseErrorBody(doc);
    FUZZ_CHECK(round.ok(), "an escaped text does not parse: ", round.status().ToString());
    FUZZ_CHECK(round->code == bytes, "XmlEscape round trip changed the text");
  }
  return 0;
}
