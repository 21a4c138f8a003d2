// images:DIR?... — a folder of JPEG/PNG files with torchvision's eval transform
// (ImageFolder + Resize(R) + CenterCrop(C) + ToTensor + Normalize), see image_source.h.
#include "server/data/image_source.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include <ATen/ops/empty.h>
#include <png.h>
#include <turbojpeg.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/data/pil_resample.h"
#include "server/data/torch_error.h"
#include "server/data_access/data_roots.h"
#include "server/data_access/image_files.h"

namespace recal::data {
namespace {

namespace fs = std::filesystem;

// PIL refuses images above twice Image.MAX_IMAGE_PIXELS (decompression bombs).
constexpr int64_t kMaxPixels = 2 * 89478485;

// Read, not memory-mapped like tensor files (common/mapped_file.h): an image on shared
// storage may be replaced while a job runs, and a mapping of a truncated file faults (SIGBUS)
// where a read just fails.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ss.str();
}

// torchvision's Resize(int): the shorter side becomes R, the longer int(R * long / short).
std::pair<int64_t, int64_t> ResizedSize(int64_t h, int64_t w, int64_t r) {
  if (w <= h) return {static_cast<int64_t>(static_cast<double>(r) * h / w), r};
  return {r, static_cast<int64_t>(static_cast<double>(r) * w / h)};
}

absl::StatusOr<RgbImage> DecodeJpeg(const std::string& bytes, int64_t resize, bool dct_scaling,
                               int64_t* orig_h, int64_t* orig_w) {
  tjhandle tj = tjInitDecompress();
  if (tj == nullptr) return absl::ResourceExhaustedError("tjInitDecompress failed");
  struct Closer {
    tjhandle h;
    ~Closer() { tjDestroy(h); }
  } closer{tj};
  auto* buf = reinterpret_cast<const unsigned char*>(bytes.data());
  const unsigned long size = bytes.size();
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, buf, size, &w, &h, &subsamp, &colorspace) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad JPEG header: ", tjGetErrorStr2(tj)));
  }
  if (w < 1 || h < 1 || static_cast<int64_t>(w) * h > kMaxPixels) {
    return absl::InvalidArgumentError(absl::StrCat("JPEG size ", w, "x", h, " out of range"));
  }
  *orig_h = h;
  *orig_w = w;
  // Reduced-size DCT: the smallest n/8 scale whose shorter side is still >= resize.
  int sw = w, sh = h;
  if (dct_scaling) {
    int count = 0;
    tjscalingfactor* factors = tjGetScalingFactors(&count);
    double best = 1.0;
    for (int i = 0; factors != nullptr && i < count; ++i) {
      const tjscalingfactor f = factors[i];
      const double scale = static_cast<double>(f.num) / f.denom;
      if (scale > 1.0 || scale >= best) continue;
      const int tw = TJSCALED(w, f), th = TJSCALED(h, f);
      if (std::min(tw, th) >= resize) {
        best = scale;
        sw = tw;
        sh = th;
      }
    }
  }
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const int channels = cmyk ? 4 : 3;
  std::vector<uint8_t> raw(static_cast<size_t>(sw) * sh * channels);
  if (tjDecompress2(tj, buf, size, raw.data(), sw, 0, sh, cmyk ? TJPF_CMYK : TJPF_RGB, 0) != 0) {
    // Warnings too (e.g. a truncated file); PIL refuses those as well.
    return absl::InvalidArgumentError(absl::StrCat("bad JPEG data: ", tjGetErrorStr2(tj)));
  }
  RgbImage out{sw, sh, {}};
  if (!cmyk) {
    out.pixels = std::move(raw);
    return out;
  }
  // PIL reads Adobe CMYK JPEGs as inverted CMYK (TurboJPEG returns the stored, inverted
  // values) and converts like Pillow 9's cmyk2rgb: r = (255 - k) - c * (255 - k) / 255.
  out.pixels.resize(static_cast<size_t>(sw) * sh * 3);
  for (size_t i = 0, n = static_cast<size_t>(sw) * sh; i < n; ++i) {
    const int nk = raw[4 * i + 3];  // 255 - k
    for (int c = 0; c < 3; ++c) {
      const int cyan = 255 - raw[4 * i + c];
      int t = cyan * nk + 128;
      t = ((t >> 8) + t) >> 8;
      out.pixels[3 * i + c] = static_cast<uint8_t>(std::clamp(nk - t, 0, 255));
    }
  }
  return out;
}

