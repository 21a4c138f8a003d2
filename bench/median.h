// The statistic every benchmark table reports: robust to the odd slow run on a shared machine.
#pragma once

#include <algorithm>
#include <vector>

namespace recal::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace recal::bench
