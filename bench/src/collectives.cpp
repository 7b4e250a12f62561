// bench/src/collectives.cpp — times and checks all_gather, broadcast, reduce_scatter and all_reduce over a size sweep (host buffers, or device buffers with --device cuda), and prints nccl-tests' tables.
#include "collectives.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cuda_device.hpp"
#include "support.hpp"

namespace shardopt_bench {
namespace {

struct OpTraits {
  const char* name;
  const char* redop;     // "sum" or "none"
  const char* placement; // printed above the table
  bool rooted;
  bool split_over_ranks;  // count must be a multiple of the world size
};

OpTraits traits(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_gather:
      return {"all_gather", "none",
              "in place, as the optimizer's parameter sync; size = the whole gathered buffer", false, true};
    case CollectiveOp::broadcast:
      return {"broadcast", "none", "in place; size = the broadcast buffer", true, false};
    case CollectiveOp::reduce_scatter:
      return {"reduce_scatter", "sum", "out of place; size = the whole input buffer", false, true};
    case CollectiveOp::all_reduce:
      return {"all_reduce", "sum", "in place; size = the buffer", false, false};
  }
  return {"?", "?", "", false, false};
}

// nccl-tests' bus bandwidth factors: what each rank's link carries relative to algbw for the
// bandwidth-optimal algorithm, so that busbw is comparable across ops and world sizes.
double bus_factor(CollectiveOp op, int world) {
  const double n = world;
  switch (op) {
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter: return (n - 1) / n;
    case CollectiveOp::all_reduce: return 2 * (n - 1) / n;
    case CollectiveOp::broadcast: return 1.0;
  }
  return 1.0;
}

// Small non-negative integers: exact in f32, and so are their sums over up to 2^14 ranks in
// any order, so a reduction's expected value does not depend on the algorithm MPI picked.
// Depending on the iteration makes a collective that left last iteration's data show up.
float pattern(int rank, int64_t index, int iteration) {
  return static_cast<float>((int64_t{rank + 1} * 131 + index * 7 + int64_t{iteration} * 17) % 1021);
}
constexpr float kSentinel = -1.f;  // never a pattern value: marks bytes nobody wrote

float pattern_sum(int world, int64_t index, int iteration) {
  float sum = 0.f;
  for (int r = 0; r < world; ++r) sum += pattern(r, index, iteration);
  return sum;
}

struct SweepRow {
  int64_t bytes = 0;
  int64_t count = 0;
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  int64_t wrong = 0;
};

// `comm_` (MPI) times and checks; `tested_` runs the collectives, on host vectors or, with
// --device cuda, on device buffers that mirror them: filled on the host and uploaded before an
// iteration, downloaded and checked after it, neither of them timed.
class CollectiveBench {
 public:
  CollectiveBench(Communicator& comm, Communicator& tested, const Options& options, CollectiveOp op)
      : comm_(comm), tested_(tested), options_(options), op_(op), world_(comm.size()), rank_(comm.rank()),
        on_device_(options.device == BenchDevice::cuda) {}

  // Elements in the row of `bytes` (rounded down to a multiple of the world for split ops).
  int64_t count_for(int64_t bytes) const {
    int64_t count = bytes / static_cast<int64_t>(sizeof(float));
    if (traits(op_).split_over_ranks) count = count / world_ * world_;
    return count;
  }

  SweepRow run(int64_t count) {
    const int total = options_.warmup + options_.iters;
    allocate(count);
    std::vector<double> seconds;
    int64_t wrong = 0;
    for (int it = 0; it < total; ++it) {
      if (options_.check || it == 0) {
        fill(count, it);
        upload();
      }
      comm_.barrier();
      const auto start = Clock::now();
      issue(count);
      const double elapsed = seconds_since(start);
      if (it < options_.warmup) continue;
      seconds.push_back(elapsed);
      if (options_.check) {
        download();
        wrong += verify(count, it);
      }
    }
    SweepRow row;
    row.count = count;
    row.bytes = count * static_cast<int64_t>(sizeof(float));
    const double t = median(slowest_rank(comm_, seconds));
    row.time_us = t * 1e6;
    row.algbw = t > 0 ? static_cast<double>(row.bytes) / t / 1e9 : 0.0;
    row.busbw = row.algbw * bus_factor(op_, world_);
    row.wrong = options_.check ? sum_int64(comm_, wrong) : -1;
    return row;
  }

