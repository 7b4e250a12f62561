// python/src/py_communicator.cpp — shardopt::Communicator over a Python object's methods (torch.distributed's transport under shardopt's kernels).
//
// The library calls a communicator from C++ with the GIL released (the optimizer's long calls
// release it), so every call into Python takes the GIL first. Buffers go to Python without a
// copy, as DLPack arrays over the library's own memory, valid until the collective completes.
// A Python exception inside a collective becomes Error(comm) (Error(timeout) for a transport
// timeout) carrying the Python message, and poisons the communicator as the MPI one is
// poisoned: every later call on it, or on its pending collectives, raises at once.
//
// A communicator over device memory (torch's NCCL group) is a CUDA-aware host-timeline one, as
// a CUDA-aware MPI is: device() is the CPU, cuda_aware() is true, so the optimizer synchronises
// its stream before each collective and the Python side completes each on the host's timeline.
// Its buffers may then be host memory (the agreement's records) or device memory (the params),
// which the CUDA driver tells apart.
#include "py_communicator.hpp"

#include <dlfcn.h>

#include <cstdint>

#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "shardopt/comm_backend.hpp"
#include "shardopt/dlpack.h"
#include "shardopt/shardopt.hpp"

namespace shardopt_python {

using shardopt::Communicator;
using shardopt::DType;
using shardopt::Error;
using shardopt::ErrorCode;
using shardopt::PendingCollective;
using shardopt::ReduceOp;

namespace {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "unknown";
}

// A reference to a Python object that may be dropped on any thread: the reference is released
// under the GIL, or left alone once the interpreter is going away (a leak at exit, never a crash).
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(nb::object object) : object_(std::move(object)) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { reset(); }
  const nb::object& get() const { return object_; }
  void reset() {
    if (!object_.is_valid()) return;
    if (Py_IsInitialized() && nb::is_alive()) {
      nb::gil_scoped_acquire gil;
      object_.reset();
    } else {
      object_.release();
    }
  }

 private:
  nb::object object_;
};

// What a communicator shares with its pending collectives: the Python object, and the poison.
class State {
 public:
  State(nb::object impl, int rank, int size, bool cuda_aware, std::string backend)
      : impl_(std::move(impl)), rank_(rank), size_(size), cuda_aware_(cuda_aware), backend_(std::move(backend)) {}

  const nb::object& impl() const { return impl_.get(); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool cuda_aware() const { return cuda_aware_; }
  const std::string& backend() const { return backend_; }

  void check_usable(const char* op) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (unusable_.empty()) return;
    throw Error(unusable_code_, std::string(op) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                                    " refused: this " + backend_ + " communicator is unusable since an earlier collective " +
                                    (unusable_code_ == ErrorCode::timeout ? "timed out" : "failed") + " (" + unusable_ +
                                    "); create a new communicator");
  }

  // Runs `call` (which calls into Python) under the GIL; a failure poisons this state and is
  // raised as Error(comm), or Error(timeout) when the transport says it timed out.
  template <typename Call>
  nb::object call_python(const char* op, Call&& call) {
    check_usable(op);
    std::string failure;
    {
      nb::gil_scoped_acquire gil;
      try {
        return call();
      } catch (nb::python_error& e) {
        failure = std::string(nb::type_name(e.type()).c_str()) + ": " + nb::str(e.value()).c_str();
      } catch (const Error& e) {
        failure = e.what();
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    const bool timed_out = failure.find("Timed out") != std::string::npos ||
                           failure.find("timed out") != std::string::npos;
    const std::lock_guard<std::mutex> lock(mutex_);
    unusable_ = std::string(op) + " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " failed in " +
                backend_ + ": " + failure;
    unusable_code_ = timed_out ? ErrorCode::timeout : ErrorCode::comm;
    throw Error(unusable_code_, unusable_ + "; the communicator is now unusable");
  }

 private:
  PyRef impl_;
  const int rank_;
  const int size_;
  const bool cuda_aware_;
  const std::string backend_;
  mutable std::mutex mutex_;
  std::string unusable_;  // empty while usable
  ErrorCode unusable_code_ = ErrorCode::comm;
};

// The Python object's waitable (anything with wait(), or None when already complete).
class PythonPending final : public PendingCollective {
 public:
  PythonPending(std::shared_ptr<State> state, const char* op, nb::object work)
      : state_(std::move(state)), op_(op), work_(std::move(work)) {}

  void wait() override {
    if (done_) return;
    state_->call_python(op_, [&] {
      if (!work_.get().is_none()) work_.get().attr("wait")();
      return nb::none();
    });
    done_ = true;
    work_.reset();
  }

 private:
  std::shared_ptr<State> state_;
  const char* op_;
  PyRef work_;
  bool done_ = false;
};

// Where a buffer lives, as the CUDA driver says (libcuda, loaded on first use, so that the module
// needs no CUDA toolkit): device memory (or managed) is cuda:<ordinal>, anything else the host.
shardopt::Device locate(const void* p) {
  using GetAttribute = int (*)(void* data, int attribute, unsigned long long pointer);
  static const GetAttribute get_attribute = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return driver == nullptr ? nullptr : reinterpret_cast<GetAttribute>(dlsym(driver, "cuPointerGetAttribute"));
  }();
  constexpr int kMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
  constexpr int kDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
  constexpr unsigned kDeviceMemory = 2;  // CU_MEMORYTYPE_DEVICE
  if (get_attribute == nullptr || p == nullptr) return shardopt::Device::cpu();
  const auto pointer = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p));
  unsigned memory_type = 0;
  // Plain host memory is unknown to the driver: an error, which means the host.
  if (get_attribute(&memory_type, kMemoryType, pointer) != 0 || memory_type != kDeviceMemory) {
    return shardopt::Device::cpu();
  }
  int ordinal = 0;
  if (get_attribute(&ordinal, kDeviceOrdinal, pointer) != 0) return shardopt::Device::cpu();
  return shardopt::Device::cuda(ordinal);
}

