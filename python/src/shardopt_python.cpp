// python/src/shardopt_python.cpp — the `shardopt` Python module (nanobind): the C++ API, taking any tensor that exposes __dlpack__ (torch, numpy, ...).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dlpack_import.hpp"
#include "optim/hyperparams.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/shardopt.h"
#include "shardopt/shardopt.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using shardopt::Error;
using shardopt::ErrorCode;

namespace {

// ---- DLPack from Python objects --------------------------------------------------------------

// Imported tensors are held by the library's own DlpackOwner (as the C ABI holds them): its
// deleter runs exactly once, when the owner is destroyed.
using shardopt::DlpackOwner;

// A pre-1.0 ("dltensor") capsule seen as a versioned tensor; deleting it deletes the original.
struct LegacyTensor {
  DLManagedTensorVersioned versioned;
  DLManagedTensor* legacy;
};

void delete_legacy(DLManagedTensorVersioned* self) {
  auto* wrapper = static_cast<LegacyTensor*>(self->manager_ctx);
  if (wrapper->legacy->deleter != nullptr) wrapper->legacy->deleter(wrapper->legacy);
  delete wrapper;
}

// Takes the DLPack tensor out of `obj` (consuming the capsule, per the protocol). torch tensors
// that require grad are detached first: the detached tensor shares the same storage.
DlpackOwner take_dlpack(nb::handle obj, const std::string& what) {
  nb::object source = nb::borrow(obj);
  if (nb::hasattr(source, "detach") && nb::hasattr(source, "requires_grad")) source = source.attr("detach")();
  if (!nb::hasattr(source, "__dlpack__")) {
    throw Error(ErrorCode::invalid_argument,
                what + ": a " + std::string(nb::type_name(source.type()).c_str()) +
                    " does not expose __dlpack__ (pass a torch tensor, a numpy array or another DLPack producer)");
  }
  nb::object capsule;
  try {
    capsule = source.attr("__dlpack__")("max_version"_a = nb::make_tuple(1, 0));
  } catch (nb::python_error& e) {
    // Producers predating DLPack 1.0 (torch < 2.4, numpy < 2.1) know no max_version.
    if (!e.matches(PyExc_TypeError)) throw;
    capsule = source.attr("__dlpack__")();
  }
  PyObject* cap = capsule.ptr();
  if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
    auto* t = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, "dltensor_versioned"));
    PyCapsule_SetName(cap, "used_dltensor_versioned");
    return DlpackOwner(t);
  }
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* legacy = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    auto* wrapper = new LegacyTensor{};
    wrapper->legacy = legacy;
    wrapper->versioned.version = DLPackVersion{1, 0};
    wrapper->versioned.manager_ctx = wrapper;
    wrapper->versioned.deleter = delete_legacy;
    wrapper->versioned.flags = 0;
    wrapper->versioned.dl_tensor = legacy->dl_tensor;
    PyCapsule_SetName(cap, "used_dltensor");
    return DlpackOwner(&wrapper->versioned);
  }
  throw Error(ErrorCode::invalid_argument, what + ": __dlpack__() did not return a DLPack capsule");
}

// The same checks as the C ABI (contiguous, f32/bf16/f16, CPU/CUDA, writable, DLPack 1.x).
shardopt::TensorRef tensor_ref(const DlpackOwner& t, const std::string& what) {
  shardopt_tensor out{};
  const shardopt_status status = shardopt_tensor_from_dlpack(t.get(), &out);
  if (status != SHARDOPT_OK) {
    std::string message = shardopt_last_error();
    const std::string prefix = "shardopt_tensor_from_dlpack: tensor: ";
    if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
    throw Error(static_cast<ErrorCode>(static_cast<int>(status)), what + ": " + message);
  }
  shardopt::TensorRef ref;
  ref.data = out.data;
  ref.numel = out.numel;
  ref.dtype = static_cast<shardopt::DType>(out.dtype);
  ref.device = out.device_kind == SHARDOPT_DEVICE_CUDA ? shardopt::Device::cuda(out.device_index) : shardopt::Device::cpu();
  return ref;
}

// ---- param groups from Python ------------------------------------------------------------------

const char* const kHyperKeys[] = {"lr", "betas", "beta1", "beta2", "eps", "weight_decay",
                                  "momentum", "dampening", "nesterov", "maximize", "amsgrad"};

[[noreturn]] void unknown_key(const std::string& key, const char* where) {
  std::string known;
  for (const char* k : kHyperKeys) known += std::string(known.empty() ? "" : ", ") + k;
  throw Error(ErrorCode::invalid_argument, "unknown " + std::string(where) + " '" + key + "' (" + known + ")");
}

