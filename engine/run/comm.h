/*
 * comm.h - the communicator and its requests (engine-private).
 */
#ifndef CHORUS_COMM_H
#define CHORUS_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "algos/algos.h"
#include "bootstrap.h"
#include "ckpt.h"
#include "chorus.h"
#include "exec.h"
#include "plan.h"
#include "prov.h"
#include "select.h"
#include "settings.h"

struct event_base;
struct event;

#define COMM_PLAN_CACHE 16

/* A compiled plan and the shape it was compiled for (coll.c). */
typedef struct comm_plan_slot {
  plan_t *plan;
  int coll;                /* coll_kind */
  const algo_desc_t *algo; /* NULL: the empty plan of a call with nothing to move */
  size_t count;
  chorus_dtype dtype;
  chorus_op op;
  int root;
  bool inplace;
  bool own_placed;
  size_t chunk_bytes;
  size_t *mcounts;  /* fused allreduce: its counts (owned), else NULL */
  int nmulti;       /* fused allreduce: number of buffers, else 0 */
  size_t extent[2]; /* bytes of BUF_SEND / BUF_RECV the plan reaches */
  unsigned refs;    /* requests using it (application thread only) */
  uint64_t last_use;
} comm_plan_slot_t;

typedef struct eng_local_job eng_local_job_t;

struct chorus_request {
  chorus_comm_t *comm;
  comm_plan_slot_t *slot; /* cached plan in use, or NULL when plan is owned */
  plan_t *plan;
  const void *sendbuf;
  void *recvbuf;
  void **xbufs;      /* fused allreduce: the user's buffers, plan->nxbufs (owned table) */
  void *tmp;         /* engine-owned stand-in for a buffer this rank ignores (owned) */
  uint32_t msg_or;   /* or'ed into message numbers: EXEC_MSG_P2P for send/recv */
  uint16_t seq;      /* tag sequence: the collective's, or the per-peer p2p counter */
  uint64_t call_seq; /* the communicator's call number (from 1); 0 for send/recv */
  uint64_t fp;       /* fingerprint its messages carry (ckpt.h); 0: none */
  uint64_t count;    /* as called, for messages */
  chorus_request_t *next_parked; /* failed by the transport, waiting for the verdict */
  chorus_result park_rc;         /* parked: the failure if no verdict comes */
  char *park_why;                /* and its explanation (owned), or NULL */
  bool internal;                 /* a round of the engine's own that runs on a failed comm */
  bool recovery;                 /* internal: tags in the EXEC_COMM_RECOVERY space */
  uint8_t coll;                  /* coll_kind, for messages */
  int32_t peer;                  /* send/recv: the peer (the watchdog's wait-for graph) */
  bool submitted;                /* handed to the progress thread (false while queued in a group) */
  bool grouped; /* a blocking call queued in a group: chorus_group_end releases it */
  bool staged;  /* sends from comm->stage (coll.c, "Staging"); released with the request */
  bool bounce;  /* its sends bounce whatever the memory (coll.c, "Staging") */
  bool handle;  /* a handle (eng_handle_add): it reaches the caller; a blocking call's does not */
  atomic_int done;
  chorus_result result;
  chorus_request_t *next_cmd;              /* command queue link */
  chorus_request_t *prev_live, *next_live; /* comm's list of unreleased requests */
};

struct chorus_comm {
  int rank, size;
  chorus_settings_t set;
  boot_t *boot;           /* NULL for an in-process job */
  eng_local_job_t *local; /* in-process job, or NULL */
  prov_t *prov;
  /* where sock listens when no interface is named (comm_open_transport):
   * 127.0.0.1 or the address this rank reached the rendezvous from; a
   * child of chorus_comm_split, which has no rendezvous, takes its parent's */
  char sock_listen[48];
  exec_ctx_t ex;    /* under prog_lock: the progress thread or a waiting caller */
  topo_t *topo;     /* hosts of the ranks (topo.c); NULL until known = one host */
  plan_t *ctl_plan; /* xgather.c: the control exchange's plan, kept until comm_free
                       (a run reads its plan until after it completes) */

