// python/src/shardopt_python.cpp — the `shardopt` Python module (nanobind): the C++ API's classes and functions, taking any tensor that exposes __dlpack__ (torch, numpy, ...).
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

#include "py_averaging.hpp"
#include "py_collectives.hpp"
#include "py_communicator.hpp"
#include "py_hyperparams.hpp"
#include "py_hyperparams_view.hpp"
#include "py_optimizer.hpp"
#include "py_remote.hpp"
#include "py_report.hpp"
#include "py_state_dict.hpp"
#include "py_tensors.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/shardopt.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace shardopt_python;
using shardopt::Error;

namespace {

// A read-write property of HyperparamsView for one field of Hyperparams.
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
      .value("adamw", shardopt::Algorithm::adamw)
      .value("muon", shardopt::Algorithm::muon);
  nb::enum_<shardopt::MatrixPrecision>(m, "MatrixPrecision")
      .value("bf16", shardopt::MatrixPrecision::bf16)
      .value("f32", shardopt::MatrixPrecision::f32);
  nb::enum_<shardopt::PartitionStrategy>(m, "PartitionStrategy")
      .value("flat", shardopt::PartitionStrategy::flat)
      .value("sorted_greedy", shardopt::PartitionStrategy::sorted_greedy);
  nb::enum_<shardopt::Storage>(m, "Storage")
      .value("bucket_view", shardopt::Storage::bucket_view)
      .value("external", shardopt::Storage::external);
  nb::enum_<shardopt::StatePrecision>(m, "StatePrecision")
      .value("fp32", shardopt::StatePrecision::fp32)
      .value("q8", shardopt::StatePrecision::q8);
  nb::enum_<shardopt::MasterStorage>(m, "MasterStorage")
      .value("fp32", shardopt::MasterStorage::fp32)
      .value("remainder16", shardopt::MasterStorage::remainder16);
  nb::enum_<shardopt::OverlapPolicy>(m, "OverlapPolicy")
      .value("off", shardopt::OverlapPolicy::off)
      .value("after_backward", shardopt::OverlapPolicy::after_backward)
      .value("per_bucket", shardopt::OverlapPolicy::per_bucket);

  nb::class_<shardopt::Communicator> communicator_class(m, "Communicator");
  communicator_class
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
  bind_collectives(m, communicator_class);

