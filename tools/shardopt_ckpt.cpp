// tools/shardopt_ckpt.cpp — shardopt-ckpt: info, verify, upgrade, export and reshard of sharded checkpoints, offline.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shardopt/checkpoint.hpp"
#include "shardopt/error.hpp"

namespace {

constexpr const char* kUsage =
    "usage: shardopt-ckpt info DIR\n"
    "       shardopt-ckpt verify DIR\n"
    "       shardopt-ckpt upgrade DIR      (a format-version-1 checkpoint, checked, to the current version)\n"
    "       shardopt-ckpt export DIR OUT.safetensors\n"
    "       shardopt-ckpt reshard DIR OUT_DIR --world N [--partition flat|sorted_greedy]\n";

int usage() {
  std::fputs(kUsage, stderr);
  return 2;
}

// A one-line bar on stderr, redrawn in place; nothing when stderr is not a terminal (logs, CI).
shardopt::CheckpointProgress progress_bar() {
  if (!isatty(STDERR_FILENO)) return {};
  return [](const char* stage, int64_t done, int64_t total) {
    constexpr int kWidth = 40;
    const double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int filled = static_cast<int>(fraction * kWidth);
    std::fprintf(stderr, "\r%-8s [%-*s] %5.1f%%", stage, kWidth, std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 100.0 * fraction);
    if (done >= total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

void print_info(const std::string& dir) {
  const shardopt::CheckpointInfo info = shardopt::read_checkpoint_info(dir);
  std::string kinds;
  for (const std::string& k : info.state_kinds) kinds += (kinds.empty() ? "" : ", ") + k;
  std::printf("checkpoint      %s\n", dir.c_str());
  std::printf("format version  %d\n", info.format_version);
  std::printf("save id         %s\n", info.save_id.c_str());
  std::printf("world size      %d (%d shard files, partition %s)\n", info.world_size, info.num_files,
              info.partition.c_str());
  std::printf("algorithm       %s (state: %s)\n", shardopt::algorithm_name(info.algorithm),
              kinds.empty() ? "none" : kinds.c_str());
  std::printf("params          %d in %d groups, %lld elements (%lld trainable)\n", info.num_params, info.num_groups,
              static_cast<long long>(info.numel), static_cast<long long>(info.trainable_numel));
  if (info.min_step == info.max_step) {
    std::printf("step            %lld\n", static_cast<long long>(info.max_step));
  } else {
    std::printf("step            %lld..%lld\n", static_cast<long long>(info.min_step),
                static_cast<long long>(info.max_step));
  }
  std::printf("bytes           %lld (%.1f MiB)\n", static_cast<long long>(info.file_bytes),
              static_cast<double>(info.file_bytes) / (1 << 20));
}

int run(const std::vector<std::string>& args) {
  if (args.empty()) return usage();
  const std::string& command = args[0];
  if (command == "info" && args.size() == 2) {
    print_info(args[1]);
    return 0;
  }
  if (command == "verify" && args.size() == 2) {
    shardopt::verify_checkpoint(args[1], progress_bar());
    std::printf("%s: OK\n", args[1].c_str());
    return 0;
  }
  if (command == "upgrade" && args.size() == 2) {
    const bool rewritten = shardopt::upgrade_checkpoint(args[1], progress_bar());
    std::printf(rewritten ? "%s: upgraded to the current format version\n" : "%s: already current, OK\n",
                args[1].c_str());
    return 0;
  }
  if (command == "export" && args.size() == 3) {
    shardopt::export_checkpoint(args[1], args[2], progress_bar());
    std::printf("wrote %s\n", args[2].c_str());
    return 0;
  }
  if (command == "reshard" && args.size() >= 5) {
    shardopt::ReshardOptions options;
    options.world_size = 0;
    for (std::size_t i = 3; i < args.size(); ++i) {
      if (args[i] == "--world" && i + 1 < args.size()) {
        char* end = nullptr;
        const long n = std::strtol(args[++i].c_str(), &end, 10);
        if (end == nullptr || *end != '\0' || n < 1 || n > 1 << 20) {
          std::fprintf(stderr, "shardopt-ckpt: --world needs a positive integer, got '%s'\n", args[i].c_str());
          return 2;
        }
        options.world_size = static_cast<int>(n);
      } else if (args[i] == "--partition" && i + 1 < args.size()) {
        const std::string p = args[++i];
        if (p == "flat") options.partition = shardopt::PartitionStrategy::flat;
        else if (p == "sorted_greedy") options.partition = shardopt::PartitionStrategy::sorted_greedy;
        else return usage();
      } else {
        return usage();
      }
    }
    if (options.world_size == 0) return usage();
    shardopt::reshard_checkpoint(args[1], args[2], options, progress_bar());
    std::printf("wrote %s for %d ranks\n", args[2].c_str(), options.world_size);
    return 0;
  }
  return usage();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const shardopt::Error& e) {
    std::fprintf(stderr, "shardopt-ckpt: %s error: %s\n", shardopt::error_code_name(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardopt-ckpt: %s\n", e.what());
    return 1;
  }
}