  /* progress thread */
  pthread_t thread;
  bool thread_started;
  atomic_int prog_tid; /* the progress thread's kernel thread id, once it runs (tests, gdb) */
  struct event_base *base;
  struct event *ev_cmd, *ev_wait, *ev_timer;
  int cmd_fd; /* eventfd: wakes the progress thread */
  atomic_int cmd_pending;
  atomic_int sleeping;
  /* Whoever drives the transport and the executor holds prog_lock: the
   * progress thread while awake, or an application thread waiting in
   * chorus_wait (caller-driven progress: no hand-off, no wake-up). */
  pthread_mutex_t prog_lock;
  bool armed; /* under prog_lock: the transport is armed for a sleeper */
  /* Application threads inside comm_drive. While there is one, the progress
   * thread steps aside: it sleeps on its eventfd and timer only (`aside`),
   * not on the transport, so that it neither takes prog_lock from the
   * waiting thread nor wakes for the traffic that thread is reading. Left
   * alone, the two took turns: the progress thread ran each call while the
   * application thread yielded, a context switch per call, which made small
   * calls several times slower on cores shared by ranks. Nor does a progress thread that wakes
   * while there is one wait on prog_lock (progress_relock): it steps aside the same way
   * (`sleeping` and `aside` set without the lock; the last driver out kicks
   * it when it leaves work in flight). */
  atomic_int drivers;
  atomic_int aside;
  atomic_int handoff; /* a driver left work in flight for the progress thread */
  atomic_int stop;

  /* shared between application and progress threads, under lock */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int waiters;
  chorus_request_t *cmd_head, *cmd_tail;
  char last_error[1024];

  /* Failure of the communicator as a whole (a verdict of the watchdog, a
   * mismatch, an abort): set once, by any thread; every pending call then
   * fails with it and every later one at once. async_text under lock. */
  atomic_int async_rc;
  atomic_int abort_pending; /* the executor still has to fail its runs */
  char async_text[1024];
  ckpt_t ckpt;            /* where each call stands (ckpt.h) */
  atomic_bool failed_any; /* some call failed: destroy does not wait for peers */
  /* under prog_lock: runs the transport failed (a peer's endpoint closed)
   * wait up to COMM_PARK_NS for the watchdog's verdict, which explains
   * them better (the peer died, diverged...) */
  chorus_request_t *parked;
  uint64_t parked_until;
  bool *lost;            /* [size], under lock: ranks the watchdog's verdict declared lost */
  uint16_t recovery_seq; /* application thread: shrink rounds so far */
  struct watch *watch;   /* heartbeat client (watch.c); NULL when none */
  struct watch_bell *watch_bell; /* its doorbell (below), which comm_fail rings */
  struct fault_plan *faults;     /* CHORUS_FAULTS, parsed: call faults (kill, stall) */
  int64_t clock_offset_ns;       /* add to our CLOCK_MONOTONIC: rank 0's clock */
  /* An injected stall (fault injection, tests): until then the progress
   * engine does nothing, so the rank looks frozen to its peers. */
  _Atomic uint64_t stall_until_ns;
  char stall_why[96];
  _Atomic uint64_t unwedge_after; /* comm_unwedge's next look, at the earliest */

