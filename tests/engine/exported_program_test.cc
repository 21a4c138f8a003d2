// torch.export programs (PT2 archives) beyond what the manifest-wide reference tests prove:
// hostile or damaged archives are refused before anything runs, naming what was refused;
// the format is told from the bytes; the forward skips what feeds no BatchNorm; the result
// is the same archive with the new statistics. The hostile archives are made here by editing
// a fixture's program or records, as an attacker would.
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <caffe2/serialize/inline_container.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/script.h>

#include "server/engine/exported/program_plan.h"
#include "server/engine/exported/pt2_archive.h"
#include "server/engine/recalibration.h"
#include "tests/engine/program_edits.h"
#include "tests/engine/test_util.h"

namespace recal::engine {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using nlohmann::json;
using testing::CreateStatus;
using testing::ExpectRefused;
using testing::TempPath;

// A small fixture program: a convolution, a BatchNorm called twice, a head.
const std::string kBase = std::string(RECAL_FIXTURES_DIR) + "/models/twice.exported_eval.pt2";

// `edit_program` on the program's JSON of kBase, and the rest as testing::Edited.
std::string Edited(const std::string& name, const std::function<void(json&)>& edit_program,
                   const std::function<std::optional<std::string>(const std::string&, std::string)>& edit_record = nullptr,
                   const std::map<std::string, std::string>& extra = {}, bool compress_extra = false,
                   const std::string& base = kBase) {
  return testing::Edited(name, base, edit_program, edit_record, extra, compress_extra);
}

json& NodeWith(json& program, const std::string& part) { return testing::NodeWith(testing::Nodes(program), part); }

TEST(ExportedProgramTest, TheFixtureLoads) { EXPECT_TRUE(CreateStatus(kBase).ok()) << CreateStatus(kBase); }

TEST(ExportedProgramTest, RefusesAnOperatorOutsideTheAllowlist) {
  const std::string path = Edited("from_file", [](json& p) {
    NodeWith(p, "conv")["target"] = "torch.ops.aten.from_file.default";
  });
  ExpectRefused(path, "operator aten::from_file is not allowed");
}

TEST(ExportedProgramTest, RefusesOperatorsOfOtherNamespacesRecalsOwnIncluded) {
  for (const char* target : {"torch.ops.recal.observed_batch_norm.default", "torch.ops.torchvision.nms.default",
                             "torch.ops.profiler._record_function_enter.default"}) {
    const std::string path = Edited("namespace", [&](json& p) { NodeWith(p, "conv")["target"] = target; });
    ExpectRefused(path, "is not allowed");
  }
}

TEST(ExportedProgramTest, RefusesHigherOrderOperatorsItDoesNotRunOrThatAreMalformed) {
  const std::string loop = Edited("while_loop", [](json& p) {
    NodeWith(p, "conv")["target"] = "torch.ops.higher_order.while_loop";
  });
  ExpectRefused(loop, "a higher-order operator Recal does not run");
  // torch.cond with a convolution's arguments (lists of ints, no graphs): refused naming it.
  const std::string cond = Edited("cond", [](json& p) { NodeWith(p, "conv")["target"] = "torch.ops.higher_order.cond"; });
  ExpectRefused(cond, "(torch.ops.higher_order.cond): ");
}

TEST(ExportedProgramTest, RefusesPythonFunctionsThatAreNotShapeArithmetic) {
  for (const char* target : {"builtins.eval", "os.system", "builtins.open", "_operator.getitem"}) {
    const std::string path = Edited("python", [&](json& p) { NodeWith(p, "conv")["target"] = target; });
    ExpectRefused(path, "Recal does not run this function");
  }
}

TEST(ExportedProgramTest, RefusesArgumentsThatAreGraphsOrObjects) {
  const std::string path = Edited("graph_arg", [](json& p) {
    json& node = NodeWith(p, "conv");
    node["inputs"][0]["arg"] = json{{"as_custom_obj", {{"name", "obj"}, {"class_fqn", "__torch__.Evil"}}}};
  });
  ExpectRefused(path, "argument 'input' is as_custom_obj");
}

TEST(ExportedProgramTest, RefusesAJsonBomb) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string path = Edited("deep", nullptr, [&](const std::string& record, std::string bytes) {
    return record.rfind("models/", 0) == 0 ? deep : bytes;
  });
  ExpectRefused(path, "nests deeper than");
}

TEST(ExportedProgramTest, RefusesMalformedJson) {
  const std::string path = Edited("truncated", nullptr, [](const std::string& record, std::string bytes) {
    return record.rfind("models/", 0) == 0 ? bytes.substr(0, bytes.size() / 2) : bytes;
  });
  ExpectRefused(path, "is not valid JSON");
}

TEST(ExportedProgramTest, RefusesAGraphPastTheNodeLimit) {
  Options options;
  options.preload_output_copy = false;
  options.graph_policy.max_graph_nodes = 3;
  const absl::Status status = Recalibration::Create(kBase, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("more than the 3 allowed"));
}

