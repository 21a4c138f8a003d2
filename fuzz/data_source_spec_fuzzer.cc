// The API's data source (recal.v1.DataSource, part of SubmitJob) -> the data a job runs
// with: server/jobs/resolved_data_source.cc (ResolveDataSource: field checks, the path
// resolved under the data roots) and common/data_source.cc (DataSpecOfSource, the
// field-for-field mapping the worker and the client share). The input is a serialized
// DataSource message.
//
// Contract: a malformed source is INVALID_ARGUMENT (PERMISSION_DENIED, NOT_FOUND for paths)
// with a message; an accepted one stands for the message field for field (but its path), its
// spec spelled as text parses back to the same spec (common/data_spec.cc: what reports show
// and recal-run reads), and its path lies under a data root (no "..", absolute path or
// symbolic link leads out).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "absl/strings/match.h"
#include "common/data_source.h"
#include "common/data_spec.h"
#include "fuzz/fuzz_util.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/resolved_data_source.h"

namespace {

namespace fs = std::filesystem;
using recal::data::DataSpec;

// <scratch>/root{,2}: the data roots, with a file of each kind, an image folder and links,
// one of them out to <scratch>/outside, which no accepted spec may name.
struct Roots {
  std::vector<std::string> roots;
  std::vector<std::string> canonical;
};

const Roots& TheRoots() {
  static const Roots roots = [] {
    const std::string base = recal::fuzz::ScratchDir();
    for (const char* dir : {"root/images/sub", "root2/more", "outside/images"}) fs::create_directories(base + "/" + dir);
    for (const char* file : {"root/x.npy", "root/x.safetensors", "root/x.pt", "root/images/a.png",
                             "root2/y.npy", "outside/secret.npy", "outside/images/b.png"}) {
      recal::fuzz::WriteFileOrDie(base + "/" + file, "x");
    }
    std::error_code ignored;
    fs::create_directory_symlink(base + "/outside", base + "/root/out", ignored);
    fs::create_symlink(base + "/outside/secret.npy", base + "/root/secret.npy", ignored);
    fs::create_directory_symlink("images", base + "/root/pics", ignored);
    Roots r;
    r.roots = {base + "/root", base + "/root2/"};
    for (const std::string& root : r.roots) r.canonical.push_back(fs::canonical(root).string());
    return r;
  }();
  return roots;
}

bool UnderARoot(const std::string& path) {
  for (const std::string& root : TheRoots().canonical) {
    if (path == root || absl::StartsWith(path, root + "/")) return true;
  }
  return false;
}

bool SameExceptPath(const DataSpec& a, const DataSpec& b) {
  const bool seed_matters = a.scheme == DataSpec::Scheme::kSynthetic || a.shuffle;
  return a.scheme == b.scheme && a.keys == b.keys && a.sample_shape == b.sample_shape &&
         (!seed_matters || a.seed == b.seed) && a.resize == b.resize && a.crop == b.crop && a.mean == b.mean &&
         a.std == b.std && a.scale == b.scale && a.samples == b.samples && a.shuffle == b.shuffle &&
         a.skip_bad == b.skip_bad;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // no line per string field with invalid UTF-8
  TheRoots();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  recal::v1::DataSource source;
  if (!source.ParseFromArray(data, static_cast<int>(size))) return 0;  // gRPC would not deliver it

  // The mapping alone, as the client uses it to show a job's source: any message.
  const std::optional<DataSpec> mapped = recal::data::DataSpecOfSource(source);
  if (mapped) {
    FUZZ_CHECK(source.has_tensor_file() || source.has_image_folder() || source.has_synthetic(), "a spec of nothing");
    (void)recal::data::DataSpecToString(*mapped);
  }

  auto resolved = recal::jobs::ResolveDataSource(source, TheRoots().roots);
  if (!resolved.ok()) {
    recal::fuzz::CheckRefusal(resolved.status(), "ResolveDataSource");
    const absl::StatusCode code = resolved.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kPermissionDenied ||
                   code == absl::StatusCode::kNotFound,
               "unexpected code: ", resolved.status().ToString());
    return 0;
  }
  if (source.has_client_stream()) {
    FUZZ_CHECK(resolved->has_client_stream(), "a client stream resolved to another source");
    return 0;
  }
  FUZZ_CHECK(mapped.has_value(), "an accepted source that maps to no spec");
  const std::optional<DataSpec> typed = recal::data::DataSpecOfSource(*resolved);
  FUZZ_CHECK(typed.has_value(), "a resolved source that maps to no spec");
  const std::string spec = recal::data::DataSpecToString(*typed);
  FUZZ_CHECK(SameExceptPath(*mapped, *typed), "spec '", spec, "' does not stand for the message");
  auto parsed = recal::data::ParseDataSpec(spec);
  FUZZ_CHECK(parsed.ok(), "an accepted source's spec '", spec, "' does not parse: ", parsed.status().ToString());
  FUZZ_CHECK(SameExceptPath(*typed, *parsed) && typed->path == parsed->path, "spec '", spec,
             "' parses to another spec");
  FUZZ_CHECK(recal::data::DataSpecToString(*parsed) == spec, "spec '", spec, "' is not canonical");
  if (!source.has_synthetic()) {
    FUZZ_CHECK(UnderARoot(parsed->path), "spec '", spec, "' names a path outside the data roots");
    std::error_code error;
    const fs::path real = fs::canonical(parsed->path, error);
    FUZZ_CHECK(!error && UnderARoot(real.string()), "spec '", spec, "' leads outside the data roots");
  }
  return 0;
}
