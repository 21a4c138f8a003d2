#include "tests/test_util.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace recal::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(base != nullptr && *base != '\0' ? base : "/tmp", "/recal_test_XXXXXX");
  char* made = ::mkdtemp(templ.data());
  if (made == nullptr) ADD_FAILURE() << "mkdtemp failed for " << templ;
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::File(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

std::vector<std::string> TempDir::List() const {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(path_)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

void WriteBytes(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int RunPython(const std::string& script, const std::string& dir) {
  const std::string script_path = absl::StrCat(dir, "/make.py");
  WriteBytes(script_path, script);
  const std::string cmd = absl::StrCat(RECAL_PYTHON, " ", script_path, " ", dir);
  const int rc = std::system(cmd.c_str());
  std::remove(script_path.c_str());
  return rc;
}

int RunFixturesPython(const std::string& script, const std::string& dir) {
  return RunPython(absl::StrCat("import sys\nsys.path.insert(0, '", RECAL_TEST_FIXTURES_SOURCE_DIR, "')\n", script), dir);
}

int MakeImageFolders(const std::string& dir) {
  return RunFixturesPython("import image_folders\nimage_folders.make(sys.argv[1])\n", dir);
}

std::string NpyFile(absl::string_view dict, absl::string_view data, int major_version) {
  const size_t prefix = major_version == 1 ? 10 : 12;
  std::string header(dict);
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(major_version);
  out += '\0';
  const size_t len = header.size();
  for (size_t i = 0; i < prefix - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  return absl::StrCat(out, header, data);
}

Result RunBinary(const std::string& binary, const std::vector<std::string>& args,
                 const std::vector<std::string>& env) {
  TempDir io;
  const std::string out_path = io.File("out"), err_path = io.File("err");
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::unsetenv("RECAL_SERVER");
    ::unsetenv("RECAL_TOKEN");
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    std::vector<char*> raw;
    for (std::string& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    ::execvp(raw[0], raw.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Result result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadBytes(out_path);
  result.err = ReadBytes(err_path);
  return result;
}

}  // namespace recal::testing
