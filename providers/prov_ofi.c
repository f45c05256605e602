/*
 * prov_ofi.c - the transport over a libfabric RDM endpoint with tagged
 * messages: shm, tcp (tcp;ofi_rxm), udp (udp;ofi_rxd), sockets, verbs...
 *
 * One instance = fabric, domain, AV (table, one entry per rank), CQ (tagged
 * format) and an RDM endpoint. Every posted op takes a slot from a fixed
 * pool: the slot holds the fi_context the provider may own (FI_CONTEXT and
 * FI_CONTEXT2 modes are both honoured), and the pool sizes are what keeps us
 * inside the provider's queue limits (shm fails past its queue's 256
 * receives, udp stalls past its window): past max_posted() a post returns
 * -EAGAIN. Over shm a send also waits for room in the receiver's queue
 * (see "the window").
 *
 * Receives are directed (FI_DIRECTED_RECV) when the provider offers it;
 * otherwise FI_ADDR_UNSPEC with the exact tag: the engine puts the source
 * rank in the tag.
 *
 * Sleeping. Three ways, chosen at open:
 *  - CQ fd (tcp, sockets, verbs): FI_WAIT_FD + FI_GETWAIT; arm() is fi_trywait.
 *  - doorbell (shm, which has no wait object): see below.
 *  - none (udp): wait_fd() is -1, the owner sleeps on a timer.
 *
 * The shm doorbell. Every endpoint owns
 *  - an abstract AF_UNIX datagram socket (no file to clean up): a 1-byte
 *    datagram to it is a ring; wait_fd() is an epoll set holding it;
 *  - a memfd page { sleeping, want_any, want[] } that peers on the host map
 *    through /proc/<pid>/fd/<memfd> (ptrace read access: the same user).
 *  Its address (getname) is the libfabric name followed by pid, memfd number,
 *  a nonce, the page's address and the socket name.
 *
 *   sleeper                                  peer
 *   arm:  sleeping = 1                       post:  fi_tsend (message in shm)
 *         fence                                     fence
 *         fi_cq_read: empty? sleep           if sleeping: ring
 *
 *  Both sides fence between their store and their load (Dekker), so either
 *  the sleeper's last fi_cq_read sees the message or the peer sees the flag.
 *  Rings are also owed where shm needs the *other* side to progress:
 *   - a send above the inject size (CMA) completes only after the receiver
 *     copied it: after a receive from p completes, ring p if it sleeps;
 *   - a post that got -FI_EAGAIN (peer queue full, first contact) waits for
 *     the peer to progress: the sender sets its bit in the peer's want[]
 *     and rings it; the peer's next progress() rings every sender in want[];
 *   - a sender held back by the window (below) that goes to sleep sets its
 *     bit in the peer's taken_want[] (arm()); the peer rings it when it
 *     next takes a message from it.
 *  If a peer's page can not be mapped, that peer is rung unconditionally.
 *
 *  Some turns of shm's progress leave no trace we could ring on:
 *   - a sender finishing a large send must trylock the receiver's region;
 *     when the receiver is inside its own progress the attempt is put off
 *     to the sender's next progress, and nothing tells the sender when
 *     (seen: two ranks exchanging large messages both asleep for good);
 *   - without CMA (Yama ptrace_scope=1, FI_SHM_DISABLE_CMA) messages above
 *     the inject size move through a bounded pool of segments (SAR), both
 *     sides taking turns in mid-transfer.
 *  Ringing the peer after each progress would make two sleepers with
 *  unmatched transfers wake each other forever, so a timer backs these up:
 *  wait_fd() is an epoll set of { socket, timerfd } and, while a large send
 *  (or, to a peer without CMA, a large receive) is in flight, arm() also
 *  sets the timer: 50 us doubling to 10 ms (1 ms with segments), back to
 *  50 us on every completion. Rings stay the fast path. Whether a peer
 *  allows CMA we learn as shm does: process_vm_readv of the peer's page,
 *  whose address is in its name.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "memcopy.h"
#include "memreg.h"
#include "ofi_lib.h" /* after <rdma/...>: fi_getinfo & co. from the loaded library */
#include "prov_internal.h"

#define OFI_API_VERSION FI_VERSION(1, 9)
#define OFI_ADDR_MAGIC 0x43484f46u /* "CHOF" */
#define OFI_MAX_POSTED_CAP 1024
#define OFI_RXD_MAX_POSTED 32
#define OFI_CQ_BATCH 32
#define OFI_CQ_BATCHES_PER_PROGRESS 8
#define OFI_STASH 32
#define OFI_TRYWAIT_TRIES 4
#define OFI_CLOSE_DRAIN_NS (200 * 1000 * 1000L)
#define OFI_FABNAME_MAX 256
/* Single-copy rendezvous (shm with CMA): every message above the inject
 * size travels as a descriptor; the receiver copies with process_vm_readv
 * and acks (see "single-copy rendezvous" below for why). */
#define OFI_RNDV_DATA 0x434d4152u /* "CMAR", the descriptor's magic */
/* A descriptor's remote CQ data. The engine's immediate data (prov_op.data)
 * never has bit 63 set: an ordinary message can not pass for a descriptor. */
#define OFI_RNDV_MARK ((1ULL << 63) | OFI_RNDV_DATA)
#define OFI_TAG_ACK (1ULL << 63) /* reserved tag bit: rendezvous acks */
/* Ack rings (see "single-copy rendezvous"): entries a receiver's page holds
 * for each sender, and the largest job that has them (a page of 256 ranks
 * grows by 80 KiB). */
#define OFI_ACK_RING 16
#define OFI_ACK_RING_MAX_RANKS 256
#define OFI_MAPS 32 /* peers' chorus_mem_alloc regions kept mapped (LRU) */
/* ofi_db_page.mapped, set once by add_peers (0 before): every peer's shm
 * region is mapped here / not every one (see "Names"). */
#define OFI_MAPPED_ALL 1u
#define OFI_MAPPED_SOME 2u
/* Bounce slots: a rendezvous send of up to bounce_max bytes (prov_config_t.
 * shm_bounce, at most OFI_BOUNCE_MAX) from memory peers can not map is first
 * copied into one of these, in a region they can; from memory they can map
 * too when the op asks (PROV_OP_BOUNCE). Each peer maps the whole region at
 * its first bounced message from us.
 *
 * The region is twice the size of a core's L2 cache (ofi_bounce_region),
 * and each slot's messages move along its share of it, so that a line is
 * written again only after the receiver has read twice its L2's worth of
 * other data since it read the line: by then the line has left the
 * receiver's L2, and the copy into it need not take it from the other core
 * (slots at fixed places were slower; larger regions no faster, and much
 * larger ones slower). The region is written through once when it is made,
 * so that no copy into it waits for the kernel to give the page. */
#define OFI_BOUNCE_DEFAULT (64 * 1024)
#define OFI_BOUNCE_MAX (256 * 1024)
#define OFI_BOUNCE_SLOTS 16
#define OFI_BOUNCE_REGION_MAX (16u << 20)
#define OFI_DB_NAME_MAX 100
#define OFI_NAP_MIN_US 50
#define OFI_NAP_MAX_US 10000
#define OFI_NAP_MAX_SAR_US 1000

enum ofi_wait {
  OFI_WAIT_TIMER,    /* no wait object: wait_fd() is -1 */
  OFI_WAIT_CQ_FD,    /* the CQ's own fd, fi_trywait before sleeping */
  OFI_WAIT_DOORBELL, /* our socket (+ timer) + sleeping flag (shm) */
};

struct ofi_slot {
  union {
    struct fi_context ctx;
    struct fi_context2 ctx2;
  } fctx;                     /* owned by the provider while posted */
  prov_op_t *op;              /* NULL when free */
  struct ofi_slot *next_free; /* free list of its direction */
  size_t len;
  uint64_t tag;
  int peer;
  bool is_send;
  unsigned char nap; /* OFI_NAP_*: whether a sleeper needs the timer for it */
  /* rendezvous send: descriptor out, ack back; done when both came back */
  unsigned char rndv_pending; /* OFI_RNDV_DESC | OFI_RNDV_ACK | OFI_RNDV_RING still to come */
  bool ring_cancel;           /* cancelled while its ack was due by ring: ended by progress() */
  int rndv_status;            /* first error of the two */
  int32_t ack_status;         /* the receiver's verdict (ack payload) */
  void *rbuf;                 /* receive: the buffer (a descriptor may land there) */
  uint32_t gen;               /* bumped per use: a stale ack can not match */
  int bounce;                 /* rendezvous send: bounce slot + 1, 0 for none */
  int bounce_mark;            /* bounce slot + 1 that the receiver hands back by mark, 0 for none */
  bool early;                 /* bounced send already completed; the slot waits for the ack */
  bool marked;                /* receive: a bounced message handed back by mark (no ack, no ring) */
  struct ofi_rndv_desc {
    uint64_t addr, len, cookie;
    int32_t pid;
    uint32_t magic;
    /* when the data lies in a chorus_mem_alloc region (rid != 0): */
    uint64_t rid, ino, roff;
    int32_t rfd;
    uint32_t flags; /* OFI_DESC_*; bits 8-15: the bounce slot (OFI_DESC_MARK) */
    uint64_t data;  /* the message's immediate data (prov_op.data) */
  } desc;
  union {
    struct fi_context ctx;
    struct fi_context2 ctx2;
  } ack_fctx;
};

enum { OFI_RNDV_DESC = 1, OFI_RNDV_ACK = 2, OFI_RNDV_RING = 4 };
/* OFI_DESC_BOUNCE: rid is the sender's bounce region. OFI_DESC_MARK: no
 * ack; the receiver marks the slot done in its own doorbell page.
 * OFI_DESC_RING: no ack message; the receiver puts the ack in its page's
 * ring for the sender. */
enum { OFI_DESC_BOUNCE = 1, OFI_DESC_MARK = 2, OFI_DESC_RING = 4 };
/* How a receiver hands a rendezvous message back (ofi_rndv_done). */
enum ofi_done_how { OFI_DONE_ACK, OFI_DONE_MARK, OFI_DONE_RING };
#define OFI_DESC_SLOT(flags) (((flags) >> 8) & 0xffu)

enum {
  OFI_NAP_NONE,
  OFI_NAP_SEND, /* large send (CMA): its completion can be put off */
  OFI_NAP_SAR,  /* large send or receive with a peer without CMA */
};

/* The page a sleeper shares with the peers on its host. */
struct ofi_db_page {
  uint64_t nonce;            /* checked by peers after mapping */
  _Atomic uint32_t sleeping; /* owner is asleep (or about to be) on its socket */
  _Atomic uint32_t want_any; /* some bit of want[] is set */
  _Atomic uint32_t mapped;   /* OFI_MAPPED_*: the peers' regions after our add_peers ("Names") */
  _Atomic uint32_t closed;   /* the owner closed its endpoint */
  _Atomic uint64_t want[];   /* rank r's bit: ring r after our next progress */
  /* then _Atomic uint32_t bounce_done[nranks] (db_done_word): bit k of
   * entry r, rank r's bounce slot k that we finished reading;
   * _Atomic uint32_t taken[nranks] (db_taken_word): messages from rank r
   * whose receive completed here; and _Atomic uint64_t taken_want[] (8-byte
   * aligned): rank r's bit, ring r when taken[r] next grows (see "window");
   * then, in jobs of up to OFI_ACK_RING_MAX_RANKS, struct ofi_ack_ring
   * ack_ring[nranks] (db_ack_ring): entry r, our acks of rank r's
   * rendezvous messages */
};

/* Acks of one sender's rendezvous messages, in the receiver's page: the
 * receiver writes an entry, then moves head on (release); the sender reads
 * from its own tail up to head. A sender keeps at most OFI_ACK_RING such
 * acks due (ofi_db_peer.ack_out), so the ring never overflows. */
struct ofi_ack_ring {
  _Atomic uint32_t head;
  uint32_t pad[15];
  struct ofi_ack_entry {
    uint64_t cookie;
    int32_t status;
    uint32_t pad;
  } e[OFI_ACK_RING];
};

struct ofi_db_peer {
  struct ofi_db_page *page; /* NULL: ring this peer on every occasion */
  int32_t pid;
  char region[96];   /* its shm region's name (chorus://NAME), "" if not ours */
  char shm_name[96]; /* the same, kept after settle removed the name ("Locks left held") */
  size_t page_len;
  bool sar;            /* no CMA to this peer: large messages go by segments */
  uint32_t taken_seen; /* its taken[] entry for us, as we last read it (the window) */
  uint32_t held_limit; /* the window a send held back needs; not 0: in ofi_ep.held[] */
  uint32_t ack_tail;   /* acks read so far from our ring in its page */
  uint32_t ack_out;    /* our messages to it whose ack is due by that ring */
  struct sockaddr_un sa;
  socklen_t salen;
};

/* A peer's region, mapped read-only here. */
struct ofi_map {
  int32_t pid;
  uint64_t rid;
  const unsigned char *base;
  size_t size;
  uint64_t last_use;
};

struct ofi_ep {
  prov_t base;
  struct ofi_map maps[OFI_MAPS];
  uint64_t map_uses;
  prov_ofi_rndv_stats_t rndv_stats;
  /* Bounce region (rendezvous endpoints): OFI_BOUNCE_SLOTS slots, a bit per
   * free one. A slot whose send failed is never reused (the receiver may
   * still be reading it). */
  unsigned char *bounce;
  uint32_t bounce_free;
  uint32_t bounce_out;                /* slots the receiver hands back by mark */
  int bounce_to[OFI_BOUNCE_SLOTS];    /* ... and to which peer each went */
  size_t bounce_max;                  /* largest message bounced (prov_config_t.shm_bounce) */
  size_t bounce_slot;                 /* bytes a message takes at most: bounce_max in whole pages */
  size_t bounce_share;                /* bytes of the region each slot moves along */
  size_t bounce_at[OFI_BOUNCE_SLOTS]; /* where in its share a slot's next message goes */
  int rank, nranks;
  char region[96];   /* shm: our region's name in /dev/shm ("Names"), "" if not ours */
  bool region_named; /* ... and it is still there */
  uint64_t pidns;    /* our PID namespace's inode, 0 if /proc is not ours */
  /* shm 1.17: each rank's queue lock in its region, NULL where unknown ("Locks left held") */
  pthread_spinlock_t **wedge;
  bool wedge_looked;       /* under wedge_mu: wedge found (or not), once needed */
  struct ofi_ep *smr_next; /* on smr_live while open ("shm's list of names") */
  pthread_mutex_t wedge_mu;
  char prov_name[64];
  char errmsg[256];
  bool closing;

  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
  bool directed;        /* FI_DIRECTED_RECV granted */
  bool cq_data;         /* 8 bytes of remote CQ data: prov_op.data travels */
  uint16_t listen_port; /* tcp and the like: the port peers connect to, 0 if none */
  size_t inject_len;    /* sends up to this complete without the receiver */
  bool rndv;            /* single-copy rendezvous for large messages (shm + CMA) */
  int32_t pid;
  /* acks that met -EAGAIN, retried by progress() */
  struct ofi_ack {
    int peer;
    uint64_t cookie;
    int32_t status;
  } * acks;
  size_t nacks, cap_acks;
  uint32_t ack_out;      /* acks due by ring, all peers (their ofi_db_peer.ack_out) */
  uint32_t ring_cancels; /* slots with ring_cancel set */

  fi_addr_t *peers; /* nranks entries after add_peers */

  struct ofi_slot *slots; /* 2 * max_posted: the first half sends */
  struct ofi_slot *tx_free, *rx_free;
  size_t max_posted;
  size_t in_flight;

  /* Completions read by arm(), delivered first by the next progress(). */
  struct fi_cq_tagged_entry stash[OFI_STASH];
  int stash_pos, stash_n;

  enum ofi_wait wait;
  int cq_fd;

  /* Doorbell (OFI_WAIT_DOORBELL only). */
  int db_epfd;  /* wait_fd(): epoll set of db_sock and db_timer */
  int db_sock;  /* rings arrive here */
  int db_timer; /* timerfd, armed by arm() while db_nap_ops */
  int db_memfd;
  struct ofi_db_page *db_page;
  size_t db_page_len;
  struct sockaddr_un db_sa;
  socklen_t db_salen;
  struct ofi_db_peer *db_peers; /* nranks entries after add_peers */
  size_t db_nap_ops;            /* posted ops with slot->nap */
  size_t db_nap_sar;            /* of which OFI_NAP_SAR */
  unsigned db_nap_us;           /* next timer while db_nap_ops */
  bool db_no_backstop;          /* tests: rings only, no timer */

  /* The window (doorbell endpoints, see "window" below). */
  uint32_t window; /* messages to one peer it has not yet taken; 0: no window */
  uint32_t *sent;  /* nranks: messages posted to each peer */
  int *held;       /* nranks: peers a send was held back from (ofi_held_open) */
  uint32_t nheld;

  /* Our address as given to peers: header, libfabric name, doorbell. */
  unsigned char addr[sizeof(uint32_t) * 2 + OFI_FABNAME_MAX + 40 + OFI_DB_NAME_MAX];
  size_t addrlen;
};

