// tests/matrix/matrix_program.hpp — runs the feature matrix's training program for one combination, as the variant (its implementation choices) or the plain reference.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "combination.hpp"

namespace shardopt_matrix {

// What one run did on this rank.
struct RunResult {
  bool completed = false;
  // Where it stopped, when it did not complete: "construct.ZeroOptimizer",
  // "construct.PostLocalSGDOptimizer", "step2.reduce_gradients", "mid.save_load", "join", ...
  std::string phase;
  std::string code;     // error_code_name() of the shardopt::Error, or "std::exception"
  std::string message;  // its what()
  std::vector<uint8_t> bytes;         // every parameter's bytes at the end, in id order
  std::vector<int64_t> param_offset;  // where each parameter starts in `bytes`
  bool changed = false;               // the bytes differ from the initial values
};

// Runs the program of `c` on fresh communicators over the world (collective over it). The
// reference keeps `c`'s semantics (dtype, local SGD, Join, mid-run operation, LR change) and
// takes overlap off, stage 1, flat and no node sharing. `dir` (the same on every rank) is where
// the mid-run operation may save. The run's objects (communicators, optimizer, averager) go
// into `keep`, for the caller to destroy once no peer can still be in one of their collectives:
// a rank that left a run its peers then timed out in must not free communicators whose MPI
// context a new one would reuse while the peers' abandoned collectives still address it (Open
// MPI then crashed in the next MPI_Comm_dup).
RunResult run_program(const Combination& c, bool reference, const std::string& dir,
                      std::vector<std::shared_ptr<void>>& keep);

}  // namespace shardopt_matrix
