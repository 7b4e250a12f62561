// src/checkpoint/collective.cpp — checkpoint phase outcomes carried by agreement records.
#include "checkpoint/collective.hpp"

#include <cstring>

#include "comm/agreement.hpp"
#include "comm/raw_collectives.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {

std::vector<Outcome> agree_on_outcomes(Communicator& comm, const Outcome& mine, const std::string& operation,
                                       const std::string& what) {
  comm::AgreementRecord record(operation);
  if (!mine.ok) record.fail(Error(mine.code, fmt::format("{}: {}", what, mine.message)));
  record.set_payload(0, mine.value0);
  record.set_payload(1, mine.value1);
  std::vector<Outcome> outcomes;
  for (const comm::Payload& p : comm::agree(comm, record)) {
    Outcome o;
    o.value0 = p[0];
    o.value1 = p[1];
    outcomes.push_back(o);
  }
  return outcomes;
}

std::string broadcast_string(Communicator& comm, const std::string& text, int root) {
  struct Text {
    char bytes[256];
  };
  Text buffer = {};
  SHARDOPT_CHECK(text.size() < sizeof(buffer.bytes), internal, "broadcast_string: '{}' is too long", text);
  std::memcpy(buffer.bytes, text.data(), text.size());
  comm::broadcast_record(comm, buffer, root);  // through memory of its own, not this stack frame
  buffer.bytes[sizeof(buffer.bytes) - 1] = '\0';
  return std::string(buffer.bytes);
}

}  // namespace checkpoint
}  // namespace shardopt