// One hyperparameter key of a param-group dict (or a keyword default) into `h`, whose fields are
// optional or not: a group sets only the keys its dict has (torch's semantics), and the rest
// take the optimizer's defaults. `where` names the kind of key in the message.
template <typename Target>
void set_hyper(Target& h, const std::string& key, nb::handle value, const char* where) {
  if (key == "lr") h.lr = nb::cast<double>(value);
  else if (key == "betas") {
    const auto betas = nb::cast<std::vector<double>>(value);
    if (betas.size() != 2) throw Error(ErrorCode::invalid_argument, "betas must be a pair (beta1, beta2)");
    h.beta1 = betas[0];
    h.beta2 = betas[1];
  } else if (key == "beta1") h.beta1 = nb::cast<double>(value);
  else if (key == "beta2") h.beta2 = nb::cast<double>(value);
  else if (key == "eps") h.eps = nb::cast<double>(value);
  else if (key == "weight_decay") h.weight_decay = nb::cast<double>(value);
  else if (key == "momentum") h.momentum = nb::cast<double>(value);
  else if (key == "dampening") h.dampening = nb::cast<double>(value);
  else if (key == "nesterov") h.nesterov = nb::cast<bool>(value);
  else if (key == "maximize") h.maximize = nb::cast<bool>(value);
  else if (key == "amsgrad") h.amsgrad = nb::cast<bool>(value);
  else unknown_key(key, where);
}

// The value of one key, as a param-group dict holds it (betas as a tuple).
nb::object hyper_value(const shardopt::Hyperparams& h, const std::string& key) {
  if (key == "lr") return nb::float_(h.lr);
  if (key == "betas") return nb::make_tuple(h.beta1, h.beta2);
  if (key == "beta1") return nb::float_(h.beta1);
  if (key == "beta2") return nb::float_(h.beta2);
  if (key == "eps") return nb::float_(h.eps);
  if (key == "weight_decay") return nb::float_(h.weight_decay);
  if (key == "momentum") return nb::float_(h.momentum);
  if (key == "dampening") return nb::float_(h.dampening);
  if (key == "nesterov") return nb::bool_(h.nesterov);
  if (key == "maximize") return nb::bool_(h.maximize);
  if (key == "amsgrad") return nb::bool_(h.amsgrad);
  unknown_key(key, "hyperparameter");
}

bool same_hyper(const shardopt::Hyperparams& a, const shardopt::Hyperparams& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.momentum == b.momentum && a.dampening == b.dampening &&
         a.nesterov == b.nesterov && a.maximize == b.maximize && a.amsgrad == b.amsgrad;
}

// "lr=0.001, betas=(0.9, 0.999), ..." with Python's own float reprs (the shortest that round-trip).
std::string hyper_text(const shardopt::Hyperparams& h) {
  const auto f = [](double v) { return std::string(nb::repr(nb::float_(v)).c_str()); };
  const auto b = [](bool v) { return std::string(v ? "True" : "False"); };
  return "lr=" + f(h.lr) + ", betas=(" + f(h.beta1) + ", " + f(h.beta2) + "), eps=" + f(h.eps) +
         ", weight_decay=" + f(h.weight_decay) + ", momentum=" + f(h.momentum) + ", dampening=" + f(h.dampening) +
         ", nesterov=" + b(h.nesterov) + ", maximize=" + b(h.maximize) + ", amsgrad=" + b(h.amsgrad);
}

nb::dict hyper_dict(const shardopt::Hyperparams& h) {
  nb::dict d;
  d["lr"] = h.lr;
  d["betas"] = nb::make_tuple(h.beta1, h.beta2);
  d["eps"] = h.eps;
  d["weight_decay"] = h.weight_decay;
  d["momentum"] = h.momentum;
  d["dampening"] = h.dampening;
  d["nesterov"] = h.nesterov;
  d["maximize"] = h.maximize;
  d["amsgrad"] = h.amsgrad;
  return d;
}

