#include "common/formats/npy.h"

#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recal::formats {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed .npy header: ", why));
}

// Reads a little-endian unsigned integer of `n` bytes.
uint64_t ReadLE(const char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// A cursor over the header's dict literal. The grammar is the tiny subset np.save writes
// (strings, True/False, tuples of ints), so a few methods beat a general Python parser.
class DictReader {
 public:
  explicit DictReader(absl::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(absl::string_view word) {
    SkipSpace();
    if (absl::StartsWith(text_.substr(pos_), word)) {
      pos_ += word.size();
      return true;
    }
    return false;
  }
  char Peek() {
    SkipSpace();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }

  absl::StatusOr<std::string> String() {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Malformed(absl::StrCat("expected a quoted string at ", Where()));
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return Malformed("unterminated string");
    std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return s;
  }

  absl::StatusOr<std::vector<int64_t>> IntTuple() {
    if (!Consume('(')) return Malformed(absl::StrCat("'shape' must be a tuple, found ", Where()));
    std::vector<int64_t> dims;
    while (!Consume(')')) {
      SkipSpace();
      size_t end = pos_;
      while (end < text_.size() && absl::ascii_isdigit(static_cast<unsigned char>(text_[end]))) ++end;
      int64_t dim = 0;
      if (end == pos_ || !absl::SimpleAtoi(text_.substr(pos_, end - pos_), &dim)) {
        return Malformed(absl::StrCat("'shape' must hold non-negative integers, found ", Where()));
      }
      pos_ = end;
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long literal
      dims.push_back(dim);
      if (!Consume(',') && Peek() != ')') {
        return Malformed(absl::StrCat("expected ',' or ')' in 'shape', found ", Where()));
      }
    }
    return dims;
  }

  std::string Where() {
    SkipSpace();
    if (pos_ >= text_.size()) return "end of header";
    return absl::StrCat("'", text_.substr(pos_, 16), "'");
  }

 private:
  absl::string_view text_;
  size_t pos_ = 0;
};

absl::Status UnsupportedDescr(absl::string_view descr, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported .npy dtype '", descr, "': ", why,
      "; supported: <f8 <f4 <f2 <i8 <i4 <i2 |i1 |u1 |b1 (little-endian)"));
}

absl::StatusOr<DType> DTypeFromDescr(absl::string_view descr) {
  if (descr.size() < 3) return UnsupportedDescr(descr, "not a simple dtype");
  const char order = descr[0];
  const char kind = descr[1];
  int size = 0;
  if (!absl::SimpleAtoi(descr.substr(2), &size)) return UnsupportedDescr(descr, "not a simple dtype");
  if (kind == 'O') {
    return UnsupportedDescr(descr, "object arrays hold pickled Python objects, not numbers");
  }
  if (order != '<' && order != '|' && order != '>' && order != '=') {
    return UnsupportedDescr(descr, "unknown byte order");
  }
  if (order == '>' && size > 1) {
    return UnsupportedDescr(descr, "big-endian; convert with arr.astype(arr.dtype.newbyteorder('<'))");
  }
  if (order == '|' && size > 1) return UnsupportedDescr(descr, "byte order '|' on a multi-byte type");
  std::optional<DType> dtype;
  switch (kind) {
    case 'f':
      if (size == 8) dtype = DType::kF64;
      if (size == 4) dtype = DType::kF32;
      if (size == 2) dtype = DType::kF16;
      break;
    case 'i':
      if (size == 8) dtype = DType::kI64;
      if (size == 4) dtype = DType::kI32;
      if (size == 2) dtype = DType::kI16;
      if (size == 1) dtype = DType::kI8;
      break;
    case 'u':
      if (size == 1) dtype = DType::kU8;
      break;
    case 'b':
      if (size == 1) dtype = DType::kBool;
      break;
    default:
      break;
  }
  if (!dtype) return UnsupportedDescr(descr, "no matching tensor type");
  return *dtype;
}

}  // namespace

