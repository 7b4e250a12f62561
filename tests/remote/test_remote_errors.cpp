// tests/remote/test_remote_errors.cpp — bad handles, wrong sizes, out-of-range rows, contexts stepped twice or never opened are named errors with nothing applied; a bad construction fails on every rank.
#include "remote_model.hpp"

using namespace shardopt;
using namespace shardopt_test;

namespace {

template <typename Call>
void check_refused(Call&& call, ErrorCode code, const std::string& fragment) {
  try {
    call();
    FAIL("no error; expected one naming: " << fragment);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.code() == code);
    CHECK(std::string(e.what()).find(fragment) != std::string::npos);
  }
}

std::vector<float> pull_all(RemoteOptimizer& remote, const std::string& name) {
  const RemoteParam p = remote.lookup(name);
  std::vector<float> out(static_cast<std::size_t>(p.numel()));
  remote.pull(p, out.data(), p.numel());
  return out;
}

}  // namespace

TEST_CASE("remote trainer calls with bad input: named errors, nothing applied", "[remote]") {
  auto& comm = world();
  const int rank = comm->rank();
  std::vector<int> owners = {0};
  if (comm->size() > 1) owners.push_back(1);
  const std::vector<RemoteModelParam> model = remote_model(owners);
  RemoteOptions options;
  options.order = RemoteOrder::deterministic;
  options.max_open_contexts = 2;
  options.timeout_seconds = 20;
  RemoteOptimizer remote(comm, owned_groups(model, rank), options);
  const RemoteParam emb = remote.lookup("emb");
  const std::vector<float> before = pull_all(remote, "emb");
  comm->barrier();

  const RemoteContext context = remote.open_context();
  const std::vector<float> grad(static_cast<std::size_t>(emb.numel()), 1.f);
  RemoteParam made_up = emb;
  made_up.id = 7;
  check_refused([&] { remote.push(context, made_up, grad.data(), emb.numel()); }, ErrorCode::invalid_argument,
                "bad parameter handle (id 7");
  RemoteParam foreign = emb;
  foreign.check ^= 1;
  check_refused([&] { remote.push(context, foreign, grad.data(), emb.numel()); }, ErrorCode::invalid_argument,
                "bad parameter handle");
  check_refused([&] { remote.push(context, emb, grad.data(), emb.numel() - 1); }, ErrorCode::invalid_argument,
                "'emb' has 48 elements (12 rows of 4), the gradient 47");
  const std::vector<int64_t> rows = {3, 12};
  check_refused([&] { remote.push_rows(context, emb, rows.data(), 2, grad.data()); }, ErrorCode::invalid_argument,
                "row 12 (index 1) is out of range for 'emb', which has 12 rows");
  const std::vector<int64_t> negative = {-1};
  check_refused([&] { remote.push_rows(context, emb, negative.data(), 1, grad.data()); }, ErrorCode::invalid_argument,
                "row -1 (index 0) is out of range");
  check_refused([&] { remote.push(context + 100, emb, grad.data(), emb.numel()); }, ErrorCode::invalid_argument,
                "context " + std::to_string(context + 100) + " was never opened");
  check_refused([&] { remote.step(context + 100); }, ErrorCode::invalid_argument, "was never opened");
  check_refused([&] { remote.lookup("nope"); }, ErrorCode::invalid_argument, "no owner registered a parameter named 'nope'");
  std::vector<float> out(static_cast<std::size_t>(emb.numel()));
  check_refused([&] { remote.pull(emb, out.data(), 3); }, ErrorCode::invalid_argument, "the output 3");
  check_refused([&] { remote.pull_rows(emb, rows.data(), 2, out.data()); }, ErrorCode::invalid_argument,
                "row 12 (index 1) is out of range");
  const RemoteContext second = remote.open_context();
  check_refused([&] { remote.open_context(); }, ErrorCode::invalid_argument, "2 contexts are open already");
  comm->barrier();  // every rank's refused calls are behind it
  CHECK(bitwise_equal(pull_all(remote, "emb"), before));

  // The context's refused pushes left it empty: its step applies nothing; a second is refused.
  remote.step(context);
  remote.step(second);
  check_refused([&] { remote.step(context); }, ErrorCode::invalid_argument,
                "context " + std::to_string(context) + " was stepped already");
  check_refused([&] { remote.push(context, emb, grad.data(), emb.numel()); }, ErrorCode::invalid_argument,
                "was stepped already");
  comm->barrier();
  CHECK(bitwise_equal(pull_all(remote, "emb"), before));
  comm->barrier();  // every rank has read it before any rank's next step changes it

  // A valid push and step after all that is applied.
  const RemoteContext third = remote.open_context();
  remote.push(third, emb, grad.data(), emb.numel());
  remote.step(third);
  comm->barrier();
  CHECK_FALSE(bitwise_equal(pull_all(remote, "emb"), before));
  remote.close();
  if (rank == 0) CHECK(remote.stats().contexts_failed == 0);
}