 private:
  void allocate(int64_t count) {
    const auto n = static_cast<std::size_t>(count);
    if (op_ == CollectiveOp::reduce_scatter) {
      if (send_.size() < n) send_.resize(n);
      if (recv_.size() < n / static_cast<std::size_t>(world_)) recv_.resize(n / static_cast<std::size_t>(world_));
    } else if (recv_.size() < n) {
      recv_.resize(n);
    }
    if (!on_device_) return;
    const auto bytes = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size() * sizeof(float)); };
    if (!send_device_ || send_device_->bytes() < bytes(send_)) send_device_ = std::make_unique<DeviceBuffer>(bytes(send_));
    if (!recv_device_ || recv_device_->bytes() < bytes(recv_)) recv_device_ = std::make_unique<DeviceBuffer>(bytes(recv_));
  }

  // The buffers the collective runs on: the host vectors or their device mirrors.
  float* send() { return on_device_ ? static_cast<float*>(send_device_->data()) : send_.data(); }
  float* recv() { return on_device_ ? static_cast<float*>(recv_device_->data()) : recv_.data(); }

  void upload() {
    if (!on_device_) return;
    copy_to_device(send(), send_.data(), static_cast<int64_t>(send_.size() * sizeof(float)));
    copy_to_device(recv(), recv_.data(), static_cast<int64_t>(recv_.size() * sizeof(float)));
  }
  void download() {
    if (on_device_) copy_to_host(recv_.data(), recv(), static_cast<int64_t>(recv_.size() * sizeof(float)));
  }

  int64_t block(int64_t count) const { return count / world_; }

  void fill(int64_t count, int it) {
    switch (op_) {
      case CollectiveOp::all_gather: {
        const int64_t c = block(count);
        for (int r = 0; r < world_; ++r) {
          for (int64_t i = 0; i < c; ++i) recv_[static_cast<std::size_t>(r * c + i)] = r == rank_ ? pattern(r, i, it) : kSentinel;
        }
        break;
      }
      case CollectiveOp::broadcast:
        for (int64_t i = 0; i < count; ++i) recv_[static_cast<std::size_t>(i)] = rank_ == options_.root ? pattern(rank_, i, it) : kSentinel;
        break;
      case CollectiveOp::reduce_scatter:
        for (int64_t i = 0; i < count; ++i) send_[static_cast<std::size_t>(i)] = pattern(rank_, i, it);
        for (int64_t i = 0; i < block(count); ++i) recv_[static_cast<std::size_t>(i)] = kSentinel;
        break;
      case CollectiveOp::all_reduce:
        for (int64_t i = 0; i < count; ++i) recv_[static_cast<std::size_t>(i)] = pattern(rank_, i, it);
        break;
    }
  }

  void issue(int64_t count) {
    switch (op_) {
      case CollectiveOp::all_gather: {
        const int64_t c = block(count);
        tested_.all_gather(recv() + rank_ * c, recv(), c, DType::f32);
        break;
      }
      case CollectiveOp::broadcast: tested_.broadcast(recv(), count, DType::f32, options_.root); break;
      case CollectiveOp::reduce_scatter:
        tested_.reduce_scatter(send(), recv(), block(count), DType::f32, ReduceOp::sum);
        break;
      case CollectiveOp::all_reduce: tested_.all_reduce(recv(), count, DType::f32, ReduceOp::sum); break;
    }
  }

  // Elements of this rank's result that differ from what the collective had to produce.
  int64_t verify(int64_t count, int it) const {
    int64_t wrong = 0;
    auto expect = [&](std::size_t at, float expected) { wrong += recv_[at] != expected ? 1 : 0; };
    switch (op_) {
      case CollectiveOp::all_gather: {
        const int64_t c = block(count);
        for (int r = 0; r < world_; ++r) {
          for (int64_t i = 0; i < c; ++i) expect(static_cast<std::size_t>(r * c + i), pattern(r, i, it));
        }
        break;
      }
      case CollectiveOp::broadcast:
        for (int64_t i = 0; i < count; ++i) expect(static_cast<std::size_t>(i), pattern(options_.root, i, it));
        break;
      case CollectiveOp::reduce_scatter: {
        const int64_t c = block(count);
        for (int64_t i = 0; i < c; ++i) expect(static_cast<std::size_t>(i), pattern_sum(world_, rank_ * c + i, it));
        break;
      }
      case CollectiveOp::all_reduce:
        for (int64_t i = 0; i < count; ++i) expect(static_cast<std::size_t>(i), pattern_sum(world_, i, it));
        break;
    }
    return wrong;
  }

  Communicator& comm_;
  Communicator& tested_;
  const Options& options_;
  CollectiveOp op_;
  int world_;
  int rank_;
  bool on_device_;
  std::vector<float> send_;
  std::vector<float> recv_;
  std::unique_ptr<DeviceBuffer> send_device_;  // --device cuda
  std::unique_ptr<DeviceBuffer> recv_device_;
};

}  // namespace

