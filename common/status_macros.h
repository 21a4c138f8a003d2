// Early-return helpers for absl::Status / StatusOr (Triton's RETURN_IF_ERROR), for any layer.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RECAL_CONCAT_INNER(a, b) a##b
#define RECAL_CONCAT(a, b) RECAL_CONCAT_INNER(a, b)

#define RECAL_RETURN_IF_ERROR(expr)       \
  do {                                          \
    if (absl::Status _st = (expr); !_st.ok()) { \
      return _st;                               \
    }                                           \
  } while (0)

#define RECAL_ASSIGN_OR_RETURN(lhs, expr) \
  RECAL_ASSIGN_OR_RETURN_IMPL(RECAL_CONCAT(_statusor_, __LINE__), lhs, expr)

#define RECAL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  if (!tmp.ok()) return std::move(tmp).status();          \
  lhs = std::move(tmp).value()
