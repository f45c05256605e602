/*
 * prov.h - the transport interface: one ops table, several implementations.
 *
 *   prov_ofi     libfabric RDM endpoint with tagged messages (shm, tcp, udp,
 *                sockets, verbs...), chosen by name.
 *   prov_sock    tagged messages over plain TCP sockets, one connection per
 *                pair of ranks ("sock"; Chorus's own, faster than tcp;ofi_rxm).
 *   prov_inproc  every rank inside one process (unit tests, simulation).
 *   prov_multi   two of them side by side, routed per peer: shm inside a
 *                host, a network provider between hosts ("shm+tcp").
 *   prov_fault   a wrapper around any of them that injects faults from a
 *                spec (cfg->faults; see "Fault injection" below).
 *
 * Model
 *  - A transport instance is one endpoint of one rank. Peers are numbered
 *    0..n-1 (ranks) after add_peers().
 *  - Messages are tagged (64 bits; bit 63 is reserved for the transports'
 *    own messages and must be 0). A receive names the source peer and the
 *    tag; a message matches only a receive with the same source and tag.
 *    Messages between one pair with distinct tags may complete in any order.
 *  - Operations complete asynchronously: the caller embeds a prov_op in its
 *    own object and gets its `done` callback, from inside progress(), with
 *    status 0 or a negative errno-style code (-ECANCELED after cancel).
 *  - Nothing is thread safe: one thread (the owner's progress thread) calls
 *    every op of an instance. Callbacks may post new operations.
 *  - A send carries 63 bits of immediate data (prov_op.data) that its
 *    receive gets back (libfabric remote CQ data); a transport that can not
 *    carry it leaves the receive's data 0 (not PROV_DATA_VALID).
 *  - post_send/post_recv return 0, or -EAGAIN when the provider's queues are
 *    full (drive progress() and retry), or another negative error.
 *
 * Waiting without spinning
 *  progress() never blocks. To sleep, the owner calls arm(): it returns 0
 *  when it is safe to sleep until wait_fd() becomes readable (or a timer
 *  fires), or -EAGAIN when completions are pending (call progress() again).
 *  After waking, the owner calls disarm(). wait_fd() may be -1, meaning the
 *  provider can not wake the owner: sleep on a timer only, with backoff.
 *
 * Fault injection (prov_fault, fault.h)
 *  prov_open() wraps the named provider in prov_fault when cfg->faults is
 *  not empty (the result is named "fault(CHILD)"). The spec is a list of
 *  rules separated by ';', each `kind:key=val,key=val` (whitespace around
 *  tokens is allowed; at most 64 rules and 4096 bytes):
 *
 *    seed=7;drop:p=0.01;delay:ms=50,p=0.1;dup:p=0.01;reorder:p=0.05;
 *    corrupt:p=0.001;kill:rank=3,at=allreduce#100;stall:rank=1,at=#40,s=30
 *
 *  Kinds acting on sends (receives pass through):
 *    drop     the send completes for the caller; nothing is sent.
 *    delay    ms=M: the send is held M milliseconds, then posted.
 *    dup      the message goes twice (the copy from a private copy of the
 *             payload; the caller's op completes once).
 *    reorder  the send is held until the caller's next send to that peer
 *             was handed on (then it follows it), 5 ms at most.
 *    corrupt  one bit (a deterministic position) of a private copy of the
 *             payload is flipped and the copy is sent.
 *  Kinds acting on calls, asked for by the engine at the start of each
 *  collective (fault_plan_on_call) and carried out by it:
 *    kill     rank=R,at=[KIND]#SEQ: the rank dies there.
 *    stall    rank=R,at=[KIND]#SEQ,s=S: it freezes for S seconds
 *             (prov_fault_stall: nothing delivered, nothing posted).
 *  and, with at=create#STAGE, while the rank forms a communicator (from a
 *  rendezvous): 1 joined it, 2 opened its transport, 3 inserted every
 *  peer's endpoint, 4 started its watchdog (engine/comm/comm.c).
 *  Targets, on any rule: rank=R (only when this rank sends), peer=P (only
 *  messages to P), at=#SEQ or at=KIND#SEQ (KIND: allreduce, bcast, ...,
 *  for kill and stall only), from=#SEQ and to=#SEQ (a range), n=N (at most
 *  N injections by this endpoint), p=X (chance per message or call, 0..1;
 *  1 when a target at=, from=, to= or n= is given, else required).
 *  Messages carry their collective's sequence number in the tag, at bits
 *  [cfg->fault_tag_seq_shift, + cfg->fault_tag_seq_bits) (0 bits: not known,
 *  and rules with at=, from= or to= never match a message); only those low
 *  bits are compared, and a rule's at=/from=/to= must fit in them.
 *  Each message meets the rules in spec order; the first that targets it,
 *  has injections left and whose draw is below p applies (one fault per
 *  message). A draw is a hash of (seed, rule index, sending rank,
 *  destination, tag, how many sends this endpoint made before with that
 *  destination and tag) - not of time: the same seed and program give the
 *  same faults. (Repeats are counted exactly within the last 16384 distinct
 *  destination and tag pairs; further apart a pair may count from 0 again.)
 *  Immediate data travels unchanged on every path. The wrapper's wait_fd()
 *  is an epoll set over the child's fd and a timer set by arm() to the
 *  earliest held send; -1 when the child has none. release() is there when
 *  the child has one. The per-provider introspection calls
 *  (prov_multi_stats, prov_ofi_rndv_stats, prov_sock_stats) take
 *  prov_fault_child(p).
 *  prov_fault_events() journals what was injected.
 */
