/*
 * comm.c - communicators: creation (bootstrap, transport, progress thread),
 * destruction, argument validation and the allreduce entry points.
 *
 * Threads: the application thread calls the API; one progress thread per
 * communicator owns the transport and the executor. They meet in the
 * command queue (application -> progress, under `lock`, with an eventfd to
 * wake a sleeping progress thread) and in request completion (progress ->
 * application, an atomic flag plus a condition variable for sleepers).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "algos/algos.h"
#include "comm.h"
#include "endpoint.pb-c.h"
#include "eng.h"
#include "fsm.h"

/* ---- errors ---- */

chorus_result comm_error(chorus_comm_t *c, chorus_result rc, const char *fmt, ...) {
  char msg[sizeof(c->last_error)];
  va_list ap;

  int n = snprintf(msg, sizeof(msg), "rank %d: ", c->rank);
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&c->lock);
  memcpy(c->last_error, msg, sizeof(msg));
  pthread_mutex_unlock(&c->lock);
  eng_log(ENG_DEBUG, c->rank, "comm", "%s (%s)", msg, chorus_strerror(rc));
  return rc;
}

CHORUS_API const char *chorus_comm_last_error(const chorus_comm_t *comm) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return "invalid or destroyed communicator";
  return comm->last_error;
}

/* ---- in-process jobs ---- */

struct eng_local_job {
  int nranks;
  prov_inproc_world_t *world;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int arrived;
  unsigned generation;
  void **slots; /* allgather contributions */
  size_t *lens;
};

eng_local_job_t *eng_local_job_create(int nranks) {
  eng_local_job_t *j = calloc(1, sizeof(*j));
  if (!j)
    return NULL;
  j->nranks = nranks;
  j->world = prov_inproc_world_create(nranks);
  j->slots = calloc((size_t)nranks, sizeof(*j->slots));
  j->lens = calloc((size_t)nranks, sizeof(*j->lens));
  if (!j->world || !j->slots || !j->lens) {
    eng_local_job_destroy(j);
    return NULL;
  }
  pthread_mutex_init(&j->lock, NULL);
  pthread_cond_init(&j->cond, NULL);
  return j;
}

void eng_local_job_destroy(eng_local_job_t *j) {
  if (!j)
    return;
  if (j->world)
    prov_inproc_world_destroy(j->world);
  free(j->slots);
  free(j->lens);
  pthread_mutex_destroy(&j->lock);
  pthread_cond_destroy(&j->cond);
  free(j);
}

/* Allgather among the threads of a local job: same contract as boot_allgather. */
static int local_allgather(eng_local_job_t *j, int rank, const void *mine, size_t len,
                           void ***out_ptrs, size_t **out_lens) {
  pthread_mutex_lock(&j->lock);
  unsigned gen = j->generation;
  j->slots[rank] = (void *)(uintptr_t)mine;
  j->lens[rank] = len;
  if (++j->arrived == j->nranks) {
    j->arrived = 0;
    j->generation++;
    pthread_cond_broadcast(&j->cond);
  } else {
    while (j->generation == gen)
      pthread_cond_wait(&j->cond, &j->lock);
  }
  /* copy out while every contributor still waits at the second barrier below */
  size_t total = 0;
  for (int i = 0; i < j->nranks; i++)
    total += j->lens[i];
  void **ptrs = malloc((size_t)j->nranks * sizeof(void *) + total + 1);
  size_t *lens = malloc((size_t)j->nranks * sizeof(size_t));
  if (ptrs && lens) {
    uint8_t *data = (uint8_t *)(ptrs + j->nranks);
    for (int i = 0; i < j->nranks; i++) {
      memcpy(data, j->slots[i], j->lens[i]);
      ptrs[i] = data;
      lens[i] = j->lens[i];
      data += j->lens[i];
    }
  }
  /* second barrier: nobody's contribution is overwritten while others copy */
  gen = j->generation;
  if (++j->arrived == j->nranks) {
    j->arrived = 0;
    j->generation++;
    pthread_cond_broadcast(&j->cond);
  } else {
    while (j->generation == gen)
      pthread_cond_wait(&j->cond, &j->lock);
  }
  pthread_mutex_unlock(&j->lock);
  if (!ptrs || !lens) {
    free(ptrs);
    free(lens);
    return -ENOMEM;
  }
  *out_ptrs = ptrs;
  *out_lens = lens;
  return 0;
}

