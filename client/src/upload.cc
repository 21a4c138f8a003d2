// UploadModel: skip what the server has, resume what it has part of.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "client/src/client_impl.h"
#include "common/model_archive.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace recal {
namespace {

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status ReadAt(int fd, int64_t offset, size_t size, std::string* out, const std::string& path) {
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out->data() + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
    if (n == 0) return absl::DataLossError(absl::StrCat("'", path, "' became shorter during the upload"));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

absl::StatusOr<UploadResult> Client::UploadModel(const std::string& path, const std::string& name,
                                                 const std::map<std::string, std::string>& labels,
                                                 const TransferCallback& on_progress) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open model '", path, "'"));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat '", path, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  // What the server would refuse for its format (a state_dict) is refused before it is sent.
  RECAL_RETURN_IF_ERROR(SniffModelArchive(path).status());
  const int64_t size = st.st_size;
  RECAL_ASSIGN_OR_RETURN(const std::string digest, Sha256OfFile(path));

  UploadResult result;
  // Models are named by their digest: if the server has one, these very bytes are there.
  auto existing = GetModel("sha256:" + digest);
  if (existing.ok()) {
    result.model = *std::move(existing);
    result.already_present = true;
    return result;
  }
  if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();

  v1::UploadModelRequest header;
  header.mutable_header()->set_name(name.empty() ? BaseName(path) : name);
  header.mutable_header()->set_size(size);
  header.mutable_header()->set_sha256(digest);
  header.mutable_header()->mutable_labels()->insert(labels.begin(), labels.end());

  client_internal::ReconnectBudget budget(options_);
  int64_t committed_before = -1;
  int refusals = 0;
  std::string chunk;
  while (true) {
    // Where to start: what the server has durably stored of these bytes (0 for a new upload).
    RECAL_ASSIGN_OR_RETURN(const v1::UploadStatus status, GetUploadStatus(digest));
    if (!status.model_id().empty()) {  // another client finished it meanwhile
      RECAL_ASSIGN_OR_RETURN(result.model, GetModel(status.model_id()));
      result.already_present = result.bytes_sent == 0;
      return result;
    }
    const int64_t offset = status.committed_size();
    if (offset > committed_before) budget.Progress();
    committed_before = offset;
    result.resumed_from = offset;

    grpc::ClientContext context;
    impl_->Prepare(&context, /*unary=*/false);
    v1::Model model;
    auto writer = impl_->stub->UploadModel(&context, &model);
    // A failed Write means the server has answered already (e.g. it found the model, or
    // refused the header): Finish says how.
    if (writer->Write(header)) {
      for (int64_t at = offset; at < size; at += options_.chunk_bytes) {
        const size_t n = static_cast<size_t>(std::min<int64_t>(options_.chunk_bytes, size - at));
        if (absl::Status read = ReadAt(fd.get(), at, n, &chunk, path); !read.ok()) {
          context.TryCancel();
          writer->Finish();
          return read;
        }
        v1::UploadModelRequest part;
        part.mutable_chunk()->set_offset(at);
        part.mutable_chunk()->set_data(std::move(chunk));
        if (!writer->Write(part)) break;
        result.bytes_sent += static_cast<int64_t>(n);
        if (on_progress) on_progress(at + static_cast<int64_t>(n), size);
      }
      writer->WritesDone();
    }
    const absl::Status finished = FromGrpcStatus(writer->Finish());
    if (finished.ok()) {
      result.model = std::move(model);
      return result;
    }
    // UNAVAILABLE: the connection or the server went away. FAILED_PRECONDITION: our offset
    // was not the committed size (another client uploads the same bytes, or the server
    // restarted and kept less); asking for the status again sorts both out.
    const bool again =
        client_internal::IsRetryable(finished) || (finished.code() == absl::StatusCode::kFailedPrecondition &&
                                                   ++refusals < options_.retry.max_attempts);
    if (!again || !budget.Wait()) {
      // The server saw bytes only: the refusal names the user's file.
      const absl::Status explained = impl_->Explain(finished);
      return absl::Status(explained.code(), absl::StrCat("uploading '", path, "': ", explained.message()));
    }
  }
}

}  // namespace recal
