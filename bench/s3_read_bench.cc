// Reading a tensor file in batches from a bucket vs from local disk, in one process,
// repetitions interleaved, medians reported. The file (an .npy of --mib MiB) is read
// through OpenBatchSource as a job reads it:
//   local, source       OpenNpySource(path): narrowed out of the mapping, one copy a batch
//   local, pre-seam     npy_source.cc as it was before the reader seam, inline (MappedFile
//                       + from_blob + MakeSlicedSource): the seam's cost, if any
//   local, pipeline     OpenBatchSource("npy:PATH") without read-ahead, as recal-run reads
//   s3, prefetch 0      npy:s3://bench/x.npy from moto_server on loopback: one ranged GET
//                       per batch, nothing ahead
//   s3, prefetch 2      the same with the pipeline's read-ahead thread (what jobs use)
// The local file is in the page cache (it was just written and read): this is the cost of
// the path, not of a disk. moto_server is Python: a real S3 endpoint (or MinIO) serves far
// faster; the ratio bounds how much a slow endpoint costs, and the GET count is exact.
//
//   s3_read_bench [--mib 64 --batch_size 64 --reps 5]
// Skipped, saying so, where moto_server is not on PATH.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/median.h"
#include "common/command_line.h"
#include "common/formats/npy.h"
#include "common/mapped_file.h"
#include "server/data/batch_source.h"
#include "server/data_access/object_storage.h"
#include "server/data/sliced_source.h"
#include "server/data/sources.h"
#include "tests/s3/moto_server.h"
#include "tests/test_util.h"

ABSL_FLAG(int64_t, mib, 64, "size of the .npy file, MiB");
ABSL_FLAG(int64_t, batch_size, 64, "samples per batch (a sample is 3x64x64 float32, 48 KiB)");
ABSL_FLAG(int32_t, reps, 5, "interleaved repetitions (rotated: each starts at another row)");

namespace {

using recal::bench::Median;
using recal::data::Batch;
using recal::data::BatchSource;
using recal::data::InputOptions;

constexpr int64_t kSampleFloats = 3 * 64 * 64;

// Drains `source`; the bytes it gave, or an error.
absl::StatusOr<int64_t> Drain(BatchSource& source) {
  int64_t bytes = 0;
  while (true) {
    absl::StatusOr<std::optional<Batch>> next = source.Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return bytes;
    for (const at::Tensor& t : **next) bytes += static_cast<int64_t>(t.nbytes());
  }
}

absl::StatusOr<int64_t> ReadSpec(const std::string& spec, const InputOptions& options) {
  auto source = recal::data::OpenBatchSource(spec, absl::GetFlag(FLAGS_batch_size), options);
  if (!source.ok()) return source.status();
  return Drain(**source);
}

// npy_source.cc as it was before the reader seam, verbatim but for the names: the file
// mapped, the header parsed, a view of the array, MakeSlicedSource over it.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenPreSeam(const std::string& path, int64_t batch_size) {
  absl::StatusOr<std::unique_ptr<recal::data::MappedFile>> file = recal::data::MappedFile::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<recal::formats::NpyHeader> header = recal::formats::ParseNpyFile((*file)->bytes());
  if (!header.ok()) return header.status();
  std::shared_ptr<const recal::data::MappedFile> mapped = *std::move(file);
  std::vector<recal::data::NamedInput> inputs(1);
  inputs[0].name = "the array";
  void* data = const_cast<char*>(mapped->bytes().data() + header->data_offset);
  inputs[0].tensor = at::from_blob(data, header->shape, at::TensorOptions().dtype(at::kFloat));
  return recal::data::MakeSlicedSource("npy:" + path, std::move(inputs), std::move(mapped), batch_size);
}

// The local rows are ~100x faster than the bucket's: each sample repeats them this many
// times, so that a sample is long enough to time on a busy machine.
constexpr int kLocalRepeats = 20;

