#include "server/s3/s3_xml.h"

#include <expat.h>

#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recal::s3 {
namespace {

constexpr int kMaxDepth = 32;
constexpr size_t kMaxElements = 200000;

// The document as a small tree: S3's answers are a few levels deep and at most a few MB,
// and walking a tree keeps each parser below a few lines of plain code.
struct Node {
  std::string name;  // local name: a "prefix:" is dropped
  std::string text;  // character data directly inside this element
  std::vector<size_t> children;
};

struct Builder {
  std::vector<Node> nodes;
  std::vector<size_t> stack;
  std::string error;  // set when a handler stopped the parser
  XML_Parser parser = nullptr;

  void Fail(std::string why) {
    if (error.empty()) error = std::move(why);
    XML_StopParser(parser, XML_FALSE);
  }
};

void XMLCALL OnStart(void* data, const XML_Char* name, const XML_Char**) {
  auto* b = static_cast<Builder*>(data);
  if (!b->error.empty()) return;
  if (b->stack.size() >= kMaxDepth) return b->Fail("nested too deeply");
  if (b->nodes.size() >= kMaxElements) return b->Fail("too many elements");
  absl::string_view local(name);
  if (auto colon = local.rfind(':'); colon != absl::string_view::npos) local.remove_prefix(colon + 1);
  b->nodes.push_back(Node{std::string(local), {}, {}});
  const size_t index = b->nodes.size() - 1;
  if (!b->stack.empty()) b->nodes[b->stack.back()].children.push_back(index);
  b->stack.push_back(index);
}

void XMLCALL OnEnd(void* data, const XML_Char*) {
  auto* b = static_cast<Builder*>(data);
  if (!b->stack.empty()) b->stack.pop_back();
}

void XMLCALL OnText(void* data, const XML_Char* s, int len) {
  auto* b = static_cast<Builder*>(data);
  if (!b->stack.empty() && b->error.empty()) b->nodes[b->stack.back()].text.append(s, static_cast<size_t>(len));
}

// S3 never sends a DOCTYPE; refusing it rules out every entity-expansion attack (billion
// laughs, external entities) whatever expat's own limits are.
void XMLCALL OnDoctype(void* data, const XML_Char*, const XML_Char*, const XML_Char*, int) {
  static_cast<Builder*>(data)->Fail("a DOCTYPE is not allowed");
}

void XMLCALL OnEntityDecl(void* data, const XML_Char*, int, const XML_Char*, int, const XML_Char*, const XML_Char*,
                          const XML_Char*, const XML_Char*) {
  static_cast<Builder*>(data)->Fail("an entity declaration is not allowed");
}

struct ParserDeleter {
  void operator()(XML_ParserStruct* p) const { XML_ParserFree(p); }
};

absl::StatusOr<std::vector<Node>> ParseTree(absl::string_view xml, absl::string_view what) {
  if (xml.size() > kMaxXmlBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a ", xml.size(), "-byte XML body (more than ", kMaxXmlBytes, ")"));
  }
  std::unique_ptr<XML_ParserStruct, ParserDeleter> parser(XML_ParserCreate(nullptr));
  if (parser == nullptr) return absl::ResourceExhaustedError(absl::StrCat(what, ": XML_ParserCreate failed"));
  Builder b;
  b.parser = parser.get();
  XML_SetUserData(parser.get(), &b);
  XML_SetElementHandler(parser.get(), OnStart, OnEnd);
  XML_SetCharacterDataHandler(parser.get(), OnText);
  XML_SetStartDoctypeDeclHandler(parser.get(), OnDoctype);
  XML_SetEntityDeclHandler(parser.get(), OnEntityDecl);
  XML_SetParamEntityParsing(parser.get(), XML_PARAM_ENTITY_PARSING_NEVER);
  const XML_Status st = XML_Parse(parser.get(), xml.data(), static_cast<int>(xml.size()), XML_TRUE);
  if (!b.error.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", b.error));
  if (st != XML_STATUS_OK) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": malformed XML at line ",
                                                   XML_GetCurrentLineNumber(parser.get()), ": ",
                                                   XML_ErrorString(XML_GetErrorCode(parser.get()))));
  }
  if (b.nodes.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no XML element"));
  return std::move(b.nodes);
}

