// tests/unit/test_round_gate.cpp — the round gate's table: one rule per call, the refusals the docs promise, and docs/round_gate.md quoting the table exactly.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "optim/round_gate.hpp"

using namespace shardopt::optim;

namespace {

bool allowed(GateCall call, RoundState state) { return (rule(call).from & (1u << static_cast<unsigned>(state))) != 0; }

}  // namespace

TEST_CASE("round gate: one rule per call, each legal from some state", "[gate]") {
  std::set<int> seen;
  for (const CallRule& r : rules()) {
    INFO(r.name);
    CHECK(seen.insert(static_cast<int>(r.call)).second);
    CHECK(r.from != 0);
    CHECK(r.from < (1u << kRoundStates));
    CHECK(&rule(r.call) == &r);
  }
  CHECK(seen.size() == static_cast<std::size_t>(GateCall::average_gradients) + 1);
}

TEST_CASE("round gate: only step() finishes a per_bucket round, only reduce_gradients() an open one", "[gate]") {
  for (const CallRule& r : rules()) {
    INFO(r.name);
    const bool commit_only = r.call == GateCall::wait_save;
    CHECK(allowed(r.call, RoundState::buckets_updated) == (r.call == GateCall::step || commit_only));
    const bool hand_over = r.call == GateCall::reduce_gradients || r.call == GateCall::average_gradients;
    CHECK(allowed(r.call, RoundState::round_open) == (hand_over || commit_only));
    if (r.call != GateCall::construct) CHECK(allowed(r.call, RoundState::reduced));
  }
  // What drains what: calls that read or replace the buffers wait for the overlapped gathers;
  // calls that change values a background save may still be reading wait for its reads.
  for (GateCall call : {GateCall::save, GateCall::save_async, GateCall::load, GateCall::load_state_dict,
                        GateCall::consolidate_state_dict, GateCall::set_trainable, GateCall::add_param_group,
                        GateCall::average_parameters, GateCall::replica_checkpoint}) {
    INFO(rule(call).name);
    CHECK((rule(call).drains & kDrainGathers) != 0);
  }
  for (GateCall call : {GateCall::step, GateCall::set_trainable, GateCall::add_param_group, GateCall::load_state_dict,
                        GateCall::average_parameters}) {
    INFO(rule(call).name);
    CHECK((rule(call).drains & kDrainSaveReads) != 0);
  }
  CHECK(rule(GateCall::step).leaves == Leaves::idle);
  CHECK(rule(GateCall::reduce_gradients).leaves == Leaves::after_reduction);
}

TEST_CASE("round gate: docs/round_gate.md quotes the table", "[gate]") {
  std::ifstream in(SHARDOPT_ROUND_GATE_DOC);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string table = rules_markdown();
  // On a mismatch, the table as it should read, for pasting (into the temporary directory).
  const std::string expected_path =
      (std::filesystem::temp_directory_path() / "shardopt_round_gate_table.md").string();
  const std::string begin = "<!-- table: rules_markdown() -->\n";
  const std::string end = "<!-- end of table -->";
  const std::string doc = text.str();
  const std::size_t at = doc.find(begin);
  REQUIRE(at != std::string::npos);
  const std::size_t stop = doc.find(end, at);
  REQUIRE(stop != std::string::npos);
  const bool same = doc.substr(at + begin.size(), stop - at - begin.size()) == table;
  if (!same) std::ofstream(expected_path) << table;
  INFO("docs/round_gate.md must contain, between its table markers, exactly the text of " << expected_path);
  CHECK(same);
}
