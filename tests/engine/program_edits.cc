#include "tests/engine/program_edits.h"

#include <filesystem>
#include <stdexcept>

#include <caffe2/serialize/inline_container.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/engine/recalibration.h"

namespace recal::engine::testing {

using nlohmann::json;

std::string FixtureModel(const std::string& file) { return std::string(RECAL_FIXTURES_DIR) + "/models/" + file; }

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("recal_exported_" + name)).string();
}

std::string Edited(const std::string& name, const std::string& base, const std::function<void(json&)>& edit_program,
                   const std::function<std::optional<std::string>(const std::string&, std::string)>& edit_record,
                   const std::map<std::string, std::string>& extra, bool compress_extra) {
  caffe2::serialize::PyTorchStreamReader reader(base);
  const std::string path = TempPath(name + ".pt2");
  caffe2::serialize::PyTorchStreamWriter writer(path);
  for (const std::string& record : reader.getAllRecords()) {
    if (record == ".data/serialization_id") continue;
    auto [data, size] = reader.getRecord(record);
    std::string bytes(static_cast<const char*>(data.get()), size);
    if (record.rfind("models/", 0) == 0 && edit_program) {
      json program = json::parse(bytes);
      edit_program(program);
      bytes = program.dump();
    }
    std::optional<std::string> kept = edit_record ? edit_record(record, bytes) : std::optional<std::string>(bytes);
    if (kept) writer.writeRecord(record, kept->data(), kept->size());
  }
  for (const auto& [record, bytes] : extra) writer.writeRecord(record, bytes.data(), bytes.size(), compress_extra);
  writer.writeEndOfFile();
  return path;
}

json& Nodes(json& program) { return program["graph_module"]["graph"]["nodes"]; }

json& NodeWith(json& nodes, const std::string& part) {
  for (json& node : nodes) {
    if (node["target"].get<std::string>().find(part) != std::string::npos) return node;
  }
  throw std::runtime_error("no node with " + part);
}

json& GraphArgument(json& node, size_t index) { return node["inputs"][index]["arg"]["as_graph"]["graph"]; }

absl::Status CreateStatus(const std::string& path) {
  Options options;
  options.preload_output_copy = false;
  return Recalibration::Create(path, options).status();
}

void ExpectRefused(const std::string& path, const std::string& says) {
  const absl::Status status = CreateStatus(path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr(says));
}

}  // namespace recal::engine::testing