static struct ofi_ep *to_ofi(prov_t *p) {
  return PROV_CONTAINER_OF(p, struct ofi_ep, base);
}

/* libfabric codes are errno values below FI_ERRNO_OFFSET. */
static int ofi_to_errno(long fi_rc) {
  long e = fi_rc < 0 ? -fi_rc : fi_rc;

  if (e == FI_ETRUNC)
    return -EMSGSIZE;
  if (e > 0 && e < FI_ERRNO_OFFSET)
    return (int)-e;
  return -EIO;
}

static void ofi_seterr(struct ofi_ep *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void ofi_seterr(struct ofi_ep *o, const char *fmt, ...) {
  va_list ap;
  int n = snprintf(o->errmsg, sizeof(o->errmsg),
                   "ofi %s rank %d: ", o->prov_name[0] ? o->prov_name : "?", o->rank);

  if (n < 0 || (size_t)n >= sizeof(o->errmsg))
    return;
  va_start(ap, fmt);
  vsnprintf(o->errmsg + n, sizeof(o->errmsg) - (size_t)n, fmt, ap);
  va_end(ap);
}

/* ---- names: "shm" -> "shm", "tcp" -> "tcp;ofi_rxm" ... ---- */

static const char *ofi_prov_name(const char *name) {
  static const struct {
    const char *user, *prov;
  } map[] = {
      {"tcp", "tcp;ofi_rxm"},
      {"udp", "udp;ofi_rxd"},
      {"verbs", "verbs;ofi_rxm"},
  };
  size_t i;

  for (i = 0; i < sizeof(map) / sizeof(map[0]); i++)
    if (strcmp(name, map[i].user) == 0)
      return map[i].prov;
  return name;
}

/* rxm sends messages up to its buffer size eagerly, larger ones by a
 * rendezvous that costs a round trip: 16 KiB by default, so a 32 KiB
 * message (a small broadcast) took 3x as long as an eager one. libfabric
 * reads it when it first initialises its providers, whichever is asked for
 * first, so it is set before every fi_getinfo: a rank that opened shm
 * first and one that opened tcp first must agree (they did not, and a
 * receiver expecting a rendezvous got an eager message: a hang). A value
 * the user set is kept. */
#define OFI_RXM_BUFFER_SIZE "36864"

/* rxm posts this many of those buffers to its shared receive context when
 * an endpoint is enabled, taken from pools that grow 1024 buffers at a
 * time and are zeroed as they grow: its default of 4096 cost every tcp
 * endpoint 4 x 38 MB, zeroed (0.4 s of a 0.7 s communicator creation).
 * 1024 is one pool chunk and as many sends as we post (OFI_MAX_POSTED_CAP);
 * rxm takes more from its pool while unexpected messages hold buffers (7
 * ranks each sending rank 0 3000 messages of 1 KiB before it posts a
 * receive: all arrive). Read, like the buffer size, when libfabric first
 * initialises its providers. */
#define OFI_RXM_MSG_RX_SIZE "1024"

/* shm's queues: 256 entries each (its default is 1024). A rank's region,
 * which every peer maps and writes its messages into, shrinks with them,
 * and small collectives among many ranks were slow for their first few
 * hundred calls with the large one (ranks outnumbering the cores; 2 ranks
 * and large calls were the same). What it costs: 64 posted a direction instead of 256, which the
 * executor posts past when it must (exec.c), and smaller windows (see "the
 * window"). Read when libfabric first initialises its providers, like
 * rxm's; a value the user set is kept. */
#define OFI_SHM_QUEUE_SIZE "256"

/* udp;ofi_rxd sends a peer up to FI_OFI_RXD_MAX_UNACKED packets (128 by
 * default, 4 KiB each) before it waits for an ack, and a udp socket holds
 * net.core.rmem_default (208 KiB here, about 26 such packets: the kernel
 * counts some 8 KiB a packet); what does not fit is dropped and sent again.
 * One 2-rank exchange of 3 x 18 MiB dropped 29,820 packets that way, and
 * under load rxd (1.17) then completed some 1 and 16 MiB receives short
 * (FI_ETRUNC, eight packets' data missing). So the endpoint's socket asks
 * for OFI_UDP_RCVBUF (the kernel grants up to net.core.rmem_max, doubled).
 * With one peer that buffer holds rxd's own window, which is kept: the
 * smaller one below made 2-rank calls of 2 MiB 3 to 9 times slower. With
 * more, the window is what the buffer holds for four peers sending at
 * once, at least 8 and at most OFI_RXD_WINDOW_MAX: with a buffer large
 * enough for 128, a 4-rank allreduce over udp beside two busy loops stalled
 * for good in 8 runs of 8 (sanitizer build), and passed 5 of 5 with 16; 8
 * ranks with 128 got a 2 MiB message garbled. Read, like rxm's values, when
 * libfabric first initialises its providers, so the first job of a process
 * decides; a value the user set is kept. */
#define OFI_UDP_RCVBUF (4 << 20)
#define OFI_UDP_PKT_COST 8192
#define OFI_RXD_WINDOW_MAX 16

static long ofi_sysctl(const char *path, long dflt) {
  FILE *f = fopen(path, "re");
  long v;

  if (!f)
    return dflt;
  if (fscanf(f, "%ld", &v) != 1)
    v = dflt;
  fclose(f);
  return v;
}

/* What SO_RCVBUF of OFI_UDP_RCVBUF gives a socket, in bytes. */
static long ofi_udp_rcvbuf(void) {
  long max = ofi_sysctl("/proc/sys/net/core/rmem_max", 212992);
  long dflt = ofi_sysctl("/proc/sys/net/core/rmem_default", 212992);
  long got = 2 * (max < OFI_UDP_RCVBUF ? max : OFI_UDP_RCVBUF);

  return got > dflt ? got : dflt;
}

static void ofi_rxd_window_env(int nranks) {
  char v[16];
  long w;

  if (getenv("FI_OFI_RXD_MAX_UNACKED") || nranks <= 2)
    return;
  w = ofi_udp_rcvbuf() / OFI_UDP_PKT_COST / 4;
  w = w < 8 ? 8 : w > OFI_RXD_WINDOW_MAX ? OFI_RXD_WINDOW_MAX : w;
  snprintf(v, sizeof(v), "%ld", w);
  setenv("FI_OFI_RXD_MAX_UNACKED", v, 0);
}

/* The address a socket-based provider should listen on: the engine's
 * choice for the job (cfg->sock_addr: loopback for a job on one host, else
 * the address this rank reached the rendezvous from), unless the user named
 * an interface to libfabric itself (FI_TCP_IFACE and the like) or to Chorus
 * (CHORUS_SOCK_IFACE). NULL: libfabric's own choice (its first interface
 * up, which may be one the job never asked for). */
static const char *ofi_source(const prov_config_t *cfg) {
  static const struct {
    const char *user, *env;
  } iface[] = {{"tcp", "FI_TCP_IFACE"}, {"udp", "FI_UDP_IFACE"}, {"sockets", "FI_SOCKETS_IFACE"}};
  for (size_t i = 0; i < sizeof(iface) / sizeof(iface[0]); i++) {
    if (strcmp(cfg->name, iface[i].user) != 0)
      continue;
    const char *e = getenv(iface[i].env);
    if ((e && *e) || (cfg->iface && *cfg->iface) || !cfg->sock_addr || !*cfg->sock_addr)
      return NULL;
    return cfg->sock_addr;
  }
  return NULL;
}

static int ofi_getinfo(const char *prov, uint64_t caps, const char *node, int nranks,
                       struct fi_info **out) {
  struct fi_info *hints = fi_allocinfo();
  int rc;

  setenv("FI_OFI_RXM_BUFFER_SIZE", OFI_RXM_BUFFER_SIZE, 0);
  setenv("FI_OFI_RXM_MSG_RX_SIZE", OFI_RXM_MSG_RX_SIZE, 0);
  setenv("FI_SHM_RX_SIZE", OFI_SHM_QUEUE_SIZE, 0);
  setenv("FI_SHM_TX_SIZE", OFI_SHM_QUEUE_SIZE, 0);
  ofi_rxd_window_env(nranks);
  if (!hints)
    return -FI_ENOMEM;
  hints->caps = caps;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  /* No RMA, no registration: these only promise what we never rely on. */
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(prov);
  if (!hints->fabric_attr->prov_name) {
    fi_freeinfo(hints);
    return -FI_ENOMEM;
  }
  rc = fi_getinfo(OFI_API_VERSION, node, NULL, node ? FI_SOURCE : 0, hints, out);
  if (rc && node) /* not an address this provider serves: its own choice then */
    rc = fi_getinfo(OFI_API_VERSION, NULL, NULL, 0, hints, out);
  fi_freeinfo(hints);
  return rc;
}

/* ---- slots ---- */

static struct ofi_slot *slot_get(struct ofi_ep *o, bool is_send) {
  struct ofi_slot **head = is_send ? &o->tx_free : &o->rx_free;
  struct ofi_slot *s = *head;

  if (s) {
    *head = s->next_free;
    o->in_flight++;
  }
  return s;
}

static void slot_put(struct ofi_ep *o, struct ofi_slot *s) {
  struct ofi_slot **head = s->is_send ? &o->tx_free : &o->rx_free;

  s->op = NULL;
  s->next_free = *head;
  *head = s;
  o->in_flight--;
}

/* ---- doorbell ---- */

static void db_ring(struct ofi_ep *o, int peer) {
  struct ofi_db_peer *d = &o->db_peers[peer];
  char b = 0;

  /* EAGAIN: the peer's socket is full, so already readable. ECONNREFUSED:
   * the peer is gone. Neither is ours to report. */
  (void)sendto(o->db_sock, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&d->sa, d->salen);
}

/* Call after whatever gives the peer a reason to wake (a message posted, a
 * transfer taken) is done: the fence orders those stores before the load of
 * the peer's flag, as the peer's arm() orders its flag before its look. */
static void db_ring_if_sleeping(struct ofi_ep *o, int peer) {
  struct ofi_db_page *pg = o->db_peers[peer].page;

  atomic_thread_fence(memory_order_seq_cst);
  if (!pg || atomic_load(&pg->sleeping))
    db_ring(o, peer);
}

/* Our post to peer got -FI_EAGAIN: it must progress before we can retry. */
static void db_want_ring(struct ofi_ep *o, int peer) {
  struct ofi_db_page *pg = o->db_peers[peer].page;
  size_t word = (size_t)o->rank / 64;

  if (pg && sizeof(*pg) + (word + 1) * sizeof(uint64_t) <= o->db_peers[peer].page_len) {
    atomic_fetch_or(&pg->want[word], 1ull << (o->rank % 64));
    atomic_store(&pg->want_any, 1);
  }
  db_ring(o, peer);
}

/* Where the arrays that follow want[] begin, in a page of a job of nranks.
 * Each array starts a cache line of its own, apart from the header's
 * `sleeping`, which a peer reads after every post: taken[] is written on
 * every receive and read by a sender only when the count it saw last
 * leaves no room (ofi_window_open), bounce_done[] on every bounced message.
 * Sharing one line, every post of a peer took the line from us and every
 * receive took it back (the sender keeps its own count of what it saw,
 * ofi_window_open, and small calls are faster for it). */
#define DB_LINE 64
static size_t db_line_up(size_t off) {
  return (off + DB_LINE - 1) & ~(size_t)(DB_LINE - 1);
}

static size_t db_done_off(int nranks) {
  return db_line_up(sizeof(struct ofi_db_page) + ((size_t)nranks + 63) / 64 * sizeof(uint64_t));
}

static size_t db_taken_off(int nranks) {
  return db_line_up(db_done_off(nranks) + (size_t)nranks * sizeof(uint32_t));
}

static size_t db_taken_want_off(int nranks) {
  return (db_taken_off(nranks) + (size_t)nranks * sizeof(uint32_t) + 7) & ~(size_t)7;
}

static size_t db_ack_ring_off(int nranks) {
  return db_line_up(db_taken_want_off(nranks) + ((size_t)nranks + 63) / 64 * sizeof(uint64_t));
}

/* Bytes a page needs. */
static size_t db_page_need(int nranks) {
  if (nranks > OFI_ACK_RING_MAX_RANKS)
    return db_taken_want_off(nranks) + ((size_t)nranks + 63) / 64 * sizeof(uint64_t);
  return db_ack_ring_off(nranks) + (size_t)nranks * sizeof(struct ofi_ack_ring);
}

/* The word of `size` bytes at off + r * size in a page of page_len bytes,
 * NULL when the page is too short to hold it. */
static void *db_word(struct ofi_db_page *pg, size_t page_len, size_t off, int r, size_t size) {
  off += (size_t)r * size;
  if (!pg || off + size > page_len)
    return NULL;
  return (char *)pg + off;
}

size_t prov_ofi_test_db_layout(int nranks, size_t off[4]) {
  off[0] = db_done_off(nranks);
  off[1] = db_taken_off(nranks);
  off[2] = db_taken_want_off(nranks);
  off[3] = nranks > OFI_ACK_RING_MAX_RANKS ? 0 : db_ack_ring_off(nranks);
  return db_page_need(nranks);
}

/* Entry r of the bounce_done[] that follows want[]. */
static _Atomic uint32_t *db_done_word(struct ofi_db_page *pg, size_t page_len, int nranks, int r) {
  return db_word(pg, page_len, db_done_off(nranks), r, sizeof(uint32_t));
}

/* Entry r of taken[]: messages from rank r whose receive completed here. */
static _Atomic uint32_t *db_taken_word(struct ofi_db_page *pg, size_t page_len, int nranks, int r) {
  return db_word(pg, page_len, db_taken_off(nranks), r, sizeof(uint32_t));
}

/* Rank r's ring of acks in a page, NULL when the page has none (a job
 * larger than OFI_ACK_RING_MAX_RANKS). */
static struct ofi_ack_ring *db_ack_ring(struct ofi_db_page *pg, size_t page_len, int nranks,
                                        int r) {
  if (nranks > OFI_ACK_RING_MAX_RANKS)
    return NULL;
  return db_word(pg, page_len, db_ack_ring_off(nranks), r, sizeof(struct ofi_ack_ring));
}

/* The word of taken_want[] that holds rank r's bit. */
static _Atomic uint64_t *db_taken_want_word(struct ofi_db_page *pg, size_t page_len, int nranks,
                                            int r) {
  return db_word(pg, page_len, db_taken_want_off(nranks), r / 64, sizeof(uint64_t));
}

/* After our progress: ring every peer that waits for it. */
static void db_answer(struct ofi_ep *o) {
  struct ofi_db_page *pg = o->db_page;
  size_t w, nw = ((size_t)o->nranks + 63) / 64;

  if (!o->db_peers || !atomic_load(&pg->want_any))
    return;
  atomic_store(&pg->want_any, 0);
  for (w = 0; w < nw; w++) {
    uint64_t bits = atomic_load(&pg->want[w]) ? atomic_exchange(&pg->want[w], 0) : 0;

    while (bits) {
      size_t r = w * 64 + (size_t)__builtin_ctzll(bits);

      bits &= bits - 1;
      if (r < (size_t)o->nranks)
        db_ring(o, (int)r);
    }
  }
}

static void db_drain(struct ofi_ep *o) {
  char buf[64];

  while (recv(o->db_sock, buf, sizeof(buf), MSG_DONTWAIT) >= 0)
    ;
}

static void db_timer_set(struct ofi_ep *o, unsigned us) {
  struct itimerspec its = {.it_value = {.tv_sec = 0, .tv_nsec = (long)us * 1000}};
  uint64_t expirations;

  if (o->db_timer < 0)
    return;
  /* Nonblocking: a failed read only means it had not expired. */
  if (!us && read(o->db_timer, &expirations, sizeof(expirations)) < 0)
    expirations = 0;
  timerfd_settime(o->db_timer, 0, &its, NULL);
}

/* shm reads this libfabric variable itself; we must agree with it. */
static bool db_cma_disabled(void) {
  static const char *const yes[] = {"1", "y", "yes", "on", "true"};
  const char *v = getenv("FI_SHM_DISABLE_CMA");
  size_t i;

  for (i = 0; v && i < sizeof(yes) / sizeof(yes[0]); i++)
    if (strcasecmp(v, yes[i]) == 0)
      return true;
  return false;
}

/* The kernel's CMA permission check, made the way shm makes it. */
static bool db_cma_works(int32_t pid, uint64_t va, uint64_t nonce) {
  uint64_t v = 0;
  struct iovec local = {.iov_base = &v, .iov_len = sizeof(v)};
  struct iovec remote = {.iov_base = (void *)(uintptr_t)va, .iov_len = sizeof(v)};

  return process_vm_readv((pid_t)pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof(v) && v == nonce;
}

static int db_open(struct ofi_ep *o, const prov_config_t *cfg, char *errbuf, size_t errlen) {
  static atomic_uint seq;
  struct epoll_event ev = {.events = EPOLLIN};
  long pagesz = sysconf(_SC_PAGESIZE);
  uint64_t nonce;
  int n, rc;

  o->db_page_len = db_page_need(o->nranks);
  o->db_page_len = (o->db_page_len + (size_t)pagesz - 1) / (size_t)pagesz * (size_t)pagesz;
  o->db_memfd = memfd_create("chorus-doorbell", MFD_CLOEXEC);
  if (o->db_memfd < 0)
    goto out_errno;
  if (ftruncate(o->db_memfd, (off_t)o->db_page_len))
    goto out_close_memfd;
  o->db_page = mmap(NULL, o->db_page_len, PROT_READ | PROT_WRITE, MAP_SHARED, o->db_memfd, 0);
  if (o->db_page == MAP_FAILED) {
    o->db_page = NULL;
    goto out_close_memfd;
  }
  nonce = ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)o ^ (uint64_t)time(NULL) ^
          ((uint64_t)atomic_fetch_add(&seq, 1) << 48);
  o->db_page->nonce = nonce;

  o->db_sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (o->db_sock < 0)
    goto out_unmap;
  memset(&o->db_sa, 0, sizeof(o->db_sa));
  o->db_sa.sun_family = AF_UNIX;
  /* Abstract namespace (leading NUL): nothing to unlink, gone with the fd. */
  n = snprintf(o->db_sa.sun_path + 1, OFI_DB_NAME_MAX, "chorus/%.40s/%d/%d/%u",
               cfg->job_id ? cfg->job_id : "-", o->rank, (int)getpid(), atomic_fetch_add(&seq, 1));
  if (n < 0 || n >= OFI_DB_NAME_MAX) {
    errno = ENAMETOOLONG;
    goto out_close_sock;
  }
  o->db_salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  if (bind(o->db_sock, (struct sockaddr *)&o->db_sa, o->db_salen))
    goto out_close_sock;
  o->db_epfd = epoll_create1(EPOLL_CLOEXEC);
  if (o->db_epfd < 0)
    goto out_close_sock;
  if (epoll_ctl(o->db_epfd, EPOLL_CTL_ADD, o->db_sock, &ev))
    goto out_close_epoll;
  o->db_timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (o->db_timer < 0)
    goto out_close_epoll;
  if (epoll_ctl(o->db_epfd, EPOLL_CTL_ADD, o->db_timer, &ev))
    goto out_close_timer;
  o->db_nap_us = OFI_NAP_MIN_US;
  return 0;

out_close_timer:
  rc = errno;
  close(o->db_timer);
  o->db_timer = -1;
  errno = rc;
out_close_epoll:
  rc = errno;
  close(o->db_epfd);
  o->db_epfd = -1;
  errno = rc;
out_close_sock:
  rc = errno;
  close(o->db_sock);
  o->db_sock = -1;
  errno = rc;
out_unmap:
  rc = errno;
  munmap(o->db_page, o->db_page_len);
  o->db_page = NULL;
  errno = rc;
out_close_memfd:
  rc = errno;
  close(o->db_memfd);
  o->db_memfd = -1;
  errno = rc;
out_errno:
  rc = -errno;
  prov_errf(errbuf, errlen, "ofi %s: doorbell setup failed: %s", o->prov_name, strerror(errno));
  return rc;
}

static void db_close(struct ofi_ep *o) {
  int i;

  if (o->db_peers) {
    for (i = 0; i < o->nranks; i++)
      if (o->db_peers[i].page)
        munmap(o->db_peers[i].page, o->db_peers[i].page_len);
    free(o->db_peers);
    o->db_peers = NULL;
  }
  if (o->db_timer >= 0)
    close(o->db_timer);
  if (o->db_epfd >= 0)
    close(o->db_epfd);
  if (o->db_sock >= 0)
    close(o->db_sock);
  if (o->db_page)
    munmap(o->db_page, o->db_page_len);
  if (o->db_memfd >= 0)
    close(o->db_memfd);
  o->db_timer = o->db_epfd = o->db_sock = o->db_memfd = -1;
  o->db_page = NULL;
}

/* Maps peer's page; on any failure the peer is simply rung every time. */
static void db_peer_attach(struct ofi_db_peer *d, int32_t pid, int32_t memfd, uint64_t nonce) {
  char path[64];
  struct stat st;
  void *pg;
  int fd;

  d->page = NULL;
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)memfd);
  fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return;
  if (fstat(fd, &st) || st.st_size < (off_t)sizeof(struct ofi_db_page))
    goto out_close;
  pg = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (pg == MAP_FAILED)
    goto out_close;
  if (((struct ofi_db_page *)pg)->nonce != nonce) {
    munmap(pg, (size_t)st.st_size);
    goto out_close;
  }
  d->page = pg;
  d->page_len = (size_t)st.st_size;
