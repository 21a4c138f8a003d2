// recalctl's command line: COMMAND [POSITIONAL...] with flags anywhere after the program
// name, as --name=value, --name value, -o value (the short forms are aliases), or --flag
// for booleans (also --flag=true / --flag=false). "--" ends the flags.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recal::ctl {

class Args {
 public:
  // INVALID_ARGUMENT for an unknown flag, a missing value or a value given to a boolean.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv);

  const std::string& command() const { return command_; }
  const std::vector<std::string>& positional() const { return positional_; }

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The last value given (flags may repeat; the last one wins), or `fallback`.
  std::string Get(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> GetAll(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  // KEY=VALUE pairs of a repeated flag (--label team=vision).
  absl::StatusOr<std::map<std::string, std::string>> GetPairs(const std::string& name) const;

  // INVALID_ARGUMENT naming the first flag given that is neither global nor in `allowed`.
  absl::Status AllowOnly(const std::vector<std::string>& allowed) const;
  // INVALID_ARGUMENT unless exactly `count` positional arguments follow the command.
  absl::Status ExpectPositional(size_t count, const std::string& what) const;

 private:
  std::string command_;
  std::vector<std::string> positional_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> order_;  // flag names as given, for AllowOnly's message
};

}  // namespace recal::ctl
