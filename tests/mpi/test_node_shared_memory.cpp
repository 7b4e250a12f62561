// tests/mpi/test_node_shared_memory.cpp — a node-shared buffer whose creation fails part way (a collective of the exchange raising, as a timeout or a poisoned communicator would) leaves no segment in /dev/shm.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "comm/node_shared_memory.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/comm_backend.hpp"
#include "shm_segments.hpp"

using namespace shardopt;
using shardopt_test::segments_of_this_job;
using shardopt_test::world;

namespace {

// Forwards to `inner`, except that one kind of collective raises Error(timeout) on every rank
// (no rank enters it, so nothing is left unmatched).
class FailingComm final : public CommBackend {
 public:
  enum class Fails { broadcast, all_gather };
  FailingComm(std::shared_ptr<Communicator> inner, Fails fails) : inner_(std::move(inner)), fails_(fails) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return inner_->device(); }
  const char* backend_name() const override { return "failing"; }
  void broadcast(void* b, int64_t n, DType d, int root) override {
    if (fails_ == Fails::broadcast) fail("broadcast");
    inner_->broadcast(b, n, d, root);
  }
  void all_gather(const void* s, void* r, int64_t n, DType d) override {
    if (fails_ == Fails::all_gather) fail("all_gather");
    inner_->all_gather(s, r, n, d);
  }
  void reduce_scatter(const void* s, void* r, int64_t n, DType d, ReduceOp op) override {
    inner_->reduce_scatter(s, r, n, d, op);
  }
  void all_reduce(void* b, int64_t n, DType d, ReduceOp op) override { inner_->all_reduce(b, n, d, op); }
  void reduce(const void* s, void* r, int64_t n, DType d, ReduceOp op, int root) override {
    inner_->reduce(s, r, n, d, op, root);
  }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<PendingCollective> broadcast_async(void* b, int64_t n, DType d, int root) override {
    return inner_->broadcast_async(b, n, d, root);
  }
  std::unique_ptr<PendingCollective> all_gather_async(const void* s, void* r, int64_t n, DType d) override {
    return inner_->all_gather_async(s, r, n, d);
  }
  std::unique_ptr<PendingCollective> all_reduce_async(void* b, int64_t n, DType d, ReduceOp op) override {
    return inner_->all_reduce_async(b, n, d, op);
  }
  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* s, void* r, int64_t n, DType d,
                                                          ReduceOp op) override {
    return inner_->reduce_scatter_async(s, r, n, d, op);
  }
  std::unique_ptr<PendingCollective> reduce_async(const void* s, void* r, int64_t n, DType d, ReduceOp op,
                                                  int root) override {
    return inner_->reduce_async(s, r, n, d, op, root);
  }
  std::shared_ptr<CommBackend> split(int color, int key) override {
    std::shared_ptr<Communicator> child = inner_->split(color, key);
    return child ? backend_of(*child) : nullptr;
  }

 private:
  [[noreturn]] static void fail(const char* op) {
    throw Error(ErrorCode::timeout, std::string(op) + " did not complete (forced by the test)");
  }
  std::shared_ptr<Communicator> inner_;
  Fails fails_;
};

}  // namespace

TEST_CASE("a node-shared buffer whose exchange fails leaves no segment behind", "[node_sharing]") {
  std::shared_ptr<Communicator> node = world()->split_node();
  REQUIRE(node != nullptr);
  for (FailingComm::Fails fails : {FailingComm::Fails::broadcast, FailingComm::Fails::all_gather}) {
    INFO((fails == FailingComm::Fails::broadcast ? "the name's broadcast fails" : "the outcomes' all-gather fails"));
    const std::set<std::string> before = segments_of_this_job();
    Communicator failing(std::make_shared<FailingComm>(node, fails));
    std::string why_not;
    const auto [code, what] = shardopt_test::error_of([&] { comm::map_node_shared(failing, 1 << 16, why_not); });
    CHECK(code == ErrorCode::timeout);
    CHECK_THAT(what, Catch::Contains("forced by the test"));
    world()->barrier();
    const std::set<std::string> after = segments_of_this_job();
    std::vector<std::string> left;
    std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(left));
    CHECK(left == std::vector<std::string>{});
  }
  // The same exchange without the failure maps a buffer and leaves no name either.
  const std::set<std::string> before = segments_of_this_job();
  std::string why_not;
  const comm::NodeSharedBuffer buffer = comm::map_node_shared(*node, 1 << 16, why_not);
  CHECK(buffer.data != nullptr);
  CHECK(why_not.empty());
  world()->barrier();
  CHECK(segments_of_this_job() == before);
}
