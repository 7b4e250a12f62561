// python/src/py_collectives.cpp — the Communicator's collectives bound for Python (blocking and async, over DLPack tensors), and python_communicator's binding.
#include "py_collectives.hpp"

#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "py_communicator.hpp"
#include "py_tensors.hpp"
#include "shardopt/shardopt.hpp"

using namespace nb::literals;

namespace shardopt_python {

using shardopt::Communicator;
using shardopt::DType;
using shardopt::Error;
using shardopt::ErrorCode;
using shardopt::PendingCollective;
using shardopt::ReduceOp;

namespace {

// A tensor for one of the bound collectives: f32/bf16/f16 as the optimizer takes them, or uint8
// (contiguous, CPU or CUDA) as DType::byte.
struct Buffer {
  DlpackOwner owner;
  shardopt::TensorRef ref;
};

Buffer take_buffer(const Communicator& comm, nb::handle obj, const char* what) {
  Buffer b;
  b.owner = take_dlpack(obj, what);
  const DLTensor& t = b.owner.get()->dl_tensor;
  if (t.dtype.code == kDLUInt && t.dtype.bits == 8 && t.dtype.lanes == 1) {
    int64_t numel = 1;
    int64_t expected_stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (t.strides != nullptr && t.shape[d] != 1 && t.strides[d] != expected_stride) {
        throw Error(ErrorCode::invalid_argument, std::string(what) + ": must be contiguous");
      }
      expected_stride *= t.shape[d];
      numel *= t.shape[d];
    }
    if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDA) {
      throw Error(ErrorCode::unsupported, std::string(what) + ": only CPU and CUDA tensors are supported");
    }
    b.ref.data = static_cast<char*>(t.data) + t.byte_offset;
    b.ref.numel = numel;
    b.ref.dtype = DType::byte;
    b.ref.device = t.device.device_type == kDLCUDA ? shardopt::Device::cuda(t.device.device_id) : shardopt::Device::cpu();
  } else {
    b.ref = tensor_ref(b.owner, what);
  }
  const bool reachable = b.ref.device == comm.device() || (b.ref.device.is_cuda() && comm.cuda_aware());
  if (!reachable) {
    throw Error(ErrorCode::invalid_argument, std::string(what) + " is on " + shardopt::device_name(b.ref.device) +
                                                 ", which this " + comm.backend_name() + " communicator cannot reach");
  }
  return b;
}

ReduceOp parse_op(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "avg") return ReduceOp::avg;
  if (name == "max") return ReduceOp::max;
  throw Error(ErrorCode::invalid_argument, "unknown reduce op '" + name + "' (expected 'sum', 'avg' or 'max')");
}

int64_t per_rank(const Buffer& whole, const Communicator& comm, const char* what) {
  if (whole.ref.numel % comm.size() != 0) {
    throw Error(ErrorCode::invalid_argument, std::string(what) + " has " + std::to_string(whole.ref.numel) +
                                                 " elements, not a multiple of the " + std::to_string(comm.size()) +
                                                 " ranks");
  }
  return whole.ref.numel / comm.size();
}

// A collective started from Python: the library's pending collective and the tensors it uses.
struct BoundPending {
  std::vector<Buffer> buffers;  // released after the collective
  std::unique_ptr<PendingCollective> pending;
  void wait() {
    if (!pending) return;
    {
      nb::gil_scoped_release release;
      pending->wait();
    }
    pending.reset();
    buffers.clear();
  }
};

// Each collective as (blocking, async) bindings: `start` takes the buffers and starts it.
template <typename Start>
void def_collective(nb::class_<Communicator>& cls, const char* name, const char* async_name, Start start,
                    const char* doc) {
  cls.def(
      name,
      [start](Communicator& c, nb::args args) {
        BoundPending p;
        p.pending = start(c, args, p.buffers);
        p.wait();
      },
      doc);
  cls.def(
      async_name,
      [start](Communicator& c, nb::args args) {
        auto p = std::make_unique<BoundPending>();
        p->pending = start(c, args, p->buffers);
        return p;
      },
      "As the blocking form; returns a PendingCollective whose wait() finishes it.");
}

std::string arg_string(const nb::args& args, std::size_t i, const char* fallback) {
  return args.size() > i ? nb::cast<std::string>(args[i]) : std::string(fallback);
}

void need_args(const nb::args& args, std::size_t at_least, std::size_t at_most, const char* usage) {
  if (args.size() < at_least || args.size() > at_most) {
    throw Error(ErrorCode::invalid_argument, std::string("usage: ") + usage);
  }
}

}  // namespace

