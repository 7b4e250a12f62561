// python/src/py_remote.cpp — RemoteOptimizer bound for Python: groups as dicts, gradients and rows as C-contiguous numpy arrays (kept alive until their context's step was waited for), pulls returned as new arrays.
#include "py_remote.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "py_hyperparams.hpp"
#include "py_optimizer.hpp"
#include "shardopt/shardopt.hpp"

using namespace nb::literals;

namespace shardopt_python {
namespace {

using shardopt::Error;
using shardopt::ErrorCode;
using shardopt::RemoteContext;
using shardopt::RemoteOptimizer;
using shardopt::RemoteParam;
using FloatArray = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using RowArray = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::ndarray<nb::numpy, float> new_array(int64_t count, std::vector<std::size_t> shape) {
  auto* data = new float[static_cast<std::size_t>(count)];
  nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  return nb::ndarray<nb::numpy, float>(data, shape.size(), shape.data(), owner);
}

// The optimizer, and the arrays each open context's pushes read until its step is waited for.
struct PyRemote {
  std::unique_ptr<RemoteOptimizer> remote;
  std::map<RemoteContext, std::vector<nb::object>> kept;
};

// A step in flight; holds its context's arrays until wait().
struct PyRemoteStep {
  shardopt::RemoteStepHandle step;
  std::vector<nb::object> kept;
  void wait() {
    {
      nb::gil_scoped_release release;
      step.wait();
    }
    kept.clear();
  }
};

std::vector<shardopt::RemoteGroupSpec> groups_from(const nb::list& groups, std::vector<nb::object>& keep) {
  std::vector<shardopt::RemoteGroupSpec> out;
  for (nb::handle g : groups) {
    const nb::dict d = nb::cast<nb::dict>(g);
    shardopt::RemoteGroupSpec spec;
    for (auto [key, value] : d) {
      const std::string k = nb::cast<std::string>(key);
      if (k == "algorithm") spec.algorithm = nb::cast<shardopt::Algorithm>(value);
      else if (k != "params") set_hyper(spec.hyper, k, value, "remote param group key");
    }
    if (!d.contains("params")) throw Error(ErrorCode::invalid_argument, "a remote param group has no 'params'");
    for (nb::handle entry : d["params"]) {
      // (name, rows, row_size[, row_begin, row_end[, initial]])
      const nb::tuple t = nb::cast<nb::tuple>(entry);
      if (t.size() != 3 && t.size() != 5 && t.size() != 6) {
        throw Error(ErrorCode::invalid_argument,
                    "each remote param is (name, rows, row_size[, row_begin, row_end[, initial]])");
      }
      shardopt::RemoteParamSpec p;
      p.name = nb::cast<std::string>(t[0]);
      p.rows = nb::cast<int64_t>(t[1]);
      p.row_size = nb::cast<int64_t>(t[2]);
      if (t.size() >= 5) {
        p.row_begin = nb::cast<int64_t>(t[3]);
        p.row_end = nb::cast<int64_t>(t[4]);
      }
      if (t.size() == 6 && !t[5].is_none()) {
        FloatArray initial = nb::cast<FloatArray>(t[5]);
        const int64_t end = p.row_end < 0 ? p.rows : p.row_end;
        if (static_cast<int64_t>(initial.size()) != (end - p.row_begin) * p.row_size) {
          throw Error(ErrorCode::invalid_argument, "remote param '" + p.name + "': initial holds " +
                                                       std::to_string(initial.size()) + " values, its rows " +
                                                       std::to_string((end - p.row_begin) * p.row_size));
        }
        p.initial = initial.data();
        keep.push_back(nb::borrow(t[5]));
      }
      spec.params.push_back(std::move(p));
    }
    out.push_back(std::move(spec));
  }
  return out;
}

// push_log_bytes=: a Python int within int64 (a larger one is named, not wrapped or cut); the
// sign is the constructor's to check, with the other options.
int64_t push_log_bytes_from(nb::handle value) {
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) {
    throw Error(ErrorCode::invalid_argument, "RemoteOptimizer: push_log_bytes must be an int, not " +
                                                 nb::cast<std::string>(nb::str(value.type().attr("__name__"))));
  }
  int overflow = 0;
  const long long bytes = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0) {
    throw Error(ErrorCode::invalid_argument, "RemoteOptimizer: push_log_bytes is " + nb::cast<std::string>(nb::str(value)) +
                                                 ", past the largest int64; give 0 (sum each push on arrival) or more");
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace

void bind_remote(nb::module_& m) {
  nb::class_<RemoteParam>(m, "RemoteParam")
      .def_ro("id", &RemoteParam::id)
      .def_ro("rows", &RemoteParam::rows)
      .def_ro("row_size", &RemoteParam::row_size)
      .def_prop_ro("numel", &RemoteParam::numel);

  nb::class_<PyRemoteStep>(m, "RemoteStep").def("wait", &PyRemoteStep::wait, "Returns once every owner applied it.");

  nb::class_<PyRemote>(m, "RemoteOptimizer",
                       "Parameters on their owners; trainers push gradients into contexts and step them there.\n"
                       "groups: [{'algorithm': Algorithm.sgd, 'lr': 0.1, ..., 'params': [(name, rows, row_size,\n"
                       "row_begin, row_end, initial_or_None), ...]}] for the parameters this rank owns.\n"
                       "push_log_bytes: bytes of pushes an owner keeps per context before summing them\n"
                       "(None: 64 MiB; 0: each summed on arrival). stats() includes logged_bytes.")
      .def(
          "__init__",
          [](PyRemote* self, std::shared_ptr<shardopt::Communicator> comm, nb::list groups, bool trainer,
             bool deterministic, double timeout_seconds, double context_expiry_seconds, int max_open_contexts,
             int cpu_threads, nb::object push_log_bytes) {
            std::vector<nb::object> keep;
            shardopt::RemoteOptions o;
            // A read failing on one rank joins the constructor's agreement: every rank raises.
            std::vector<shardopt::RemoteGroupSpec> specs = read_collectively(*comm, "RemoteOptimizer", [&] {
              if (!push_log_bytes.is_none()) o.push_log_bytes = push_log_bytes_from(push_log_bytes);
              return groups_from(groups, keep);
            });
            o.trainer = trainer;
            o.order = deterministic ? shardopt::RemoteOrder::deterministic : shardopt::RemoteOrder::arrival;
            o.timeout_seconds = timeout_seconds;
            o.context_expiry_seconds = context_expiry_seconds;
            o.max_open_contexts = max_open_contexts;
            o.cpu_threads = cpu_threads;
            new (self) PyRemote();
            nb::gil_scoped_release release;
            self->remote = std::make_unique<RemoteOptimizer>(std::move(comm), std::move(specs), o);
          },
          "comm"_a, "groups"_a = nb::list(), "trainer"_a = true, "deterministic"_a = false,
          "timeout_seconds"_a = 60.0, "context_expiry_seconds"_a = 120.0, "max_open_contexts"_a = 8,
          "cpu_threads"_a = 0, "push_log_bytes"_a = nb::none())
      .def("lookup", [](PyRemote& r, const std::string& name) { return r.remote->lookup(name); })
      .def("param_names", [](PyRemote& r) { return r.remote->param_names(); })
      .def("open_context", [](PyRemote& r) { return r.remote->open_context(); })
      .def(
          "push",
          [](PyRemote& r, RemoteContext context, const RemoteParam& param, nb::object grad) {
            FloatArray g = nb::cast<FloatArray>(grad);
            r.remote->push(context, param, g.data(), static_cast<int64_t>(g.size()));
            r.kept[context].push_back(grad);
          },
          "context"_a, "param"_a, "grad"_a, "Adds a dense gradient (read until the context's step was waited for).")
      .def(
          "push_rows",
          [](PyRemote& r, RemoteContext context, const RemoteParam& param, nb::object rows, nb::object values) {
            RowArray idx = nb::cast<RowArray>(rows);
            FloatArray v = nb::cast<FloatArray>(values);
            if (static_cast<int64_t>(v.size()) != static_cast<int64_t>(idx.size()) * param.row_size) {
              throw Error(ErrorCode::invalid_argument, "push_rows: values hold " + std::to_string(v.size()) +
                                                           " elements, rows * row_size is " +
                                                           std::to_string(idx.size() * param.row_size));
            }
            r.remote->push_rows(context, param, idx.data(), static_cast<int64_t>(idx.size()), v.data());
            r.kept[context].push_back(rows);
            r.kept[context].push_back(values);
          },
          "context"_a, "param"_a, "rows"_a, "values"_a)
      .def(
          "step",
          [](PyRemote& r, RemoteContext context) {
            {
              nb::gil_scoped_release release;
              r.remote->step(context);
            }
            r.kept.erase(context);
          },
          "context"_a)
      .def(
          "step_async",
          [](PyRemote& r, RemoteContext context) {
            auto step = std::make_unique<PyRemoteStep>();
            step->step = r.remote->step_async(context);
            auto found = r.kept.find(context);
            if (found != r.kept.end()) {
              step->kept = std::move(found->second);
              r.kept.erase(found);
            }
            return step;
          },
          "context"_a)
      .def("pull",
           [](PyRemote& r, const RemoteParam& param) {
             auto out = new_array(param.numel(), {static_cast<std::size_t>(param.rows), static_cast<std::size_t>(param.row_size)});
             nb::gil_scoped_release release;
             r.remote->pull(param, out.data(), param.numel());
             return out;
           })
      .def("pull_rows",
           [](PyRemote& r, const RemoteParam& param, nb::object rows) {
             RowArray idx = nb::cast<RowArray>(rows);
             auto out = new_array(static_cast<int64_t>(idx.size()) * param.row_size,
                                  {idx.size(), static_cast<std::size_t>(param.row_size)});
             nb::gil_scoped_release release;
             r.remote->pull_rows(param, idx.data(), static_cast<int64_t>(idx.size()), out.data());
             return out;
           })
      .def("close", [](PyRemote& r) {
        {
          nb::gil_scoped_release release;
          r.remote->close();
        }
        r.kept.clear();
      })
      .def("save", [](PyRemote& r, const std::string& dir) { r.remote->save(dir); })
      .def("load", [](PyRemote& r, const std::string& dir) { r.remote->load(dir); })
      .def("stats", [](PyRemote& r) {
        const shardopt::RemoteStats s = r.remote->stats();
        nb::dict d;
        d["pushes_received"] = s.pushes_received;
        d["bytes_received"] = s.bytes_received;
        d["contexts_applied"] = s.contexts_applied;
        d["contexts_failed"] = s.contexts_failed;
        d["contexts_expired"] = s.contexts_expired;
        d["trainers_gone"] = s.trainers_gone;
        d["open_contexts"] = s.open_contexts;
        d["accumulator_bytes"] = s.accumulator_bytes;
        d["pooled_bytes"] = s.pooled_bytes;
        d["logged_bytes"] = s.logged_bytes;
        return d;
      });

  m.def(
      "remote_mpi_world",
      [](double timeout_seconds) {
        shardopt::CommOptions o;
        o.timeout_seconds = timeout_seconds;
        return shardopt::remote_mpi_world(o);
      },
      "timeout_seconds"_a = 600.0,
      "mpi_world() with MPI initialised for MPI_THREAD_MULTIPLE (the remote optimizer's owners serve on a thread).");
}

}  // namespace shardopt_python
