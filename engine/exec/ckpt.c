/*
 * ckpt.c - call fingerprints and a communicator's checkpoint (ckpt.h).
 */
#include <stdio.h>
#include <string.h>

#include "ckpt.h"
#include "fsm.h"

static size_t algo_count(void) {
  static size_t n;
  if (!n)
    while (algo_table[n].name)
      n++;
  return n;
}

uint64_t fp_make(int kind, chorus_dtype dtype, uint64_t count, int root, chorus_op op,
                 const algo_desc_t *algo) {
  uint64_t a = 0;
  if (algo) {
    size_t i = (size_t)(algo - algo_table);
    a = i < algo_count() && i + 1 < 31 ? i + 1 : 31;
  }
  uint64_t r = root < 0 || root >= FP_ROOT_NONE ? FP_ROOT_NONE : (uint64_t)root;
  return ((uint64_t)(kind + 1) & 15) << 59 | ((uint64_t)(dtype + 1) & 15) << 55 |
         ((uint64_t)(op + 1) & 7) << 52 | a << 47 | r << 32 | (count & 0xffffffffu);
}

int fp_kind(uint64_t fp) {
  int k = (int)((fp >> 59) & 15);
  return k ? k - 1 : -1;
}

void fp_format(uint64_t fp, char *buf, size_t len) {
  int kind = fp_kind(fp);
  int dtype = (int)((fp >> 55) & 15) - 1;
  int op = (int)((fp >> 52) & 7) - 1;
  unsigned a = (unsigned)((fp >> 47) & 31);
  unsigned root = (unsigned)((fp >> 32) & 0x7fff);
  unsigned long count = (unsigned long)(fp & 0xffffffffu);
  const char *dn = dtype >= 0 ? chorus_dtype_name((chorus_dtype)dtype) : NULL;
  const char *algo = a && a < 31 && a <= algo_count() ? algo_table[a - 1].name : "?";
  char extra[48] = "";
  size_t off = 0;

  if (!fp) {
    snprintf(buf, len, "an internal round");
    return;
  }
  if (kind == COLL_ALLREDUCE || kind == COLL_REDUCE || kind == COLL_REDUCE_SCATTER) {
    const char *on = op >= 0 ? chorus_op_name((chorus_op)op) : NULL;
    off += (size_t)snprintf(extra + off, sizeof(extra) - off, ", %s", on ? on : "?");
  }
  if (root != FP_ROOT_NONE && kind != FP_KIND_P2P && off < sizeof(extra))
    snprintf(extra + off, sizeof(extra) - off, ", root %u", root);
  if (kind == COLL_BARRIER)
    snprintf(buf, len, "barrier()");
  else if (kind == FP_KIND_P2P)
    snprintf(buf, len, "send/recv(%s, %lu)", dn ? dn : "?", count);
  else
    snprintf(buf, len, "%s(%s, %lu%s, %s)", kind >= 0 ? coll_kind_str(kind) : "?", dn ? dn : "?",
             count, extra, algo);
}

void ckpt_init(ckpt_t *k) {
  memset(k, 0, sizeof(*k));
  pthread_mutex_init(&k->lock, NULL);
}

void ckpt_fini(ckpt_t *k) {
  pthread_mutex_destroy(&k->lock);
}

void ckpt_begin(ckpt_t *k, const ckpt_call_t *call) {
  pthread_mutex_lock(&k->lock);
  ckpt_call_t *e = &k->recent[call->seq % CKPT_RECENT];
  *e = *call;
  e->end_ns = 0;
  e->status = 0;
  if (call->seq > k->last_begun)
    k->last_begun = call->seq;
  k->nopen++;
  pthread_mutex_unlock(&k->lock);
}

void ckpt_end(ckpt_t *k, uint64_t seq, int status) {
  uint64_t now = fsm_stamp_ns(); /* inside a progress round: its held clock */
  pthread_mutex_lock(&k->lock);
  ckpt_call_t *e = &k->recent[seq % CKPT_RECENT];
  if (e->seq == seq && !e->end_ns) {
    e->end_ns = now ? now : 1;
    e->status = status;
  }
  if (seq > k->last_finished)
    k->last_finished = seq;
  if (k->nopen)
    k->nopen--;
  pthread_mutex_unlock(&k->lock);
}

uint64_t ckpt_age_ms(const ckpt_call_t *call, uint64_t now_ns) {
  return now_ns > call->begin_ns ? (now_ns - call->begin_ns) / 1000000 : 0;
}

size_t ckpt_recent(ckpt_t *k, ckpt_call_t *out, size_t max) {
  size_t n = 0;
  pthread_mutex_lock(&k->lock);
  uint64_t first = k->last_begun >= CKPT_RECENT ? k->last_begun - CKPT_RECENT + 1 : 1;
  for (uint64_t s = first; s <= k->last_begun && n < max; s++) {
    const ckpt_call_t *e = &k->recent[s % CKPT_RECENT];
    if (e->seq == s)
      out[n++] = *e;
  }
  pthread_mutex_unlock(&k->lock);
  return n;
}

bool ckpt_current(ckpt_t *k, ckpt_call_t *out) {
  ckpt_call_t all[CKPT_RECENT];
  size_t n = ckpt_recent(k, all, CKPT_RECENT);
  for (size_t i = 0; i < n; i++)
    if (!all[i].end_ns) {
      *out = all[i];
      return true;
    }
  if (n)
    *out = all[n - 1];
  else
    memset(out, 0, sizeof(*out));
  return false;
}

void ckpt_block(ckpt_t *k, uint64_t what) {
  if (!what)
    return;
  atomic_store_explicit(&k->block_what, what, memory_order_relaxed);
  uint64_t now = fsm_now_ns();
  atomic_store_explicit(&k->block_ns, now ? now : 1, memory_order_release);
}

void ckpt_unblock(ckpt_t *k) {
  atomic_store_explicit(&k->block_ns, 0, memory_order_release);
}

bool ckpt_blocked(ckpt_t *k, uint64_t *what, uint64_t *since_ns) {
  uint64_t ns = atomic_load_explicit(&k->block_ns, memory_order_acquire);
  *what = atomic_load_explicit(&k->block_what, memory_order_relaxed);
  /* another wait began in between: show neither */
  if (!ns || atomic_load_explicit(&k->block_ns, memory_order_acquire) != ns)
    return false;
  *since_ns = ns;
  return true;
}
