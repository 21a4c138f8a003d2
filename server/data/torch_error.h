// Text of exceptions thrown by LibTorch, for Status messages.
#pragma once

#include <exception>
#include <string>

namespace recal::data {

// For a c10::Error, the message without the C++ backtrace LibTorch appends (dozens of
// frames nobody acting on the error can use); otherwise what().
std::string ExceptionMessage(const std::exception& e);

}  // namespace recal::data
