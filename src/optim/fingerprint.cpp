// src/optim/fingerprint.cpp — fingerprints exchanged in fixed-size records, so a mismatch never hangs.
//
// Round 1 (always): each rank all-gathers one record {local error?, count, hash of all
// params, error text}. Equal records end the check. Otherwise every rank learns the same
// facts in further fixed-size rounds: rank 0's per-param hashes, each rank's first
// differing index, then the descriptions of the differing parameter on rank 0 and on the
// first differing rank. All ranks issue the same collectives whatever they registered.
#include "optim/fingerprint.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace optim {
namespace {

constexpr std::size_t kTextBytes = 240;

struct Record {
  uint64_t error_code = 0;
  uint64_t count = 0;
  uint64_t hash = 0;
  uint64_t spare = 0;
  char text[kTextBytes] = {};
};

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void copy_text(char (&dst)[kTextBytes], const std::string& s) {
  const std::size_t n = std::min(s.size(), kTextBytes - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

}  // namespace

void check_same_registration(Communicator& comm, const std::vector<ParamSignature>& params,
                             const std::string& what, const std::string& local_error,
                             ErrorCode local_error_code) {
  std::vector<uint64_t> hashes;
  uint64_t combined = fnv1a(what);
  for (const ParamSignature& p : params) {
    hashes.push_back(fnv1a(p.description));
    combined = fnv1a(p.description, combined ^ 0x9e3779b97f4a7c15ull);
  }
  Record mine;
  mine.error_code = local_error.empty() ? 0 : static_cast<uint64_t>(local_error_code);
  mine.count = params.size();
  mine.hash = combined;
  copy_text(mine.text, local_error);
  const std::vector<Record> all = comm::all_gather_records(comm, mine);

  if (!local_error.empty()) throw Error(local_error_code, local_error);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].error_code != 0) {
      raise(static_cast<ErrorCode>(all[r].error_code), "{} failed on rank {}: {}", what, r, all[r].text);
    }
  }
  bool same = true;
  for (const Record& r : all) same = same && r.count == all[0].count && r.hash == all[0].hash;
  if (same) return;

  // Rank 0's per-param hashes, padded to the longest list so every rank sends the same size.
  uint64_t longest = 0;
  for (const Record& r : all) longest = std::max(longest, r.count);
  std::vector<uint64_t> reference(longest, 0);
  if (comm.rank() == 0) std::copy(hashes.begin(), hashes.end(), reference.begin());
  comm.broadcast(reference.data(), static_cast<int64_t>(longest * 4), DType::bf16, 0);

  uint64_t first_diff = std::min<uint64_t>(params.size(), all[0].count);
  for (uint64_t i = 0; i < first_diff; ++i) {
    if (hashes[i] != reference[i]) {
      first_diff = i;
      break;
    }
  }
  if (params.size() == all[0].count && first_diff == params.size()) first_diff = UINT64_MAX;
  const std::vector<uint64_t> diffs = comm::all_gather_records(comm, first_diff);

  // The lowest rank that differs from rank 0, at its first differing parameter.
  std::size_t culprit = 0;
  for (std::size_t r = 1; r < diffs.size() && culprit == 0; ++r) {
    if (diffs[r] != UINT64_MAX) culprit = r;
  }
  SHARDOPT_CHECK(culprit != 0, internal, "{}: fingerprints differ but no differing parameter was found", what);
  const uint64_t index = diffs[culprit];

  Record described;
  copy_text(described.text, index < params.size()
                                ? params[index].description
                                : "nothing (it registered only " + std::to_string(params.size()) + " parameters)");
  const std::vector<Record> descriptions = comm::all_gather_records(comm, described);
  raise(ErrorCode::mismatch,
        "{}: parameter registration differs across ranks at parameter #{}: rank {} registered {} "
        "but rank 0 registered {}",
        what, index, culprit, descriptions[culprit].text, descriptions[0].text);
}

}  // namespace optim
}  // namespace shardopt
