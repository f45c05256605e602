/*
 * ProcessGroupChorus.hpp - torch.distributed backend "chorus": a
 * c10d::ProcessGroup (torch 1.13) over libchorus's nonblocking C API.
 *
 * Glue only: each torch call checks its tensors, maps them (dtype, op,
 * root, a contiguous stand-in where the tensor is not) onto one or a few
 * chorus_i* calls, and returns a WorkChorus holding their requests. The
 * operation runs in Chorus's progress thread. Nothing here communicates.
 *
 * Who completes a Work (runs its copy-out, marks it and its future):
 *   - a thread in Work::wait() drives the communicator itself
 *     (chorus_wait_for, no hand-off between threads on the latency path);
 *   - isCompleted() looks (chorus_test);
 *   - a Work whose future was asked for (DDP's buckets, comm hooks) is
 *     completed by the group's completion thread, which sleeps in
 *     chorus_comm_wait_any while such a Work is pending, and else on cv.
 * Whichever comes first; the others see it finished. Every chorus call on
 * the communicator, posting and releasing alike, is made under Core::mu:
 * the C API allows one application thread at a time on a communicator,
 * except chorus_wait_for and chorus_comm_wait_any, made outside it.
 */
#pragma once

#include <chorus.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace chorus_torch {

class WorkChorus;
using WorkPtr = c10::intrusive_ptr<WorkChorus>;
using Requests = std::vector<chorus_request_t *>;

/* The communicator and what completes its Works; shared by the process
 * group, its Works and its completion threads, so a Work outliving its
 * group stays safe. */
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(chorus_comm_t *comm, int rank, int size);
  ~Core();

  /* Posts through `post` (chorus_i* calls appending their requests) under
   * mu and queues w. A post that fails with nothing posted throws; one
   * that fails after posting some leaves w to fail once those finish. */
  void launch(const WorkPtr &w, const std::function<chorus_result(Requests &)> &post);
  /* Work::wait's driving part: until w finished or the deadline. */
  void drive(WorkChorus *w, std::chrono::steady_clock::time_point deadline, bool forever);
  /* Completes w if its requests finished (isCompleted). */
  void poll(WorkChorus *w);
  /* w's future is wanted: the completion threads watch w. */
  void watch(WorkChorus *w);
  /* Completes every pending Work, stops the completion threads and
   * destroys the communicator (collective, as chorus_comm_destroy).
   * Idempotent. Called on a completion thread (a future's callback
   * dropped the group), it hands that over to a thread of its own. */
  void shutdown();

  chorus_comm_t *comm() const {
    return comm_;
  }
  int rank() const {
    return rank_;
  }
  int size() const {
    return size_;
  }

 private:
  /* chorus_test on w's unreleased requests (mu held, no user inside
   * chorus_wait_for on them); true when all finished. */
  bool testLocked(WorkChorus *w);
  /* Takes w (requests all released, nobody inside) off the pending list;
   * the caller completes it outside mu, then calls finished(). */
  WorkPtr take(WorkChorus *w);
  void finished(size_t n);
  /* take + complete + finished, mu dropped meanwhile */
  void finish(std::unique_lock<std::mutex> &lk, WorkChorus *w);
  /* Takes the pending Works (all, or only the watched ones) whose
   * requests finished. */
  std::vector<WorkPtr> collect(bool watched_only);
  /* mu held: some thread leads (watches the communicator) whenever a
   * watched Work is pending, or any Work at shutdown. */
  void ensureLeader();
  void threadLoop();

  chorus_comm_t *comm_;
  const int rank_, size_;
  std::mutex mu_;                /* every chorus call on comm_ but the two waits */
  std::condition_variable cv_;   /* spare completion threads: lead, or exit */
  std::condition_variable idle_; /* shutdown: the last Work completed, the threads left */
  std::list<WorkPtr> pending_;   /* posted, not completed, in posting order */
  size_t watched_ = 0;           /* pending Works whose future was asked for */
  size_t unwatched_ = 0;         /* the others (swept now and then by launch) */
  int finishing_ = 0;            /* Works off the list, being completed outside mu */
  bool leader_ = false;          /* a completion thread watches the communicator */
  int spares_ = 0;               /* completion threads waiting on cv_ */
  int alive_ = 0;                /* completion threads not yet returned */
  std::vector<std::thread> threads_;
  bool stop_ = false;            /* shutdown began: complete everything, then exit */
  bool down_ = false;            /* the communicator is destroyed */
};

/* One torch call: the requests it posted and what to do when they finish. */
class WorkChorus : public c10d::Work {
 public:
  WorkChorus(std::shared_ptr<Core> core, c10d::OpType type, const char *name,
             std::vector<at::Tensor> outputs);
  ~WorkChorus() override;

  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;

  /* tensors the requests read or write, kept alive until they finish */
  void keep(const at::Tensor &t) {
    keep_.push_back(t);
  }
  /* runs once the requests succeeded: copies results out of stand-ins */
  void onSuccess(std::function<void()> fn) {
    unpack_.push_back(std::move(fn));
  }
  const char *name() const {
    return name_;
  }

 private:
  friend class Core;
  /* Marks the Work and its future (outside Core::mu). */
  void complete();
  void markFuture(const c10::intrusive_ptr<c10::ivalue::Future> &fut, const std::exception_ptr &ex);

  std::shared_ptr<Core> core_;
  const char *name_; /* "allreduce", ... for messages */
  /* under Core::mu */
  Requests reqs_;                        /* posted, not yet released */
  int users_ = 0;                        /* threads inside chorus_wait_for on reqs_ */
  bool pending_ = false;                 /* on Core::pending_ */
  bool watched_ = false;                 /* its future was asked for */
  std::list<WorkPtr>::iterator it_;      /* its place on Core::pending_ */
  chorus_result rc_ = CHORUS_SUCCESS;    /* the first failure */
  std::string err_;                      /* its text */
  /* set before launch, used once finished */
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::vector<std::function<void()>> unpack_;
  c10::intrusive_ptr<c10::ivalue::Future> future_; /* under mutex_, made by getFuture */
};

class ProcessGroupChorus : public c10d::ProcessGroup {
 public:
  /* Rendezvous through store (rank 0's chorus unique id), then a
   * communicator whose CHORUS_TIMEOUT is timeout. Collective. */
  ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                     std::chrono::milliseconds timeout);
  ~ProcessGroupChorus() override;

  const std::string getBackendName() const override {
    return "chorus";
  }
  /* the transport ("shm", "shm+sock", ...) */
  std::string provider() const;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  allreduce_coalesced(std::vector<at::Tensor> &tensors,
                      const c10d::AllreduceCoalescedOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                        const c10d::ReduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs,
                                        const c10d::GatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work>
  _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                       const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &outputSplits,
                                               std::vector<int64_t> &inputSplits,
                                               const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors,
                                               int tag) override;

 private:
  WorkPtr makeWork(c10d::OpType type, const char *name, std::vector<at::Tensor> outputs);

  std::shared_ptr<Core> core_;
};

} // namespace chorus_torch
