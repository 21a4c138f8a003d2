#include "server/engine/script_tensors.h"

#include <cstring>
#include <map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/engine/tensor_view.h"
#include "server/engine/torch_error.h"

namespace recal::engine {
namespace {

using caffe2::serialize::PyTorchStreamReader;
using c10::IValue;

// Tensors whose rebuilding may read their parts (a per-channel quantized tensor reads its
// scales; sparse ones may validate their indices): a pickle naming them (GLOBAL spells the
// name so) is refused before it is unpickled. No operator of the allowlist computes on them.
constexpr absl::string_view kRebuiltFromData[] = {"torch._utils\n_rebuild_qtensor\n",
                                                  "torch._utils\n_rebuild_sparse_tensor\n"};

absl::Status Refused(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("TorchScript archive: ", what));
}

// The context of the storages the scan makes: the record LibTorch would read. Their DataPtr
// holds no bytes, so that nothing of the scan can read through one.
struct StorageRecord {
  std::string name;
};
void KeepRecord(void*) {}  // the records are owned by the scan

class TensorScan {
 public:
  TensorScan(PyTorchStreamReader* reader, size_t archive_bytes)
      : reader_(reader), archive_bytes_(archive_bytes), types_(std::make_shared<torch::jit::CompilationUnit>()) {}

  // Every tensor of `archive`.pkl (its storages in `archive`/), named from `root`.
  absl::Status Check(const std::string& archive, const std::string& root) {
    RECAL_ASSIGN_OR_RETURN(IValue value, Unpickle(archive));
    return Walk(value, root);
  }

 private:
  absl::StatusOr<int64_t> RecordBytes(const std::string& record) const {
    absl::StatusOr<int64_t> bytes = RecordInArchive(*reader_, record, archive_bytes_);
    if (!bytes.ok()) return Refused(bytes.status().message());
    return bytes;
  }

  c10::StrongTypePtr TypeOf(const c10::QualifiedName& name) {
    const std::string& text = name.qualifiedName();
    // restore_type_tag asks for containers by their annotation; the element types do not
    // matter to the scan.
    if (absl::StartsWith(text, "Dict[")) {
      return c10::StrongTypePtr(types_, c10::DictType::create(c10::AnyType::get(), c10::AnyType::get()));
    }
    if (absl::StartsWith(text, "List[")) return c10::StrongTypePtr(types_, c10::ListType::create(c10::AnyType::get()));
    // Any other name is a class of the archive: its object keeps the pickled state as it is.
    c10::ClassTypePtr& type = classes_[text];
    if (!type) {
      type = c10::ClassType::create(name, types_);
      type->addAttribute("state", c10::AnyType::get());
    }
    return c10::StrongTypePtr(types_, type);
  }

  absl::StatusOr<IValue> Unpickle(const std::string& archive) {
    const std::string name = archive + ".pkl";
    RECAL_RETURN_IF_ERROR(RecordBytes(name).status());
    auto [bytes, size] = reader_->getRecord(name);
    const char* data = static_cast<const char*>(bytes.get());
    for (absl::string_view global : kRebuiltFromData) {
      if (absl::StrContains(absl::string_view(data, size), global)) {
        return Refused(absl::StrCat(name, " holds quantized or sparse tensors; Recal takes models of dense float tensors"));
      }
    }
    size_t done = 0;
    auto read = [&](char* buffer, size_t n) {
      n = std::min(n, size - done);
      std::memcpy(buffer, data + done, n);
      done += n;
      return n;
    };
    auto load_object = [](const c10::StrongTypePtr& type, IValue state) {
      auto object = c10::ivalue::Object::create(type, 1);
      object->setSlot(0, std::move(state));
      return object;
    };
    auto read_record = [this, dir = archive + "/"](const std::string& key) {
      records_.push_back(std::make_unique<StorageRecord>(StorageRecord{dir + key}));
      return at::DataPtr(nullptr, records_.back().get(), &KeepRecord, at::Device(at::kCPU));
    };
    // On the CPU whatever device the archive names: a storage bound elsewhere would be copied.
    torch::jit::Unpickler unpickler(read, [this](const c10::QualifiedName& type) { return TypeOf(type); },
                                    load_object, read_record, at::Device(at::kCPU));
    unpickler.set_version(reader_->version());
    return unpickler.parse_ivalue();
  }

