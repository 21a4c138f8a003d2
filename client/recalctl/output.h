// What recalctl prints on stdout: one protobuf JSON document (--output=json), or short
// "key: value" lines and tables (--output=text). Progress goes to stderr (progress.h).
#pragma once

#include <google/protobuf/message.h>

#include <cstdint>
#include <string>

#include "recal/v1/recal.pb.h"

namespace recal::ctl {

// Protobuf's JSON mapping with its defaults (lowerCamelCase names, enums by name, fields at
// their default value left out), except that 64-bit integers are numbers, not strings
// (json_numbers.h). Every JSON document recalctl prints comes from here. Indented; ends in '\n'.
std::string ToJson(const google::protobuf::Message& message);

std::string JobText(const v1::Job& job);
std::string ModelText(const v1::Model& model);
std::string JobsTable(const v1::ListJobsResponse& jobs);
std::string ModelsTable(const v1::ListModelsResponse& models);
std::string UsageText(const v1::Usage& usage);

// "1.5 MB", "312 B"; "0:42", "1:02:03".
std::string FormatBytes(int64_t bytes);
std::string FormatDuration(double seconds);

}  // namespace recal::ctl
