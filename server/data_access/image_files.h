// Which files an image folder (images:DIR or images:s3://BUCKET/PREFIX/) uses, and in which
// order: the rules every folder follows wherever its files live (a local directory,
// server/data/image_source.cc; a prefix in a bucket, locate_objects.cc), so that the same
// tree gives the same batches from anywhere. Decoding them is server/data's (LibTorch).
#pragma once

#include <string>
#include <vector>

#include "common/data_spec.h"

namespace recal::data {

// Whether a file, by its path relative to the folder, is one the folder uses: .jpg, .jpeg
// or .png, case-insensitive (std::filesystem's extension: ".png" alone is a hidden file
// without one).
bool IsImageFileName(const std::string& relative);

// The files the spec reads, in the order it reads them: `files` (relative paths with '/'
// separators, as listed, any order) sorted by byte-wise path order, or shuffled with the
// spec's seed when it says shuffle=1, then the first `samples` (all when negative).
std::vector<std::string> SelectImageFiles(std::vector<std::string> files, const DataSpec& spec);

}  // namespace recal::data
