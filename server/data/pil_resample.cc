#include "server/data/pil_resample.h"

#include <algorithm>
#include <cmath>

namespace recal::data {
namespace {

// Pillow's Resample.c: weights are normalised to 22 fractional bits so that a sum of
// uint8 x weight products fits an int32 with headroom.
constexpr int kPrecisionBits = 32 - 8 - 2;

// Per output pixel: the first input index, the number of inputs, and their weights.
struct Coefficients {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;  // out_size x ksize
};

double Triangle(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for the whole-image box [0, in_size),
// restricted to outputs [out_begin, out_begin + out_count).
Coefficients Precompute(int64_t in_size, int64_t out_size, int64_t out_begin, int64_t out_count) {
  const double scale = static_cast<double>(static_cast<float>(in_size) - 0.0f) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // the bilinear filter's support is 1
  Coefficients c;
  c.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_count);
  c.count.resize(out_count);
  c.weights.assign(out_count * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int64_t i = 0; i < out_count; ++i) {
    const double center = (static_cast<double>(out_begin + i) + 0.5) * scale;
    const double inv = 1.0 / filter_scale;
    // C's (int) truncation, as Pillow rounds with "+ 0.5" then casts.
    int64_t lo = static_cast<int64_t>(static_cast<int>(center - support + 0.5));
    lo = std::max<int64_t>(lo, 0);
    int64_t hi = static_cast<int64_t>(static_cast<int>(center + support + 0.5));
    hi = std::min(hi, in_size);
    const int64_t n = hi - lo;
    double total = 0.0;
    for (int64_t x = 0; x < n; ++x) {
      k[x] = Triangle((static_cast<double>(x + lo) - center + 0.5) * inv);
      total += k[x];
    }
    for (int64_t x = 0; x < n; ++x) {
      const double w = total != 0.0 ? k[x] / total : k[x];
      c.weights[i * c.ksize + x] =
          static_cast<int32_t>(w < 0 ? -0.5 + w * (1 << kPrecisionBits) : 0.5 + w * (1 << kPrecisionBits));
    }
    c.first[i] = lo;
    c.count[i] = n;
  }
  return c;
}

uint8_t Clip8(int32_t sum) { return static_cast<uint8_t>(std::clamp(sum >> kPrecisionBits, 0, 255)); }

}  // namespace

RgbImage ResizeCropLikePil(const RgbImage& image, int64_t out_h, int64_t out_w, int64_t top, int64_t left,
                           int64_t crop_h, int64_t crop_w) {
  const int64_t in_w = image.width, in_h = image.height;
  // Pillow skips a pass whose size does not change; a pass with scale 1 would be the
  // identity anyway, but skipping it keeps that obviously true.
  const bool horizontal = out_w != in_w;
  const bool vertical = out_h != in_h;

  // Rows of the input the vertical pass reads (all of the crop's rows, if no vertical pass).
  Coefficients rows;
  int64_t row_begin = top, row_end = top + crop_h;
  if (vertical) {
    rows = Precompute(in_h, out_h, top, crop_h);
    row_begin = rows.first[0];
    row_end = rows.first[crop_h - 1] + rows.count[crop_h - 1];
  }

  // Horizontal pass over those rows, only the crop's columns.
  const int64_t mid_h = row_end - row_begin;
  RgbImage mid{crop_w, mid_h, std::vector<uint8_t>(static_cast<size_t>(mid_h * crop_w * 3))};
  if (horizontal) {
    const Coefficients cols = Precompute(in_w, out_w, left, crop_w);
    for (int64_t y = 0; y < mid_h; ++y) {
      const uint8_t* in = image.pixels.data() + (row_begin + y) * in_w * 3;
      uint8_t* out = mid.pixels.data() + y * crop_w * 3;
      for (int64_t x = 0; x < crop_w; ++x) {
        const int32_t* k = cols.weights.data() + x * cols.ksize;
        const uint8_t* p = in + cols.first[x] * 3;
        int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
        for (int64_t j = 0; j < cols.count[x]; ++j) {
          s0 += p[3 * j + 0] * k[j];
          s1 += p[3 * j + 1] * k[j];
          s2 += p[3 * j + 2] * k[j];
        }
        out[3 * x + 0] = Clip8(s0);
        out[3 * x + 1] = Clip8(s1);
        out[3 * x + 2] = Clip8(s2);
      }
    }
  } else {
    for (int64_t y = 0; y < mid_h; ++y) {
      const uint8_t* in = image.pixels.data() + ((row_begin + y) * in_w + left) * 3;
      std::copy(in, in + crop_w * 3, mid.pixels.data() + y * crop_w * 3);
    }
  }
  if (!vertical) return mid;

  RgbImage out{crop_w, crop_h, std::vector<uint8_t>(static_cast<size_t>(crop_h * crop_w * 3))};
  const int64_t stride = crop_w * 3;
  for (int64_t y = 0; y < crop_h; ++y) {
    const int32_t* k = rows.weights.data() + y * rows.ksize;
    const uint8_t* in = mid.pixels.data() + (rows.first[y] - row_begin) * stride;
    uint8_t* o = out.pixels.data() + y * stride;
    for (int64_t x = 0; x < stride; ++x) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int64_t j = 0; j < rows.count[y]; ++j) s += in[j * stride + x] * k[j];
      o[x] = Clip8(s);
    }
  }
  return out;
}

}  // namespace recal::data
