// The names of a proto enum's values as users write them: the value names in lowercase
// ("batch_average" for BATCH_AVERAGE), *_UNSPECIFIED left out. The proto (e.g.
// proto/recal/v1/report.proto) is the one list of an option's names; flags, JSON fields and
// error messages take them from its descriptor through these functions.
//
// Header-only: recalctl links recal_client, which carries the generated protobuf code as
// objects of its own (client/CMakeLists.txt), so a library here linking recal_proto would
// give it two copies of the same descriptors.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/generated_enum_reflection.h"

namespace recal {

namespace enum_names_internal {

inline bool IsUnspecified(const google::protobuf::EnumValueDescriptor& value) {
  return absl::EndsWith(value.name(), "_UNSPECIFIED");
}

// The user-facing names of `descriptor`'s values, in declaration order.
inline std::vector<std::string> Names(const google::protobuf::EnumDescriptor& descriptor) {
  std::vector<std::string> names;
  for (int i = 0; i < descriptor.value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor& value = *descriptor.value(i);
    if (!IsUnspecified(value)) names.push_back(absl::AsciiStrToLower(value.name()));
  }
  return names;
}

}  // namespace enum_names_internal

// The lowercase names of E's values, *_UNSPECIFIED left out, in declaration order.
template <typename E>
std::vector<std::string> EnumNames() {
  return enum_names_internal::Names(*google::protobuf::GetEnumDescriptor<E>());
}

// The value whose lowercase name is exactly `name`; nullopt for any other string (the
// uppercase value name and "*_unspecified" included).
template <typename E>
std::optional<E> EnumFromName(absl::string_view name) {
  const google::protobuf::EnumDescriptor& descriptor = *google::protobuf::GetEnumDescriptor<E>();
  for (int i = 0; i < descriptor.value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor& value = *descriptor.value(i);
    if (!enum_names_internal::IsUnspecified(value) && absl::AsciiStrToLower(value.name()) == name) {
      return static_cast<E>(value.number());
    }
  }
  return std::nullopt;
}

// The lowercase name of `value` ("" for a number the enum does not declare).
template <typename E>
std::string EnumName(E value) {
  const google::protobuf::EnumValueDescriptor* found =
      google::protobuf::GetEnumDescriptor<E>()->FindValueByNumber(static_cast<int>(value));
  return found == nullptr ? "" : absl::AsciiStrToLower(found->name());
}

// "a, b or c": E's names for the "use ..." part of an error message.
template <typename E>
std::string EnumNameList() {
  std::vector<std::string> names = EnumNames<E>();
  if (names.size() < 2) return absl::StrJoin(names, "");
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

}  // namespace recal