// PNG with libpng's classic API, which applies only the transformations asked for (the
// simplified API converts to sRGB and linearises 16-bit data; PIL does neither). libpng reports
// errors by longjmp out of PngError: the setjmp sits in two small helpers so that the frames it
// unwinds (theirs, libpng's, the callbacks') hold no objects with destructors, and no C++
// exception ever passes through libpng (the callbacks only copy bytes).
struct PngStream {
  const uint8_t* data;
  size_t size, pos;
  char error[160];
};

void PngRead(png_structp png, png_bytep out, size_t n) {
  auto* s = static_cast<PngStream*>(png_get_io_ptr(png));
  if (s->size - s->pos < n) png_error(png, "file is truncated");
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

[[noreturn]] void PngError(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngStream*>(png_get_error_ptr(png));
  std::strncpy(s->error, message, sizeof(s->error) - 1);  // error[] starts zeroed
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}  // PIL never sees what libpng only warns about

// The header, with only the transformation PIL's unpackers do too: 1/2/4-bit samples to a
// byte each (unscaled). No gamma, no tRNS expansion, no 16-bit reduction: see DecodePng.
bool PngReadHeader(png_structp png, png_infop info, int* passes, int* depth) {
  if (setjmp(png_jmpbuf(png))) return false;
  // PIL checks the CRC of every chunk before the first IDAT (ancillary ones too) and of none
  // after it.
  png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
  png_read_info(png, info);
  *depth = png_get_bit_depth(png, info);  // before png_set_packing makes it 8
  png_set_crc_action(png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
  png_set_packing(png);
  *passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  return true;
}

bool PngReadRows(png_structp png, int passes, png_uint_32 height, size_t stride, uint8_t* raw) {
  if (setjmp(png_jmpbuf(png))) return false;
  for (int pass = 0; pass < passes; ++pass) {
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, raw + y * stride, nullptr);
  }
  return true;
}

absl::StatusOr<RgbImage> DecodePng(const std::string& bytes) {
  // PIL decodes whatever part of a cut-off IDAT chunk is there (the rows may all be in it);
  // libpng reads chunk data in blocks and fails on a short one. Shorten such a chunk to what
  // the file holds, so that only missing rows make the file bad.
  std::string cut;
  for (size_t pos = 8; pos + 8 <= bytes.size();) {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + pos;
    const size_t length = static_cast<size_t>(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3];
    if (bytes.size() - pos - 8 >= length) {
      pos += 12 + length;
      continue;
    }
    if (std::memcmp(p + 4, "IDAT", 4) == 0) {
      cut = bytes;
      const size_t have = bytes.size() - pos - 8;
      for (int i = 0; i < 4; ++i) cut[pos + i] = static_cast<char>(have >> (24 - 8 * i));
    }
    break;
  }
  const std::string& data = cut.empty() ? bytes : cut;
  PngStream stream{reinterpret_cast<const uint8_t*>(data.data()), data.size(), 0, {}};
  struct Handles {
    png_structp png = nullptr;
    png_infop info = nullptr;
    ~Handles() { png_destroy_read_struct(&png, &info, nullptr); }
  } h;
  h.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &stream, PngError, PngWarning);
  if (h.png != nullptr) h.info = png_create_info_struct(h.png);
  if (h.info == nullptr) return absl::ResourceExhaustedError("cannot start the PNG decoder");
  png_set_read_fn(h.png, &stream, PngRead);
  // PIL limits the pixel count only (kMaxPixels), not the width or height.
  png_set_user_limits(h.png, PNG_UINT_31_MAX, PNG_UINT_31_MAX);
  // PIL feeds zlib IDAT data in the same pieces (64 KiB, split at chunk ends), so a bad zlib
  // checksum after the last row is seen, or not, by both alike.
  png_set_compression_buffer_size(h.png, 65536);
  // PIL skips unknown chunks, critical ones too.
  png_set_read_user_chunk_fn(h.png, nullptr, [](png_structp, png_unknown_chunkp) { return 1; });
  int passes = 1, depth = 8;
  if (!PngReadHeader(h.png, h.info, &passes, &depth)) {
    return absl::InvalidArgumentError(absl::StrCat("bad PNG header: ", stream.error));
  }
  const png_uint_32 width = png_get_image_width(h.png, h.info), height = png_get_image_height(h.png, h.info);
  if (width < 1 || height < 1 || static_cast<int64_t>(width) * height > kMaxPixels) {
    return absl::InvalidArgumentError(absl::StrCat("PNG size ", width, "x", height, " out of range"));
  }
  const int type = png_get_color_type(h.png, h.info);
  const int channels = png_get_channels(h.png, h.info), sample = depth == 16 ? 2 : 1;
  const size_t stride = png_get_rowbytes(h.png, h.info);
  // PIL's palette starts as a gray ramp: indices past the PLTE entries read as (i, i, i).
  uint8_t palette[256][3];
  for (int i = 0; i < 256; ++i) palette[i][0] = palette[i][1] = palette[i][2] = static_cast<uint8_t>(i);
  png_colorp plte = nullptr;
  int plte_size = 0;
  if (type == PNG_COLOR_TYPE_PALETTE && png_get_PLTE(h.png, h.info, &plte, &plte_size) != 0) {
    for (int i = 0; i < plte_size && i < 256; ++i) {
      palette[i][0] = plte[i].red, palette[i][1] = plte[i].green, palette[i][2] = plte[i].blue;
    }
  }
  std::vector<uint8_t> raw(stride * height);
  // PIL stops once it has every row, so an error in what libpng reads after the last one (the
  // rest of the zlib stream, the IDAT CRC, up to a truncation) does not make the file bad.
  if (!PngReadRows(h.png, passes, height, stride, raw.data()) &&
      (passes > 1 ? png_get_current_pass_number(h.png) < 7 : png_get_current_row_number(h.png) < height)) {
    return absl::InvalidArgumentError(absl::StrCat("bad PNG data: ", stream.error));
  }
  // convert("RGB") as Pillow 9.4 does it: gray replicated (1/2/4-bit scaled to 0..255), alpha
  // and tRNS dropped without compositing, 16-bit samples cut to their high byte -- except
  // 16-bit gray, which PIL opens as mode "I" and clips to 0..255.
  const int gray_scale = depth < 8 ? 255 / ((1 << depth) - 1) : 1;
  RgbImage out{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  uint8_t* o = out.pixels.data();
  for (png_uint_32 y = 0; y < height; ++y) {
    const uint8_t* s = raw.data() + y * stride;
    for (png_uint_32 x = 0; x < width; ++x, s += channels * sample, o += 3) {
      if (type == PNG_COLOR_TYPE_PALETTE) {
        std::memcpy(o, palette[s[0]], 3);
      } else if (type == PNG_COLOR_TYPE_GRAY && depth == 16) {
        o[0] = o[1] = o[2] = static_cast<uint8_t>(std::min((s[0] << 8) | s[1], 255));
      } else if (channels <= 2) {  // gray, gray + alpha
        o[0] = o[1] = o[2] = static_cast<uint8_t>(s[0] * gray_scale);
      } else {  // RGB, RGBA
        o[0] = s[0], o[1] = s[sample], o[2] = s[2 * sample];
      }
    }
  }
  return out;
}

// One file's result: a float [3, C, C] sample, or why the file could not be used.
using Sample = absl::StatusOr<std::vector<float>>;

// Decoding runs on a pool of threads that work through the file list in order, at most
// `window` files ahead of the consumer; Next() takes the results back in file order, so the
// batches do not depend on the thread count or on timing. The workers use no torch (no
// intra-op thread pools to oversubscribe).
class ImageSource final : public BatchSource {
 public:
  ImageSource(DataSpec spec, std::vector<std::string> files, ImageFileReader read, int64_t batch_size,
              ImageSourceOptions options, std::string description)
      : spec_(std::move(spec)), files_(std::move(files)), read_(std::move(read)), batch_size_(batch_size),
        options_(options), description_(std::move(description)),
        window_(static_cast<size_t>(2 * batch_size_ + 2 * options_.threads)) {}

  ~ImageSource() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  absl::StatusOr<std::optional<Batch>> Next() override {
    if (absl::Status started = StartWorkers(); !started.ok()) return started;
    const int64_t c = spec_.crop;
    std::vector<std::vector<float>> samples;
    while (static_cast<int64_t>(samples.size()) < batch_size_ && consumed_ < files_.size()) {
      const size_t index = consumed_;
      Sample sample = Take(index);
      if (sample.ok()) {
        samples.push_back(*std::move(sample));
      } else if (spec_.skip_bad && sample.status().code() == absl::StatusCode::kInvalidArgument) {
        skipped_.fetch_add(1);
      } else {
        // A later call moves on past the bad file.
        return absl::Status(sample.status().code(), absl::StrCat(description_, ": ", sample.status().message()));
      }
    }
    if (samples.empty()) return std::optional<Batch>();
    try {
      at::Tensor batch = at::empty({static_cast<int64_t>(samples.size()), 3, c, c}, at::kFloat);
      float* dst = batch.data_ptr<float>();
      for (const std::vector<float>& sample : samples) dst = std::copy(sample.begin(), sample.end(), dst);
      return std::optional<Batch>(Batch{batch});
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(absl::StrCat(description_, ": cannot make a batch: ", ExceptionMessage(e)));
    }
  }

  std::optional<int64_t> num_samples() const override { return static_cast<int64_t>(files_.size()); }
  std::string Describe() const override { return description_; }
  int64_t skipped_files() const override { return skipped_.load(); }
  // Files, not samples: with on_bad=skip the batches after a bad file shift; skipping
  // counts whole batches of files, as if none had been bad.
  absl::Status SkipBatches(int64_t batches) override {
    if (!workers_.empty()) return BatchSource::SkipBatches(batches);  // only Next() starts them
    std::lock_guard<std::mutex> lock(mu_);
    consumed_ = claimed_ = std::min(files_.size(), consumed_ + static_cast<size_t>(batches * batch_size_));
    return absl::OkStatus();
  }

 private:
  absl::Status StartWorkers() {
    if (!workers_.empty()) return absl::OkStatus();
    try {
      for (int t = 0; t < options_.threads; ++t) workers_.emplace_back([this] { Work(); });
    } catch (const std::exception& e) {
      if (!workers_.empty()) return absl::OkStatus();  // fewer threads still work
      return absl::ResourceExhaustedError(absl::StrCat(description_, ": cannot start decoding threads: ", e.what()));
    }
    return absl::OkStatus();
  }

  void Work() {
    while (true) {
      size_t index;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [this] {
          return stopping_ || claimed_ >= files_.size() || claimed_ < consumed_ + window_;
        });
        if (stopping_ || claimed_ >= files_.size()) return;
        index = claimed_++;
      }
      Sample sample = LoadNoThrow(files_[index]);
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.emplace(index, std::move(sample));
      }
      ready_.notify_all();
    }
  }

  // The result for files_[index] (index == consumed_), waiting for the pool if need be.
  Sample Take(size_t index) {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return done_.count(index) > 0; });
    auto it = done_.find(index);
    Sample sample = std::move(it->second);
    done_.erase(it);
    ++consumed_;
    lock.unlock();
    work_.notify_all();
    return sample;
  }

  Sample LoadNoThrow(const std::string& relative) const {
    try {
      return Load(relative);
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(absl::StrCat(relative, ": ", e.what()));
    } catch (...) {
      return absl::InternalError(absl::StrCat(relative, ": decoding threw a non-standard exception"));
    }
  }

  // One file -> float [3, C, C]; INVALID_ARGUMENT (naming the file) for a bad image.
  Sample Load(const std::string& relative) const {
    absl::StatusOr<std::string> bytes = read_(relative);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<RgbImage> rgb = absl::InvalidArgumentError("not a JPEG or PNG file");
    int64_t h = 0, w = 0;
    const std::string& b = *bytes;
    if (b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF && static_cast<uint8_t>(b[1]) == 0xD8 &&
        static_cast<uint8_t>(b[2]) == 0xFF) {
      rgb = DecodeJpeg(b, spec_.resize, options_.jpeg_dct_scaling, &h, &w);
    } else if (b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
      rgb = DecodePng(b);
      if (rgb.ok()) h = rgb->height, w = rgb->width;
    }
    if (!rgb.ok()) {
      return absl::Status(rgb.status().code(), absl::StrCat(relative, ": ", rgb.status().message()));
    }
    // torchvision's Resize from the file's own size (DCT scaling decodes smaller), then
    // CenterCrop with Python's round-half-even.
    const auto [oh, ow] = ResizedSize(h, w, spec_.resize);
    const int64_t c = spec_.crop;
    const int64_t top = static_cast<int64_t>(std::nearbyint((oh - c) / 2.0));
    const int64_t left = static_cast<int64_t>(std::nearbyint((ow - c) / 2.0));
    const RgbImage cropped = ResizeCropLikePil(*rgb, oh, ow, top, left, c, c);
    // ToTensor then Normalize, in float32 as torchvision computes them.
    std::vector<float> out(static_cast<size_t>(3 * c * c));
    for (int64_t ch = 0; ch < 3; ++ch) {
      const float mean = static_cast<float>(spec_.mean[ch]), std = static_cast<float>(spec_.std[ch]);
      float* o = out.data() + ch * c * c;
      for (int64_t i = 0; i < c * c; ++i) o[i] = (cropped.pixels[3 * i + ch] / 255.0f - mean) / std;
    }
    return out;
  }

  const DataSpec spec_;
  const std::vector<std::string> files_;  // relative to spec_.path, in order
  const ImageFileReader read_;
  const int64_t batch_size_;
  const ImageSourceOptions options_;
  const std::string description_;
  const size_t window_;  // files decoded ahead of the consumer at most
  std::atomic<int64_t> skipped_{0};

  std::mutex mu_;
  std::condition_variable work_;   // consumed_ moved on, or stopping_
  std::condition_variable ready_;  // done_ gained a result
  size_t claimed_ = 0;             // files handed to workers
  size_t consumed_ = 0;            // files taken by Next()
  std::map<size_t, Sample> done_;  // decoded, not yet taken
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

