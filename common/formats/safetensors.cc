#include "common/formats/safetensors.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"

namespace recal::formats {
namespace {

namespace pb = ::google::protobuf;

constexpr absl::string_view kMetadataKey = "__metadata__";
// The reference implementation refuses larger headers; so do we, before parsing JSON.
constexpr uint64_t kMaxHeaderBytes = 100 << 20;
// Offsets and dims travel as JSON numbers, which protobuf parses as doubles.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

absl::Status Invalid(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("invalid safetensors header: ", why));
}

std::optional<int64_t> AsIndex(const pb::Value& v) {
  if (v.kind_case() != pb::Value::kNumberValue) return std::nullopt;
  const double d = v.number_value();
  if (!(d >= 0) || d > kMaxExactInteger || std::floor(d) != d) return std::nullopt;
  return static_cast<int64_t>(d);
}

absl::StatusOr<SafetensorsTensorInfo> ParseEntry(const std::string& name, const pb::Value& value) {
  if (value.kind_case() != pb::Value::kStructValue) {
    return Invalid(absl::StrCat("entry '", name, "' must be an object"));
  }
  const auto& fields = value.struct_value().fields();
  SafetensorsTensorInfo info;
  info.name = name;

  auto dtype_it = fields.find("dtype");
  if (dtype_it == fields.end() || dtype_it->second.kind_case() != pb::Value::kStringValue) {
    return Invalid(absl::StrCat("entry '", name, "' has no string \"dtype\""));
  }
  std::optional<DType> dtype = DTypeFromSafetensorsName(dtype_it->second.string_value());
  if (!dtype) {
    return Invalid(absl::StrCat("entry '", name, "' has unsupported dtype '",
                                dtype_it->second.string_value(),
                                "'; supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL"));
  }
  info.dtype = *dtype;

  auto shape_it = fields.find("shape");
  if (shape_it == fields.end() || shape_it->second.kind_case() != pb::Value::kListValue) {
    return Invalid(absl::StrCat("entry '", name, "' has no list \"shape\""));
  }
  for (const pb::Value& dim : shape_it->second.list_value().values()) {
    std::optional<int64_t> d = AsIndex(dim);
    if (!d) return Invalid(absl::StrCat("entry '", name, "' has a shape entry that is not a non-negative integer"));
    info.shape.push_back(*d);
  }

  auto offsets_it = fields.find("data_offsets");
  if (offsets_it == fields.end() || offsets_it->second.kind_case() != pb::Value::kListValue ||
      offsets_it->second.list_value().values_size() != 2) {
    return Invalid(absl::StrCat("entry '", name, "' has no \"data_offsets\": [begin, end]"));
  }
  std::optional<int64_t> begin = AsIndex(offsets_it->second.list_value().values(0));
  std::optional<int64_t> end = AsIndex(offsets_it->second.list_value().values(1));
  if (!begin || !end || *end < *begin) {
    return Invalid(absl::StrCat("entry '", name,
                                "' has \"data_offsets\" that are not integers with begin <= end"));
  }
  info.begin = *begin;
  info.end = *end;

  absl::StatusOr<int64_t> size = DenseByteSize(info.shape, info.dtype);
  if (!size.ok()) return Invalid(absl::StrCat("entry '", name, "': ", size.status().message()));
  if (*size != info.end - info.begin) {
    return Invalid(absl::StrFormat(
        "entry '%s': shape [%s] of %s needs %d bytes, but data_offsets [%d, %d] span %d", name,
        absl::StrJoin(info.shape, ", "), SafetensorsDTypeName(info.dtype), *size, info.begin,
        info.end, info.end - info.begin));
  }
  return info;
}

// JSON string literal; tensor names are arbitrary UTF-8, so quotes, backslashes and
// control characters are escaped and everything else passes through.
void AppendJsonString(std::string* out, absl::string_view s) {
  out->push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

std::string EncodeLE64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

}  // namespace

const SafetensorsTensorInfo* SafetensorsHeader::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const SafetensorsTensorInfo& t, absl::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file) {
  return ParseSafetensorsHeader(file, static_cast<int64_t>(file.size()));
}

