/*
 * ProcessGroupChorus.cpp - the "chorus" backend's glue (see the header).
 *
 * A call's life:
 *
 *   caller thread                      progress thread    completion thread
 *   check tensors, stand-ins
 *   lock mu; chorus_i*(); queue Work
 *   [wait(): chorus_wait_for drives] -> runs the steps   [future wanted:
 *   lock mu; chorus_test releases                          chorus_comm_wait_any,
 *   copy out, mark Work + future                           then the same]
 *
 * Ordering hazards:
 *  - A request is released (chorus_test) only under mu and only while no
 *    thread is inside chorus_wait_for on it (WorkChorus::users_).
 *  - A Work leaves the pending list before it is completed outside mu
 *    (its copy-out and the future's callbacks, which may post new calls:
 *    PowerSGD); shutdown waits for those (finishing_) too.
 *  - The completion thread runs Python callbacks (comm hooks): the group's
 *    destructor drops the GIL before it waits for that thread.
 */
#include "ProcessGroupChorus.hpp"

#include <Python.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace chorus_torch {

namespace {

/* ---- argument checks: each raises a Python exception naming the cause ---- */

[[noreturn]] void bad_value(const std::string &msg) {
  throw c10::ValueError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg);
}
[[noreturn]] void bad_type(const std::string &msg) {
  throw c10::TypeError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg);
}

const char *dtype_name(at::ScalarType t) {
  switch (t) {
  case at::kBool:
    return "torch.bool";
  case at::kChar:
    return "torch.int8";
  case at::kByte:
    return "torch.uint8";
  case at::kShort:
    return "torch.int16";
  case at::kInt:
    return "torch.int32";
  case at::kLong:
    return "torch.int64";
  case at::kHalf:
    return "torch.float16";
  case at::kBFloat16:
    return "torch.bfloat16";
  case at::kFloat:
    return "torch.float32";
  case at::kDouble:
    return "torch.float64";
  case at::kComplexHalf:
    return "torch.complex32";
  case at::kComplexFloat:
    return "torch.complex64";
  case at::kComplexDouble:
    return "torch.complex128";
  default:
    return c10::toString(t);
  }
}

std::string shape_str(const at::Tensor &t) {
  std::ostringstream s;
  s << "[";
  for (int64_t i = 0; i < t.dim(); i++)
    s << (i ? ", " : "") << t.size(i);
  s << "]";
  return s.str();
}

/* A CPU, strided tensor of a dtype Chorus has (bool travels as uint8). */
chorus_dtype check_tensor(const char *op, const at::Tensor &t, const char *what) {
  if (!t.defined())
    bad_value(std::string("chorus ") + op + ": " + what + " is an undefined tensor");
  if (!t.device().is_cpu())
    bad_type(std::string("chorus ") + op + ": " + what + " is on " + t.device().str() +
             "; the chorus backend takes CPU tensors only");
  if (t.layout() != c10::kStrided)
    bad_type(std::string("chorus ") + op + ": " + what +
             " is not a dense (strided) tensor; sparse tensors are not supported");
  switch (t.scalar_type()) {
  case at::kBool:
    return CHORUS_UINT8;
  case at::kChar:
    return CHORUS_INT8;
  case at::kByte:
    return CHORUS_UINT8;
  case at::kInt:
    return CHORUS_INT32;
  case at::kLong:
    return CHORUS_INT64;
  case at::kHalf:
    return CHORUS_FLOAT16;
  case at::kBFloat16:
    return CHORUS_BFLOAT16;
  case at::kFloat:
    return CHORUS_FLOAT32;
  case at::kDouble:
    return CHORUS_FLOAT64;
  default:
    bad_type(std::string("chorus ") + op + ": " + what + " has dtype " +
             dtype_name(t.scalar_type()) +
             ", not supported (supported: torch.int8, torch.uint8, torch.int32, torch.int64, "
             "torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool)");
  }
}

/* Every tensor of a list: the same dtype and shape as ref. */
void check_like(const char *op, const at::Tensor &ref, const char *refwhat, const at::Tensor &t,
                const std::string &what) {
  check_tensor(op, t, what.c_str());
  if (t.scalar_type() != ref.scalar_type())
    bad_type(std::string("chorus ") + op + ": " + what + " has dtype " +
             dtype_name(t.scalar_type()) + " but " + refwhat + " has " +
             dtype_name(ref.scalar_type()) + " (one dtype per call)");
  if (t.sizes() != ref.sizes())
    bad_value(std::string("chorus ") + op + ": " + what + " has shape " + shape_str(t) + " but " +
              refwhat + " has " + shape_str(ref) + " (one shape per call)");
}

chorus_op check_op(const char *op, const c10d::ReduceOp &rop, at::ScalarType t) {
  chorus_op o;
  const char *name;
  switch (rop.op_) {
  case c10d::ReduceOp::SUM:
    o = CHORUS_SUM, name = "SUM";
    break;
  case c10d::ReduceOp::AVG:
    o = CHORUS_AVG, name = "AVG";
    break;
  case c10d::ReduceOp::PRODUCT:
    o = CHORUS_PROD, name = "PRODUCT";
    break;
  case c10d::ReduceOp::MIN:
    o = CHORUS_MIN, name = "MIN";
    break;
  case c10d::ReduceOp::MAX:
    o = CHORUS_MAX, name = "MAX";
    break;
  default: {
    static const char *const names[] = {"SUM",  "AVG", "PRODUCT", "MIN",       "MAX",
                                        "BAND", "BOR", "BXOR",    "PREMUL_SUM"};
    unsigned i = static_cast<unsigned>(rop.op_);
    bad_value(std::string("chorus ") + op + ": reduce op " +
              (i < sizeof(names) / sizeof(names[0]) ? names[i] : "UNUSED") +
              " is not supported (supported: SUM, AVG, PRODUCT, MIN, MAX)");
  }
  }
  if (t == at::kBool && (o == CHORUS_SUM || o == CHORUS_AVG))
    bad_value(std::string("chorus ") + op + ": reduce op " + name +
              " on torch.bool is not supported (MAX is a logical or, MIN and PRODUCT a "
              "logical and)");
  return o;
}

