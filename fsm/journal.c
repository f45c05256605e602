/*
 * journal.c - the per-process ring of transitions, and the machine registry
 * that turns a record's machine id back into names.
 *
 * Appends take no lock. A writer claims sequence number n with one
 * fetch_add on `head`, owns slot n & mask through a per-slot sequence word
 * and publishes it seqlock-style:
 *
 *   slot.seq:  0 ──────► BUSY(n) ──► DONE(n) ──► BUSY(n + cap) ──► DONE(n + cap) ...
 *                CAS        3 release        CAS
 *                           word stores
 *
 * A reader wanting record n accepts the slot only if it reads DONE(n) both
 * before and after copying the words, so a slot being written, or already
 * reused for a newer record, is skipped rather than returned torn. A writer
 * that finds its slot busy or already holding a newer record (it stalled a
 * whole lap behind) drops its record instead of waiting.
 */
#include "fsm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define FSM_JOURNAL_DEFAULT_CAP 65536
#define FSM_JOURNAL_MAX_CAP (1u << 26)
#define FSM_MACHINES_MAX 0xfffe
#define FSM_JOURNAL_PREFAULT_MAX ((size_t)64 << 20) /* touched at allocation */

#define JSEQ_DONE(n) (((uint64_t)(n) + 1) << 1)
#define JSEQ_BUSY(n) (JSEQ_DONE(n) | 1)

struct fsm_jslot {
  _Atomic uint64_t seq;  /* 0: never written; BUSY(n) or DONE(n) for record n */
  _Atomic uint64_t w[3]; /* the record, packed; see fsm_jpack() */
};

struct fsm_journal {
  uint64_t mask;   /* capacity - 1 */
  size_t map_len;  /* bytes of the mapping, which starts here (fsm_jalloc) */
  uint8_t pad[48]; /* slots start on a cache line: none straddles two */
  struct fsm_jslot slot[];
};
_Static_assert(offsetof(struct fsm_journal, slot) % 64 == 0, "slots on cache lines");

static _Atomic(struct fsm_journal *) fsm_jring; /* allocated on first append */
static _Alignas(64) _Atomic uint64_t fsm_jhead; /* next sequence number == total appended */
static _Alignas(64) _Atomic bool fsm_jon = true;
static size_t fsm_jcap = FSM_JOURNAL_DEFAULT_CAP; /* under fsm_jlock */
static pthread_mutex_t fsm_jlock = PTHREAD_MUTEX_INITIALIZER;

/* Registry: fsm_machines[id - 1] is the machine with that id; id 0 is never given. */
static const fsm_machine_t **fsm_machines;
static size_t fsm_nmachines, fsm_machines_cap;
static pthread_mutex_t fsm_machines_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t fsm_jround(size_t capacity) {
  size_t cap = 1;

  if (!capacity)
    return FSM_JOURNAL_DEFAULT_CAP;
  if (capacity > FSM_JOURNAL_MAX_CAP)
    return FSM_JOURNAL_MAX_CAP;
  while (cap < capacity)
    cap <<= 1;
  return cap;
}

/*
 * The ring is mapped and every page of it touched here, once. Left to fault
 * in as records arrive, its first lap would take a page fault every 128
 * records on the calls' own path, until the ring wrapped. Past
 * FSM_JOURNAL_PREFAULT_MAX the rest faults in as it is used.
 *
 * The ring does not ask for transparent huge pages: on a kernel that
 * samples physical memory for a pageout scheme (DAMON), huge pages made
 * every rank of a job stall together about twice a second. The ring is
 * written in order, so 4 KiB pages cost only a TLB miss every 128 records.
 */
static struct fsm_journal *fsm_jalloc(size_t cap) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t bytes = sizeof(struct fsm_journal) + cap * sizeof(struct fsm_jslot);
  size_t len = (bytes + page - 1) & ~(page - 1);
  uint8_t *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  struct fsm_journal *j;

  if (base == MAP_FAILED)
    return NULL;
  for (size_t off = 0; off < len && off < FSM_JOURNAL_PREFAULT_MAX; off += page)
    ((volatile uint8_t *)base)[off] = 0;
  j = (struct fsm_journal *)base;
  j->mask = cap - 1;
  j->map_len = len;
  return j;
}

static void fsm_jfree(struct fsm_journal *j) {
  if (j)
    munmap(j, j->map_len);
}

static struct fsm_journal *fsm_jget(void) {
  struct fsm_journal *j = atomic_load_explicit(&fsm_jring, memory_order_acquire);

  if (j)
    return j;
  pthread_mutex_lock(&fsm_jlock);
  j = atomic_load_explicit(&fsm_jring, memory_order_relaxed);
  if (!j) {
    j = fsm_jalloc(fsm_jcap);
    if (j)
      atomic_store_explicit(&fsm_jring, j, memory_order_release);
  }
  pthread_mutex_unlock(&fsm_jlock);
  return j;
}

