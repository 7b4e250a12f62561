// src/checkpoint/collective.cpp — every rank's outcome of a phase, exchanged in fixed-size records.
#include "checkpoint/collective.hpp"

#include <algorithm>
#include <cstring>

#include "comm/raw_collectives.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// Long enough for two paths and a reason.
constexpr std::size_t kTextBytes = 1000;

struct Record {
  uint64_t failed = 0;
  uint64_t code = 0;
  uint64_t value0 = 0;
  uint64_t value1 = 0;
  char text[kTextBytes] = {};
};

}  // namespace

std::vector<Outcome> agree_on_outcomes(Communicator& comm, const Outcome& mine, const std::string& what) {
  Record record;
  record.failed = mine.ok ? 0 : 1;
  record.code = static_cast<uint64_t>(mine.code);
  record.value0 = mine.value0;
  record.value1 = mine.value1;
  const std::size_t n = std::min(mine.message.size(), kTextBytes - 1);
  std::memcpy(record.text, mine.message.data(), n);

  std::vector<Record> all = comm::all_gather_records(comm, record);

  std::vector<Outcome> outcomes(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    all[r].text[kTextBytes - 1] = '\0';
    if (all[r].failed != 0) {
      const std::string where = comm.size() > 1 ? fmt::format(" (on rank {})", r) : "";
      throw Error(static_cast<ErrorCode>(all[r].code), fmt::format("{}: {}{}", what, all[r].text, where));
    }
    outcomes[r].value0 = all[r].value0;
    outcomes[r].value1 = all[r].value1;
  }
  return outcomes;
}

std::string broadcast_string(Communicator& comm, const std::string& text, int root) {
  char buffer[256] = {};
  SHARDOPT_CHECK(text.size() < sizeof(buffer), internal, "broadcast_string: '{}' is too long", text);
  std::memcpy(buffer, text.data(), text.size());
  comm.broadcast(buffer, sizeof(buffer) / 2, DType::bf16, root);
  buffer[sizeof(buffer) - 1] = '\0';
  return std::string(buffer);
}

}  // namespace checkpoint
}  // namespace shardopt