absl::StatusOr<int64_t> NpyHeaderSize(absl::string_view bytes) {
  if (bytes.size() < kMagic.size() + 2 || bytes.substr(0, kMagic.size()) != kMagic) {
    return absl::InvalidArgumentError(
        "not a .npy file (it does not start with the magic \"\\x93NUMPY\")");
  }
  const int major_version = static_cast<unsigned char>(bytes[6]);
  const int minor_version = static_cast<unsigned char>(bytes[7]);
  if (major_version < 1 || major_version > 3 || minor_version != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported .npy format version ", major_version, ".",
                                                   minor_version, "; supported: 1.0, 2.0, 3.0"));
  }
  const int len_bytes = major_version == 1 ? 2 : 4;
  const size_t prefix = kMagic.size() + 2 + len_bytes;
  if (bytes.size() < prefix) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated .npy header: ", bytes.size(), " bytes, need at least ", prefix));
  }
  return static_cast<int64_t>(prefix + ReadLE(bytes.data() + 8, len_bytes));
}

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes) {
  absl::StatusOr<int64_t> header_size = NpyHeaderSize(bytes);
  if (!header_size.ok()) return header_size.status();
  NpyHeader header;
  header.major_version = static_cast<unsigned char>(bytes[6]);
  header.minor_version = static_cast<unsigned char>(bytes[7]);
  const size_t prefix = kMagic.size() + 2 + (header.major_version == 1 ? 2 : 4);
  const uint64_t header_len = static_cast<uint64_t>(*header_size) - prefix;
  if (bytes.size() - prefix < header_len) {
    return absl::InvalidArgumentError(absl::StrCat("truncated .npy header: it declares ", header_len,
                                                   " header bytes after the first ", prefix,
                                                   ", but only ", bytes.size() - prefix,
                                                   " are there"));
  }
  header.data_offset = static_cast<int64_t>(prefix + header_len);

  DictReader reader(bytes.substr(prefix, header_len));
  if (!reader.Consume('{')) return Malformed("it must be a dict literal starting with '{'");
  bool have_descr = false, have_order = false, have_shape = false;
  while (!reader.Consume('}')) {
    absl::StatusOr<std::string> key = reader.String();
    if (!key.ok()) return key.status();
    if (!reader.Consume(':')) return Malformed(absl::StrCat("expected ':' after '", *key, "'"));
    if (*key == "descr" && !have_descr) {
      if (reader.Peek() == '[') {
        return absl::InvalidArgumentError(
            "unsupported .npy dtype: structured (record) arrays are not supported");
      }
      absl::StatusOr<std::string> descr = reader.String();
      if (!descr.ok()) return descr.status();
      header.descr = *descr;
      have_descr = true;
    } else if (*key == "fortran_order" && !have_order) {
      if (reader.ConsumeWord("True")) {
        header.fortran_order = true;
      } else if (!reader.ConsumeWord("False")) {
        return Malformed(absl::StrCat("'fortran_order' must be True or False, found ", reader.Where()));
      }
      have_order = true;
    } else if (*key == "shape" && !have_shape) {
      absl::StatusOr<std::vector<int64_t>> shape = reader.IntTuple();
      if (!shape.ok()) return shape.status();
      header.shape = *std::move(shape);
      have_shape = true;
    } else {
      return Malformed(absl::StrCat("unexpected or repeated key '", *key, "'"));
    }
    if (!reader.Consume(',') && reader.Peek() != '}') {
      return Malformed(absl::StrCat("expected ',' or '}', found ", reader.Where()));
    }
  }
  if (!reader.AtEnd()) return Malformed(absl::StrCat("trailing text after the dict: ", reader.Where()));
  if (!have_descr || !have_order || !have_shape) {
    return Malformed("it must have the keys 'descr', 'fortran_order' and 'shape'");
  }

  absl::StatusOr<DType> dtype = DTypeFromDescr(header.descr);
  if (!dtype.ok()) return dtype.status();
  header.dtype = *dtype;
  // A Fortran-order array with at most one non-trivial dim has the same bytes in C order,
  // but numpy only writes fortran_order=True for genuinely transposed layouts, so say so.
  if (header.fortran_order) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the .npy array (shape [", absl::StrJoin(header.shape, ", "),
        "]) is in Fortran (column-major) order; re-save it in C order: "
        "np.save(path, np.ascontiguousarray(arr))"));
  }
  absl::StatusOr<int64_t> size = DenseByteSize(header.shape, header.dtype);
  if (!size.ok()) return size.status();
  header.data_size = *size;
  return header;
}

absl::StatusOr<NpyHeader> ParseNpyFile(absl::string_view file) {
  return ParseNpyHeaderOfFile(file, static_cast<int64_t>(file.size()));
}

absl::StatusOr<NpyHeader> ParseNpyHeaderOfFile(absl::string_view header_bytes, int64_t file_size) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(header_bytes);
  if (!header.ok()) return header.status();
  const uint64_t available = static_cast<uint64_t>(file_size) - static_cast<uint64_t>(header->data_offset);
  if (file_size < header->data_offset || available < static_cast<uint64_t>(header->data_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated .npy file: shape [", absl::StrJoin(header->shape, ", "), "] of ",
        DTypeName(header->dtype), " needs ", header->data_size, " data bytes after the ",
        header->data_offset, "-byte header, but only ", file_size < header->data_offset ? 0 : available,
        " are there"));
  }
  return header;
}

}  // namespace recal::formats
