// LibTorch reports errors by throwing; the engine turns them into Status values here.
#pragma once

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace recal::engine {

// The one line of a LibTorch exception a person needs: TorchScript errors carry a traceback
// of the scripted code before the actual "RuntimeError: ..." line, which is what is kept.
std::string TorchErrorLine(const std::exception& e);

// InvalidArgument: "<context>: <TorchErrorLine(e)>".
absl::Status TorchErrorStatus(absl::string_view context, const std::exception& e);

}  // namespace recal::engine
