// Shared by the client tests: a real recal-server over the fixtures, restartable on the
// same port; running recalctl as a subprocess; the BN-buffer check against the float64
// reference (the only part that needs LibTorch, kept out of this header).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace recal::testing {

inline const std::string kFixtures = RECAL_FIXTURES_DIR;
inline const std::string kModel = kFixtures + "/models/resnet18.traced_eval.pt";
inline const std::string kReference = kFixtures + "/ref/resnet18.population.safetensors";

// Worst relative error of the BatchNorm buffers in the safetensors file `got` against the
// reference file (tests/engine WorstRelativeError); infinity if a key is missing.
double WorstBnError(const std::string& got, const std::string& reference = kReference);

// A port nothing listens on (bound once, then released).
int ClosedPort();

// A recal-server per test, over the fixtures and a root of the test's own.
class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override;
  virtual std::vector<std::string> Flags();
  // Kills the server and starts another on the same data dir and the same port.
  void RestartOnSamePort();
  std::string own_root() const { return tmp_.File("root"); }
  std::string target() const { return server_->target(); }

  TempDir tmp_;
  std::string data_dir_;
  std::unique_ptr<ServerProcess> server_;
};

// Runs build/bin/recalctl with `args` (no shell), RECAL_SERVER / RECAL_TOKEN unset unless
// given in `env` ("NAME=value").
Result Recalctl(const std::vector<std::string>& args, const std::vector<std::string>& env = {});

}  // namespace recal::testing
