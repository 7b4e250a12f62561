// src/remote/directory.hpp — which rank owns which rows of which remote parameter: exchanged once at construction, the same on every rank, and the checks of a trainer's handles against it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/optimizer.hpp"
#include "shardopt/remote.hpp"

namespace shardopt {
namespace remote {

struct Slice {
  int owner = -1;
  int64_t row_begin = 0;
  int64_t row_end = 0;
};

// What one owner registered for one parameter.
struct OwnedEntry {
  std::string name;
  int64_t rows = 0;
  int64_t row_size = 1;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  Algorithm algorithm = Algorithm::adam;
  Hyperparams hyper;
};

struct DirectoryParam {
  std::string name;
  int64_t rows = 0;
  int64_t row_size = 1;
  Algorithm algorithm = Algorithm::adam;
  Hyperparams hyper;
  std::vector<Slice> slices;  // by row_begin; together every row once
  uint64_t check = 0;
};

class Directory {
 public:
  // Collective over `comm`: every rank's entries and trainer flag are all-gathered, and every
  // rank checks the whole (owners of one name agree on its shape, algorithm and
  // hyperparameters; their rows cover it exactly once), raising the same Error on every rank.
  static Directory exchange(Communicator& comm, const std::vector<OwnedEntry>& mine, bool trainer);

  std::size_t size() const { return params_.size(); }
  const DirectoryParam& param(int32_t id) const { return params_[static_cast<std::size_t>(id)]; }
  int32_t find(const std::string& name) const;  // -1 when absent
  // The entry `handle` names; Error(invalid_argument) naming `call` for a handle that is not
  // one of this directory's.
  const DirectoryParam& checked(const RemoteParam& handle, const char* call) const;
  RemoteParam handle(int32_t id) const;

  const std::vector<int>& trainers() const { return trainers_; }  // ranks, ascending
  const std::vector<int>& owners() const { return owners_; }      // ranks owning any rows

 private:
  std::vector<DirectoryParam> params_;  // by name
  std::vector<int> trainers_;
  std::vector<int> owners_;
};

// Collective: every rank's `mine`, in rank order (its length first, then the padded texts).
std::vector<std::string> all_gather_text(Communicator& comm, const std::string& mine);

// The local checks of one owner's entry (Error(invalid_argument) naming the parameter).
void validate_entry(const OwnedEntry& entry);

}  // namespace remote
}  // namespace shardopt
