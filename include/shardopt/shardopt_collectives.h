/* shardopt/shardopt_collectives.h — the C ABI of collectives on a communicator handle: all-reduce, broadcast, all-gather (barrier is in shardopt.h). Included by shardopt/shardopt.h; its conventions hold here. */
#ifndef SHARDOPT_SHARDOPT_COLLECTIVES_H_
#define SHARDOPT_SHARDOPT_COLLECTIVES_H_

#include "shardopt/shardopt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- collectives ----------------------------------------------------------------------------- */

/* shardopt::ReduceOp, value for value. avg is the sum divided by the communicator's size. */
typedef enum shardopt_reduce_op {
  SHARDOPT_REDUCE_SUM = 0,
  SHARDOPT_REDUCE_AVG = 1,
  SHARDOPT_REDUCE_MAX = 2
} shardopt_reduce_op;

/* All three are collective over `comm` and run as Communicator's collectives do (see
 * shardopt/communicator.hpp for the rounding of bf16/f16 sums): counts are elements of `dtype`,
 * buffers are host memory (device memory over a NCCL communicator), f32/bf16/f16 reduce, and
 * SHARDOPT_DTYPE_BYTE moves raw bytes (broadcast, all_gather only).
 *
 * Each begins with one small agreement among the ranks (an all-gather of the arguments), so a bad
 * argument fails on every rank with the same status instead of hanging or corrupting memory:
 *  - a NULL buffer where count > 0 (NULL is fine for count 0): SHARDOPT_ERR_NULL_POINTER;
 *  - a negative count, a dtype or op that is not one of the enumerators, a root outside
 *    [0, size): SHARDOPT_ERR_INVALID_ARGUMENT;
 *  - a reduction of SHARDOPT_DTYPE_BYTE: SHARDOPT_ERR_UNSUPPORTED (as in the C++ API);
 *    each message names the argument and the first rank that passed it, the same on every rank;
 *  - valid arguments that differ between ranks (count, dtype, op, root): SHARDOPT_ERR_MISMATCH
 *    naming the argument, the two values and the ranks.
 * A peer that never calls fails the others with SHARDOPT_ERR_TIMEOUT after the communicator's
 * timeout; over MPI the timed-out collective stays live, so keep its buffer allocated until MPI
 * is finalised (see CommOptions.timeout_seconds in shardopt/communicator.hpp). */

/* In place: every rank's `count` elements at `buffer` become their reduction over the ranks. */
SHARDOPT_C_API shardopt_status shardopt_comm_all_reduce(shardopt_comm_t comm, void* buffer, int64_t count,
                                                        shardopt_dtype dtype, shardopt_reduce_op op);
/* Rank `root`'s `count` elements at `buffer` are copied into `buffer` on every rank. */
SHARDOPT_C_API shardopt_status shardopt_comm_broadcast(shardopt_comm_t comm, void* buffer, int64_t count,
                                                       shardopt_dtype dtype, int root);
/* Rank r's `count` elements at `send` land at recv + r * count (recv holds size * count
 * elements) on every rank. In place when send == recv + rank * count. */
SHARDOPT_C_API shardopt_status shardopt_comm_all_gather(shardopt_comm_t comm, const void* send, void* recv,
                                                        int64_t count, shardopt_dtype dtype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHARDOPT_SHARDOPT_COLLECTIVES_H_ */