class Tree {
 public:
  explicit Tree(std::vector<Node> nodes) : nodes_(std::move(nodes)) {}
  const Node& root() const { return nodes_[0]; }
  const Node* Child(const Node& n, absl::string_view name) const {
    for (size_t c : n.children) {
      if (nodes_[c].name == name) return &nodes_[c];
    }
    return nullptr;
  }
  std::vector<const Node*> Children(const Node& n, absl::string_view name) const {
    std::vector<const Node*> out;
    for (size_t c : n.children) {
      if (nodes_[c].name == name) out.push_back(&nodes_[c]);
    }
    return out;
  }
  // The child's text as sent (S3 keys may begin or end with spaces), "" when absent.
  std::string Text(const Node& n, absl::string_view name) const {
    const Node* c = Child(n, name);
    return c == nullptr ? std::string() : c->text;
  }

 private:
  std::vector<Node> nodes_;
};

absl::StatusOr<Tree> ParseRoot(absl::string_view xml, absl::string_view root, absl::string_view what) {
  auto nodes = ParseTree(xml, what);
  if (!nodes.ok()) return nodes.status();
  Tree tree(*std::move(nodes));
  if (tree.root().name != root) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root element <", tree.root().name, ">, expected <", root, ">"));
  }
  return tree;
}

ErrorBody ErrorFrom(const Tree& t, const Node& n) {
  return ErrorBody{t.Text(n, "Code"), t.Text(n, "Message"), t.Text(n, "BucketName"), t.Text(n, "Key"),
                   t.Text(n, "RequestId")};
}

}  // namespace

std::string StripEtagQuotes(absl::string_view etag) {
  etag = absl::StripAsciiWhitespace(etag);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

absl::StatusOr<ListPage> ParseListBucketResult(absl::string_view xml) {
  constexpr absl::string_view kWhat = "ListObjectsV2 response";
  auto tree = ParseRoot(xml, "ListBucketResult", kWhat);
  if (!tree.ok()) return tree.status();
  const Node& root = tree->root();
  ListPage page;
  for (const Node* c : tree->Children(root, "Contents")) {
    const Node* key = tree->Child(*c, "Key");
    const Node* size = tree->Child(*c, "Size");
    if (key == nullptr || key->text.empty() || size == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(kWhat, ": <Contents> without <Key> or <Size>"));
    }
    ObjectInfo info{key->text, 0, StripEtagQuotes(tree->Text(*c, "ETag"))};
    if (!absl::SimpleAtoi(size->text, &info.size) || info.size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kWhat, ": bad <Size> '", absl::CHexEscape(size->text), "' of key ", info.key));
    }
    page.objects.push_back(std::move(info));
  }
  for (const Node* c : tree->Children(root, "CommonPrefixes")) page.common_prefixes.push_back(tree->Text(*c, "Prefix"));
  const std::string truncated(absl::StripAsciiWhitespace(tree->Text(root, "IsTruncated")));
  if (truncated == "true") {
    page.is_truncated = true;
  } else if (!truncated.empty() && truncated != "false") {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": bad <IsTruncated> '", absl::CHexEscape(truncated), "'"));
  }
  page.next_continuation_token = tree->Text(root, "NextContinuationToken");
  return page;
}

absl::StatusOr<std::string> ParseInitiateMultipartUploadResult(absl::string_view xml) {
  constexpr absl::string_view kWhat = "CreateMultipartUpload response";
  auto tree = ParseRoot(xml, "InitiateMultipartUploadResult", kWhat);
  if (!tree.ok()) return tree.status();
  std::string id(absl::StripAsciiWhitespace(tree->Text(tree->root(), "UploadId")));
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(kWhat, ": no <UploadId>"));
  return id;
}

absl::StatusOr<ErrorBody> ParseErrorBody(absl::string_view xml) {
  auto tree = ParseRoot(xml, "Error", "S3 error response");
  if (!tree.ok()) return tree.status();
  return ErrorFrom(*tree, tree->root());
}

absl::StatusOr<CompleteResult> ParseCompleteMultipartUploadResult(absl::string_view xml) {
  constexpr absl::string_view kWhat = "CompleteMultipartUpload response";
  auto nodes = ParseTree(xml, kWhat);
  if (!nodes.ok()) return nodes.status();
  Tree tree(*std::move(nodes));
  CompleteResult out;
  if (tree.root().name == "Error") {
    out.is_error = true;
    out.error = ErrorFrom(tree, tree.root());
    return out;
  }
  // "...Response": moto's name for the same document.
  if (tree.root().name != "CompleteMultipartUploadResult" && tree.root().name != "CompleteMultipartUploadResponse") {
    return absl::InvalidArgumentError(absl::StrCat(kWhat, ": root element <", tree.root().name, ">"));
  }
  out.etag = StripEtagQuotes(tree.Text(tree.root(), "ETag"));
  out.location = tree.Text(tree.root(), "Location");
  if (out.etag.empty()) return absl::InvalidArgumentError(absl::StrCat(kWhat, ": no <ETag>"));
  return out;
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace recal::s3