out_close:
  close(fd);
}

/* ---- wire address: magic, fab_len, db_len, libfabric name, doorbell ----
 * doorbell: pid (4), memfd (4), nonce (8), page address (8),
 * socket name length (1), name. */
#define OFI_DB_FIXED 25

static int addr_build(struct ofi_ep *o, const void *fab, size_t fab_len) {
  unsigned char *p = o->addr;
  uint32_t magic = OFI_ADDR_MAGIC;
  uint16_t fl = (uint16_t)fab_len, dl = 0;

  if (o->wait == OFI_WAIT_DOORBELL)
    dl = (uint16_t)(OFI_DB_FIXED + (o->db_salen - offsetof(struct sockaddr_un, sun_path)));
  if (8 + fab_len + dl > sizeof(o->addr))
    return -ENAMETOOLONG;
  memcpy(p, &magic, 4);
  memcpy(p + 4, &fl, 2);
  memcpy(p + 6, &dl, 2);
  memcpy(p + 8, fab, fab_len);
  p += 8 + fab_len;
  if (dl) {
    int32_t pid = (int32_t)getpid(), fd = o->db_memfd;
    uint64_t va = (uint64_t)(uintptr_t)o->db_page;
    uint8_t nl = (uint8_t)(dl - OFI_DB_FIXED);

    memcpy(p, &pid, 4);
    memcpy(p + 4, &fd, 4);
    memcpy(p + 8, &o->db_page->nonce, 8);
    memcpy(p + 16, &va, 8);
    memcpy(p + 24, &nl, 1);
    memcpy(p + OFI_DB_FIXED, o->db_sa.sun_path, nl);
  }
  o->addrlen = 8 + fab_len + dl;
  return 0;
}

struct ofi_peer_addr {
  const unsigned char *fab;
  size_t fab_len;
  bool has_db;
  int32_t pid, memfd;
  uint64_t nonce, va;
  const unsigned char *name;
  size_t name_len;
};

static int addr_parse(const void *addr, size_t len, struct ofi_peer_addr *pa) {
  const unsigned char *p = addr;
  uint32_t magic;
  uint16_t fl, dl;
  uint8_t nl;

  memset(pa, 0, sizeof(*pa));
  if (!p || len < 8)
    return -EINVAL;
  memcpy(&magic, p, 4);
  memcpy(&fl, p + 4, 2);
  memcpy(&dl, p + 6, 2);
  if (magic != OFI_ADDR_MAGIC || (size_t)8 + fl + dl != len || !fl)
    return -EINVAL;
  pa->fab = p + 8;
  pa->fab_len = fl;
  if (!dl)
    return 0;
  p += 8 + fl;
  if (dl < OFI_DB_FIXED)
    return -EINVAL;
  memcpy(&pa->pid, p, 4);
  memcpy(&pa->memfd, p + 4, 4);
  memcpy(&pa->nonce, p + 8, 8);
  memcpy(&pa->va, p + 16, 8);
  memcpy(&nl, p + 24, 1);
  if ((size_t)nl + OFI_DB_FIXED != dl || nl > sizeof(((struct sockaddr_un *)0)->sun_path))
    return -EINVAL;
  pa->name = p + OFI_DB_FIXED;
  pa->name_len = nl;
  pa->has_db = true;
  return 0;
}

/* What add_peers keeps of a doorbell address (pa->has_db) besides what
 * needs a system call: the socket's address and, when the libfabric name is
 * one of our shm regions ("chorus://NAME"), NAME ("" otherwise). d must
 * come zeroed. Shared with prov_ofi_test_addr_decode (fuzzing). */
static void db_peer_names(struct ofi_db_peer *d, const struct ofi_peer_addr *pa) {
  d->sa.sun_family = AF_UNIX;
  memcpy(d->sa.sun_path, pa->name, pa->name_len);
  d->salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + pa->name_len);
  if (pa->fab_len > 9 && pa->fab_len < sizeof(d->region) + 9 &&
      memcmp(pa->fab, "chorus://", 9) == 0) {
    memcpy(d->region, pa->fab + 9, pa->fab_len - 9);
    d->region[pa->fab_len - 9] = '\0';
    if (strchr(d->region, '/'))
      d->region[0] = '\0';
  }
}

int prov_ofi_test_addr_decode(const void *addr, size_t len, bool doorbell,
                              prov_ofi_test_addr_t *out) {
  struct ofi_peer_addr pa;
  struct ofi_db_peer d;

  memset(out, 0, sizeof(*out));
  if (addr_parse(addr, len, &pa) || (doorbell && !pa.has_db))
    return -EINVAL;
  out->fab = pa.fab;
  out->fab_len = pa.fab_len;
  out->has_db = pa.has_db;
  if (doorbell) {
    memset(&d, 0, sizeof(d));
    db_peer_names(&d, &pa);
    out->salen = d.salen;
    memcpy(out->sun_path, d.sa.sun_path, sizeof(out->sun_path));
    memcpy(out->region, d.region, sizeof(out->region));
  }
  return 0;
}

/* ---- open ---- */

static size_t ofi_safe_posted(const struct fi_info *info) {
  size_t m = info->tx_attr->size < info->rx_attr->size ? info->tx_attr->size : info->rx_attr->size;

  m -= m / 8; /* headroom for what the provider queues on its own */
  if (m > OFI_MAX_POSTED_CAP)
    m = OFI_MAX_POSTED_CAP;
  return m ? m : 1;
}

static void ofi_each_port_sock(uint16_t port, void (*fn)(int fd, ino_t ino, void *arg), void *arg);
static void ofi_raise_rcvbuf(int fd, ino_t ino, void *arg);

/* ---- shm's list of names ----
 *
 * libfabric 1.17's shm puts an entry (the region's name, its address, list
 * links: 280 bytes) on a process-wide list whenever an endpoint is enabled,
 * and frees it only when the library is unloaded: every communicator made
 * and destroyed over shm left one behind for good. So a closed endpoint's
 * entry is taken off here. The list is libfabric's own: it is found once,
 * in libfabric's data, as the ring that holds our endpoint's name, and it is
 * touched only while shm says 1.17 and every entry on it is one of ours
 * (another user of shm in the process takes the list's lock, which we
 * cannot: then we leave it alone). Every call of ours that reads or changes
 * the list (fi_enable, fi_av_insert, an AV's close) and the removal hold
 * smr_mu. An entry stays while an open endpoint has its name among its
 * peers: libfabric takes a region of this process from the list, not from
 * a mapping of its own, and unmaps it when the entry is gone. */
#define SMR117_VERSION FI_VERSION(117, 0) /* shm's prov_version in libfabric 1.17.x */
#define SMR117_NAME_MAX 256               /* struct smr_ep_name: char name[256]; void *region; */
#define SMR117_LINKS 264                  /* struct dlist_entry { next, prev }; 280 bytes in all */

struct smr_links {
  struct smr_links *next, *prev;
};

/* Whether o is an endpoint of libfabric 1.17's shm with a region we named. */
static bool ofi_smr117(const struct ofi_ep *o) {
  return o->region[0] && o->info->fabric_attr->prov_version == SMR117_VERSION &&
         strcmp(o->info->fabric_attr->prov_name, "shm") == 0;
}

static pthread_mutex_t smr_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ofi_ep *smr_live; /* open endpoints whose entries we track */
static char **smr_retired;      /* names of closed ones whose entries are left */
static size_t smr_nretired;
static struct smr_links *smr_head; /* libfabric's list, once found */
static bool smr_off;               /* not found, or not ours alone: leave it */

/* Reads n bytes at addr without faulting where nothing is mapped. */
static bool smr_peek(const void *addr, void *out, size_t n) {
  struct iovec l = {out, n}, r = {(void *)addr, n};
  return process_vm_readv(getpid(), &l, 1, &r, 1, 0) == (ssize_t)n;
}

static bool smr_entry_named(const struct smr_links *e, const char *name) {
  char block[SMR117_LINKS + sizeof(struct smr_links)];
  if (!smr_peek((const char *)e - SMR117_LINKS, block, sizeof(block)))
    return false;
  block[SMR117_NAME_MAX - 1] = '\0';
  return strcmp(block, name) == 0;
}

/* Whether the ring at h is a list that holds name (every link checked). */
static bool smr_ring_holds(struct smr_links *h, const char *name) {
  struct smr_links cur, *at = h, *prev = NULL;
  bool found = false;
  for (long steps = 0; steps < (1l << 20); steps++) {
    if (!smr_peek(at, &cur, sizeof(cur)) || (prev && cur.prev != prev) || !cur.next ||
        ((uintptr_t)cur.next & 7))
      return false;
    if (at != h && !found)
      found = smr_entry_named(at, name);
    prev = at;
    at = cur.next;
    if (at == h)
      return found;
  }
  return false;
}

/* libfabric's list head: in its writable data, the ring holding name. */
static struct smr_links *smr_find_head(const char *name) {
  FILE *maps = fopen("/proc/self/maps", "re");
  char line[512];
  struct smr_links *head = NULL;
  if (!maps)
    return NULL;
  while (!head && fgets(line, sizeof(line), maps)) {
    unsigned long a, b;
    char perms[8];
    if (!strstr(line, "/libfabric.so") || sscanf(line, "%lx-%lx %7s", &a, &b, perms) != 3 ||
        perms[0] != 'r' || perms[1] != 'w')
      continue;
    for (unsigned long p = a; !head && p + sizeof(struct smr_links) <= b; p += 8) {
      const struct smr_links *c = (const struct smr_links *)p;
      struct smr_links n;
      if (!c->next || (void *)c->next == c || ((uintptr_t)c->next & 7) ||
          !smr_peek(c->next, &n, sizeof(n)) || (void *)n.prev != c)
        continue;
      if (smr_ring_holds((struct smr_links *)p, name))
        head = (struct smr_links *)p;
    }
  }
  fclose(maps);
  return head;
}

/* Whether an open endpoint may hold name's region through the list. */
static bool smr_in_use(const char *name) {
  for (struct ofi_ep *o = smr_live; o; o = o->smr_next) {
    if (o->peers && !o->db_peers)
      return true; /* peers' names unknown */
    for (int r = 0; o->db_peers && r < o->nranks; r++)
      if (strcmp(o->db_peers[r].shm_name, name) == 0)
        return true;
  }
  return false;
}

/* Whether every entry on the list is one of ours (under smr_mu). */
static bool smr_ours_alone(void) {
  for (struct smr_links *e = smr_head->next; e != smr_head; e = e->next)
    if (strncmp((const char *)e - SMR117_LINKS, "chorus-", 7) != 0)
      return false;
  return true;
}

/* Takes name's entry off the list, if it is there (under smr_mu). */
static void smr_forget(const char *name) {
  for (struct smr_links *e = smr_head->next; e != smr_head; e = e->next)
    if (strcmp((const char *)e - SMR117_LINKS, name) == 0) {
      e->prev->next = e->next;
      e->next->prev = e->prev;
      free((char *)e - SMR117_LINKS);
      return;
    }
}

/* Leaves the list alone for good (under smr_mu). */
static void smr_give_up(void) {
  smr_off = true;
  for (size_t i = 0; i < smr_nretired; i++)
    free(smr_retired[i]);
  free(smr_retired);
  smr_retired = NULL;
  smr_nretired = 0;
}

/* Adds name to smr_retired (under smr_mu); false when out of memory. */
static bool smr_retire(const char *name) {
  char **grown = realloc(smr_retired, (smr_nretired + 1) * sizeof(*grown));
  if (!grown)
    return false;
  smr_retired = grown;
  if (!(smr_retired[smr_nretired] = strdup(name)))
    return false;
  smr_nretired++;
  return true;
}

/* After o's enable (under smr_mu): track its entry if shm 1.17 made one. */
static void smr_track(struct ofi_ep *o) {
  if (smr_off || !ofi_smr117(o))
    return;
  o->smr_next = smr_live;
  smr_live = o;
}

/* After o's close (every fid of it closed): its entry, and any left
 * before that no open endpoint needs now, come off the list. */
static void smr_untrack(struct ofi_ep *o) {
  struct ofi_ep **pp = &smr_live;
  pthread_mutex_lock(&smr_mu);
  while (*pp && *pp != o)
    pp = &(*pp)->smr_next;
  if (*pp) {
    *pp = o->smr_next;
    if (!smr_off && !smr_head)
      smr_head = smr_find_head(o->region);
    if (!smr_off && (!smr_head || !smr_ours_alone() || !smr_retire(o->region)))
      smr_give_up();
    size_t keep = 0;
    for (size_t i = 0; i < smr_nretired; i++) {
      if (smr_in_use(smr_retired[i])) {
        smr_retired[keep++] = smr_retired[i];
        continue;
      }
      smr_forget(smr_retired[i]);
      free(smr_retired[i]);
    }
    smr_nretired = keep;
  }
  pthread_mutex_unlock(&smr_mu);
}