// One group: {"params": [(name, tensor[, grad]), ...], "lr": ..., ...}. With external storage
// and no grad given, the tensor's own .grad is used (torch allocates it at the first backward,
// or set it to zeros beforehand).
shardopt::ParamGroupSpec group_from(nb::handle group, const shardopt::OptimizerConfig& config,
                                    std::vector<DlpackOwner>& tensors) {
  if (!nb::isinstance<nb::dict>(group)) {
    throw Error(ErrorCode::invalid_argument, "a param group must be a dict with 'params' and hyperparameters");
  }
  nb::dict d = nb::borrow<nb::dict>(group);
  if (!d.contains("params")) throw Error(ErrorCode::invalid_argument, "a param group has no 'params'");
  shardopt::ParamGroupSpec spec;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    if (k != "params") set_hyper(spec.hyper, k, value, "param group key");
  }
  for (nb::handle entry : d["params"]) {
    const std::size_t n = nb::len(entry);
    if (!nb::isinstance<nb::tuple>(entry) && !nb::isinstance<nb::list>(entry)) {
      throw Error(ErrorCode::invalid_argument, "each param must be a (name, tensor) or (name, tensor, grad) tuple");
    }
    if (n != 2 && n != 3) {
      throw Error(ErrorCode::invalid_argument, "each param must be a (name, tensor) or (name, tensor, grad) tuple");
    }
    shardopt::ParamSpec p;
    p.name = nb::cast<std::string>(entry[0]);
    nb::object param = entry[1];
    nb::object grad = n == 3 ? nb::object(entry[2]) : nb::none();
    if (grad.is_none() && config.storage == shardopt::Storage::external && nb::hasattr(param, "grad")) {
      grad = param.attr("grad");
    }
    tensors.push_back(take_dlpack(param, "parameter '" + p.name + "'"));
    p.param = tensor_ref(tensors.back(), "parameter '" + p.name + "'");
    if (!grad.is_none()) {
      tensors.push_back(take_dlpack(grad, "gradient of '" + p.name + "'"));
      p.grad = tensor_ref(tensors.back(), "gradient of '" + p.name + "'");
    } else if (config.storage == shardopt::Storage::external) {
      throw Error(ErrorCode::invalid_argument,
                  "parameter '" + p.name + "': external storage needs a gradient buffer: pass (name, param, grad), "
                  "or give the tensor a .grad (e.g. p.grad = torch.zeros_like(p))");
    }
    spec.params.push_back(std::move(p));
  }
  return spec;
}

// Reading Python objects may fail on one rank only (a read-only array, a typo): agree before the
// collective registration, so that every rank raises instead of some waiting forever.
template <typename Read>
auto read_collectively(shardopt::Communicator& comm, const char* what, Read&& read) {
  std::exception_ptr local;
  decltype(read()) result{};
  try {
    result = read();
  } catch (...) {
    local = std::current_exception();
  }
  float failed_rank = local ? static_cast<float>(comm.rank() + 1) : 0.0f;
  {
    nb::gil_scoped_release release;
    comm.all_reduce(&failed_rank, 1, shardopt::DType::f32, shardopt::ReduceOp::max);
  }
  if (local) std::rethrow_exception(local);
  if (failed_rank > 0) {
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": rank " + std::to_string(static_cast<int>(failed_rank) - 1) +
                                                 " could not read its parameters (see the error raised there)");
  }
  return result;
}

// ---- the optimizer object -------------------------------------------------------------------------

struct PyZeroOptimizer {
  std::vector<DlpackOwner> tensors;  // declared first: released after the optimizer
  std::unique_ptr<shardopt::ZeroOptimizer> opt;
};

using Groups = std::vector<shardopt::ParamGroupSpec>;

// The optimizer-level defaults (torch's `defaults`): the constructor's keyword hyperparameters
// over config.defaults, or over torch's defaults for the algorithm. Checked here, so that a bad
// value is refused even when every group sets that key itself, as torch's constructors do.
shardopt::Hyperparams defaults_from(const shardopt::OptimizerConfig& config, const nb::kwargs& keywords) {
  shardopt::Hyperparams defaults = config.defaults.value_or(shardopt::default_hyperparams(config.algorithm));
  for (auto [key, value] : keywords) set_hyper(defaults, nb::cast<std::string>(key), value, "keyword hyperparameter");
  try {
    shardopt::optim::validate_hyperparams(defaults, config.algorithm, 0);
  } catch (const Error& e) {
    // The check speaks of a group ("param group 0: invalid lr ..."); these are the defaults.
    std::string message = e.what();
    const std::string group_prefix = "param group 0: ";
    if (message.rfind(group_prefix, 0) == 0) message.erase(0, group_prefix.size());
    throw Error(e.code(), "defaults: " + message);
  }
  return defaults;
}

