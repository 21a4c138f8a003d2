// Protobuf's JSON mapping writes 64-bit integers as strings ("samples": "1024"), because
// JavaScript's numbers lose precision above 2^53. Recal's JSON (the report artifact,
// recalctl's output) is read by people and by jq / Python, which want numbers; this rewrites
// those strings as numbers (protobuf's JSON parser takes either).
#pragma once

#include <google/protobuf/descriptor.h>

#include <string>

#include "absl/strings/string_view.h"

namespace recal {

// `json`, as protobuf printed a message of `type`, with the quotes around every value of a
// 64-bit integer field (int64, uint64, sint64, fixed64, sfixed64; singular, repeated or as a
// map's value) removed: "samples": "1024" -> "samples": 1024. The field is found through the
// descriptor, so a string field or a map key that happens to hold digits stays a string.
// Everything else (order, whitespace, well-known types) is copied byte for byte. Input that is
// not the JSON protobuf prints comes back unchanged.
std::string Int64FieldsAsNumbers(absl::string_view json, const google::protobuf::Descriptor& type);

}  // namespace recal
