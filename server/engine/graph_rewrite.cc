#include "server/engine/graph_rewrite.h"

#include <functional>
#include <set>

#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>

#include "absl/strings/str_cat.h"
#include "server/engine/dropout_ops.h"
#include "server/engine/observed_batch_norm.h"

namespace recal::engine {
namespace {

using torch::jit::Block;
using torch::jit::Graph;
using torch::jit::Node;

// Visits every node, nested blocks first; safe against the visitor destroying the node.
void ForEachNode(Block* block, const std::function<void(Node*)>& visit) {
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    Node* node = *it++;
    for (Block* inner : node->blocks()) ForEachNode(inner, visit);
    visit(node);
  }
}

torch::jit::Value* ReplaceBatchNorm(Graph& graph, Node* node, int64_t collector) {
  torch::jit::WithInsertPoint guard(node);
  std::vector<torch::jit::NamedValue> args(node->inputs().begin(), node->inputs().end());
  args.emplace_back(c10::IValue(collector));
  torch::jit::Value* observed =
      graph.insert(c10::Symbol::fromQualString(kObservedBatchNormOp), args);
  observed->setType(node->output()->type());
  node->output()->replaceAllUsesWith(observed);
  node->destroy();
  return observed;
}

// The observing quantizer `node` as recal::frozen_fake_quantize: the same inputs, nothing
// written (server/engine/quantizers.h).
void FreezeObserver(Graph& graph, Node* node) {
  torch::jit::WithInsertPoint guard(node);
  std::vector<torch::jit::NamedValue> args(node->inputs().begin(), node->inputs().end());
  torch::jit::Value* frozen = graph.insert(c10::Symbol::fromQualString(kFrozenFakeQuantizeOp), args);
  frozen->setType(node->output()->type());
  node->output()->replaceAllUsesWith(frozen);
  node->destroy();
}

int CountNodes(Block* block) {
  int count = 0;
  ForEachNode(block, [&](Node*) { ++count; });
  return count;
}

// The node of the graph's top block that is or holds `node`.
Node* TopLevelNodeOf(Graph& graph, Node* node) {
  while (node->owningBlock() != graph.block()) node = node->owningBlock()->owningNode();
  return node;
}

// Makes forward return None as soon as the last observed BatchNorm has run; dead-code
// elimination then drops what only the old output needed. It keeps every node with side
// effects (the observed operator is registered CONSERVATIVE, so it counts as one) and every
// write to something that may alias module state, so the statistics of this batch and
// the state the next batch starts from are those of the whole forward.
int EndAtLastBatchNorm(Graph& graph, const std::vector<torch::jit::Value*>& observed) {
  Node* last = nullptr;
  for (torch::jit::Value* value : observed) {
    Node* top = TopLevelNodeOf(graph, value->node());
    if (last == nullptr || top->isAfter(last)) last = top;
  }
  torch::jit::WithInsertPoint guard(last->next());
  torch::jit::Value* none = graph.insertConstant(c10::IValue());
  const int before = CountNodes(graph.block());
  for (size_t i = 0; i < graph.outputs().size(); ++i) graph.return_node()->replaceInput(i, none);
  torch::jit::EliminateDeadCode(graph.block());
  return before - CountNodes(graph.block());
}

}  // namespace

absl::StatusOr<RewriteCounts> InstrumentForward(torch::jit::Module& module, int64_t collector,
                                                v1::ModuleMode mode, bool end_at_last_batch_norm) {
  if (!module.find_method("forward")) {
    return absl::InvalidArgumentError("the model has no forward method");
  }
  std::shared_ptr<Graph> graph = module.get_method("forward").graph();
  torch::jit::Inline(*graph);

  std::vector<Node*> batch_norms;
  std::vector<Node*> observers;
  RewriteCounts counts;
  const bool fix_dropout = mode == v1::EVAL || mode == v1::TRAIN;
  bool frozen_statistics = false;
  ForEachNode(graph->block(), [&](Node* node) {
    const QuantizerKind quantizer = QuantizerKindOf(node->kind().toQualString());
    if (quantizer != QuantizerKind::kNone && quantizer != QuantizerKind::kDequantize) ++counts.quantizers.quantizers;
    if (quantizer == QuantizerKind::kObserving) observers.push_back(node);
    if (node->kind() == c10::Symbol::fromQualString("aten::batch_norm")) {
      // Inputs: input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn.
      if (node->input(3)->node()->kind() == c10::prim::Constant &&
          node->input(3)->type()->kind() == c10::TypeKind::TensorType) {
        frozen_statistics = true;
      }
      batch_norms.push_back(node);
    } else if (fix_dropout && IsDropoutOp(node->kind().toQualString())) {
      torch::jit::WithInsertPoint guard(node);
      node->replaceInput(2, graph->insertConstant(mode == v1::TRAIN));
      ++counts.dropouts;
    }
  });
  if (batch_norms.empty()) {
    return absl::InvalidArgumentError(
        "the model's forward has no BatchNorm (no aten::batch_norm after inlining); a frozen or "
        "optimized-for-inference model has its BatchNorm folded into convolutions: export the "
        "model before torch.jit.freeze");
  }
  if (frozen_statistics) {
    return absl::InvalidArgumentError(
        "the model's BatchNorm statistics are constants, not buffers (a frozen model, "
        "torch.jit.freeze): they cannot be written back; export the model before freezing");
  }
  for (Node* node : observers) FreezeObserver(*graph, node);
  counts.quantizers.observers_frozen = static_cast<int>(observers.size());
  std::vector<torch::jit::Value*> observed;
  for (Node* node : batch_norms) observed.push_back(ReplaceBatchNorm(*graph, node, collector));
  counts.batch_norms = static_cast<int>(batch_norms.size());
  if (end_at_last_batch_norm) counts.nodes_cut = EndAtLastBatchNorm(*graph, observed);
  return counts;
}

std::vector<std::string> RecalOpsIn(const torch::jit::Module& module) {
  std::set<std::string> found;
  std::set<const torch::jit::Function*> seen;
  std::function<void(Block*)> scan = [&](Block* block) {
    ForEachNode(block, [&](Node* node) {
      if (node->kind().is_aten() || node->kind().is_prim()) {
        if (node->kind() == c10::prim::CallFunction) {
          // Free functions reached from methods are compiled into the archive too.
          auto fn_type = node->input(0)->type()->cast<c10::FunctionType>();
          if (fn_type && fn_type->function()->isGraphFunction() &&
              seen.insert(fn_type->function()).second) {
            scan(torch::jit::toGraphFunction(*fn_type->function()).graph()->block());
          }
        }
        return;
      }
      if (node->kind().ns().toUnqualString() == std::string(kRecalOpNamespace)) {
        found.insert(node->kind().toQualString());
      }
    });
  };
  for (const auto& sub : module.modules()) {
    for (const auto& method : sub.get_methods()) scan(method.graph()->block());
  }
  return {found.begin(), found.end()};
}

}  // namespace recal::engine
