// src/optim/host_staging.hpp — transitional: the adapter moved to comm/host_staging.hpp; this keeps the optimizer's old include and name until it uses the new ones.
#pragma once

#include "comm/host_staging.hpp"

namespace shardopt {
namespace optim {

using comm::HostStagedCommunicator;

}  // namespace optim
}  // namespace shardopt