/* fi_close of an AV under smr_mu (shm's AV close reads the list). */
static void smr_close_av(struct fid_av *av) {
  pthread_mutex_lock(&smr_mu);
  fi_close(&av->fid);
  pthread_mutex_unlock(&smr_mu);
}

static int ofi_open_cq(struct ofi_ep *o) {
  struct fi_cq_attr attr = {
      .format = FI_CQ_FORMAT_TAGGED,
      .size = o->info->tx_attr->size + o->info->rx_attr->size,
      .wait_obj = FI_WAIT_NONE,
  };
  int rc;

  if (o->wait == OFI_WAIT_CQ_FD) {
    attr.wait_obj = FI_WAIT_FD;
    rc = fi_cq_open(o->domain, &attr, &o->cq, NULL);
    if (!rc) {
      rc = fi_control(&o->cq->fid, FI_GETWAIT, &o->cq_fd);
      if (!rc && o->cq_fd >= 0)
        return 0;
      fi_close(&o->cq->fid);
      o->cq = NULL;
    }
    /* No usable wait object: fall back to a timer. */
    o->wait = OFI_WAIT_TIMER;
    o->cq_fd = -1;
    attr.wait_obj = FI_WAIT_NONE;
  }
  return fi_cq_open(o->domain, &attr, &o->cq, NULL);
}

/* Bytes of the bounce region (see "Bounce slots"): twice a core's L2 cache
 * (1 MiB when the C library does not know it), at most
 * OFI_BOUNCE_REGION_MAX, in whole pages a slot, and at least a message of
 * `slot` bytes a slot. */
static size_t ofi_bounce_region(size_t slot) {
  long l2 = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
  l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  size_t region = l2 > 0 ? 2 * (size_t)l2 : (size_t)2 << 20;
  if (region > OFI_BOUNCE_REGION_MAX)
    region = OFI_BOUNCE_REGION_MAX;
  size_t share = region / OFI_BOUNCE_SLOTS & ~(size_t)4095;
  if (share < slot)
    share = slot;
  return share * OFI_BOUNCE_SLOTS;
}

/* Names of shm regions (see "Names"): pid, rank, nonce, start time, PID namespace. */
#define NAMES_FORMAT "chorus-%d-%d-%016llx-%llu-%llu"
static uint64_t names_pidns(void);
static bool names_start_time(int32_t pid, uint64_t *start);
static int names_sweep(void);
static bool names_all_mapped(const struct ofi_ep *o);

static int ofi_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen) {
  unsigned char fab[OFI_FABNAME_MAX];
  size_t fab_len = sizeof(fab) - 1;
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  struct ofi_ep *o;
  const char *prov;
  size_t i;
  int rc;

  if (out)
    *out = NULL;
  if (!cfg || !out || !cfg->name || cfg->nranks <= 0 || cfg->rank < 0 || cfg->rank >= cfg->nranks) {
    prov_errf(errbuf, errlen, "ofi: bad configuration");
    return -EINVAL;
  }
  o = calloc(1, sizeof(*o));
  if (!o) {
    prov_errf(errbuf, errlen, "ofi: out of memory");
    return -ENOMEM;
  }
  o->base.ops = &prov_ofi_ops;
  o->base.name = o->prov_name;
  o->base.last_error = o->errmsg;
  pthread_mutex_init(&o->wedge_mu, NULL);
  o->rank = cfg->rank;
  o->nranks = cfg->nranks;
  o->cq_fd = o->db_epfd = o->db_sock = o->db_timer = o->db_memfd = -1;
  o->pid = (int32_t)getpid();
  prov = ofi_prov_name(cfg->name);

  o->directed = true;
  const char *source = ofi_source(cfg);
  rc = ofi_getinfo(prov, FI_TAGGED | FI_DIRECTED_RECV, source, cfg->nranks, &o->info);
  if (rc == -FI_ENODATA) {
    o->directed = false;
    rc = ofi_getinfo(prov, FI_TAGGED, source, cfg->nranks, &o->info);
  }
  if (rc) {
    prov_errf(errbuf, errlen, "ofi: no libfabric provider \"%s\" with RDM tagged messaging: %s",
              prov, fi_strerror(-rc));
    rc = rc == -FI_ENODATA ? -ENODEV : ofi_to_errno(rc);
    goto out_free_ep;
  }
  snprintf(o->prov_name, sizeof(o->prov_name), "%s", o->info->fabric_attr->prov_name);
  o->directed = o->directed && (o->info->caps & FI_DIRECTED_RECV);
  o->inject_len = o->info->tx_attr->inject_size;
  /* 8 bytes of remote CQ data carry the engine's immediate data */
  o->cq_data = o->info->domain_attr->cq_data_size >= sizeof(uint64_t);
  o->max_posted = ofi_safe_posted(o->info);
  if (strcmp(o->prov_name, "shm") == 0) {
    o->wait = OFI_WAIT_DOORBELL;
    o->rndv = !db_cma_disabled() && o->cq_data;
    o->bounce_max = cfg->shm_bounce == PROV_BOUNCE_NONE ? 0
                    : cfg->shm_bounce                   ? cfg->shm_bounce
                                                        : OFI_BOUNCE_DEFAULT;
    if (o->bounce_max > OFI_BOUNCE_MAX)
      o->bounce_max = OFI_BOUNCE_MAX;
    o->bounce_slot = (o->bounce_max + 4095) & ~(size_t)4095;
    o->bounce_share = ofi_bounce_region(o->bounce_slot) / OFI_BOUNCE_SLOTS;
    if (o->rndv && o->bounce_max &&
        memreg_alloc((void **)&o->bounce, o->bounce_share * OFI_BOUNCE_SLOTS) == 0) {
      o->bounce_free = OFI_BOUNCE_SLOTS == 32 ? ~0u : (1u << OFI_BOUNCE_SLOTS) - 1;
      memset(o->bounce, 0, o->bounce_share * OFI_BOUNCE_SLOTS);
    }
    /* shm's receive queue holds our posted receives, the receives of
     * rendezvous acks (one per send) and every message that came before its
     * receive: 2/7 of it each for our receives and our sends' acks (64 of
     * the 224 we use of OFI_SHM_QUEUE_SIZE), the rest for the windows of all
     * senders (see "the window"); without rendezvous, half and half */
    size_t safe = o->max_posted, room;
    o->max_posted = o->rndv ? safe * 2 / 7 : safe / 2;
    if (!o->max_posted)
      o->max_posted = 1;
    room = safe > o->max_posted * (o->rndv ? 2 : 1) ? safe - o->max_posted * (o->rndv ? 2 : 1) : 1;
    o->window = (uint32_t)(room / (size_t)cfg->nranks ? room / (size_t)cfg->nranks : 1);
  } else if (strncmp(o->prov_name, "udp", 3) == 0) {
    o->wait = OFI_WAIT_TIMER;
    /* udp;ofi_rxd stalls silently, for good, once a peer has more
     * unacknowledged messages than its window: stay well inside it */
    if (o->max_posted > OFI_RXD_MAX_POSTED)
      o->max_posted = OFI_RXD_MAX_POSTED;
  } else
    o->wait = OFI_WAIT_CQ_FD;

  if (o->wait == OFI_WAIT_DOORBELL && o->info->addr_format == FI_ADDR_STR) {
    /* shm names its region after its address, by default the pid: a
     * process killed before it could unlink it leaves the name taken for
     * the next process that gets the pid (EBUSY). Ours are unique, and say
     * who made them (see "Names"). chorus-run (remove_rank_regions) and the
     * tests (mp_count_dev_shm_of) find a rank's by the "chorus-PID-"
     * prefix: change them with it. */
    struct timespec ts;
    char name[sizeof(o->region) + 9];
    uint64_t start = 0, pidns = names_pidns();
    if (pidns && !names_start_time(o->pid, &start))
      pidns = 0;
    o->pidns = pidns;
    (void)names_sweep();
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t nonce = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^
                     ((uint64_t)(uintptr_t)o << 7) ^ ((uint64_t)o->pid << 40);
    snprintf(name, sizeof(name), "chorus://" NAMES_FORMAT, (int)o->pid, cfg->rank,
             (unsigned long long)nonce, (unsigned long long)start, (unsigned long long)pidns);
    char *dup = strdup(name);
    if (dup) {
      free(o->info->src_addr);
      o->info->src_addr = dup;
      o->info->src_addrlen = strlen(dup) + 1;
      snprintf(o->region, sizeof(o->region), "%s", name + 9);
    }
  }
  rc = fi_fabric(o->info->fabric_attr, &o->fabric, NULL);
  if (rc) {
    prov_errf(errbuf, errlen, "ofi %s: fi_fabric: %s", o->prov_name, fi_strerror(-rc));
    goto out_free_info;
  }
  rc = fi_domain(o->fabric, o->info, &o->domain, NULL);
  if (rc) {
    prov_errf(errbuf, errlen, "ofi %s: fi_domain: %s", o->prov_name, fi_strerror(-rc));
    goto out_close_fabric;
  }
  av_attr.count = (size_t)cfg->nranks;
  rc = fi_av_open(o->domain, &av_attr, &o->av, NULL);
  if (rc) {
    prov_errf(errbuf, errlen, "ofi %s: fi_av_open: %s", o->prov_name, fi_strerror(-rc));
    goto out_close_domain;
  }
  rc = ofi_open_cq(o);
  if (rc) {
    prov_errf(errbuf, errlen, "ofi %s: fi_cq_open: %s", o->prov_name, fi_strerror(-rc));
    goto out_close_av;
  }
  rc = fi_endpoint(o->domain, o->info, &o->ep, NULL);
  if (rc) {
    prov_errf(errbuf, errlen, "ofi %s: fi_endpoint: %s", o->prov_name, fi_strerror(-rc));
    goto out_close_cq;
  }
  rc = fi_ep_bind(o->ep, &o->av->fid, 0);
  if (!rc)
    rc = fi_ep_bind(o->ep, &o->cq->fid, FI_TRANSMIT | FI_RECV);
  if (!rc) {
    pthread_mutex_lock(&smr_mu);
    rc = fi_enable(o->ep);
    if (!rc)
      smr_track(o);
    pthread_mutex_unlock(&smr_mu);
  }
  if (!rc)
    rc = fi_getname(&o->ep->fid, fab, &fab_len);
  if (rc) {
    prov_errf(errbuf, errlen, "ofi %s: endpoint setup: %s", o->prov_name, fi_strerror(-rc));
    goto out_close_endpoint;
  }
  o->region_named = o->region[0] != '\0';
  /* FI_ADDR_STR names go back to fi_av_insert as C strings. */
  if (o->info->addr_format == FI_ADDR_STR && (fab_len == 0 || fab[fab_len - 1] != '\0'))
    fab[fab_len++] = '\0';
  if (o->info->addr_format == FI_SOCKADDR_IN && fab_len >= sizeof(struct sockaddr_in))
    o->listen_port = ntohs(((const struct sockaddr_in *)fab)->sin_port);
  else if (o->info->addr_format == FI_SOCKADDR_IN6 && fab_len >= sizeof(struct sockaddr_in6))
    o->listen_port = ntohs(((const struct sockaddr_in6 *)fab)->sin6_port);
  if (o->wait == OFI_WAIT_TIMER) /* udp: see ofi_rxd_window_env */
    ofi_each_port_sock(o->listen_port, ofi_raise_rcvbuf, NULL);

  o->slots = calloc(2 * o->max_posted, sizeof(*o->slots));
  if (!o->slots) {
    rc = -FI_ENOMEM;
    prov_errf(errbuf, errlen, "ofi %s: out of memory", o->prov_name);
    goto out_close_endpoint;
  }
  for (i = 2 * o->max_posted; i-- > 0;) {
    struct ofi_slot *s = &o->slots[i];

    s->is_send = i < o->max_posted;
    s->next_free = s->is_send ? o->tx_free : o->rx_free;
    *(s->is_send ? &o->tx_free : &o->rx_free) = s;
  }

  if (o->wait == OFI_WAIT_DOORBELL) {
    rc = db_open(o, cfg, errbuf, errlen);
    if (rc)
      goto out_free_slots;
  }
  rc = addr_build(o, fab, fab_len);
  if (rc) {
    prov_errf(errbuf, errlen, "ofi %s: address too long", o->prov_name);
    goto out_close_doorbell;
  }
  *out = &o->base;
  return 0;

out_close_doorbell:
  db_close(o);
out_free_slots:
  free(o->slots);
out_close_endpoint:
  fi_close(&o->ep->fid);
out_close_cq:
  fi_close(&o->cq->fid);
out_close_av:
  smr_close_av(o->av);
out_close_domain:
  fi_close(&o->domain->fid);
out_close_fabric:
  fi_close(&o->fabric->fid);
  smr_untrack(o);
out_free_info:
  fi_freeinfo(o->info);
  rc = ofi_to_errno(rc);
out_free_ep:
  pthread_mutex_destroy(&o->wedge_mu);
  free(o);
  return rc;
}

static int ofi_getname(prov_t *p, void *addr, size_t *len) {
  struct ofi_ep *o = to_ofi(p);

  return prov_copy_name(o->addr, o->addrlen, addr, len);
}

static int add_peers_locked(prov_t *p, const void *const *addrs, const size_t *lens, int n) {
  struct ofi_ep *o = to_ofi(p);
  bool no_cma = db_cma_disabled();
  struct ofi_peer_addr pa;
  int i, rc;

  if (o->peers) {
    ofi_seterr(o, "add_peers called twice");
    return -EALREADY;
  }
  if (n != o->nranks || !addrs || !lens) {
    ofi_seterr(o, "add_peers got %d addresses for %d ranks", n, o->nranks);
    return -EINVAL;
  }
  o->peers = calloc((size_t)n, sizeof(*o->peers));
  if (!o->peers)
    return -ENOMEM;
  if (o->wait == OFI_WAIT_DOORBELL) {
    o->db_peers = calloc((size_t)n, sizeof(*o->db_peers));
    o->sent = calloc((size_t)n, sizeof(*o->sent));
    o->held = calloc((size_t)n, sizeof(*o->held));
    if (!o->db_peers || !o->sent || !o->held) {
      rc = -ENOMEM;
      goto out_free_peers;
    }
  }
  for (i = 0; i < n; i++) {
    rc = addr_parse(addrs[i], lens[i], &pa);
    if (rc || (o->db_peers && !pa.has_db)) {
      ofi_seterr(o, "address of rank %d is not a chorus %s address", i, o->prov_name);
      rc = -EINVAL;
      goto out_unmap_peers;
    }
    rc = fi_av_insert(o->av, pa.fab, 1, &o->peers[i], 0, NULL);
    if (rc != 1) {
      ofi_seterr(o, "fi_av_insert of rank %d: %s", i, rc < 0 ? fi_strerror(-rc) : "rejected");
      rc = rc < 0 ? ofi_to_errno(rc) : -EINVAL;
      goto out_unmap_peers;
    }
    if (o->db_peers) {
      struct ofi_db_peer *d = &o->db_peers[i];

      db_peer_names(d, &pa);
      memcpy(d->shm_name, d->region, sizeof(d->shm_name));
      db_peer_attach(d, pa.pid, pa.memfd, pa.nonce);
      d->pid = pa.pid;
      d->sar = no_cma || !db_cma_works(pa.pid, pa.va, pa.nonce);
    }
  }
  /* Peers wait for this in settle before they remove their names. */
  if (o->db_peers)
    atomic_store_explicit(&o->db_page->mapped,
                          names_all_mapped(o) ? OFI_MAPPED_ALL : OFI_MAPPED_SOME,
                          memory_order_release);
  return 0;

out_unmap_peers:
  if (o->db_peers) {
    while (i-- > 0)
      if (o->db_peers[i].page)
        munmap(o->db_peers[i].page, o->db_peers[i].page_len);
    free(o->db_peers);
    o->db_peers = NULL;
  }
  /* AV entries already inserted stay: a second add_peers is refused anyway. */
out_free_peers:
  free(o->db_peers);
  o->db_peers = NULL;
  free(o->sent);
  o->sent = NULL;
  free(o->held);
  o->held = NULL;
  free(o->peers);
  o->peers = NULL;
  return rc;
}

/* Under smr_mu: shm's fi_av_insert reads its list of names, and the
 * peers' names kept here say which entries of it are still in use. */
static int ofi_add_peers(prov_t *p, const void *const *addrs, const size_t *lens, int n) {
  pthread_mutex_lock(&smr_mu);
  int rc = add_peers_locked(p, addrs, lens, n);
  pthread_mutex_unlock(&smr_mu);
  return rc;
}

static int ofi_check_post(struct ofi_ep *o, int peer, size_t len, const void *buf, prov_op_t *op) {
  if (o->closing)
    return -ESHUTDOWN;
  if (!op || !op->done || (len && !buf))
    return -EINVAL;
  if (!o->peers || peer < 0 || peer >= o->nranks)
    return -EINVAL;
  return 0;
}