// Edits the weights config: `edit(config)` on {"config": {fqn: PayloadMeta}}.
std::string EditedWeights(const std::string& name, const std::function<void(json&)>& edit,
                          const std::string& base = kBase) {
  return Edited(
      name, nullptr,
      [&](const std::string& record, std::string bytes) -> std::optional<std::string> {
        if (record.find("_weights_config.json") == std::string::npos) return bytes;
        json config = json::parse(bytes);
        edit(config["config"]);
        return config.dump();
      },
      {}, false, base);
}

TEST(ExportedProgramTest, RefusesAShapeTheStoredBytesCannotHold) {
  const std::string path = EditedWeights("absurd", [](json& config) {
    json& meta = config.begin().value()["tensor_meta"];
    meta["sizes"] = json::array({json{{"as_int", 1000000}}, json{{"as_int", 1000000}}});
    meta["strides"] = json::array({json{{"as_int", 1000000}}, json{{"as_int", 1}}});
  });
  ExpectRefused(path, "which holds");
}

TEST(ExportedProgramTest, RefusesNegativeOrOverflowingViews) {
  for (int64_t size : {int64_t{-5}, int64_t{1} << 62}) {
    const std::string path = EditedWeights("negative", [&](json& config) {
      json& meta = config.begin().value()["tensor_meta"];
      meta["sizes"] = json::array({json{{"as_int", size}}, json{{"as_int", size}}});
      meta["strides"] = json::array({json{{"as_int", size}}, json{{"as_int", 1}}});
    });
    ExpectRefused(path, "has an impossible shape");
  }
}

TEST(ExportedProgramTest, RefusesMissingWeights) {
  std::string dropped;
  const std::string path = EditedWeights("missing", [&](json& config) {
    for (auto it = config.begin(); it != config.end(); ++it) {
      if (it.key().find("running_var") != std::string::npos) {
        dropped = it.key();
        config.erase(it);
        break;
      }
    }
  });
  ExpectRefused(path, "which the archive does not hold");
  EXPECT_THAT(CreateStatus(path).message(), HasSubstr(dropped));
}

TEST(ExportedProgramTest, RefusesPickledPayloadsWithoutUnpickling) {
  const std::string path = EditedWeights("pickled", [](json& config) { config.begin().value()["use_pickle"] = true; });
  ExpectRefused(path, "never unpickles an upload");
}

TEST(ExportedProgramTest, RefusesWeightsOfAnotherShapeThanTheGraphWasExportedWith) {
  const std::string path = EditedWeights("swapped", [](json& config) {
    for (auto& [fqn, meta] : config.items()) {
      json& sizes = meta["tensor_meta"]["sizes"];
      if (sizes.size() == 1 && sizes[0]["as_int"].get<int64_t>() > 1) {  // a 1-d tensor read as a column
        sizes = json::array({sizes[0], json{{"as_int", 1}}});
        meta["tensor_meta"]["strides"] = json::array({json{{"as_int", 1}}, json{{"as_int", 1}}});
        return;
      }
    }
  });
  ExpectRefused(path, "is not the tensor the program was exported with");
}

TEST(ExportedProgramTest, TensorsThatShareARecordReadItOnce) {
  // The four running_var of `regions` point into the record of the first: N tensors of one
  // record (as torch stores tied weights) are N views of one copy of its bytes, not N copies.
  std::string shared_record;
  const std::string path = EditedWeights("shared_record", [&](json& config) {
    for (auto& [fqn, meta] : config.items()) {
      if (fqn.find("running_var") == std::string::npos) continue;
      if (shared_record.empty()) shared_record = meta["path_name"];
      meta["path_name"] = shared_record;
    }
  }, testing::FixtureModel("regions.exported_eval.pt2"));
  auto file = OpenModelFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto archive = exported::Pt2Archive::Read(*file, exported::ArchiveLimits{});
  ASSERT_TRUE(archive.ok()) << archive.status();
  exported::Pt2Archive::RecordCache records;
  std::set<const void*> storages;
  int tensors = 0;
  for (const auto& [name, stored] : archive->weights()) {
    if (name.find("running_var") == std::string::npos) continue;
    auto tensor = archive->Load(stored, &records);
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    storages.insert(tensor->storage().data());
    ++tensors;
  }
  EXPECT_EQ(tensors, 4);
  EXPECT_EQ(storages.size(), 1u);
  EXPECT_EQ(records.size(), 1u);
}

