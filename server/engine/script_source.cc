#include "server/engine/script_source.h"

#include <algorithm>
#include <string>
#include <vector>

#include <caffe2/serialize/inline_container.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/engine/torch_error.h"

namespace recal::engine {
namespace {

struct CodeShape {
  int64_t lines = 0;  // statements: lines outside brackets that are neither blank nor comments
  int64_t depth = 0;  // the deepest nesting of blocks (by indentation, as the lexer reads it) or brackets
};

// One file of code/, read as TorchScript's lexer reads it (strings do not span lines in what
// the printer writes; a crafted one only shifts the count to the safe side).
void Measure(absl::string_view text, CodeShape* shape) {
  std::vector<size_t> indents = {0};
  int64_t brackets = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (brackets == 0) {
      size_t j = i;
      while (j < n && (text[j] == ' ' || text[j] == '\t')) ++j;
      if (j < n && text[j] != '\n' && text[j] != '\r' && text[j] != '#') {
        ++shape->lines;
        const size_t indent = j - i;
        while (indents.back() > indent) indents.pop_back();
        if (indent > indents.back()) indents.push_back(indent);
        shape->depth = std::max<int64_t>(shape->depth, static_cast<int64_t>(indents.size()) - 1);
      }
      i = j;
    }
    char quote = 0;
    for (; i < n && text[i] != '\n'; ++i) {
      const char c = text[i];
      if (quote != 0) {
        if (c == '\\') {
          ++i;
        } else if (c == quote) {
          quote = 0;
        }
      } else if (c == '#') {
        while (i + 1 < n && text[i + 1] != '\n') ++i;
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '(' || c == '[' || c == '{') {
        shape->depth = std::max(shape->depth, ++brackets);
      } else if ((c == ')' || c == ']' || c == '}') && brackets > 0) {
        --brackets;
      }
    }
    ++i;  // the newline
  }
}

absl::Status Refused(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("the model's code ", what));
}

absl::Status TooLarge(absl::string_view what, const GraphPolicy& policy) {
  return Refused(absl::StrCat(what, ": more than ", policy.max_graph_nodes,
                              " nodes (max_graph_nodes, the limit), refused before it is compiled. An "
                              "administrator can raise --max_graph_nodes"));
}

}  // namespace

absl::Status CheckScriptSource(const std::shared_ptr<ReadAdapter>& file, const GraphPolicy& policy) {
  if (policy.trusted) return absl::OkStatus();
  try {
    caffe2::serialize::PyTorchStreamReader reader(file);
    std::vector<std::string> code;
    int64_t bytes = 0;
    for (const std::string& name : reader.getAllRecords()) {
      if (!absl::StartsWith(name, "code/") || !absl::EndsWith(name, ".py")) continue;
      code.push_back(name);
      bytes += static_cast<int64_t>(reader.getRecordSize(name));
    }
    // Before anything is decompressed: code is stored compressed, a bomb would expand here.
    const int64_t max_bytes = policy.max_graph_nodes * kMaxCodeBytesPerNode;
    if (bytes > max_bytes) {
      return TooLarge(absl::StrCat("holds ", bytes, " bytes, more than ", kMaxCodeBytesPerNode, " a node"), policy);
    }
    CodeShape shape;
    for (const std::string& name : code) {
      auto [data, size] = reader.getRecord(name);
      Measure(absl::string_view(static_cast<const char*>(data.get()), size), &shape);
      if (shape.depth > policy.max_graph_depth) {
        return Refused(absl::StrCat("in ", name, " nests blocks or brackets more than ", policy.max_graph_depth,
                                    " deep (max_graph_depth, the limit): TorchScript from Python source "
                                    "nests far less; the archive is crafted"));
      }
    }
    if (shape.lines > policy.max_graph_nodes) {
      return TooLarge(absl::StrCat("holds ", shape.lines, " statements, each at least one node"), policy);
    }
  } catch (const std::exception& e) {
    return TorchErrorStatus("cannot read the TorchScript archive's code", e);
  }
  return absl::OkStatus();
}

}  // namespace recal::engine
