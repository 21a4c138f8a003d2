// The one LibTorch-using piece of the client tests (the client itself never links it).
#include "tests/client/client_test_util.h"
#include "tests/engine/test_util.h"

namespace recal::testing {

double WorstBnError(const std::string& got, const std::string& reference) {
  return engine::testing::WorstRelativeError(engine::testing::ReadSafetensors(got),
                                             engine::testing::ReadSafetensors(reference));
}

}  // namespace recal::testing
