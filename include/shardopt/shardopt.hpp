// shardopt/shardopt.hpp — the C++ API in one include.
#pragma once

#include "shardopt/averaging.hpp"
#include "shardopt/checkpoint.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"
#include "shardopt/export.hpp"
#include "shardopt/nccl.hpp"
#include "shardopt/optimizer.hpp"
#include "shardopt/remote.hpp"
#include "shardopt/types.hpp"

namespace shardopt {
SHARDOPT_API const char* version();
}  // namespace shardopt
