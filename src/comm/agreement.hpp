// src/comm/agreement.hpp — the one protocol by which ranks agree on a collective decision, or all fail with the same named error.
//
// Every collective entry point of shardopt starts with an agreement: each rank describes what
// it is about to do (the operation, the arguments and settings that must match, whether its own
// validation failed) in a record of one fixed size, and the records are all-gathered. Ranks in
// different calls, with different values, or with an invalid value on any one of them then all
// raise the same Error instead of cross-matching collectives, hanging, or diverging.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace comm {

// Numbers a rank shares with the others in the same collective (flags, partial norms, sizes):
// returned to every rank, never compared.
constexpr std::size_t kPayloadSlots = 4;
using Payload = std::array<uint64_t, kPayloadSlots>;

// What one rank contributes. Fields are compared by hash; their text is exchanged only when
// they differ, to name them.
class AgreementRecord {
 public:
  // `operation` names the call ("step", "save", "ZeroOptimizer"): messages print it as "step()".
  explicit AgreementRecord(std::string operation) : operation_(std::move(operation)) {}

  // A value that must be the same on every rank, as text ("0.001", "adamw", "true").
  void field(std::string name, std::string value);
  // This rank's own validation failed: every rank raises this error's code.
  void fail(const Error& error);
  // Runs `check`; an Error it throws becomes this rank's failure. Returns whether it passed.
  template <typename Check>
  bool validate(Check&& check) {
    if (failure_) return false;
    try {
      check();
      return true;
    } catch (const Error& e) {
      fail(e);
      return false;
    }
  }
  void set_payload(std::size_t slot, uint64_t value) { payload_.at(slot) = value; }
  // This rank is in join(): it has no call of its own and follows whichever call the ranks
  // still active are in (its operation and fields are not compared with theirs).
  void set_shadowing() { shadowing_ = true; }
  bool shadowing() const { return shadowing_; }

  const std::string& operation() const { return operation_; }
  bool failed() const { return failure_.has_value(); }
  const std::optional<Error>& failure() const { return failure_; }
  const Payload& payload() const { return payload_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<std::string>& values() const { return values_; }
  const std::vector<uint64_t>& hashes() const { return hashes_; }

 private:
  std::string operation_;
  std::vector<std::string> names_;
  std::vector<std::string> values_;
  std::vector<uint64_t> hashes_;
  std::optional<Error> failure_;
  Payload payload_{};
  bool shadowing_ = false;
};

// What an agreement that joined ranks may shadow returns to every rank alike.
struct Agreed {
  std::vector<Payload> payloads;   // every rank's, in rank order
  std::vector<bool> shadowing;     // which ranks are in join()
  std::string operation;           // the active ranks' call ("" when every rank is in join())
  int reference = 0;               // the lowest active rank (0 when every rank is in join())
  int active() const;
};

// Collective over `comm`: every rank must call it (every shardopt entry point does, first).
// Raises on every rank, in this order of precedence:
//  - Error(mismatch) "{op}: ranks are in different calls: rank a is in X(), rank b is in Y()";
//  - a rank's validation failure: that rank rethrows its own Error, the others raise the same
//    code with "{op} failed on rank r: {its message}" (r: the lowest failing rank);
//  - Error(mismatch) "{op}: ranks disagree on {field}: rank a has {value}, rank b has {value}"
//    for the first field where the lowest differing rank b differs from rank a = 0.
// Otherwise returns every rank's payload, in rank order.
// A rank in join() (a shadowing record) makes every rank raise Error(invalid_argument) naming
// the call and the joined rank: only the calls that use agree_with_joined() are shadowed.
std::vector<Payload> agree(Communicator& comm, const AgreementRecord& mine);
// The same protocol where ranks in join() take part: the active ranks must be in the same call
// with the same fields (compared against the lowest active rank); the shadowing ones only
// contribute their payload and any validation failure, and learn the call.
Agreed agree_with_joined(Communicator& comm, const AgreementRecord& mine);
// Error(invalid_argument) on every rank when some rank of `agreed` is in join(): `operation`
// (the active ranks' call) is not one that join() shadows.
void raise_if_joined(const Agreed& agreed, const std::string& operation);

// For a failure found before an entry point's own agreement could be built (a C ABI argument
// or a Python object that could not even be read): joins the agreement of `operation` carrying
// `error`, so that the other ranks, inside that call, raise too. Never throws: the caller then
// reports its own original error.
void join_failed(Communicator& comm, const std::string& operation, const Error& error) noexcept;

// FNV-1a of `s`, continuing from `h`: how records hash their fields, and how a caller folds a
// long description (every parameter of a model) into one field's value.
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull);

// A double carried in a payload slot, bit for bit.
uint64_t double_bits(double value);
double bits_double(uint64_t bits);

}  // namespace comm
}  // namespace shardopt