void bind_collectives(nb::module_& m, nb::class_<Communicator>& cls) {
  nb::class_<BoundPending>(m, "PendingCollective")
      .def("wait", &BoundPending::wait, "Finishes the collective (raising its failure); then a no-op.");

  m.def("python_communicator", &python_communicator, "impl"_a,
        "A Communicator whose collectives are impl's methods (the protocol of shardopt._torch_comm's\n"
        "TorchDistCommunicator). Prefer shardopt.torch_communicator(process_group).");

  cls.def_prop_ro("device", [](const Communicator& c) { return shardopt::device_name(c.device()); });
  def_collective(
      cls, "broadcast", "broadcast_async",
      [](Communicator& c, const nb::args& a, std::vector<Buffer>& keep) {
        need_args(a, 2, 2, "broadcast(tensor, root)");
        keep.push_back(take_buffer(c, a[0], "tensor"));
        const shardopt::TensorRef t = keep.back().ref;
        const int root = nb::cast<int>(a[1]);
        nb::gil_scoped_release release;
        return c.broadcast_async(t.data, t.numel, t.dtype, root);
      },
      "broadcast(tensor, root): root's tensor to every rank, in place.");
  def_collective(
      cls, "all_gather", "all_gather_async",
      [](Communicator& c, const nb::args& a, std::vector<Buffer>& keep) {
        need_args(a, 2, 2, "all_gather(send, recv)");
        keep.push_back(take_buffer(c, a[0], "send"));
        keep.push_back(take_buffer(c, a[1], "recv"));
        const shardopt::TensorRef send = keep[0].ref;
        const shardopt::TensorRef recv = keep[1].ref;
        if (send.dtype != recv.dtype || recv.numel != send.numel * c.size()) {
          throw Error(ErrorCode::invalid_argument, "all_gather: recv must hold size() * send's elements, of send's dtype");
        }
        nb::gil_scoped_release release;
        return c.all_gather_async(send.data, recv.data, send.numel, send.dtype);
      },
      "all_gather(send, recv): rank r's send lands in recv's block r.");
  def_collective(
      cls, "all_reduce", "all_reduce_async",
      [](Communicator& c, const nb::args& a, std::vector<Buffer>& keep) {
        need_args(a, 1, 2, "all_reduce(tensor, op='sum')");
        keep.push_back(take_buffer(c, a[0], "tensor"));
        const shardopt::TensorRef t = keep.back().ref;
        const ReduceOp op = parse_op(arg_string(a, 1, "sum"));
        nb::gil_scoped_release release;
        return c.all_reduce_async(t.data, t.numel, t.dtype, op);
      },
      "all_reduce(tensor, op='sum'): in place; op is 'sum', 'avg' or 'max'.");
  def_collective(
      cls, "reduce_scatter", "reduce_scatter_async",
      [](Communicator& c, const nb::args& a, std::vector<Buffer>& keep) {
        need_args(a, 2, 3, "reduce_scatter(send, recv, op='sum')");
        keep.push_back(take_buffer(c, a[0], "send"));
        keep.push_back(take_buffer(c, a[1], "recv"));
        const shardopt::TensorRef send = keep[0].ref;
        const shardopt::TensorRef recv = keep[1].ref;
        const int64_t count = per_rank(keep[0], c, "reduce_scatter's send");
        if (send.dtype != recv.dtype || recv.numel != count) {
          throw Error(ErrorCode::invalid_argument, "reduce_scatter: recv must hold send's elements / size(), of send's dtype");
        }
        const ReduceOp op = parse_op(arg_string(a, 2, "sum"));
        nb::gil_scoped_release release;
        return c.reduce_scatter_async(send.data, recv.data, count, send.dtype, op);
      },
      "reduce_scatter(send, recv, op='sum'): this rank receives the reduced block rank of send.");
  def_collective(
      cls, "reduce", "reduce_async",
      [](Communicator& c, const nb::args& a, std::vector<Buffer>& keep) {
        need_args(a, 4, 4, "reduce(send, recv, op, root)");
        keep.push_back(take_buffer(c, a[0], "send"));
        keep.push_back(take_buffer(c, a[1], "recv"));
        const shardopt::TensorRef send = keep[0].ref;
        const shardopt::TensorRef recv = keep[1].ref;
        if (send.dtype != recv.dtype || recv.numel != send.numel) {
          throw Error(ErrorCode::invalid_argument, "reduce: recv must match send's size and dtype");
        }
        const ReduceOp op = parse_op(nb::cast<std::string>(a[2]));
        const int root = nb::cast<int>(a[3]);
        nb::gil_scoped_release release;
        return c.reduce_async(send.data, recv.data, send.numel, send.dtype, op, root);
      },
      "reduce(send, recv, op, root): every rank's send reduced into root's recv (in place when the same).");
}

}  // namespace shardopt_python
