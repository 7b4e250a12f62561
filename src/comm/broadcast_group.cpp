// src/comm/broadcast_group.cpp — Communicator::broadcast_group_async's default: the broadcasts started one by one, finished by one wait.
#include <utility>
#include <vector>

#include "shardopt/communicator.hpp"

namespace shardopt {
namespace {

class PendingGroup final : public PendingCollective {
 public:
  explicit PendingGroup(std::vector<std::unique_ptr<PendingCollective>> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& part : parts_) part->wait();
    parts_.clear();
  }

 private:
  std::vector<std::unique_ptr<PendingCollective>> parts_;
};

}  // namespace

std::unique_ptr<PendingCollective> Communicator::broadcast_group_async(const BroadcastPart* parts,
                                                                       std::size_t count, DType dtype) {
  std::vector<std::unique_ptr<PendingCollective>> started;
  started.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    started.push_back(broadcast_async(parts[i].buffer, parts[i].count, dtype, parts[i].root));
  }
  return std::make_unique<PendingGroup>(std::move(started));
}

}  // namespace shardopt
