#include "server/engine/graph_validation.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_set>

#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace recal::engine {
namespace {

using torch::jit::Block;
using torch::jit::Function;
using torch::jit::Node;

// Derived by tests/fixtures/derive_allowed_ops.py; see the file's header.
constexpr const char* kAllowedOps[] = {
#include "server/engine/allowed_ops.inc"
};

// Where a node comes from: the user's Python source when the archive kept it (debug info),
// else the archive's serialized code.
std::string SourceOf(const Node* node) {
  const torch::jit::SourceRange& range = node->sourceRange();
  c10::optional<torch::jit::SourceRange> original = range.findSourceRangeThatGenerated();
  const torch::jit::SourceRange& where = original ? *original : range;
  auto location = where.file_line_col();
  if (!location) return "unknown source location";
  const auto& [file, line, column] = *location;
  std::string text = where.text().str();
  std::replace(text.begin(), text.end(), '\n', ' ');
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return absl::StrCat(file, ":", line, ":", column + 1, text.empty() ? "" : ": ", text);
}

void ForEachNode(const Block* block, const std::function<void(const Node*)>& visit) {
  for (const Node* node : block->nodes()) {
    visit(node);
    for (const Block* inner : node->blocks()) ForEachNode(inner, visit);
  }
}

// The function a call node reaches when it is known before running: free functions and
// methods of classes (modules included); interface calls are resolved at run time, but every
// implementation is in the compilation unit and checked there.
Function* Callee(const Node* node) {
  if (node->kind() == c10::prim::CallFunction) {
    auto type = node->input(0)->type()->cast<c10::FunctionType>();
    return type ? type->function() : nullptr;
  }
  if (node->kind() == c10::prim::CallMethod) {
    auto type = node->input(0)->type()->cast<c10::ClassType>();
    return type ? type->findMethod(node->s(c10::attr::name)) : nullptr;
  }
  return nullptr;
}

class Validator {
 public:
  explicit Validator(const GraphPolicy& policy) : policy_(policy) {
    allowed_.insert(std::begin(kAllowedOps), std::end(kAllowedOps));
    // Calls stay in the graphs (archives are loaded without inlining); what they call is a
    // function of the archive, checked on its own.
    allowed_.insert({"prim::CallFunction", "prim::CallMethod"});
    allowed_.insert(policy.extra_allowed_ops.begin(), policy.extra_allowed_ops.end());
  }

  absl::Status Check(Function* function) {
    if (!checked_.insert(function).second) return absl::OkStatus();
    if (!function->isGraphFunction()) {
      return absl::InvalidArgumentError(
          absl::StrCat("function ", function->qualname().qualifiedName(),
                       " is not TorchScript"));
    }
    absl::Status status;
    std::vector<Function*> callees;
    ForEachNode(torch::jit::toGraphFunction(*function).graph()->block(), [&](const Node* node) {
      if (!status.ok()) return;
      if (++nodes_ > policy_.max_graph_nodes) {
        status = TooLarge("the model's graphs hold");
        return;
      }
      if (Function* callee = Callee(node)) callees.push_back(callee);
      const std::string kind = node->kind().toQualString();
      if (allowed_.count(kind) == 0) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "operator ", kind, " is not allowed (in ",
            function->qualname().qualifiedName(), ", ", SourceOf(node),
            "); a model may only compute on tensors. An administrator can allow more operators "
            "with --extra_allowed_ops"));
      }
    });
    for (Function* callee : callees) {
      if (!status.ok()) break;
      status = Check(callee);
    }
    return status;
  }

  // Nodes of `function` with every known call inlined, as InstrumentForward will build it;
  // counted without inlining, so that a graph that would explode is refused first.
  absl::StatusOr<int64_t> InlinedSize(Function* function) {
    auto known = inlined_size_.find(function);
    if (known != inlined_size_.end()) return known->second;
    if (!function->isGraphFunction()) return 0;
    inlined_size_[function] = policy_.max_graph_nodes + 1;  // TorchScript has no recursion
    int64_t size = 0;
    std::vector<Function*> callees;
    ForEachNode(torch::jit::toGraphFunction(*function).graph()->block(), [&](const Node* node) {
      ++size;
      if (Function* callee = Callee(node)) callees.push_back(callee);
    });
    for (Function* callee : callees) {
      auto inner = InlinedSize(callee);
      if (!inner.ok()) return inner.status();
      size += *inner;
      if (size > policy_.max_graph_nodes) return TooLarge("the model's forward, inlined, holds");
    }
    inlined_size_[function] = size;
    return size;
  }

 private:
  absl::Status TooLarge(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " more than ",
                                                   policy_.max_graph_nodes, " nodes (the limit)"));
  }

  const GraphPolicy& policy_;
  std::unordered_set<std::string> allowed_;
  std::set<Function*> checked_;
  int64_t nodes_ = 0;
  std::map<Function*, int64_t> inlined_size_;
};

}  // namespace

absl::Status ValidateGraphs(const torch::jit::Module& module, const GraphPolicy& policy) {
  if (policy.trusted) return absl::OkStatus();
  Validator validator(policy);
  std::vector<Function*> roots;
  // Every function the archive compiled (methods of every class, free functions, hooks)...
  for (Function* function : module._ivalue()->compilation_unit()->get_functions()) {
    roots.push_back(function);
  }
  // ... and, should some live elsewhere, every method and hook of every module.
  for (const torch::jit::Module& sub : module.modules()) {
    const c10::ClassTypePtr type = sub.type();
    for (Function* method : type->methods()) roots.push_back(method);
    for (Function* hook : type->getForwardHooks()) roots.push_back(hook);
    for (Function* hook : type->getForwardPreHooks()) roots.push_back(hook);
  }
  for (Function* function : roots) {
    if (absl::Status checked = validator.Check(function); !checked.ok()) return checked;
  }
  if (Function* forward = module.type()->findMethod("forward")) {
    auto size = validator.InlinedSize(forward);
    if (!size.ok()) return size.status();
  }
  return absl::OkStatus();
}

std::vector<std::string> AllowedOperators() {
  std::vector<std::string> ops(std::begin(kAllowedOps), std::end(kAllowedOps));
  std::sort(ops.begin(), ops.end());
  return ops;
}

}  // namespace recal::engine
