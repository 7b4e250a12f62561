// tests/matrix/matrix_main.cpp — the feature-matrix test: runs this world size's combinations, each against the plain reference run, classifies them on every rank alike and records the outcomes.
//
// Usage (under mpiexec -n NP): shardopt-feature-matrix-test COMBINATIONS_FILE OUTCOMES_FILE [ID...]
// Runs the combinations of COMBINATIONS_FILE with np=NP (or only the named ones); rank 0
// writes one line per combination to OUTCOMES_FILE (tools/feature_matrix.py table reads them).
// Exits 1 when a combination is neither bitwise the reference nor refused on every rank as
// combinations.txt expects (by a constructor, or by a call every rank meets), unless marked
// known failing with that very failure, or a known failure changed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "combination.hpp"
#include "matrix_program.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;
using namespace shardopt_matrix;

namespace {

// One rank's account of one run, fixed-size so the ranks can all-gather it.
struct RankRecord {
  int32_t ran = 0;  // 0: no such run (the combination is the reference itself)
  int32_t completed = 0;
  int32_t changed = 0;
  int32_t first_differing_param = -1;  // variant only: -1 when bitwise the reference
  char code[24] = {};
  char phase[64] = {};
  char message[400] = {};
};

void copy_text(char* to, std::size_t size, const std::string& from) {
  std::strncpy(to, from.c_str(), size - 1);
  to[size - 1] = '\0';
}

RankRecord record_of(const RunResult* run, const RunResult* reference) {
  RankRecord r;
  if (run == nullptr) return r;
  r.ran = 1;
  r.completed = run->completed ? 1 : 0;
  r.changed = run->changed ? 1 : 0;
  copy_text(r.code, sizeof(r.code), run->code);
  copy_text(r.phase, sizeof(r.phase), run->phase);
  copy_text(r.message, sizeof(r.message), run->message);
  if (reference != nullptr && run->completed && reference->completed) {
    if (run->bytes != reference->bytes) {
      r.first_differing_param = static_cast<int32_t>(run->param_offset.size());
      for (std::size_t i = 0; i < run->param_offset.size(); ++i) {
        const std::size_t begin = static_cast<std::size_t>(run->param_offset[i]);
        const std::size_t end = i + 1 < run->param_offset.size() ? static_cast<std::size_t>(run->param_offset[i + 1])
                                                                 : run->bytes.size();
        if (end > reference->bytes.size() ||
            !std::equal(run->bytes.begin() + static_cast<std::ptrdiff_t>(begin),
                        run->bytes.begin() + static_cast<std::ptrdiff_t>(end),
                        reference->bytes.begin() + static_cast<std::ptrdiff_t>(begin))) {
          r.first_differing_param = static_cast<int32_t>(i);
          break;
        }
      }
    }
  }
  return r;
}

// Every rank's record of one run (index = rank).
std::vector<RankRecord> gather(Communicator& world, const RankRecord& mine) {
  std::vector<RankRecord> all(static_cast<std::size_t>(world.size()));
  world.all_gather(&mine, all.data(), sizeof(RankRecord), DType::byte);
  return all;
}

struct Verdict {
  std::string outcome;    // pass, refused, FAIL
  std::string signature;  // FAIL: what failed where, without spaces ("-" otherwise)
  std::string message;    // refused: the error; FAIL: what happened
};

// Every rank stopped in a constructor with the same error.
bool refused_at_construction(const std::vector<RankRecord>& run) {
  for (const RankRecord& r : run) {
    if (!r.ran || r.completed || std::strncmp(r.phase, "construct.", 10) != 0) return false;
    if (std::strcmp(r.code, run[0].code) != 0 || std::strcmp(r.message, run[0].message) != 0) return false;
  }
  return true;
}

// A refusal at a call (join() beside model averaging): every rank of both runs stopped with the
// same error code, not a timeout, each message naming the refusal; `message` lists where.
bool refused_at_call(const std::vector<RankRecord>& reference, const std::vector<RankRecord>& variant,
                     const std::string& fragment, std::string& message) {
  std::string first_code, first_message, where;
  for (const auto* run : {&reference, &variant}) {
    for (std::size_t r = 0; r < run->size(); ++r) {
      const RankRecord& rec = (*run)[r];
      if (!rec.ran) continue;
      if (rec.completed || std::strcmp(rec.code, "timeout") == 0) return false;
      if (std::string(rec.message).find(fragment) == std::string::npos) return false;
      if (first_code.empty()) {
        first_code = rec.code;
        first_message = rec.message;
      }
      if (first_code != rec.code) return false;
      where += (where.empty() ? "" : ", ") + std::string(run == &reference ? "reference" : "variant") + " rank " +
               std::to_string(r) + " at " + rec.phase;
    }
  }
  message = first_code + " on every rank (" + where + "): " + first_message;
  return true;
}

bool all_completed(const std::vector<RankRecord>& run) {
  return std::all_of(run.begin(), run.end(), [](const RankRecord& r) { return !r.ran || r.completed; });
}

Verdict classify(const std::vector<RankRecord>& reference, const std::vector<RankRecord>& variant) {
  Verdict v{"FAIL", "-", ""};
  if (refused_at_construction(variant)) {
    v.outcome = "refused";
    v.message = std::string(variant[0].phase + 10) + ": " + variant[0].code + ": " + variant[0].message;
    return v;
  }
  if (all_completed(reference) && all_completed(variant)) {
    std::string differing, unchanged;
    for (std::size_t r = 0; r < variant.size(); ++r) {
      if (variant[r].first_differing_param >= 0) {
        differing += (differing.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " from param " +
                     std::to_string(variant[r].first_differing_param);
      }
      if (!variant[r].changed) unchanged += (unchanged.empty() ? "" : ",") + std::to_string(r);
    }
    if (differing.empty() && unchanged.empty()) {
      v.outcome = "pass";
      return v;
    }
    v.signature = differing.empty() ? "params_unchanged" : "bits_differ";
    v.message = differing.empty() ? "the run left the parameters unchanged on ranks " + unchanged
                                  : "completed, but the parameters differ from the reference's: " + differing;
    return v;
  }
  // An error somewhere but not a refusal at construction on every rank: name each distinct one.
  std::set<std::string> tokens;
  std::vector<std::string> seen;
  for (const auto* run : {&reference, &variant}) {
    const char* name = run == &reference ? "reference" : "variant";
    for (std::size_t r = 0; r < run->size(); ++r) {
      const RankRecord& rec = (*run)[r];
      if (!rec.ran || rec.completed) continue;
      tokens.insert(std::string(name) + "@" + rec.phase + ":" + rec.code);
      const std::string what = std::string(rec.phase) + ": " + rec.code + ": " + rec.message;
      if (std::find(seen.begin(), seen.end(), what) == seen.end()) {
        seen.push_back(what);
        v.message += (v.message.empty() ? "" : " / ") + std::string(name) + " rank " + std::to_string(r) + " at " + what;
      }
    }
  }
  v.signature.clear();
  for (const std::string& t : tokens) v.signature += (v.signature.empty() ? "" : ";") + t;
  return v;
}

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// A directory name every rank shares, new for this run of the test.
std::string shared_base_dir(Communicator& world) {
  char name[128] = {};
  if (world.rank() == 0) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("shardopt-feature-matrix-np" + std::to_string(world.size()) + "-" + std::to_string(now)))
                                .string();
    copy_text(name, sizeof(name), dir);
  }
  world.broadcast(name, sizeof(name), DType::byte, 0);
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s COMBINATIONS_FILE OUTCOMES_FILE [ID...]\n", argv[0]);
    return 2;
  }
  CommOptions options;
  options.timeout_seconds = 120;  // the test's own exchanges; the runs use 6 s communicators
  std::shared_ptr<Communicator> world = mpi_world(options);
  const int rank = world->rank();
  const std::vector<std::string> only(argv + 3, argv + argc);
  std::vector<Combination> combinations;
  for (Combination& c : read_combinations(argv[1])) {
    if (c.np != world->size()) continue;
    if (!only.empty() && std::find(only.begin(), only.end(), c.id) == only.end()) continue;
    combinations.push_back(std::move(c));
  }
  const std::string base = shared_base_dir(*world);
  std::ofstream outcomes;
  if (rank == 0) {
    outcomes.open(argv[2]);
    outcomes << "# feature matrix outcomes at np " << world->size() << " (tests/matrix/matrix_main.cpp)\n";
  }
  int unexpected = 0, refused = 0, passed = 0, known = 0;
  // Every run's objects, destroyed at the end (matrix_program.hpp says why).
  std::vector<std::shared_ptr<void>> kept;
  for (const Combination& c : combinations) {
    const auto started = std::chrono::steady_clock::now();
    const std::string dir = base + "/" + c.id;
    RunResult reference_run, variant_run;
    const bool separate_reference = !c.is_reference();
    // Every rank starts each run together: a rank whose run timed out (its peers left early)
    // must not meet them in the next run's communicator creation, a collective over the world.
    if (separate_reference) {
      world->barrier();
      reference_run = run_program(c, true, dir + "/reference", kept);
    }
    world->barrier();
    variant_run = run_program(c, false, dir + "/variant", kept);
    const std::vector<RankRecord> reference =
        gather(*world, record_of(separate_reference ? &reference_run : nullptr, nullptr));
    const std::vector<RankRecord> variant =
        gather(*world, record_of(&variant_run, separate_reference ? &reference_run : nullptr));
    Verdict v = classify(reference, variant);
    // Every rank holds the same records, so every rank reaches the same judgement.
    std::string outcome = v.outcome, problem;
    if (c.refused_at_call) {
      std::string refusal;
      if (refused_at_call(reference, variant, c.refusal, refusal)) {
        outcome = "refused";
        v.message = refusal;
      } else {
        problem = "expected refused on every rank by the same error code (not a timeout) naming '" + c.refusal +
                  "', got " + v.outcome;
      }
    } else if (!c.refusal.empty()) {
      if (v.outcome != "refused" || v.message.find(c.refusal) == std::string::npos) {
        problem = "expected refused at construction naming '" + c.refusal + "', got " + v.outcome;
      }
    } else if (c.known_failure.empty()) {
      if (v.outcome == "refused") problem = "refused at construction, though the generator expects it to run";
      if (v.outcome == "FAIL") problem = "neither bitwise the reference nor refused at construction";
    } else if (v.outcome != "FAIL") {
      problem = "marked known failing (" + c.known_failure + ") but now " + v.outcome +
                ": remove its mark in tools/feature_matrix.py";
    } else if (v.signature != c.known_failure) {
      problem = "marked known failing as " + c.known_failure + " but failed as " + v.signature;
    } else {
      outcome = "known_failing";
    }
    unexpected += problem.empty() ? 0 : 1;
    refused += outcome == "refused" ? 1 : 0;
    passed += outcome == "pass" ? 1 : 0;
    known += outcome == "known_failing" ? 1 : 0;
    if (rank == 0) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::printf("%s %s: %s (%.1f s)%s%s%s\n", problem.empty() ? "ok  " : "FAIL", c.describe().c_str(), outcome.c_str(),
                  seconds, v.message.empty() ? "" : "\n      ", one_line(v.message).c_str(),
                  problem.empty() ? "" : ("\n      " + problem + "; signature " + v.signature).c_str());
      std::fflush(stdout);
      outcomes << c.id << " np=" << c.np << " outcome=" << outcome << " signature=" << v.signature
               << " message=" << one_line(v.message) << "\n";
    }
    world->barrier();
    if (rank == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }
  world->barrier();
  kept.clear();
  world->barrier();
  if (rank == 0) {
    std::error_code ignored;
    std::filesystem::remove_all(base, ignored);
    std::printf("feature matrix at np %d: %zu combinations, %d bitwise, %d refused by name, %d known failing, %d "
                "unexpected\n",
                world->size(), combinations.size(), passed, refused, known, unexpected);
  }
  world.reset();
  return unexpected > 0 ? 1 : 0;
}
