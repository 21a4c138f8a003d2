// ResolveDataSource: a job's DataSource checked and its path resolved under the data roots.
// Each resolved source is compared as the spec it stands for (DataSpecOfSource, as the worker
// opens it), spelled as text and parsed back (as reports show it and recal-run reads it),
// which must give the same spec.
#include "server/jobs/resolved_data_source.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/data_source.h"
#include "common/data_spec.h"
#include "common/status_macros.h"
#include "tests/test_util.h"

namespace recal::jobs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using data::DataSpec;
namespace fs = std::filesystem;

constexpr char kClientStreamSpec[] = "client_stream";

// The resolved source as a spec's text; kClientStreamSpec for a client stream.
absl::StatusOr<std::string> DataSpecFor(const v1::DataSource& source, const std::vector<std::string>& roots) {
  RECAL_ASSIGN_OR_RETURN(const v1::DataSource resolved, ResolveDataSource(source, roots));
  if (resolved.has_client_stream()) return std::string(kClientStreamSpec);
  const std::optional<DataSpec> spec = data::DataSpecOfSource(resolved);
  if (!spec) return absl::InternalError("a resolved source that maps to no spec");
  return data::DataSpecToString(*spec);
}

class ResolvedDataSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::canonical(tmp_.path()).string() + "/root";
    fs::create_directories(root_ + "/images/nested");
    testing::WriteBytes(root_ + "/x.npy", "not parsed here");
    testing::WriteBytes(root_ + "/x.safetensors", "not parsed here");
    testing::WriteBytes(tmp_.File("outside.npy"), "not parsed here");
    fs::create_directories(tmp_.File("outside_images"));
  }

  // The resolved source's spec, parsed back from its text; fails the test on an error.
  DataSpec Parsed(const v1::DataSource& source) {
    absl::StatusOr<std::string> text = DataSpecFor(source, {root_});
    EXPECT_TRUE(text.ok()) << text.status();
    if (!text.ok()) return {};
    absl::StatusOr<DataSpec> parsed = data::ParseDataSpec(*text);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    if (!parsed.ok()) return {};
    EXPECT_EQ(data::DataSpecToString(*parsed), *text) << "the spec is canonical";
    return *parsed;
  }
  absl::Status Error(const v1::DataSource& source) { return DataSpecFor(source, {root_}).status(); }

  testing::TempDir tmp_;
  std::string root_;
};

v1::DataSource TensorFile(v1::TensorFileSource::Format format, const std::string& path) {
  v1::DataSource source;
  source.mutable_tensor_file()->set_format(format);
  source.mutable_tensor_file()->set_path(path);
  return source;
}

// A valid image folder: resize 36, crop 32, ImageNet's mean and std.
v1::DataSource ImageFolder(const std::string& path) {
  v1::DataSource source;
  v1::ImageFolderSource* folder = source.mutable_image_folder();
  folder->set_path(path);
  folder->set_resize(36);
  folder->set_crop(32);
  for (float m : {0.485f, 0.456f, 0.406f}) folder->add_mean(m);
  for (float s : {0.229f, 0.224f, 0.225f}) folder->add_std(s);
  return source;
}

TEST_F(ResolvedDataSourceTest, TensorFilesResolveUnderTheRoots) {
  DataSpec npy = Parsed(TensorFile(v1::TensorFileSource::NPY, "x.npy"));
  EXPECT_EQ(npy.scheme, DataSpec::Scheme::kNpy);
  EXPECT_EQ(npy.path, root_ + "/x.npy");
  EXPECT_EQ(npy.scale, 0);
  EXPECT_TRUE(npy.mean.empty());
  EXPECT_EQ(*DataSpecFor(TensorFile(v1::TensorFileSource::NPY, "x.npy"), {root_}), "npy:" + root_ + "/x.npy");

  DataSpec torch = Parsed(TensorFile(v1::TensorFileSource::TORCH, root_ + "/x.npy"));
  EXPECT_EQ(torch.scheme, DataSpec::Scheme::kTorch);
  EXPECT_EQ(torch.path, root_ + "/x.npy");

  v1::DataSource safetensors = TensorFile(v1::TensorFileSource::SAFETENSORS, "x.safetensors");
  DataSpec all = Parsed(safetensors);
  EXPECT_EQ(all.scheme, DataSpec::Scheme::kSafetensors);
  EXPECT_TRUE(all.keys.empty());
  safetensors.mutable_tensor_file()->add_keys("images");
  safetensors.mutable_tensor_file()->add_keys("what?");
  DataSpec two = Parsed(safetensors);
  EXPECT_EQ(two.path, root_ + "/x.safetensors");
  EXPECT_THAT(two.keys, ElementsAre("images", "what?"));
}

