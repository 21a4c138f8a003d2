// Autocast on one device type for a scope, as torch.autocast enters and leaves it: the
// thread's autocast state set, the nesting counted, the casts of weights it caches dropped
// when the outermost scope ends, the state before restored. The engine's reduced-precision
// forward (Options::compute_dtype) and the autocast regions of exported programs use it.
#pragma once

#include <optional>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace recal::engine {

class AutocastScope {
 public:
  // `dtype` / `cache_enabled`: std::nullopt keeps the thread's current ones.
  AutocastScope(c10::DeviceType device_type, bool enabled, std::optional<c10::ScalarType> dtype,
                std::optional<bool> cache_enabled = std::nullopt);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  const c10::DeviceType device_type_;
  const bool was_enabled_;
  const c10::ScalarType was_dtype_;
  const bool was_cache_enabled_;
};

}  // namespace recal::engine