absl::Status CheckImageSpec(const DataSpec& spec, int64_t batch_size) {
  const std::string label = DataSpecToString(spec);
  if (spec.scheme != DataSpec::Scheme::kImages || spec.mean.size() != 3 || spec.std.size() != 3 ||
      spec.crop < 1 || spec.crop > spec.resize) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not a valid images spec"));
  }
  if (batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": batch size must be >= 1, got ", batch_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenImageSource(const DataSpec& spec, int64_t batch_size,
                                                             ImageSourceOptions options) {
  const std::string label = DataSpecToString(spec);
  if (absl::Status s = CheckImageSpec(spec, batch_size); !s.ok()) return s;
  std::error_code ec;
  if (!fs::is_directory(spec.path, ec)) {
    return absl::NotFoundError(absl::StrCat(label, ": ", spec.path, " is not a directory"));
  }
  // Symbolic links to directories are followed, as torchvision's ImageFolder does
  // (os.walk(followlinks=True)); a directory reached a second time (a link loop, or two
  // links to one place) is not entered again.
  std::vector<std::string> files;
  std::set<fs::path> entered = {fs::canonical(spec.path, ec)};
  fs::recursive_directory_iterator it(spec.path, fs::directory_options::follow_directory_symlink, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    if (it->is_directory(ec2)) {
      if (!options.allowed_roots.empty()) {
        // A link to a directory outside the roots is refused before it is listed, as a file
        // link is before it is read (the worker's sandbox would refuse the listing too).
        absl::StatusOr<std::string> inside = ResolveUnderRoots(options.allowed_roots, it->path().string());
        if (!inside.ok()) {
          return absl::Status(inside.status().code(),
                              absl::StrCat(label, ": ", it->path().lexically_relative(spec.path).generic_string(),
                                           ": ", inside.status().message()));
        }
      }
      if (!entered.insert(fs::canonical(it->path(), ec2)).second || ec2) it.disable_recursion_pending();
    } else if (it->is_regular_file(ec2) && IsImageFileName(it->path().filename().string())) {
      files.push_back(it->path().lexically_relative(spec.path).generic_string());
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat(label, ": cannot list ", spec.path, ": ", ec.message()));
  const std::string folder = spec.path;
  const std::vector<std::string> roots = options.allowed_roots;
  ImageFileReader read = [folder, roots](const std::string& relative) -> absl::StatusOr<std::string> {
    std::string path = (fs::path(folder) / relative).string();
    if (!roots.empty()) {
      // A link inside the folder must not lead outside what the server may read. Not a bad
      // file: on_bad=skip does not hide it.
      absl::StatusOr<std::string> resolved = ResolveUnderRoots(roots, path);
      if (!resolved.ok()) {
        return absl::Status(resolved.status().code(), absl::StrCat(relative, ": ", resolved.status().message()));
      }
      path = *std::move(resolved);
    }
    return ReadFile(path);
  };
  return MakeImageSource(spec, std::move(files), std::move(read), spec.path, batch_size, std::move(options));
}

absl::StatusOr<std::unique_ptr<BatchSource>> MakeImageSource(const DataSpec& spec, std::vector<std::string> files,
                                                             ImageFileReader read, const std::string& where,
                                                             int64_t batch_size, ImageSourceOptions options) {
  const std::string label = DataSpecToString(spec);
  if (absl::Status s = CheckImageSpec(spec, batch_size); !s.ok()) return s;
  files = SelectImageFiles(std::move(files), spec);
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(label, ": no .jpg/.jpeg/.png files under ", where));
  }
  if (options.threads < 1) {
    options.threads = static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  }
  const std::string description =
      absl::StrCat(label, " (", files.size(), " files -> ", spec.crop, "x", spec.crop, " float32)");
  return std::unique_ptr<BatchSource>(
      new ImageSource(spec, std::move(files), std::move(read), batch_size, options, description));
}

}  // namespace recal::data
