// A batch the client splits into parts (PushBatchesRequest.batch_continues) comes out of the
// assembler as the very batch it split, byte for byte; every malformed sequence of parts is refused
// naming the rule, and a client cannot make it hold more than the batch limit.
#include "server/jobs/batch_assembler.h"

#include "recal/batch_parts.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recal::jobs {
namespace {

using ::recal::BatchMessages;

using ::testing::HasSubstr;

v1::Tensor Float32(std::vector<int64_t> shape, char fill) {
  v1::Tensor tensor;
  tensor.set_dtype(v1::Tensor::FLOAT32);
  int64_t numel = 1;
  for (int64_t d : shape) {
    tensor.add_shape(d);
    numel *= d;
  }
  std::string data(static_cast<size_t>(numel * 4), fill);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(fill + i % 7);
  tensor.set_data(data);
  return tensor;
}

// The parts the C++ client sends for `whole` (its splitter, recal/batch_parts.h): dtype and
// shape in the first, then at most `bytes` of data per message, input after input.
std::vector<v1::PushBatchesRequest> Split(const v1::PushBatchesRequest& whole, size_t bytes) {
  std::vector<v1::Tensor> inputs(whole.inputs().begin(), whole.inputs().end());
  std::vector<v1::PushBatchesRequest> parts = BatchMessages(inputs, static_cast<int64_t>(bytes));
  parts.back().set_last(whole.last());
  return parts;
}

TEST(BatchAssemblerTest, AWholeMessagePassesThroughAsItIs) {
  BatchAssembler assembler(1 << 20);
  v1::PushBatchesRequest message;
  *message.add_inputs() = Float32({2, 3}, 'a');
  auto out = assembler.Add(message);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, &message);
  EXPECT_TRUE(assembler.Finish().ok());
}

TEST(BatchAssemblerTest, PartsOfTwoInputsJoinIntoTheBatchTheClientSplit) {
  for (size_t part_bytes : {1, 7, 64, 100, 271}) {
    BatchAssembler assembler(1 << 20);
    v1::PushBatchesRequest whole;
    *whole.add_inputs() = Float32({4, 3, 5}, 'a');
    *whole.add_inputs() = Float32({4, 2}, 'k');
    whole.set_last(true);
    std::vector<v1::PushBatchesRequest> parts = Split(whole, part_bytes);
    ASSERT_GT(parts.size(), 1u);
    for (size_t p = 0; p + 1 < parts.size(); ++p) {
      auto out = assembler.Add(parts[p]);
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(*out, nullptr) << "part " << p << " completed the batch early";
    }
    auto out = assembler.Add(parts.back());
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_NE(*out, nullptr);
    EXPECT_FALSE((*out)->batch_continues());
    EXPECT_TRUE((*out)->last());
    ASSERT_EQ((*out)->inputs_size(), 2);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ((*out)->inputs(i).SerializeAsString(), whole.inputs(i).SerializeAsString()) << part_bytes;
    }
    EXPECT_TRUE(assembler.Finish().ok());
    // The next batch starts afresh.
    v1::PushBatchesRequest next;
    *next.add_inputs() = Float32({1}, 'z');
    auto passed = assembler.Add(next);
    ASSERT_TRUE(passed.ok());
    EXPECT_EQ(*passed, &next);
  }
}

absl::Status FeedAll(BatchAssembler& assembler, std::vector<v1::PushBatchesRequest>& parts) {
  for (v1::PushBatchesRequest& part : parts) {
    auto out = assembler.Add(part);
    if (!out.ok()) return out.status();
  }
  return assembler.Finish();
}

TEST(BatchAssemblerTest, MalformedPartsAreRefusedNamingTheRule) {
  v1::PushBatchesRequest whole;
  *whole.add_inputs() = Float32({4, 8}, 'a');
  const std::vector<v1::PushBatchesRequest> good = Split(whole, 40);
  ASSERT_EQ(good.size(), 4u);  // 128 bytes: the head with 40, then 40, 40, 8
  struct Case {
    const char* what;
    std::function<void(std::vector<v1::PushBatchesRequest>&)> edit;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a later part sets a shape", [](auto& p) { p[1].mutable_inputs(0)->add_shape(4); }, "only the first part"},
      {"a later part sets a dtype", [](auto& p) { p[2].mutable_inputs(0)->set_dtype(v1::Tensor::UINT8); },
       "only the first part"},
      {"a part drops an input", [](auto& p) { p[1].clear_inputs(); }, "carries 0 inputs; the batch has 1"},
      {"too many bytes", [](auto& p) { p[3].mutable_inputs(0)->mutable_data()->append("x"); }, "carry more than"},
      {"too few bytes", [](auto& p) { p[3].mutable_inputs(0)->clear_data(); }, "its dtype and shape need 128"},
      {"last inside the batch", [](auto& p) { p[1].set_last(true); }, "only the part that completes a batch"},
      {"last on the first part", [](auto& p) { p[0].set_last(true); }, "only the part that completes a batch"},
      {"the stream ends inside", [](auto& p) { p.pop_back(); }, "the stream ended inside a batch"},
      {"a first part without inputs", [](auto& p) { p[0].clear_inputs(); }, "carries its inputs' dtype and shape"},
      {"a first part with a bad dtype",
       [](auto& p) { p[0].mutable_inputs(0)->set_dtype(v1::Tensor::DTYPE_UNSPECIFIED); }, "tensor dtype must be"},
  };
  for (const Case& c : cases) {
    std::vector<v1::PushBatchesRequest> parts = good;
    c.edit(parts);
    BatchAssembler assembler(1 << 20);
    const absl::Status status = FeedAll(assembler, parts);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << c.what << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message)) << c.what;
  }
  std::vector<v1::PushBatchesRequest> parts = good;
  BatchAssembler assembler(1 << 20);
  EXPECT_TRUE(FeedAll(assembler, parts).ok());
}

TEST(BatchAssemblerTest, ABatchDeclaringMoreThanTheLimitIsRefusedAtItsFirstPart) {
  // Two inputs of 600 bytes each fit the limit alone but not together: the assembler never
  // holds more than the limit for one stream.
  BatchAssembler assembler(1000);
  v1::PushBatchesRequest first;
  for (int i = 0; i < 2; ++i) {
    v1::Tensor* input = first.add_inputs();
    input->set_dtype(v1::Tensor::UINT8);
    input->add_shape(600);
  }
  first.set_batch_continues(true);
  auto out = assembler.Add(first);
  EXPECT_TRUE(absl::IsResourceExhausted(out.status())) << out.status();
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("--max_batch_bytes"));
  // A shape whose product overflows int64 is refused, not wrapped.
  v1::PushBatchesRequest huge;
  v1::Tensor* input = huge.add_inputs();
  input->set_dtype(v1::Tensor::FLOAT32);
  for (int i = 0; i < 4; ++i) input->add_shape(int64_t{1} << 40);
  huge.set_batch_continues(true);
  BatchAssembler fresh(1000);
  EXPECT_TRUE(absl::IsResourceExhausted(fresh.Add(huge).status()));
}

}  // namespace
}  // namespace recal::jobs
