#include "tests/engine/test_util.h"

#include <gtest/gtest.h>

#include "common/formats/safetensors.h"
#include "common/mapped_file.h"
#include "server/data/torch_dtype.h"

namespace recal::engine::testing {

std::string SaveModule(const torch::jit::Module& module, const std::string& path) {
  module.save(path);
  return path;
}

torch::jit::Module MakeBatchNorm(int64_t channels) {
  torch::jit::Module bn("BatchNormLike");
  bn.register_attribute("training", c10::BoolType::get(), true);
  bn.register_parameter("weight", torch::linspace(0.5, 1.5, channels), false);
  bn.register_parameter("bias", torch::linspace(-1, 1, channels), false);
  bn.register_buffer("running_mean", torch::full({channels}, 0.5));
  bn.register_buffer("running_var", torch::full({channels}, 2.0));
  bn.define(R"(
def forward(self, x):
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                            self.training, 0.1, 1e-5, False)
)");
  return bn;
}

std::map<std::string, at::Tensor> ReadSafetensors(const std::string& path) {
  std::map<std::string, at::Tensor> tensors;
  auto file = data::MappedFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return tensors;
  auto header = formats::ParseSafetensors((*file)->bytes());
  EXPECT_TRUE(header.ok()) << header.status();
  if (!header.ok()) return tensors;
  for (const auto& info : header->tensors) {
    const char* begin = (*file)->bytes().data() + header->data_offset + info.begin;
    tensors[info.name] = torch::from_blob(const_cast<char*>(begin), info.shape,
                                          torch::dtype(data::ToScalarType(info.dtype)))
                             .clone();
  }
  return tensors;
}

double WorstRelativeError(const std::map<std::string, at::Tensor>& got,
                          const std::map<std::string, at::Tensor>& reference) {
  double worst = 0;
  for (const auto& [key, expected] : reference) {
    auto found = got.find(key);
    if (found == got.end()) return std::numeric_limits<double>::infinity();
    at::Tensor scale = expected.to(at::kDouble).abs();
    const bool is_mean = key.size() >= 4 && key.compare(key.size() - 4, 4, "mean") == 0;
    if (is_mean) {
      auto var = reference.find(key.substr(0, key.size() - 4) + "var");
      if (var != reference.end()) scale = at::maximum(scale, var->second.to(at::kDouble).sqrt());
    }
    const at::Tensor error = (found->second.to(at::kDouble) - expected.to(at::kDouble)).abs() / (scale + 1e-12);
    worst = std::max(worst, error.max().item<double>());
  }
  return worst;
}

std::function<absl::StatusOr<std::optional<std::vector<at::Tensor>>>()> FeedFrom(
    std::vector<at::Tensor> batches) {
  auto next = std::make_shared<size_t>(0);
  return [batches = std::move(batches), next]()
             -> absl::StatusOr<std::optional<std::vector<at::Tensor>>> {
    if (*next == batches.size()) return std::nullopt;
    return std::vector<at::Tensor>{batches[(*next)++]};
  };
}

v1::Tensor ToProto(const at::Tensor& t) {
  v1::Tensor proto;
  proto.set_dtype(t.scalar_type() == at::kByte ? v1::Tensor::UINT8
                  : t.scalar_type() == at::kHalf ? v1::Tensor::FLOAT16 : v1::Tensor::FLOAT32);
  for (int64_t d : t.sizes()) proto.add_shape(d);
  const at::Tensor c = t.contiguous();
  proto.set_data(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  return proto;
}

}  // namespace recal::engine::testing