#ifndef CHORUS_PROV_H
#define CHORUS_PROV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct prov prov_t;
typedef struct prov_op prov_op_t;

/* Completion callback: status 0 or -errno; len = bytes received/sent. */
typedef void (*prov_done_fn)(prov_op_t *op, int status, size_t len);

/* prov_op.flags, set by the caller before posting */
enum {
  /* A receive may complete without copying: when the data can be read where
   * the sender keeps it (a chorus_mem_alloc buffer of a peer on this host),
   * the provider sets `borrowed` to it instead of filling the receive
   * buffer, and holds the sender's operation open until release(). The
   * caller must release every borrowed op, soon and without waiting for
   * other messages (the sender waits). */
  PROV_OP_BORROW = 1u << 0,
  /* A send the user orders (point to point): where the provider bounds the
   * messages a peer has not yet asked for (shm's window), these get a
   * smaller share, so that a user's sends the peer will receive only after
   * a collective never leave that collective's messages without room. */
  PROV_OP_P2P = 1u << 1,
  /* A send the peer will never take (fault injection's duplicate): where
   * the provider bounds those messages, it goes only while that bound is
   * mostly free, and is refused with -ENOBUFS otherwise (lost, as a
   * network short of buffers would lose it), so that such copies never
   * hold the room real messages need. */
  PROV_OP_SPARE = 1u << 2,
  /* A send that goes through shm's bounce slots (up to shm_bounce bytes)
   * even from memory peers can map, which is otherwise read where it lies:
   * read in place, it holds its sender until the receiver is scheduled,
   * reads and acks. The engine sets it for small calls among ranks that
   * outnumber the cores (coll.c, "Staging"). */
  PROV_OP_BOUNCE = 1u << 3,
};

/* Embedded by the caller in its own object (container_of to get back). */
struct prov_op {
  prov_done_fn done;
  void *internal[4];    /* owned by the provider while the op is posted or borrowed */
  unsigned flags;       /* PROV_OP_*, in */
  const void *borrowed; /* out: NULL, or where a borrowed receive's data lies */
  /* Immediate data. Send, in: a value below 2^63 delivered with the message
   * (the engine's call fingerprint). Receive, out: PROV_DATA_VALID | the
   * sender's value when the transport carried it, else 0. */
  uint64_t data;
};
#define PROV_DATA_VALID (1ULL << 63)