static int comm_allgather(chorus_comm_t *c, const void *mine, size_t len, void ***ptrs,
                          size_t **lens, double timeout_s) {
  char err[1024];
  int rc;

  if (c->local) {
    rc = local_allgather(c->local, c->rank, mine, len, ptrs, lens);
    return rc ? comm_error(c, CHORUS_ERR_NO_MEMORY, "allgather: out of memory") : 0;
  }
  rc = boot_allgather(c->boot, mine, len, ptrs, lens, timeout_s, err, sizeof(err));
  return rc ? comm_error(c, (chorus_result)rc, "%s", err) : 0;
}

/* ---- progress thread ---- */

static void on_wake(evutil_socket_t fd, short what, void *arg) {
  chorus_comm_t *c = arg;
  uint64_t v;
  if (fd == c->cmd_fd && read(c->cmd_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
    eng_log(ENG_WARN, c->rank, "progress", "eventfd read: %s", strerror(errno));
}

static void on_timer(evutil_socket_t fd, short what, void *arg) {}

static void request_exec_done(exec_t *ex, int status, void *arg) {
  request_complete(arg, (chorus_result)status);
}

/* Start the runs of queued requests. */
static size_t start_commands(chorus_comm_t *c) {
  size_t n = 0;

  pthread_mutex_lock(&c->lock);
  chorus_request_t *head = c->cmd_head;
  c->cmd_head = c->cmd_tail = NULL;
  atomic_store(&c->cmd_pending, 0);
  pthread_mutex_unlock(&c->lock);
  while (head) {
    chorus_request_t *req = head;
    head = head->next_cmd;
    req->next_cmd = NULL;
    exec_t *ex = exec_create(&c->ex, req->plan, req->sendbuf, req->recvbuf, req->seq,
                             request_exec_done, req);
    if (!ex) {
      comm_error(c, CHORUS_ERR_NO_MEMORY, "allreduce #%u: out of memory starting the run",
                 req->seq);
      request_complete(req, CHORUS_ERR_NO_MEMORY);
      continue;
    }
    exec_start(&c->ex, ex);
    n++;
  }
  return n;
}

static void *progress_main(void *arg) {
  chorus_comm_t *c = arg;
  prov_t *p = c->prov;
  const uint64_t spin_ns = (uint64_t)c->set.spin_us * 1000;
  uint64_t idle_since = 0;
  unsigned backoff_us = 16;

  while (!atomic_load(&c->stop)) {
    size_t n = 0;
    int pc = p->ops->progress(p);
    if (pc > 0)
      n += (size_t)pc;
    else if (pc < 0 && !exec_idle(&c->ex)) {
      comm_error(c, CHORUS_ERR_TRANSPORT, "transport progress failed: %s", strerror(-pc));
      exec_fail_all(&c->ex, CHORUS_ERR_TRANSPORT);
    }
    if (atomic_load_explicit(&c->cmd_pending, memory_order_acquire))
      n += start_commands(c);
    n += exec_drive(&c->ex);
    if (n) {
      idle_since = 0;
      backoff_us = 16;
      continue;
    }
    uint64_t now = fsm_now_ns();
    if (!idle_since)
      idle_since = now;
    if (now - idle_since < spin_ns) {
      sched_yield();
      continue;
    }

    /* Sleep. Dekker with the poster: sleeping=1 then re-check the queue;
     * the poster queues then checks sleeping. */
    atomic_store(&c->sleeping, 1);
    if (atomic_load(&c->cmd_pending) || atomic_load(&c->stop) || p->ops->arm(p) != 0) {
      atomic_store(&c->sleeping, 0);
      continue;
    }
    struct timeval tv;
    if (p->ops->wait_fd(p) < 0 || c->ex.stalled) {
      /* the transport can not wake us, or a post met -EAGAIN (a connection
       * being set up does not signal the fd): poll on a timer, backing off to 1 ms */
      tv.tv_sec = 0;
      tv.tv_usec = backoff_us;
      if (backoff_us < 1000)
        backoff_us *= 2;
    } else {
      /* a safety net only: wake-ups come from the fd */
      tv.tv_sec = exec_idle(&c->ex) ? 1 : 0;
      tv.tv_usec = exec_idle(&c->ex) ? 0 : 100000;
    }
    evtimer_add(c->ev_timer, &tv);
    event_base_loop(c->base, EVLOOP_ONCE);
    evtimer_del(c->ev_timer);
    p->ops->disarm(p);
    atomic_store(&c->sleeping, 0);
    idle_since = 0;
  }
  return NULL;
}

static void progress_wake(chorus_comm_t *c) {
  uint64_t one = 1;
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load(&c->sleeping) && write(c->cmd_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
    eng_log(ENG_WARN, c->rank, "progress", "eventfd write: %s", strerror(errno));
}

static int progress_start(chorus_comm_t *c) {
  c->cmd_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->cmd_fd < 0)
    return -errno;
  c->base = event_base_new();
  if (!c->base)
    return -ENOMEM;
  c->ev_cmd = event_new(c->base, c->cmd_fd, EV_READ | EV_PERSIST, on_wake, c);
  c->ev_timer = evtimer_new(c->base, on_timer, c);
  if (!c->ev_cmd || !c->ev_timer || event_add(c->ev_cmd, NULL))
    return -ENOMEM;
  int wfd = c->prov->ops->wait_fd(c->prov);
  if (wfd >= 0) {
    c->ev_wait = event_new(c->base, wfd, EV_READ | EV_PERSIST, on_wake, c);
    if (!c->ev_wait || event_add(c->ev_wait, NULL))
      return -ENOMEM;
  }
  int rc = pthread_create(&c->thread, NULL, progress_main, c);
  if (rc)
    return -rc;
  c->thread_started = true;
  return 0;
}

static void progress_stop(chorus_comm_t *c) {
  if (c->thread_started) {
    uint64_t one = 1;
    atomic_store(&c->stop, 1);
    if (write(c->cmd_fd, &one, sizeof(one)) < 0)
      eng_log(ENG_WARN, c->rank, "progress", "eventfd write: %s", strerror(errno));
    pthread_join(c->thread, NULL);
    c->thread_started = false;
  }
  if (c->ev_wait)
    event_free(c->ev_wait);
  if (c->ev_cmd)
    event_free(c->ev_cmd);
  if (c->ev_timer)
    event_free(c->ev_timer);
  if (c->base)
    event_base_free(c->base);
  if (c->cmd_fd >= 0)
    close(c->cmd_fd);
  c->ev_wait = c->ev_cmd = c->ev_timer = NULL;
  c->base = NULL;
  c->cmd_fd = -1;
}

/* ---- creation ---- */

static chorus_comm_t *comm_alloc(int rank, int size) {
  chorus_comm_t *c = calloc(1, sizeof(*c));
  if (!c)
    return NULL;
  c->rank = rank;
  c->size = size;
  c->cmd_fd = -1;
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  strcpy(c->last_error, "no error");
  return c;
}

static void comm_free(chorus_comm_t *c) {
  progress_stop(c);
  if (c->prov)
    c->prov->ops->close(c->prov);
  exec_ctx_fini(&c->ex);
  if (c->boot)
    boot_close(c->boot);
  for (int i = 0; i < COMM_PLAN_CACHE; i++)
    plan_free(c->plans[i].plan);
  while (c->live) {
    chorus_request_t *r = c->live;
    c->live = r->next_live;
    free(r);
  }
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  free(c);
}

static size_t once_records;

static void global_once(void) {
  evthread_use_pthreads();
  fsm_journal_configure(once_records);
  fsm_machine_register(&exec_step_machine);
}

static void global_init(const chorus_settings_t *s) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;

  once_records = s->journal_records;
  pthread_once(&once, global_once);
  fsm_journal_enable(s->journal);
  eng_log_level = s->log_level;
}

/* Publish our endpoint, learn everyone's, insert them into the transport. */
static chorus_result exchange_endpoints(chorus_comm_t *c, const char *host) {
  uint8_t addr[512];
  size_t alen = sizeof(addr);
  void **ptrs = NULL;
  size_t *lens = NULL;
  const void **addrs = NULL;
  size_t *alens = NULL;
  Chorus__Ep__Endpoint **eps = NULL;
  chorus_result ret = CHORUS_SUCCESS;
  int rc;

  rc = c->prov->ops->getname(c->prov, addr, &alen);
  if (rc)
    return comm_error(c, CHORUS_ERR_TRANSPORT, "transport %s: getname failed: %s", c->prov->name,
                      strerror(-rc));
  Chorus__Ep__Endpoint me = CHORUS__EP__ENDPOINT__INIT;
  me.rank = (uint32_t)c->rank;
  me.provider = (char *)c->prov->name;
  me.address.data = addr;
  me.address.len = alen;
  me.host = (char *)host;
  me.pid = (uint32_t)getpid();
  size_t plen = chorus__ep__endpoint__get_packed_size(&me);
  uint8_t *packed = malloc(plen ? plen : 1);
  if (!packed)
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
  chorus__ep__endpoint__pack(&me, packed);
  ret = (chorus_result)comm_allgather(c, packed, plen, &ptrs, &lens, c->set.connect_timeout_s);
  free(packed);
  if (ret)
    return ret;

  eps = calloc((size_t)c->size, sizeof(*eps));
  addrs = calloc((size_t)c->size, sizeof(*addrs));
  alens = calloc((size_t)c->size, sizeof(*alens));
  if (!eps || !addrs || !alens) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  for (int i = 0; i < c->size; i++) {
    eps[i] = chorus__ep__endpoint__unpack(NULL, lens[i], ptrs[i]);
    if (!eps[i] || eps[i]->rank != (uint32_t)i) {
      ret = comm_error(c, CHORUS_ERR_BOOTSTRAP, "malformed endpoint record from rank %d", i);
      goto out;
    }
    if (strcmp(eps[i]->provider, c->prov->name) != 0) {
      ret = comm_error(c, CHORUS_ERR_TRANSPORT,
                       "rank %d uses transport '%s' but rank %d uses '%s': set the same "
                       "CHORUS_PROVIDER on every rank",
                       i, eps[i]->provider, c->rank, c->prov->name);
      goto out;
    }
    addrs[i] = eps[i]->address.data;
    alens[i] = eps[i]->address.len;
  }
  rc = c->prov->ops->add_peers(c->prov, addrs, alens, c->size);
  if (rc)
    ret = comm_error(c, CHORUS_ERR_TRANSPORT, "transport %s: inserting peer addresses failed: %s",
                     c->prov->name, strerror(-rc));
out:
  if (eps)
    for (int i = 0; i < c->size; i++)
      if (eps[i])
        chorus__ep__endpoint__free_unpacked(eps[i], NULL);
  free(eps);
  free(addrs);
  free(alens);
  free(ptrs);
  free(lens);
  return ret;
}

/* Transport name: CHORUS_PROVIDER, else shm when every rank is on this host, else tcp. */
static const char *choose_provider(chorus_comm_t *c, const char *host) {
  if (c->local)
    return "inproc";
  if (c->set.provider[0])
    return c->set.provider;
  for (int i = 0; i < c->size; i++) {
    const char *h = boot_host_of(c->boot, i);
    if (!h || strcmp(h, host) != 0)
      return "tcp";
  }
  return "shm";
}

static chorus_result comm_setup(chorus_comm_t *c, const char *host) {
  char err[1024] = "";
  chorus_result ret;
  int rc;

  const char *name = choose_provider(c, host);
  const char *job_id = c->set.job_token[0] ? c->set.job_token : "chorus";
  prov_config_t cfg = {.name = name,
                       .rank = c->rank,
                       .nranks = c->size,
                       .job_id = job_id,
                       .inproc_world = c->local ? c->local->world : NULL};
  rc = prov_open(&cfg, &c->prov, err, sizeof(err));
  if (rc)
    return comm_error(c, CHORUS_ERR_TRANSPORT, "opening transport '%s' failed: %s", name, err);
  if ((ret = exchange_endpoints(c, host)))
    return ret;
  c->ex.prov = c->prov;
  c->ex.rank = c->rank;
  c->ex.comm_id = 0;
  size_t pm = c->prov->ops->max_posted(c->prov);
  c->ex.max_posted = c->set.max_posted < pm ? c->set.max_posted : pm;
  if (c->ex.max_posted == 0)
    c->ex.max_posted = 1;
  if ((rc = progress_start(c)))
    return comm_error(c, CHORUS_ERR_INTERNAL, "starting the progress thread failed: %s",
                      strerror(-rc));
  return CHORUS_SUCCESS;
}

static chorus_result comm_register(chorus_comm_t *c) {
  if (eng_handle_add(c, ENG_HANDLE_COMM))
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_init(chorus_comm_t **comm, int rank, int size,
                                          const char *rendezvous) {
  char err[1024];
  char host[256];
  chorus_comm_t *c;
  chorus_result ret;
  int rc;

  if (!comm)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_init: comm is NULL");
  *comm = NULL;
  if (size < 1 || size > 32767)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_init: size %d out of range [1, 32767]",
                     size);
  if (rank < 0 || rank >= size)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_init: rank %d out of range [0, %d)", rank,
                     size);
  if (!rendezvous || !*rendezvous || !strchr(rendezvous, ':'))
    return eng_error(
        CHORUS_ERR_INVALID_ARG, "chorus_comm_init: rendezvous must be \"host:port\", got %s%s%s",
        rendezvous ? "\"" : "", rendezvous ? rendezvous : "NULL", rendezvous ? "\"" : "");
  if (!(c = comm_alloc(rank, size)))
    return eng_error(CHORUS_ERR_NO_MEMORY, "chorus_comm_init: out of memory");
  if (settings_load(&c->set, err, sizeof(err))) {
    ret = eng_error(CHORUS_ERR_ENV, "rank %d: %s", rank, err);
    goto out_free;
  }
  global_init(&c->set);
  boot_host_identity(host, sizeof(host));
  boot_config_t bc = {.rank = rank,
                      .size = size,
                      .rendezvous = rendezvous,
                      .token = c->set.job_token,
                      .timeout_s = c->set.connect_timeout_s};
  rc = boot_open(&bc, &c->boot, err, sizeof(err));
  if (rc) {
    ret = eng_error((chorus_result)rc, "rank %d: %s", rank, err);
    goto out_free;
  }
  if ((ret = comm_setup(c, host))) {
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  if ((ret = comm_register(c))) {
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  eng_log(ENG_INFO, rank, "comm", "ready: %d ranks over %s", size, c->prov->name);
  *comm = c;
  return CHORUS_SUCCESS;

out_free:
  comm_free(c);
  return ret;
}

CHORUS_API chorus_result chorus_comm_init_from_env(chorus_comm_t **comm) {
  chorus_launch_env_t e;
  char err[1024];

  if (!comm)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_init_from_env: comm is NULL");
  *comm = NULL;
  if (settings_launch_env(&e, err, sizeof(err)))
    return eng_error(CHORUS_ERR_ENV, "%s", err);
  return chorus_comm_init(comm, e.rank, e.size, e.rendezvous);
}

chorus_result eng_comm_init_local(eng_local_job_t *job, int rank, chorus_comm_t **out) {
  char err[1024];
  chorus_comm_t *c;
  chorus_result ret;

  *out = NULL;
  if (!job || rank < 0 || rank >= job->nranks)
    return eng_error(CHORUS_ERR_INVALID_ARG, "eng_comm_init_local: bad job or rank");
  if (!(c = comm_alloc(rank, job->nranks)))
    return eng_error(CHORUS_ERR_NO_MEMORY, "out of memory");
  c->local = job;
  if (settings_load(&c->set, err, sizeof(err))) {
    ret = eng_error(CHORUS_ERR_ENV, "%s", err);
    goto out_free;
  }
  global_init(&c->set);
  if ((ret = comm_setup(c, "local")) || (ret = comm_register(c))) {
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  *out = c;
  return CHORUS_SUCCESS;

out_free:
  comm_free(c);
  return ret;
}

CHORUS_API chorus_result chorus_comm_destroy(chorus_comm_t *comm) {
  chorus_result ret = CHORUS_SUCCESS;

  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM,
                     "chorus_comm_destroy: not a live communicator (NULL or already destroyed)");
  eng_handle_remove(comm);
  /* Wait for what is still running: every rank issued the same calls. */
  for (chorus_request_t *r = comm->live; r; r = r->next_live) {
    pthread_mutex_lock(&comm->lock);
    comm->waiters++;
    while (!atomic_load(&r->done))
      pthread_cond_wait(&comm->cond, &comm->lock);
    comm->waiters--;
    pthread_mutex_unlock(&comm->lock);
  }
  /* Nobody may close while a peer still reads from or writes to it. */
  if (comm->size > 1) {
    void **ptrs = NULL;
    size_t *lens = NULL;
    if (comm_allgather(comm, "", 0, &ptrs, &lens, comm->set.connect_timeout_s) == 0) {
      free(ptrs);
      free(lens);
    } else {
      ret = CHORUS_ERR_BOOTSTRAP;
      eng_error(ret, "%s", comm->last_error);
    }
  }
  comm_free(comm);
  return ret;
}

CHORUS_API chorus_result chorus_comm_rank(const chorus_comm_t *comm, int *rank) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "chorus_comm_rank: not a live communicator");
  if (!rank)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_rank: rank is NULL");
  *rank = comm->rank;
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_size(const chorus_comm_t *comm, int *size) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "chorus_comm_size: not a live communicator");
  if (!size)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_size: size is NULL");
  *size = comm->size;
  return CHORUS_SUCCESS;
}