TEST_CASE("remote construction: a bad spec or option on one rank fails on every rank", "[remote]") {
  auto& comm = world();
  const int rank = comm->rank();
  const int last = comm->size() - 1;
  const std::vector<RemoteModelParam> model = remote_model({0});
  SECTION("invalid option on the last rank") {
    RemoteOptions options;
    if (rank == last) options.timeout_seconds = -1;
    check_refused([&] { RemoteOptimizer remote(comm, owned_groups(model, rank), options); },
                  ErrorCode::invalid_argument, "RemoteOptions.timeout_seconds is -1");
  }
  SECTION("rows past the end on the last rank") {
    std::vector<RemoteGroupSpec> groups = owned_groups(model, rank);
    if (rank == last) {
      RemoteGroupSpec g;
      g.params.push_back({"extra", 4, 2, 2, 5, nullptr});
      groups.push_back(g);
    }
    check_refused([&] { RemoteOptimizer remote(comm, groups, {}); }, ErrorCode::invalid_argument,
                  "'extra': rows [2, 5) are not a non-empty range within its 4 rows");
  }
  SECTION("rows nobody owns") {
    std::vector<RemoteGroupSpec> groups = owned_groups(model, rank);
    if (rank == last) {
      RemoteGroupSpec g;
      g.params.push_back({"half", 4, 2, 0, 2, nullptr});
      groups.push_back(g);
    }
    check_refused([&] { RemoteOptimizer remote(comm, groups, {}); }, ErrorCode::invalid_argument,
                  "'half': rows [2, 4) are owned by nobody");
  }
  if (comm->size() > 1) {
    SECTION("owners that disagree on a parameter's shape") {
      std::vector<RemoteGroupSpec> groups = owned_groups(model, rank);
      RemoteGroupSpec g;
      g.params.push_back({"split", 4, rank == 1 ? 3 : 2, rank == 1 ? 2 : 0, rank == 1 ? 4 : 2, nullptr});
      if (rank <= 1) groups.push_back(g);
      check_refused([&] { RemoteOptimizer remote(comm, groups, {}); }, ErrorCode::mismatch,
                    "the owners of parameter 'split' disagree: rank 0 has rows 4 row_size 2");
    }
    SECTION("options that differ between ranks") {
      RemoteOptions options;
      if (rank == last) options.order = RemoteOrder::deterministic;
      check_refused([&] { RemoteOptimizer remote(comm, owned_groups(model, rank), options); }, ErrorCode::mismatch,
                    "RemoteOptions.order");
    }
    SECTION("a rank owning rows another owns too") {
      std::vector<RemoteGroupSpec> groups = owned_groups(model, rank);
      if (rank == last) groups.push_back(owned_groups(model, 0).front());
      check_refused([&] { RemoteOptimizer remote(comm, groups, {}); }, ErrorCode::invalid_argument,
                    "'emb': rows owned twice");
    }
  }
}