/* Settings a transport is opened with. */
typedef struct prov_config {
  const char *name;   /* "shm", "tcp", "udp", "sockets", "verbs", "inproc"... */
  int rank;           /* this endpoint's rank */
  int nranks;         /* ranks in the job */
  const char *job_id; /* unique per job (e.g. the rendezvous token); for names */
  void *inproc_world; /* prov_inproc only: the shared world object */
  /* prov_multi only ("A+B"): host of each rank, host_of[nranks]; ranks on
   * this rank's host are reached over A, the others over B. */
  const int *host_of;
  /* shm: largest message from ordinary memory sent through a mappable
   * bounce slot (at most 256 KiB; the engine lowers it when ranks
   * outnumber cores). 0: the default, 64 KiB; PROV_BOUNCE_NONE: never. */
  size_t shm_bounce;
  /* sock: the network interface to listen on ("eth0", "lo"); NULL or "":
   * FI_TCP_IFACE when set, else sock_addr, else the first IPv4 interface
   * that is up and not loopback, else loopback. */
  const char *iface;
  /* sock: the IPv4 address to listen on when neither iface nor FI_TCP_IFACE
   * names an interface ("10.1.2.3"); NULL or "": none. The engine passes
   * 127.0.0.1 for a job on one host, else the address this rank reached
   * rank 0's rendezvous from. */
  const char *sock_addr;
  /* Where a transport reports, one line each, what it refused at the door
   * (a stranger on its listener: who, and why), at the default log level
   * and rate-limited by the transport; NULL: stderr. Called from the
   * thread that drives the instance. */
  void (*log)(void *log_arg, const char *line);
  void *log_arg;
  /* sock: SO_SNDBUF of a connection whose two ends are on one host, where
   * the kernel's TCP is a memory copy and less in flight stays in the
   * caches; 0: the kernel's autotuning (always so between hosts). */
  size_t sock_sndbuf;
  /* Fault injection: a spec (grammar above); NULL or "": none. */
  const char *faults;
  /* Where the collective sequence number lies in a tag, for the fault
   * rules' at=, from= and to=: bits [shift, shift + bits). The engine's
   * layout puts it at shift 24, 16 bits. bits 0: not known. */
  int fault_tag_seq_shift;
  int fault_tag_seq_bits;
} prov_config_t;
#define PROV_BOUNCE_NONE ((size_t)-1)

typedef struct prov_ops {
  size_t size; /* sizeof(prov_ops_t), for versioning */
  const char *name;
  /* Open an endpoint. On failure *out is NULL and a negative code returns;
   * a human-readable reason is written to errbuf (errlen bytes). */
  int (*open)(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen);
  /* This endpoint's address, opaque bytes to be exchanged between ranks.
   * *len in: buffer size; out: bytes used (-ENOSPC if too small). */
  int (*getname)(prov_t *p, void *addr, size_t *len);
  /* Insert all ranks' addresses; addrs[i] of lens[i] bytes is rank i. */
  int (*add_peers)(prov_t *p, const void *const *addrs, const size_t *lens, int n);
  int (*post_send)(prov_t *p, int peer, const void *buf, size_t len, uint64_t tag, prov_op_t *op);
  int (*post_recv)(prov_t *p, int peer, void *buf, size_t len, uint64_t tag, prov_op_t *op);
  /* Cancel a posted op; its callback then runs with -ECANCELED (or its real
   * status if it had already completed). */
  int (*cancel)(prov_t *p, prov_op_t *op);
  /* Drive the provider; runs callbacks. Returns completions delivered (>=0) or <0. */
  int (*progress)(prov_t *p);
  int (*wait_fd)(prov_t *p);
  int (*arm)(prov_t *p);
  void (*disarm)(prov_t *p);
  /* Largest number of receives / sends the caller should keep posted. */
  size_t (*max_posted)(prov_t *p);
  /* Cancels what is posted (callbacks run), then frees everything. */
  void (*close)(prov_t *p);
  /* Ends a borrowed receive (op->borrowed != NULL): the sender may go on.
   * NULL for providers that never borrow. */
  void (*release)(prov_t *p, prov_op_t *op);
  /* Removes what peers whose process has ended left behind on this host
   * (shm: their region in /dev/shm, which a killed process can not
   * unlink). Returns how many were removed. NULL: nothing to do. */
  int (*reap)(prov_t *p);
  /* Called on every rank of a job after add_peers succeeded everywhere
   * (the engine's creation; never from inside another rank's call): waits,
   * at most timeout_s, until every peer has taken in what it opens of ours
   * by name, then removes the names (shm: the regions in /dev/shm), so that
   * from here on nothing is left behind by a process that is killed.
   * Returns 0, or <0 with last_error set: -ECONNRESET, a peer ended or
   * closed first; -ETIMEDOUT. NULL: the transport names nothing. */
  int (*settle)(prov_t *p, double timeout_s);
  /* Sends what the endpoint still owes peers (queued messages) and delivers
   * the completions it holds, without looking for news from them (no
   * system call when nothing is queued): for a round that starts new work
   * or ends with none in flight. Returns completions delivered or <0.
   * NULL: progress does it. */
  int (*flush)(prov_t *p);
  /* The peer is lost (a verdict said so): everything posted with it
   * completes now with -ECANCELED, including a message half on the wire,
   * and nothing it sends later lands; posts to it fail from here on.
   * NULL: the transport's cancel already ends every operation. */
  int (*drop_peer)(prov_t *p, int peer);
  /* The communicator failed: frees what a process killed inside the
   * transport left taken and that holds up this one's threads for good
   * (libfabric 1.17 shm: a queue lock in shared memory). The only op called
   * from a thread outside the transport while another may be inside it.
   * Returns how many it freed. NULL: nothing of the kind. */
  int (*unwedge)(prov_t *p);
} prov_ops_t;