absl::StatusOr<int64_t> SafetensorsHeaderSize(absl::string_view prefix) {
  if (prefix.size() < 8) {
    return Invalid(absl::StrCat("the file has ", prefix.size(), " bytes, fewer than the 8-byte length prefix"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(prefix[i]);
  if (header_len > kMaxHeaderBytes) {
    return Invalid(absl::StrCat("declared header length ", header_len, " exceeds the ",
                                kMaxHeaderBytes, "-byte limit (not a safetensors file?)"));
  }
  return static_cast<int64_t>(8 + header_len);
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file, int64_t file_size) {
  absl::StatusOr<int64_t> header_size = SafetensorsHeaderSize(file.substr(0, std::min<int64_t>(file_size, 8)));
  if (!header_size.ok()) return header_size.status();
  const uint64_t header_len = static_cast<uint64_t>(*header_size) - 8;
  if (header_len > static_cast<uint64_t>(file_size) - 8) {
    return Invalid(absl::StrCat("declared header length ", header_len, " but only ",
                                file_size - 8, " bytes follow the length prefix (truncated?)"));
  }
  if (file.size() < static_cast<size_t>(*header_size)) {
    return absl::InternalError(absl::StrCat("ParseSafetensorsHeader: given ", file.size(), " bytes of a ",
                                            *header_size, "-byte header"));
  }
  const absl::string_view json = file.substr(8, header_len);
  if (json.empty() || json[0] != '{') return Invalid("the JSON header must start with '{'");

  pb::Struct root;
  const auto parsed = pb::util::JsonStringToMessage(pb::StringPiece(json.data(), json.size()), &root);
  if (!parsed.ok()) {
    return Invalid(absl::StrCat("not valid JSON: ", std::string(parsed.message())));
  }

  SafetensorsHeader header;
  header.data_offset = static_cast<int64_t>(8 + header_len);
  const int64_t data_size = file_size - header.data_offset;
  for (const auto& [name, value] : root.fields()) {
    if (name == kMetadataKey) {
      if (value.kind_case() != pb::Value::kStructValue) return Invalid("\"__metadata__\" must be an object");
      for (const auto& [key, v] : value.struct_value().fields()) {
        if (v.kind_case() == pb::Value::kStringValue) header.metadata[key] = v.string_value();
      }
      continue;
    }
    absl::StatusOr<SafetensorsTensorInfo> info = ParseEntry(name, value);
    if (!info.ok()) return info.status();
    if (info->end > data_size) {
      return Invalid(absl::StrFormat(
          "entry '%s' has data_offsets [%d, %d] beyond the %d-byte data section (truncated file?)",
          name, info->begin, info->end, data_size));
    }
    header.tensors.push_back(*std::move(info));
  }

  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const SafetensorsTensorInfo& t : header.tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return Invalid(absl::StrFormat("entries '%s' [%d, %d] and '%s' [%d, %d] overlap",
                                     by_offset[i - 1]->name, by_offset[i - 1]->begin,
                                     by_offset[i - 1]->end, by_offset[i]->name,
                                     by_offset[i]->begin, by_offset[i]->end));
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return header;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata) {
  const auto bad = [&path](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write safetensors file '", path, "': ", why));
  };
  struct Planned {
    const SafetensorsEntry* entry;
    DType dtype;
    int64_t begin = 0;
  };
  std::vector<Planned> plan;
  for (const SafetensorsEntry& e : entries) {
    if (e.name.empty() || e.name == kMetadataKey) {
      return bad(absl::StrCat("invalid tensor name '", e.name, "'"));
    }
    std::optional<DType> dtype = DTypeFromSafetensorsName(e.dtype);
    if (!dtype) {
      return bad(absl::StrCat("tensor '", e.name, "' has unknown dtype '", e.dtype,
                              "'; expected F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL"));
    }
    absl::StatusOr<int64_t> size = DenseByteSize(e.shape, *dtype);
    if (!size.ok()) return bad(absl::StrCat("tensor '", e.name, "': ", size.status().message()));
    if (static_cast<uint64_t>(*size) != e.bytes.size()) {
      return bad(absl::StrFormat("tensor '%s' of shape [%s] %s needs %d bytes, got %d", e.name,
                                 absl::StrJoin(e.shape, ", "), e.dtype, *size, e.bytes.size()));
    }
    plan.push_back({&e, *dtype});
  }

  std::sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) {
    const int64_t sa = ElementSize(a.dtype), sb = ElementSize(b.dtype);
    return sa != sb ? sa > sb : a.entry->name < b.entry->name;
  });
  int64_t offset = 0;
  for (Planned& p : plan) {
    p.begin = offset;
    offset += static_cast<int64_t>(p.entry->bytes.size());
  }
  std::vector<const Planned*> by_name;
  for (const Planned& p : plan) by_name.push_back(&p);
  std::sort(by_name.begin(), by_name.end(),
            [](const Planned* a, const Planned* b) { return a->entry->name < b->entry->name; });
  for (size_t i = 1; i < by_name.size(); ++i) {
    if (by_name[i]->entry->name == by_name[i - 1]->entry->name) {
      return bad(absl::StrCat("tensor name '", by_name[i]->entry->name, "' appears twice"));
    }
  }

  std::string json = "{";
  bool first = true;
  if (!metadata.empty()) {
    AppendJsonString(&json, kMetadataKey);
    json += ":{";
    for (const auto& [key, value] : metadata) {
      if (!first) json += ',';
      first = false;
      AppendJsonString(&json, key);
      json += ':';
      AppendJsonString(&json, value);
    }
    json += '}';
    first = false;
  }
  for (const Planned* p : by_name) {
    if (!first) json += ',';
    first = false;
    AppendJsonString(&json, p->entry->name);
    absl::StrAppend(&json, ":{\"dtype\":\"", p->entry->dtype, "\",\"shape\":[",
                    absl::StrJoin(p->entry->shape, ","), "],\"data_offsets\":[", p->begin, ",",
                    p->begin + static_cast<int64_t>(p->entry->bytes.size()), "]}");
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');

  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Open(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = writer->Append(EncodeLE64(json.size())); !s.ok()) return s;
  if (absl::Status s = writer->Append(json); !s.ok()) return s;
  for (const Planned& p : plan) {
    if (absl::Status s = writer->Append(p.entry->bytes); !s.ok()) return s;
  }
  return writer->Commit();
}

}  // namespace recal::formats
