// What the fuzz targets (fuzz/*_fuzzer.cc) share: contract checks that abort (libFuzzer
// and the replay driver report an abort as a crash, with the input that caused it), and a
// scratch directory for the targets whose code path reads files. Header-only, so that the
// default build's <target>_replay binaries need nothing but their own .cc file.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace recal::fuzz {

[[noreturn]] inline void ContractViolated(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: fuzz target contract violated: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// FUZZ_CHECK(condition, message parts...): the parts are absl::StrCat arguments.
#define FUZZ_CHECK(cond, ...)                                                                         \
  do {                                                                                                \
    if (!(cond)) ::recal::fuzz::ContractViolated(__FILE__, __LINE__, absl::StrCat("(" #cond ") ", __VA_ARGS__)); \
  } while (0)

// A refusal must say why: a non-OK status with a message.
inline void CheckRefusal(const absl::Status& status, absl::string_view what) {
  FUZZ_CHECK(!status.ok(), what, ": expected an error");
  FUZZ_CHECK(!status.message().empty(), what, ": an error without a message (code ",
             absl::StatusCodeToString(status.code()), ")");
}

// One directory per process, removed at a normal exit: under $RECAL_FUZZ_TMPDIR, else
// /dev/shm (files there cost no disk I/O), else $TMPDIR or /tmp.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::string base;
    if (const char* env = std::getenv("RECAL_FUZZ_TMPDIR"); env != nullptr && *env) {
      base = env;
    } else if (::access("/dev/shm", W_OK) == 0) {
      base = "/dev/shm";
    } else if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp) {
      base = tmp;
    } else {
      base = "/tmp";
    }
    std::string templ = base + "/recal-fuzz-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) {
      std::perror("recal fuzz: mkdtemp");
      std::abort();
    }
    static std::string made = templ;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(made, ignored);
    });
    return templ;
  }();
  return dir;
}

inline void WriteFileOrDie(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "recal fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace recal::fuzz