TEST_F(ResolvedDataSourceTest, TensorFileNormalizationIsCarriedExactly) {
  v1::DataSource source = TensorFile(v1::TensorFileSource::SAFETENSORS, "x.safetensors");
  v1::TensorFileSource* file = source.mutable_tensor_file();
  file->add_keys("pixels");
  file->set_scale(255);
  for (float m : {0.485f, 0.456f, 0.406f}) file->add_mean(m);
  for (float s : {0.229f, 0.224f, 0.1234567f}) file->add_std(s);
  EXPECT_EQ(*DataSpecFor(source, {root_}),
            "safetensors:" + root_ + "/x.safetensors:pixels?scale=255&mean=0.485,0.456,0.406&std=0.229,0.224,0.1234567");
  DataSpec parsed = Parsed(source);
  EXPECT_EQ(parsed.scale, 255);
  EXPECT_THAT(parsed.mean, ElementsAre(0.485, 0.456, 0.406));
  EXPECT_THAT(parsed.std, ElementsAre(0.229, 0.224, 0.1234567));
  // Each reads back as the float that was sent.
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(static_cast<float>(parsed.mean[c]), file->mean(c));
    EXPECT_EQ(static_cast<float>(parsed.std[c]), file->std(c));
  }

  // The scale alone (uint8 to [0, 1]); or mean and std alone.
  v1::DataSource scaled = TensorFile(v1::TensorFileSource::NPY, "x.npy");
  scaled.mutable_tensor_file()->set_scale(255);
  EXPECT_EQ(*DataSpecFor(scaled, {root_}), "npy:" + root_ + "/x.npy?scale=255");
  v1::DataSource standardised = TensorFile(v1::TensorFileSource::TORCH, "x.npy");
  standardised.mutable_tensor_file()->add_mean(-0.5f);
  standardised.mutable_tensor_file()->add_std(2);
  DataSpec one_channel = Parsed(standardised);
  EXPECT_EQ(one_channel.scale, 0);
  EXPECT_THAT(one_channel.mean, ElementsAre(-0.5));
  EXPECT_THAT(one_channel.std, ElementsAre(2));
}

TEST_F(ResolvedDataSourceTest, PathsWithQuestionMarksAndColonsRoundTrip) {
  const std::string odd = root_ + "/odd?name:x.npy";
  testing::WriteBytes(odd, "not parsed here");
  for (auto format : {v1::TensorFileSource::NPY, v1::TensorFileSource::SAFETENSORS, v1::TensorFileSource::TORCH}) {
    v1::DataSource source = TensorFile(format, "odd?name:x.npy");
    EXPECT_EQ(Parsed(source).path, odd) << v1::TensorFileSource::Format_Name(format);
    source.mutable_tensor_file()->set_scale(2);
    DataSpec scaled = Parsed(source);
    EXPECT_EQ(scaled.path, odd);
    EXPECT_EQ(scaled.scale, 2);
  }
  // images: the options start at the last '?', and there always are options.
  const std::string folder = root_ + "/what?folder:a=1&b";
  fs::create_directories(folder);
  DataSpec images = Parsed(ImageFolder("what?folder:a=1&b"));
  EXPECT_EQ(images.path, folder);
  EXPECT_EQ(images.resize, 36);
}