// The library's buffer as a one-dimensional DLPack capsule ("dltensor": uint8 for byte). It owns
// nothing: the collective's caller keeps the memory alive. Its deleter touches no Python object,
// so the consumer may drop it on any thread at any time: torch's gloo worker thread often holds
// the last reference to a finished collective's tensors, and takes it down after the main thread
// has started finalising the interpreter, where taking the GIL ends the thread (inside torch's
// noexcept destructor: std::terminate, an abort at exit). nanobind's own ndarray capsules take
// the GIL in their deleter, hence this one.
struct BufferExport {
  DLManagedTensor managed{};
  int64_t shape[1] = {0};
  int64_t strides[1] = {1};
};

void delete_buffer_export(DLManagedTensor* managed) { delete static_cast<BufferExport*>(managed->manager_ctx); }

void delete_unconsumed_capsule(PyObject* capsule) {
  // Only a capsule nobody consumed still owns its tensor (a consumer renames it "used_dltensor").
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    managed->deleter(managed);
  }
}

nb::object buffer_array(const void* data, int64_t count, DType dtype, shardopt::Device device) {
  auto buffer = std::make_unique<BufferExport>();
  buffer->shape[0] = count;
  DLTensor& t = buffer->managed.dl_tensor;
  t.data = const_cast<void*>(data);
  t.device = DLDevice{device.is_cuda() ? kDLCUDA : kDLCPU, device.is_cuda() ? device.index : 0};
  t.ndim = 1;
  t.dtype = DLDataType{static_cast<uint8_t>(kDLFloat), 32, 1};
  if (dtype == DType::f16) t.dtype = DLDataType{static_cast<uint8_t>(kDLFloat), 16, 1};
  if (dtype == DType::bf16) t.dtype = DLDataType{static_cast<uint8_t>(kDLBfloat), 16, 1};
  if (dtype == DType::byte) t.dtype = DLDataType{static_cast<uint8_t>(kDLUInt), 8, 1};
  t.shape = buffer->shape;
  t.strides = buffer->strides;
  t.byte_offset = 0;
  buffer->managed.manager_ctx = buffer.get();
  buffer->managed.deleter = delete_buffer_export;
  PyObject* capsule = PyCapsule_New(&buffer->managed, "dltensor", delete_unconsumed_capsule);
  if (capsule == nullptr) throw nb::python_error();
  buffer.release();  // the capsule (or its consumer) owns it now
  return nb::steal(capsule);
}

// Refuses config.overlap: the optimizer would call it from its communication thread, where each
// collective needs the GIL and the Python transport (torch.distributed) would be driven from a
// second thread beside the trainer's own calls. A clear Error(unsupported) at construction, on
// every rank alike, instead of a deadlock or a reordering at the first overlapped round.
std::shared_ptr<shardopt::CommBackend> python_backend(nb::object impl);

class PythonBackend final : public shardopt::CommBackend {
 public:
  explicit PythonBackend(std::shared_ptr<State> state) : state_(std::move(state)) {}

  void require_serialized_calls() const override {
    throw Error(ErrorCode::unsupported,
                "config.overlap needs a communicator the optimizer can call from its communication thread; this " +
                    state_->backend() +
                    " communicator is implemented in Python (e.g. over a torch.distributed process group), whose "
                    "calls need the GIL and the launching thread: use overlap = off with it, or launch under mpirun "
                    "and build the optimizer over shardopt.mpi_world()");
  }

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  // Host-timeline collectives (no stream is exposed), on device buffers too when CUDA-aware.
  shardopt::Device device() const override { return shardopt::Device::cpu(); }
  const char* backend_name() const override { return state_->backend().c_str(); }
  bool cuda_aware() const override { return state_->cuda_aware(); }

  // The blocking collectives are CommBackend's defaults: start, then wait.
  void barrier() override {
    PythonPending(state_, "barrier", state_->call_python("barrier", [&] { return state_->impl().attr("barrier")(); }))
        .wait();
  }

