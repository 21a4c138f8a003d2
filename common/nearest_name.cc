#include "common/nearest_name.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recal {
namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string NearestName(absl::string_view unknown, const std::vector<std::string>& names) {
  const std::string* nearest = nullptr;
  size_t nearest_distance = unknown.size() + 1;
  for (const std::string& name : names) {
    const size_t distance = EditDistance(unknown, name);
    if (distance < nearest_distance) {
      nearest = &name;
      nearest_distance = distance;
    }
  }
  if (nearest != nullptr && nearest_distance <= std::max<size_t>(2, unknown.size() / 3)) return *nearest;
  // A name cut short (--max_batch for --max_batch_bytes) is far by edit distance.
  for (const std::string& name : names) {
    if (unknown.size() >= 4 && absl::StartsWith(name, unknown)) return name;
  }
  return "";
}

std::string DidYouMean(absl::string_view unknown, const std::vector<std::string>& names, absl::string_view prefix) {
  const std::string nearest = NearestName(unknown, names);
  return nearest.empty() ? "" : absl::StrCat("; did you mean ", prefix, nearest, "?");
}

}  // namespace recal