  /* application thread */
  uint64_t seq; /* calls begun (collectives and internal rounds); tags carry its low 16 bits */
  uint64_t uses;
  comm_plan_slot_t plans[COMM_PLAN_CACHE];
  chorus_request_t *live;      /* requests not yet released */
  chorus_request_t *spare_req; /* the last one released, for the next call */
  select_ctx_t sel;            /* algorithm selection (coll.c) */
  /* the last selections, so that a repeated call skips the cost model */
  struct comm_sel_memo {
    const algo_desc_t *d; /* NULL: empty */
    int coll, dtype, op, root;
    bool inplace;
    size_t count, chunk_bytes;
  } sel_memo[16];
  unsigned sel_memo_next;
  bool sel_ready;
  uint64_t yield_after_ns; /* a driver idle this long starts yielding (COMM_YIELD_AFTER_NS) */
  uint64_t start_drive_ns; /* a small nonblocking call's caller drives it this long (coll.c) */
  int home_cpu;            /* this rank's own CPU (COMM_HOME_EVERY_NS), -1 for none */
  /* Families (watch.c): a communicator with a watchdog heads one (family: a
   * key unique in the process, sub_id 0); chorus_comm_split's children join
   * their parent's (sub_id: the same on every member; world_of[r]: the
   * head's rank of rank r here), so that the head's watchdog sees where
   * they wait and passes its verdicts on to them. 0: in no family. */
  uint64_t family, sub_id;
  uint32_t *world_of;           /* uint32_t: it goes into the head's beats as it is */
  atomic_uint nsplits;          /* splits made of this one: part of each child's sub_id */
  _Atomic uint64_t home_after;  /* no look at the CPU before then (fsm_now_ns; comm_home_due) */
  _Atomic uint64_t home_looks;  /* looks at the CPU a caller runs on (tests) */
  _Atomic uint64_t home_moves;  /* moves made (tests) */
  size_t chunk_bytes;           /* pipeline chunk of this communicator's plans (coll.c) */
  size_t bcast_chunk_bytes;     /* that of broadcasts (coll.c) */
  size_t allgather_chunk_bytes; /* that of allgathers (coll.c) */
  size_t allgather_chunks;      /* if not 0, allgather chunks grow to a block / this (coll.c) */
  void *stage;                  /* mappable staging buffer (coll.c, "Staging"), or NULL */
  size_t stage_bytes;           /* its size */
  bool stage_busy;              /* a live request runs in it */
  bool stage_shm;               /* every peer on this host, over shm (coll.c, "Staging") */
  size_t shm_bounce;            /* comm_shm_bounce(), kept by coll_comm_init */
  int per_core; /* coll_ranks_per_core(), kept by coll_comm_init; > 1: they outnumber the cores */
  char last_algo[32]; /* chorus_comm_last_algorithm */
  const algo_desc_t *last_algo_d;
  uint16_t *p2p_seq; /* [2*size]: next send to peer p at 2p, next receive from p at 2p+1 */
};

