/*
 * comm.c - communicators made and destroyed: in-process jobs, the
 * bootstrap's allgather, the transport opened and endpoints exchanged, the
 * progress thread started (run.c), and the API calls on a communicator as a
 * whole (abort, dump, rank, size...).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "algos/algos.h"
#include "comm.h"
#include "endpoint.pb-c.h"
#include "eng.h"
#include "fsm.h"
#include "fault.h"
#include "topo.h"
#include "watch.h"

CHORUS_API chorus_result chorus_comm_abort(chorus_comm_t *comm) {
  char text[128];
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "chorus_comm_abort: not a live communicator");
  snprintf(text, sizeof(text), "rank %d aborted the communicator (chorus_comm_abort)", comm->rank);
  comm_fail(comm, CHORUS_ERR_ABORTED, text);
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_get_async_error(chorus_comm_t *comm, chorus_result *error) {
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM,
                     "chorus_comm_get_async_error: not a live communicator");
  if (!error)
    return comm_error(comm, CHORUS_ERR_INVALID_ARG, "chorus_comm_get_async_error: error is NULL");
  *error = (chorus_result)atomic_load(&comm->async_rc);
  if (*error) {
    char text[sizeof(comm->async_text)];
    pthread_mutex_lock(&comm->lock);
    memcpy(text, comm->async_text, sizeof(text));
    pthread_mutex_unlock(&comm->lock);
    comm_error(comm, *error, "%s", text);
  }
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_dump(chorus_comm_t *comm, const char *dir) {
  char path[1100];
  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM, "chorus_comm_dump: not a live communicator");
  if (!dir || !*dir)
    dir = comm->set.trace_dir;
  if (!*dir)
    return comm_error(comm, CHORUS_ERR_INVALID_ARG,
                      "chorus_comm_dump: no directory (pass one, or set CHORUS_TRACE_DIR)");
  char text[64];
  snprintf(text, sizeof(text), "rank %d dumped on request (chorus_comm_dump)", comm->rank);
  int rc = dump_write(comm, dir, 2 /* Verdict.REQUEST */, -1, 0, text, NULL, 0, path, sizeof(path));
  if (rc)
    return comm_error(comm, CHORUS_ERR_INTERNAL, "chorus_comm_dump: writing into %s failed: %s",
                      dir, strerror(-rc));
  return CHORUS_SUCCESS;
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
  /* Jobs made by chorus_comm_split belong to their communicators: the
   * last one destroyed frees the job. 0 for jobs their creator frees. */
  atomic_int comm_refs;
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

eng_local_job_t *eng_local_job_create_shared(int nranks) {
  eng_local_job_t *j = eng_local_job_create(nranks);
  if (j)
    atomic_store(&j->comm_refs, nranks);
  return j;
}

