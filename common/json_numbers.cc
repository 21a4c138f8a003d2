#include "common/json_numbers.h"

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace recal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

bool Is64BitInteger(const FieldDescriptor& field) {
  return field.cpp_type() == FieldDescriptor::CPPTYPE_INT64 || field.cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
}

// Printed by protobuf in a JSON form of their own (a timestamp as a string, a Struct as any
// JSON): copied as they are.
bool IsWellKnown(const Descriptor& type) { return absl::StartsWith(type.full_name(), "google.protobuf."); }

const FieldDescriptor* FieldByJsonKey(const Descriptor& type, absl::string_view key) {
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor* field = type.field(i);
    // preserve_proto_field_names prints `name`, the default `json_name`.
    if (field->json_name() == key || field->name() == key) return field;
  }
  return nullptr;
}

bool IsInteger(absl::string_view text) {
  if (absl::StartsWith(text, "-")) text.remove_prefix(1);
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// A recursive-descent copy of the JSON text that knows, from the descriptor, which field each
// value belongs to. Every method returns false on text it does not expect.
class Rewriter {
 public:
  explicit Rewriter(absl::string_view in) : in_(in) {}

  bool Document(const Descriptor& type) {
    if (!Message(type)) return false;
    CopySpace();
    return pos_ == in_.size();
  }
  std::string& out() { return out_; }

 private:
  char Peek() const { return pos_ < in_.size() ? in_[pos_] : '\0'; }

  void CopySpace() {
    while (pos_ < in_.size() && absl::ascii_isspace(static_cast<unsigned char>(in_[pos_]))) out_ += in_[pos_++];
  }

  bool Copy(char expected) {
    CopySpace();
    if (Peek() != expected) return false;
    out_ += in_[pos_++];
    return true;
  }

  // The raw text between the quotes of the string at pos_ (escapes left as they are).
  std::optional<absl::string_view> ReadString() {
    CopySpace();
    if (Peek() != '"') return std::nullopt;
    const size_t start = ++pos_;
    while (pos_ < in_.size() && in_[pos_] != '"') pos_ += in_[pos_] == '\\' ? 2 : 1;
    if (pos_ >= in_.size()) return std::nullopt;
    return in_.substr(start, pos_++ - start);
  }

  bool CopyString() {
    const std::optional<absl::string_view> text = ReadString();
    if (!text) return false;
    out_.append("\"").append(text->data(), text->size()).append("\"");
    return true;
  }

  // Any JSON value, unchanged.
  bool CopyOpaque() {
    CopySpace();
    const char first = Peek();
    if (first == '"') return CopyString();
    if (first == '{' || first == '[') {
      int depth = 0;
      do {
        if (Peek() == '"') {
          if (!CopyString()) return false;
          continue;
        }
        if (pos_ >= in_.size()) return false;
        const char c = in_[pos_++];
        out_ += c;
        if (c == '{' || c == '[') ++depth;
        if (c == '}' || c == ']') --depth;
      } while (depth > 0);
      return true;
    }
    const size_t start = pos_;  // a number, true, false or null
    while (pos_ < in_.size() && !absl::StrContains(",}] \t\r\n", in_[pos_])) ++pos_;
    out_.append(in_.data() + start, pos_ - start);
    return pos_ > start;
  }

  // `{ "key": value, ... }`, each value handled by `value(key)`.
  template <typename ValueFn>
  bool Object(ValueFn value) {
    if (!Copy('{')) return false;
    CopySpace();
    if (Peek() == '}') return Copy('}');
    do {
      const std::optional<absl::string_view> key = ReadString();
      if (!key) return false;
      out_.append("\"").append(key->data(), key->size()).append("\"");
      if (!Copy(':') || !value(*key)) return false;
      CopySpace();
    } while (Peek() == ',' && Copy(','));
    return Copy('}');
  }

  bool Message(const Descriptor& type) {
    return Object([&](absl::string_view key) {
      const FieldDescriptor* field = FieldByJsonKey(type, key);
      return field == nullptr ? CopyOpaque() : Value(*field, /*element=*/false);
    });
  }

  // The value of `field`; `element`: one element of a repeated field, not the array.
  bool Value(const FieldDescriptor& field, bool element) {
    CopySpace();
    if (Peek() == 'n') return CopyOpaque();  // null
    if (field.is_map() && !element) {
      const FieldDescriptor& map_value = *field.message_type()->map_value();
      return Object([&](absl::string_view) { return Value(map_value, false); });
    }
    if (field.is_repeated() && !element) {
      if (!Copy('[')) return false;
      CopySpace();
      if (Peek() == ']') return Copy(']');
      do {
        if (!Value(field, true)) return false;
        CopySpace();
      } while (Peek() == ',' && Copy(','));
      return Copy(']');
    }
    if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      return IsWellKnown(*field.message_type()) ? CopyOpaque() : Message(*field.message_type());
    }
    if (Is64BitInteger(field) && Peek() == '"') {
      const std::optional<absl::string_view> text = ReadString();
      if (!text) return false;
      if (IsInteger(*text)) {
        out_.append(text->data(), text->size());
      } else {
        out_.append("\"").append(text->data(), text->size()).append("\"");
      }
      return true;
    }
    return CopyOpaque();
  }

  absl::string_view in_;
  size_t pos_ = 0;
  std::string out_;
};

}  // namespace

std::string Int64FieldsAsNumbers(absl::string_view json, const google::protobuf::Descriptor& type) {
  if (IsWellKnown(type)) return std::string(json);
  Rewriter rewriter(json);
  if (!rewriter.Document(type)) return std::string(json);
  return std::move(rewriter.out());
}

}  // namespace recal