struct prov {
  const prov_ops_t *ops;
  const char *name; /* provider in use, e.g. "shm" or "tcp;ofi_rxm" */
  /* Detail of the latest failure seen by this instance (a failed post, an
   * error completion: which peer, tag and the provider's own words), "" if
   * none. Owned by the instance; read it right after the failure (e.g. from
   * the done callback that got status < 0) to log it. */
  const char *last_error;
};

/* Registry. */
extern const prov_ops_t prov_ofi_ops;
extern const prov_ops_t prov_inproc_ops;
extern const prov_ops_t prov_sock_ops;

extern const prov_ops_t prov_multi_ops;
extern const prov_ops_t prov_fault_ops;

/* Open by name: "inproc" -> prov_inproc, "sock" -> prov_sock, "A+B" (e.g.
 * "shm+tcp") -> prov_multi over A and B, anything else -> prov_ofi; any of them inside
 * prov_fault when cfg->faults is not empty (a bad spec: -EINVAL and the
 * parser's reason in errbuf). */
int prov_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen);

/* prov_multi: what went where, for logs and tests. child 0 is the
 * provider inside the host (A), child 1 the one between hosts (B). */
typedef struct prov_multi_stats {
  const char *child_name[2];        /* provider in use, or NULL when not opened */
  int child_nranks[2];              /* peers the child was opened for (0: not opened) */
  uint64_t sends[2], send_bytes[2]; /* sends posted on each child */
  uint64_t recvs[2];                /* receives posted on each child */
} prov_multi_stats_t;
/* Returns 0, or -EINVAL when p is not a prov_multi. */
int prov_multi_stats(prov_t *p, prov_multi_stats_t *out);
/* Which child carries traffic with peer (0 or 1), or -1 (bad peer or p). */
int prov_multi_route(prov_t *p, int peer);
/* Child `which` (0 or 1) of a prov_multi, for its own stats; NULL when p is
 * not a prov_multi or the child was not opened. */
prov_t *prov_multi_child(prov_t *p, int which);

/* prov_ofi's large-message (rendezvous) paths, for logs and tests: bytes
 * this endpoint received by CMA, by copying out of a peer's mapped
 * chorus_mem_alloc region, by lending that region to the caller
 * (PROV_OP_BORROW), and out of a peer's bounce slot (the sender copied a
 * plain buffer there first; copied or lent). Returns 0, or -EINVAL when p
 * is not a prov_ofi. */
