#include "server/data_access/image_files.h"

#include <algorithm>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"

namespace recal::data {

bool IsImageFileName(const std::string& relative) {
  const std::string ext = absl::AsciiStrToLower(std::filesystem::path(relative).extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

std::vector<std::string> SelectImageFiles(std::vector<std::string> files, const DataSpec& spec) {
  std::sort(files.begin(), files.end());
  if (spec.shuffle) {
    // Fisher-Yates with mt19937_64 (fully specified by the standard, unlike std::shuffle).
    std::mt19937_64 rng(spec.seed);
    for (size_t i = files.size(); i > 1; --i) std::swap(files[i - 1], files[rng() % i]);
  }
  if (spec.samples >= 0 && static_cast<size_t>(spec.samples) < files.size()) files.resize(spec.samples);
  return files;
}

}  // namespace recal::data