int check_root(const char *op, int64_t root, int size, const char *what = "root") {
  if (root < 0 || root >= size)
    bad_value(std::string("chorus ") + op + ": " + what + " " + std::to_string(root) +
              " is not a rank of this group of " + std::to_string(size));
  return static_cast<int>(root);
}

void check_count(const char *op, const char *what, size_t got, size_t want) {
  if (got != want)
    bad_value(std::string("chorus ") + op + ": " + what + " " + std::to_string(got) +
              ", expected " + std::to_string(want));
}

/* One tensor per process in the list forms (torch passes one per device). */
const at::Tensor &only(const char *op, const std::vector<at::Tensor> &v, const char *what) {
  if (v.size() != 1)
    bad_value(std::string("chorus ") + op + ": expects exactly one " +
              (*what ? std::string(what) + " " : std::string()) + "tensor per process, got " +
              std::to_string(v.size()));
  return v[0];
}

char empty_buf[64]; /* stands for the data of an empty tensor (count 0) */

void *ptr(const at::Tensor &t) {
  return t.numel() ? t.data_ptr() : static_cast<void *>(empty_buf);
}

size_t count(const at::Tensor &t) {
  return static_cast<size_t>(t.numel());
}

/* The buffer a call writes: t itself when contiguous, else a contiguous
 * stand-in (holding t's values when `load`, for in-place calls) copied
 * back into t once the call succeeded. */
at::Tensor out_buf(WorkChorus &w, const at::Tensor &t, bool load) {
  at::Tensor b = t;
  if (!t.is_contiguous()) {
    b = load ? t.contiguous() : at::empty(t.sizes(), t.options());
    w.onSuccess([t, b]() mutable { t.copy_(b); });
  }
  w.keep(b);
  return b;
}

/* The buffer a call reads: t, or a contiguous copy of it. */
at::Tensor in_buf(WorkChorus &w, const at::Tensor &t) {
  at::Tensor b = t.contiguous();
  w.keep(b);
  return b;
}

/* A flat stand-in for a list of tensors, block i holding list[i]'s
 * values when `load`; copied back into the list once the call succeeded
 * when `store`. */
at::Tensor list_buf(WorkChorus &w, const std::vector<at::Tensor> &list, bool load, bool store) {
  const at::Tensor &ref = list[0];
  int64_t n = ref.numel();
  at::Tensor flat = at::empty({static_cast<int64_t>(list.size()) * n}, ref.options());
  if (load)
    for (size_t i = 0; i < list.size(); i++)
      flat.narrow(0, static_cast<int64_t>(i) * n, n).view(ref.sizes()).copy_(list[i]);
  if (store)
    w.onSuccess([list, flat, n]() mutable {
      for (size_t i = 0; i < list.size(); i++)
        list[i].copy_(flat.narrow(0, static_cast<int64_t>(i) * n, n).view(list[i].sizes()));
    });
  w.keep(flat);
  return flat;
}

double seconds_left(std::chrono::steady_clock::time_point deadline) {
  auto left = deadline - std::chrono::steady_clock::now();
  return std::max(0.0, std::chrono::duration<double>(left).count());
}

} // namespace

/* ======================= Core ======================= */

namespace {
/* the Core whose completion thread this is, if any */
thread_local Core *tl_pool = nullptr;
} // namespace

Core::Core(chorus_comm_t *comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}

Core::~Core() {
  /* Threads and pending Works hold the Core: with none left, only a
   * communicator never shut down remains (a group that failed halfway) */
  if (!stop_)
    chorus_comm_destroy(comm_);
}

void Core::launch(const WorkPtr &w, const std::function<chorus_result(Requests &)> &post) {
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_ || down_)
    bad_value(std::string("chorus ") + w->name() +
              ": the process group was destroyed (destroy_process_group)");
  /* Works nobody waits for nor watches: release the finished ones now
   * and then, so that fire-and-forget calls do not pile up */
  if (unwatched_ >= 16)
    for (WorkPtr &d : collect(false)) {
      lk.unlock();
      d->complete();
      lk.lock();
      finished(1);
    }
  chorus_result rc = post(w->reqs_);
  if (rc != CHORUS_SUCCESS) {
    std::string why = chorus_comm_last_error(comm_);
    if (w->reqs_.empty()) {
      lk.unlock();
      if (rc == CHORUS_ERR_INVALID_ARG || rc == CHORUS_ERR_INVALID_DTYPE ||
          rc == CHORUS_ERR_INVALID_OP || rc == CHORUS_ERR_COUNT_OVERFLOW)
        bad_value(std::string("chorus ") + w->name() + ": " + why);
      throw std::runtime_error(std::string("chorus ") + w->name() + ": " + why);
    }
    w->rc_ = rc;
    w->err_ = std::string("chorus ") + w->name() + ": " + why;
  }
  w->pending_ = true;
  w->it_ = pending_.insert(pending_.end(), w);
  unwatched_++;
}

