// src/averaging/join_refusal_relay.cpp — join() beside model averaging: a rank that raises the refusal carries it into the next agreement of each averaging communicator, so every rank of the world raises it by name and none waits for a rank that left.
//
// Why a relay: the replicas meet only in the averaging's collectives (every `period` steps, and
// every round in warmup), each over a group of its own (the ranks of one shard across the
// replicas of a level group). A rank that raises the refusal (its own join(), or a replica
// peer's carried into its call) leaves every one of those groups; their other ranks would wait
// for it at their next averaging until the timeout. Instead it waits for them there, in their
// next agreement, which fails on all of them with the refusal; each rank that learns it so
// relays it on its own groups in turn. A rank learns it once, in the first agreement that
// carries it, and all members of that agreement learn it together: nobody waits on a group
// whose ranks have all left it.
#include <algorithm>
#include <utility>
#include <vector>

#include "averaging/averaging_schedule.hpp"
#include "averaging/model_averager_impl.hpp"
#include "comm/agreement.hpp"
#include "optim/round_gate.hpp"

namespace shardopt {

namespace {

// Joins `comm`'s next agreement, whichever call its other ranks are in, carrying `e`: they raise
// "<their call> failed on rank r: <e>". Shadowing, so the call's name is not compared. Errors
// here (this rank's own, rethrown; a timeout) are the caller's to drop: it raises `e`.
void carry_into_next_agreement(Communicator& comm, const Error& e) {
  comm::AgreementRecord record("join");
  record.set_shadowing();
  record.fail(e);
  try {
    comm::agree_with_joined(comm, record);
  } catch (const Error&) {
  }
}

// The levels, in the order of the first step from `from` on that averages at each (a level
// whose steps all fall on larger levels' is left out: it never averages).
std::vector<int> levels_in_schedule_order(const AveragerConfig& config, int64_t from) {
  std::vector<std::pair<int64_t, int>> first;
  for (std::size_t l = 0; l < config.levels.size(); ++l) {
    const int64_t period = config.levels[l].period;
    // Periodic averagers count from warmup, hierarchical ones from step 0 (averaging_schedule).
    const int64_t origin = config.hierarchical ? 0 : config.warmup_steps;
    int64_t s = origin + (from - origin + period - 1) / period * period;
    for (int tries = 0; tries < 64 && averaging::level_at(config, s) != static_cast<int>(l); ++tries) s += period;
    if (averaging::level_at(config, s) == static_cast<int>(l)) first.emplace_back(s, static_cast<int>(l));
  }
  std::sort(first.begin(), first.end());
  std::vector<int> levels;
  for (const auto& f : first) levels.push_back(f.second);
  return levels;
}

}  // namespace

void ModelAverager::Impl::relay_join_refusal(const Error& e, const std::vector<const Communicator*>& covered) {
  if (join_refusal_relayed || !optim::is_join_refusal(e)) return;
  join_refusal_relayed = true;
  std::vector<Communicator*> order;
  const auto add = [&](Communicator* c) {
    const bool known = std::find(covered.begin(), covered.end(), c) != covered.end() ||
                       std::find(order.begin(), order.end(), c) != order.end();
    if (c->size() > 1 && !known) order.push_back(c);
  };
  // The replica's next optimizer call comes first (within this step); then the groups in the
  // order the other replicas reach them, so that no rank waits here for a rank waiting there.
  add(&port.replica());
  if (warmup_gradients_cross && step < config.warmup_steps) add(groups.world_peers.get());
  for (int level : levels_in_schedule_order(config, std::max(step, config.warmup_steps))) {
    add(groups.level_peers[static_cast<std::size_t>(level)].get());
  }
  // (config.overlap: the last step's all-gathers land first; this rank's MPI calls come from
  // one thread at a time.)
  try {
    port.wait_for_queued_work();
  } catch (const Error&) {
  }
  for (Communicator* c : order) carry_into_next_agreement(*c, e);
}

}  // namespace shardopt
