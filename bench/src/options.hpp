// bench/src/options.hpp — shardopt-bench's command line: the options struct, its parser and the usage text.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

using shardopt::Algorithm;
using shardopt::DType;
using shardopt::PartitionStrategy;
using shardopt::Storage;

// --help, and after an error in the flags.
extern const char* const usage_text;

enum class BenchMode { collectives, step, checkpoint, iteration };
// Where the collectives' buffers and the step's parameters live (--device).
enum class BenchDevice { cpu, cuda };
// The communicator under test with --device cuda (--comm): NCCL bootstrapped over MPI, or the
// MPI communicator itself (one rank, or a CUDA-aware MPI).
enum class DeviceComm { nccl, mpi };
enum class CollectiveOp { all_gather, broadcast, reduce_scatter, all_reduce };

struct Options {
  BenchMode mode = BenchMode::collectives;
  BenchDevice device = BenchDevice::cpu;
  DeviceComm comm = DeviceComm::nccl;
  bool comm_given = false;
  // Sweep and timing.
  int64_t min_bytes = 1024;
  int64_t max_bytes = int64_t{16} << 20;
  double step_factor = 2.0;
  int64_t step_bytes = 0;
  int iters = 20;
  int warmup = 5;
  bool check = true;
  int root = 0;
  std::vector<CollectiveOp> ops{CollectiveOp::all_gather, CollectiveOp::broadcast,
                                CollectiveOp::reduce_scatter, CollectiveOp::all_reduce};
  // Step.
  int64_t params = 0;  // 0: the --layers x --width model
  int tensors = 4;
  int layers = 20;
  int width = 2000;
  Algorithm algorithm = Algorithm::adam;
  double momentum = 0.9;
  // Muon (--algorithm muon): OptimizerConfig::muon.
  shardopt::MatrixPrecision muon_precision = shardopt::MatrixPrecision::bf16;
  int blas_threads = 1;
  double lr = 1e-3;
  PartitionStrategy partition = PartitionStrategy::flat;
  Storage storage = Storage::bucket_view;
  DType dtype = DType::f32;
  int stage = 1;
  int threads = 1;
  bool threads_given = false;  // --device cuda: the CPU reference's threads default to all cores
  int64_t bucket_bytes = shardopt::OptimizerConfig{}.bucket_bytes;
  int64_t pipeline_chunk_bytes = 0;
  bool node_shared_params = true;  // OptimizerConfig::node_shared_params
  // Stage 2 with bucket view: gradients written through grad_view where it exists (true), or
  // handed with reduce_gradient() (false: --stage2-grads hand-over).
  bool stage2_grad_views = true;
  // --mode iteration: OptimizerConfig::overlap, and whether each iteration writes the gradients
  // into grad_view in backward order (a copy from ones made once, with grad_ready under overlap)
  // as the timed reduce's first part: the least a backward writes, for overlap to run beside.
  shardopt::OverlapPolicy overlap = shardopt::OverlapPolicy::off;
  bool backward_copy = false;
  bool sharded = true;
  int64_t stream_mb = 0;  // 0: automatic
  bool breakdown = false;
  // Checkpoint: the directory every rank saves into (shared by the ranks), steps per round.
  std::string ckpt_dir = "shardopt-bench-ckpt";
  int save_every = 5;
  bool help = false;
};

// Thrown as std::invalid_argument: main prints the message with the usage text and exits 2.
[[noreturn]] void bad_usage(const std::string& message);

// Every rank parses the same argv; throws std::invalid_argument (bad_usage) on a bad flag.
Options parse_options(int argc, char** argv);

}  // namespace shardopt_bench