bool Core::testLocked(WorkChorus *w) {
  auto &r = w->reqs_;
  size_t keep = 0;
  for (size_t i = 0; i < r.size(); i++) {
    int done = 0;
    chorus_result rc = chorus_test(&r[i], &done);
    if (!done && rc == CHORUS_SUCCESS) {
      r[keep++] = r[i];
      continue;
    }
    if (rc != CHORUS_SUCCESS && w->rc_ == CHORUS_SUCCESS) {
      w->rc_ = rc;
      w->err_ = std::string("chorus ") + w->name() + " failed: " + chorus_comm_last_error(comm_);
    }
  }
  r.resize(keep);
  return r.empty();
}

WorkPtr Core::take(WorkChorus *w) {
  WorkPtr hold = *w->it_; /* the list's reference, dropped by the caller */
  pending_.erase(w->it_);
  w->pending_ = false;
  if (w->watched_)
    watched_--;
  else
    unwatched_--;
  finishing_++;
  return hold;
}

void Core::finished(size_t n) {
  finishing_ -= static_cast<int>(n);
  if (stop_ && finishing_ == 0 && pending_.empty()) {
    idle_.notify_all();
    cv_.notify_all(); /* spare threads: time to go */
  }
}

void Core::finish(std::unique_lock<std::mutex> &lk, WorkChorus *w) {
  WorkPtr hold = take(w);
  lk.unlock();
  w->complete();
  hold.reset(); /* may be the last reference: outside mu */
  lk.lock();
  finished(1);
}

std::vector<WorkPtr> Core::collect(bool watched_only) {
  std::vector<WorkPtr> done;
  for (auto it = pending_.begin(); it != pending_.end();) {
    WorkChorus *w = (it++)->get(); /* take() erases w's node */
    if (w->users_ == 0 && (!watched_only || w->watched_) && testLocked(w))
      done.push_back(take(w));
  }
  return done;
}

void Core::drive(WorkChorus *w, std::chrono::steady_clock::time_point deadline, bool forever) {
  std::unique_lock<std::mutex> lk(mu_);
  while (w->pending_) {
    if (w->users_ == 0 && testLocked(w)) {
      finish(lk, w);
      return;
    }
    if (w->reqs_.empty())
      return; /* finished, but another thread is inside: it completes w */
    double left = forever ? -1.0 : seconds_left(deadline);
    if (!forever && left <= 0)
      return;
    chorus_request_t *r = w->reqs_.front();
    int done = 0;
    w->users_++;
    lk.unlock();
    chorus_result rc = chorus_wait_for(r, left, &done);
    lk.lock();
    w->users_--;
    if (rc != CHORUS_SUCCESS || !done)
      return; /* timed out (Work::wait reports it) */
    if (w->users_ > 0)
      return; /* the last thread out completes w; Work::wait waits for that */
  }
}

void Core::poll(WorkChorus *w) {
  std::unique_lock<std::mutex> lk(mu_);
  if (w->pending_ && w->users_ == 0 && testLocked(w))
    finish(lk, w);
}

void Core::watch(WorkChorus *w) {
  std::lock_guard<std::mutex> g(mu_);
  if (!w->pending_ || w->watched_)
    return;
  w->watched_ = true;
  unwatched_--;
  watched_++;
  ensureLeader();
}

void Core::ensureLeader() {
  if (leader_ || (stop_ ? pending_.empty() : watched_ == 0))
    return;
  if (spares_ > 0) {
    cv_.notify_one();
    return;
  }
  alive_++;
  threads_.emplace_back([self = shared_from_this()] { self->threadLoop(); });
}

/* The completion threads, leader and followers: one at a time leads,
 * sleeping in chorus_comm_wait_any while a watched Work is pending (each
 * completion on the communicator wakes it; one that lands between the
 * test and the sleep is seen at the timeout, 1 ms, doubling up to 50 ms
 * while nothing finishes). When Works finished, the leader steps down
 * (ensureLeader wakes or starts a follower if watched Works remain) and
 * completes them: their futures' callbacks may block on a later
 * operation's future (PowerSGD waits inside its callbacks), which the
 * next leader completes. */
void Core::threadLoop() {
  tl_pool = this;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (stop_ && pending_.empty())
      break;
    if (leader_ || (!stop_ && watched_ == 0)) {
      spares_++;
      cv_.wait(lk);
      spares_--;
      continue;
    }
    leader_ = true;
    double nap = 1e-3;
    std::vector<WorkPtr> done;
    while (!(stop_ ? pending_.empty() : watched_ == 0)) {
      done = collect(!stop_);
      if (!done.empty())
        break;
      lk.unlock();
      chorus_comm_wait_any(comm_, nap);
      lk.lock();
      nap = std::min(nap * 2, 0.05);
    }
    leader_ = false;
    if (done.empty())
      continue;
    ensureLeader();
    lk.unlock();
    for (WorkPtr &w : done)
      w->complete();
    size_t n = done.size();
    done.clear(); /* may drop the last references: outside mu */
    lk.lock();
    finished(n);
  }
  alive_--;
  idle_.notify_all();
  cv_.notify_all();
  tl_pool = nullptr;
}

void Core::shutdown() {
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_)
    return;
  if (tl_pool == this) {
    /* inside a future's callback on one of our threads, whose completion
     * the shutdown waits for: let another thread do it */
    lk.unlock();
    std::thread([self = shared_from_this()] { self->shutdown(); }).detach();
    return;
  }
  stop_ = true;
  ensureLeader();
  cv_.notify_all();
  idle_.wait(lk, [this] { return pending_.empty() && finishing_ == 0 && alive_ == 0; });
  std::vector<std::thread> threads = std::move(threads_);
  down_ = true;
  lk.unlock();
  for (std::thread &t : threads)
    t.join();
  chorus_comm_destroy(comm_);
}

