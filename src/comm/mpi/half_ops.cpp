// src/comm/mpi/half_ops.cpp — makes the bf16/f16 MPI_Ops once per process and frees them when MPI finalises.
#include "comm/mpi/half_ops.hpp"

#include <cstdint>
#include <mutex>

#include "comm/mpi/half_reduce.hpp"
#include "comm/mpi/mpi_runtime.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace comm {
namespace {

// MPI's user function: inout[i] = Combine(in[i], inout[i]) over 16-bit words.
template <uint16_t (*Combine)(uint16_t, uint16_t)>
void combine_words(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Combine(a[i], b[i]);
}

// The operations are freed at the start of MPI_Finalize (whoever calls it, shardopt or the
// application that lent its communicator): MPI deletes MPI_COMM_SELF's attributes first thing
// in MPI_Finalize, and the attribute set here frees the operations in its delete callback.
class HalfOps {
 public:
  // Index: [dtype == f16][op == max].
  static MPI_Op get(DType dtype, ReduceOp op) {
    std::lock_guard<std::mutex> lock(mutex());
    Table& t = table();
    if (!t.made) make(t);
    return t.ops[dtype == DType::f16 ? 1 : 0][op == ReduceOp::max ? 1 : 0];
  }

 private:
  struct Table {
    bool made = false;
    MPI_Op ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
  };
  // Never destroyed: MPI_Finalize may run from another static's destructor (MpiRuntime's).
  static std::mutex& mutex() {
    static auto* m = new std::mutex();
    return *m;
  }
  static Table& table() {
    static auto* t = new Table();
    return *t;
  }

  static void make(Table& t) {
    MPI_User_function* const functions[2][2] = {
        {&combine_words<sum_words<Bf16Words>>, &combine_words<max_words<Bf16Words>>},
        {&combine_words<sum_words<F16Words>>, &combine_words<max_words<F16Words>>}};
    for (int d = 0; d < 2; ++d) {
      for (int o = 0; o < 2; ++o) {
        const int code = MPI_Op_create(functions[d][o], /*commute=*/1, &t.ops[d][o]);
        if (code != MPI_SUCCESS) {
          free_ops(t);
          raise(ErrorCode::comm, "MPI_Op_create for the bf16/f16 reductions failed: {}",
                mpi_error_string(code));
        }
      }
    }
    int keyval = MPI_KEYVAL_INVALID;
    int code = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &on_finalize, &keyval, nullptr);
    if (code == MPI_SUCCESS) code = MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
    if (code != MPI_SUCCESS) {
      free_ops(t);
      if (keyval != MPI_KEYVAL_INVALID) MPI_Comm_free_keyval(&keyval);
      raise(ErrorCode::comm, "registering the bf16/f16 reductions for MPI_Finalize failed: {}",
            mpi_error_string(code));
    }
    // MPI keeps the key value alive while the attribute uses it.
    MPI_Comm_free_keyval(&keyval);
    t.made = true;
  }

  static void free_ops(Table& t) {
    for (auto& row : t.ops) {
      for (MPI_Op& op : row) {
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
        op = MPI_OP_NULL;
      }
    }
    t.made = false;
  }

  static int on_finalize(MPI_Comm, int, void*, void*) {
    std::lock_guard<std::mutex> lock(mutex());
    free_ops(table());
    return MPI_SUCCESS;
  }
};

}  // namespace

MPI_Op half_op(DType dtype, ReduceOp op) { return HalfOps::get(dtype, op); }

}  // namespace comm
}  // namespace shardopt