CHORUS_API const char *chorus_comm_provider(const chorus_comm_t *comm) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return "invalid";
  return comm->prov->name;
}

/* ---- allreduce ---- */

static comm_plan_slot_t *plan_lookup(chorus_comm_t *c, size_t count, chorus_dtype dtype,
                                     chorus_op op, bool inplace, chorus_result *ret) {
  comm_plan_slot_t *victim = NULL;
  const size_t chunk = c->set.chunk_bytes;

  c->uses++;
  for (int i = 0; i < COMM_PLAN_CACHE; i++) {
    comm_plan_slot_t *s = &c->plans[i];
    if (s->plan && s->plan->count == count && s->plan->dtype == dtype && s->plan->op == op &&
        s->plan->inplace == inplace && s->chunk_bytes == chunk) {
      s->last_use = c->uses;
      s->refs++;
      return s;
    }
    if (s->refs == 0 && (!victim || !s->plan || (victim->plan && s->last_use < victim->last_use)))
      victim = s;
  }
  if (!victim) {
    *ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "too many different collectives in flight");
    return NULL;
  }
  plan_t *p;
  algo_args_t args = {.coll = COLL_ALLREDUCE,
                      .rank = c->rank,
                      .nranks = c->size,
                      .count = count,
                      .dtype = dtype,
                      .op = op,
                      .inplace = inplace,
                      .chunk_bytes = chunk};
  int rc = algo_ring_allreduce(&args, &p);
  if (rc) {
    *ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory compiling allreduce of %zu", count);
    return NULL;
  }
  plan_free(victim->plan);
  victim->plan = p;
  victim->chunk_bytes = chunk;
  victim->last_use = c->uses;
  victim->refs = 1;
  return victim;
}

