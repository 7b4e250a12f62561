// src/checkpoint/async_save.hpp — a save whose shard file a background thread writes while training goes on; the agreement and the manifest come at wait_save.
//
// One background save (ZeroOptimizer::save_async, then wait_save):
// 1. save_async, calling thread, collective: start_save (save_phases.hpp) checks, makes the
//    directory, agrees on the save's identity and captures what later calls may change and the
//    checkpoint records: the manifest (steps, hyperparameters, loss scale, trainable flags,
//    layout) and the list of live buffers the file's bytes come from. Nothing large is copied.
// 2. The writer thread writes this rank's shard file (temporary name, fsync, rename) straight
//    from those buffers. It never calls the communicator (MPI runs FUNNELED: one thread calls
//    MPI) and never touches the optimizer's objects, only the captured pointers.
// 3. Every call that changes what the writer reads (step, load, load_state_dict, set_trainable,
//    add_param_group, the model averagers' average_parameters) first calls wait_for_sources(),
//    before its own agreement, so once any rank is past that agreement every rank's writer has
//    finished reading. It returns when the writer has handed every byte to the kernel (write()
//    returned), not when the file is durable: the fsync and rename go on while steps run.
// 4. wait_save(), and save(), save_async() and load(), which complete a pending save first:
//    calling thread, collective. Joins the writer, then finish_save: the ranks agree on their
//    files (a failure on any rank raises on every rank, with save()'s messages), prove the
//    checkpoint together, and rank 0 commits manifest.json. A save is committed nowhere else: until then the
//    previous checkpoint is the one a load finds.
//
// The bound: the writer keeps no copy of the state; bf16/f16 values pass through one widening
// chunk (4 MiB). The snapshot is staged in the kernel's page cache, which a blocking save fills
// just as much. So a step after save_async waits at most for the rest of this rank's file to be
// handed to the kernel (memory speed below the dirty-page limit, disk speed above it), never for
// the fsync, the proof or the manifest; wait_save costs the proof (each rank reads back its own
// file, as save does) and the manifest commit.
//
// Crash safety is save()'s: a shard file gets its final name only complete and fsynced, and no
// manifest names it before rank 0's rename inside wait_save, so a kill at any point leaves the
// previous checkpoint untouched. Destroying the optimizer with a save pending joins the writer
// and abandons the save: this rank's new file is removed and no manifest is written.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include "checkpoint/save_phases.hpp"

namespace shardopt {
namespace checkpoint {

class AsyncSave {
 public:
  AsyncSave() = default;
  ~AsyncSave();  // abandons a pending save
  AsyncSave(const AsyncSave&) = delete;
  AsyncSave& operator=(const AsyncSave&) = delete;

  // Whether a save was started and not yet finished or abandoned (the same on every rank:
  // start and finish are collective).
  bool pending() const { return pending_; }
  // Starts writing `ticket`'s file in the background. Requires !pending().
  void start(SaveTicket ticket);
  // Local: returns once the writer no longer reads the optimizer's buffers (at once when no
  // save is pending). The seconds it waited, for callers that report them.
  double wait_for_sources();
  // Collective: joins the writer and commits the save (finish_save), raising its failure on
  // every rank. No longer pending afterwards, whether it succeeded or not.
  void finish(Communicator& comm);

 private:
  void write();
  void abandon() noexcept;

  bool pending_ = false;
  SaveTicket ticket_;
  std::thread writer_;
  std::mutex mutex_;
  std::condition_variable sources_read_signal_;
  bool sources_read_ = false;  // guarded by mutex_
  Outcome written_;            // the writer's result; read after the join
};

}  // namespace checkpoint
}  // namespace shardopt
