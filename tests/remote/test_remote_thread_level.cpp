// tests/remote/test_remote_thread_level.cpp — under MPI initialised with MPI_THREAD_SERIALIZED (shardopt's default), constructing a RemoteOptimizer is refused by name on every rank.
#include "../mpi/mpi_test_support.hpp"

using namespace shardopt;

TEST_CASE("remote optimizer needs MPI_THREAD_MULTIPLE", "[remote]") {
  auto& comm = shardopt_test::world();
  RemoteGroupSpec group;
  if (comm->rank() == 0) group.params.push_back({"x", 4, 1, 0, 4, nullptr});
  try {
    RemoteOptimizer remote(comm, {group}, {});
    FAIL("constructed under " << "MPI_THREAD_SERIALIZED");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.code() == ErrorCode::unsupported);
    CHECK(std::string(e.what()).find("needs MPI_THREAD_MULTIPLE, but this process's MPI provides "
                                     "MPI_THREAD_SERIALIZED") != std::string::npos);
  }
  // The communicator is still usable: the refusal was agreed, nothing was left half done.
  float one = 1.f;
  comm->all_reduce(&one, 1, DType::f32, ReduceOp::sum);
  CHECK(one == static_cast<float>(comm->size()));
}
