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

// Rounds 2 and 3: names the first field where the lowest differing rank differs from rank 0.
[[noreturn]] void raise_field_mismatch(Communicator& comm, const AgreementRecord& mine,
                                       const std::vector<Wire>& all) {
  uint64_t longest = 0;
  for (const Wire& w : all) longest = std::max(longest, w.field_count);
  // Rank 0's per-field hashes, padded so every rank sends the same size.
  std::vector<uint64_t> reference(longest, 0);
  const std::vector<uint64_t>& hashes = mine.hashes();
  if (comm.rank() == 0) std::copy(hashes.begin(), hashes.end(), reference.begin());
  if (longest > 0) broadcast_bytes(comm, reference.data(), static_cast<int64_t>(longest * sizeof(uint64_t)), 0);

  uint64_t first_diff = kNoDifference;
  const uint64_t common = std::min<uint64_t>(hashes.size(), all[0].field_count);
  for (uint64_t i = 0; i < common && first_diff == kNoDifference; ++i) {
    if (hashes[i] != reference[i]) first_diff = i;
  }
  if (first_diff == kNoDifference && hashes.size() != all[0].field_count) first_diff = common;
  const std::vector<uint64_t> diffs = all_gather_records(comm, first_diff);

  std::size_t culprit = 0;
  for (std::size_t r = 1; r < diffs.size() && culprit == 0; ++r) {
    if (diffs[r] != kNoDifference) culprit = r;
  }
  const std::string op = text_of(all[0].operation);
  SHARDOPT_CHECK(culprit != 0, internal, "{}: the ranks' records differ but no differing field was found", op);
  const uint64_t index = diffs[culprit];

  FieldText described;
  if (index < mine.names().size()) {
    copy_text(described.name, mine.names()[index]);
    copy_text(described.value, mine.values()[index]);
  } else {
    copy_text(described.value, fmt::format("nothing (it has {} fields)", mine.names().size()));
  }
  const std::vector<FieldText> texts = all_gather_records(comm, described);
  const std::string name0 = text_of(texts[0].name);
  const std::string name1 = text_of(texts[culprit].name);
  const std::string value0 = text_of(texts[0].value);
  const std::string value1 = text_of(texts[culprit].value);
  if (name0 == name1 || name1.empty() || name0.empty()) {
    raise(ErrorCode::mismatch, "{}: ranks disagree on {}: rank 0 has {}, rank {} has {}", op,
          name0.empty() ? name1 : name0, value0, culprit, value1);
  }
  raise(ErrorCode::mismatch, "{}: ranks disagree on {}: rank 0 has {} = {}, rank {} has {} = {}", op, name0, name0,
        value0, culprit, name1, value1);
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

std::vector<Payload> agree(Communicator& comm, const AgreementRecord& mine) {
  Wire wire;
  wire.operation_hash = fnv1a(mine.operation());
  wire.fields_hash = fnv1a(std::to_string(mine.hashes().size()));
  for (uint64_t h : mine.hashes()) wire.fields_hash = (wire.fields_hash ^ h) * 1099511628211ull;
  wire.field_count = mine.hashes().size();
  wire.payload = mine.payload();
  copy_text(wire.operation, mine.operation());
  if (mine.failed()) {
    wire.error_code = static_cast<uint64_t>(mine.failure()->code());
    copy_text(wire.error, mine.failure()->what());
  }
  const std::vector<Wire> all = comm.size() > 1 ? all_gather_records(comm, wire) : std::vector<Wire>{wire};

  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r].operation_hash != all[0].operation_hash) {
      raise(ErrorCode::mismatch, "{}: ranks are in different calls: rank 0 is in {}, rank {} is in {}",
            mine.operation(), call_name(all[0]), r, call_name(all[r]));
    }
  }
  if (mine.failed()) throw *mine.failure();
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].error_code != 0) {
      raise(static_cast<ErrorCode>(all[r].error_code), "{} failed on rank {}: {}", mine.operation(), r,
            text_of(all[r].error));
    }
  }
  for (const Wire& w : all) {
    if (w.fields_hash != all[0].fields_hash || w.field_count != all[0].field_count) {
      raise_field_mismatch(comm, mine, all);
    }
  }
  std::vector<Payload> payloads;
  payloads.reserve(all.size());
  for (const Wire& w : all) payloads.push_back(w.payload);
  return payloads;
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
