// src/capi/capi_collectives.cpp — the C collectives on a communicator handle (all-reduce, broadcast, all-gather), each behind one agreement on its arguments so that a bad or differing argument fails on every rank alike.
#include <optional>

#include "capi/capi_convert.hpp"
#include "comm/agreement.hpp"

namespace shardopt {
namespace capi {
namespace {

enum class Collective { all_reduce, broadcast, all_gather };

// One rank's arguments, as raw values (an enum may hold anything the caller stored). Which of
// them a collective uses: all_reduce buffer/count/dtype/op, broadcast buffer/count/dtype/root,
// all_gather send (as `buffer`)/recv/count/dtype; the others stay 0.
struct Arguments {
  bool buffer_null = false;
  bool recv_null = false;
  int64_t count = 0;
  int32_t dtype = 0;
  int32_t op = 0;
  int32_t root = 0;
};

// Four payload slots carry a rank's arguments to every other rank.
comm::Payload pack(const Arguments& a) {
  comm::Payload p{};
  p[0] = (a.buffer_null ? 1u : 0u) | (a.recv_null ? 2u : 0u);
  p[1] = static_cast<uint64_t>(a.count);
  p[2] = static_cast<uint64_t>(static_cast<uint32_t>(a.dtype)) |
         (static_cast<uint64_t>(static_cast<uint32_t>(a.op)) << 32);
  p[3] = static_cast<uint64_t>(static_cast<uint32_t>(a.root));
  return p;
}

Arguments unpack(const comm::Payload& p) {
  Arguments a;
  a.buffer_null = (p[0] & 1u) != 0;
  a.recv_null = (p[0] & 2u) != 0;
  a.count = static_cast<int64_t>(p[1]);
  a.dtype = static_cast<int32_t>(static_cast<uint32_t>(p[2]));
  a.op = static_cast<int32_t>(static_cast<uint32_t>(p[2] >> 32));
  a.root = static_cast<int32_t>(static_cast<uint32_t>(p[3]));
  return a;
}

struct Problem {
  shardopt_status status;
  std::string what;
};

// What is wrong with rank `rank`'s arguments, if anything. Every rank runs this over every
// rank's arguments, so all of them reach the same verdict.
std::optional<Problem> problem_of(Collective kind, const Arguments& a, int size) {
  const char* buffer_name = kind == Collective::all_gather ? "send" : "buffer";
  if (a.count < 0) return Problem{SHARDOPT_ERR_INVALID_ARGUMENT, fmt::format("a negative count ({})", a.count)};
  if (a.dtype < SHARDOPT_DTYPE_F32 || a.dtype > SHARDOPT_DTYPE_BYTE) {
    return Problem{SHARDOPT_ERR_INVALID_ARGUMENT, fmt::format("dtype {}, which is not a shardopt_dtype (0..3)", a.dtype)};
  }
  if (kind == Collective::all_reduce) {
    if (a.op < SHARDOPT_REDUCE_SUM || a.op > SHARDOPT_REDUCE_MAX) {
      return Problem{SHARDOPT_ERR_INVALID_ARGUMENT, fmt::format("op {}, which is not a shardopt_reduce_op (0..2)", a.op)};
    }
    if (a.dtype == SHARDOPT_DTYPE_BYTE) {
      return Problem{SHARDOPT_ERR_UNSUPPORTED,
                     "dtype SHARDOPT_DTYPE_BYTE to a reduction (raw bytes have no arithmetic: use f32, bf16 or f16)"};
    }
  }
  if (kind == Collective::broadcast && (a.root < 0 || a.root >= size)) {
    return Problem{SHARDOPT_ERR_INVALID_ARGUMENT,
                   fmt::format("root {}, outside the communicator's ranks 0..{}", a.root, size - 1)};
  }
  if (a.count > 0 && a.buffer_null) {
    return Problem{SHARDOPT_ERR_NULL_POINTER, fmt::format("a NULL {} with count {}", buffer_name, a.count)};
  }
  if (a.count > 0 && a.recv_null) {
    return Problem{SHARDOPT_ERR_NULL_POINTER, fmt::format("a NULL recv with count {}", a.count)};
  }
  return std::nullopt;
}

const char* operation_name(Collective kind) {
  switch (kind) {
    case Collective::all_reduce: return "shardopt_comm_all_reduce";
    case Collective::broadcast: return "shardopt_comm_broadcast";
    case Collective::all_gather: return "shardopt_comm_all_gather";
  }
  return "a collective";
}

// Collective: exchanges every rank's arguments, then fails on every rank with the first bad
// one (lowest rank), or with the first argument that differs from rank 0's.
void agree_on(Communicator& comm, Collective kind, const Arguments& mine) {
  comm::AgreementRecord record(operation_name(kind));
  const comm::Payload packed = pack(mine);
  for (std::size_t i = 0; i < packed.size(); ++i) record.set_payload(i, packed[i]);
  const std::vector<comm::Payload> all = comm::agree(comm, record);
  const int size = comm.size();
  std::vector<Arguments> args;
  for (const comm::Payload& p : all) args.push_back(unpack(p));
  for (int r = 0; r < size; ++r) {
    if (const std::optional<Problem> problem = problem_of(kind, args[r], size)) {
      fail(problem->status, "rank {} passed {}", r, problem->what);
    }
  }
  const auto differ = [&](const char* name, auto field) {
    for (int r = 1; r < size; ++r) {
      if (field(args[r]) != field(args[0])) {
        fail(SHARDOPT_ERR_MISMATCH, "ranks disagree on {}: rank 0 has {}, rank {} has {}", name, field(args[0]), r,
             field(args[r]));
      }
    }
  };
  differ("count", [](const Arguments& a) { return a.count; });
  differ("dtype", [](const Arguments& a) { return a.dtype; });
  if (kind == Collective::all_reduce) differ("op", [](const Arguments& a) { return a.op; });
  if (kind == Collective::broadcast) differ("root", [](const Arguments& a) { return a.root; });
}

}  // namespace
}  // namespace capi
}  // namespace shardopt