  m.def(
      "mpi_world",
      [](double timeout_seconds, int ranks_per_node) {
        shardopt::CommOptions options;
        options.timeout_seconds = timeout_seconds;
        options.ranks_per_node = ranks_per_node;
        return shardopt::mpi_world(options);
      },
      "timeout_seconds"_a = 600.0, "ranks_per_node"_a = 0,
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
             shardopt::Storage storage, bool shard_state, int64_t bucket_bytes, int cpu_threads,
             shardopt::OverlapPolicy overlap) {
            new (self) shardopt::OptimizerConfig{algorithm, partition, storage, shard_state, bucket_bytes, cpu_threads};
            self->overlap = overlap;
          },
          "algorithm"_a = shardopt::Algorithm::adam, "partition"_a = shardopt::PartitionStrategy::flat,
          "storage"_a = shardopt::Storage::bucket_view, "shard_state"_a = true, "bucket_bytes"_a = shardopt::OptimizerConfig{}.bucket_bytes,
          "cpu_threads"_a = 0, "overlap"_a = shardopt::OverlapPolicy::off)
      .def_rw("algorithm", &shardopt::OptimizerConfig::algorithm)
      .def_rw("partition", &shardopt::OptimizerConfig::partition)
      .def_rw("storage", &shardopt::OptimizerConfig::storage)
      .def_rw("shard_state", &shardopt::OptimizerConfig::shard_state)
      .def_rw("bucket_bytes", &shardopt::OptimizerConfig::bucket_bytes)
      .def_rw("cpu_threads", &shardopt::OptimizerConfig::cpu_threads)
      .def_rw("node_shared_params", &shardopt::OptimizerConfig::node_shared_params)
      .def_rw("divide_by_initial_world_size", &shardopt::OptimizerConfig::divide_by_initial_world_size)
      .def_prop_rw(
          "muon_precision", [](const shardopt::OptimizerConfig& c) { return c.muon.precision; },
          [](shardopt::OptimizerConfig& c, shardopt::MatrixPrecision p) { c.muon.precision = p; },
          "MatrixPrecision of Muon's Newton-Schulz: bf16 (as torch.optim.Muon) or f32.")
      .def_prop_rw(
          "muon_blas_threads", [](const shardopt::OptimizerConfig& c) { return c.muon.blas_threads; },
          [](shardopt::OptimizerConfig& c, int threads) { c.muon.blas_threads = threads; },
          "OpenBLAS threads of each Newton-Schulz product (fixed, so the bits never depend on it).")
      .def_rw("stage", &shardopt::OptimizerConfig::stage,
              "1: gradients all-reduced whole on every rank; 2: each rank keeps its shard's (reduce_gradient).")
      .def_rw("overlap", &shardopt::OptimizerConfig::overlap,
              "OverlapPolicy: off, after_backward (reductions overlap backward, the all-gathers the next\n"
              "forward) or per_bucket (each bucket updated as its reduction lands; no clipping). Bucket view\n"
              "storage; the MPI communicator (CPU parameters, or CUDA ones at one rank) or NCCL (CUDA\n"
              "parameters: collectives on the communication stream, no thread); a Python communicator\n"
              "raises Error(unsupported).")
      .def_rw("state_precision", &shardopt::OptimizerConfig::state_precision,
              "StatePrecision of every group that sets none: fp32, or q8 (8-bit blockwise Adam moments,\n"
              "bitsandbytes' algorithm; needs partition sorted_greedy). A group dict's 'state_precision' key\n"
              "('fp32' or 'q8') sets its own.")
      .def_rw("master", &shardopt::OptimizerConfig::master,
              "MasterStorage of every group that sets none: fp32, or remainder16 (bf16 CPU parameters: the\n"
              "master is the parameter and a 16-bit remainder). A group dict's 'master' key sets its own.")
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

  using shardopt::MemoryReport;
  def_report(m, "MemoryReport", "This rank's bytes and elements (ZeroOptimizer.memory_report).",
             field("state_bytes", &MemoryReport::state_bytes),
             field("master_bytes", &MemoryReport::master_bytes), field("param_bytes", &MemoryReport::param_bytes),
             field("grad_bytes", &MemoryReport::grad_bytes), field("buffer_bytes", &MemoryReport::buffer_bytes),
             field("shard_numel", &MemoryReport::shard_numel), field("trainable_numel", &MemoryReport::trainable_numel),
             field("node_shared_param_bytes", &MemoryReport::node_shared_param_bytes),
             field("node_ranks", &MemoryReport::node_ranks));

  using shardopt::StepReport;
  def_report(m, "StepReport", "What the last step() did on this rank; times in seconds.",
             field("skipped", &StepReport::skipped),
             field("loss_scale", &StepReport::loss_scale), field("grad_norm", &StepReport::grad_norm),
             field("clip_coef", &StepReport::clip_coef), field("skipped_steps", &StepReport::skipped_steps),
             field("agree_seconds", &StepReport::agree_seconds), field("update_seconds", &StepReport::update_seconds),
             field("sync_seconds", &StepReport::sync_seconds),
             field("newton_schulz_seconds", &StepReport::newton_schulz_seconds,
                   "Of update_seconds, Muon's Newton-Schulz on this rank (0 where it owns no Muon matrix)."));

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
      .def("set_trainable", [](Opt& s, shardopt::ParamId id, bool t) { s.opt->set_trainable(id, t); }, "id"_a, "trainable"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("trainable", [](const Opt& s, shardopt::ParamId id) { return s.opt->trainable(id); }, "id"_a)
      .def("num_groups", [](const Opt& s) { return s.opt->num_groups(); })
      .def("group_algorithm", [](const Opt& s, int group) { return s.opt->group_algorithm(group); }, "group"_a,
           "A group's algorithm, fixed for its life (its dict's \"algorithm\", or the config's).")
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
          "param_view",
          [](nb::handle self, shardopt::ParamId id) {
            const shardopt::ZeroOptimizer& opt = *nb::cast<Opt&>(self).opt;
            return view(opt.param_view(id), self, opt.param_view_owner(id));
          },
          "id"_a,
          "bucket_view: a view into shardopt's flat buffer (moves when layout_version() changes; a view\n"
          "kept across set_trainable/add_param_group/load keeps the old buffer alive, with the values of\n"
          "that moment, but is no longer the parameter: fetch a new one).")
      .def(
          "grad_view",
          [](nb::handle self, shardopt::ParamId id) {
            const shardopt::ZeroOptimizer& opt = *nb::cast<Opt&>(self).opt;
            return view(opt.grad_view(id), self, opt.grad_view_owner(id));
          },
          "id"_a, "bucket_view: write gradients here before reduce_gradients()/step().")
      .def("layout_version", [](const Opt& s) { return s.opt->layout_version(); })
      .def("zero_grad", [](Opt& s) { s.opt->zero_grad(); }, nb::call_guard<nb::gil_scoped_release>())
      .def("reduce_gradients", [](Opt& s) { s.opt->reduce_gradients(); }, nb::call_guard<nb::gil_scoped_release>(),
           "Collective: averages gradients over the ranks (skip it under DDP).")
      // The calls below may wait for the overlap engine's communication thread: they release the
      // GIL so that other Python threads (and anything that thread waits on) go on meanwhile.
      .def("grad_ready", [](Opt& s, shardopt::ParamId id) { s.opt->grad_ready(id); }, "id"_a,
           nb::call_guard<nb::gil_scoped_release>(),
           "Stage 1, bucket view: param id's gradient in grad_view(id) is final for this round. With\n"
           "config.overlap its bucket's reduction starts once the whole bucket is ready (collective per\n"
           "bucket: every rank hands the same params in the same order).")
      .def(
          "reduce_gradient",
          [](Opt& s, shardopt::ParamId id, nb::handle grad) {
            const std::string what = "gradient of param " + std::to_string(id);
            DlpackOwner owner = take_dlpack(grad, what);
            const shardopt::TensorRef ref = tensor_ref(owner, what);
            nb::gil_scoped_release release;
            s.opt->reduce_gradient(id, ref);  // reads the gradient before it returns (CPU)
          },
          "id"_a, "grad"_a,
          "Bucket view: hands this rank's local gradient of param id (stage 2; stage 1 too with\n"
          "config.overlap, copied into grad_view(id)). Collective per bucket, once per step.")
      .def("wait_param", [](Opt& s, shardopt::ParamId id) { s.opt->wait_param(id); }, "id"_a,
           nb::call_guard<nb::gil_scoped_release>(),
           "config.overlap: returns once param id's values from the last step have landed on this rank\n"
           "(CUDA parameters: the optimizer's stream waits for them on the device; the host does not).")
      .def("wait_bucket", [](Opt& s, int bucket) { s.opt->wait_bucket(bucket); }, "bucket"_a,
           nb::call_guard<nb::gil_scoped_release>(), "wait_param for a bucket, 0 .. num_buckets()-1.")
      .def("wait_all", [](Opt& s) { s.opt->wait_all(); }, nb::call_guard<nb::gil_scoped_release>(),
           "config.overlap: returns once every parameter of the last step has landed.")
      .def("num_buckets", [](const Opt& s) { return s.opt->num_buckets(); })
      .def("clip_grad_norm", [](Opt& s, double max_norm, double norm_type) { return s.opt->clip_grad_norm(max_norm, norm_type); },
           "max_norm"_a, "norm_type"_a = 2.0, nb::call_guard<nb::gil_scoped_release>(),
           "Collective, after reduce_gradients(): the total norm of the averaged gradients; the factor\n"
           "max_norm / (norm + 1e-6), capped at 1, is applied in the next step().")
      .def("join", [](Opt& s) { s.opt->join(); }, nb::call_guard<nb::gil_scoped_release>(),
           "Collective, for a rank out of inputs: follows the other ranks' gradient reductions (with zero\n"
           "gradients), clipping and steps until every rank has joined (ZeroOptimizer::join()).")
      .def("join_step", [](Opt& s) { return s.opt->join_step(); }, nb::call_guard<nb::gil_scoped_release>(),
           "One iteration of join(): True once a step was followed, False when every rank has joined.")
      .def(
          "step",
          [](Opt& s, nb::object closure, std::vector<shardopt::ParamId> without_grad) -> nb::object {
            nb::object loss = nb::none();
            if (!closure.is_none()) loss = nb::float_(nb::cast<double>(closure()));
            nb::gil_scoped_release release;
            s.opt->step(without_grad);
            return loss;
          },
          "closure"_a = nb::none(), "without_grad"_a = std::vector<shardopt::ParamId>{},
          "Collective: updates this rank's shard, then syncs parameters to every rank. The params in\n"
          "without_grad (ids; the same on every rank) are left as they are: no update, no state or step\n"
          "change, as torch's optimizers skip a param whose .grad is None.")
      .def("memory_report", [](const Opt& s) { return s.opt->memory_report(); })
      .def("last_step", [](const Opt& s) { return s.opt->last_step(); },
           "The last step()'s StepReport on this rank (its phase times, Muon's Newton-Schulz among them).")
      .def("save", [](Opt& s, const std::string& dir) { s.opt->save(dir); }, "dir"_a,
           nb::call_guard<nb::gil_scoped_release>(), "Collective: a sharded checkpoint in dir.")
      .def("save_async", [](Opt& s, const std::string& dir) { s.opt->save_async(dir); }, "dir"_a,
           nb::call_guard<nb::gil_scoped_release>(),
           "Collective: the checkpoint save(dir) would write now, written in the background while training goes "
           "on; committed by wait_save() (or the next save, save_async or load).")
      .def("wait_save", [](Opt& s) { s.opt->wait_save(); }, nb::call_guard<nb::gil_scoped_release>(),
           "Collective: completes the pending save_async, raising its error on every rank if any rank failed.")
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

  // Over the ZeroOptimizer and Communicator bound above.
  bind_averaging(m);
  bind_remote(m);
}