TEST_F(ResolvedDataSourceTest, BadTensorFilesAreRefusedNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(v1::TensorFileSource&)> change;
    absl::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no format", [](auto& f) { f.set_format(v1::TensorFileSource::FORMAT_UNSPECIFIED); },
       absl::StatusCode::kInvalidArgument, "tensor_file.format"},
      {"keys of an npy file", [](auto& f) { f.add_keys("a"); }, absl::StatusCode::kInvalidArgument,
       "tensor_file.keys"},
      {"negative scale", [](auto& f) { f.set_scale(-1); }, absl::StatusCode::kInvalidArgument,
       "tensor_file.scale"},
      {"infinite scale", [](auto& f) { f.set_scale(std::numeric_limits<float>::infinity()); },
       absl::StatusCode::kInvalidArgument, "tensor_file.scale"},
      {"mean without std", [](auto& f) { f.add_mean(0.5f); }, absl::StatusCode::kInvalidArgument,
       "tensor_file.mean has 1 values and tensor_file.std 0"},
      {"zero std",
       [](auto& f) {
         f.add_mean(0.5f);
         f.add_std(0);
       },
       absl::StatusCode::kInvalidArgument, "tensor_file.std[0] is 0"},
      {"NaN mean",
       [](auto& f) {
         f.add_mean(std::nanf(""));
         f.add_std(1);
       },
       absl::StatusCode::kInvalidArgument, "tensor_file.mean[0]"},
      {"outside the roots", [](auto& f) { f.set_path("../outside.npy"); }, absl::StatusCode::kPermissionDenied,
       "outside"},
      {"missing", [](auto& f) { f.set_path("missing.npy"); }, absl::StatusCode::kNotFound, "missing.npy"},
  };
  for (const Case& c : cases) {
    v1::DataSource source = TensorFile(v1::TensorFileSource::NPY, "x.npy");
    c.change(*source.mutable_tensor_file());
    const absl::Status status = Error(source);
    EXPECT_EQ(status.code(), c.code) << c.what << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what;
  }
  for (const char* key : {"", "a,b", "a:b"}) {
    v1::DataSource source = TensorFile(v1::TensorFileSource::SAFETENSORS, "x.safetensors");
    source.mutable_tensor_file()->add_keys(key);
    const absl::Status status = Error(source);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(status.message(), HasSubstr("tensor_file.keys")) << key;
  }
}