absl::StatusOr<int64_t> Repeated(const std::function<absl::StatusOr<std::unique_ptr<BatchSource>>()>& open) {
  int64_t bytes = 0;
  for (int i = 0; i < kLocalRepeats; ++i) {
    auto source = open();
    if (!source.ok()) return source.status();
    absl::StatusOr<int64_t> got = Drain(**source);
    if (!got.ok()) return got.status();
    bytes = *got;
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "s3_read_bench", "s3_read_bench: a tensor file read in batches from a bucket (moto_server) vs from local disk");
  const std::string moto_binary = recal::s3::testing::FindOnPath("moto_server");
  if (moto_binary.empty()) {
    std::printf("s3_read_bench: moto_server not installed: skipped\n");
    return 0;
  }
  recal::testing::TempDir dir;
  auto moto = recal::s3::testing::MotoServer::Start(moto_binary, dir.File("moto.log"));
  if (moto == nullptr) {
    std::fprintf(stderr, "moto_server did not start; see %s\n", dir.File("moto.log").c_str());
    return 1;
  }

  const int64_t samples = (absl::GetFlag(FLAGS_mib) << 20) / (kSampleFloats * 4);
  std::vector<float> data(static_cast<size_t>(samples * kSampleFloats));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 9973) * 0.5f;
  const std::string path = dir.File("x.npy");
  recal::testing::WriteBytes(
      path, recal::testing::NpyFile(absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", samples,
                                                 ", 3, 64, 64), }"),
                                    recal::testing::BytesOf(data)));
  data = {};

  recal::s3::S3ClientOptions s3;
  s3.config.endpoint = *recal::s3::ParseEndpoint(moto->endpoint());
  s3.config.credentials = {"AKIAEXAMPLE", "unchecked", ""};
  auto client = recal::s3::S3Client::Create(s3);
  if (!client.ok() || !(*client)->CreateBucket("bench").ok() || !(*client)->UploadFile("bench", "x.npy", path).ok()) {
    std::fprintf(stderr, "cannot upload the file to moto\n");
    return 1;
  }

  struct Way {
    std::string name;
    std::function<absl::StatusOr<int64_t>()> read;
    std::vector<double> seconds;  // per read of the file
    int reads = 1;                // per sample
  };
  InputOptions local{.prefetch_depth = 0};
  InputOptions remote0{.prefetch_depth = 0}, remote2{.prefetch_depth = 2};
  remote0.access.object_storage = remote2.access.object_storage = *recal::data::ConnectBucket(s3);
  const int64_t batch = absl::GetFlag(FLAGS_batch_size);
  std::vector<Way> ways = {
      {"local, source", [&] { return Repeated([&] { return recal::data::OpenNpySource(path, batch); }); }, {}, kLocalRepeats},
      {"local, pre-seam", [&] { return Repeated([&] { return OpenPreSeam(path, batch); }); }, {}, kLocalRepeats},
      {"local, pipeline",
       [&] { return Repeated([&] { return recal::data::OpenBatchSource("npy:" + path, batch, local); }); }, {},
       kLocalRepeats},
      {"s3, prefetch 0", [&] { return ReadSpec("npy:s3://bench/x.npy", remote0); }, {}, 1},
      {"s3, prefetch 2", [&] { return ReadSpec("npy:s3://bench/x.npy", remote2); }, {}, 1},
  };
  const int64_t file_bytes = samples * kSampleFloats * 4;
  for (int rep = -1; rep < absl::GetFlag(FLAGS_reps); ++rep) {  // rep -1: warm-up, not counted
    // Each rep starts at another row: the first row of a rep runs on colder caches.
    for (size_t j = 0; j < ways.size(); ++j) {
      Way& way = ways[(j + static_cast<size_t>(rep + 1)) % ways.size()];
      // A local row right after a bucket row would pay for the allocator's state the bucket
      // rows leave behind (3 MiB batches freed on another thread): one untimed read first.
      if (way.reads > 1 && !way.read().ok()) return 1;
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<int64_t> bytes = way.read();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!bytes.ok() || *bytes != file_bytes) {
        std::fprintf(stderr, "%s: %s\n", way.name.c_str(),
                     bytes.ok() ? absl::StrCat(*bytes, " bytes, not ", file_bytes).c_str()
                                : bytes.status().ToString().c_str());
        return 1;
      }
      if (rep >= 0) way.seconds.push_back(s / way.reads);
    }
  }
  const int64_t batches = (samples + absl::GetFlag(FLAGS_batch_size) - 1) / absl::GetFlag(FLAGS_batch_size);
  const int gets = recal::s3::testing::CountRequests(moto->log(), "GET", "/bench/x.npy");
  std::printf("Reading a %.1f MiB .npy in %lld batches of %lld samples (%.2f MiB each), median of %d\n",
              file_bytes / 1048576.0, static_cast<long long>(batches),
              static_cast<long long>(absl::GetFlag(FLAGS_batch_size)),
              absl::GetFlag(FLAGS_batch_size) * kSampleFloats * 4 / 1048576.0, absl::GetFlag(FLAGS_reps));
  std::printf("%-18s %10s %10s %15s\n", "path", "seconds", "MiB/s", "x local, source");
  const double base = Median(ways[0].seconds);
  for (const Way& way : ways) {
    const double s = Median(way.seconds);
    std::printf("%-18s %10.4f %10.0f %15.2f\n", way.name.c_str(), s, file_bytes / 1048576.0 / s, s / base);
  }
  const int runs = 2 * (absl::GetFlag(FLAGS_reps) + 1);  // the two s3 rows, warm-up included
  std::printf("GETs of the object: %d in %d s3 runs (expected %lld: %lld batches + 1 header read a run)\n", gets, runs,
              static_cast<long long>(runs * (batches + 1)), static_cast<long long>(batches));
  return 0;
}
