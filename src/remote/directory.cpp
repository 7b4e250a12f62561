// src/remote/directory.cpp — the exchange of every owner's registrations and the checks that make them one directory.
#include "remote/directory.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

#include "comm/agreement.hpp"
#include "core/check.hpp"
#include "optim/hyperparams.hpp"

namespace shardopt {
namespace remote {
namespace {

std::string bits(double value) { return fmt::format("{:016x}", comm::double_bits(value)); }

// The fields owners of one name must share, as text.
std::string shape_text(const OwnedEntry& e) {
  const Hyperparams& h = e.hyper;
  return fmt::format("rows {} row_size {} algorithm {} lr {} betas ({}, {}) eps {} weight_decay {} momentum {} "
                     "dampening {} nesterov {} maximize {} amsgrad {}",
                     e.rows, e.row_size, algorithm_name(e.algorithm), h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                     h.momentum, h.dampening, h.nesterov, h.maximize, h.amsgrad);
}

std::string serialise(const std::vector<OwnedEntry>& mine, bool trainer) {
  std::string out = trainer ? "T\n" : "-\n";
  for (const OwnedEntry& e : mine) {
    const Hyperparams& h = e.hyper;
    out += fmt::format("{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n", e.name, e.rows, e.row_size,
                       e.row_begin, e.row_end, static_cast<int>(e.algorithm), bits(h.lr), bits(h.beta1),
                       bits(h.beta2), bits(h.eps), bits(h.weight_decay), bits(h.momentum), bits(h.dampening),
                       int{h.nesterov}, int{h.maximize}, int{h.amsgrad});
  }
  return out;
}

double unbits(const std::string& hex) { return comm::bits_double(std::stoull(hex, nullptr, 16)); }

void parse(const std::string& text, int rank, bool& trainer, std::vector<std::pair<int, OwnedEntry>>& entries) {
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);
  trainer = line == "T";
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    std::size_t start = 0;
    for (;;) {
      const std::size_t tab = line.find('\t', start);
      f.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    SHARDOPT_CHECK(f.size() == 16, internal, "RemoteOptimizer: rank {}'s directory entry is malformed", rank);
    OwnedEntry e;
    e.name = f[0];
    e.rows = std::stoll(f[1]);
    e.row_size = std::stoll(f[2]);
    e.row_begin = std::stoll(f[3]);
    e.row_end = std::stoll(f[4]);
    e.algorithm = static_cast<Algorithm>(std::stoi(f[5]));
    e.hyper.lr = unbits(f[6]);
    e.hyper.beta1 = unbits(f[7]);
    e.hyper.beta2 = unbits(f[8]);
    e.hyper.eps = unbits(f[9]);
    e.hyper.weight_decay = unbits(f[10]);
    e.hyper.momentum = unbits(f[11]);
    e.hyper.dampening = unbits(f[12]);
    e.hyper.nesterov = f[13] == "1";
    e.hyper.maximize = f[14] == "1";
    e.hyper.amsgrad = f[15] == "1";
    entries.emplace_back(rank, std::move(e));
  }
}

}  // namespace

// Every rank's text, in rank order (two all-gathers: the lengths, then the padded texts).
std::vector<std::string> all_gather_text(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  std::vector<int64_t> lengths(static_cast<std::size_t>(n));
  const int64_t length = static_cast<int64_t>(mine.size());
  comm.all_gather(&length, lengths.data(), sizeof(int64_t), DType::byte);
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<char> send(static_cast<std::size_t>(longest), '\0');
  if (!mine.empty()) std::memcpy(send.data(), mine.data(), mine.size());
  std::vector<char> all(static_cast<std::size_t>(longest * n));
  comm.all_gather(send.data(), all.data(), longest, DType::byte);
  std::vector<std::string> texts;
  for (int r = 0; r < n; ++r) {
    texts.emplace_back(all.data() + r * longest, static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]));
  }
  return texts;
}