/* A failed post: -EAGAIN when the provider's queues are full. */
static int ofi_post_failed(struct ofi_ep *o, struct ofi_slot *s, ssize_t rc, const char *what) {
  int peer = s->peer;
  uint64_t tag = s->tag;

  s->op->internal[PROV_OP_OWNER] = NULL;
  s->op->internal[PROV_OP_REQ] = NULL;
  slot_put(o, s);
  if (rc == -FI_EAGAIN || rc == -FI_ENOMEM) {
    if (o->wait == OFI_WAIT_DOORBELL)
      db_want_ring(o, peer);
    return -EAGAIN;
  }
  ofi_seterr(o, "%s rank %d tag %#llx: %s", what, peer, (unsigned long long)tag,
             fi_strerror((int)-rc));
  return ofi_to_errno(rc);
}

static struct ofi_slot *ofi_slot_fill(struct ofi_ep *o, bool is_send, prov_t *p, int peer,
                                      size_t len, uint64_t tag, prov_op_t *op) {
  struct ofi_slot *s = slot_get(o, is_send);

  if (!s)
    return NULL;
  s->op = op;
  s->peer = peer;
  s->len = len;
  s->tag = tag;
  s->nap = OFI_NAP_NONE;
  op->internal[PROV_OP_OWNER] = p;
  op->internal[PROV_OP_REQ] = s;
  return s;
}

static void db_track_nap(struct ofi_ep *o, struct ofi_slot *s) {
  if (s->len <= o->inject_len)
    return;
  if (o->db_peers[s->peer].sar)
    s->nap = OFI_NAP_SAR;
  else if (s->is_send)
    s->nap = OFI_NAP_SEND;
  else
    return;
  o->db_nap_ops++;
  o->db_nap_sar += s->nap == OFI_NAP_SAR;
}

/* ---- single-copy rendezvous (shm with CMA) ----
 *
 * libfabric's shm copies large messages with CMA too, but does it holding
 * the receiver's region lock, which senders then spin on: measured here it
 * ran at a third of process_vm_readv's own speed. Worse, it completes a
 * sender's non-inject sends in the order they were posted (one response
 * queue per sender, read from its head): a send whose receiver has not
 * posted the receive yet holds back the completion of every later send,
 * even of sends already received. A schedule where a receive waits for a
 * later send to finish (a ring reusing its scratch slots) then deadlocks
 * across ranks. So for every message above the inject size, to a peer that
 * allows CMA:
 *   sender    posts a receive for the ack (tag OFI_TAG_ACK | cookie), then
 *             sends a descriptor {addr, len, cookie, pid} with remote CQ
 *             data OFI_RNDV_DATA on the message's own tag;
 *   receiver  gets the descriptor in its buffer (matched as usual by tag),
 *             copies the data with process_vm_readv, then injects the ack
 *             (its status) and rings the sender if it sleeps;
 *   sender    completes the op when both the descriptor send and the ack
 *             came back, with the receiver's status.
 * A message of up to bounce_max bytes from memory peers can not map (or
 * from any memory, with PROV_OP_BOUNCE) is copied into a bounce slot first,
 * and the op is done once the descriptor left. Then the ack only gives the
 * slot back; when we map the receiver's doorbell page it does not even do
 * that: the descriptor asks for a mark (OFI_DESC_MARK and the slot's
 * number), the receiver sets the slot's bit in its page's bounce_done[our
 * rank] instead of sending an ack, and we take marked slots back when we
 * run out of free ones (ofi_bounce_take).
 * One message instead of two on the 32 KiB path, and no wake-up for it.
 * The engine never sets bit 63 of a tag (prov.h), so acks can not collide.
 *
 * Ack rings. When we map the receiver's page and fewer than OFI_ACK_RING
 * acks from it are due, a CMA send asks for its ack by ring (OFI_DESC_RING)
 * and posts no ack receive: the receiver writes {cookie, status} into the
 * ring its page keeps for us and moves the ring's head on, then rings us if
 * we sleep; progress() reads every ring with acks due (ofi_ack_rings_read),
 * and arm() does not sleep on an unread one. A stale ack (a cancelled send)
 * finds the slot's generation moved on. An ack message takes the peer's
 * region lock in libfabric's shm, which the peer takes too for its own
 * messages; a ring takes none. (Acking nothing at all, unsafe, was worth
 * little more; injecting the descriptor nothing.)
 */

static bool ofi_use_rndv(const struct ofi_ep *o, int peer, size_t len) {
  return o->rndv && len > o->inject_len && o->db_peers && !o->db_peers[peer].sar;
}

static uint32_t ofi_slot_index(const struct ofi_ep *o, const struct ofi_slot *s) {
  return (uint32_t)(s - o->slots);
}

/* Takes a free bounce slot (its index), or -1 when none is. Slots handed
 * back by mark are taken back here, only once the free ones ran out: the
 * receiver's page is read no more often than that. */
static int ofi_bounce_take(struct ofi_ep *o) {
  uint32_t out = o->bounce_out;

  while (!o->bounce_free && out) {
    int peer = o->bounce_to[__builtin_ctz(out)];
    _Atomic uint32_t *w =
        db_done_word(o->db_peers[peer].page, o->db_peers[peer].page_len, o->nranks, o->rank);
    uint32_t done = w && atomic_load_explicit(w, memory_order_relaxed)
                        ? atomic_exchange_explicit(w, 0, memory_order_acquire)
                        : 0;

    uint32_t mine = 0; /* the slots out to this peer: only those can it mark */
    for (uint32_t m = out; m; m &= m - 1)
      if (o->bounce_to[__builtin_ctz(m)] == peer)
        mine |= m & -m;
    out &= ~mine;
    done &= mine;
    o->bounce_out &= ~done;
    o->bounce_free |= done;
  }
  if (!o->bounce_free)
    return -1;
  int k = __builtin_ctz(o->bounce_free);
  o->bounce_free &= ~(1u << k);
  return k;
}

/* Copies len bytes into bounce slot k, at the slot's next place (see
 * "Bounce slots"); returns where the copy is. */
static unsigned char *ofi_bounce_copy(struct ofi_ep *o, int k, const void *buf, size_t len) {
  unsigned char *copy = o->bounce + (size_t)k * o->bounce_share + o->bounce_at[k];

  o->bounce_at[k] += (len + 4095) & ~(size_t)4095;
  if (o->bounce_at[k] + o->bounce_slot > o->bounce_share)
    o->bounce_at[k] = 0;
  memcopy(copy, buf, len);
  return copy;
}

static int ofi_post_rndv_send(struct ofi_ep *o, struct ofi_slot *s, const void *buf, size_t len) {
  ssize_t rc;

  s->gen++;
  s->desc.addr = (uint64_t)(uintptr_t)buf;
  s->desc.len = len;
  s->desc.cookie = ((uint64_t)s->gen << 32) | ofi_slot_index(o, s);
  s->desc.pid = o->pid;
  s->desc.magic = OFI_RNDV_DATA;
  s->desc.data = s->op->data & ~PROV_DATA_VALID;
  memreg_info_t mi;
  int k;
  s->bounce = s->bounce_mark = 0;
  s->desc.flags = 0;
  if (o->bounce && len <= o->bounce_max &&
      ((s->op->flags & PROV_OP_BOUNCE) || !memreg_lookup(buf, len, &mi)) &&
      (k = ofi_bounce_take(o)) >= 0) {
    unsigned char *copy = ofi_bounce_copy(o, k, buf, len);
    buf = copy;
    s->desc.addr = (uint64_t)(uintptr_t)copy;
    s->desc.flags = OFI_DESC_BOUNCE;
    if (db_done_word(o->db_peers[s->peer].page, o->db_peers[s->peer].page_len, o->nranks,
                     o->rank)) {
      /* the receiver marks it done in its page, which we map: no ack */
      s->desc.flags |= OFI_DESC_MARK | (uint32_t)k << 8;
      s->bounce_mark = k + 1;
      o->bounce_out |= 1u << k;
      o->bounce_to[k] = s->peer;
    } else {
      s->bounce = k + 1;
    }
  }
  struct ofi_db_peer *dp = &o->db_peers[s->peer];
  const bool ring = !s->bounce && !s->bounce_mark && dp->ack_out < OFI_ACK_RING &&
                    db_ack_ring(dp->page, dp->page_len, o->nranks, o->rank);
  if (ring)
    s->desc.flags |= OFI_DESC_RING;
  if (memreg_lookup(buf, len, &mi)) {
    s->desc.rid = mi.id;
    s->desc.ino = mi.ino;
    s->desc.roff = mi.off;
    s->desc.rfd = mi.fd;
  } else {
    s->desc.rid = 0;
  }
  s->rndv_status = 0;
  s->ack_status = -EIO;
  rc = fi_tsenddata(o->ep, &s->desc, sizeof(s->desc), NULL, OFI_RNDV_MARK, o->peers[s->peer],
                    s->tag, &s->fctx);
  if (rc) {
    if (s->bounce) /* never sent: nobody reads it */
      o->bounce_free |= 1u << (s->bounce - 1);
    if (s->bounce_mark) {
      o->bounce_out &= ~(1u << (s->bounce_mark - 1));
      o->bounce_free |= 1u << (s->bounce_mark - 1);
    }
    s->bounce = s->bounce_mark = 0;
    return ofi_post_failed(o, s, rc, "send to");
  }
  s->rndv_pending = OFI_RNDV_DESC;
  if (ring) {
    /* the ack comes by the receiver's ring (ofi_ack_rings_read) */
    s->rndv_pending |= OFI_RNDV_RING;
    dp->ack_out++;
    o->ack_out++;
  } else if (!s->bounce_mark) {
    /* (marked: done when the descriptor left, the data is in the slot) The
     * ack may already be on its way: libfabric keeps it as unexpected until
     * this receive is posted. The pool sizes keep room for it. */
    rc = fi_trecv(o->ep, &s->ack_status, sizeof(s->ack_status), NULL,
                  o->directed ? o->peers[s->peer] : FI_ADDR_UNSPEC,
                  OFI_TAG_ACK | (s->desc.cookie & ~OFI_TAG_ACK), 0, &s->ack_fctx);
    if (rc) {
      ofi_seterr(o, "rendezvous to rank %d: posting the ack receive failed: %s", s->peer,
                 fi_strerror((int)-rc));
      s->rndv_status = -EIO;
    } else {
      s->rndv_pending |= OFI_RNDV_ACK;
    }
  }
  if (o->wait == OFI_WAIT_DOORBELL)
    db_ring_if_sleeping(o, s->peer);
  return 0;
}

static void ofi_queue_ack(struct ofi_ep *o, int peer, uint64_t cookie, int32_t status) {
  if (o->nacks == o->cap_acks) {
    size_t ncap = o->cap_acks ? 2 * o->cap_acks : 16;
    struct ofi_ack *n = realloc(o->acks, ncap * sizeof(*n));
    if (!n) {
      ofi_seterr(o, "out of memory queueing an ack to rank %d", peer);
      return;
    }
    o->acks = n;
    o->cap_acks = ncap;
  }
  o->acks[o->nacks++] = (struct ofi_ack){peer, cookie, status};
}

static bool ofi_send_ack(struct ofi_ep *o, int peer, uint64_t cookie, int32_t status) {
  ssize_t rc = fi_tinject(o->ep, &status, sizeof(status), o->peers[peer],
                          OFI_TAG_ACK | (cookie & ~OFI_TAG_ACK));
  if (rc == -FI_EAGAIN)
    return false;
  if (rc)
    ofi_seterr(o, "ack to rank %d: %s", peer, fi_strerror((int)-rc));
  db_ring_if_sleeping(o, peer);
  return true;
}

static void ofi_flush_acks(struct ofi_ep *o) {
  size_t k = 0;
  for (size_t i = 0; i < o->nacks; i++)
    if (!ofi_send_ack(o, o->acks[i].peer, o->acks[i].cookie, o->acks[i].status))
      o->acks[k++] = o->acks[i];
  o->nacks = k;
}

/* We are done with a rendezvous message from peer: ack it (the cookie), by
 * a message or, when the sender asked for it, in our page's ring for it; or
 * when the sender asked for a mark (its bounce slot `id`), set the slot's
 * bit in our page, where the sender looks when it needs the slot. */
static void ofi_rndv_done(struct ofi_ep *o, int peer, uint64_t id, enum ofi_done_how how,
                          int32_t status) {
  if (how == OFI_DONE_MARK) {
    atomic_fetch_or_explicit(db_done_word(o->db_page, o->db_page_len, o->nranks, peer), 1u << id,
                             memory_order_release);
    o->rndv_stats.bounce_marks++;
    return;
  }
  if (how == OFI_DONE_RING) {
    /* the sender keeps at most OFI_ACK_RING acks due: the entry is free */
    struct ofi_ack_ring *r = db_ack_ring(o->db_page, o->db_page_len, o->nranks, peer);
    uint32_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    r->e[h % OFI_ACK_RING] = (struct ofi_ack_entry){.cookie = id, .status = status};
    atomic_store_explicit(&r->head, h + 1, memory_order_release);
    o->rndv_stats.ring_acks++;
    db_ring_if_sleeping(o, peer);
    return;
  }
  if (!ofi_send_ack(o, peer, id, status))
    ofi_queue_ack(o, peer, id, status);
}

/* ---- a peer's rendezvous descriptor: what is checked before it is used ---- */

/* Reads the descriptor that came from the peer as a message of
 * sizeof(*d) bytes (ofi_complete checks its length) into *d, for a receive
 * buffer of rlen bytes: 0, -EPROTO when it is not a descriptor, -EMSGSIZE
 * when its data would not fit the buffer. */
static int rndv_desc_read(const void *msg, size_t rlen, struct ofi_rndv_desc *d) {
  memcpy(d, msg, sizeof(*d));
  if (d->magic != OFI_RNDV_DATA)
    return -EPROTO;
  return d->len > rlen ? -EMSGSIZE : 0;
}

/* Whether the data of descriptor d lies inside a region of `size` bytes. */
static bool rndv_in_region(const struct ofi_rndv_desc *d, uint64_t size) {
  return d->roff <= size && d->len <= size - d->roff;
}

int prov_ofi_test_rndv_desc(const void *msg, size_t len, size_t rlen, uint64_t region_size,
                            uint64_t *off, uint64_t *n) {
  struct ofi_rndv_desc d;
  int rc;

  *off = *n = 0;
  if (len != sizeof(d))
    return 1; /* an ordinary message */
  rc = rndv_desc_read(msg, rlen, &d);
  if (rc)
    return rc;
  *n = d.len;
  if (!d.rid || !rndv_in_region(&d, region_size))
    return 2; /* not in the region: process_vm_readv of d.len bytes */
  *off = d.roff;
  return 0;
}

/* The data of descriptor d in this process, when the sender's buffer lies
 * in a region we can map (cached, least recently used mapping evicted);
 * NULL otherwise (then CMA is used). */
static const unsigned char *ofi_map_region(struct ofi_ep *o, const struct ofi_rndv_desc *d) {
  struct ofi_map *m, *victim = &o->maps[0];
  char path[64];
  struct stat st;
  void *p;
  int fd;

  if (!d->rid)
    return NULL;
  for (int i = 0; i < OFI_MAPS; i++) {
    m = &o->maps[i];
    if (m->base && m->pid == d->pid && m->rid == d->rid) {
      if (!rndv_in_region(d, m->size))
        return NULL;
      m->last_use = ++o->map_uses;
      return m->base + d->roff;
    }
    if (!m->base || (victim->base && m->last_use < victim->last_use))
      victim = m;
  }
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)d->pid, (int)d->rfd);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  /* the fd number might have been reused: the inode tells */
  if (fstat(fd, &st) || (uint64_t)st.st_ino != d->ino || !rndv_in_region(d, (uint64_t)st.st_size)) {
    close(fd);
    return NULL;
  }
  p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return NULL;
  if (victim->base)
    munmap((void *)victim->base, victim->size);
  *victim = (struct ofi_map){d->pid, d->rid, p, (size_t)st.st_size, ++o->map_uses};
  return victim->base + d->roff;
}

static void ofi_unmap_all(struct ofi_ep *o) {
  for (int i = 0; i < OFI_MAPS; i++)
    if (o->maps[i].base) {
      munmap((void *)o->maps[i].base, o->maps[i].size);
      o->maps[i].base = NULL;
    }
}

/* A descriptor landed in the receive buffer of s: copy the data (or lend
 * it, see PROV_OP_BORROW), ack it. Returns the status to deliver; *len is
 * set to the bytes received. */