TEST_F(ResolvedDataSourceTest, ImageFoldersCarryTheTransformAndTheirOptions) {
  DataSpec plain = Parsed(ImageFolder("images"));
  EXPECT_EQ(plain.scheme, DataSpec::Scheme::kImages);
  EXPECT_EQ(plain.path, root_ + "/images");
  EXPECT_EQ(plain.resize, 36);
  EXPECT_EQ(plain.crop, 32);
  EXPECT_THAT(plain.mean, ElementsAre(0.485, 0.456, 0.406));
  EXPECT_THAT(plain.std, ElementsAre(0.229, 0.224, 0.225));
  EXPECT_EQ(plain.samples, -1) << "samples 0 means all";
  EXPECT_FALSE(plain.shuffle);
  EXPECT_FALSE(plain.skip_bad) << "ON_BAD_UNSPECIFIED fails";
  EXPECT_EQ(*DataSpecFor(ImageFolder("images"), {root_}),
            "images:" + root_ + "/images?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225");

  v1::DataSource source = ImageFolder(root_ + "/images/nested");
  v1::ImageFolderSource* folder = source.mutable_image_folder();
  folder->set_samples(7);
  folder->set_shuffle(true);
  folder->set_seed(std::numeric_limits<uint64_t>::max());
  folder->set_on_bad(v1::ImageFolderSource::SKIP);
  DataSpec all = Parsed(source);
  EXPECT_EQ(all.path, root_ + "/images/nested");
  EXPECT_EQ(all.samples, 7);
  EXPECT_TRUE(all.shuffle);
  EXPECT_EQ(all.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(all.skip_bad);
  folder->set_on_bad(v1::ImageFolderSource::FAIL);
  EXPECT_FALSE(Parsed(source).skip_bad);
  // resize == crop, and the largest sides the data layer takes.
  folder->set_resize(65536);
  folder->set_crop(65536);
  EXPECT_EQ(Parsed(source).crop, 65536);
}

TEST_F(ResolvedDataSourceTest, BadImageFoldersAreRefusedNamingTheField) {
  fs::create_symlink(tmp_.File("outside_images"), root_ + "/escape");
  struct Case {
    const char* what;
    std::function<void(v1::ImageFolderSource&)> change;
    absl::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"negative resize", [](auto& f) { f.set_resize(-1); }, absl::StatusCode::kInvalidArgument,
       "image_folder.resize is -1"},
      {"resize too large", [](auto& f) { f.set_resize(65537); }, absl::StatusCode::kInvalidArgument,
       "image_folder.resize is 65537"},
      {"negative crop", [](auto& f) { f.set_crop(-1); }, absl::StatusCode::kInvalidArgument, "image_folder.crop is -1"},
      {"crop > resize", [](auto& f) { f.set_crop(37); }, absl::StatusCode::kInvalidArgument,
       "image_folder.crop is 37; it must be in 1..resize (36)"},
      {"2 means", [](auto& f) { f.mutable_mean()->RemoveLast(); }, absl::StatusCode::kInvalidArgument,
       "got 2 and 3"},
      {"4 std", [](auto& f) { f.add_std(1); }, absl::StatusCode::kInvalidArgument, "got 3 and 4"},
      {"zero std", [](auto& f) { f.set_std(1, 0); }, absl::StatusCode::kInvalidArgument, "image_folder.std[1] is 0"},
      {"negative std", [](auto& f) { f.set_std(2, -1); }, absl::StatusCode::kInvalidArgument,
       "image_folder.std[2] is -1"},
      {"infinite mean", [](auto& f) { f.set_mean(0, std::numeric_limits<float>::infinity()); },
       absl::StatusCode::kInvalidArgument, "image_folder.mean[0]"},
      {"negative samples", [](auto& f) { f.set_samples(-1); }, absl::StatusCode::kInvalidArgument,
       "image_folder.samples is -1"},
      {"unknown on_bad", [](auto& f) { f.set_on_bad(static_cast<v1::ImageFolderSource::OnBad>(7)); },
       absl::StatusCode::kInvalidArgument, "image_folder.on_bad is 7"},
      {"a file", [](auto& f) { f.set_path("x.npy"); }, absl::StatusCode::kInvalidArgument,
       "image_folder.path x.npy is not a directory"},
      {"missing", [](auto& f) { f.set_path("no_such_folder"); }, absl::StatusCode::kNotFound, "no_such_folder"},
      {"outside the roots", [](auto& f) { f.set_path("../outside_images"); },
       absl::StatusCode::kPermissionDenied, "outside the server's data roots"},
      {"a link out of the roots", [](auto& f) { f.set_path("escape"); }, absl::StatusCode::kPermissionDenied,
       "outside the server's data roots"},
      {"empty path", [](auto& f) { f.clear_path(); }, absl::StatusCode::kInvalidArgument, "empty"},
  };
  for (const Case& c : cases) {
    v1::DataSource source = ImageFolder("images");
    c.change(*source.mutable_image_folder());
    const absl::Status status = Error(source);
    EXPECT_EQ(status.code(), c.code) << c.what << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what << ": " << status;
  }
  // The fields are checked before the path: a malformed source is refused as such anywhere.
  v1::DataSource both = ImageFolder("/etc");
  both.mutable_image_folder()->set_crop(-1);
  EXPECT_EQ(Error(both).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Error(ImageFolder("/etc")).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(DataSpecFor(ImageFolder("images"), {}).status().code(), absl::StatusCode::kPermissionDenied)
      << "no data roots: nothing is served";
}

TEST_F(ResolvedDataSourceTest, AnImageFolderLeavingTheTransformUnsetGetsImageNets) {
  v1::DataSource source = ImageFolder("images");
  v1::ImageFolderSource& folder = *source.mutable_image_folder();
  folder.clear_resize();
  folder.clear_crop();
  folder.clear_mean();
  folder.clear_std();
  const DataSpec spec = Parsed(source);
  EXPECT_EQ(spec.resize, 256);
  EXPECT_EQ(spec.crop, 224);
  EXPECT_THAT(spec.mean, ElementsAre(0.485, 0.456, 0.406));
  EXPECT_THAT(spec.std, ElementsAre(0.229, 0.224, 0.225));
  folder.set_resize(36);  // a resize alone crops 224/256 of it
  EXPECT_EQ(Parsed(source).crop, 31);
  // A crop alone beyond the largest side is refused as the crop (and never multiplied).
  folder.clear_resize();
  folder.set_crop(int64_t{1} << 62);
  EXPECT_THAT(Error(source).message(), HasSubstr("image_folder.crop is 4611686018427387904"));
}

TEST_F(ResolvedDataSourceTest, SyntheticClientStreamAndNothing) {
  v1::DataSource source;
  for (int64_t d : {3, 8, 8}) source.mutable_synthetic()->add_sample_shape(d);
  source.mutable_synthetic()->set_seed(-1);
  DataSpec synthetic = Parsed(source);
  EXPECT_EQ(synthetic.scheme, DataSpec::Scheme::kSynthetic);
  EXPECT_THAT(synthetic.sample_shape, ElementsAre(3, 8, 8));
  EXPECT_EQ(synthetic.seed, std::numeric_limits<uint64_t>::max()) << "int64 -1 is the seed 2^64-1 bit for bit";

  source.mutable_synthetic()->set_sample_shape(0, 0);
  EXPECT_EQ(Error(source).code(), absl::StatusCode::kInvalidArgument);
  source.mutable_synthetic()->clear_sample_shape();
  EXPECT_EQ(Error(source).code(), absl::StatusCode::kInvalidArgument);
  // What the data layer would refuse when the job runs is refused at submit.
  for (int64_t d : {65536, 65536}) source.mutable_synthetic()->add_sample_shape(d);
  const absl::Status huge = Error(source);
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.message(), HasSubstr("2^31"));

  v1::DataSource stream;
  stream.mutable_client_stream()->set_scale(255);
  EXPECT_EQ(*DataSpecFor(stream, {root_}), kClientStreamSpec);
  EXPECT_EQ(Error(v1::DataSource()).code(), absl::StatusCode::kInvalidArgument);
}

