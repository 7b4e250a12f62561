// tests/unit/test_hyperparams.cpp — hyperparameter validation names the group and the field.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "optim/hyperparams.hpp"
#include "shardopt/error.hpp"

using shardopt::Algorithm;
using shardopt::Hyperparams;
using shardopt::optim::validate_hyperparams;

namespace {

std::string failure(const Hyperparams& h, Algorithm a, int group = 0) {
  try {
    validate_hyperparams(h, a, group);
  } catch (const shardopt::Error& e) {
    REQUIRE(e.code() == shardopt::ErrorCode::invalid_argument);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("valid defaults pass", "[hyperparams]") {
  for (Algorithm a : {Algorithm::sgd, Algorithm::adam, Algorithm::adamw}) REQUIRE(failure(Hyperparams{}, a).empty());
}

TEST_CASE("NaN, negative and out-of-range values are refused by name", "[hyperparams]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Hyperparams h;
  h.lr = nan;
  REQUIRE(failure(h, Algorithm::adam, 3) == "param group 3: invalid lr nan (must be a finite number >= 0)");
  h = Hyperparams{};
  h.lr = -0.1;
  REQUIRE_THAT(failure(h, Algorithm::sgd), Catch::Contains("invalid lr -0.1"));
  h = Hyperparams{};
  h.beta1 = 1.0;
  REQUIRE_THAT(failure(h, Algorithm::adamw), Catch::Contains("invalid beta1 1 (must be in [0, 1))"));
  h = Hyperparams{};
  h.beta2 = nan;
  REQUIRE_THAT(failure(h, Algorithm::adam), Catch::Contains("invalid beta2 nan"));
  h = Hyperparams{};
  h.eps = -1e-8;
  REQUIRE_THAT(failure(h, Algorithm::adam), Catch::Contains("invalid eps"));
  h = Hyperparams{};
  h.weight_decay = std::numeric_limits<double>::infinity();
  REQUIRE_THAT(failure(h, Algorithm::adam), Catch::Contains("invalid weight_decay inf"));
  h = Hyperparams{};
  h.momentum = -0.5;
  REQUIRE_THAT(failure(h, Algorithm::sgd), Catch::Contains("invalid momentum -0.5"));
}

TEST_CASE("nesterov needs momentum and no dampening, as in torch", "[hyperparams]") {
  Hyperparams h;
  h.nesterov = true;
  REQUIRE_THAT(failure(h, Algorithm::sgd), Catch::Contains("nesterov momentum requires momentum > 0 and dampening == 0"));
  h.momentum = 0.9;
  REQUIRE(failure(h, Algorithm::sgd).empty());
  h.dampening = 0.1;
  REQUIRE_THAT(failure(h, Algorithm::sgd), Catch::Contains("dampening 0.1"));
}