static int ofi_rndv_pull(struct ofi_ep *o, struct ofi_slot *s, void *buf, size_t *len) {
  struct ofi_rndv_desc d;
  const unsigned char *mapped;
  int status = rndv_desc_read(buf, s->len, &d);

  if (status == -EPROTO) {
    ofi_seterr(o, "recv from rank %d: malformed rendezvous descriptor", s->peer);
    return -EPROTO;
  }
  bool mark = d.flags & OFI_DESC_MARK, ring = d.flags & OFI_DESC_RING;
  uint64_t id = mark ? OFI_DESC_SLOT(d.flags) : d.cookie;
  if ((mark && (ring || id >= OFI_BOUNCE_SLOTS || !(d.flags & OFI_DESC_BOUNCE) || !o->db_page)) ||
      (ring && !db_ack_ring(o->db_page, o->db_page_len, o->nranks, s->peer))) {
    ofi_seterr(o, "recv from rank %d: malformed rendezvous descriptor", s->peer);
    return -EPROTO;
  }
  const enum ofi_done_how how = mark ? OFI_DONE_MARK : ring ? OFI_DONE_RING : OFI_DONE_ACK;
  s->marked = mark;
  s->op->data = PROV_DATA_VALID | d.data;
  if (!status && (mapped = ofi_map_region(o, &d))) {
    *len = (size_t)d.len;
    bool bounced = d.flags & OFI_DESC_BOUNCE;
    if (bounced) {
      o->rndv_stats.bounce_bytes += d.len;
      if (d.roff + d.len > o->rndv_stats.bounce_reach)
        o->rndv_stats.bounce_reach = d.roff + d.len;
    }
    if (s->op->flags & PROV_OP_BORROW) {
      /* the ack waits for release() */
      if (!bounced)
        o->rndv_stats.borrowed_bytes += d.len;
      s->op->borrowed = mapped;
      s->op->internal[2] = (void *)(uintptr_t)id;
      s->op->internal[3] = (void *)((intptr_t)s->peer << 2 | how);
      return 0;
    }
    memcopy(buf, mapped, (size_t)d.len);
    if (!bounced)
      o->rndv_stats.mapped_bytes += d.len;
    ofi_rndv_done(o, s->peer, id, how, 0);
    return 0;
  }
  if (status) { /* -EMSGSIZE */
    ofi_seterr(o,
               "recv from rank %d tag %#llx: %llu bytes into %zu (message longer than the "
               "receive buffer)",
               s->peer, (unsigned long long)s->tag, (unsigned long long)d.len, s->len);
  } else {
    size_t done = 0;
    while (done < d.len) {
      struct iovec l = {(char *)buf + done, (size_t)d.len - done};
      struct iovec r = {(void *)(uintptr_t)(d.addr + done), (size_t)d.len - done};
      ssize_t got = process_vm_readv(d.pid, &l, 1, &r, 1, 0);
      if (got <= 0) {
        status = got < 0 ? -errno : -EIO;
        ofi_seterr(o, "recv from rank %d: process_vm_readv of %llu bytes from pid %d: %s", s->peer,
                   (unsigned long long)d.len, d.pid, strerror(-status));
        break;
      }
      done += (size_t)got;
    }
    *len = done;
    o->rndv_stats.cma_bytes += done;
  }
  ofi_rndv_done(o, s->peer, id, how, status);
  return status;
}

int prov_ofi_rndv_stats(prov_t *p, prov_ofi_rndv_stats_t *out) {
  if (!p || p->ops != &prov_ofi_ops || !out)
    return -EINVAL;
  const struct ofi_ep *o = to_ofi(p);
  *out = o->rndv_stats;
  out->bounce_region = o->bounce ? o->bounce_share * OFI_BOUNCE_SLOTS : 0;
  return 0;
}

/* Reads /proc/<pid>/<what> into buf (NUL-terminated); false if it can not. */
static bool proc_read(int32_t pid, const char *what, char *buf, size_t len, bool *gone) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *gone = errno == ENOENT;
    return false;
  }
  ssize_t n = read(fd, buf, len - 1);
  close(fd);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  return true;
}

#define OFI_PF_EXITING 0x4ul     /* the kernel's task flag: in do_exit */
#define OFI_SIGKILL_BIT 0x100ull /* SIGKILL (9) in a /proc signal mask */

/* A process that is gone, a zombie nobody reaped yet, or one on its way out
 * (exiting, or SIGKILL pending): none of them touches its region again. A
 * killed process stays on its way out while the kernel takes its memory
 * apart, long under a sanitizer (gigabytes of shadow mappings): a peer that
 * looked for zombies alone then left the region behind. */
static bool pid_dead(int32_t pid) {
  char buf[1024];
  bool gone = false;
  if (pid <= 0)
    return false;
  if (kill(pid, 0) && errno == ESRCH)
    return true;
  if (!proc_read(pid, "stat", buf, sizeof(buf), &gone))
    return gone;
  const char *rp = strrchr(buf, ')');
  if (!rp || rp[1] != ' ')
    return false;
  if (rp[2] == 'Z' || rp[2] == 'X')
    return true;
  int ppid, pgrp, session, tty, tpgid;
  unsigned long flags;
  if (sscanf(rp + 3, "%d %d %d %d %d %lu", &ppid, &pgrp, &session, &tty, &tpgid, &flags) == 6 &&
      (flags & OFI_PF_EXITING))
    return true;
  if (!proc_read(pid, "status", buf, sizeof(buf), &gone))
    return gone;
  static const char *const masks[] = {"\nShdPnd:", "\nSigPnd:"};
  for (size_t i = 0; i < 2; i++) {
    const char *m = strstr(buf, masks[i]);
    unsigned long long bits;
    if (m && sscanf(m + strlen(masks[i]), "%llx", &bits) == 1 && (bits & OFI_SIGKILL_BIT))
      return true;
  }
  return false;
}

bool prov_ofi_test_pid_dead(int32_t pid) {
  return pid_dead(pid);
}

/* ---- locks left held ----
 *
 * libfabric 1.17's shm guards each rank's command queue with a spinlock in
 * that rank's region, taken by every sender to it and by the rank itself as
 * it reads the queue. A process killed while holding one leaves it held for
 * good: every thread that then sends to that rank, or the rank polling its
 * own queue, spins inside libfabric and never returns, even after the
 * watchdog's verdict. So once the communicator failed (the engine calls
 * ofi_unwedge then, from a thread outside the transport) a lock that
 * stays held all through OFI_WEDGE_NS while a peer of this host is dead is
 * freed: whatever its queue still holds belongs to the failed communicator.
 * Where the lock lies is libfabric's own business: it is used only when
 * shm says 1.17 and our own region reads as 1.17 lays it out (our pid, then
 * the region's own address); peers' regions must carry their pid as well.
 */
#define SMR117_PID 4   /* int: the owner's pid */
#define SMR117_BASE 16 /* void *: the region's address in its owner */
#define SMR117_LOCK 24 /* pthread_spinlock_t: the queue's lock */
#define OFI_WEDGE_NS (200l * 1000 * 1000)

static long ofi_elapsed_ns(const struct timespec *t0);

/* The queue lock of the region mapped at r, made by pid (NULL: not laid
 * out as expected). */
static pthread_spinlock_t *wedge_lock_of(unsigned char *r, int32_t pid, bool own) {
  int32_t owner;
  void *base;

  memcpy(&owner, r + SMR117_PID, sizeof(owner));
  memcpy(&base, r + SMR117_BASE, sizeof(base));
  if (owner != pid || (own && base != r))
    return NULL;
  return (pthread_spinlock_t *)(r + SMR117_LOCK);
}

/* The locks, once needed (under wedge_mu, after add_peers, which mapped
 * every peer's region): one read of /proc/self/maps, long in a process with
 * many mappings, so not on every communicator's creation. */
static void wedge_find(struct ofi_ep *o) {
  if (o->wedge_looked)
    return;
  o->wedge_looked = true;
  if (!o->peers || !o->db_peers || !ofi_smr117(o))
    return;
  FILE *maps = fopen("/proc/self/maps", "re");
  if (!maps)
    return;
  if (!(o->wedge = calloc((size_t)o->nranks, sizeof(*o->wedge)))) {
    fclose(maps);
    return;
  }
  char line[512];
  while (fgets(line, sizeof(line), maps)) {
    unsigned long start, off;
    char *name = strstr(line, " /dev/shm/chorus-");
    if (!name || sscanf(line, "%lx-%*x %*s %lx", &start, &off) != 2 || off)
      continue; /* a region is mapped whole, from offset 0 */
    name += 10;
    name[strcspn(name, " \n")] = '\0'; /* " (deleted)" once removed */
    for (int r = 0; r < o->nranks; r++) {
      const char *want = r == o->rank ? o->region : o->db_peers[r].shm_name;
      if (!o->wedge[r] && want[0] && strcmp(name, want) == 0)
        o->wedge[r] = wedge_lock_of((unsigned char *)start,
                                    r == o->rank ? o->pid : o->db_peers[r].pid, r == o->rank);
    }
  }
  fclose(maps);
  if (!o->wedge[o->rank]) { /* our own region does not read as 1.17's: touch nothing */
    free(o->wedge);
    o->wedge = NULL;
  }
}

/* Whether the lock stays taken all through OFI_WEDGE_NS. */
static bool wedge_held(pthread_spinlock_t *l) {
  struct timespec t0;

  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    if (pthread_spin_trylock(l) == 0) {
      pthread_spin_unlock(l);
      return false;
    }
    if (ofi_elapsed_ns(&t0) >= OFI_WEDGE_NS)
      return true;
    struct timespec nap = {0, 200000};
    nanosleep(&nap, NULL);
  }
}

static int ofi_unwedge(prov_t *p) {
  struct ofi_ep *o = to_ofi(p);
  int freed = 0;

  if (!o->region[0] || pthread_mutex_trylock(&o->wedge_mu))
    return 0;
  wedge_find(o);
  if (!o->wedge) {
    pthread_mutex_unlock(&o->wedge_mu);
    return 0;
  }
  bool dead = false;
  for (int r = 0; r < o->nranks && !dead; r++)
    dead = r != o->rank && o->db_peers[r].pid > 0 && pid_dead(o->db_peers[r].pid);
  for (int r = 0; dead && r < o->nranks; r++) {
    if (!o->wedge[r] || !wedge_held(o->wedge[r]))
      continue;
    pthread_spin_unlock(o->wedge[r]);
    freed++;
  }
  pthread_mutex_unlock(&o->wedge_mu);
  return freed;
}

/* ---- names in /dev/shm ----
 *
 * Names. shm's regions are POSIX shared memory, which peers open by name
 * (/dev/shm/NAME) and which outlives a process that does not remove its
 * own: a rank killed, or one that exits without chorus_comm_destroy (an
 * exception: the usual way a trainer fails), left 16 MiB behind for good
 * unless its launcher cleaned up (chorus-run does; torchrun, srun and
 * mpirun do not). libfabric 1.17 maps a peer's region when its address
 * goes into the AV (fi_av_insert, in add_peers) and never opens it by name
 * again: a connection request finds the mapping by the name it carries,
 * and close unlinks its own name, there or not (strace of a run: one open
 * per peer's region, from fi_av_insert). So a name is needed only until
 * every peer has inserted it:
 *
 *   open       sweep (below); create NAME
 *   add_peers  insert every peer (libfabric maps its region); our page's
 *              mapped = ALL when /proc/self/maps shows every peer's NAME
 *              mapped (or did so once in this process), else SOME
 *   settle     wait for every peer's mapped; all ALL: unlink every NAME,
 *              the peers' too (once all mapped all, anyone may)
 *
 * From settle on, a process killed leaves nothing. A libfabric that maps
 * later (on the first send) makes SOME, and a peer whose doorbell page can
 * not be mapped here (another PID namespace, a process that is not
 * dumpable) can not say: the names then stay until close or reap, as they
 * always did. Before settle:
 *  - a rank that dies after it published its address: the others' settle
 *    finds it dead and fails, creation fails, and comm_free's reap removes
 *    its region by the name it published;
 *  - a rank that dies before: nobody knows its name. reap (on the others'
 *    failed creation) and every open sweep /dev/shm for regions proven
 *    stale: named by a process of our PID namespace (its inode is in the
 *    name, and /proc is ours) that no longer runs (no process with that pid
 *    and start time, or it is on its way out), and owned by our user. A
 *    region from another namespace sharing /dev/shm (containers), whose pid
 *    would name another process here, is never touched, nor is a name of
 *    another form;
 *  - every rank of a host killed at once before settle (milliseconds): the
 *    next communicator on the host sweeps their regions (chorus-run removes
 *    them at once).
 */

static long ofi_elapsed_ns(const struct timespec *t0);

/* The inode of this process's PID namespace; 0 when /proc is not this
 * namespace's (/proc/self is not our pid), where a pid read would be
 * another process's: then nothing is swept. */
static uint64_t names_pidns(void) {
  char buf[32];
  struct stat st;
  ssize_t n = readlink("/proc/self", buf, sizeof(buf) - 1);

  if (n <= 0)
    return 0;
  buf[n] = '\0';
  if (strtol(buf, NULL, 10) != (long)getpid() || stat("/proc/self/ns/pid", &st))
    return 0;
  return (uint64_t)st.st_ino;
}

/* Process pid's start time (clock ticks after boot, /proc/PID/stat field
 * 22); false if it can not be read (*gone: there is no such process). */
static bool names_start_of(int32_t pid, uint64_t *start, bool *gone) {
  char buf[1024], *end;
  const char *p;

  *gone = false;
  if (!proc_read(pid, "stat", buf, sizeof(buf), gone) || !(p = strrchr(buf, ')')))
    return false;
  for (int field = 2; field < 22; field++) /* ") " ends field 2, the name */
    if (!(p = strchr(p + 1, ' ')))
      return false;
  errno = 0;
  *start = strtoull(p + 1, &end, 10);
  return end != p + 1 && !errno;
}

static bool names_start_time(int32_t pid, uint64_t *start) {
  bool gone;
  return names_start_of(pid, start, &gone);
}

/* The number at *p in `base` up to `sep`; *p moves past sep. */
static bool names_field(const char **p, int base, char sep, uint64_t *v) {
  char *end;

  if (!(base == 16 ? isxdigit((unsigned char)**p) : isdigit((unsigned char)**p)))
    return false;
  errno = 0;
  *v = strtoull(*p, &end, base);
  if (errno || *end != sep)
    return false;
  *p = end + 1;
  return true;
}

/* A name made by ofi_open (NAMES_FORMAT, without "chorus://"): who made it. */
static bool names_parse(const char *name, int32_t *pid, uint64_t *start, uint64_t *pidns) {
  static const int base[5] = {10, 10, 16, 10, 10}; /* pid, rank, nonce, start, pidns */
  uint64_t v[5];
  const char *p = name;

  if (strncmp(p, "chorus-", 7) != 0)
    return false;
  p += 7;
  for (int i = 0; i < 5; i++)
    if (!names_field(&p, base[i], i < 4 ? '-' : '\0', &v[i]))
      return false;
  if (v[0] == 0 || v[0] > INT32_MAX)
    return false;
  *pid = (int32_t)v[0];
  *start = v[3];
  *pidns = v[4];
  return true;
}

/* Whether region NAME was made in our PID namespace, where its pid means
 * its maker. */
static bool names_ours(const struct ofi_ep *o, const char *name) {
  int32_t pid;
  uint64_t start, pidns;
  return o->pidns && names_parse(name, &pid, &start, &pidns) && pidns == o->pidns;
}

/* Whether the process that made a region (pid, start time) can use it no
 * more: none runs with that pid, the pid is another's now, or it is on its
 * way out. */
static bool names_stale(int32_t pid, uint64_t start) {
  uint64_t now;
  bool gone;

  if (!names_start_of(pid, &now, &gone))
    return gone;
  return now != start || pid_dead(pid);
}

/* Removes the regions in /dev/shm that processes of ours left behind and
 * can use no more (see "Names"). Returns how many. */
static int names_sweep(void) {
  uint64_t ns = names_pidns();
  uid_t me = geteuid();
  struct dirent *e;
  DIR *dir;
  int n = 0;

  if (!ns || !(dir = opendir("/dev/shm")))
    return 0;
  while ((e = readdir(dir))) {
    int32_t pid;
    uint64_t start, pidns;
    struct stat st;

    if (!names_parse(e->d_name, &pid, &start, &pidns) || pidns != ns ||
        fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode) ||
        st.st_uid != me || !names_stale(pid, start))
      continue;
    n += unlinkat(dirfd(dir), e->d_name, 0) == 0;
  }
  closedir(dir);
  return n;
}

/* Set once /proc/self/maps showed every peer's region mapped after add_peers:
 * this process's libfabric maps regions when they are inserted. Reading the
 * maps costs time in proportion to the mappings (many in a trainer's
 * process, with CUDA), so it is read until it showed that once. */
static atomic_bool names_mapped_at_insert;

/* Whether libfabric has mapped every peer's region here: its name among
 * our mappings (/proc/self/maps). */
static bool names_all_mapped(const struct ofi_ep *o) {
  static const char dir[] = " /dev/shm/";
  int left = o->nranks > 1 ? o->nranks - 1 : 0;
  bool *seen = calloc((size_t)left + 1, sizeof(*seen)); /* by rank, ours not used */
  char *line = NULL;
  size_t cap = 0;
  FILE *f;

  if (!seen)
    return false;
  for (int i = 0; i < o->nranks; i++)
    if (i != o->rank && !o->db_peers[i].region[0])
      goto out; /* a name we can not look for */
  if (atomic_load(&names_mapped_at_insert))
    left = 0;
  if (left > 0 && (f = fopen("/proc/self/maps", "re"))) {
    while (left > 0 && getline(&line, &cap, f) > 0) {
      char *name = strstr(line, dir);
      if (!name)
        continue;
      name += sizeof(dir) - 1;
      name[strcspn(name, "\n")] = '\0';
      for (int i = 0; i < o->nranks; i++)
        if (i != o->rank && !seen[i] && strcmp(name, o->db_peers[i].region) == 0) {
          seen[i] = true;
          left--;
          break;
        }
    }
    fclose(f);
    free(line);
    if (left == 0)
      atomic_store(&names_mapped_at_insert, true);
  }
out:
  free(seen);
  return left == 0;
}

