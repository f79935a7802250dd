// MPS delegate emulator shim for the ExecuTorch runtime of the executorch wheel.
//
// Registers a backend named "MPSBackend" in the backend registry of the wheel's
// libexecutorch.so (the same library the Python pybindings link), so that a whole
// .pte with MPS delegates runs on Linux. The delegate work itself is done in Python:
// execute() describes every tensor argument of the delegate call and calls one
// process-wide C callback (installed from Python through ctypes), which reads the
// inputs, runs the device-model interpreter and writes the outputs in place.
//
// Per-node debugging: when the runtime runs with an event tracer (an ETDump),
// the callback also gets a trace handle, and Python calls mps_emu_trace_begin /
// mps_emu_trace_end / mps_emu_trace_output around each MPS node it interprets,
// so the ETDump holds one profiling event (marked "emulated") and one
// intermediate output per MPS node, under the delegate debug identifier the
// ahead-of-time side wrote (the node's index in the MPS graph).
//
// Built on first use by mps_backend/runtime/emulator.py; see that file for the
// build command. Only the extern "C" entry points below are exported
// (-fvisibility=hidden). Nothing here may abort the process: every failure is
// reported as an executorch Error.

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/event_tracer.h>
#include <executorch/runtime/platform/log.h>

#define MPS_EMU_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using executorch::runtime::ArrayRef;
using executorch::runtime::Backend;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::EventTracer;
using executorch::runtime::EventTracerEntry;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::Result;
using executorch::runtime::Span;
using executorch::aten::Tensor;

// Bumped whenever MpsEmuArg or the callback signature changes; checked from Python.
constexpr int32_t kAbiVersion = 2;

}  // namespace

// One tensor argument of a delegate call (tensor lists are flattened, in order).
// Layout mirrored by ctypes in emulator.py; keep both in sync with kAbiVersion.
struct MpsEmuArg {
  void* data;               // tensor data (read for inputs, written for outputs)
  int64_t nbytes;           // Tensor::nbytes()
  const int32_t* sizes;     // `dim` entries
  const uint8_t* dim_order; // `dim` entries
  int32_t dim;
  int32_t dtype;            // executorch ScalarType code (same numbering as c10)
  int32_t arg_index;        // index of the EValue in the delegate's args
  int32_t list_index;       // position inside a tensor list, -1 for a plain tensor
};

// Event tracer of one delegate call, handed to Python as an opaque pointer (null
// when the runtime has no event tracer). One node event is open at a time.
struct MpsEmuTrace {
  EventTracer* tracer;
  EventTracerEntry entry;
  bool open;
};

// Returns 0 on success, anything else = failure (the Python side keeps the reason).
typedef int32_t (*MpsEmuCallback)(
    int64_t handle_id,
    const uint8_t* blob,
    uint64_t blob_len,
    int32_t n_args,        // number of MpsEmuArg entries
    MpsEmuArg* args,
    int32_t n_evalues,     // number of EValues the runtime passed (incl. non-tensors)
    const char* method_name,
    MpsEmuTrace* trace);   // null: no event tracer, nothing to log

namespace {

std::atomic<MpsEmuCallback> g_callback{nullptr};
std::atomic<int64_t> g_next_handle_id{1};
std::atomic<int64_t> g_live_handles{0};

struct EmuHandle {
  int64_t id;
  std::vector<uint8_t> blob;
  char method_name[64];
};

constexpr size_t kMinBlobSize = 30;  // MPSDelegateHeader kMinSize


// Runtime API differences between executorch releases, resolved at compile time (the int overload
// wins when its return type compiles): 1.3+ have FreeableBuffer::data_safe() and
// EValue::tryToTensorList() returning Result; 1.0-1.2 only data() and toTensorList().
template <typename Buffer>
auto buffer_data(Buffer* buffer, int) -> decltype(buffer->data_safe()) {
  return buffer->data_safe();
}
template <typename Buffer>
Result<const void*> buffer_data(Buffer* buffer, long) {
  return buffer->data();
}
template <typename Value>
auto tensor_list(const Value* value, int) -> decltype(value->tryToTensorList()) {
  return value->tryToTensorList();
}
template <typename Value>
Result<executorch::aten::ArrayRef<executorch::aten::Tensor>> tensor_list(const Value* value, long) {
  return value->toTensorList();
}

class MPSEmulatorBackend final : public BackendInterface {
 public:
  ~MPSEmulatorBackend() override = default;

