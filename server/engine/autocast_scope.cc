#include "server/engine/autocast_scope.h"

#include <ATen/autocast_mode.h>

namespace recal::engine {

AutocastScope::AutocastScope(c10::DeviceType device_type, bool enabled, std::optional<c10::ScalarType> dtype,
                             std::optional<bool> cache_enabled)
    : device_type_(device_type),
      was_enabled_(at::autocast::is_autocast_enabled(device_type)),
      was_dtype_(at::autocast::get_autocast_dtype(device_type)),
      was_cache_enabled_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_enabled(device_type_, enabled);
  if (dtype) at::autocast::set_autocast_dtype(device_type_, *dtype);
  at::autocast::increment_nesting();
  if (cache_enabled) at::autocast::set_autocast_cache_enabled(*cache_enabled);
}

AutocastScope::~AutocastScope() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, was_enabled_);
  at::autocast::set_autocast_dtype(device_type_, was_dtype_);
  at::autocast::set_autocast_cache_enabled(was_cache_enabled_);
}

}  // namespace recal::engine