/* Record a failure on comm (any thread); returns rc. */
chorus_result comm_error(chorus_comm_t *c, chorus_result rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* In-process jobs: every rank a thread of this process, over prov_inproc. */
eng_local_job_t *eng_local_job_create(int nranks);
void eng_local_job_destroy(eng_local_job_t *job);
chorus_result eng_comm_init_local(eng_local_job_t *job, int rank, chorus_comm_t **out);
/* A job for the communicators chorus_comm_split makes in an in-process job:
 * each of its nranks communicators holds it, the last destroyed frees it. */
eng_local_job_t *eng_local_job_create_shared(int nranks);

/* Creation, in pieces (comm.c), shared with chorus_comm_split (split.c):
 * alloc; set topo, set, local; open the transport; pack this rank's
 * endpoint record and insert the peers' (child rank i's record is
 * recs[members[i]], or recs[i] without members; check_topo: refuse records
 * made under another CHORUS_TOPO); start the progress thread; register.
 * comm_free undoes whatever was done. */
/* What creating a communicator over a rendezvous takes (chorus_comm_init,
 * chorus_comm_init_rank). */
typedef struct comm_init {
  const char *who; /* the API call, for messages */
  int rank, size;
  const char *rendezvous; /* "host:port" */
  const char *token;      /* NULL: CHORUS_JOB_TOKEN */
  bool has_listen_fd;     /* rank 0 serves on listen_fd (comm_init_with owns it) */
  int listen_fd;
  double timeout_s;         /* > 0: overrides CHORUS_TIMEOUT */
  double connect_timeout_s; /* > 0: overrides CHORUS_CONNECT_TIMEOUT */
} comm_init_t;
chorus_result comm_init_with(chorus_comm_t **comm, const comm_init_t *in);
chorus_comm_t *comm_alloc(int rank, int size);
void comm_free(chorus_comm_t *c);
chorus_result comm_open_transport(chorus_comm_t *c);
/* The transport c runs on, by name: CHORUS_PROVIDER, or chosen by
 * topology (run.c). */
const char *comm_provider_choice(const chorus_comm_t *c);
/* Starts and stops c's progress thread and its event base (run.c):
 * comm_start, comm_free. comm_progress_start returns 0 or -errno. */
int comm_progress_start(chorus_comm_t *c);
void comm_progress_stop(chorus_comm_t *c);
/* Ranks on one host talk through a network provider (CHORUS_PROVIDER=tcp,
 * udp, ...), not shared memory. */
bool comm_intra_network(const chorus_comm_t *c);
/* Every peer is on this host and talks over shm (coll.c: staging). */
bool comm_shm_only(const chorus_comm_t *c);
/* Every rank talks to every other over the sock transport. */
bool comm_all_sock(const chorus_comm_t *c);
/* The largest message shm copies through a bounce slot for this
 * communicator (prov_config_t.shm_bounce; PROV_BOUNCE_NONE: none; coll.c). A system
 * call: calls read c->shm_bounce. */
size_t comm_shm_bounce(const chorus_comm_t *c);
chorus_result comm_pack_endpoint(chorus_comm_t *c, const char *host, uint8_t **out, size_t *outlen);
chorus_result comm_add_peer_records(chorus_comm_t *c, void *const *recs, const size_t *lens,
                                    const int *members, bool check_topo);
chorus_result comm_start(chorus_comm_t *c);
chorus_result comm_register(chorus_comm_t *c);
/* Everyone contributes len bytes; same contract as boot_allgather (free
 * *ptrs and *lens). Over the bootstrap, the in-process job, or for
 * communicators made by split, over their own transport
 * (comm_xport_allgather: needs the progress thread). Application
 * thread; collective over c. */
chorus_result comm_allgather(chorus_comm_t *c, const void *mine, size_t len, void ***ptrs,
                             size_t **lens, double timeout_s);
/* The same over c's own transport (xgather.c); alive: the ranks taking
 * part (chorus_comm_shrink's survivors, with tags of their own), NULL: all. */
chorus_result comm_xport_allgather(chorus_comm_t *c, const bool *alive, const void *mine,
                                   size_t len, void ***ptrs, size_t **lens);

/* The watchdog thread's doorbell (watch.c): what it is asked to do, and
 * the eventfd it polls. Here, so that comm_fail rings it from below the
 * watchdog (watch_bell_ring, run.c; any thread, not a signal handler). */
enum {
  WATCH_REQ_STOP = 1,
  WATCH_REQ_FAIL = 2, /* the communicator failed here: tell the judge now */
  WATCH_REQ_DUMP = 4,
  WATCH_REQ_FATAL = 8,
  WATCH_REQ_BEAT = 16
};
typedef struct watch_bell {
  atomic_int req;
  int efd;
  int rank; /* for the log */
} watch_bell_t;
void watch_bell_ring(watch_bell_t *b, int bit);

/* The communicator fails as a whole (any thread): the first failure wins;
 * pending runs are failed with rc by the executor, later calls fail at
 * once, text becomes their message. Returns the code in force. */
chorus_result comm_fail(chorus_comm_t *c, chorus_result rc, const char *text);
/* The ranks a verdict declared lost (watch.c; any thread). */
void comm_note_lost(chorus_comm_t *c, const uint32_t *lost, size_t n);
/* Once c failed: frees what a process killed inside the transport left
 * taken, on which a thread of ours may spin for good (prov_ops_t.unwedge).
 * From any thread outside the transport; at most every few hundred ms
 * unless `now`. */
void comm_unwedge(chorus_comm_t *c, bool now);
/* Freezes c's progress engine for `seconds` (fault injection; any thread). */
void comm_stall(chorus_comm_t *c, double seconds, const char *why);
/* Kills this process where CHORUS_FAULTS says (`where`, for the log). */
void comm_fault_kill(const chorus_comm_t *c, const char *where);

/* Hands a request to the progress thread (run.c). With wake, the caller
 * starts it, driving it for up to drive_ns (0: one round that posts its
 * first messages), and a sleeping progress thread is armed or woken for
 * what is left. */
void comm_submit(chorus_comm_t *c, chorus_request_t *req, bool wake, uint64_t drive_ns);

/* Collectives (coll.c). coll_comm_init sets up selection (CHORUS_ERR_ENV
 * with a message on a bad CHORUS_ALGO) and the point-to-point counters;
 * coll_comm_fini frees plans, requests and selection state (safe on a
 * communicator coll_comm_init never saw); coll_comm_drop_queued fails the
 * requests of c still queued in this thread's open group (destroy). */
chorus_result coll_comm_init(chorus_comm_t *c);
/* The pipeline chunk of a call of kind coll (coll_kind) whose block (an
 * allgather's: what each rank gives) is `block` bytes (coll.c). */
size_t coll_call_chunk(const chorus_comm_t *c, int coll, size_t block);
/* Ranks on this rank's machine per core it may run on, rounded up; 1 when
 * they do not outnumber the cores (selection, chunking, shm bouncing). */
int coll_ranks_per_core(const chorus_comm_t *c);
void coll_comm_fini(chorus_comm_t *c);
void coll_comm_drop_queued(chorus_comm_t *c);
/* Test hook: replace c's algorithm overrides, same syntax as CHORUS_ALGO
 * ("" = the cost model). CHORUS_ERR_ENV with a message on a bad spec (the
 * old overrides stay). Application thread, nothing in flight required. */
chorus_result eng_comm_set_algo(chorus_comm_t *c, const char *spec);

/* Caller-driven progress: drives the communicator from this thread, when
 * the progress thread is not busy doing it, until *flag is set, or nothing
 * moved for idle_ns, or after max_rounds rounds (0: no limit). Returns with
 * the transport as it found it (armed for a sleeping progress thread, or
 * that thread woken). */
void comm_drive(chorus_comm_t *c, atomic_int *flag, uint64_t idle_ns, unsigned max_rounds);
/* A driver that has polled idle for COMM_YIELD_AFTER_NS starts yielding the
 * core (every 16 idle rounds, COMM_YIELD_EVERY_MASK), when the
 * communicator's ranks on this host do not outnumber its cores; with more,
 * from the start and after every idle round. A yield is a
 * system call that a waiter on a core of its own only pays for: a message
 * over shm is answered within microseconds. */
#define COMM_YIELD_AFTER_NS (5 * 1000)
#define COMM_YIELD_EVERY_MASK 15u
/* Own cores (CHORUS_SPREAD_CORES). When a host's ranks fit its cores, local
 * rank i's own CPU is the i-th of its affinity mask at creation; the thread
 * that creates the communicator, and a driver that waits (idle rounds, or
 * spinning while the progress thread holds prog_lock), move back to it when
 * they find themselves elsewhere, the driver at most every
 * COMM_HOME_EVERY_NS (run.c: comm_go_home, comm_home_due). Left to itself the kernel
 * may put both ranks of a job on one core while they connect (perf sched
 * shows them switching to each other thousands of times a second, the
 * other core idle) and keep them there into the first calls, each wait
 * then costing the peer's turn. The threads move a few times a run at most. */
#define COMM_HOME_EVERY_NS (10 * 1000 * 1000)
/* home_cpu before coll_comm_init picks it: a split or a shrink copies its
 * parent's instead, since a child's local ranks are numbered afresh (ranks
 * 0 and 2 of a 4-rank host would both be first in their halves). */
#define COMM_HOME_UNSET (-2)
/* Moves the calling thread to c->home_cpu if it is elsewhere (run.c). */
void comm_go_home(chorus_comm_t *c);
/* Whether a driver idle for idle_ns yields now. */
bool comm_yield_due(const chorus_comm_t *c, uint64_t idle_ns);

/*
 * How long a polling loop (comm_drive) has waited, counted while it runs: a
 * gap of more than IDLE_CLOCK_GAP_NS between two looks at the clock is time
 * the thread spent off its core (ranks outnumber the cores, or the kernel
 * put two on one), not waiting. By the wall clock alone, a rank sharing a
 * core with its peer reached the limit within one time slice and slept; its
 * wakeups then came on the waker's core and the pair stayed there, sleeping
 * and waking, for seconds (hundreds of voluntary context switches where a
 * fast run has none). The wall clock still bounds it: IDLE_CLOCK_WALL times the
 * limit, so a waiter that keeps losing its core to other work sleeps too.
 */
#define IDLE_CLOCK_GAP_NS 200000
#define IDLE_CLOCK_WALL 16
typedef struct {
  uint64_t first, last, spent;
} idle_clock_t;
/* Records a look at the clock (now, ns); true once the loop has waited more
 * than limit ns by the above. Start from (idle_clock_t){0}. */
bool idle_clock_over(idle_clock_t *ic, uint64_t now, uint64_t limit);

/* Requests: completed and released in run.c, waited on in request.c. */
void request_complete(chorus_request_t *req, chorus_result rc);
/* Same, with the failure's explanation (NULL: the communicator's own
 * failure if it is the cause, else a generic line). */
void request_complete_text(chorus_request_t *req, chorus_result rc, const char *why);
void request_release(chorus_request_t *req);
/* Blocks until req is done: spins for CHORUS_SPIN_US, then sleeps. */
void request_wait_done(chorus_request_t *req);

#endif
