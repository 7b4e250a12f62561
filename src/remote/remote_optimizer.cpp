// src/remote/remote_optimizer.cpp — RemoteOptimizer's facade: the agreed construction (validation, directory, the duplicate communicator), the owner's service thread and the trainer's calls.
#include <mpi.h>

#include <cmath>

#include "comm/agreement.hpp"
#include "comm/mpi/mpi_comm_of.hpp"
#include "comm/mpi/mpi_runtime.hpp"
#include "core/check.hpp"
#include "remote/remote_impl.hpp"
#include "shardopt/remote.hpp"

namespace shardopt {

namespace {

void validate_options(const RemoteOptions& o) {
  SHARDOPT_CHECK(std::isfinite(o.timeout_seconds) && o.timeout_seconds > 0, invalid_argument,
                 "RemoteOptimizer: RemoteOptions.timeout_seconds is {}; give a positive number of seconds",
                 o.timeout_seconds);
  SHARDOPT_CHECK(std::isfinite(o.context_expiry_seconds) && o.context_expiry_seconds > 0, invalid_argument,
                 "RemoteOptimizer: RemoteOptions.context_expiry_seconds is {}; give a positive number of seconds",
                 o.context_expiry_seconds);
  SHARDOPT_CHECK(o.max_open_contexts > 0, invalid_argument,
                 "RemoteOptimizer: RemoteOptions.max_open_contexts is {}; give at least 1", o.max_open_contexts);
  SHARDOPT_CHECK(o.push_log_bytes >= 0, invalid_argument,
                 "RemoteOptimizer: RemoteOptions.push_log_bytes is {}; give 0 (sum each push on arrival) or more",
                 o.push_log_bytes);
  SHARDOPT_CHECK(o.order == RemoteOrder::arrival || o.order == RemoteOrder::deterministic, invalid_argument,
                 "RemoteOptimizer: RemoteOptions.order {} is not a RemoteOrder", static_cast<int>(o.order));
}

void require_mpi(Communicator& comm) {
  SHARDOPT_CHECK(comm::mpi_comm_of(comm) != MPI_COMM_NULL, unsupported,
                 "RemoteOptimizer runs over MPI point-to-point messages; the communicator given is the {} backend's "
                 "(give mpi_world(), remote_mpi_world() or mpi_borrow())",
                 comm.backend_name());
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  SHARDOPT_CHECK(provided == MPI_THREAD_MULTIPLE, unsupported,
                 "RemoteOptimizer: its owners serve requests on a thread of their own beside the caller's MPI calls, "
                 "which needs MPI_THREAD_MULTIPLE, but this process's MPI provides {} (create the communicator with "
                 "remote_mpi_world(), set SHARDOPT_MPI_THREAD_MULTIPLE=1 before shardopt initialises MPI, or "
                 "initialise MPI yourself with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...))",
                 comm::thread_level_name(provided));
}

}  // namespace

RemoteOptimizer::RemoteOptimizer(std::shared_ptr<Communicator> comm, std::vector<RemoteGroupSpec> owned,
                                 RemoteOptions options)
    : impl_(std::make_unique<Impl>()) {
  SHARDOPT_CHECK(comm != nullptr, invalid_argument, "RemoteOptimizer: the communicator is null");
  impl_->comm = comm;
  impl_->options = options;
  std::vector<remote::OwnedEntry> entries;
  std::vector<const float*> initial;
  comm::AgreementRecord record("RemoteOptimizer");
  record.validate([&] {
    require_mpi(*comm);
    validate_options(options);
    for (const RemoteGroupSpec& group : owned) {
      const Hyperparams hyper = group.hyper.resolve(default_hyperparams(group.algorithm));
      for (const RemoteParamSpec& p : group.params) {
        remote::OwnedEntry e;
        e.name = p.name;
        e.rows = p.rows;
        e.row_size = p.row_size;
        e.row_begin = p.row_begin;
        e.row_end = p.row_end < 0 ? p.rows : p.row_end;
        e.algorithm = group.algorithm;
        e.hyper = hyper;
        remote::validate_entry(e);
        entries.push_back(std::move(e));
        initial.push_back(p.initial);
      }
    }
  });
  record.field("RemoteOptions.order", std::to_string(static_cast<int>(options.order)));
  record.field("RemoteOptions.timeout_seconds", fmt::format("{}", options.timeout_seconds));
  record.field("RemoteOptions.context_expiry_seconds", fmt::format("{}", options.context_expiry_seconds));
  record.field("RemoteOptions.max_open_contexts", std::to_string(options.max_open_contexts));
  record.field("RemoteOptions.push_log_bytes", std::to_string(options.push_log_bytes));
  comm::agree(*comm, record);
  // Every rank is here (the agreement passed), so the blocking duplicate cannot hang.
  SHARDOPT_CHECK(MPI_Comm_dup(comm::mpi_comm_of(*comm), &impl_->remote_comm) == MPI_SUCCESS, comm,
                 "RemoteOptimizer: MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(impl_->remote_comm, MPI_ERRORS_RETURN);
  try {
    impl_->directory = remote::Directory::exchange(*comm, entries, options.trainer);
  } catch (...) {
    MPI_Comm_free(&impl_->remote_comm);
    throw;
  }
  if (options.trainer) impl_->trainer = std::make_unique<remote::Trainer>(impl_->remote_comm, impl_->directory, options);
  if (!entries.empty()) {
    impl_->store = std::make_unique<remote::OwnerStore>(impl_->directory, entries, initial, options.cpu_threads);
    impl_->service = std::make_unique<remote::Service>(impl_->remote_comm, impl_->directory, *impl_->store, options);
  }
}

RemoteOptimizer::~RemoteOptimizer() {
  try {
    close();
  } catch (...) {
    // A destructor does not throw: the owner or trainer that failed was named by the calls.
  }
  impl_->service.reset();
  if (impl_->remote_comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->remote_comm);
}

RemoteParam RemoteOptimizer::lookup(const std::string& name) const {
  const int32_t id = impl_->directory.find(name);
  SHARDOPT_CHECK(id >= 0, invalid_argument, "RemoteOptimizer::lookup: no owner registered a parameter named '{}'", name);
  return impl_->directory.handle(id);
}

std::vector<std::string> RemoteOptimizer::param_names() const {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < impl_->directory.size(); ++i) names.push_back(impl_->directory.param(static_cast<int32_t>(i)).name);
  return names;
}

std::vector<std::array<int64_t, 3>> RemoteOptimizer::owners(const RemoteParam& param) const {
  std::vector<std::array<int64_t, 3>> out;
  for (const remote::Slice& s : impl_->directory.checked(param, "owners").slices) out.push_back({s.owner, s.row_begin, s.row_end});
  return out;
}

RemoteContext RemoteOptimizer::open_context() { return impl_->trainer_or_throw("open_context").open_context(); }

void RemoteOptimizer::push(RemoteContext context, const RemoteParam& param, const float* grad, int64_t numel) {
  impl_->trainer_or_throw("push").push(context, param, grad, numel);
}

void RemoteOptimizer::push_rows(RemoteContext context, const RemoteParam& param, const int64_t* rows, int64_t count,
                                const float* values) {
  impl_->trainer_or_throw("push_rows").push_rows(context, param, rows, count, values);
}

void RemoteOptimizer::step(RemoteContext context) { step_async(context).wait(); }

RemoteStepHandle RemoteOptimizer::step_async(RemoteContext context) {
  RemoteStepHandle handle;
  handle.state_ = std::make_unique<RemoteStepHandle::State>();
  handle.state_->exchange = impl_->trainer_or_throw("step").step(context);
  return handle;
}

void RemoteOptimizer::pull(const RemoteParam& param, float* out, int64_t numel) {
  impl_->trainer_or_throw("pull").pull(param, out, numel);
}

void RemoteOptimizer::pull_rows(const RemoteParam& param, const int64_t* rows, int64_t count, float* out) {
  impl_->trainer_or_throw("pull_rows").pull_rows(param, rows, count, out);
}

void RemoteOptimizer::close() {
  if (impl_->closed) return;
  impl_->closed = true;
  if (impl_->trainer) impl_->trainer->finish();
  if (impl_->service) impl_->service->join();
}

RemoteStats RemoteOptimizer::stats() const { return impl_->service ? impl_->service->stats() : RemoteStats{}; }

const RemoteOptions& RemoteOptimizer::options() const { return impl_->options; }

RemoteStepHandle::RemoteStepHandle() = default;
// A step never waited for is waited for here (its errors dropped): its buffers are the caller's.
RemoteStepHandle::~RemoteStepHandle() {
  if (state_ == nullptr || state_->exchange == nullptr) return;
  try {
    state_->exchange->finish();
  } catch (...) {
  }
}
RemoteStepHandle::RemoteStepHandle(RemoteStepHandle&&) noexcept = default;
RemoteStepHandle& RemoteStepHandle::operator=(RemoteStepHandle&&) noexcept = default;

void RemoteStepHandle::wait() {
  SHARDOPT_CHECK(state_ != nullptr && state_->exchange != nullptr, invalid_argument,
                 "RemoteStepHandle::wait: no step in flight (waited already, or a default-constructed handle)");
  std::unique_ptr<remote::Exchange> exchange = std::move(state_->exchange);
  exchange->finish();
}

std::shared_ptr<Communicator> remote_mpi_world(const CommOptions& options) {
  comm::request_thread_multiple();
  return mpi_world(options);
}

}  // namespace shardopt