/* Waits for peer i's mapped (see "Names"): 0 with *state, 0 when its page
 * is not mapped here (nobody can tell then), or <0 when it ended or closed
 * first, or the time ran out. */
static int names_await(struct ofi_ep *o, int i, const struct timespec *t0, long limit_ns,
                       uint32_t *state) {
  struct ofi_db_peer *d = &o->db_peers[i];
  unsigned nap_us = 10;
  long look_at = 0;

  *state = 0;
  if (!d->page) {
    /* its doorbell page could not be mapped: from our namespace, because
     * it is gone; from another, we can not tell, and the names stay */
    if (names_ours(o, d->region) && pid_dead(d->pid))
      goto out_ended;
    return 0;
  }
  for (;;) {
    uint32_t st = atomic_load_explicit(&d->page->mapped, memory_order_acquire);
    if (st) {
      *state = st;
      return 0;
    }
    if (atomic_load(&d->page->closed)) {
      ofi_seterr(o, "rank %d closed its endpoint before it had inserted its peers' addresses", i);
      return -ECONNRESET;
    }
    long el = ofi_elapsed_ns(t0);
    if (el >= look_at) { /* its page is mapped: its pid is of our namespace */
      if (pid_dead(d->pid))
        goto out_ended;
      look_at = el + 10 * 1000 * 1000L;
    }
    if (limit_ns > 0 && el >= limit_ns) {
      ofi_seterr(o, "rank %d (pid %d) did not insert its peers' addresses within %.1f s", i,
                 (int)d->pid, (double)limit_ns / 1e9);
      return -ETIMEDOUT;
    }
    struct timespec nap = {0, (long)nap_us * 1000};
    nanosleep(&nap, NULL);
    if (nap_us < 1000)
      nap_us *= 2;
  }
out_ended:
  ofi_seterr(o, "rank %d (pid %d) ended before it had inserted its peers' addresses", i,
             (int)d->pid);
  return -ECONNRESET;
}

static int ofi_settle(prov_t *p, double timeout_s) {
  struct ofi_ep *o = to_ofi(p);
  long limit_ns = timeout_s > 0 ? (long)(timeout_s * 1e9) : 0;
  struct timespec t0;
  bool all;

  if (!o->region[0])
    return 0;
  if (!o->db_peers) {
    ofi_seterr(o, "settle before add_peers");
    return -EINVAL;
  }
  clock_gettime(CLOCK_MONOTONIC, &t0);
  all = atomic_load(&o->db_page->mapped) == OFI_MAPPED_ALL;
  for (int i = 0; i < o->nranks; i++) {
    uint32_t state;
    int rc;

    if (i == o->rank)
      continue;
    if ((rc = names_await(o, i, &t0, limit_ns, &state)))
      return rc;
    all = all && state == OFI_MAPPED_ALL;
  }
  if (!all)
    return 0;
  for (int i = 0; i < o->nranks; i++) {
    struct ofi_db_peer *d = &o->db_peers[i];
    if (i != o->rank && d->region[0]) {
      (void)shm_unlink(d->region);
      d->region[0] = '\0';
    }
  }
  if (o->region_named)
    (void)shm_unlink(o->region);
  o->region_named = false;
  return 0;
}

/* Peers' regions still named (settle did not run, or kept the names) whose
 * process ended, then what the sweep finds (see "Names"): ranks that died
 * before they published a name. */
static int ofi_reap(prov_t *p) {
  struct ofi_ep *o = to_ofi(p);
  int n = 0;

  for (int i = 0; o->db_peers && i < o->nranks; i++) {
    struct ofi_db_peer *d = &o->db_peers[i];
    if (i == o->rank || !d->region[0] || !names_ours(o, d->region) || !pid_dead(d->pid))
      continue;
    n += shm_unlink(d->region) == 0;
    d->region[0] = '\0';
  }
  if (o->region[0])
    n += names_sweep();
  return n;
}

static void ofi_release(prov_t *p, prov_op_t *op) {
  struct ofi_ep *o = to_ofi(p);
  uint64_t cookie = (uint64_t)(uintptr_t)op->internal[2];
  intptr_t who = (intptr_t)op->internal[3];

  if (!op->borrowed)
    return;
  op->borrowed = NULL;
  ofi_rndv_done(o, (int)(who >> 2), cookie, (enum ofi_done_how)(who & 3), 0);
}

/* ---- the window ----
 *
 * shm keeps a message that came before its receive in the receiver's
 * receive queue (OFI_SHM_QUEUE_SIZE entries, shared with the posted
 * receives), and while that queue is full it refuses every post to the
 * receiver: the one its posted receive waits for too. Senders that run
 * calls ahead of their receiver (a fan-in: gather, reduce) fill it with
 * messages of later calls, and the job hangs (16 ranks, 4 KiB chunks, a
 * linear gather of 2 MiB).
 *
 * So a sender keeps at most `window` messages to a peer that the peer has
 * not yet taken (its receive completed): each endpoint counts in its
 * doorbell page, taken[r], the messages from rank r whose receive
 * completed, and a sender compares that with what it sent, reading the
 * peer's count again only when the one it read last leaves no room (the
 * count only grows: an old one errs towards a closed window). The windows of
 * all senders fill what our receives and sends (with their ack receives,
 * max_posted each) leave of the queue: 96 of the 224 entries we use (384
 * of 896 with shm's default size). A send the window holds back is posted
 * again at the sender's next progress. A sender about to sleep with such a
 * send sets its bit in the peer's taken_want[] and looks again (arm(),
 * ofi_held_open; each side fences between its store and its load, as for
 * sleeping), and the peer rings it when it next takes one of its messages.
 * Setting the bit at every refusal instead made a sender that polls, such
 * as a broadcast root running ahead, cost its receiver a ring (a sendto())
 * per message taken, which more than doubled a small broadcast's, reduce's
 * or gather's time.
 */

/* Whether one more message may go to peer. A point-to-point send
 * (PROV_OP_P2P) may fill only half the window: a user may send messages
 * that the peer receives only after a collective (8 ranks, each sending its
 * neighbour a dozen, then an allreduce: with a window of 12 the allreduce's
 * sends found it full, and the job hung), and the collective's messages,
 * which the peer does take in order, must find room. A spare copy
 * (PROV_OP_SPARE, never taken) only the first quarter: those pile up for
 * good (a fault soak duplicating one message in five closed windows of 24
 * at 4 ranks within 30 calls), and point-to-point sends keep a quarter. */
static uint32_t ofi_window_limit(const struct ofi_ep *o, unsigned flags) {
  if (flags & PROV_OP_SPARE)
    return o->window / 4;
  return flags & PROV_OP_P2P ? o->window - o->window / 2 : o->window;
}

static bool ofi_window_open(struct ofi_ep *o, int peer, unsigned flags) {
  struct ofi_db_peer *d = &o->db_peers[peer];
  _Atomic uint32_t *taken = db_taken_word(d->page, d->page_len, o->nranks, o->rank);
  _Atomic uint64_t *want = db_taken_want_word(d->page, d->page_len, o->nranks, o->rank);
  const uint32_t limit = ofi_window_limit(o, flags);

  if (!taken || !want) /* no page: no window */
    return true;
  /* taken[] only grows: what we saw of it last is never too much */
  if (o->sent[peer] - d->taken_seen < limit)
    return true;
  o->rndv_stats.window_looks++;
  d->taken_seen = atomic_load_explicit(taken, memory_order_acquire);
  if (o->sent[peer] - d->taken_seen < limit)
    return true;
  if (flags & PROV_OP_SPARE) /* refused, not retried: nothing to wait for */
    return false;
  /* held back: the post is retried at our next progress, and before we
   * sleep arm() asks the peer to ring us (ofi_held_open) */
  if (!d->held_limit)
    o->held[o->nheld++] = peer;
  if (limit > d->held_limit)
    d->held_limit = limit;
  o->rndv_stats.window_waits++;
  return false;
}

/* arm(), after `sleeping` is set and fenced: for each peer a send was held
 * back from, sets our bit in its taken_want[] and, fenced, reads its count
 * again (Dekker with ofi_taken: either it sees the bit and rings us, or we
 * see what it took). Returns whether a held send may go now (we must not
 * sleep); those peers leave the list, with their bit cleared. */
static bool ofi_held_open(struct ofi_ep *o) {
  bool open = false;

  for (uint32_t i = 0; i < o->nheld;) {
    int peer = o->held[i];
    struct ofi_db_peer *d = &o->db_peers[peer];
    _Atomic uint32_t *taken = db_taken_word(d->page, d->page_len, o->nranks, o->rank);
    _Atomic uint64_t *want = db_taken_want_word(d->page, d->page_len, o->nranks, o->rank);
    const uint64_t bit = 1ull << (o->rank % 64);

    atomic_fetch_or(want, bit);
    atomic_thread_fence(memory_order_seq_cst);
    d->taken_seen = atomic_load(taken);
    if (o->sent[peer] - d->taken_seen < d->held_limit) {
      atomic_fetch_and(want, ~bit);
      d->held_limit = 0;
      o->held[i] = o->held[--o->nheld];
      open = true;
      continue;
    }
    i++;
  }
  return open;
}

/* A message from peer was taken (its receive completed): count it, and ring
 * the peer if it waits for that. */
static void ofi_taken(struct ofi_ep *o, int peer) {
  _Atomic uint32_t *taken = db_taken_word(o->db_page, o->db_page_len, o->nranks, peer);
  _Atomic uint64_t *want = db_taken_want_word(o->db_page, o->db_page_len, o->nranks, peer);
  uint64_t bit = 1ull << (peer % 64);

  if (!taken || !want)
    return;
  /* we are the only writer */
  atomic_store_explicit(taken, atomic_load_explicit(taken, memory_order_relaxed) + 1,
                        memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(want, memory_order_relaxed) & bit) {
    atomic_fetch_and(want, ~bit);
    o->rndv_stats.window_rings++;
    db_ring(o, peer);
  }
}

static int ofi_post_send(prov_t *p, int peer, const void *buf, size_t len, uint64_t tag,
                         prov_op_t *op) {
  struct ofi_ep *o = to_ofi(p);
  struct ofi_slot *s;
  ssize_t rc = ofi_check_post(o, peer, len, buf, op);

  if (rc)
    return (int)rc;
  /* o->sent: the window is counted in the doorbell page, which shm may lack */
  if (o->window && o->sent && !ofi_window_open(o, peer, op->flags))
    return op->flags & PROV_OP_SPARE ? -ENOBUFS : -EAGAIN;
  s = ofi_slot_fill(o, true, p, peer, len, tag, op);
  if (!s)
    return -EAGAIN;
  if (ofi_use_rndv(o, peer, len)) {
    rc = ofi_post_rndv_send(o, s, buf, len);
    if (rc)
      return (int)rc;
  } else {
    if (o->cq_data)
      rc = fi_tsenddata(o->ep, buf, len, NULL, op->data & ~PROV_DATA_VALID, o->peers[peer], tag,
                        &s->fctx);
    else
      rc = fi_tsend(o->ep, buf, len, NULL, o->peers[peer], tag, &s->fctx);
    if (rc)
      return ofi_post_failed(o, s, rc, "send to");
    if (o->wait == OFI_WAIT_DOORBELL) {
      db_track_nap(o, s);
      db_ring_if_sleeping(o, peer);
    }
  }
  if (o->sent) /* the window's count (none without the doorbell page) */
    o->sent[peer]++;
  return 0;
}

static int ofi_post_recv(prov_t *p, int peer, void *buf, size_t len, uint64_t tag, prov_op_t *op) {
  struct ofi_ep *o = to_ofi(p);
  struct ofi_slot *s;
  ssize_t rc = ofi_check_post(o, peer, len, buf, op);

  if (rc)
    return (int)rc;
  s = ofi_slot_fill(o, false, p, peer, len, tag, op);
  if (!s)
    return -EAGAIN;
  op->borrowed = NULL;
  s->rbuf = buf;
  rc = fi_trecv(o->ep, buf, len, NULL, o->directed ? o->peers[peer] : FI_ADDR_UNSPEC, tag, 0,
                &s->fctx);
  if (rc)
    return ofi_post_failed(o, s, rc, "recv from");
  if (o->wait == OFI_WAIT_DOORBELL)
    db_track_nap(o, s);
  return 0;
}

static int ofi_cancel(prov_t *p, prov_op_t *op) {
  struct ofi_ep *o = to_ofi(p);
  struct ofi_slot *s;

  if (!op || op->internal[PROV_OP_OWNER] != p)
    return -ENOENT;
  s = op->internal[PROV_OP_REQ];
  /* Too late (matched, sending) is not an error: the op completes normally. */
  (void)fi_cancel(&o->ep->fid, &s->fctx);
  if (s->rndv_pending & OFI_RNDV_ACK)
    (void)fi_cancel(&o->ep->fid, &s->ack_fctx);
  /* an ack due by ring can not be called back: the send ends at the next
   * progress(), with -ECANCELED unless the descriptor failed first (a late
   * ack finds the slot gone, or in use again under another generation) */
  if ((s->rndv_pending & OFI_RNDV_RING) && !s->ring_cancel) {
    s->ring_cancel = true;
    o->ring_cancels++;
  }
  return 0;
}

/* ---- completions ---- */

/* The slot's last completion came: its bounce slot (kept when the transfer
 * failed: the receiver may still read it) and the slot go back. */
static void ofi_slot_end(struct ofi_ep *o, struct ofi_slot *s, int status) {
  if (s->ring_cancel) {
    s->ring_cancel = false;
    o->ring_cancels--;
  }
  if (s->is_send && s->bounce) {
    if (!status)
      o->bounce_free |= 1u << (s->bounce - 1);
    s->bounce = 0;
  }
  if (s->is_send && s->bounce_mark) {
    /* sent: it comes back by the receiver's mark (ofi_bounce_take) */
    if (status)
      o->bounce_out &= ~(1u << (s->bounce_mark - 1));
    s->bounce_mark = 0;
  }
  s->marked = false;
  if (s->nap) {
    o->db_nap_ops--;
    o->db_nap_sar -= s->nap == OFI_NAP_SAR;
    s->nap = OFI_NAP_NONE;
  }
  s->early = false;
  slot_put(o, s);
}

/* A bounced send is complete for the engine once its descriptor left: the
 * data is ours already. The slot stays taken until the ack frees the copy. */
static void ofi_deliver_early(struct ofi_ep *o, struct ofi_slot *s) {
  prov_op_t *op = s->op;

  s->early = true;
  s->op = NULL;
  op->internal[PROV_OP_OWNER] = NULL;
  op->internal[PROV_OP_REQ] = NULL;
  op->done(op, 0, s->len);
}

static void ofi_deliver(struct ofi_ep *o, struct ofi_slot *s, int status, size_t len) {
  prov_op_t *op = s->op;
  bool is_send = s->is_send, marked = s->marked;
  int peer = s->peer;

  if (is_send && !status)
    len = s->len;
  ofi_slot_end(o, s, status);
  op->internal[PROV_OP_OWNER] = NULL;
  op->internal[PROV_OP_REQ] = NULL;
  if (!is_send && o->window && status != -ECANCELED)
    ofi_taken(o, peer);
  /* A sender above the inject size waits for us to have copied its data
   * (not one whose bounce slot we marked: it was done already). */
  if (!is_send && !marked && o->db_peers && status != -ECANCELED && (len > o->inject_len || status))
    db_ring_if_sleeping(o, peer);
  op->done(op, status, len);
}

/* The slot a completion context belongs to: its fctx, or its ack_fctx. */
static struct ofi_slot *ofi_slot_of(struct ofi_ep *o, void *op_context) {
  size_t off = (size_t)((char *)op_context - (char *)o->slots);
  return &o->slots[off / sizeof(struct ofi_slot)];
}

static bool ofi_is_ack_ctx(struct ofi_ep *o, void *op_context) {
  size_t off = (size_t)((char *)op_context - (char *)o->slots);
  return off % sizeof(struct ofi_slot) == offsetof(struct ofi_slot, ack_fctx);
}

/* The ack of rendezvous send s came (what: OFI_RNDV_ACK, a message, or
 * OFI_RNDV_RING), with the receiver's status, or its receive failed. */
static void ofi_rndv_acked(struct ofi_ep *o, struct ofi_slot *s, unsigned char what, int status) {
  s->rndv_pending &= (unsigned char)~what;
  if (!s->rndv_status)
    s->rndv_status = status;
  if (s->rndv_pending)
    return;
  ofi_deliver(o, s, s->rndv_status, s->len);
}

/* Peer p's ring of acks for us, when some are due from it; else NULL. */
static struct ofi_ack_ring *ofi_ack_ring_due(struct ofi_ep *o, int p) {
  const struct ofi_db_peer *d = &o->db_peers[p];
  return d->ack_out ? db_ack_ring(d->page, d->page_len, o->nranks, o->rank) : NULL;
}

/* Reads the acks our peers put in their rings for us (every peer with acks
 * due), and ends the sends whose ring acks were cancelled. Returns the sends
 * it ended. */