CHORUS_API chorus_result chorus_iallreduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                           size_t count, chorus_dtype dtype, chorus_op op,
                                           chorus_request_t **req) {
  chorus_result ret = CHORUS_SUCCESS;

  if (req)
    *req = NULL;
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM,
                     "chorus_allreduce: not a live communicator (NULL or destroyed)");
  if (!req)
    return comm_error(comm, CHORUS_ERR_INVALID_ARG, "allreduce: req is NULL");
  if ((unsigned)dtype >= CHORUS_DTYPE_COUNT)
    return comm_error(comm, CHORUS_ERR_INVALID_DTYPE, "allreduce: unknown datatype %d", (int)dtype);
  if ((unsigned)op >= CHORUS_OP_COUNT)
    return comm_error(comm, CHORUS_ERR_INVALID_OP, "allreduce: unknown reduction op %d", (int)op);
  size_t es = chorus_dtype_size(dtype);
  if (count > (SIZE_MAX / 4) / es)
    return comm_error(comm, CHORUS_ERR_COUNT_OVERFLOW,
                      "allreduce: count %zu of %s (%zu bytes each) overflows", count,
                      chorus_dtype_name(dtype), es);
  if (count && (!sendbuf || !recvbuf))
    return comm_error(comm, CHORUS_ERR_INVALID_ARG, "allreduce(%s, %zu): %s is NULL",
                      chorus_dtype_name(dtype), count, !sendbuf ? "sendbuf" : "recvbuf");
  if (count && sendbuf != recvbuf) {
    const uint8_t *s = sendbuf, *r = recvbuf;
    if (s < r + count * es && r < s + count * es)
      return comm_error(comm, CHORUS_ERR_INVALID_ARG,
                        "allreduce(%s, %zu): sendbuf and recvbuf overlap without being equal "
                        "(pass the same pointer for in place)",
                        chorus_dtype_name(dtype), count);
  }

  chorus_request_t *r = calloc(1, sizeof(*r));
  if (!r)
    return comm_error(comm, CHORUS_ERR_NO_MEMORY, "allreduce: out of memory");
  r->slot = plan_lookup(comm, count, dtype, op, sendbuf == recvbuf || count == 0, &ret);
  if (!r->slot || eng_handle_add(r, ENG_HANDLE_REQUEST)) {
    if (r->slot)
      r->slot->refs--;
    free(r);
    return ret ? ret : comm_error(comm, CHORUS_ERR_NO_MEMORY, "allreduce: out of memory");
  }
  r->comm = comm;
  r->plan = r->slot->plan;
  r->sendbuf = sendbuf;
  r->recvbuf = recvbuf;
  r->seq = comm->seq++;
  r->next_live = comm->live;
  if (comm->live)
    comm->live->prev_live = r;
  comm->live = r;

  pthread_mutex_lock(&comm->lock);
  if (comm->cmd_tail)
    comm->cmd_tail->next_cmd = r;
  else
    comm->cmd_head = r;
  comm->cmd_tail = r;
  atomic_store_explicit(&comm->cmd_pending, 1, memory_order_release);
  pthread_mutex_unlock(&comm->lock);
  progress_wake(comm);
  *req = r;
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_allreduce(chorus_comm_t *comm, const void *sendbuf, void *recvbuf,
                                          size_t count, chorus_dtype dtype, chorus_op op) {
  chorus_request_t *req;
  chorus_result rc = chorus_iallreduce(comm, sendbuf, recvbuf, count, dtype, op, &req);
  if (rc)
    return rc;
  return chorus_wait(&req);
}
