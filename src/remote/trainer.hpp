// src/remote/trainer.hpp — a trainer's side: gradient contexts, pushes split by owner, steps and pulls waited on with a deadline.
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "remote/directory.hpp"
#include "remote/wire.hpp"

namespace shardopt {
namespace remote {

// Requests sent and the replies expected for one trainer call, waited on together.
struct Exchange {
  std::string call;  // for messages: "step(context 3)"
  double timeout_seconds = 0;
  std::vector<std::unique_ptr<PendingSend>> sends;
  std::vector<int> owners;  // per expected reply
  std::vector<MPI_Request> replies;
  std::vector<std::vector<char>> buffers;

  Exchange() = default;
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;
  // What MPI still holds (a call that failed half way, a handle never waited) is abandoned.
  ~Exchange();
  // Posts the receive of `owner`'s reply to `request_id`, carrying `data_bytes` after its header.
  void expect_reply(int owner, int64_t request_id, std::size_t data_bytes, MPI_Comm comm);
  // Waits for every send and reply; Error(timeout) naming the first owner that did not answer
  // in time, Error(comm) for a failed send, or the first owner's refusal (its code).
  void finish();
  const char* data(std::size_t reply) const { return buffers[reply].data() + sizeof(ReplyHeader); }
};

class Trainer {
 public:
  Trainer(MPI_Comm comm, const Directory& directory, const RemoteOptions& options);

  RemoteContext open_context();
  void push(RemoteContext context, const RemoteParam& param, const float* grad, int64_t numel);
  void push_rows(RemoteContext context, const RemoteParam& param, const int64_t* rows, int64_t count,
                 const float* values);
  std::unique_ptr<Exchange> step(RemoteContext context);
  void pull(const RemoteParam& param, float* out, int64_t numel);
  void pull_rows(const RemoteParam& param, const int64_t* rows, int64_t count, float* out);
  // Tells every owner this trainer is done (its open contexts are dropped there).
  void finish();

 private:
  struct Context {
    std::set<int32_t> touched;
    std::vector<std::unique_ptr<PendingSend>> sends;
    int64_t pushes = 0;
  };
  Context& open(RemoteContext context, const char* call);
  void send(Context& context, std::unique_ptr<PendingSend> send,
            const std::vector<std::pair<const void*, std::size_t>>& spans, int owner, bool pack);
  void forget_completed(Context& context);

  MPI_Comm comm_;
  const Directory& directory_;
  RemoteOptions options_;
  std::mutex mutex_;
  std::map<RemoteContext, Context> open_;
  RemoteContext next_context_ = 0;
  int64_t next_request_ = 0;
  int64_t steps_issued_ = 0;
  bool finished_ = false;
};

}  // namespace remote

struct RemoteStepHandle::State {
  std::unique_ptr<remote::Exchange> exchange;
};

}  // namespace shardopt