void fsm_journal_configure(size_t capacity) {
  size_t cap = fsm_jround(capacity);
  struct fsm_journal *j = fsm_jalloc(cap), *old;

  if (!j)
    return;
  pthread_mutex_lock(&fsm_jlock);
  fsm_jcap = cap;
  old = atomic_exchange_explicit(&fsm_jring, j, memory_order_acq_rel);
  pthread_mutex_unlock(&fsm_jlock);
  fsm_jfree(old);
}

void fsm_journal_enable(bool on) {
  atomic_store_explicit(&fsm_jon, on, memory_order_relaxed);
}

bool fsm_journal_enabled(void) {
  return atomic_load_explicit(&fsm_jon, memory_order_relaxed);
}

static void fsm_jpack(const fsm_record_t *r, uint64_t w[3]) {
  w[0] = r->t_ns;
  w[1] = (uint64_t)r->actor | (uint64_t)r->group << 32;
  w[2] = (uint64_t)r->machine | (uint64_t)r->from << 16 | (uint64_t)r->event << 32 |
         (uint64_t)r->to << 48;
}

static void fsm_junpack(const uint64_t w[3], fsm_record_t *r) {
  r->t_ns = w[0];
  r->actor = (uint32_t)w[1];
  r->group = (uint32_t)(w[1] >> 32);
  r->machine = (uint16_t)w[2];
  r->from = (uint16_t)(w[2] >> 16);
  r->event = (uint16_t)(w[2] >> 32);
  r->to = (uint16_t)(w[2] >> 48);
}

void fsm_journal_append(const fsm_record_t *r) {
  struct fsm_journal *j;
  struct fsm_jslot *s;
  uint64_t n, cur, w[3];

  if (!r || !fsm_journal_enabled())
    return;
  j = fsm_jget();
  if (!j)
    return;
  n = atomic_fetch_add_explicit(&fsm_jhead, 1, memory_order_relaxed);
  s = &j->slot[n & j->mask];
  cur = atomic_load_explicit(&s->seq, memory_order_relaxed);
  do {
    if ((cur & 1) || cur >= JSEQ_DONE(n))
      return;
  } while (!atomic_compare_exchange_weak_explicit(&s->seq, &cur, JSEQ_BUSY(n), memory_order_acquire,
                                                  memory_order_relaxed));
  /* Release on each word: a reader that sees a new word also sees BUSY
   * when it rechecks seq. DONE is published only after all three. */
  fsm_jpack(r, w);
  for (int i = 0; i < 3; i++)
    atomic_store_explicit(&s->w[i], w[i], memory_order_release);
  atomic_store_explicit(&s->seq, JSEQ_DONE(n), memory_order_release);
}

static bool fsm_jread(struct fsm_jslot *s, uint64_t n, fsm_record_t *out) {
  uint64_t w[3];

  if (atomic_load_explicit(&s->seq, memory_order_acquire) != JSEQ_DONE(n))
    return false;
  for (int i = 0; i < 3; i++)
    w[i] = atomic_load_explicit(&s->w[i], memory_order_acquire);
  if (atomic_load_explicit(&s->seq, memory_order_relaxed) != JSEQ_DONE(n))
    return false;
  fsm_junpack(w, out);
  return true;
}

size_t fsm_journal_snapshot(fsm_record_t *out, size_t max) {
  struct fsm_journal *j = atomic_load_explicit(&fsm_jring, memory_order_acquire);
  uint64_t head, span;
  size_t got = 0;

  if (!out || !max || !j)
    return 0;
  head = atomic_load_explicit(&fsm_jhead, memory_order_acquire);
  span = head < j->mask + 1 ? head : j->mask + 1;
  if (span > max)
    span = max;
  for (uint64_t n = head - span; n < head; n++)
    if (fsm_jread(&j->slot[n & j->mask], n, &out[got]))
      got++;
  return got;
}

uint64_t fsm_journal_total(void) {
  return atomic_load_explicit(&fsm_jhead, memory_order_acquire);
}

void fsm_machine_register(fsm_machine_t *m) {
  const fsm_machine_t **grown;
  size_t cap;

  if (!m)
    return;
  pthread_mutex_lock(&fsm_machines_lock);
  for (size_t i = 0; i < fsm_nmachines; i++)
    if (fsm_machines[i] == m)
      goto out_unlock;
  if (fsm_nmachines == FSM_MACHINES_MAX)
    goto out_unlock;
  if (fsm_nmachines == fsm_machines_cap) {
    cap = fsm_machines_cap ? fsm_machines_cap * 2 : 16;
    grown = realloc(fsm_machines, cap * sizeof(*grown));
    if (!grown)
      goto out_unlock;
    fsm_machines = grown;
    fsm_machines_cap = cap;
  }
  fsm_machines[fsm_nmachines++] = m;
  m->id = (uint16_t)fsm_nmachines;
out_unlock:
  pthread_mutex_unlock(&fsm_machines_lock);
}

const fsm_machine_t *fsm_machine_lookup(uint16_t id) {
  const fsm_machine_t *m = NULL;

  pthread_mutex_lock(&fsm_machines_lock);
  if (id && id <= fsm_nmachines)
    m = fsm_machines[id - 1];
  pthread_mutex_unlock(&fsm_machines_lock);
  return m;
}
