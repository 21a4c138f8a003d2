#include "client/recalctl/args.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/nearest_name.h"

namespace recal::ctl {
namespace {

struct FlagInfo {
  const char* name;
  bool has_value;
};

// Every flag of every command. A flag means the same (and takes a value or not) in every
// command, so one table parses them all; AllowOnly then checks the command takes it.
constexpr FlagInfo kFlags[] = {
    // global
    {"server", true},
    {"token", true},
    {"output", true},
    {"tls", false},
    {"tls_ca", true},
    {"tls_cert", true},
    {"tls_key", true},
    {"tls_server_name", true},
    {"deadline", true},
    {"quiet", false},
    {"help", false},
    {"version", false},
    // upload / run
    {"name", true},
    {"label", true},
    // submit / run
    {"model", true},
    {"data", true},
    {"stream", false},
    {"batch_size", true},
    {"max_batches", true},
    {"estimator", true},
    {"modules", true},
    {"include", true},
    {"exclude", true},
    {"target_rel_error", true},
    {"allow_short_data", false},
    {"priority", true},
    {"shards", true},
    {"compute_dtype", true},
    {"memory_format", true},
    {"iterations", true},
    {"fold_batch_norm", false},
    {"timeout", true},
    {"scale", true},
    {"mean", true},
    {"std", true},
    {"request_id", true},
    {"out", true},
    {"bn_out", true},
    {"folded_out", true},
    {"report", true},
    // report
    {"top", true},
    {"all", false},
    {"from", true},
    {"html", true},
    {"warn_rel_error", true},
    // list / watch / download / health
    {"state", true},
    {"page_size", true},
    {"page_token", true},
    {"models", false},
    {"after_seq", true},
    {"artifact", true},
    {"service", true},
    // token new
    {"tenant", true},
    {"role", true},
};

constexpr const char* kGlobal[] = {"server",  "token",           "output",   "tls",   "tls_ca", "tls_cert",
                                   "tls_key", "tls_server_name", "deadline", "quiet", "help", "version"};

const FlagInfo* Find(const std::string& name) {
  for (const FlagInfo& flag : kFlags) {
    if (name == flag.name) return &flag;
  }
  return nullptr;
}

std::string Alias(const std::string& name) {
  if (name == "o") return "out";
  if (name == "q") return "quiet";
  if (name == "h") return "help";
  return name;
}

}  // namespace

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv) {
  Args args;
  bool flags_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      if (args.command_.empty()) {
        args.command_ = arg;
      } else {
        args.positional_.push_back(arg);
      }
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    const std::string body = arg.substr(absl::StartsWith(arg, "--") ? 2 : 1);
    const size_t eq = body.find('=');
    const std::string name = Alias(body.substr(0, eq));
    const FlagInfo* flag = Find(name);
    if (flag == nullptr) {
      std::vector<std::string> names;
      for (const FlagInfo& known : kFlags) names.emplace_back(known.name);
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '", arg, "'", DidYouMean(body.substr(0, eq), names, "--")));
    }
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
      if (!flag->has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value (or true / false)"));
      }
    } else if (flag->has_value) {
      if (i + 1 >= argv.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    } else {
      value = "true";
    }
    args.values_[name].push_back(value);
    args.order_.push_back(name);
  }
  return args;
}

std::string Args::Get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> Args::GetAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

bool Args::GetBool(const std::string& name) const { return Get(name, "false") == "true"; }

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t fallback) const {
  if (!Has(name)) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(Get(name), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be an integer, not '", Get(name), "'"));
  }
  return value;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double fallback) const {
  if (!Has(name)) return fallback;
  double value = 0;
  if (!absl::SimpleAtod(Get(name), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " must be a number, not '", Get(name), "'"));
  }
  return value;
}

absl::StatusOr<std::map<std::string, std::string>> Args::GetPairs(const std::string& name) const {
  std::map<std::string, std::string> pairs;
  for (const std::string& item : GetAll(name)) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " takes KEY=VALUE, not '", item, "'"));
    }
    pairs[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return pairs;
}

absl::Status Args::AllowOnly(const std::vector<std::string>& allowed) const {
  for (const std::string& name : order_) {
    const bool global = std::find(std::begin(kGlobal), std::end(kGlobal), name) != std::end(kGlobal);
    if (!global && std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat("'", command_, "' takes no --", name));
    }
  }
  return absl::OkStatus();
}

absl::Status Args::ExpectPositional(size_t count, const std::string& what) const {
  if (positional_.size() == count) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("'", command_, "' takes ", what, " (got ",
                                                 positional_.size(), " argument",
                                                 positional_.size() == 1 ? "" : "s", ")"));
}

}  // namespace recal::ctl