TEST(ExportedProgramTest, FactoryOperatorsThatNameNoDeviceAllocateOnTheJobsDevice) {
  // stochastic_depth's aten.empty without its device argument: by default the host's; planned
  // for a job on another device (meta, which any build has), it allocates there.
  const std::string path = Edited(
      "no_device",
      [](json& p) {
        json& empty = NodeWith(p, "aten.empty.memory_format");
        json kept = json::array();
        for (const json& input : empty["inputs"]) {
          if (input["name"] != "device") kept.push_back(input);
        }
        empty["inputs"] = kept;
      },
      nullptr, {}, false, testing::FixtureModel("stochastic_depth.exported_train.pt2"));
  auto file = OpenModelFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto archive = exported::Pt2Archive::Read(*file, exported::ArchiveLimits{});
  ASSERT_TRUE(archive.ok()) << archive.status();
  auto plan = exported::PlanProgram(archive->program(), GraphPolicy{}, c10::Device(c10::kMeta));
  ASSERT_TRUE(plan.ok()) << plan.status();
  int factories = 0;
  for (const exported::Step& step : plan->steps) {
    if (step.target != "aten::empty") continue;
    const auto device = step.op->schema().argumentIndexWithName("device");
    ASSERT_TRUE(device.has_value());
    const c10::IValue& given = step.arguments[*device].constant;
    ASSERT_TRUE(given.isDevice()) << "device left to the default: " << given;
    EXPECT_EQ(given.toDevice(), c10::Device(c10::kMeta));
    ++factories;
  }
  EXPECT_GE(factories, 1);
}

TEST(ExportedProgramTest, RefusesACompressedBombInPlaceOfAWeight) {
  // A record that inflates to 64 MiB from a few kB: the archive stores weights uncompressed,
  // so no honest record is larger than the archive.
  const std::string weight = "data/weights/weight_0";
  const std::string zeros(64 << 20, '\0');
  const std::string bombed = Edited(
      "bomb", nullptr,
      [&](const std::string& record, std::string bytes) -> std::optional<std::string> {
        if (record == weight) return std::nullopt;
        return bytes;
      },
      {{weight, zeros}}, /*compress_extra=*/true);
  ASSERT_LT(std::filesystem::file_size(bombed), 16u << 20);
  ExpectRefused(bombed, "past the end of the");
}

TEST(ExportedProgramTest, RefusesAnArchiveOfSeveralPrograms) {
  caffe2::serialize::PyTorchStreamReader reader(kBase);
  std::string program;
  for (const std::string& record : reader.getAllRecords()) {
    if (record.rfind("models/", 0) == 0) {
      auto [data, size] = reader.getRecord(record);
      program.assign(static_cast<const char*>(data.get()), size);
    }
  }
  const std::string path = Edited("two", nullptr, nullptr, {{"models/second.json", program}});
  ExpectRefused(path, "holds 2 programs");
}

TEST(ExportedProgramTest, SaysWhatFormatsItReadsForAnythingElse) {
  const std::string junk = TempPath("junk.pt2");
  std::ofstream(junk) << "not a model at all";
  ExpectRefused(junk, "torch.export.save");
  const std::string state_dict = TempPath("state_dict.pt");
  {
    caffe2::serialize::PyTorchStreamWriter writer(state_dict);
    const std::string pickle = "\x80\x02}q\x00.";
    writer.writeRecord("data.pkl", pickle.data(), pickle.size());
    writer.writeEndOfFile();
  }
  ExpectRefused(state_dict, "a torch.save file (a state_dict or a pickled module)");
}

TEST(ExportedProgramTest, TheForwardSkipsTheHeadAfterTheLastBatchNorm) {
  // A head after the last BatchNorm, and a tuple holding a dict as output.
  const std::string with_head = std::string(RECAL_FIXTURES_DIR) + "/models/tuple_dict_out.exported_eval.pt2";
  Options options;
  options.preload_output_copy = false;
  auto run = Recalibration::Create(with_head, options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_GT((*run)->forward_nodes_cut(), 0);
  options.end_at_last_batch_norm = false;
  auto whole = Recalibration::Create(with_head, options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ((*whole)->forward_nodes_cut(), 0);
}

// EfficientNet-B0 exported in train mode: stochastic depth is a Bernoulli mask in every block.
const std::string kStochasticDepth = std::string(RECAL_FIXTURES_DIR) + "/models/zoo_efficientnet_b0.exported_train.pt2";

TEST(ExportedProgramTest, OtherRandomnessUnderEvalModulesIsRefusedAndKeptUnderTrain) {
  // The first Bernoulli mask turned into Gaussian noise: no longer a mask whose expected
  // value is what eval mode computes.
  const std::string path = Edited(
      "noise", [](json& p) {
        json& node = NodeWith(p, "bernoulli_");
        node["target"] = "torch.ops.aten.normal_.default";
        for (json& input : node["inputs"]) {
          if (input["name"] == "p") input["name"] = "mean";
        }
      },
      nullptr, {}, false, kStochasticDepth);
  Options options;
  options.preload_output_copy = false;
  const absl::Status refused = Recalibration::Create(path, options).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), AllOf(HasSubstr("aten::normal_"), HasSubstr("export the model in eval mode")));
  options.modules = v1::TRAIN;
  EXPECT_TRUE(Recalibration::Create(path, options).ok());
  options.modules = v1::EVAL;
  EXPECT_TRUE(Recalibration::Create(kStochasticDepth, options).ok());
}

TEST(ExportedProgramTest, TheReportNamesTheFormat) {
  Options options;
  options.preload_output_copy = false;
  auto run = Recalibration::Create(kBase, options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->Report().model_format(), "exported_program");
}

}  // namespace
}  // namespace recal::engine