void validate_entry(const OwnedEntry& e) {
  SHARDOPT_CHECK(e.algorithm == Algorithm::sgd || e.algorithm == Algorithm::adam || e.algorithm == Algorithm::adamw,
                 unsupported, "RemoteOptimizer: parameter '{}': algorithm {} is not one the remote optimizer runs (SGD, "
                 "Adam, AdamW: its owners update rows of parameters)",
                 e.name, algorithm_name(e.algorithm));
  SHARDOPT_CHECK(!e.name.empty() && e.name.find_first_of("\t\n") == std::string::npos, invalid_argument,
                 "RemoteOptimizer: parameter name '{}' is empty or holds a tab or newline", e.name);
  SHARDOPT_CHECK(e.rows > 0 && e.row_size > 0, invalid_argument,
                 "RemoteOptimizer: parameter '{}' has rows {} and row_size {}; both must be positive", e.name, e.rows,
                 e.row_size);
  SHARDOPT_CHECK(e.row_begin >= 0 && e.row_begin < e.row_end && e.row_end <= e.rows, invalid_argument,
                 "RemoteOptimizer: parameter '{}': rows [{}, {}) are not a non-empty range within its {} rows", e.name,
                 e.row_begin, e.row_end, e.rows);
  optim::validate_hyperparams(e.hyper, e.algorithm, "remote parameter '" + e.name + "'");
}

Directory Directory::exchange(Communicator& comm, const std::vector<OwnedEntry>& mine, bool trainer) {
  const std::vector<std::string> texts = all_gather_text(comm, serialise(mine, trainer));
  Directory dir;
  std::vector<std::pair<int, OwnedEntry>> entries;
  for (int r = 0; r < static_cast<int>(texts.size()); ++r) {
    bool is_trainer = false;
    const std::size_t before = entries.size();
    parse(texts[static_cast<std::size_t>(r)], r, is_trainer, entries);
    if (is_trainer) dir.trainers_.push_back(r);
    if (entries.size() > before) dir.owners_.push_back(r);
  }
  std::map<std::string, std::vector<const std::pair<int, OwnedEntry>*>> by_name;
  for (const auto& entry : entries) by_name[entry.second.name].push_back(&entry);
  for (auto& [name, slices] : by_name) {
    std::sort(slices.begin(), slices.end(),
              [](const auto* a, const auto* b) { return a->second.row_begin < b->second.row_begin; });
    const OwnedEntry& first = slices.front()->second;
    DirectoryParam p;
    p.name = name;
    p.rows = first.rows;
    p.row_size = first.row_size;
    p.algorithm = first.algorithm;
    p.hyper = first.hyper;
    p.check = comm::fnv1a(fmt::format("{}/{}/{}", name, first.rows, first.row_size));
    int64_t next_row = 0;
    for (const auto* slice : slices) {
      const OwnedEntry& e = slice->second;
      SHARDOPT_CHECK(shape_text(e) == shape_text(first), mismatch,
                     "RemoteOptimizer: the owners of parameter '{}' disagree: rank {} has {}, rank {} has {}", name,
                     slices.front()->first, shape_text(first), slice->first, shape_text(e));
      SHARDOPT_CHECK(e.row_begin == next_row, invalid_argument,
                     "RemoteOptimizer: parameter '{}': {} (rank {} holds rows [{}, {}), the rows before it end at {})",
                     name, e.row_begin < next_row ? "rows owned twice" : "rows owned by nobody", slice->first,
                     e.row_begin, e.row_end, next_row);
      p.slices.push_back(Slice{slice->first, e.row_begin, e.row_end});
      next_row = e.row_end;
    }
    SHARDOPT_CHECK(next_row == p.rows, invalid_argument,
                   "RemoteOptimizer: parameter '{}': rows [{}, {}) are owned by nobody", name, next_row, p.rows);
    dir.params_.push_back(std::move(p));
  }
  return dir;
}

int32_t Directory::find(const std::string& name) const {
  const auto at = std::lower_bound(params_.begin(), params_.end(), name,
                                   [](const DirectoryParam& p, const std::string& n) { return p.name < n; });
  if (at == params_.end() || at->name != name) return -1;
  return static_cast<int32_t>(at - params_.begin());
}

const DirectoryParam& Directory::checked(const RemoteParam& handle, const char* call) const {
  const bool known = handle.id >= 0 && static_cast<std::size_t>(handle.id) < params_.size() &&
                     params_[static_cast<std::size_t>(handle.id)].check == handle.check &&
                     params_[static_cast<std::size_t>(handle.id)].rows == handle.rows &&
                     params_[static_cast<std::size_t>(handle.id)].row_size == handle.row_size;
  SHARDOPT_CHECK(known, invalid_argument,
                 "RemoteOptimizer::{}: bad parameter handle (id {}, {} rows of {}): not one that lookup() of this "
                 "optimizer returned",
                 call, handle.id, handle.rows, handle.row_size);
  return params_[static_cast<std::size_t>(handle.id)];
}

RemoteParam Directory::handle(int32_t id) const {
  const DirectoryParam& p = params_[static_cast<std::size_t>(id)];
  return RemoteParam{id, p.rows, p.row_size, p.check};
}

}  // namespace remote
}  // namespace shardopt
