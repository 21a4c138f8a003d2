#include "common/command_line.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/nearest_name.h"
#include "common/version.h"

namespace recal {
namespace {

// Abseil's own flags (--flagfile, --undefok, ...) are not the binary's options.
bool IsOwnFlag(const absl::CommandLineFlag& flag) {
  return !flag.IsRetired() && !absl::StrContains(flag.Filename(), "absl/");
}

std::vector<absl::CommandLineFlag*> OwnFlags() {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (IsOwnFlag(*flag)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](auto* a, auto* b) { return a->Name() < b->Name(); });
  return flags;
}

void PrintHelp(absl::string_view usage) {
  std::cout << usage << "\n\nflags:\n";
  for (const absl::CommandLineFlag* flag : OwnFlags()) {
    std::string value = flag->DefaultValue();
    if (flag->IsOfType<std::string>()) value = absl::StrCat("\"", value, "\"");
    std::cout << "  --" << flag->Name() << "=" << value << "\n      " << flag->Help() << "\n";
  }
  std::cout << "\n  --help      this list\n  --version   the version and the LibTorch of the build\n";
}

// The flag `name` (of "--name=value", "-name") sets, or nullptr; "noname" sets a bool flag
// false.
const absl::CommandLineFlag* Find(absl::string_view name) {
  if (const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name); flag != nullptr && !flag->IsRetired()) {
    return flag;
  }
  if (!absl::ConsumePrefix(&name, "no")) return nullptr;
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  return flag != nullptr && flag->IsOfType<bool>() ? flag : nullptr;
}

}  // namespace

std::vector<char*> ParseCommandLineOrExit(int argc, char** argv, absl::string_view program, absl::string_view usage,
                                          absl::string_view build) {
  absl::SetProgramUsageMessage(usage);
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    const absl::string_view name = arg.substr(0, arg.find('='));
    if (name == "help" || name == "helpfull" || name == "helpshort" || name == "h") {
      PrintHelp(usage);
      std::exit(0);
    }
    if (name == "version") {
      std::cout << program << " " << Version() << " (LibTorch " << LibTorchVersion() << ")\n";
      if (!build.empty()) std::cout << build << "\n";
      std::exit(0);
    }
    if (const absl::CommandLineFlag* flag = Find(name); flag != nullptr) {
      if (arg.find('=') == absl::string_view::npos && !flag->IsOfType<bool>()) ++i;  // "--flag value"
      continue;
    }
    std::vector<std::string> names;
    for (const absl::CommandLineFlag* flag : OwnFlags()) names.emplace_back(flag->Name());
    std::cerr << program << ": unknown flag --" << name << DidYouMean(name, names, "--")
              << " (--help lists every flag)\n";
    std::exit(2);
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace recal