using namespace shardopt::capi;
using shardopt::DType;
using shardopt::ReduceOp;

static_assert(SHARDOPT_REDUCE_SUM == static_cast<int>(ReduceOp::sum) &&
                  SHARDOPT_REDUCE_AVG == static_cast<int>(ReduceOp::avg) &&
                  SHARDOPT_REDUCE_MAX == static_cast<int>(ReduceOp::max),
              "shardopt_reduce_op mirrors shardopt::ReduceOp");

extern "C" {

shardopt_status shardopt_comm_all_reduce(shardopt_comm_t comm, void* buffer, int64_t count, shardopt_dtype dtype,
                                         shardopt_reduce_op op) {
  return guard("shardopt_comm_all_reduce", [&] {
    shardopt_comm_s& c = checked_comm(comm, "comm");
    Arguments a;
    a.buffer_null = buffer == nullptr;
    a.count = count;
    a.dtype = raw_enum_value(dtype);
    a.op = raw_enum_value(op);
    agree_on(*c.comm, Collective::all_reduce, a);
    if (count == 0) return;
    c.comm->all_reduce(buffer, count, static_cast<DType>(a.dtype), static_cast<ReduceOp>(a.op));
  });
}

shardopt_status shardopt_comm_broadcast(shardopt_comm_t comm, void* buffer, int64_t count, shardopt_dtype dtype,
                                        int root) {
  return guard("shardopt_comm_broadcast", [&] {
    shardopt_comm_s& c = checked_comm(comm, "comm");
    Arguments a;
    a.buffer_null = buffer == nullptr;
    a.count = count;
    a.dtype = raw_enum_value(dtype);
    a.root = root;
    agree_on(*c.comm, Collective::broadcast, a);
    if (count == 0) return;
    c.comm->broadcast(buffer, count, static_cast<DType>(a.dtype), root);
  });
}

shardopt_status shardopt_comm_all_gather(shardopt_comm_t comm, const void* send, void* recv, int64_t count,
                                         shardopt_dtype dtype) {
  return guard("shardopt_comm_all_gather", [&] {
    shardopt_comm_s& c = checked_comm(comm, "comm");
    Arguments a;
    a.buffer_null = send == nullptr;
    a.recv_null = recv == nullptr;
    a.count = count;
    a.dtype = raw_enum_value(dtype);
    agree_on(*c.comm, Collective::all_gather, a);
    if (count == 0) return;
    c.comm->all_gather(send, recv, count, static_cast<DType>(a.dtype));
  });
}

}  // extern "C"