// A client stream's normalisation is refused at submit, as a tensor file's is: not after the
// client has pushed its first batch into a job that can only divide by zero.
TEST_F(ResolvedDataSourceTest, BadClientStreamNormalisationIsRefusedAtSubmit) {
  struct Case {
    const char* what;
    std::function<void(v1::ClientStreamSource&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"zero std", [](auto& c) { c.add_mean(0.5f); c.add_std(0); }, "client_stream.std[0] is 0"},
      {"negative std", [](auto& c) { c.add_mean(0.5f); c.add_std(-1); }, "client_stream.std[0] is -1"},
      {"infinite mean", [](auto& c) { c.add_mean(std::numeric_limits<float>::infinity()); c.add_std(1); },
       "client_stream.mean[0]"},
      {"std without mean", [](auto& c) { c.add_std(1); }, "client_stream.mean has 0 values and client_stream.std 1"},
      {"negative scale", [](auto& c) { c.set_scale(-255); }, "client_stream.scale is -255"},
      {"NaN scale", [](auto& c) { c.set_scale(std::nanf("")); }, "client_stream.scale"},
  };
  for (const Case& c : cases) {
    v1::DataSource source;
    c.change(*source.mutable_client_stream());
    const absl::Status status = Error(source);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.what;
  }
  v1::DataSource good;
  for (float v : {0.485f, 0.456f, 0.406f}) good.mutable_client_stream()->add_mean(v);
  for (float v : {0.229f, 0.224f, 0.225f}) good.mutable_client_stream()->add_std(v);
  EXPECT_EQ(*DataSpecFor(good, {root_}), kClientStreamSpec);
}

TEST(DataRootsTest, SharedRootsAreEveryTenantsAndTenantRootsOnlyTheirOwn) {
  DataRoots roots;
  roots.Add("/shared,/more");
  roots.Add("team-a=/a-only");
  roots.Add("/x=y");  // not a tenant before '=': a path with '=' in it
  EXPECT_EQ(roots.For("team-a"), (std::vector<std::string>{"/shared", "/more", "/x=y", "/a-only"}));
  EXPECT_EQ(roots.For("team-b"), (std::vector<std::string>{"/shared", "/more", "/x=y"}));
  EXPECT_EQ(roots.All().size(), 4u);
}

}  // namespace
}  // namespace recal::jobs