void init_optimizer(PyZeroOptimizer* self, std::shared_ptr<shardopt::Communicator> comm, nb::sequence groups,
                    const shardopt::OptimizerConfig& config, const nb::kwargs& keywords) {
  if (!comm) throw Error(ErrorCode::invalid_argument, "ZeroOptimizer needs a communicator (got None)");
  std::vector<DlpackOwner> tensors;
  auto [resolved, specs] = read_collectively(*comm, "ZeroOptimizer", [&] {
    shardopt::OptimizerConfig c = config;
    c.defaults = defaults_from(config, keywords);
    Groups out;
    for (nb::handle g : groups) out.push_back(group_from(g, c, tensors));
    return std::make_pair(c, std::move(out));
  });
  std::unique_ptr<shardopt::ZeroOptimizer> opt;
  {
    nb::gil_scoped_release release;
    opt = std::make_unique<shardopt::ZeroOptimizer>(comm, resolved, std::move(specs));
  }
  new (self) PyZeroOptimizer{std::move(tensors), std::move(opt)};
}

// ---- one group's hyperparameters, live --------------------------------------------------------

// What opt.hyperparams(g) returns: the optimizer object (kept alive by this reference) and a
// group index, never a reference into the optimizer's storage. Each read or write goes through
// ZeroOptimizer::hyperparams(index) at that moment, so it can neither dangle nor miss a write.
struct HyperparamsView {
  nb::object owner;  // the Python ZeroOptimizer
  int group = 0;

  shardopt::ZeroOptimizer& opt() const { return *nb::cast<PyZeroOptimizer&>(owner).opt; }
  shardopt::Hyperparams get() const { return opt().hyperparams(group); }
  // Checked before it is stored (as the C ABI's set_hyperparams does), so a refused value raises
  // at the assignment and leaves the group as it was.
  void set(const shardopt::Hyperparams& next) const {
    shardopt::ZeroOptimizer& o = opt();
    shardopt::optim::validate_hyperparams(next, o.config().algorithm, group);
    o.hyperparams(group) = next;
  }
};

HyperparamsView hyperparams_view(nb::handle self, int group) {
  nb::cast<PyZeroOptimizer&>(self).opt->hyperparams(group);  // raises for a group that does not exist
  return HyperparamsView{nb::borrow(self), group};
}

template <typename T>
void def_view_field(nb::class_<HyperparamsView>& cls, const char* name, T shardopt::Hyperparams::*field) {
  cls.def_prop_rw(
      name, [field](const HyperparamsView& v) { return v.get().*field; },
      [field](const HyperparamsView& v, T value) {
        shardopt::Hyperparams h = v.get();
        h.*field = value;
        v.set(h);
      });
}

// Equality by value with another view, a Hyperparams or a param-group-style dict of all keys.
nb::object view_equals(const HyperparamsView& v, nb::handle other) {
  const shardopt::Hyperparams mine = v.get();
  if (nb::isinstance<HyperparamsView>(other)) return nb::bool_(same_hyper(mine, nb::cast<HyperparamsView&>(other).get()));
  if (nb::isinstance<shardopt::Hyperparams>(other)) return nb::bool_(same_hyper(mine, nb::cast<shardopt::Hyperparams&>(other)));
  if (nb::isinstance<nb::dict>(other)) return nb::bool_(hyper_dict(mine).equal(other));
  return nb::borrow(Py_NotImplemented);
}

// A view of shardopt's (or the caller's) buffer, kept valid by the optimizer object `owner`:
// a numpy array for CPU f32/f16, otherwise an array exposing __dlpack__ (torch.from_dlpack).
nb::object view(const shardopt::TensorRef& ref, nb::handle owner) {
  const std::size_t shape[1] = {static_cast<std::size_t>(ref.numel)};
  nb::dlpack::dtype dtype = nb::dtype<float>();
  if (ref.dtype == shardopt::DType::f16) dtype = nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
  if (ref.dtype == shardopt::DType::bf16) dtype = nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  const int32_t device_type = ref.device.is_cuda() ? nb::device::cuda::value : nb::device::cpu::value;
  const int32_t device_id = ref.device.is_cuda() ? ref.device.index : 0;
  if (ref.device.is_cpu() && ref.dtype != shardopt::DType::bf16) {
    return nb::cast(nb::ndarray<nb::numpy>(ref.data, 1, shape, owner, nullptr, dtype, device_type, device_id));
  }
  return nb::cast(nb::ndarray<>(ref.data, 1, shape, owner, nullptr, dtype, device_type, device_id));
}

nb::object numpy_copy(const std::vector<float>& values) {
  auto* heap = new std::vector<float>(values);
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  const std::size_t shape[1] = {heap->size()};
  return nb::cast(nb::ndarray<nb::numpy, float, nb::ndim<1>>(heap->data(), 1, shape, owner));
}