  std::unique_ptr<PendingCollective> broadcast_async(void* buffer, int64_t count, DType dtype, int root) override {
    check_count(count, "broadcast");
    check_root(root, "broadcast");
    return start("broadcast", [&] {
      return state_->impl().attr("broadcast")(array(buffer, count, dtype), root);
    });
  }
  std::unique_ptr<PendingCollective> all_gather_async(const void* send, void* recv, int64_t count,
                                                      DType dtype) override {
    check_count(count, "all_gather");
    return start("all_gather", [&] {
      return state_->impl().attr("all_gather")(array(send, count, dtype), array(recv, count * size(), dtype));
    });
  }
  std::unique_ptr<PendingCollective> all_reduce_async(void* buffer, int64_t count, DType dtype,
                                                      ReduceOp op) override {
    check_count(count, "all_reduce");
    check_reduction(dtype, op, "all_reduce");
    return start("all_reduce", [&] {
      return state_->impl().attr("all_reduce")(array(buffer, count, dtype), op_name(op));
    });
  }
  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* send, void* recv, int64_t count, DType dtype,
                                                          ReduceOp op) override {
    check_count(count, "reduce_scatter");
    check_reduction(dtype, op, "reduce_scatter");
    return start("reduce_scatter", [&] {
      return state_->impl().attr("reduce_scatter")(array(send, count * size(), dtype), array(recv, count, dtype),
                                                   op_name(op));
    });
  }
  std::unique_ptr<PendingCollective> reduce_async(const void* send, void* recv, int64_t count, DType dtype,
                                                  ReduceOp op, int root) override {
    check_count(count, "reduce");
    check_root(root, "reduce");
    check_reduction(dtype, op, "reduce");
    return start("reduce", [&] {
      // recv is not significant off the root: the Python side gets None there.
      nb::object out = rank() == root ? array(recv, count, dtype) : nb::none();
      return state_->impl().attr("reduce")(array(send, count, dtype), out, op_name(op), root);
    });
  }

  std::shared_ptr<shardopt::CommBackend> split(int color, int key) override {
    std::shared_ptr<shardopt::CommBackend> child;
    state_->call_python("split", [&] {
      nb::object impl = state_->impl().attr("split")(color, key);
      if (!impl.is_none()) child = python_backend(impl);
      return nb::none();
    });
    return child;
  }
  // No shared host memory between the ranks of a Python communicator: null, as NCCL's is.
  std::shared_ptr<shardopt::CommBackend> split_node() override { return nullptr; }

 private:
  nb::object array(const void* data, int64_t count, DType dtype) const {
    return buffer_array(data, count, dtype, state_->cuda_aware() ? locate(data) : shardopt::Device::cpu());
  }
  template <typename Call>
  std::unique_ptr<PendingCollective> start(const char* op, Call&& call) {
    nb::object work = state_->call_python(op, std::forward<Call>(call));
    return std::make_unique<PythonPending>(state_, op, std::move(work));
  }
  void check_count(int64_t count, const char* op) const {
    state_->check_usable(op);
    if (count < 0) throw Error(ErrorCode::invalid_argument, std::string(op) + ": negative count " + std::to_string(count));
  }
  void check_root(int root, const char* op) const {
    if (root < 0 || root >= size()) {
      throw Error(ErrorCode::invalid_argument, std::string(op) + ": root " + std::to_string(root) +
                                                   " is not a rank of this " + std::to_string(size()) +
                                                   "-rank communicator");
    }
  }
  void check_reduction(DType dtype, ReduceOp op, const char* name) const {
    if (dtype == DType::byte) {
      throw Error(ErrorCode::unsupported,
                  std::string(name) + " over " + state_->backend() +
                      " cannot reduce dtype byte: byte is raw bytes that collectives move (broadcast, all_gather) "
                      "without arithmetic; reductions take f32, bf16 and f16");
    }
    if (op != ReduceOp::sum && op != ReduceOp::avg && op != ReduceOp::max) {
      throw Error(ErrorCode::unsupported, std::string(name) + " over " + state_->backend() + ": unknown reduce op " +
                                              std::to_string(static_cast<int>(op)));
    }
  }

  std::shared_ptr<State> state_;
};

std::shared_ptr<shardopt::CommBackend> python_backend(nb::object impl) {
  const int rank = nb::cast<int>(impl.attr("rank")());
  const int size = nb::cast<int>(impl.attr("size")());
  const bool cuda_aware = nb::hasattr(impl, "cuda_aware") && nb::cast<bool>(impl.attr("cuda_aware")());
  std::string backend = nb::cast<std::string>(impl.attr("backend")());
  if (size < 1 || rank < 0 || rank >= size) {
    throw Error(ErrorCode::invalid_argument, "communicator: rank " + std::to_string(rank) + " of " +
                                                 std::to_string(size) + " is not a rank of the group");
  }
  return std::make_shared<PythonBackend>(
      std::make_shared<State>(std::move(impl), rank, size, cuda_aware, std::move(backend)));
}

}  // namespace

std::shared_ptr<Communicator> python_communicator(nb::object impl) {
  return std::make_shared<Communicator>(python_backend(std::move(impl)));
}

}  // namespace shardopt_python