typedef struct prov_ofi_rndv_stats {
  uint64_t cma_bytes, mapped_bytes, borrowed_bytes, bounce_bytes;
  /* bounced messages handed back by marking the sender's slot done in our
   * doorbell page instead of an ack message */
  uint64_t bounce_marks;
  /* rendezvous messages acked in our doorbell page's ring for their sender
   * instead of by an ack message */
  uint64_t ring_acks;
  /* bytes of our bounce region (0: none), and how far into a peer's we
   * read a bounced message (its furthest byte) */
  uint64_t bounce_region, bounce_reach;
  /* sends held back (-EAGAIN) because the peer had not yet taken the
   * window's worth of our earlier messages (prov_ofi.c, "the window") */
  uint64_t window_waits;
  /* times a sender read the peer's count of our messages it took (its
   * doorbell page's taken[]): only when the count it read last leaves the
   * window no room */
  uint64_t window_looks;
  /* rings we sent a sender held back by its window, when we took one of its
   * messages: only a sender that sleeps asks for them (arm()) */
  uint64_t window_rings;
} prov_ofi_rndv_stats_t;
int prov_ofi_rndv_stats(prov_t *p, prov_ofi_rndv_stats_t *out);

/* prov_sock, for logs and tests: times a connection stopped being read
 * because its unexpected messages held SOCK_UNEXP_MAX; connections up whose
 * two ends are on one host, and those of them given the configured send
 * buffer; the largest SO_SNDBUF the kernel reports for a connection up,
 * read at the call. Returns 0, or -EINVAL when p is not a prov_sock. */
typedef struct prov_sock_stats {
  uint64_t pauses;
  uint64_t polls; /* looks at the sockets (epoll_wait) in progress() */
  uint32_t host_conns;
  uint32_t sndbuf_set;
  int sndbuf_max;
  /* the door: whether the listener is open (it closes once every rank that
   * connects to this one has), connections refused there (strangers,
   * silence past the hello's deadline, the oldest silent ones when too many
   * wait), and the most that waited for their hello at once */
  bool listening;
  uint64_t refused;
  uint32_t pending_max;
} prov_sock_stats_t;
int prov_sock_stats(prov_t *p, prov_sock_stats_t *out);

/* prov_fault: what was injected, for logs and tests. */
typedef struct prov_fault_event {
  uint64_t t_ns;    /* CLOCK_MONOTONIC, when it was decided */
  const char *kind; /* "drop", "delay", "dup", "reorder", "corrupt", "stall" */
  int peer;         /* destination; -1 for a stall */
  uint64_t tag;
  char detail[96]; /* rule, bytes, bit flipped, milliseconds held... */
} prov_fault_event_t;
#define PROV_FAULT_JOURNAL 256 /* events kept: the most recent */
/* Copies the most recent events (at most max), oldest first; returns how
 * many, or -EINVAL when p is not a prov_fault. */
int prov_fault_events(prov_t *p, prov_fault_event_t *out, int max);

typedef struct prov_fault_stats {
  uint64_t sends;                              /* sends the caller posted */
  uint64_t drop, delay, dup, reorder, corrupt; /* injected, by kind */
  uint64_t stall;                              /* prov_fault_stall() calls */
  uint64_t events;                             /* journaled in all (kept: the last 256) */
} prov_fault_stats_t;
/* Returns 0, or -EINVAL when p is not a prov_fault. */
int prov_fault_stats(prov_t *p, prov_fault_stats_t *out);
/* The wrapped provider, or NULL when p is not a prov_fault. */
prov_t *prov_fault_child(prov_t *p);
/* Freezes the endpoint for `seconds` from now (0 ends a stall): progress()
 * delivers nothing and posts nothing, sends and receives are held, arm()
 * sleeps until the end; all resumes afterwards. Returns 0, or -EINVAL (not
 * a prov_fault, seconds negative or above a week). */
int prov_fault_stall(prov_t *p, double seconds);

/* In-process world shared by the ranks of one simulated job. */
typedef struct prov_inproc_world prov_inproc_world_t;
prov_inproc_world_t *prov_inproc_world_create(int nranks);
void prov_inproc_world_destroy(prov_inproc_world_t *w);

#endif