// torch's optimizer.state_dict() layout, plus the names shardopt checks on load.
nb::dict state_dict_to_python(const shardopt::StateDict& sd) {
  nb::dict state;
  for (const auto& [id, ps] : sd.state) {
    nb::dict entry;
    entry["step"] = ps.step;
    for (const auto& [kind, values] : ps.tensors) entry[kind.c_str()] = numpy_copy(values);
    state[nb::int_(id)] = entry;
  }
  nb::list groups;
  for (const shardopt::ParamGroupState& g : sd.param_groups) {
    nb::dict d = hyper_dict(g.hyper);
    d["params"] = nb::cast(g.params);
    groups.append(d);
  }
  nb::dict out;
  out["algorithm"] = shardopt::algorithm_name(sd.algorithm);
  out["param_names"] = nb::cast(sd.param_names);
  out["state"] = state;
  out["param_groups"] = groups;
  return out;
}

shardopt::StateDict state_dict_from_python(nb::dict d) {
  shardopt::StateDict sd;
  const std::string algorithm = nb::cast<std::string>(d["algorithm"]);
  bool known = false;
  for (shardopt::Algorithm a : {shardopt::Algorithm::sgd, shardopt::Algorithm::adam, shardopt::Algorithm::adamw}) {
    if (algorithm == shardopt::algorithm_name(a)) {
      sd.algorithm = a;
      known = true;
    }
  }
  if (!known) throw Error(ErrorCode::invalid_argument, "state dict: unknown algorithm '" + algorithm + "'");
  sd.param_names = nb::cast<std::vector<std::string>>(d["param_names"]);
  for (auto [key, value] : nb::borrow<nb::dict>(d["state"])) {
    shardopt::ParamState ps;
    for (auto [kind, tensor] : nb::borrow<nb::dict>(value)) {
      const std::string k = nb::cast<std::string>(kind);
      if (k == "step") {
        ps.step = nb::cast<int64_t>(tensor);
        continue;
      }
      auto array = nb::cast<nb::ndarray<const float, nb::c_contig, nb::device::cpu>>(tensor);
      ps.tensors[k].assign(array.data(), array.data() + array.size());
    }
    sd.state[nb::cast<shardopt::ParamId>(key)] = std::move(ps);
  }
  for (nb::handle g : nb::borrow<nb::list>(d["param_groups"])) {
    shardopt::ParamGroupState gs;
    for (auto [key, value] : nb::borrow<nb::dict>(g)) {
      const std::string k = nb::cast<std::string>(key);
      if (k == "params") gs.params = nb::cast<std::vector<shardopt::ParamId>>(value);
      else set_hyper(gs.hyper, k, value, "param group key");
    }
    sd.param_groups.push_back(std::move(gs));
  }
  return sd;
}

}  // namespace