/* A communicator lets go of its job (after closing its endpoint). */
static void local_job_release(eng_local_job_t *j) {
  if (j && atomic_load(&j->comm_refs) > 0 && atomic_fetch_sub(&j->comm_refs, 1) == 1)
    eng_local_job_destroy(j);
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

chorus_result comm_allgather(chorus_comm_t *c, const void *mine, size_t len, void ***ptrs,
                             size_t **lens, double timeout_s) {
  char err[1024];
  int rc;

  if (c->local) {
    rc = local_allgather(c->local, c->rank, mine, len, ptrs, lens);
    return rc ? comm_error(c, CHORUS_ERR_NO_MEMORY, "allgather: out of memory") : 0;
  }
  if (!c->boot) /* made by chorus_comm_split: over its own transport */
    return comm_xport_allgather(c, NULL, mine, len, ptrs, lens);
  rc = boot_allgather(c->boot, mine, len, ptrs, lens, timeout_s, err, sizeof(err));
  return rc ? comm_error(c, (chorus_result)rc, "%s", err) : 0;
}

/* ---- creation ---- */

chorus_comm_t *comm_alloc(int rank, int size) {
  chorus_comm_t *c = calloc(1, sizeof(*c));
  if (!c)
    return NULL;
  c->rank = rank;
  c->size = size;
  c->cmd_fd = -1;
  c->home_cpu = COMM_HOME_UNSET;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->prog_lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  strcpy(c->last_error, "no error");
  ckpt_init(&c->ckpt);
  return c;
}

void comm_free(chorus_comm_t *c) {
  watch_family_remove(c);
  c->watch_bell = NULL;
  watch_stop(c->watch);
  c->watch = NULL;
  comm_progress_stop(c);
  comm_unwedge(c, true); /* closing reads our own queue */
  /* a peer killed on this host leaves its shm region behind: remove it */
  if (c->prov && c->prov->ops->reap && c->prov->ops->reap(c->prov) > 0)
    eng_log(ENG_INFO, c->rank, "comm", "removed the shared memory of ended peers");
  if (c->prov)
    c->prov->ops->close(c->prov);
  local_job_release(c->local);
  topo_free(c->topo);
  plan_free(c->ctl_plan);
  exec_ctx_fini(&c->ex);
  if (c->boot)
    boot_close(c->boot);
  coll_comm_fini(c);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->prog_lock);
  pthread_cond_destroy(&c->cond);
  ckpt_fini(&c->ckpt);
  fault_plan_free(c->faults);
  free(c->lost);
  free(c->world_of);
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

/* ---- topology and transport ---- */

/* c->topo for a communicator made from scratch: the bootstrap's table of
 * hosts (one host for an in-process job), cut further by CHORUS_TOPO. */
static chorus_result comm_topo_init(chorus_comm_t *c) {
  char err[512];
  int *labels = malloc((size_t)c->size * sizeof(*labels));
  const char **hosts = malloc((size_t)c->size * sizeof(*hosts));
  topo_t *real = NULL, *emu = NULL;
  chorus_result ret = CHORUS_SUCCESS;

  if (!labels || !hosts) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  if (topo_parse(c->set.topo, c->size, labels, err, sizeof(err))) {
    ret = comm_error(c, CHORUS_ERR_ENV, "%s", err);
    goto out;
  }
  emu = topo_from_labels(labels, c->size);
  if (c->boot) {
    for (int r = 0; r < c->size; r++)
      hosts[r] = boot_host_of(c->boot, r);
    real = topo_from_hosts(hosts, c->size);
  }
  c->topo = emu && (real || !c->boot) ? topo_refine(real, emu, c->size) : NULL;
  if (!c->topo) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  if (eng_log_level >= ENG_DEBUG) {
    char d[256];
    topo_describe(c->topo, d, sizeof(d));
    eng_log(ENG_DEBUG, c->rank, "comm", "topology: %s", d);
  }
out:
  topo_free(real);
  topo_free(emu);
  free(hosts);
  free(labels);
  return ret;
}

/* A transport's line about what it refused at its door (prov_config_t.log). */
static void comm_prov_log(void *arg, const char *line) {
  const chorus_comm_t *c = arg;

  eng_log(ENG_WARN, c->rank, "sock", "%s", line);
}

/* Where sock listens when CHORUS_SOCK_IFACE (or FI_TCP_IFACE) names no
 * interface: loopback when every rank is on this host; else the address
 * this rank reached rank 0's rendezvous from, the one the job's network
 * gave it; a split child, with no rendezvous, its parent's choice. ""
 * when none is known (the provider then takes the first interface up). */
static void sock_listen_addr(const chorus_comm_t *c, char *out, size_t len) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  const char *me = c->boot ? boot_host_of(c->boot, c->rank) : NULL;
  bool one_host = me != NULL;
  int fd = c->boot ? boot_fd(c->boot) : -1;

  out[0] = '\0';
  if (!c->boot) {
    snprintf(out, len, "%s", c->sock_listen);
    return;
  }
  for (int r = 0; one_host && r < c->size; r++) {
    const char *h = boot_host_of(c->boot, r);

    one_host = h && strcmp(h, me) == 0;
  }
  if (one_host) {
    snprintf(out, len, "127.0.0.1");
    return;
  }
  if (fd < 0 || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
    return;
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)len);
  } else if (ss.ss_family == AF_INET6) {
    const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;

    if (IN6_IS_ADDR_V4MAPPED(a))
      inet_ntop(AF_INET, &a->s6_addr[12], out, (socklen_t)len);
  }
}

