// python/src/py_averaging.cpp — model averaging for Python: AveragerConfig and its torch-named factories, ModelAverager (Periodic/Hierarchical) and PostLocalSGDOptimizer over a Python ZeroOptimizer, with torch's state_dict and its load warning.
#include "py_averaging.hpp"

#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "py_optimizer.hpp"
#include "py_report.hpp"
#include "py_state_dict.hpp"
#include "shardopt/averaging.hpp"

using namespace nb::literals;

namespace shardopt_python {

using shardopt::Error;
using shardopt::ErrorCode;

namespace {

// A ModelAverager seen from Python: one it owns (PeriodicModelAverager(...)), or the one inside a
// PostLocalSGDOptimizer (its .averager). `owner` keeps alive what the averager refers to: the
// Python ZeroOptimizer, or the PostLocalSGDOptimizer. Declared first, so released last.
struct PyModelAverager {
  nb::object owner;
  std::unique_ptr<shardopt::ModelAverager> owned;
  shardopt::ModelAverager* averager = nullptr;

  shardopt::ModelAverager& get() const { return *averager; }
};

// The two torch names, as Python subclasses of ModelAverager (isinstance works as in torch).
struct PyPeriodicModelAverager : PyModelAverager {};
struct PyHierarchicalModelAverager : PyModelAverager {};

struct PyPostLocalSGD {
  nb::object optimizer;  // the Python ZeroOptimizer: outlives the C++ object, which refers to it
  std::unique_ptr<shardopt::PostLocalSGDOptimizer> plsgd;
};

using Levels = std::vector<std::pair<int64_t, int>>;

Levels levels_of(const shardopt::AveragerConfig& c) {
  Levels out;
  for (const shardopt::AveragingLevel& l : c.levels) out.emplace_back(l.period, l.group_size);
  return out;
}

std::vector<shardopt::AveragingLevel> levels_from(const Levels& levels) {
  std::vector<shardopt::AveragingLevel> out;
  for (const auto& [period, group_size] : levels) {
    shardopt::AveragingLevel l;
    l.period = period;
    l.group_size = group_size;
    out.push_back(l);
  }
  return out;
}

// torch's {period: group_size} dict, in insertion order (torch keeps it as an OrderedDict).
std::vector<shardopt::AveragingLevel> levels_from_dict(nb::handle period_group_size_dict) {
  if (!nb::isinstance<nb::dict>(period_group_size_dict)) {
    throw Error(ErrorCode::invalid_argument,
                "period_group_size_dict must be a dict {period: group_size, ...}, got a " +
                    std::string(nb::type_name(period_group_size_dict.type()).c_str()));
  }
  std::vector<shardopt::AveragingLevel> out;
  for (auto [period, group_size] : nb::borrow<nb::dict>(period_group_size_dict)) {
    shardopt::AveragingLevel l;
    l.period = nb::cast<int64_t>(period);
    l.group_size = nb::cast<int>(group_size);
    out.push_back(l);
  }
  return out;
}

std::string bool_text(bool b) { return b ? "True" : "False"; }

std::string outer_text(const shardopt::OuterOptimizer& o) {
  return nb::cast<std::string>(nb::str("shardopt.OuterOptimizer(enabled={}, lr={!r}, momentum={!r}, nesterov={})")
                                   .attr("format")(bool_text(o.enabled), o.lr, o.momentum, bool_text(o.nesterov)));
}

// outer=: None keeps the config's; True/False switch it (with its settings); an OuterOptimizer
// replaces it; a dict {lr, momentum, nesterov[, enabled]} enables it with those settings, the
// missing keys at their defaults.
shardopt::OuterOptimizer outer_from(nb::handle outer, const shardopt::OuterOptimizer& current) {
  if (outer.is_none()) return current;
  if (PyBool_Check(outer.ptr())) {
    shardopt::OuterOptimizer o = current;
    o.enabled = nb::cast<bool>(outer);
    return o;
  }
  if (nb::isinstance<shardopt::OuterOptimizer>(outer)) return nb::cast<shardopt::OuterOptimizer>(outer);
  if (nb::isinstance<nb::dict>(outer)) {
    shardopt::OuterOptimizer o;
    o.enabled = true;
    for (auto [key, value] : nb::borrow<nb::dict>(outer)) {
      const std::string k = nb::cast<std::string>(key);
      if (k == "lr") o.lr = nb::cast<double>(value);
      else if (k == "momentum") o.momentum = nb::cast<double>(value);
      else if (k == "nesterov") o.nesterov = nb::cast<bool>(value);
      else if (k == "enabled") o.enabled = nb::cast<bool>(value);
      else throw Error(ErrorCode::invalid_argument, "unknown outer optimizer key '" + k + "' (lr, momentum, nesterov)");
    }
    return o;
  }
  throw Error(ErrorCode::invalid_argument, "outer must be None, a bool, an OuterOptimizer or a dict, got a " +
                                               std::string(nb::type_name(outer.type()).c_str()));
}

PyZeroOptimizer& zero_optimizer(nb::handle optimizer, const char* what) {
  if (!nb::isinstance<PyZeroOptimizer>(optimizer)) {
    throw Error(ErrorCode::invalid_argument, std::string(what) + " needs a shardopt.ZeroOptimizer, got a " +
                                                 std::string(nb::type_name(optimizer.type()).c_str()));
  }
  return nb::cast<PyZeroOptimizer&>(optimizer);
}

std::shared_ptr<shardopt::Communicator> checked_world(std::shared_ptr<shardopt::Communicator> world, const char* what) {
  if (!world) throw Error(ErrorCode::invalid_argument, std::string(what) + " needs a world communicator (got None)");
  return world;
}

// Collective over `world`: reads the arguments with `read` (a failure joins the constructor's
// agreement, so every rank raises), then builds the averager over the optimizer.
template <typename Self, typename Read>
void init_averager(Self* self, std::shared_ptr<shardopt::Communicator> world, nb::handle optimizer, Read&& read) {
  world = checked_world(std::move(world), "ModelAverager");
  auto [opt, config] = read_collectively(*world, "ModelAverager", [&] {
    PyZeroOptimizer& o = zero_optimizer(optimizer, "ModelAverager");
    return std::make_pair(o.opt.get(), read());
  });
  std::unique_ptr<shardopt::ModelAverager> averager;
  {
    nb::gil_scoped_release release;
    averager = std::make_unique<shardopt::ModelAverager>(world, *opt, std::move(config));
  }
  new (self) Self();
  self->owner = nb::borrow(optimizer);
  self->owned = std::move(averager);
  self->averager = self->owned.get();
}

}  // namespace

void bind_averaging(nb::module_& m) {
  nb::class_<shardopt::OuterOptimizer>(
      m, "OuterOptimizer",
      "The outer optimizer (DiLoCo) of the world-level averaging: torch's SGD (no dampening or weight\n"
      "decay) applied to (params at the last sync) - (average of the replicas). Constructing one enables\n"
      "it; AveragerConfig().outer is disabled.")
      .def(
          "__init__",
          [](shardopt::OuterOptimizer* self, double lr, double momentum, bool nesterov, bool enabled) {
            new (self) shardopt::OuterOptimizer{enabled, lr, momentum, nesterov};
          },
          "lr"_a = shardopt::OuterOptimizer{}.lr, "momentum"_a = shardopt::OuterOptimizer{}.momentum,
          "nesterov"_a = shardopt::OuterOptimizer{}.nesterov, "enabled"_a = true)
      .def_rw("enabled", &shardopt::OuterOptimizer::enabled)
      .def_rw("lr", &shardopt::OuterOptimizer::lr)
      .def_rw("momentum", &shardopt::OuterOptimizer::momentum)
      .def_rw("nesterov", &shardopt::OuterOptimizer::nesterov)
      .def("__repr__", &outer_text);

  nb::class_<shardopt::AveragerConfig>(
      m, "AveragerConfig",
      "How a ModelAverager or PostLocalSGDOptimizer averages: levels [(period, group_size), ...] with\n"
      "increasing periods and group sizes (in world ranks; 0 or the world size for the last), warmup_steps,\n"
      "hierarchical (count periods from step 0, as HierarchicalModelAverager, instead of from the end of\n"
      "warmup), bucket_bytes and outer. periodic_averager() and hierarchical_averager() make torch's two.")
      .def(
          "__init__",
          [](shardopt::AveragerConfig* self, const Levels& levels, int64_t warmup_steps, bool hierarchical,
             int64_t bucket_bytes, nb::handle outer) {
            shardopt::AveragerConfig c;
            c.levels = levels_from(levels);
            c.warmup_steps = warmup_steps;
            c.hierarchical = hierarchical;
            c.bucket_bytes = bucket_bytes;
            c.outer = outer_from(outer, c.outer);
            new (self) shardopt::AveragerConfig(std::move(c));
          },
          "levels"_a = Levels{}, "warmup_steps"_a = 0, "hierarchical"_a = false,
          "bucket_bytes"_a = shardopt::AveragerConfig{}.bucket_bytes, "outer"_a = nb::none())
      .def_prop_rw(
          "levels", [](const shardopt::AveragerConfig& c) { return levels_of(c); },
          [](shardopt::AveragerConfig& c, const Levels& levels) { c.levels = levels_from(levels); })
      .def_rw("warmup_steps", &shardopt::AveragerConfig::warmup_steps)
      .def_rw("hierarchical", &shardopt::AveragerConfig::hierarchical)
      .def_rw("bucket_bytes", &shardopt::AveragerConfig::bucket_bytes)
      .def_rw("outer", &shardopt::AveragerConfig::outer)
      .def("__repr__", [](const shardopt::AveragerConfig& c) {
        return nb::cast<std::string>(
            nb::str("shardopt.AveragerConfig(levels={!r}, warmup_steps={}, hierarchical={}, bucket_bytes={}, outer={})")
                .attr("format")(nb::cast(levels_of(c)), c.warmup_steps, bool_text(c.hierarchical), c.bucket_bytes,
                                outer_text(c.outer)));
      });

  m.def(
      "periodic_averager",
      [](int64_t period, int64_t warmup_steps) { return shardopt::periodic_averager(period, warmup_steps); },
      "period"_a, "warmup_steps"_a = 0,
      "The AveragerConfig of torch's PeriodicModelAverager(period, warmup_steps): the world every `period`\n"
      "steps, counted from the end of warmup.");
  m.def(
      "hierarchical_averager",
      [](nb::handle period_group_size_dict, int64_t warmup_steps) {
        return shardopt::hierarchical_averager(levels_from_dict(period_group_size_dict), warmup_steps);
      },
      "period_group_size_dict"_a, "warmup_steps"_a = 0,
      "The AveragerConfig of torch's HierarchicalModelAverager({period: group_size, ...}, warmup_steps),\n"
      "levels in the dict's order.");

  using shardopt::CommunicationCounts;
  def_report(m, "CommunicationCounts", "Bytes of payload this rank handed to collectives spanning more than one rank.",
             field("gradient_bytes", &CommunicationCounts::gradient_bytes),
             field("averaging_bytes", &CommunicationCounts::averaging_bytes),
             field("averages", &CommunicationCounts::averages));

  using Averager = PyModelAverager;
  nb::class_<Averager>(
      m, "ModelAverager",
      "Averages the parameters of one replica (a ZeroOptimizer over a split of `world`) with the other\n"
      "replicas. Call average_parameters() after the optimizer's step(), on every rank of the world.")
      .def(
          "__init__",
          [](Averager* self, std::shared_ptr<shardopt::Communicator> world, nb::handle optimizer,
             const shardopt::AveragerConfig& config) {
            init_averager(self, std::move(world), optimizer, [&] { return config; });
          },
          "world"_a, "optimizer"_a, "config"_a, "Collective over world.")
      .def("average_parameters", [](Averager& a) { a.get().average_parameters(); },
           nb::call_guard<nb::gil_scoped_release>(),
           "Collective over the world: averages if this step is one to average at, then advances .step.")
      .def_prop_rw(
          "step", [](const Averager& a) { return a.get().step(); },
          [](Averager& a, int64_t step) { a.get().set_step(step); }, "torch's averager.step.")
      .def("next_group_size", [](const Averager& a) { return a.get().next_group_size(); },
           "The group size (world ranks) the next average_parameters() averages over; 0 if none.")
      .def_prop_ro("config", [](const Averager& a) { return a.get().config(); })
      .def_prop_ro("communication", [](const Averager& a) { return a.get().communication(); })
      .def_prop_ro("replica_size", [](const Averager& a) { return a.get().replica_size(); })
      .def_prop_ro("num_replicas", [](const Averager& a) { return a.get().num_replicas(); });

  nb::class_<PyPeriodicModelAverager, Averager>(m, "PeriodicModelAverager")
      .def(
          "__init__",
          [](PyPeriodicModelAverager* self, std::shared_ptr<shardopt::Communicator> world, nb::handle optimizer,
             int64_t period, int64_t warmup_steps) {
            init_averager(self, std::move(world), optimizer,
                          [&] { return shardopt::periodic_averager(period, warmup_steps); });
          },
          "world"_a, "optimizer"_a, "period"_a, "warmup_steps"_a = 0,
          "torch's PeriodicModelAverager(period, warmup_steps) over `world`. Collective.");
  nb::class_<PyHierarchicalModelAverager, Averager>(m, "HierarchicalModelAverager")
      .def(
          "__init__",
          [](PyHierarchicalModelAverager* self, std::shared_ptr<shardopt::Communicator> world, nb::handle optimizer,
             nb::handle period_group_size_dict, int64_t warmup_steps) {
            init_averager(self, std::move(world), optimizer, [&] {
              return shardopt::hierarchical_averager(levels_from_dict(period_group_size_dict), warmup_steps);
            });
          },
          "world"_a, "optimizer"_a, "period_group_size_dict"_a, "warmup_steps"_a = 0,
          "torch's HierarchicalModelAverager({period: group_size, ...}, warmup_steps) over `world`, levels\n"
          "in the dict's order. Collective.");

  using Plsgd = PyPostLocalSGD;
  nb::class_<Plsgd>(
      m, "PostLocalSGDOptimizer",
      "torch's PostLocalSGDOptimizer for a ZeroOptimizer: PostLocalSGDOptimizer(world, optimizer, averager,\n"
      "outer=None), `averager` an AveragerConfig (shardopt.periodic_averager(period, warmup_steps) or\n"
      "shardopt.hierarchical_averager({period: group_size}, warmup_steps)), `optimizer`'s communicator one\n"
      "of the equal groups that split `world` (its replica). reduce_gradients() averages gradients over the\n"
      "world during warmup, over the replica after; step() steps the optimizer, then averages parameters.")
      .def(
          "__init__",
          [](Plsgd* self, std::shared_ptr<shardopt::Communicator> world, nb::handle optimizer,
             const shardopt::AveragerConfig& averager, nb::handle outer) {
            world = checked_world(std::move(world), "PostLocalSGDOptimizer");
            // Its constructor's first agreement is its ModelAverager's: a failed read joins that.
            auto [opt, config] = read_collectively(*world, "ModelAverager", [&] {
              PyZeroOptimizer& o = zero_optimizer(optimizer, "PostLocalSGDOptimizer");
              shardopt::AveragerConfig c = averager;
              c.outer = outer_from(outer, c.outer);
              return std::make_pair(o.opt.get(), std::move(c));
            });
            std::unique_ptr<shardopt::PostLocalSGDOptimizer> plsgd;
            {
              nb::gil_scoped_release release;
              plsgd = std::make_unique<shardopt::PostLocalSGDOptimizer>(world, *opt, std::move(config));
            }
            new (self) Plsgd{nb::borrow(optimizer), std::move(plsgd)};
          },
          "world"_a, "optimizer"_a, "averager"_a, "outer"_a = nb::none(),
          "Collective over world. outer: None (the averager config's), True/False, an OuterOptimizer, or a dict\n"
          "{'lr': ..., 'momentum': ..., 'nesterov': ...} that enables it.")
      .def("zero_grad", [](Plsgd& s) { s.plsgd->optimizer().zero_grad(); }, nb::call_guard<nb::gil_scoped_release>())
      .def("reduce_gradients", [](Plsgd& s) { s.plsgd->reduce_gradients(); }, nb::call_guard<nb::gil_scoped_release>(),
           "Collective: over the world during warmup, over the replica after it.")
      .def(
          "step",
          [](Plsgd& s, nb::object closure) -> nb::object {
            if (closure.is_none()) {
              nb::gil_scoped_release release;
              s.plsgd->step();
              return nb::none();
            }
            const double loss = s.plsgd->step([&] { return nb::cast<double>(closure()); });
            return nb::float_(loss);
          },
          "closure"_a = nb::none(), "Collective over the world: the optimizer's step, then average_parameters().")
      .def("save", [](Plsgd& s, const std::string& dir) { s.plsgd->save(dir); }, "dir"_a,
           nb::call_guard<nb::gil_scoped_release>(),
           "Collective over the world: every replica's checkpoint and the averager's state, committed together.")
      .def("load", [](Plsgd& s, const std::string& dir) { s.plsgd->load(dir); }, "dir"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def("consolidate_state_dict", [](Plsgd& s, int to) { s.plsgd->consolidate_state_dict(to); }, "to"_a = 0,
           nb::call_guard<nb::gil_scoped_release>(), "Collective within each replica; `to` is a rank of the replica.")
      .def(
          "state_dict",
          [](const Plsgd& s) {
            const shardopt::PostLocalSGDStateDict state = s.plsgd->state_dict();
            nb::dict d = state_dict_to_python(state.optimizer);
            if (state.has_step) d["step"] = state.step;
            return d;
          },
          "torch's: the optimizer's consolidated dict plus 'step' (the averager's); only on the rank that\n"
          "consolidated. The outer optimizer's state is not in it (use save/load).")
      .def(
          "load_state_dict",
          [](Plsgd& s, nb::dict d) {
            shardopt::PostLocalSGDStateDict state;
            state.optimizer = state_dict_from_python(d);
            state.has_step = d.contains("step");
            if (state.has_step) state.step = nb::cast<int64_t>(d["step"]);
            {
              nb::gil_scoped_release release;
              s.plsgd->load_state_dict(state);
            }
            // torch warns (and restarts the averager at 0) when the dict has no step.
            const std::string& warning = s.plsgd->load_warning();
            if (!state.has_step && !warning.empty() && PyErr_WarnEx(PyExc_UserWarning, warning.c_str(), 1) != 0) {
              throw nb::python_error();
            }
          },
          "state"_a)
      .def_prop_ro("optimizer", [](const Plsgd& s) { return s.optimizer; }, "The wrapped ZeroOptimizer.")
      .def_prop_ro(
          "averager",
          [](nb::handle self) {
            Plsgd& s = nb::cast<Plsgd&>(self);
            PyModelAverager view;
            view.owner = nb::borrow(self);
            view.averager = &s.plsgd->averager();
            return view;
          },
          "Its ModelAverager (e.g. .averager.step, as torch's); keeps this object alive.")
      .def_prop_ro("param_groups", [](const Plsgd& s) { return s.optimizer.attr("param_groups"); })
      .def_prop_ro("communication", [](const Plsgd& s) { return s.plsgd->communication(); },
                   "Gradient and averaging traffic of this rank (CommunicationCounts).");
}

}  // namespace shardopt_python