static int ofi_ack_rings_read(struct ofi_ep *o) {
  int n = 0;

  for (int p = 0; o->ack_out && p < o->nranks; p++) {
    struct ofi_db_peer *d = &o->db_peers[p];
    struct ofi_ack_ring *r = ofi_ack_ring_due(o, p);

    if (!r)
      continue;
    /* d->ack_tail moves before each delivery: a callback may progress again */
    while (d->ack_tail != atomic_load_explicit(&r->head, memory_order_acquire) && d->ack_out) {
      struct ofi_ack_entry e = r->e[d->ack_tail % OFI_ACK_RING];
      d->ack_tail++;
      d->ack_out--;
      o->ack_out--;
      uint64_t idx = e.cookie & 0xffffffffu;
      if (idx >= o->max_posted)
        continue;
      struct ofi_slot *s = &o->slots[idx];
      /* a cancelled send's slot may be in use again: its generation differs */
      if (!s->op || s->peer != p || s->gen != (uint32_t)(e.cookie >> 32) ||
          !(s->rndv_pending & OFI_RNDV_RING))
        continue;
      ofi_rndv_acked(o, s, OFI_RNDV_RING, e.status);
      n++;
    }
  }
  for (size_t i = 0; o->ring_cancels && i < o->max_posted; i++) {
    struct ofi_slot *s = &o->slots[i];
    if (!s->ring_cancel)
      continue;
    s->ring_cancel = false;
    o->ring_cancels--;
    if (s->op && (s->rndv_pending & OFI_RNDV_RING)) {
      ofi_rndv_acked(o, s, OFI_RNDV_RING, -ECANCELED);
      n++;
    }
  }
  return n;
}

/* Whether a peer put an ack for us in its ring that we have not read. */
static bool ofi_ack_rings_ready(struct ofi_ep *o) {
  if (o->ring_cancels)
    return true;
  for (int p = 0; o->ack_out && p < o->nranks; p++) {
    struct ofi_ack_ring *r = ofi_ack_ring_due(o, p);

    if (r && o->db_peers[p].ack_tail != atomic_load_explicit(&r->head, memory_order_acquire))
      return true;
  }
  return false;
}

/* Every completion, good or bad, comes through here. */
static void ofi_complete(struct ofi_ep *o, void *ctx, int status, size_t len, uint64_t flags,
                         uint64_t data) {
  struct ofi_slot *s = ofi_slot_of(o, ctx);

  if (s->early) {
    /* the ack of a send delivered early */
    s->rndv_pending = 0;
    ofi_slot_end(o, s, status ? status : s->ack_status);
    return;
  }
  if (!s->op) {
    /* a second completion for an op already delivered (seen with
     * udp;ofi_rxd after a cancel): nobody is waiting for it */
    ofi_seterr(o, "ignored a completion (status %d) for an operation already finished", status);
    return;
  }
  if (s->is_send && s->rndv_pending) {
    if (ofi_is_ack_ctx(o, ctx)) {
      ofi_rndv_acked(o, s, OFI_RNDV_ACK, status ? status : s->ack_status);
      return;
    } else {
      s->rndv_pending &= (unsigned char)~OFI_RNDV_DESC;
      if (!s->rndv_status)
        s->rndv_status = status;
      /* a failed descriptor will never be acked (a ring ack's place stays
       * counted in ack_out: it is not known never to come) */
      if (status && (s->rndv_pending & OFI_RNDV_ACK))
        (void)fi_cancel(&o->ep->fid, &s->ack_fctx);
      if (status)
        s->rndv_pending &= (unsigned char)~OFI_RNDV_RING;
    }
    if (s->rndv_pending == OFI_RNDV_ACK && s->bounce && !s->rndv_status) {
      ofi_deliver_early(o, s);
      return;
    }
    if (s->rndv_pending)
      return;
    ofi_deliver(o, s, s->rndv_status, s->len);
    return;
  }
  if (!s->is_send) {
    s->op->data = (!status || status == -EMSGSIZE) && (flags & FI_REMOTE_CQ_DATA) &&
                          !(status && data == OFI_RNDV_MARK)
                      ? PROV_DATA_VALID | data
                      : 0;
    if (!status && (flags & FI_REMOTE_CQ_DATA) && data == OFI_RNDV_MARK &&
        len == sizeof(struct ofi_rndv_desc))
      status = ofi_rndv_pull(o, s, s->rbuf, &len);
  }
  ofi_deliver(o, s, status, len);
}

static int ofi_read_error(struct ofi_ep *o) {
  struct fi_cq_err_entry err = {0};
  char buf[128];
  struct ofi_slot *s;
  ssize_t rc;
  int status;

  rc = fi_cq_readerr(o->cq, &err, 0);
  if (rc == -FI_EAGAIN)
    return 0;
  if (rc < 0) {
    ofi_seterr(o, "fi_cq_readerr: %s", fi_strerror((int)-rc));
    return ofi_to_errno(rc);
  }
  err.err = err.err < 0 ? -err.err : err.err; /* shm reports some codes negated */
  status = err.err == FI_ECANCELED ? -ECANCELED : ofi_to_errno(err.err);
  if (!err.op_context) {
    ofi_seterr(o, "completion error without an operation: %s", fi_strerror(err.err));
    return 0;
  }
  s = ofi_slot_of(o, err.op_context);
  if (status != -ECANCELED) {
    const char *detail = "";

    /* For truncation, rxm's prov_errno reads "Operation now in progress". */
    if (err.prov_errno && err.err != FI_ETRUNC)
      detail = fi_cq_strerror(o->cq, err.prov_errno, err.err_data, buf, sizeof(buf));
    ofi_seterr(o, "%s rank %d tag %#llx failed: %s%s%s%s", s->is_send ? "send to" : "recv from",
               s->peer, (unsigned long long)s->tag, fi_strerror(err.err),
               err.err == FI_ETRUNC ? " (message longer than the receive buffer)" : "",
               detail && detail[0] ? "; provider: " : "", detail ? detail : "");
  }
  /* a truncated message still says whose call it was (its remote CQ data) */
  ofi_complete(o, err.op_context, status, err.len, err.flags & FI_REMOTE_CQ_DATA, err.data);
  return 1;
}

static int ofi_progress(prov_t *p) {
  struct ofi_ep *o = to_ofi(p);
  struct fi_cq_tagged_entry e[OFI_CQ_BATCH];
  int n = 0, batches, rc = 0;

  if (o->nacks)
    ofi_flush_acks(o);
  if (o->ack_out || o->ring_cancels)
    n += ofi_ack_rings_read(o);
  /* Callbacks may re-enter (post, even progress): pop before delivering. */
  while (o->stash_pos < o->stash_n) {
    struct fi_cq_tagged_entry *x = &o->stash[o->stash_pos++];

    ofi_complete(o, x->op_context, 0, x->len, x->flags, x->data);
    n++;
  }
  for (batches = 0; batches < OFI_CQ_BATCHES_PER_PROGRESS; batches++) {
    ssize_t got = fi_cq_read(o->cq, e, OFI_CQ_BATCH);
    ssize_t i;

    if (got == -FI_EAGAIN)
      break;
    if (got == -FI_EAVAIL) {
      rc = ofi_read_error(o);
      if (rc < 0)
        break;
      n += rc;
      rc = 0;
      continue;
    }
    if (got < 0) {
      ofi_seterr(o, "fi_cq_read: %s", fi_strerror((int)-got));
      rc = ofi_to_errno(got);
      break;
    }
    for (i = 0; i < got; i++)
      ofi_complete(o, e[i].op_context, 0, e[i].len, e[i].flags, e[i].data);
    n += (int)got;
    if (got < OFI_CQ_BATCH)
      break;
  }
  if (o->wait == OFI_WAIT_DOORBELL) {
    db_answer(o);
    if (n)
      o->db_nap_us = OFI_NAP_MIN_US;
  }
  return n ? n : rc;
}

static int ofi_wait_fd(prov_t *p) {
  struct ofi_ep *o = to_ofi(p);

  switch (o->wait) {
  case OFI_WAIT_CQ_FD:
    return o->cq_fd;
  case OFI_WAIT_DOORBELL:
    return o->db_epfd;
  default:
    return -1;
  }
}

/* Reads what is ready into the stash: > 0 (or an error) means "not now". */
static ssize_t ofi_stash_fill(struct ofi_ep *o) {
  ssize_t got = fi_cq_read(o->cq, o->stash, OFI_STASH);

  if (got > 0) {
    o->stash_pos = 0;
    o->stash_n = (int)got;
    return got;
  }
  return got == -FI_EAGAIN ? 0 : 1;
}

static int ofi_arm(prov_t *p) {
  struct ofi_ep *o = to_ofi(p);
  struct fid *fids[1] = {&o->cq->fid};
  int i, rc;

  if (o->stash_pos < o->stash_n)
    return -EAGAIN;
  switch (o->wait) {
  case OFI_WAIT_CQ_FD:
    for (i = 0; i < OFI_TRYWAIT_TRIES; i++) {
      rc = fi_trywait(o->fabric, fids, 1);
      if (rc == FI_SUCCESS)
        return 0;
      if (rc != -FI_EAGAIN || ofi_stash_fill(o))
        return -EAGAIN;
    }
    return -EAGAIN;
  case OFI_WAIT_DOORBELL:
    atomic_store(&o->db_page->sleeping, 1);
    atomic_thread_fence(memory_order_seq_cst); /* flag visible before the last look */
    if (ofi_stash_fill(o) || atomic_load(&o->db_page->want_any) || ofi_held_open(o) ||
        ofi_ack_rings_ready(o)) {
      atomic_store(&o->db_page->sleeping, 0);
      return -EAGAIN;
    }
    if (o->db_nap_ops && !o->db_no_backstop) {
      unsigned cap = o->db_nap_sar ? OFI_NAP_MAX_SAR_US : OFI_NAP_MAX_US;

      if (o->db_nap_us > cap)
        o->db_nap_us = cap;
      db_timer_set(o, o->db_nap_us);
      o->db_nap_us = o->db_nap_us * 2 < cap ? o->db_nap_us * 2 : cap;
    }
    return 0;
  default:
    return ofi_stash_fill(o) ? -EAGAIN : 0;
  }
}

static void ofi_disarm(prov_t *p) {
  struct ofi_ep *o = to_ofi(p);

  if (o->wait != OFI_WAIT_DOORBELL)
    return;
  atomic_store(&o->db_page->sleeping, 0);
  db_drain(o);
  db_timer_set(o, 0);
}

static size_t ofi_max_posted(prov_t *p) {
  return to_ofi(p)->max_posted;
}

static long ofi_elapsed_ns(const struct timespec *t0) {
  struct timespec t;

  clock_gettime(CLOCK_MONOTONIC, &t);
  return (t.tv_sec - t0->tv_sec) * 1000000000L + (t.tv_nsec - t0->tv_nsec);
}

/* libfabric's tcp provider (1.17) can leave behind a connection a peer
 * opened to us while the endpoint was closing (seen after a failure, when
 * ranks close at different times): its listener accepted the socket but the
 * peer's connection request had not been read when the listener closed, and
 * closing the listener forgets the half-accepted connection (its memory and
 * its socket; fixed upstream in 2026, "prov/tcp: Fix PEP close
 * use-after-free"). Such a socket has our listener's port as its local port.
 * Before closing, ofi_port_socks() notes the sockets on that port (while the
 * listener holds it, none can be another endpoint's); after every fi_close,
 * ofi_close_strays() closes those still open, and any other socket on the
 * port whose peer has closed (CLOSE_WAIT: accepted during the close), never a
 * live socket another endpoint may have bound to the port since. */
#define OFI_STRAYS_MAX 64
typedef struct ofi_strays {
  int n;
  int fd[OFI_STRAYS_MAX];
  ino_t ino[OFI_STRAYS_MAX];
} ofi_strays_t;

/* Calls fn for each socket of this process whose local port is `port`. */
static void ofi_each_port_sock(uint16_t port, void (*fn)(int fd, ino_t ino, void *arg), void *arg) {
  DIR *d = port ? opendir("/proc/self/fd") : NULL;
  if (!d)
    return;
  int dfd = dirfd(d);
  for (struct dirent *e; (e = readdir(d));) {
    int fd = atoi(e->d_name);
    struct stat st;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (fd <= 2 || fd == dfd || fstat(fd, &st) || !S_ISSOCK(st.st_mode) ||
        getsockname(fd, (struct sockaddr *)&ss, &sl))
      continue;
    uint16_t p = ss.ss_family == AF_INET    ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                 : ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                            : 0;
    if (p == port)
      fn(fd, st.st_ino, arg);
  }
  closedir(d);
}

/* The udp socket of a udp;ofi_rxd endpoint: see ofi_rxd_window_env. */
static void ofi_raise_rcvbuf(int fd, ino_t ino, void *arg) {
  int type = 0, size = OFI_UDP_RCVBUF;
  socklen_t tl = sizeof(type);

  (void)ino;
  (void)arg;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0 && type == SOCK_DGRAM)
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

static void ofi_note_sock(int fd, ino_t ino, void *arg) {
  ofi_strays_t *s = arg;
  if (s->n < OFI_STRAYS_MAX) {
    s->fd[s->n] = fd;
    s->ino[s->n++] = ino;
  }
}

static void ofi_port_socks(uint16_t port, ofi_strays_t *s) {
  s->n = 0;
  ofi_each_port_sock(port, ofi_note_sock, s);
}

static void ofi_close_stray(int fd, ino_t ino, void *arg) {
  const ofi_strays_t *s = arg;
  for (int i = 0; i < s->n; i++)
    if (s->fd[i] == fd && s->ino[i] == ino) {
      close(fd);
      return;
    }
  struct tcp_info ti;
  socklen_t tl = sizeof(ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 && ti.tcpi_state == TCP_CLOSE_WAIT)
    close(fd);
}

static void ofi_close_strays(uint16_t port, const ofi_strays_t *s) {
  ofi_each_port_sock(port, ofi_close_stray, (void *)s);
}

static void ofi_close(prov_t *p) {
  struct ofi_ep *o = to_ofi(p);
  struct timespec t0;
  size_t i;

  o->closing = true;
  if (o->db_page) /* a peer in settle waits no longer */
    atomic_store(&o->db_page->closed, 1);
  for (i = 0; i < 2 * o->max_posted; i++)
    if (o->slots[i].early)
      (void)fi_cancel(&o->ep->fid, &o->slots[i].ack_fctx);
    else if (o->slots[i].op)
      (void)ofi_cancel(p, o->slots[i].op);
  /* Give cancellations and sends in flight a moment to complete. */
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (o->in_flight && ofi_elapsed_ns(&t0) < OFI_CLOSE_DRAIN_NS) {
    if (ofi_progress(p) <= 0) {
      struct timespec nap = {0, 100000};

      nanosleep(&nap, NULL);
    }
  }
  ofi_strays_t strays;
  ofi_port_socks(o->listen_port, &strays);
  fi_close(&o->ep->fid);
  /* What never completed (sends to a peer that never received) is ours to end. */
  for (i = 0; i < 2 * o->max_posted; i++)
    if (o->slots[i].early) {
      o->slots[i].rndv_pending = 0;
      ofi_slot_end(o, &o->slots[i], -ECANCELED);
    } else if (o->slots[i].op) {
      o->slots[i].rndv_pending = 0;
      ofi_deliver(o, &o->slots[i], -ECANCELED, 0);
    }
  free(o->acks);
  ofi_unmap_all(o);
  if (o->bounce)
    memreg_free(o->bounce);

  fi_close(&o->cq->fid);
  smr_close_av(o->av);
  fi_close(&o->domain->fid);
  fi_close(&o->fabric->fid);
  smr_untrack(o);
  ofi_close_strays(o->listen_port, &strays);
  fi_freeinfo(o->info);
  db_close(o);
  free(o->slots);
  free(o->sent);
  free(o->held);
  free(o->peers);
  free(o->wedge);
  pthread_mutex_destroy(&o->wedge_mu);
  free(o);
}

void *prov_ofi_test_queue_lock(prov_t *p, int rank) {
  if (!p || p->ops != &prov_ofi_ops)
    return NULL;
  struct ofi_ep *o = to_ofi(p);
  pthread_mutex_lock(&o->wedge_mu);
  wedge_find(o);
  void *l = o->wedge && rank >= 0 && rank < o->nranks ? (void *)o->wedge[rank] : NULL;
  pthread_mutex_unlock(&o->wedge_mu);
  return l;
}

void prov_ofi_test_no_backstop(prov_t *p) {
  if (p && p->ops == &prov_ofi_ops)
    to_ofi(p)->db_no_backstop = true;
}

const prov_ops_t prov_ofi_ops = {
    .size = sizeof(prov_ops_t),
    .name = "ofi",
    .open = ofi_open,
    .getname = ofi_getname,
    .add_peers = ofi_add_peers,
    .post_send = ofi_post_send,
    .post_recv = ofi_post_recv,
    .cancel = ofi_cancel,
    .progress = ofi_progress,
    .wait_fd = ofi_wait_fd,
    .arm = ofi_arm,
    .disarm = ofi_disarm,
    .max_posted = ofi_max_posted,
    .close = ofi_close,
    .release = ofi_release,
    .reap = ofi_reap,
    .settle = ofi_settle,
    .unwedge = ofi_unwedge,
};