  absl::Status CheckTensor(const std::string& path, const at::Tensor& tensor) const {
    if (tensor.layout() != at::kStrided || tensor.is_quantized()) {
      return Refused(absl::StrCat("tensor '", path, "' is not a dense tensor; Recal takes models of dense float tensors"));
    }
    const at::DataPtr& data = tensor.storage().data_ptr();
    const int64_t storage_bytes = static_cast<int64_t>(tensor.storage().nbytes());
    std::string record = "(none)";
    int64_t record_bytes = 0;
    if (data.get_deleter() == &KeepRecord) {
      record = static_cast<const StorageRecord*>(data.get_context())->name;
      RECAL_ASSIGN_OR_RETURN(record_bytes, RecordBytes(record));
    } else if (data.get() != nullptr || storage_bytes != 0) {
      return Refused(absl::StrCat("tensor '", path, "' is not stored as a plain tensor"));
    }
    if (storage_bytes < 0 || storage_bytes > record_bytes) {
      return Refused(absl::StrCat("tensor '", path, "' claims a storage of ", storage_bytes, " bytes in record ",
                                  record, ", which holds ", record_bytes,
                                  " bytes: the archive is damaged or crafted; save the model again"));
    }
    TensorView view{tensor.scalar_type(), tensor.sizes().vec(), tensor.strides().vec(), tensor.storage_offset()};
    absl::Status fits = CheckViewFits(path, view, storage_bytes, record);
    return fits.ok() ? fits : Refused(fits.message());
  }

  // Depth first over the unpickled value, each shared object once; paths as the module's
  // state_dict spells them.
  absl::Status Walk(const IValue& root, const std::string& root_path) const {
    std::vector<std::pair<IValue, std::string>> pending = {{root, root_path}};
    std::unordered_set<const void*> seen;
    auto child = [](const std::string& path, const std::string& part) {
      return path.empty() ? part : absl::StrCat(path, ".", part);
    };
    while (!pending.empty()) {
      auto [value, path] = std::move(pending.back());
      pending.pop_back();
      if (value.isPtrType() && !seen.insert(value.internalToPointer()).second) continue;
      if (value.isTensor()) {
        RECAL_RETURN_IF_ERROR(CheckTensor(path, value.toTensor()));
      } else if (value.isObject()) {
        pending.emplace_back(value.toObjectRef().getSlot(0), path);
      } else if (value.isGenericDict()) {
        for (const auto& item : value.toGenericDict()) {
          const std::string key = item.key().isString() ? item.key().toStringRef()
                                  : item.key().isInt() ? std::to_string(item.key().toInt())
                                                       : "?";
          if (item.key().isTensor()) pending.emplace_back(item.key(), child(path, key + " (a key)"));
          pending.emplace_back(item.value(), child(path, key));
        }
      } else if (value.isList() || value.isTuple()) {
        const std::vector<IValue> items =
            value.isList() ? value.toList().vec() : value.toTupleRef().elements().vec();
        for (size_t i = 0; i < items.size(); ++i) {
          pending.emplace_back(items[i], root_path == "CONSTANTS" && path == root_path ? child(path, absl::StrCat("c", i))
                                                                                       : absl::StrCat(path, "[", i, "]"));
        }
      }
    }
    return absl::OkStatus();
  }

  PyTorchStreamReader* reader_;
  const size_t archive_bytes_;
  std::shared_ptr<torch::jit::CompilationUnit> types_;
  std::map<std::string, c10::ClassTypePtr> classes_;
  std::vector<std::unique_ptr<StorageRecord>> records_;
};

}  // namespace

absl::Status CheckScriptTensors(const std::shared_ptr<ReadAdapter>& file) {
  try {
    PyTorchStreamReader reader(file);
    if (!reader.hasRecord("data.pkl")) return Refused("has no data.pkl (the module's state)");
    TensorScan scan(&reader, file->size());
    RECAL_RETURN_IF_ERROR(scan.Check("data", ""));
    // The code's tensor constants, which the code reads as CONSTANTS.c0, c1, ...
    if (reader.hasRecord("constants.pkl")) RECAL_RETURN_IF_ERROR(scan.Check("constants", "CONSTANTS"));
  } catch (const std::exception& e) {
    return TorchErrorStatus("TorchScript archive: cannot read its tensors", e);
  }
  return absl::OkStatus();
}

}  // namespace recal::engine