NB_MODULE(_shardopt, m) {
  m.doc() = "shardopt: ZeRO-style sharded optimizers over MPI, for tensors exposing __dlpack__";

  // shardopt.Error(RuntimeError) with .code ("mismatch", "timeout", ...).
  static nb::object error_type = nb::steal(PyErr_NewException("shardopt.Error", PyExc_RuntimeError, nullptr));
  m.attr("Error") = error_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::object instance = error_type(e.what());
      instance.attr("code") = shardopt::error_code_name(e.code());
      PyErr_SetObject(error_type.ptr(), instance.ptr());
    }
  });

  m.def("version", &shardopt::version, "The library version, 'major.minor.patch'.");
  m.def("nccl_compiled_in", &shardopt::nccl_compiled_in);

  nb::enum_<shardopt::Algorithm>(m, "Algorithm")
      .value("sgd", shardopt::Algorithm::sgd)
      .value("adam", shardopt::Algorithm::adam)
      .value("adamw", shardopt::Algorithm::adamw);
  nb::enum_<shardopt::PartitionStrategy>(m, "PartitionStrategy")
      .value("flat", shardopt::PartitionStrategy::flat)
      .value("sorted_greedy", shardopt::PartitionStrategy::sorted_greedy);
  nb::enum_<shardopt::Storage>(m, "Storage")
      .value("bucket_view", shardopt::Storage::bucket_view)
      .value("external", shardopt::Storage::external);

  nb::class_<shardopt::Communicator>(m, "Communicator")
      .def_prop_ro("rank", &shardopt::Communicator::rank)
      .def_prop_ro("size", &shardopt::Communicator::size)
      .def_prop_ro("backend", &shardopt::Communicator::backend_name)
      .def("barrier", &shardopt::Communicator::barrier, nb::call_guard<nb::gil_scoped_release>())
      .def("split", &shardopt::Communicator::split, "color"_a, "key"_a = 0,
           "Collective: ranks passing the same color form a new communicator, ordered by key.",
           nb::call_guard<nb::gil_scoped_release>())
      .def("__repr__", [](const shardopt::Communicator& c) {
        return "<shardopt.Communicator " + std::string(c.backend_name()) + " rank " + std::to_string(c.rank()) +
               " of " + std::to_string(c.size()) + ">";
      });

  m.def(
      "mpi_world",
      [](double timeout_seconds) {
        shardopt::CommOptions options;
        options.timeout_seconds = timeout_seconds;
        return shardopt::mpi_world(options);
      },
      "timeout_seconds"_a = 600.0,
      "MPI_COMM_WORLD; initialises MPI if nobody has, finalises it when the last communicator goes.");
  m.def(
      "nccl_world",
      [](double timeout_seconds) {
        shardopt::CommOptions options;
        options.timeout_seconds = timeout_seconds;
        return shardopt::nccl_world(options);
      },
      "timeout_seconds"_a = 600.0, "One NCCL rank per MPI rank (raises shardopt.Error where NCCL is not built in).");

  nb::class_<shardopt::OptimizerConfig>(m, "OptimizerConfig")
      .def(
          "__init__",
          [](shardopt::OptimizerConfig* self, shardopt::Algorithm algorithm, shardopt::PartitionStrategy partition,
             shardopt::Storage storage, bool shard_state, int64_t bucket_bytes, int cpu_threads) {
            new (self) shardopt::OptimizerConfig{algorithm, partition, storage, shard_state, bucket_bytes, cpu_threads};
          },
          "algorithm"_a = shardopt::Algorithm::adam, "partition"_a = shardopt::PartitionStrategy::flat,
          "storage"_a = shardopt::Storage::bucket_view, "shard_state"_a = true, "bucket_bytes"_a = shardopt::OptimizerConfig{}.bucket_bytes,
          "cpu_threads"_a = 0)
      .def_rw("algorithm", &shardopt::OptimizerConfig::algorithm)
      .def_rw("partition", &shardopt::OptimizerConfig::partition)
      .def_rw("storage", &shardopt::OptimizerConfig::storage)
      .def_rw("shard_state", &shardopt::OptimizerConfig::shard_state)
      .def_rw("bucket_bytes", &shardopt::OptimizerConfig::bucket_bytes)
      .def_rw("cpu_threads", &shardopt::OptimizerConfig::cpu_threads)
      .def_prop_rw(
          "defaults", [](const shardopt::OptimizerConfig& c) { return c.defaults; },
          [](shardopt::OptimizerConfig& c, std::optional<shardopt::Hyperparams> d) { c.defaults = std::move(d); },
          nb::arg("defaults").none(),
          "The optimizer-level Hyperparams that groups' missing keys take (None: torch's defaults for the\n"
              "algorithm; ZeroOptimizer's keyword hyperparameters override it).");

  nb::class_<shardopt::Hyperparams>(m, "Hyperparams")
      .def(nb::init<>())
      .def_rw("lr", &shardopt::Hyperparams::lr)
      .def_rw("beta1", &shardopt::Hyperparams::beta1)
      .def_rw("beta2", &shardopt::Hyperparams::beta2)
      .def_rw("eps", &shardopt::Hyperparams::eps)
      .def_rw("weight_decay", &shardopt::Hyperparams::weight_decay)
      .def_rw("momentum", &shardopt::Hyperparams::momentum)
      .def_rw("dampening", &shardopt::Hyperparams::dampening)
      .def_rw("nesterov", &shardopt::Hyperparams::nesterov)
      .def_rw("maximize", &shardopt::Hyperparams::maximize)
      .def_rw("amsgrad", &shardopt::Hyperparams::amsgrad)
      .def("as_dict", &hyper_dict)
      .def("__repr__", [](const shardopt::Hyperparams& h) { return "shardopt.Hyperparams(" + hyper_text(h) + ")"; })
      .def("__eq__",
           [](const shardopt::Hyperparams& h, nb::handle other) -> nb::object {
             if (nb::isinstance<shardopt::Hyperparams>(other)) {
               return nb::bool_(same_hyper(h, nb::cast<shardopt::Hyperparams&>(other)));
             }
             return nb::borrow(Py_NotImplemented);  // Python then tries the other side (a view)
           });
  // Mutable: not hashable, as a dict is not.
  m.attr("Hyperparams").attr("__hash__") = nb::none();
  m.def("default_hyperparams", &shardopt::default_hyperparams, "algorithm"_a,
        "torch.optim's constructor defaults for the algorithm (AdamW: weight_decay 0.01).");

  nb::class_<HyperparamsView> view_class(
      m, "HyperparamsView",
      "One param group's hyperparameters, live: reads and writes go to the optimizer at that moment\n"
      "(a write takes effect at the next step, and is checked first). Keeps its optimizer alive.");
  def_view_field(view_class, "lr", &shardopt::Hyperparams::lr);
  def_view_field(view_class, "beta1", &shardopt::Hyperparams::beta1);
  def_view_field(view_class, "beta2", &shardopt::Hyperparams::beta2);
  def_view_field(view_class, "eps", &shardopt::Hyperparams::eps);
  def_view_field(view_class, "weight_decay", &shardopt::Hyperparams::weight_decay);
  def_view_field(view_class, "momentum", &shardopt::Hyperparams::momentum);
  def_view_field(view_class, "dampening", &shardopt::Hyperparams::dampening);
  def_view_field(view_class, "nesterov", &shardopt::Hyperparams::nesterov);
  def_view_field(view_class, "maximize", &shardopt::Hyperparams::maximize);
  def_view_field(view_class, "amsgrad", &shardopt::Hyperparams::amsgrad);
  view_class
      .def_prop_rw(
          "betas", [](const HyperparamsView& v) { return std::make_pair(v.get().beta1, v.get().beta2); },
          [](const HyperparamsView& v, std::pair<double, double> betas) {
            shardopt::Hyperparams h = v.get();
            h.beta1 = betas.first;
            h.beta2 = betas.second;
            v.set(h);
          })
      .def_prop_ro("group", [](const HyperparamsView& v) { return v.group; })
      // torch's param_groups[g]["lr"] idiom: the same keys as a param-group dict.
      .def("__getitem__", [](const HyperparamsView& v, const std::string& key) { return hyper_value(v.get(), key); })
      .def("__setitem__",
           [](const HyperparamsView& v, const std::string& key, nb::handle value) {
             shardopt::Hyperparams h = v.get();
             set_hyper(h, key, value, "hyperparameter");
             v.set(h);
           })
      .def("keys", [](const HyperparamsView&) { return hyper_dict(shardopt::Hyperparams{}).attr("keys")(); })
      .def("get", [](const HyperparamsView& v) { return v.get(); }, "A copy: a Hyperparams detached from the optimizer.")
      .def("set", [](const HyperparamsView& v, const shardopt::Hyperparams& h) { v.set(h); }, "hyper"_a,
           "Replaces every field at once (checked first).")
      .def("as_dict", [](const HyperparamsView& v) { return hyper_dict(v.get()); })
      .def("__eq__", &view_equals)
      .def("__repr__", [](const HyperparamsView& v) {
        return "<shardopt.HyperparamsView group " + std::to_string(v.group) + ": " + hyper_text(v.get()) + ">";
      });
  view_class.attr("__hash__") = nb::none();

  nb::class_<shardopt::MemoryReport>(m, "MemoryReport")
      .def_ro("state_bytes", &shardopt::MemoryReport::state_bytes)
      .def_ro("master_bytes", &shardopt::MemoryReport::master_bytes)
      .def_ro("param_bytes", &shardopt::MemoryReport::param_bytes)
      .def_ro("grad_bytes", &shardopt::MemoryReport::grad_bytes)
      .def_ro("buffer_bytes", &shardopt::MemoryReport::buffer_bytes)
      .def_ro("shard_numel", &shardopt::MemoryReport::shard_numel)
      .def_ro("trainable_numel", &shardopt::MemoryReport::trainable_numel);

  using Opt = PyZeroOptimizer;
  nb::class_<Opt>(m, "ZeroOptimizer")
      .def("__init__", &init_optimizer, "comm"_a, "param_groups"_a, "config"_a = shardopt::OptimizerConfig(),
           "defaults"_a,
           "Collective. param_groups: [{'params': [(name, tensor[, grad]), ...], 'lr': ..., ...}]; tensors are\n"
           "anything exposing __dlpack__. bucket_view storage copies their initial values; external storage\n"
           "updates them in place (gradients: the third element, or the tensor's .grad). Keyword\n"
           "hyperparameters (lr=..., betas=..., ...) are the optimizer's defaults, as torch's constructor\n"
           "arguments: a group's missing keys take them, here and in add_param_group.")
      .def(
          "add_param_group",
          [](Opt& self, nb::handle group) {
            std::vector<DlpackOwner> tensors;
            shardopt::ParamGroupSpec spec = read_collectively(self.opt->communicator(), "add_param_group", [&] {
              return group_from(group, self.opt->config(), tensors);
            });
            int index;
            {
              nb::gil_scoped_release release;
              index = self.opt->add_param_group(std::move(spec));
            }
            for (DlpackOwner& t : tensors) self.tensors.push_back(std::move(t));
            return index;
          },
          "group"_a, "Collective; returns the new group's index. Keys the dict lacks take the optimizer's defaults.")
      .def("set_trainable", [](Opt& s, shardopt::ParamId id, bool t) { s.opt->set_trainable(id, t); }, "id"_a, "trainable"_a)
      .def("trainable", [](const Opt& s, shardopt::ParamId id) { return s.opt->trainable(id); }, "id"_a)
      .def("num_groups", [](const Opt& s) { return s.opt->num_groups(); })
      .def("num_params", [](const Opt& s) { return s.opt->num_params(); })
      .def("hyperparams", &hyperparams_view, "group"_a,
           "The group's hyperparameters, live (a HyperparamsView): assigning a field (e.g. .lr) takes effect\n"
           "at the next step.")
      .def_prop_ro(
          "param_groups",
          [](nb::handle self) {
            std::vector<HyperparamsView> groups;
            const int n = nb::cast<Opt&>(self).opt->num_groups();
            for (int g = 0; g < n; ++g) groups.push_back(hyperparams_view(self, g));
            return groups;
          },
          "A live HyperparamsView per group, e.g. for g in opt.param_groups: g['lr'] = lr.")
      .def_prop_ro("defaults", [](const Opt& s) { return s.opt->defaults(); },
                   "The optimizer-level defaults (a copy), which groups' missing keys take.")
      .def("find_param", [](const Opt& s, const std::string& name) { return s.opt->find_param(name); }, "name"_a)
      .def("param_name", [](const Opt& s, shardopt::ParamId id) { return s.opt->param_name(id); }, "id"_a)
      .def("param_group", [](const Opt& s, shardopt::ParamId id) { return s.opt->param_group(id); }, "id"_a)
      .def("param_step", [](const Opt& s, shardopt::ParamId id) { return s.opt->param_step(id); }, "id"_a)
      .def("param_owner", [](const Opt& s, shardopt::ParamId id) { return s.opt->param_owner(id); }, "id"_a)
      .def(
          "param_view", [](nb::handle self, shardopt::ParamId id) { return view(nb::cast<Opt&>(self).opt->param_view(id), self); },
          "id"_a, "bucket_view: a view into shardopt's flat buffer (moves when layout_version() changes).")
      .def(
          "grad_view", [](nb::handle self, shardopt::ParamId id) { return view(nb::cast<Opt&>(self).opt->grad_view(id), self); },
          "id"_a, "bucket_view: write gradients here before reduce_gradients()/step().")
      .def("layout_version", [](const Opt& s) { return s.opt->layout_version(); })
      .def("zero_grad", [](Opt& s) { s.opt->zero_grad(); }, nb::call_guard<nb::gil_scoped_release>())
      .def("reduce_gradients", [](Opt& s) { s.opt->reduce_gradients(); }, nb::call_guard<nb::gil_scoped_release>(),
           "Collective: averages gradients over the ranks (skip it under DDP).")
      .def(
          "step",
          [](Opt& s, nb::object closure) -> nb::object {
            if (closure.is_none()) {
              nb::gil_scoped_release release;
              s.opt->step();
              return nb::none();
            }
            const double loss = s.opt->step([&] { return nb::cast<double>(closure()); });
            return nb::float_(loss);
          },
          "closure"_a = nb::none(), "Collective: updates this rank's shard, then syncs parameters to every rank.")
      .def("memory_report", [](const Opt& s) { return s.opt->memory_report(); })
      .def("save", [](Opt& s, const std::string& dir) { s.opt->save(dir); }, "dir"_a,
           nb::call_guard<nb::gil_scoped_release>(), "Collective: a sharded checkpoint in dir.")
      .def("load", [](Opt& s, const std::string& dir) { s.opt->load(dir); }, "dir"_a,
           nb::call_guard<nb::gil_scoped_release>(), "Collective: restores from dir, resharding as needed.")
      .def("consolidate_state_dict", [](Opt& s, int to) { s.opt->consolidate_state_dict(to); }, "to"_a = 0,
           nb::call_guard<nb::gil_scoped_release>())
      .def("state_dict", [](const Opt& s) { return state_dict_to_python(s.opt->state_dict()); },
           "torch's layout; only on the rank that consolidated.")
      .def("load_state_dict", [](Opt& s, nb::dict d) { s.opt->load_state_dict(state_dict_from_python(d)); }, "state"_a)
      .def_prop_ro(
          "communicator", [](const Opt& s) -> shardopt::Communicator& { return s.opt->communicator(); },
          nb::rv_policy::reference_internal)
      .def_prop_ro("config", [](const Opt& s) { return s.opt->config(); });
}