/* ======================= WorkChorus ======================= */

WorkChorus::WorkChorus(std::shared_ptr<Core> core, c10d::OpType type, const char *name,
                       std::vector<at::Tensor> outputs)
    : c10d::Work(core->rank(), type), core_(std::move(core)), name_(name),
      outputs_(std::move(outputs)) {}

WorkChorus::~WorkChorus() = default;

namespace {

const c10::TypePtr &tensor_list_type() {
  static const c10::TypePtr t = c10::ListType::create(c10::TensorType::get());
  return t;
}

} // namespace

void WorkChorus::markFuture(const c10::intrusive_ptr<c10::ivalue::Future> &fut,
                            const std::exception_ptr &ex) {
  if (ex)
    fut->setError(ex);
  else
    fut->markCompleted(c10::IValue(outputs_));
}

void WorkChorus::complete() {
  std::exception_ptr ex;
  if (rc_ != CHORUS_SUCCESS) {
    ex = std::make_exception_ptr(std::runtime_error(err_));
  } else {
    try {
      for (auto &fn : unpack_)
        fn();
    } catch (...) {
      ex = std::current_exception();
    }
  }
  unpack_.clear();
  keep_.clear();
  /* as Work::finish, and the future made before completion (getFuture
   * marks one made after it) */
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  {
    std::unique_lock<std::mutex> lk(mutex_);
    completed_ = true;
    exception_ = ex;
    fut = future_;
    if (recordFunctionEndCallback_) {
      recordFunctionEndCallback_();
      recordFunctionEndCallback_ = nullptr;
    }
  }
  cv_.notify_all();
  if (fut)
    markFuture(fut, ex);
}

bool WorkChorus::isCompleted() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (completed_)
      return true;
  }
  core_->poll(this);
  std::lock_guard<std::mutex> g(mutex_);
  return completed_;
}

bool WorkChorus::wait(std::chrono::milliseconds timeout) {
  bool forever = timeout == kNoTimeout;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  core_->drive(this, deadline, forever);
  std::unique_lock<std::mutex> lk(mutex_);
  if (forever) {
    cv_.wait(lk, [this] { return completed_; });
  } else if (!cv_.wait_until(lk, deadline, [this] { return completed_; })) {
    throw std::runtime_error(std::string("chorus ") + name_ + ": Work.wait timed out after " +
                             std::to_string(timeout.count()) +
                             " ms (the operation goes on; wait again or destroy the group)");
  }
  if (exception_)
    std::rethrow_exception(exception_);
  return true;
}

/* Made on demand (most calls are waited for, not chained). Marked by
 * complete() when made before the Work completed, else here. */
c10::intrusive_ptr<c10::ivalue::Future> WorkChorus::getFuture() {
  {
    std::unique_lock<std::mutex> lk(mutex_);
    if (future_)
      return future_;
    future_ = c10::make_intrusive<c10::ivalue::Future>(tensor_list_type());
    if (completed_) {
      std::exception_ptr ex = exception_;
      lk.unlock();
      markFuture(future_, ex);
      return future_;
    }
  }
  core_->watch(this);
  return future_;
}

std::vector<at::Tensor> WorkChorus::result() {
  return outputs_;
}

/* ======================= ProcessGroupChorus ======================= */

ProcessGroupChorus::ProcessGroupChorus(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size) {
  if (size < 1 || rank < 0 || rank >= size)
    bad_value("chorus: rank " + std::to_string(rank) + " of a group of " + std::to_string(size) +
              " is not a rank of it");
  /* Each communicator made over this store gets a key of its own: the
   * arrivals counter numbers them (a store may serve one group after
   * another: destroy_process_group, then init_process_group again) */
  int64_t arrived = store->add("chorus/arrivals", 1);
  std::string key = "chorus/uid/" + std::to_string((arrived - 1) / size);

  chorus_unique_id id;
  if (rank == 0) {
    if (chorus_get_unique_id(&id) != CHORUS_SUCCESS)
      throw std::runtime_error(std::string("chorus: chorus_get_unique_id failed: ") +
                               chorus_last_error());
    try {
      store->set(key, std::vector<uint8_t>(reinterpret_cast<uint8_t *>(id.internal),
                                           reinterpret_cast<uint8_t *>(id.internal) +
                                               sizeof(id.internal)));
    } catch (...) {
      chorus_unique_id_release(&id);
      throw;
    }
  } else {
    std::vector<uint8_t> v = store->get(key); /* blocks up to the store's timeout */
    if (v.size() != sizeof(id.internal))
      throw std::runtime_error("chorus: the store's key " + key + " holds " +
                               std::to_string(v.size()) + " bytes, not a chorus unique id (" +
                               std::to_string(sizeof(id.internal)) + ")");
    std::memcpy(id.internal, v.data(), sizeof(id.internal));
  }

  chorus_init_opts o;
  std::memset(&o, 0, sizeof(o));
  o.struct_size = sizeof(o);
  o.timeout_s = timeout.count() > 0 ? static_cast<double>(timeout.count()) / 1000.0 : 0.0;
  chorus_comm_t *comm = nullptr;
  chorus_result rc = chorus_comm_init_rank(&comm, size, &id, rank, &o);
  if (rank == 0) {
    chorus_unique_id_release(&id); /* no-op once the communicator took it */
    if (rc == CHORUS_SUCCESS) {
      try {
        store->deleteKey(key); /* every rank read it before joining */
      } catch (...) {
      }
    }
  }
  if (rc != CHORUS_SUCCESS)
    throw std::runtime_error(std::string("chorus: creating the communicator of rank ") +
                             std::to_string(rank) + " of " + std::to_string(size) +
                             " failed: " + chorus_last_error());
  core_ = std::make_shared<Core>(comm, rank, size);
  init();
}

