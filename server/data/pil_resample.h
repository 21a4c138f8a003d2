// Pillow's bilinear resampling of 8-bit RGB images (Image.resize(size, Image.BILINEAR), which
// torchvision's Resize calls on PIL images), reproduced to the bit: the same filter support,
// the same 22-bit fixed-point weights, horizontal pass then vertical pass, the same rounding.
// Written by hand (no torch) so decoding threads never start intra-op thread pools, and so
// only the pixels a center crop keeps are computed.
#pragma once

#include <cstdint>
#include <vector>

namespace recal::data {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // height x width x 3, row-major
};

// The window [top, top + crop_h) x [left, left + crop_w) of `image` resized to
// out_h x out_w. Requires 0 <= top, top + crop_h <= out_h (same for columns) and
// positive sizes.
RgbImage ResizeCropLikePil(const RgbImage& image, int64_t out_h, int64_t out_w, int64_t top, int64_t left,
                           int64_t crop_h, int64_t crop_w);

}  // namespace recal::data
