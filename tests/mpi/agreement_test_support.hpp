// tests/mpi/agreement_test_support.hpp — outcomes of calls that must fail together by name, checks of their errors, and a 10 s watchdog world for the agreement tests.
//
// Each test makes its own world communicator with a 10 s watchdog, so a regression (a rank left
// waiting in a collective its peers never join) fails in seconds instead of hanging the job,
// and checks that its error came in well under that. Every rank runs the same body and checks
// its own error; per-rank branches make the ranks disagree. Checks are CHECKs, not REQUIREs,
// so that a failed check does not take one rank out of the lockstep the others rely on.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "mpi_test_support.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt_agreement_test {

using namespace shardopt;
using shardopt_test::all_params;
using shardopt_test::bitwise_equal;
using shardopt_test::seeded_values;

// A collective that has not finished after this long is a hang: the error must come before.
constexpr double kWatchdogSeconds = 10.0;
constexpr double kFastSeconds = 8.0;

inline std::shared_ptr<Communicator> test_comm() { return mpi_world(CommOptions{kWatchdogSeconds}); }

// What a call threw (if anything) and how long it took.
struct Outcome {
  bool threw = false;
  ErrorCode code = ErrorCode::internal;
  std::string what;
  double seconds = 0.0;
};

template <typename Call>
inline Outcome outcome_of(Call&& call) {
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  try {
    call();
  } catch (const Error& e) {
    o.threw = true;
    o.code = e.code();
    o.what = e.what();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

// The call failed with `code`, in time, and its message holds every one of `parts`.
inline void check_error(const Outcome& o, ErrorCode code, const std::vector<std::string>& parts) {
  INFO("message: " << o.what);
  CHECK(o.threw);
  CHECK(error_code_name(o.code) == std::string(error_code_name(code)));
  CHECK(o.seconds < kFastSeconds);
  for (const std::string& part : parts) CHECK_THAT(o.what, Catch::Contains(part));
}

// "ranks are in different calls" naming rank 0's call and the last rank's call.
inline void check_different_calls(const Outcome& o, const std::string& first_call, int last, const std::string& last_call) {
  check_error(o, ErrorCode::mismatch,
              {"ranks are in different calls", "rank 0 is in " + first_call,
               "rank " + std::to_string(last) + " is in " + last_call});
}

// "ranks disagree on {field}: rank 0 has {v0}, rank {last} has {v1}".
inline void check_disagree(const Outcome& o, const std::string& field, const std::string& v0, int last, const std::string& v1) {
  check_error(o, ErrorCode::mismatch,
              {"ranks disagree on " + field, "rank 0 has " + v0, "rank " + std::to_string(last) + " has " + v1});
}

// An invalid value on rank `bad`: the same code everywhere, its own text on every rank, and the
// culprit named on the others.
inline void check_invalid_on(const Outcome& o, int me, int bad, const std::vector<std::string>& parts) {
  std::vector<std::string> all = parts;
  if (me != bad) all.push_back("on rank " + std::to_string(bad));
  check_error(o, ErrorCode::invalid_argument, all);
}

inline std::string num(double v) { return fmt::format("{}", v); }

using Params = shardopt_test::SeededParams;

const std::vector<std::pair<std::string, int64_t>> kSmall = {{"embed", 24}, {"fc.weight", 40}, {"fc.bias", 8}};

// The same gradients on every rank, so no reduction is needed for the ranks to agree.
inline void write_grads(ZeroOptimizer& opt, int step) {
  shardopt_test::write_seeded_grads(opt, 500u + static_cast<uint32_t>(step * 31));
}

// A state dict with no per-parameter state: what consolidate_state_dict gives before any step.
inline StateDict stateless_dict(const ZeroOptimizer& opt) {
  StateDict sd;
  sd.algorithm = opt.config().algorithm;
  for (ParamId id = 0; id < opt.num_params(); ++id) sd.param_names.push_back(opt.param_name(id));
  for (int g = 0; g < opt.num_groups(); ++g) {
    ParamGroupState group;
    group.hyper = opt.hyperparams(g);
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      if (opt.param_group(id) == g) group.params.push_back(id);
    }
    sd.param_groups.push_back(group);
  }
  return sd;
}

// A scratch directory shared by the ranks of this run (rank 0's pid names it).
inline std::filesystem::path shared_scratch(Communicator& comm, const std::string& what) {
  uint32_t pid = static_cast<uint32_t>(::getpid());
  comm.broadcast(&pid, 2, DType::bf16, 0);  // two raw 16-bit words
  return std::filesystem::temp_directory_path() /
         fmt::format("shardopt-{}-{}-np{}", what, pid, comm.size());
}

}  // namespace shardopt_agreement_test
