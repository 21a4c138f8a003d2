// Fixture programs edited as an attacker (or a newer torch) would write them: the program's
// JSON or its records changed, the archive written anew. Shared by the tests of exported
// programs.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace recal::engine::testing {

// A fixture model by its file name under the fixtures' models/.
std::string FixtureModel(const std::string& file);

std::string TempPath(const std::string& name);

// `base` with its program JSON passed through `edit_program`, its records passed through
// `edit_record` (return nullopt to drop one), and `extra` records added. Written under the
// temp directory as name.pt2; returns the path.
std::string Edited(const std::string& name, const std::string& base,
                   const std::function<void(nlohmann::json&)>& edit_program,
                   const std::function<std::optional<std::string>(const std::string&, std::string)>& edit_record = nullptr,
                   const std::map<std::string, std::string>& extra = {}, bool compress_extra = false);

// The nodes of the program's graph.
nlohmann::json& Nodes(nlohmann::json& program);
// The first node of `nodes` whose target contains `part`; throws if there is none.
nlohmann::json& NodeWith(nlohmann::json& nodes, const std::string& part);
// The graph (with "nodes") that argument `index` of `node` carries as {"as_graph": ...}.
nlohmann::json& GraphArgument(nlohmann::json& node, size_t index);

// What Recalibration::Create says of the model at `path` (without preloading the copy to write).
absl::Status CreateStatus(const std::string& path);
// Expects INVALID_ARGUMENT whose message holds `says`.
void ExpectRefused(const std::string& path, const std::string& says);

}  // namespace recal::engine::testing
