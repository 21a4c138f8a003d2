// What the in-process benchmarks share: a wall-clock timer and the random input batches they
// feed (seeded, so every configuration of one run sees the same data).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace recal::bench {

inline double TimeIt(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// `count` batches of N(0, 1) samples, [batch_size, *shape] with shape as "3x112x112" (the
// benchmarks' --shape flag: a bad one ends the process with status 2).
inline std::vector<at::Tensor> RandomBatches(int64_t batch_size, absl::string_view shape, int count) {
  std::vector<int64_t> sizes = {batch_size};
  for (absl::string_view d : absl::StrSplit(shape, 'x')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(d, &v) || v <= 0) {
      std::fprintf(stderr, "--shape takes positive sizes as 3x112x112, not '%s'\n", std::string(shape).c_str());
      std::exit(2);
    }
    sizes.push_back(v);
  }
  at::manual_seed(0);
  std::vector<at::Tensor> batches;
  for (int i = 0; i < count; ++i) batches.push_back(at::randn(sizes));
  return batches;
}

}  // namespace recal::bench
