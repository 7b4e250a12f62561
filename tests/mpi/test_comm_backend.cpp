// tests/mpi/test_comm_backend.cpp — a transport that implements only CommBackend's required calls serves every Communicator call (blocking forms, broadcast groups, split) with the MPI communicator's results.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "shardopt/comm_backend.hpp"

using namespace shardopt;
using shardopt_test::world;

namespace {

// The smallest transport: the required calls, each over `inner`'s nonblocking form; it counts
// them, so the test sees the blocking calls arrive here as start + wait.
class MinimalBackend final : public CommBackend {
 public:
  explicit MinimalBackend(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Device device() const override { return inner_->device(); }
  const char* backend_name() const override { return "minimal"; }

  std::unique_ptr<PendingCollective> broadcast_async(void* b, int64_t n, DType d, int root) override {
    ++started_;
    return inner_->broadcast_async(b, n, d, root);
  }
  std::unique_ptr<PendingCollective> all_gather_async(const void* s, void* r, int64_t n, DType d) override {
    ++started_;
    return inner_->all_gather_async(s, r, n, d);
  }
  std::unique_ptr<PendingCollective> all_reduce_async(void* b, int64_t n, DType d, ReduceOp op) override {
    ++started_;
    return inner_->all_reduce_async(b, n, d, op);
  }
  std::unique_ptr<PendingCollective> reduce_scatter_async(const void* s, void* r, int64_t n, DType d,
                                                          ReduceOp op) override {
    ++started_;
    return inner_->reduce_scatter_async(s, r, n, d, op);
  }
  std::unique_ptr<PendingCollective> reduce_async(const void* s, void* r, int64_t n, DType d, ReduceOp op,
                                                  int root) override {
    ++started_;
    return inner_->reduce_async(s, r, n, d, op, root);
  }
  void barrier() override { inner_->barrier(); }
  std::shared_ptr<CommBackend> split(int color, int key) override {
    std::shared_ptr<Communicator> child = inner_->split(color, key);
    return child ? std::make_shared<MinimalBackend>(std::move(child)) : nullptr;
  }

  int started() const { return started_; }

 private:
  std::shared_ptr<Communicator> inner_;
  int started_ = 0;
};

}  // namespace

TEST_CASE("a transport with only the required calls serves every Communicator call", "[comm][backend]") {
  auto backend = std::make_shared<MinimalBackend>(world());
  Communicator comm(backend);
  const int n = comm.size();
  const int me = comm.rank();
  CHECK(std::string(comm.backend_name()) == "minimal");
  CHECK(backend_of(comm) == backend);
  // The optional capabilities' defaults: a host transport that shares no memory.
  CHECK_FALSE(comm.cuda_aware());
  CHECK(comm.cuda_stream() == nullptr);
  CHECK(comm.split_node() == nullptr);
  CHECK_NOTHROW(backend->require_serialized_calls());
  // A transport that does not say how long a peer may take is still bounded (CommOptions' default).
  CHECK(comm.timeout_seconds() == CommOptions{}.timeout_seconds);
  CHECK(comm.timeout_seconds() > 0);

  // The blocking forms arrive as the nonblocking ones, and give the MPI communicator's values.
  std::vector<float> b(5, me == n - 1 ? 2.5f : 0.f);
  comm.broadcast(b.data(), 5, DType::f32, n - 1);
  CHECK(b == std::vector<float>(5, 2.5f));
  std::vector<float> all(static_cast<std::size_t>(3 * n), -1.f);
  const std::vector<float> mine(3, static_cast<float>(me));
  comm.all_gather(mine.data(), all.data(), 3, DType::f32);
  for (int r = 0; r < n; ++r) CHECK(all[static_cast<std::size_t>(3 * r + 2)] == static_cast<float>(r));
  std::vector<float> s(4, static_cast<float>(me + 1));
  comm.all_reduce(s.data(), 4, DType::f32, ReduceOp::sum);
  CHECK(s == std::vector<float>(4, static_cast<float>(n * (n + 1) / 2)));
  std::vector<float> send(static_cast<std::size_t>(2 * n), 1.f);
  std::vector<float> block(2, 0.f);
  comm.reduce_scatter(send.data(), block.data(), 2, DType::f32, ReduceOp::sum);
  CHECK(block == std::vector<float>(2, static_cast<float>(n)));
  const std::vector<float> to_root(2, static_cast<float>(me + 1));
  std::vector<float> at_root(2, 0.f);
  comm.reduce(to_root.data(), at_root.data(), 2, DType::f32, ReduceOp::max, 0);
  if (me == 0) CHECK(at_root == std::vector<float>(2, static_cast<float>(n)));
  CHECK(backend->started() == 5);

  // A broadcast group is started part by part and finished by one wait.
  std::vector<float> x(2, me == 0 ? 4.f : 0.f);
  std::vector<float> y(3, me == n - 1 ? 8.f : 0.f);
  const BroadcastPart parts[] = {{x.data(), 2, 0}, {y.data(), 3, n - 1}};
  comm.broadcast_group_async(parts, 2, DType::f32)->wait();
  CHECK(x == std::vector<float>(2, 4.f));
  CHECK(y == std::vector<float>(3, 8.f));
  CHECK(backend->started() == 7);

  // split wraps the transport's child; a negative color gets null, as from MPI.
  std::shared_ptr<Communicator> solo = comm.split(me, 0);
  REQUIRE(solo != nullptr);
  CHECK(solo->size() == 1);
  CHECK(std::string(solo->backend_name()) == "minimal");
  std::shared_ptr<Communicator> others = comm.split(me == 0 ? -1 : 1, 0);
  CHECK((others == nullptr) == (me == 0));
  if (others) CHECK(others->size() == n - 1);
  comm.barrier();
}

TEST_CASE("a Communicator over no transport is refused by name", "[comm][backend]") {
  const auto [code, what] = shardopt_test::error_of([] { Communicator comm(nullptr); });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(what, Catch::Contains("the backend is null"));
}
