// Work the engine overlaps with its own: loading the output copy beside a run, checking that
// saved bytes reload beside writing them.
#pragma once

#include <future>
#include <system_error>
#include <utility>

namespace recal::engine {

// Runs `work` on a thread of its own, or here when no thread can be started.
template <typename Work>
auto RunAside(Work work) -> std::future<decltype(work())> {
  try {
    return std::async(std::launch::async, std::move(work));
  } catch (const std::system_error&) {
    std::promise<decltype(work())> done;
    done.set_value(work());
    return done.get_future();
  }
}

}  // namespace recal::engine
