// src/comm/agreement.cpp — agreement records exchanged in fixed-size rounds, so that ranks that disagree never hang.
//
// Round 1 (always): one all-gather of {operation, hash of all fields, field count, failure,
// payload}. Equal operations, no failure and equal hashes end it: the common case costs one
// small collective. Otherwise every rank learns the same facts in further fixed-size rounds,
// taken by all ranks alike whatever they hold: rank 0's per-field hashes, each rank's first
// differing field, then the name and value of that field on rank 0 and on the first rank that
// differs.
#include "comm/agreement.hpp"

#include <algorithm>
#include <cstring>

#include "comm/raw_collectives.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace comm {
uint64_t fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

template <std::size_t N>
void copy_text(char (&dst)[N], const std::string& s) {
  const std::size_t n = std::min(s.size(), N - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

template <std::size_t N>
std::string text_of(const char (&src)[N]) {
  return std::string(src, strnlen(src, N));
}

// Long enough for an error naming two paths and a reason.
struct Wire {
  uint64_t operation_hash = 0;
  uint64_t fields_hash = 0;
  uint64_t field_count = 0;
  uint64_t error_code = 0;  // 0: this rank's validation passed
  uint64_t shadowing = 0;   // 1: this rank is in join() and follows the active ranks' call
  Payload payload{};
  char operation[56] = {};
  char error[952] = {};
};

struct FieldText {
  char name[120] = {};
  char value[392] = {};
};

constexpr uint64_t kNoDifference = UINT64_MAX;

// A record whose call name does not hash to its operation hash was not written by agree(): the
// peer is in another collective on this communicator (say a barrier called on it directly)
// and MPI matched that collective's traffic with ours.
std::string call_name(const Wire& w) {
  const std::string name = text_of(w.operation);
  if (name.empty() || fnv1a(name) != w.operation_hash) {
    return "another collective (it sent no agreement record: a collective called on the "
           "communicator directly, or one of a different shardopt object)";
  }
  return name + "()";
}

// Rounds 2 and 3: names the first field where the lowest differing rank differs from rank `ref`
// (the lowest active one; ranks in join() are never compared).
[[noreturn]] void raise_field_mismatch(Communicator& comm, const AgreementRecord& mine,
                                       const std::vector<Wire>& all, std::size_t ref) {
  uint64_t longest = 0;
  for (const Wire& w : all) longest = std::max(longest, w.field_count);
  // The reference rank's per-field hashes, padded so every rank sends the same size.
  std::vector<uint64_t> reference(longest, 0);
  const std::vector<uint64_t>& hashes = mine.hashes();
  if (static_cast<std::size_t>(comm.rank()) == ref) std::copy(hashes.begin(), hashes.end(), reference.begin());
  broadcast_values(comm, reference, static_cast<int>(ref));

  uint64_t first_diff = kNoDifference;
  if (!mine.shadowing()) {
    const uint64_t common = std::min<uint64_t>(hashes.size(), all[ref].field_count);
    for (uint64_t i = 0; i < common && first_diff == kNoDifference; ++i) {
      if (hashes[i] != reference[i]) first_diff = i;
    }
    if (first_diff == kNoDifference && hashes.size() != all[ref].field_count) first_diff = common;
  }
  const std::vector<uint64_t> diffs = all_gather_records(comm, first_diff);

  std::size_t culprit = ref;
  for (std::size_t r = ref + 1; r < diffs.size() && culprit == ref; ++r) {
    if (diffs[r] != kNoDifference) culprit = r;
  }
  const std::string op = text_of(all[ref].operation);
  SHARDOPT_CHECK(culprit != ref, internal, "{}: the ranks' records differ but no differing field was found", op);
  const uint64_t index = diffs[culprit];

  FieldText described;
  if (index < mine.names().size()) {
    copy_text(described.name, mine.names()[index]);
    copy_text(described.value, mine.values()[index]);
  } else {
    copy_text(described.value, fmt::format("nothing (it has {} fields)", mine.names().size()));
  }
  const std::vector<FieldText> texts = all_gather_records(comm, described);
  const std::string name0 = text_of(texts[ref].name);
  const std::string name1 = text_of(texts[culprit].name);
  const std::string value0 = text_of(texts[ref].value);
  const std::string value1 = text_of(texts[culprit].value);
  if (name0 == name1 || name1.empty() || name0.empty()) {
    raise(ErrorCode::mismatch, "{}: ranks disagree on {}: rank {} has {}, rank {} has {}", op,
          name0.empty() ? name1 : name0, ref, value0, culprit, value1);
  }
  raise(ErrorCode::mismatch, "{}: ranks disagree on {}: rank {} has {} = {}, rank {} has {} = {}", op, name0, ref,
        name0, value0, culprit, name1, value1);
}

}  // namespace

void AgreementRecord::field(std::string name, std::string value) {
  hashes_.push_back(fnv1a(value, fnv1a(name) ^ 0x9e3779b97f4a7c15ull));
  names_.push_back(std::move(name));
  values_.push_back(std::move(value));
}

void AgreementRecord::fail(const Error& error) {
  if (!failure_) failure_ = error;
}

int Agreed::active() const {
  return static_cast<int>(std::count(shadowing.begin(), shadowing.end(), false));
}

Agreed agree_with_joined(Communicator& comm, const AgreementRecord& mine) {
  Wire wire;
  wire.operation_hash = fnv1a(mine.operation());
  wire.fields_hash = fnv1a(std::to_string(mine.hashes().size()));
  for (uint64_t h : mine.hashes()) wire.fields_hash = (wire.fields_hash ^ h) * 1099511628211ull;
  wire.field_count = mine.hashes().size();
  wire.shadowing = mine.shadowing() ? 1 : 0;
  wire.payload = mine.payload();
  copy_text(wire.operation, mine.operation());
  if (mine.failed()) {
    wire.error_code = static_cast<uint64_t>(mine.failure()->code());
    copy_text(wire.error, mine.failure()->what());
  }
  const std::vector<Wire> all = comm.size() > 1 ? all_gather_records(comm, wire) : std::vector<Wire>{wire};

  Agreed agreed;
  std::size_t ref = all.size();
  for (std::size_t r = 0; r < all.size(); ++r) {
    agreed.shadowing.push_back(all[r].shadowing != 0);
    if (all[r].shadowing == 0 && ref == all.size()) ref = r;
  }
  for (std::size_t r = ref + 1; r < all.size(); ++r) {
    if (all[r].shadowing == 0 && all[r].operation_hash != all[ref].operation_hash) {
      raise(ErrorCode::mismatch, "{}: ranks are in different calls: rank {} is in {}, rank {} is in {}",
            mine.operation(), ref, call_name(all[ref]), r, call_name(all[r]));
    }
  }
  if (mine.failed()) throw *mine.failure();
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].error_code != 0) {
      raise(static_cast<ErrorCode>(all[r].error_code), "{} failed on rank {}: {}", mine.operation(), r,
            text_of(all[r].error));
    }
  }
  if (ref < all.size()) {
    for (const Wire& w : all) {
      if (w.shadowing == 0 && (w.fields_hash != all[ref].fields_hash || w.field_count != all[ref].field_count)) {
        raise_field_mismatch(comm, mine, all, ref);
      }
    }
    agreed.operation = text_of(all[ref].operation);
    agreed.reference = static_cast<int>(ref);
  }
  agreed.payloads.reserve(all.size());
  for (const Wire& w : all) agreed.payloads.push_back(w.payload);
  return agreed;
}

void raise_if_joined(const Agreed& agreed, const std::string& operation) {
  for (std::size_t r = 0; r < agreed.shadowing.size(); ++r) {
    if (!agreed.shadowing[r]) continue;
    raise(ErrorCode::invalid_argument,
          "{}(): rank {} is in join() (out of inputs), which shadows only reduce_gradients, reduce_gradient, "
          "clip_grad_norm and step; call {}() once every rank has left join()",
          operation, r, operation);
  }
}

std::vector<Payload> agree(Communicator& comm, const AgreementRecord& mine) {
  Agreed agreed = agree_with_joined(comm, mine);
  raise_if_joined(agreed, agreed.operation.empty() ? mine.operation() : agreed.operation);
  return std::move(agreed.payloads);
}

void join_failed(Communicator& comm, const std::string& operation, const Error& error) noexcept {
  try {
    AgreementRecord record(operation);
    record.fail(error);
    agree(comm, record);
  } catch (...) {
    // agree() rethrows this failure here (or the ranks' disagreement, or a communication
    // error): the caller reports its original error instead.
  }
}

uint64_t double_bits(double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double bits_double(uint64_t bits) {
  double value = 0;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace comm
}  // namespace shardopt
