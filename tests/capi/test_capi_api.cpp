// tests/capi/test_capi_api.cpp — the C ABI's statuses, messages and handles: status names, version, NULL pointers, unknown struct sizes, bad handles, and C++ errors arriving as statuses.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "capi_test_support.hpp"
#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"
#include "capi_api_support.hpp"

using shardopt_capi_test::CommHandle;
using shardopt_capi_test::FakeTensor;
using shardopt_capi_test::last_error;
using namespace shardopt_capi_api_test;

TEST_CASE("status names, version and the thread-local last error", "[capi][errors]") {
  CHECK(std::string(shardopt_status_name(SHARDOPT_ERR_STRUCT_SIZE)) == "SHARDOPT_ERR_STRUCT_SIZE");
  CHECK(std::string(shardopt_status_name(SHARDOPT_ERR_OUT_OF_MEMORY)) == "SHARDOPT_ERR_OUT_OF_MEMORY");
  CHECK(std::string(shardopt_status_name(SHARDOPT_OK)) == "SHARDOPT_OK");
  CHECK(std::string(shardopt_status_name(static_cast<shardopt_status>(1234))) == "SHARDOPT_ERR_UNKNOWN");
  CHECK(std::string(shardopt_version()) == shardopt::version());

  const std::string step_on_null =
      "shardopt_optimizer_step: opt is NULL; shardopt_optimizer_create leaves its output NULL when it fails";
  CHECK(shardopt_optimizer_step(nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == step_on_null);
  // Another thread's failure is its own.
  std::string seen_there;
  std::thread other([&] {
    seen_there = shardopt_last_error();
    int rank = 0;
    shardopt_comm_rank(nullptr, &rank);
    seen_there += "|" + last_error();
  });
  other.join();
  CHECK(seen_there == "|shardopt_comm_rank: comm is NULL; shardopt_comm_split gives a NULL handle on ranks that "
                      "passed a negative colour (they join no communicator)");
  CHECK(last_error() == step_on_null);
  // A successful call clears it.
  CHECK(std::string(shardopt_version()).size() > 0);
  CommHandle comm;
  int size = 0;
  REQUIRE(shardopt_comm_size(comm.get(), &size) == SHARDOPT_OK);
  CHECK(last_error().empty());
}

TEST_CASE("NULL pointers give SHARDOPT_ERR_NULL_POINTER naming the argument", "[capi][errors]") {
  CommHandle comm;
  RawModel model({5}, false);
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);

  CHECK(shardopt_comm_rank(comm.get(), nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_comm_rank: out is NULL");
  CHECK(shardopt_comm_world(nullptr, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(shardopt_comm_borrow(nullptr, nullptr, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  shardopt_comm_t borrowed = nullptr;
  CHECK(shardopt_comm_borrow(nullptr, nullptr, &borrowed) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_comm_borrow: mpi_comm is NULL");
  CHECK(shardopt_optimizer_find_param(opt, nullptr, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_find_param: name is NULL");
  CHECK(shardopt_optimizer_param_view(opt, 0, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(shardopt_optimizer_get_hyperparams(opt, 0, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(shardopt_optimizer_save(opt, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_save: dir is NULL");
  CHECK(shardopt_optimizer_save_async(opt, nullptr) == SHARDOPT_ERR_NULL_POINTER);
  CHECK(last_error() == "shardopt_optimizer_save_async: dir is NULL");
  // Destroying NULL is a no-op, as free(NULL).
  CHECK(shardopt_optimizer_destroy(nullptr) == SHARDOPT_OK);
  CHECK(shardopt_comm_destroy(nullptr) == SHARDOPT_OK);

  SECTION("a NULL name or params array inside the descriptors") {
    shardopt_param_desc unnamed = model.descs[0];
    unnamed.name = nullptr;
    shardopt_param_group_desc g = model.group();
    g.params = &unnamed;
    shardopt_optimizer_t other = nullptr;
    CHECK(shardopt_optimizer_create(comm.get(), nullptr, &g, 1, &other) == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == "shardopt_optimizer_create: groups[0].params[0].name is NULL");
    g.params = nullptr;
    CHECK(shardopt_optimizer_create(comm.get(), nullptr, &g, 1, &other) == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == "shardopt_optimizer_create: groups[0].params is NULL but num_params is 1");
    CHECK(shardopt_optimizer_create(comm.get(), nullptr, nullptr, 1, &other) == SHARDOPT_ERR_NULL_POINTER);
    CHECK(last_error() == "shardopt_optimizer_create: groups is NULL");
    CHECK(other == nullptr);
  }
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("a struct_size this library does not know gives SHARDOPT_ERR_STRUCT_SIZE", "[capi][errors]") {
  CommHandle comm;
  RawModel model({5, 3}, false);
  shardopt_optimizer_t opt = nullptr;

  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  const shardopt_param_group_desc group = model.group();
  config.struct_size = 16;  // smaller than any header ever declared it (earlier sizes: test_capi_struct_sizes.cpp)
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "config->struct_size is 16"));
  CHECK(contains(last_error(), "too small"));
  CHECK(contains(last_error(), "sizeof(shardopt_optimizer_config)"));
  config.struct_size = sizeof(config) + 16;  // a newer, larger one
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "larger than any version it knows"));
  config.struct_size = 0;  // forgot to initialise
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(opt == nullptr);

  model.descs[1].struct_size = 4;
  const shardopt_param_group_desc broken = model.group();
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, &broken, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "groups[0].params[1]->struct_size is 4"));
  model.descs[1].struct_size = sizeof(shardopt_param_desc);

  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  hyper.struct_size = 1;
  const shardopt_param_group_desc with_hyper = model.group(&hyper);
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, &with_hyper, 1, &opt) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "groups[0].hyperparams->struct_size is 1"));

  shardopt_comm_options options;
  shardopt_comm_options_init(&options);
  options.struct_size = 3;
  shardopt_comm_t other = nullptr;
  CHECK(shardopt_comm_world(&options, &other) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(other == nullptr);

  REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);
  shardopt_memory_report report{};
  report.struct_size = sizeof(report) * 2;
  CHECK(shardopt_optimizer_memory_report(opt, &report) == SHARDOPT_ERR_STRUCT_SIZE);
  shardopt_hyperparams out{};
  CHECK(shardopt_optimizer_get_hyperparams(opt, 0, &out) == SHARDOPT_ERR_STRUCT_SIZE);
  CHECK(contains(last_error(), "out->struct_size is 0"));
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}

TEST_CASE("destroyed, foreign and wrong-kind handles give SHARDOPT_ERR_BAD_HANDLE", "[capi][errors]") {
  CommHandle comm;
  RawModel model({5}, false);
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);

  CHECK(shardopt_optimizer_step(opt) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(contains(last_error(), "shardopt_optimizer_step: opt ("));
  CHECK(contains(last_error(), "is not a live shardopt_optimizer_t: it was destroyed, or never created"));
  CHECK(shardopt_optimizer_destroy(opt) == SHARDOPT_ERR_BAD_HANDLE);  // double destroy

  // Pointers that were never handles are refused without being read.
  float not_a_handle[16] = {};
  CHECK(shardopt_optimizer_zero_grad(reinterpret_cast<shardopt_optimizer_t>(not_a_handle)) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(shardopt_comm_barrier(reinterpret_cast<shardopt_comm_t>(uintptr_t{0x10})) == SHARDOPT_ERR_BAD_HANDLE);
  // A communicator where an optimizer belongs, and the other way round.
  CHECK(shardopt_optimizer_step(reinterpret_cast<shardopt_optimizer_t>(comm.get())) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(contains(last_error(), "opt is a shardopt_comm_t, not a shardopt_optimizer_t"));

  shardopt_comm_t gone = nullptr;
  REQUIRE(shardopt_comm_world(nullptr, &gone) == SHARDOPT_OK);
  REQUIRE(shardopt_comm_destroy(gone) == SHARDOPT_OK);
  int rank = -1;
  CHECK(shardopt_comm_rank(gone, &rank) == SHARDOPT_ERR_BAD_HANDLE);
  shardopt_optimizer_t never = nullptr;
  CHECK(shardopt_optimizer_create(gone, nullptr, &group, 1, &never) == SHARDOPT_ERR_BAD_HANDLE);
  CHECK(never == nullptr);
}

TEST_CASE("errors from the C++ core arrive as their statuses, and a refused value changes nothing", "[capi][errors]") {
  CommHandle comm;
  RawModel model({5, 3}, false);
  const shardopt_param_group_desc group = model.group();
  shardopt_optimizer_t opt = nullptr;
  REQUIRE(shardopt_optimizer_create(comm.get(), nullptr, &group, 1, &opt) == SHARDOPT_OK);

  int32_t id = -1;
  CHECK(shardopt_optimizer_find_param(opt, "p1", &id) == SHARDOPT_OK);
  CHECK(id == 1);
  CHECK(shardopt_optimizer_find_param(opt, "nope", &id) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(last_error() == "shardopt_optimizer_find_param: no parameter named 'nope' is registered");
  shardopt_tensor view{};
  CHECK(shardopt_optimizer_param_view(opt, 7, &view) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "parameter id 7 is out of range"));
  shardopt_hyperparams hyper;
  shardopt_hyperparams_init(&hyper);
  CHECK(shardopt_optimizer_get_hyperparams(opt, 3, &hyper) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "param group 3 does not exist"));

  REQUIRE(shardopt_optimizer_get_hyperparams(opt, 0, &hyper) == SHARDOPT_OK);
  CHECK(hyper.lr == 1e-3);
  hyper.lr = -1.0;
  CHECK(shardopt_optimizer_set_hyperparams(opt, 0, &hyper) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "lr"));
  shardopt_hyperparams_init(&hyper);
  hyper.lr = 0.5;  // overwritten below: the refused set must not have stuck
  REQUIRE(shardopt_optimizer_get_hyperparams(opt, 0, &hyper) == SHARDOPT_OK);
  CHECK(hyper.lr == 1e-3);

  shardopt_optimizer_config config;
  shardopt_optimizer_config_init(&config);
  config.algorithm = static_cast<shardopt_algorithm>(9);
  shardopt_optimizer_t other = nullptr;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &other) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "config->algorithm is 9"));
  shardopt_optimizer_config_init(&config);
  config.bucket_bytes = 0;
  CHECK(shardopt_optimizer_create(comm.get(), &config, &group, 1, &other) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "bucket_bytes must be positive"));
  // f16 and f32 parameters are each valid, but not in one optimizer (one flat buffer, one dtype).
  RawModel mixed({4, 4}, false);
  mixed.descs[1].param.dtype = SHARDOPT_DTYPE_F16;
  const shardopt_param_group_desc mixed_group = mixed.group();
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, &mixed_group, 1, &other) == SHARDOPT_ERR_UNSUPPORTED);
  CHECK(contains(last_error(), "parameter 'p1'"));
  // A dtype that is no shardopt_dtype at all is a bad argument.
  mixed.descs[1].param.dtype = static_cast<shardopt_dtype>(7);
  const shardopt_param_group_desc bad_group = mixed.group();
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, &bad_group, 1, &other) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "dtype 7 is not a shardopt_dtype (0..2)"));
  // Raw bytes move through collectives only, never as a parameter.
  mixed.descs[1].param.dtype = SHARDOPT_DTYPE_BYTE;
  const shardopt_param_group_desc byte_group = mixed.group();
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, &byte_group, 1, &other) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(contains(last_error(), "dtype 3 (SHARDOPT_DTYPE_BYTE) is for collectives"));
  // Registering nothing is refused by the optimizer itself.
  CHECK(shardopt_optimizer_create(comm.get(), nullptr, nullptr, 0, &other) == SHARDOPT_ERR_INVALID_ARGUMENT);
  CHECK(other == nullptr);
  REQUIRE(shardopt_optimizer_destroy(opt) == SHARDOPT_OK);
}
