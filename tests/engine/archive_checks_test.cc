// The archives an attacker crafts (tests/fixtures/crafted_archives.py) against the loaders:
// a parameter whose storage record is cut short is refused, naming the tensor and the
// numbers, before LibTorch makes it (unchecked, the job returned the worker's heap bytes in
// bn.weight, or the worker crashed); a graph too large or too deep is refused from its text,
// before anything compiles it, in well under a second.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/engine/exported/pt2_archive.h"
#include "server/engine/observed_model.h"
#include "server/engine/script_source.h"
#include "server/engine/script_tensors.h"
#include "server/engine/tensor_view.h"

namespace recal::engine {
namespace {

using ::testing::HasSubstr;

const std::string kCrafted = std::string(RECAL_CRAFTED_DIR) + "/";

absl::Status Load(const std::string& name) {
  LoadOptions options;
  options.preload_output_copy = false;
  return LoadObservedModel(kCrafted + name, options).status();
}

class TruncatedStorage : public ::testing::TestWithParam<const char*> {};

TEST_P(TruncatedStorage, IsRefusedNamingTheTensorBeforeItIsMade) {
  const absl::Status status = Load(GetParam());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("'bn.weight'"));
  EXPECT_THAT(status.message(), HasSubstr("holds 16 bytes"));
}

INSTANTIATE_TEST_SUITE_P(FloatsPast, TruncatedStorage,
                         ::testing::Values("truncated_weight_8.pt", "truncated_weight_64.pt", "truncated_weight_1000.pt",
                                           "truncated_weight_200000.pt", "truncated_weight_8.pt2",
                                           "truncated_weight_200000.pt2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

TEST(TruncatedStorage, TorchScriptRefusalGivesTheRecordAndTheNumbers) {
  const absl::Status status = Load("truncated_weight_1000.pt");
  EXPECT_THAT(status.message(), HasSubstr("TorchScript archive: tensor 'bn.weight' claims a storage of 4016 bytes "
                                          "in record data/0, which holds 16 bytes"));
}

TEST(TruncatedStorage, AViewPastAStorageThatFitsItsRecordIsRefusedWithItsNumbers) {
  // window views floats 4..7 of a storage data.pkl says holds 4 floats, in a 16-byte record.
  // LibTorch 2.14's unpickler checks such a view itself as the scan unpickles, before the
  // scan can name it (the scan checks it too, for the versions that do not).
  const absl::Status status = Load("view_past_storage.pt");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("TorchScript archive: cannot read its tensors"));
  EXPECT_THAT(status.message(), HasSubstr("storage offset 4"));
  EXPECT_THAT(status.message(), HasSubstr("16 bytes"));
}

TEST(TruncatedStorage, CodeConstantsAreCheckedAndNamedAsTheCodeReadsThem) {
  const absl::Status status = Load("truncated_constant.pt");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("tensor 'CONSTANTS.c0' claims a storage of 48 bytes in record constants/0, "
                                          "which holds 16 bytes"));
}

TEST(TensorView, ViewPastItsStorageIsRefusedWithItsNumbers) {
  TensorView view{c10::kFloat, {4}, {1}, 2};
  EXPECT_TRUE(CheckViewFits("w", view, 24, "data/0").ok());
  const absl::Status past = CheckViewFits("w", view, 20, "data/0");
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.message(), HasSubstr("tensor 'w' (Float, sizes [4], strides [1], storage offset 2) reaches 6 "
                                        "elements (6 x 4 bytes) into its storage data/0, which holds 20 bytes"));
  // Strides reach further than sizes alone, and overflowing or negative views are no views.
  EXPECT_FALSE(CheckViewFits("w", TensorView{c10::kFloat, {2, 2}, {8, 1}, 0}, 16, "data/0").ok());
  EXPECT_FALSE(CheckViewFits("w", TensorView{c10::kFloat, {2}, {INT64_MAX / 2}, 0}, 1 << 20, "data/0").ok());
  EXPECT_FALSE(CheckViewFits("w", TensorView{c10::kFloat, {2}, {1}, -1}, 1 << 20, "data/0").ok());
  EXPECT_TRUE(CheckViewFits("w", TensorView{c10::kFloat, {0, 5}, {5, 1}, 0}, 0, "(none)").ok());
}

TEST(ArchiveChecks, PassEveryFixtureModel) {
  // Scripted and traced, train and eval, with code constants, shared storages, torch 1.13's
  // format, and exported programs: what the checks refuse is only what is crafted.
  int checked = 0;
  for (const char* dir : {RECAL_FIXTURES_DIR "/models", RECAL_SOURCE_DIR "/tests/fixtures/torch113"}) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const std::string extension = entry.path().extension().string();
      if (extension != ".pt" && extension != ".pt2") continue;
      auto file = OpenModelFile(entry.path().string());
      ASSERT_TRUE(file.ok()) << file.status();
      ++checked;
      if (extension == ".pt2") {
        EXPECT_TRUE(exported::Pt2Archive::Read(*file, {}).ok()) << entry.path();
        continue;
      }
      EXPECT_TRUE(CheckScriptSource(*file, GraphPolicy{}).ok()) << entry.path() << CheckScriptSource(*file, {});
      EXPECT_TRUE(CheckScriptTensors(*file).ok()) << entry.path() << CheckScriptTensors(*file);
    }
  }
  EXPECT_GT(checked, 40);
}

// Refused with INVALID_ARGUMENT naming `limit`, timed: the bound is generous against a loaded
// machine, the real time is printed.
void ExpectRefusedQuickly(const std::string& name, const std::string& limit) {
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status = Load(name);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s refused in %.3f s: %s\n", name.c_str(), seconds, std::string(status.message()).c_str());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(limit));
  EXPECT_LT(seconds, 5.0);
}

TEST(GraphSize, HalfAMillionStatementsAreRefusedBeforeCompiling) {
  ExpectRefusedQuickly("wide_graph.pt", "more than 500000 nodes (max_graph_nodes");
}

TEST(GraphSize, ThousandsOfNestedBlocksAreRefusedBeforeCompiling) {
  ExpectRefusedQuickly("nested_ifs.pt", "more than 200 deep (max_graph_depth");
}

}  // namespace
}  // namespace recal::engine