int run_collectives(Communicator& comm, const Options& options) { return run_collectives(comm, comm, options); }

int run_collectives(Communicator& comm, Communicator& tested, const Options& options) {
  if (options.root >= comm.size()) {
    bad_usage(fmt::format("-r {} is not a rank of this {}-rank job", options.root, comm.size()));
  }
  const std::string where = options.device == BenchDevice::cuda ? fmt::format(", buffers on cuda:{}", current_device_info().index) : "";
  say(comm, "# shardopt-bench collectives: world {}, backend {}{}, type float, iters {}, warmup {}, check {}\n",
      comm.size(), tested.backend_name(), where, options.iters, options.warmup, options.check ? 1 : 0);
  say(comm, "# time: median over the iterations of the slowest rank; algbw = size / time; "
            "busbw = algbw x nccl-tests' bus factor\n");
  int64_t wrong_total = 0;
  double busbw_sum = 0;
  int rows = 0;
  for (CollectiveOp op : options.ops) {
    const OpTraits t = traits(op);
    CollectiveBench bench(comm, tested, options, op);
    say(comm, "#\n# {} ({})\n", t.name, t.placement);
    say(comm, "# {:>12} {:>13} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9} {:>7}\n", "size", "count", "type",
        "redop", "root", "time", "algbw", "busbw", "#wrong");
    say(comm, "# {:>12} {:>13} {:>7} {:>6} {:>5} {:>11} {:>9} {:>9} {:>7}\n", "(B)", "(elements)", "", "",
        "", "(us)", "(GB/s)", "(GB/s)", "");
    int64_t previous_count = -1;
    for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
      const int64_t count = bench.count_for(bytes);
      // Sizes that round to the same element count would repeat a row.
      if (count != previous_count) {
        previous_count = count;
        const SweepRow row = bench.run(count);
        const std::string wrong = options.check ? std::to_string(row.wrong) : "N/A";
        say(comm, "  {:>12} {:>13} {:>7} {:>6} {:>5} {:>11.2f} {:>9.3f} {:>9.3f} {:>7}\n", row.bytes,
            row.count, "float", t.redop, t.rooted ? options.root : -1, row.time_us, row.algbw, row.busbw, wrong);
        if (options.check) wrong_total += row.wrong;
        busbw_sum += row.busbw;
        ++rows;
      }
      const int64_t next = options.step_factor > 1.0
                               ? static_cast<int64_t>(std::ceil(static_cast<double>(std::max<int64_t>(bytes, 1)) * options.step_factor))
                               : bytes + options.step_bytes;
      if (next <= bytes) break;
      bytes = next;
    }
  }
  say(comm, "#\n# Wrong values total   : {} {}\n", options.check ? std::to_string(wrong_total) : "N/A",
      wrong_total == 0 ? "OK" : "FAILED");
  say(comm, "# Avg bus bandwidth    : {:.3f} GB/s\n", rows > 0 ? busbw_sum / rows : 0.0);
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace shardopt_bench