/* CHORUS_FAULTS as a plan, once. */
static chorus_result comm_faults_load(chorus_comm_t *c) {
  char err[1024];

  if (!c->set.faults[0] || c->faults)
    return CHORUS_SUCCESS;
  if (fault_plan_parse(c->set.faults, &c->faults, err, sizeof(err)))
    return comm_error(c, CHORUS_ERR_ENV, "CHORUS_FAULTS: %s", err);
  return CHORUS_SUCCESS;
}

/* CHORUS_FAULTS kill and stall rules at=create#STAGE, as this rank forms a
 * communicator from a rendezvous: it dies, or sleeps, right after stage
 * 1 (joined the rendezvous), 2 (opened its transport), 3 (inserted every
 * peer's endpoint) or 4 (started its watchdog, about to return). */
static chorus_result comm_create_faults(chorus_comm_t *c, int stage) {
  static const char *const what[] = {"", "joined the rendezvous", "opened its transport",
                                     "inserted the peers' endpoints", "started its watchdog"};
  chorus_result ret;
  char where[96];
  double s = 0;

  if (!c->set.faults[0] || !c->boot)
    return CHORUS_SUCCESS;
  if ((ret = comm_faults_load(c)))
    return ret;
  snprintf(where, sizeof(where), "create#%d, as it formed the communicator: %s", stage,
           what[stage]);
  switch (fault_plan_on_call(c->faults, c->rank, FAULT_AT_CREATE, (uint64_t)stage, &s)) {
  case FAULT_CALL_KILL:
    comm_fault_kill(c, where);
    break;
  case FAULT_CALL_STALL:
    eng_log(ENG_WARN, c->rank, "fault", "freezing this rank for %.1f s at %s (CHORUS_FAULTS)", s,
            where);
    for (uint64_t end = fsm_now_ns() + (uint64_t)(s * 1e9), now; (now = fsm_now_ns()) < end;) {
      struct timespec ts = {(time_t)((end - now) / 1000000000u), (long)((end - now) % 1000000000u)};
      nanosleep(&ts, NULL);
    }
    break;
  default:
    break;
  }
  return CHORUS_SUCCESS;
}

chorus_result comm_open_transport(chorus_comm_t *c) {
  char err[1024] = "", listen_addr[sizeof(c->sock_listen)];
  const char *name = comm_provider_choice(c);
  const char *job_id = c->set.job_token[0] ? c->set.job_token : "chorus";
  prov_config_t cfg = {.name = name,
                       .rank = c->rank,
                       .nranks = c->size,
                       .job_id = job_id,
                       .inproc_world = c->local ? c->local->world : NULL,
                       .host_of = c->topo ? c->topo->host_of : NULL,
                       .shm_bounce = comm_shm_bounce(c),
                       .iface = c->set.sock_iface,
                       .sock_addr = listen_addr,
                       .log = comm_prov_log,
                       .log_arg = c,
                       .sock_sndbuf = c->set.sock_sndbuf};
  sock_listen_addr(c, listen_addr, sizeof(listen_addr));
  snprintf(c->sock_listen, sizeof(c->sock_listen), "%s", listen_addr);
  if (c->set.faults[0]) {
    chorus_result ret = comm_faults_load(c);
    if (ret)
      return ret;
    /* the sequence field of exec_tag(): collective numbers in tags */
    cfg.faults = c->set.faults;
    cfg.fault_tag_seq_shift = 24;
    cfg.fault_tag_seq_bits = 16;
    eng_log(ENG_WARN, c->rank, "fault", "fault injection on: %s", c->set.faults);
  }
  int rc = prov_open(&cfg, &c->prov, err, sizeof(err));
  if (rc)
    return comm_error(c, CHORUS_ERR_TRANSPORT, "opening transport '%s' failed: %s", name, err);
  return CHORUS_SUCCESS;
}

