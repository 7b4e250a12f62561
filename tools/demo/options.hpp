// tools/demo/options.hpp — shardopt-demo's command line: the options, their defaults and the parser.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace shardopt_demo {

// The --help text (rank 0 prints it).
extern const char* const usage_text;

enum class RunModes { both, sharded, replicated };

// --local-sgd period=P,warmup=W[,hier=P1:G1:P2:G2...][,outer=LR:MOMENTUM][,replica=N]: an
// extra run with PostLocalSGDOptimizer (see shardopt_demo.cpp).
struct LocalSgdOptions {
  bool enabled = false;
  std::string spec;       // as given, for the output line
  int64_t period = 0;     // 0: not given (then hier= must be)
  int64_t warmup = 0;
  // Non-empty: torch's HierarchicalModelAverager with these (period, group size) levels.
  std::vector<shardopt::AveragingLevel> levels;
  bool outer = false;
  double outer_lr = 0.0;
  double outer_momentum = 0.0;
  int replica = 1;  // ranks per replica; must divide the world size (checked once it is known)
};

struct Options {
  RunModes modes = RunModes::both;
  shardopt::PartitionStrategy partition = shardopt::PartitionStrategy::flat;
  shardopt::Algorithm algorithm = shardopt::Algorithm::adam;
  shardopt::Storage storage = shardopt::Storage::bucket_view;
  shardopt::DType dtype = shardopt::DType::f32;
  shardopt::MasterStorage master = shardopt::MasterStorage::fp32;          // bf16: or remainder16
  shardopt::StatePrecision state_precision = shardopt::StatePrecision::fp32;  // or q8
  int stage = 1;       // of the sharded run; the replicated run is always stage 1
  double clip = 0.0;   // max total gradient norm; 0: no clipping
  double lr = 0.01;
  int layers = 20;
  int width = 2000;
  int batch = 20;
  int steps = 5;
  uint64_t seed = 0;
  int threads = 1;
  bool verbose = false;
  bool check_gradients = false;
  bool uneven = false;  // rank r trains --steps + r batches, then joins (Join)
  // Not off: one more run, the first mode's configuration with this overlap policy, compared
  // with the plain run bit for bit and by the time spent inside shardopt calls.
  shardopt::OverlapPolicy overlap = shardopt::OverlapPolicy::off;
  std::string save_dir;    // empty: no checkpoint written
  std::string resume_dir;  // empty: start from the seeded initial values
  LocalSgdOptions local_sgd;
  bool help = false;
  // Whether the size was given on the command line: --check-gradients picks tiny defaults.
  bool layers_given = false;
  bool width_given = false;
  bool batch_given = false;
};

// A bad command line: reported on rank 0 with the usage text, exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses argv; throws UsageError on a bad command line. --check-gradients picks tiny sizes
// for whatever of --layers/--width/--batch was not given.
Options parse_options(int argc, char** argv);

// The spec of --local-sgd (what follows the option); throws UsageError naming what is wrong.
LocalSgdOptions parse_local_sgd(const std::string& spec);

// The averager --local-sgd asks for.
shardopt::AveragerConfig averager_config(const LocalSgdOptions& local_sgd);

}  // namespace shardopt_demo