ProcessGroupChorus::~ProcessGroupChorus() {
  /* The completion thread may be running a Python callback that waits for
   * the GIL this thread holds (a group dropped from Python): let go. */
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState *st = PyEval_SaveThread();
    core_->shutdown();
    PyEval_RestoreThread(st);
  } else {
    core_->shutdown();
  }
}

std::string ProcessGroupChorus::provider() const {
  return chorus_comm_provider(core_->comm());
}

/* Makes one chorus_i* call (its request in req_) and keeps the request
 * in reqs when it was posted. */
#define POST(reqs, call)                                                                           \
  [&]() {                                                                                          \
    chorus_request_t *req_ = nullptr;                                                              \
    chorus_result rc_ = (call);                                                                    \
    if (rc_ == CHORUS_SUCCESS)                                                                     \
      (reqs).push_back(req_);                                                                      \
    return rc_;                                                                                    \
  }()

WorkPtr ProcessGroupChorus::makeWork(c10d::OpType type, const char *name,
                                     std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<WorkChorus>(core_, type, name, std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::broadcast(std::vector<at::Tensor> &tensors,
                                                             const c10d::BroadcastOptions &opts) {
  const char *op = "broadcast";
  const at::Tensor &t = only(op, tensors, "");
  chorus_dtype dt = check_tensor(op, t, "the tensor");
  int root = check_root(op, opts.rootRank, size_);
  if (opts.rootTensor != 0)
    bad_value("chorus broadcast: rootTensor " + std::to_string(opts.rootTensor) +
              " but there is one tensor per process");
  auto w = makeWork(c10d::OpType::BROADCAST, op, tensors);
  at::Tensor b = out_buf(*w, t, rank_ == root);
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_ibcast(core_->comm(), ptr(b), ptr(b), count(b), dt, root, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::allreduce(std::vector<at::Tensor> &tensors,
                                                             const c10d::AllreduceOptions &opts) {
  const char *op = "allreduce";
  const at::Tensor &t = only(op, tensors, "");
  chorus_dtype dt = check_tensor(op, t, "the tensor");
  chorus_op rop = check_op(op, opts.reduceOp, t.scalar_type());
  auto w = makeWork(c10d::OpType::ALLREDUCE, op, tensors);
  at::Tensor b = out_buf(*w, t, true);
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_iallreduce(core_->comm(), ptr(b), ptr(b), count(b), dt, rop, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupChorus::allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                        const c10d::AllreduceCoalescedOptions &opts) {
  const char *op = "allreduce_coalesced";
  if (tensors.empty())
    bad_value("chorus allreduce_coalesced: no tensors");
  chorus_dtype dt = check_tensor(op, tensors[0], "tensor 0");
  for (size_t i = 1; i < tensors.size(); i++) {
    std::string what = "tensor " + std::to_string(i);
    check_tensor(op, tensors[i], what.c_str());
    if (tensors[i].scalar_type() != tensors[0].scalar_type())
      bad_type("chorus allreduce_coalesced: " + what + " has dtype " +
               dtype_name(tensors[i].scalar_type()) + " but tensor 0 has " +
               dtype_name(tensors[0].scalar_type()) + " (one dtype per call)");
  }
  chorus_op rop = check_op(op, opts.reduceOp, tensors[0].scalar_type());
  if (tensors.size() > static_cast<size_t>(INT32_MAX))
    bad_value("chorus allreduce_coalesced: too many tensors");
  auto w = makeWork(c10d::OpType::ALLREDUCE_COALESCED, op, tensors);
  std::vector<void *> bufs;
  std::vector<size_t> counts;
  for (auto &t : tensors) {
    at::Tensor b = out_buf(*w, t, true);
    bufs.push_back(b.numel() ? b.data_ptr() : nullptr);
    counts.push_back(count(b));
  }
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_iallreduce_multi(
                       core_->comm(), const_cast<const void *const *>(bufs.data()), bufs.data(),
                       counts.data(), static_cast<int>(bufs.size()), dt, rop, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::reduce(std::vector<at::Tensor> &tensors,
                                                          const c10d::ReduceOptions &opts) {
  const char *op = "reduce";
  const at::Tensor &t = only(op, tensors, "");
  chorus_dtype dt = check_tensor(op, t, "the tensor");
  chorus_op rop = check_op(op, opts.reduceOp, t.scalar_type());
  int root = check_root(op, opts.rootRank, size_);
  if (opts.rootTensor != 0)
    bad_value("chorus reduce: rootTensor " + std::to_string(opts.rootTensor) +
              " but there is one tensor per process");
  auto w = makeWork(c10d::OpType::REDUCE, op, tensors);
  /* the root reduces in place; the others' tensors are left as they are */
  at::Tensor b = rank_ == root ? out_buf(*w, t, true) : in_buf(*w, t);
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_ireduce(core_->comm(), ptr(b), rank_ == root ? ptr(b) : nullptr, count(b),
                                  dt, rop, root, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupChorus::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                              std::vector<at::Tensor> &inputs, const c10d::AllgatherOptions &) {
  const char *op = "allgather";
  const at::Tensor &in = only(op, inputs, "input");
  chorus_dtype dt = check_tensor(op, in, "the input");
  if (outputs.size() != 1)
    bad_value("chorus allgather: expects exactly one output list per process, got " +
              std::to_string(outputs.size()));
  check_count(op, "output list length", outputs[0].size(), static_cast<size_t>(size_));
  for (size_t i = 0; i < outputs[0].size(); i++)
    check_like(op, in, "the input", outputs[0][i], "output " + std::to_string(i));
  auto w = makeWork(c10d::OpType::ALLGATHER, op, outputs[0]);
  at::Tensor src = in_buf(*w, in);
  at::Tensor flat = list_buf(*w, outputs[0], false, true);
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_iallgather(core_->comm(), ptr(src), ptr(flat), count(src), dt, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::_allgather_base(at::Tensor &output,
                                                                   at::Tensor &input,
                                                                   const c10d::AllgatherOptions &) {
  const char *op = "allgather_into_tensor";
  chorus_dtype dt = check_tensor(op, input, "the input");
  check_tensor(op, output, "the output");
  if (output.scalar_type() != input.scalar_type())
    bad_type(std::string("chorus allgather_into_tensor: the output has dtype ") +
             dtype_name(output.scalar_type()) + " but the input has " +
             dtype_name(input.scalar_type()) + " (one dtype per call)");
  check_count(op, "output elements", count(output), count(input) * static_cast<size_t>(size_));
  auto w = makeWork(c10d::OpType::_ALLGATHER_BASE, op, {output});
  at::Tensor dst = out_buf(*w, output, false);
  /* in place when the input is block `rank` of the output itself */
  at::Tensor src = input.is_contiguous() ? input : in_buf(*w, input);
  w->keep(src);
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_iallgather(core_->comm(), ptr(src), ptr(dst), count(src), dt, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupChorus::gather(std::vector<std::vector<at::Tensor>> &outputs,
                           std::vector<at::Tensor> &inputs, const c10d::GatherOptions &opts) {
  const char *op = "gather";
  const at::Tensor &in = only(op, inputs, "input");
  chorus_dtype dt = check_tensor(op, in, "the input");
  int root = check_root(op, opts.rootRank, size_);
  bool at_root = rank_ == root;
  if (at_root) {
    if (outputs.size() != 1)
      bad_value("chorus gather: the root expects exactly one output list, got " +
                std::to_string(outputs.size()));
    check_count(op, "output list length", outputs[0].size(), static_cast<size_t>(size_));
    for (size_t i = 0; i < outputs[0].size(); i++)
      check_like(op, in, "the input", outputs[0][i], "output " + std::to_string(i));
  } else if (!outputs.empty() && !outputs[0].empty()) {
    bad_value("chorus gather: only the root (rank " + std::to_string(root) +
              ") passes an output list; rank " + std::to_string(rank_) + " passed " +
              std::to_string(outputs[0].size()) + " tensors");
  }
  auto w = makeWork(c10d::OpType::GATHER, op, at_root ? outputs[0] : std::vector<at::Tensor>{});
  at::Tensor src = in_buf(*w, in);
  at::Tensor flat = at_root ? list_buf(*w, outputs[0], false, true) : at::Tensor();
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_igather(core_->comm(), ptr(src), at_root ? ptr(flat) : nullptr,
                                  count(src), dt, root, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupChorus::scatter(std::vector<at::Tensor> &outputs,
                            std::vector<std::vector<at::Tensor>> &inputs,
                            const c10d::ScatterOptions &opts) {
  const char *op = "scatter";
  const at::Tensor &out = only(op, outputs, "output");
  chorus_dtype dt = check_tensor(op, out, "the output");
  int root = check_root(op, opts.rootRank, size_);
  bool at_root = rank_ == root;
  if (at_root) {
    if (inputs.size() != 1)
      bad_value("chorus scatter: the root expects exactly one input list, got " +
                std::to_string(inputs.size()));
    check_count(op, "input list length", inputs[0].size(), static_cast<size_t>(size_));
    for (size_t i = 0; i < inputs[0].size(); i++)
      check_like(op, out, "the output", inputs[0][i], "input " + std::to_string(i));
  } else if (!inputs.empty() && !inputs[0].empty()) {
    bad_value("chorus scatter: only the root (rank " + std::to_string(root) +
              ") passes an input list; rank " + std::to_string(rank_) + " passed " +
              std::to_string(inputs[0].size()) + " tensors");
  }
  auto w = makeWork(c10d::OpType::SCATTER, op, outputs);
  at::Tensor dst = out_buf(*w, out, false);
  at::Tensor flat = at_root ? list_buf(*w, inputs[0], true, false) : at::Tensor();
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_iscatter(core_->comm(), at_root ? ptr(flat) : nullptr, ptr(dst),
                                   count(dst), dt, root, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupChorus::reduce_scatter(std::vector<at::Tensor> &outputs,
                                   std::vector<std::vector<at::Tensor>> &inputs,
                                   const c10d::ReduceScatterOptions &opts) {
  const char *op = "reduce_scatter";
  const at::Tensor &out = only(op, outputs, "output");
  chorus_dtype dt = check_tensor(op, out, "the output");
  chorus_op rop = check_op(op, opts.reduceOp, out.scalar_type());
  if (inputs.size() != 1)
    bad_value("chorus reduce_scatter: expects exactly one input list per process, got " +
              std::to_string(inputs.size()));
  check_count(op, "input list length", inputs[0].size(), static_cast<size_t>(size_));
  for (size_t i = 0; i < inputs[0].size(); i++)
    check_like(op, out, "the output", inputs[0][i], "input " + std::to_string(i));
  auto w = makeWork(c10d::OpType::REDUCE_SCATTER, op, outputs);
  at::Tensor dst = out_buf(*w, out, false);
  at::Tensor flat = list_buf(*w, inputs[0], true, false);
  core_->launch(w, [&](Requests &r) {
    return POST(
        r, chorus_ireduce_scatter(core_->comm(), ptr(flat), ptr(dst), count(dst), dt, rop, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupChorus::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                         const c10d::ReduceScatterOptions &opts) {
  const char *op = "reduce_scatter_tensor";
  chorus_dtype dt = check_tensor(op, output, "the output");
  check_tensor(op, input, "the input");
  if (output.scalar_type() != input.scalar_type())
    bad_type(std::string("chorus reduce_scatter_tensor: the output has dtype ") +
             dtype_name(output.scalar_type()) + " but the input has " +
             dtype_name(input.scalar_type()) + " (one dtype per call)");
  chorus_op rop = check_op(op, opts.reduceOp, output.scalar_type());
  check_count(op, "input elements", count(input), count(output) * static_cast<size_t>(size_));
  auto w = makeWork(c10d::OpType::_REDUCE_SCATTER_BASE, op, {output});
  at::Tensor dst = out_buf(*w, output, false);
  at::Tensor src = input.is_contiguous() ? input : in_buf(*w, input);
  w->keep(src);
  core_->launch(w, [&](Requests &r) {
    return POST(
        r, chorus_ireduce_scatter(core_->comm(), ptr(src), ptr(dst), count(dst), dt, rop, &req_));
  });
  return w;
}

namespace {

/* Rows of each block along dim 0: the splits given, or equal blocks. */
std::vector<int64_t> split_rows(const char *what, const at::Tensor &t,
                                const std::vector<int64_t> &splits, int size) {
  int64_t rows = t.dim() ? t.size(0) : 1;
  if (splits.empty()) {
    if (rows % size)
      bad_value(std::string("chorus alltoall_base: the ") + what + "'s first dimension " +
                std::to_string(rows) + " does not divide into " + std::to_string(size) +
                " equal blocks (pass split sizes)");
    return std::vector<int64_t>(static_cast<size_t>(size), rows / size);
  }
  if (splits.size() != static_cast<size_t>(size))
    bad_value(std::string("chorus alltoall_base: ") + std::to_string(splits.size()) + " " + what +
              " split sizes for a group of " + std::to_string(size));
  int64_t sum = 0;
  for (int64_t s : splits) {
    if (s < 0)
      bad_value(std::string("chorus alltoall_base: negative ") + what + " split size " +
                std::to_string(s));
    sum += s;
  }
  if (sum != rows)
    bad_value(std::string("chorus alltoall_base: the ") + what + " split sizes add up to " +
              std::to_string(sum) + " but its first dimension is " + std::to_string(rows));
  return splits;
}

} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall_base(at::Tensor &output,
                                                                 at::Tensor &input,
                                                                 std::vector<int64_t> &outputSplits,
                                                                 std::vector<int64_t> &inputSplits,
                                                                 const c10d::AllToAllOptions &) {
  const char *op = "alltoall_base";
  chorus_dtype dt = check_tensor(op, input, "the input");
  check_tensor(op, output, "the output");
  if (output.scalar_type() != input.scalar_type())
    bad_type(std::string("chorus alltoall_base: the output has dtype ") +
             dtype_name(output.scalar_type()) + " but the input has " +
             dtype_name(input.scalar_type()) + " (one dtype per call)");
  auto w = makeWork(c10d::OpType::ALLTOALL_BASE, op, {output});
  if (outputSplits.empty() && inputSplits.empty()) {
    check_count(op, "output elements", count(output), count(input));
    if (count(input) % static_cast<size_t>(size_))
      bad_value("chorus alltoall_base: " + std::to_string(count(input)) +
                " elements do not divide into " + std::to_string(size_) + " equal blocks");
    at::Tensor src = in_buf(*w, input);
    at::Tensor dst = out_buf(*w, output, false);
    core_->launch(w, [&](Requests &r) {
      return POST(r, chorus_ialltoall(core_->comm(), ptr(src), ptr(dst),
                                      count(src) / static_cast<size_t>(size_), dt, &req_));
    });
    return w;
  }
  /* uneven blocks: a send and a receive per peer (alltoallv) */
  std::vector<int64_t> in_rows = split_rows("input", input, inputSplits, size_);
  std::vector<int64_t> out_rows = split_rows("output", output, outputSplits, size_);
  int64_t in_row = input.dim() && input.size(0) ? input.numel() / input.size(0) : 0;
  int64_t out_row = output.dim() && output.size(0) ? output.numel() / output.size(0) : 0;
  if (input.dim() && output.dim() && input.size(0) && output.size(0) && in_row != out_row)
    bad_value("chorus alltoall_base: the input's rows have " + std::to_string(in_row) +
              " elements but the output's " + std::to_string(out_row));
  int64_t row = in_row ? in_row : out_row;
  at::Tensor src = in_buf(*w, input);
  at::Tensor dst = out_buf(*w, output, false);
  std::vector<size_t> in_off(size_ + 1, 0), out_off(size_ + 1, 0);
  for (int p = 0; p < size_; p++) {
    in_off[p + 1] = in_off[p] + static_cast<size_t>(in_rows[p] * row);
    out_off[p + 1] = out_off[p] + static_cast<size_t>(out_rows[p] * row);
  }
  check_count(op, "rows for this rank from itself", static_cast<size_t>(out_rows[rank_]),
              static_cast<size_t>(in_rows[rank_]));
  size_t esz = static_cast<size_t>(src.element_size());
  uint8_t *s = static_cast<uint8_t *>(ptr(src)), *d = static_cast<uint8_t *>(ptr(dst));
  if (in_rows[rank_])
    std::memcpy(d + out_off[rank_] * esz, s + in_off[rank_] * esz,
                (in_off[rank_ + 1] - in_off[rank_]) * esz);
  core_->launch(w, [&](Requests &r) {
    for (int k = 1; k < size_; k++) {
      int to = (rank_ + k) % size_, from = (rank_ - k + size_) % size_;
      chorus_result rc;
      if (in_rows[to] && (rc = POST(r, chorus_isend(core_->comm(), s + in_off[to] * esz,
                                                    in_off[to + 1] - in_off[to], dt, to, &req_))))
        return rc;
      if (out_rows[from] &&
          (rc = POST(r, chorus_irecv(core_->comm(), d + out_off[from] * esz,
                                     out_off[from + 1] - out_off[from], dt, from, &req_))))
        return rc;
    }
    return CHORUS_SUCCESS;
  });
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::alltoall(std::vector<at::Tensor> &outputs,
                                                            std::vector<at::Tensor> &inputs,
                                                            const c10d::AllToAllOptions &) {
  const char *op = "alltoall";
  check_count(op, "input list length", inputs.size(), static_cast<size_t>(size_));
  check_count(op, "output list length", outputs.size(), static_cast<size_t>(size_));
  chorus_dtype dt = check_tensor(op, inputs[0], "input 0");
  for (int p = 0; p < size_; p++) {
    std::string wi = "input " + std::to_string(p), wo = "output " + std::to_string(p);
    check_tensor(op, inputs[p], wi.c_str());
    check_tensor(op, outputs[p], wo.c_str());
    for (const at::Tensor *t : {&inputs[p], &outputs[p]})
      if (t->scalar_type() != inputs[0].scalar_type())
        bad_type("chorus alltoall: " + (t == &inputs[p] ? wi : wo) + " has dtype " +
                 dtype_name(t->scalar_type()) + " but input 0 has " +
                 dtype_name(inputs[0].scalar_type()) + " (one dtype per call)");
  }
  check_count(op, "elements of the output from this rank itself", count(outputs[rank_]),
              count(inputs[rank_]));
  auto w = makeWork(c10d::OpType::ALLTOALL, op, outputs);
  std::vector<at::Tensor> src(size_), dst(size_);
  for (int p = 0; p < size_; p++) {
    src[p] = in_buf(*w, inputs[p]);
    dst[p] = out_buf(*w, outputs[p], false);
  }
  if (count(src[rank_]))
    std::memcpy(ptr(dst[rank_]), ptr(src[rank_]), src[rank_].nbytes());
  core_->launch(w, [&](Requests &r) {
    for (int k = 1; k < size_; k++) {
      int to = (rank_ + k) % size_, from = (rank_ - k + size_) % size_;
      chorus_result rc;
      if (count(src[to]) &&
          (rc = POST(r, chorus_isend(core_->comm(), ptr(src[to]), count(src[to]), dt, to, &req_))))
        return rc;
      if (count(dst[from]) && (rc = POST(r, chorus_irecv(core_->comm(), ptr(dst[from]),
                                                         count(dst[from]), dt, from, &req_))))
        return rc;
    }
    return CHORUS_SUCCESS;
  });
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::barrier(const c10d::BarrierOptions &) {
  auto w = makeWork(c10d::OpType::BARRIER, "barrier", {});
  core_->launch(w, [&](Requests &r) { return POST(r, chorus_ibarrier(core_->comm(), &req_)); });
  return w;
}

namespace {

int check_peer(const char *op, int peer, int rank, int size, const char *what) {
  check_root(op, peer, size, what);
  if (peer == rank)
    bad_value(std::string("chorus ") + op + ": " + what + " " + std::to_string(peer) +
              " is this rank itself");
  return peer;
}

void check_tag(const char *op, int tag) {
  if (tag != 0)
    bad_value(std::string("chorus ") + op + ": tag " + std::to_string(tag) +
              " is not supported: Chorus matches a pair's messages in the order of the calls; "
              "pass tag=0");
}

} // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::send(std::vector<at::Tensor> &tensors, int dst,
                                                        int tag) {
  const char *op = "send";
  const at::Tensor &t = only(op, tensors, "");
  chorus_dtype dt = check_tensor(op, t, "the tensor");
  check_peer(op, dst, rank_, size_, "destination");
  check_tag(op, tag);
  auto w = makeWork(c10d::OpType::SEND, op, {});
  at::Tensor b = in_buf(*w, t);
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_isend(core_->comm(), ptr(b), count(b), dt, dst, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recv(std::vector<at::Tensor> &tensors, int src,
                                                        int tag) {
  const char *op = "recv";
  const at::Tensor &t = only(op, tensors, "");
  chorus_dtype dt = check_tensor(op, t, "the tensor");
  check_peer(op, src, rank_, size_, "source");
  check_tag(op, tag);
  auto w = makeWork(c10d::OpType::RECV, op, tensors);
  at::Tensor b = out_buf(*w, t, false);
  core_->launch(w, [&](Requests &r) {
    return POST(r, chorus_irecv(core_->comm(), ptr(b), count(b), dt, src, &req_));
  });
  return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupChorus::recvAnysource(std::vector<at::Tensor> &, int) {
  bad_value("chorus recv: a receive from any source (src=None) is not supported: name the source "
            "rank");
}

} // namespace chorus_torch