chorus_result comm_pack_endpoint(chorus_comm_t *c, const char *host, uint8_t **out,
                                 size_t *outlen) {
  uint8_t addr[2048];
  size_t alen = sizeof(addr);
  int rc;

  *out = NULL;
  *outlen = 0;
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
  *out = packed;
  *outlen = plen;
  return CHORUS_SUCCESS;
}

/* The CHORUS_TOPO part of a record's host field ("identity|spec"). */
static const char *record_topo(const char *host) {
  const char *bar = host ? strchr(host, '|') : NULL;
  return bar ? bar + 1 : "";
}

chorus_result comm_add_peer_records(chorus_comm_t *c, void *const *recs, const size_t *lens,
                                    const int *members, bool check_topo) {
  const void **addrs = NULL;
  size_t *alens = NULL;
  Chorus__Ep__Endpoint **eps = NULL;
  chorus_result ret = CHORUS_SUCCESS;
  int rc;

  eps = calloc((size_t)c->size, sizeof(*eps));
  addrs = calloc((size_t)c->size, sizeof(*addrs));
  alens = calloc((size_t)c->size, sizeof(*alens));
  if (!eps || !addrs || !alens) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  const char *my_topo = "";
  for (int i = 0; i < c->size; i++) {
    int k = members ? members[i] : i;
    if (lens[k] == 0) {
      ret = comm_error(c, CHORUS_ERR_TRANSPORT, "rank %d could not open its transport", i);
      goto out;
    }
    eps[i] = chorus__ep__endpoint__unpack(NULL, lens[k], recs[k]);
    if (!eps[i] || eps[i]->rank != (uint32_t)i) {
      ret = comm_error(c, CHORUS_ERR_BOOTSTRAP, "malformed endpoint record from rank %d", i);
      goto out;
    }
    if (i == c->rank)
      my_topo = record_topo(eps[i]->host);
  }
  for (int i = 0; i < c->size; i++) {
    if (check_topo && strcmp(record_topo(eps[i]->host), my_topo) != 0) {
      ret = comm_error(c, CHORUS_ERR_ENV,
                       "rank %d runs with CHORUS_TOPO=\"%s\" but rank %d with \"%s\": set the "
                       "same CHORUS_TOPO on every rank",
                       i, record_topo(eps[i]->host), c->rank, my_topo);
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
  if (rc) {
    ret = comm_error(c, CHORUS_ERR_TRANSPORT,
                     "transport %s: inserting peer addresses failed: %s (%s)", c->prov->name,
                     strerror(-rc), c->prov->last_error);
    goto out;
  }
  /* every rank comes here: the peers' names (shm's /dev/shm files) go now */
  rc = c->prov->ops->settle ? c->prov->ops->settle(c->prov, c->set.connect_timeout_s) : 0;
  if (rc)
    ret = comm_error(c, rc == -ETIMEDOUT ? CHORUS_ERR_TIMEOUT : CHORUS_ERR_PEER_LOST,
                     "transport %s: waiting for the peers to map this rank's shared memory: %s",
                     c->prov->name, c->prov->last_error);
out:
  if (eps)
    for (int i = 0; i < c->size; i++)
      if (eps[i])
        chorus__ep__endpoint__free_unpacked(eps[i], NULL);
  free(eps);
  free(addrs);
  free(alens);
  return ret;
}

/* Publish our endpoint, learn everyone's, insert them into the transport. */
static chorus_result exchange_endpoints(chorus_comm_t *c, const char *host) {
  char id[512];
  uint8_t *packed;
  size_t plen;
  void **ptrs = NULL;
  size_t *lens = NULL;
  chorus_result ret;

  snprintf(id, sizeof(id), "%s|%s", host, c->set.topo);
  if ((ret = comm_pack_endpoint(c, id, &packed, &plen)))
    return ret;
  ret = comm_allgather(c, packed, plen, &ptrs, &lens, c->set.connect_timeout_s);
  free(packed);
  if (ret)
    return ret;
  ret = comm_add_peer_records(c, ptrs, lens, NULL, true);
  free(ptrs);
  free(lens);
  return ret;
}

chorus_result comm_start(chorus_comm_t *c) {
  int rc;

  c->ex.prov = c->prov;
  c->ex.rank = c->rank;
  c->ex.comm_id = 0;
  c->ex.scratch_keep = c->set.buffsize;
  c->ex.trace = c->set.trace;
  c->ex.checksum = c->set.checksum;
  /* the transport holds pm a direction; one a peer is kept for the pairs'
   * oldest messages, which go past the budget (exec.h) */
  size_t pm = c->prov->ops->max_posted(c->prov);
  size_t total = c->set.max_posted < pm ? c->set.max_posted : pm;
  size_t keep = (size_t)(c->size - 1) < total / 2 ? (size_t)(c->size - 1) : total / 2;
  c->ex.max_posted = total - keep ? total - keep : 1;
  if ((rc = exec_ctx_set_peers(&c->ex, c->size)))
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory for the posting budget");
  if ((rc = comm_progress_start(c)))
    return comm_error(c, CHORUS_ERR_INTERNAL, "starting the progress thread failed: %s",
                      strerror(-rc));
  return CHORUS_SUCCESS;
}

static chorus_result comm_setup(chorus_comm_t *c, const char *host) {
  chorus_result ret;

  if ((ret = comm_topo_init(c)) || (ret = comm_open_transport(c)) ||
      (ret = comm_create_faults(c, 2)) || (ret = exchange_endpoints(c, host)) ||
      (ret = comm_create_faults(c, 3)))
    return ret;
  return comm_start(c);
}

chorus_result comm_register(chorus_comm_t *c) {
  chorus_result ret = coll_comm_init(c);
  if (ret)
    return ret;
  if (c->home_cpu >= 0) /* the creation's waits left it where the kernel put it */
    comm_go_home(c);
  if (eng_handle_add(c, ENG_HANDLE_COMM))
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "out of memory");
  return CHORUS_SUCCESS;
}

chorus_result comm_init_with(chorus_comm_t **comm, const comm_init_t *in) {
  const char *who = in->who;
  char err[1024];
  char host[256];
  chorus_comm_t *c;
  chorus_result ret;
  int rc, lfd = in->has_listen_fd ? in->listen_fd : -1;

  if (!comm) {
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "%s: comm is NULL", who);
    goto out_close_listener;
  }
  *comm = NULL;
  if (in->size < 1 || in->size > 32767) {
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "%s: size %d out of range [1, 32767]", who, in->size);
    goto out_close_listener;
  }
  if (in->rank < 0 || in->rank >= in->size) {
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "%s: rank %d out of range [0, %d)", who, in->rank,
                    in->size);
    goto out_close_listener;
  }
  if (!in->rendezvous || !*in->rendezvous || !strchr(in->rendezvous, ':')) {
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "%s: rendezvous must be \"host:port\", got %s%s%s", who,
                    in->rendezvous ? "\"" : "", in->rendezvous ? in->rendezvous : "NULL",
                    in->rendezvous ? "\"" : "");
    goto out_close_listener;
  }
  if (!(c = comm_alloc(in->rank, in->size))) {
    ret = eng_error(CHORUS_ERR_NO_MEMORY, "%s: out of memory", who);
    goto out_close_listener;
  }
  if (settings_load(&c->set, err, sizeof(err))) {
    ret = eng_error(CHORUS_ERR_ENV, "rank %d: %s", in->rank, err);
    goto out_free;
  }
  if (in->timeout_s > 0)
    c->set.timeout_s = in->timeout_s;
  if (in->connect_timeout_s > 0)
    c->set.connect_timeout_s = in->connect_timeout_s;
  global_init(&c->set);
  boot_host_identity(host, sizeof(host));
  boot_config_t bc = {.rank = in->rank,
                      .size = in->size,
                      .rendezvous = in->rendezvous,
                      .token = in->token ? in->token : c->set.job_token,
                      .timeout_s = c->set.connect_timeout_s,
                      .watch_tick_s = c->set.trace ? c->set.watchdog_ms / 1000.0 : 0,
                      .watch_timeout_s = c->set.timeout_s,
                      .watch_peer_timeout_s = c->set.peer_timeout_s,
                      .has_listen_fd = lfd >= 0,
                      .listen_fd = lfd};
  lfd = -1; /* boot_open's from here on */
  rc = boot_open(&bc, &c->boot, err, sizeof(err));
  if (rc) {
    ret = eng_error((chorus_result)rc, "rank %d: %s", in->rank, err);
    goto out_free;
  }
  if ((ret = comm_create_faults(c, 1)) || (ret = comm_setup(c, host))) {
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  if ((ret = comm_register(c))) {
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  if ((ret = watch_start(c)) || (ret = comm_create_faults(c, 4))) {
    eng_handle_remove(c);
    eng_error(ret, "%s", c->last_error);
    goto out_free;
  }
  eng_log(ENG_INFO, in->rank, "comm", "ready: %d ranks over %s", in->size, c->prov->name);
  *comm = c;
  return CHORUS_SUCCESS;

out_free:
  comm_free(c);
out_close_listener:
  if (lfd >= 0)
    close(lfd);
  return ret;
}

CHORUS_API chorus_result chorus_comm_init(chorus_comm_t **comm, int rank, int size,
                                          const char *rendezvous) {
  comm_init_t in = {
      .who = "chorus_comm_init", .rank = rank, .size = size, .rendezvous = rendezvous};

  return comm_init_with(comm, &in);
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
  atomic_store(&comm->ckpt.destroying, true);
  watch_notify_leaving(comm->watch);
  coll_comm_drop_queued(comm);
  /* Wait for what is still running: every rank issued the same calls (or
   * the communicator failed, and the executor fails them). */
  for (chorus_request_t *r = comm->live; r; r = r->next_live) {
    pthread_mutex_lock(&comm->lock);
    comm->waiters++;
    while (!atomic_load(&r->done))
      pthread_cond_wait(&comm->cond, &comm->lock);
    comm->waiters--;
    pthread_mutex_unlock(&comm->lock);
  }
  /* Nobody may close while a peer still reads from or writes to it. After
   * a failure peers may be gone or elsewhere: no rendezvous then (a peer
   * already in it fails at once: the server sees us leave). The threads of
   * an in-process job are all there: they always meet. */
  bool failed = atomic_load(&comm->async_rc) || atomic_load(&comm->failed_any);
  if (comm->size > 1 && (comm->local || !failed)) {
    void **ptrs = NULL;
    size_t *lens = NULL;
    if (comm_allgather(comm, "", 0, &ptrs, &lens, comm->set.connect_timeout_s) == 0) {
      free(ptrs);
      free(lens);
    } else if (comm->watch && watch_await_verdict(comm->watch, 2.0)) {
      /* peers left without meeting because the communicator failed while
       * this rank was done with its calls: that failure is reported (the
       * async error), this destroy did its part */
      eng_log(ENG_INFO, comm->rank, "comm", "destroy: the peers left after a failure: %s",
              comm->last_error);
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