  bool is_available() const override {
    return true;
  }

  Result<DelegateHandle*> init(
      BackendInitContext& context,
      FreeableBuffer* processed,
      ArrayRef<CompileSpec> /*compile_specs: ignored by the device runtime*/)
      const override {
    if (processed == nullptr) {
      return Error::InvalidArgument;
    }
    Result<const void*> data = buffer_data(processed, 0);
    if (!data.ok()) {
      ET_LOG(Error, "MPSBackend emulator: processed buffer is not pointer-backed");
      return data.error();
    }
    const size_t size = processed->size();
    const auto* bytes = static_cast<const uint8_t*>(data.get());
    // Like MPSDelegateHeader: too short or no "MP00" magic at bytes 4..7 -> NotFound.
    if (bytes == nullptr || size < kMinBlobSize || std::memcmp(bytes + 4, "MP00", 4) != 0) {
      ET_LOG(Error, "MPSBackend emulator: delegate payload is not an MP00 blob (%zu bytes)", size);
      return Error::NotFound;
    }
    EmuHandle* handle = new (std::nothrow) EmuHandle();
    if (handle == nullptr) {
      return Error::MemoryAllocationFailed;
    }
    try {
      handle->blob.assign(bytes, bytes + size);
    } catch (...) {
      delete handle;
      return Error::MemoryAllocationFailed;
    }
    handle->id = g_next_handle_id.fetch_add(1);
    std::memset(handle->method_name, 0, sizeof(handle->method_name));
    const char* method = context.get_method_name();
    if (method != nullptr) {
      std::strncpy(handle->method_name, method, sizeof(handle->method_name) - 1);
    }
    processed->Free();
    g_live_handles.fetch_add(1);
    return handle;
  }

  Error execute(
      BackendExecutionContext& context,
      DelegateHandle* opaque,
      Span<EValue*> args) const override {
    auto* handle = static_cast<EmuHandle*>(opaque);
    if (handle == nullptr) {
      return Error::InvalidState;
    }
    MpsEmuCallback cb = g_callback.load();
    if (cb == nullptr) {
      ET_LOG(Error, "MPSBackend emulator: no execute callback installed");
      return Error::InvalidState;
    }
    std::vector<MpsEmuArg> descs;
    try {
      descs.reserve(args.size());
      for (size_t i = 0; i < args.size(); ++i) {
        const EValue* value = args[i];
        if (value == nullptr) {
          continue;
        }
        if (value->isTensor()) {
          descs.push_back(describe(value->toTensor(), static_cast<int32_t>(i), -1));
        } else if (value->isTensorList()) {
          auto list = tensor_list(value, 0);
          if (!list.ok()) {
            ET_LOG(Error, "MPSBackend emulator: bad tensor list at arg %zu", i);
            return list.error();
          }
          const auto& tensors = list.get();
          for (size_t j = 0; j < tensors.size(); ++j) {
            descs.push_back(describe(tensors[j], static_cast<int32_t>(i), static_cast<int32_t>(j)));
          }
        }
        // Other EValues (ints, doubles, None, ...) carry no device data; the MPS
        // runtime only binds tensors.
      }
    } catch (...) {
      return Error::MemoryAllocationFailed;
    }
    MpsEmuTrace trace{context.event_tracer(), EventTracerEntry{}, false};
    const int32_t rc = cb(
        handle->id,
        handle->blob.data(),
        static_cast<uint64_t>(handle->blob.size()),
        static_cast<int32_t>(descs.size()),
        descs.data(),
        static_cast<int32_t>(args.size()),
        handle->method_name,
        trace.tracer != nullptr ? &trace : nullptr);
    if (trace.open) {  // Python failed inside a node: close its event so the ETDump stays consistent
      trace.tracer->end_profiling_delegate(trace.entry, nullptr, 0);
    }
    if (rc != 0) {
      ET_LOG(Error, "MPSBackend emulator: delegate execution failed in Python (code %d)", rc);
      return Error::Internal;
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle* opaque) const override {
    auto* handle = static_cast<EmuHandle*>(opaque);
    if (handle != nullptr) {
      delete handle;
      g_live_handles.fetch_sub(1);
    }
  }

 private:
  static MpsEmuArg describe(const Tensor& t, int32_t arg_index, int32_t list_index) {
    MpsEmuArg d;
    d.data = t.mutable_data_ptr();
    d.nbytes = static_cast<int64_t>(t.nbytes());
    d.sizes = t.sizes().data();
    d.dim_order = t.dim_order().data();
    d.dim = static_cast<int32_t>(t.dim());
    d.dtype = static_cast<int32_t>(t.scalar_type());
    d.arg_index = arg_index;
    d.list_index = list_index;
    return d;
  }
};

MPSEmulatorBackend g_backend;
std::once_flag g_register_once;
int32_t g_register_status = -1;

}  // namespace

// ABI version of MpsEmuArg / MpsEmuCallback.
MPS_EMU_EXPORT int32_t mps_emu_abi_version() {
  return kAbiVersion;
}

MPS_EMU_EXPORT int32_t mps_emu_arg_size() {
  return static_cast<int32_t>(sizeof(MpsEmuArg));
}

// Installs (or replaces, or with nullptr removes) the execute callback, and registers
// the backend with the runtime on the first call. Returns the executorch Error code
// of the one registration (0 = registered; the same value on every later call).
MPS_EMU_EXPORT int32_t mps_emu_install(MpsEmuCallback cb) {
  g_callback.store(cb);
  std::call_once(g_register_once, [] {
    static const Backend backend{"MPSBackend", &g_backend};
    g_register_status = static_cast<int32_t>(executorch::runtime::register_backend(backend));
  });
  return g_register_status;
}

// Opens the profiling event of MPS node `index` (its delegate debug identifier).
MPS_EMU_EXPORT void mps_emu_trace_begin(MpsEmuTrace* trace, int64_t index) {
  if (trace == nullptr || trace->tracer == nullptr) {
    return;
  }
  if (trace->open) {
    trace->tracer->end_profiling_delegate(trace->entry, nullptr, 0);
  }
  trace->entry = trace->tracer->start_profiling_delegate(nullptr, index);
  trace->open = true;
}

// Closes the open node event with `metadata` (delegate metadata bytes of the ETDump event).
MPS_EMU_EXPORT void mps_emu_trace_end(MpsEmuTrace* trace, const char* metadata, int64_t metadata_len) {
  if (trace == nullptr || trace->tracer == nullptr || !trace->open) {
    return;
  }
  trace->tracer->end_profiling_delegate(
      trace->entry, metadata, metadata_len > 0 ? static_cast<size_t>(metadata_len) : 0);
  trace->open = false;
}

// Logs one intermediate output of MPS node `index` (a contiguous tensor described like an
// argument; the tracer copies the bytes into its debug buffer). Returns the executorch Error
// code (0 = logged or filtered out).
MPS_EMU_EXPORT int32_t mps_emu_trace_output(MpsEmuTrace* trace, int64_t index, const MpsEmuArg* t) {
  if (trace == nullptr || trace->tracer == nullptr || t == nullptr || t->dim < 0 || t->dim > 16) {
    return 0;
  }
  using executorch::aten::ScalarType;
  using executorch::runtime::etensor::TensorImpl;
  TensorImpl::SizesType sizes[16];
  TensorImpl::DimOrderType order[16];
  TensorImpl::StridesType strides[16];
  TensorImpl::StridesType stride = 1;
  for (int32_t d = t->dim - 1; d >= 0; --d) {
    sizes[d] = t->sizes[d];
    order[d] = static_cast<TensorImpl::DimOrderType>(d);
    strides[d] = stride;
    stride *= sizes[d] > 0 ? sizes[d] : 1;
  }
  TensorImpl impl(static_cast<ScalarType>(t->dtype), t->dim, sizes, t->data, order, strides);
  Result<bool> logged = trace->tracer->log_intermediate_output_delegate(
      nullptr, index, Tensor(&impl));
  return logged.ok() ? 0 : static_cast<int32_t>(logged.error());
}

// Number of delegate handles initialised and not yet destroyed (for tests).
MPS_EMU_EXPORT int64_t mps_emu_live_handles() {
  return g_live_handles.load();
}
