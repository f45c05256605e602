/*
 * xgather.c - the allgather over a communicator's own transport, which
 * communicators made by chorus_comm_split use in place of a bootstrap, and
 * chorus_comm_shrink among the survivors.
 *
 * Rounds of one fixed exchange: every rank sends a CTL_BLOCK-byte block to
 * every other. The first block carries the contribution's length and its
 * first bytes, further rounds the rest, as many as the longest needs. The
 * plan is the same every round, so it is built once per communicator and
 * kept (comm->ctl_plan): a run reads its plan until after it completes.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "eng.h"
#include "fsm.h"

#define CTL_BLOCK 1024
#define CTL_HEAD 8 /* the length, in the first block */

/* Every rank's block into recv[rank*CTL_BLOCK]: one message to each peer
 * (message number = receiver's rank, so unique per sender) and a copy of
 * our own block. No dependencies: every step is ready at once. */
static int ctl_plan_build(int rank, int n, const bool *alive, plan_t **out) {
  plan_builder_t b;
  int rc;

  if ((rc = plan_build_begin(&b, "ctl-allgather", rank, n, CTL_BLOCK, CHORUS_UINT8, CHORUS_SUM,
                             false)))
    return rc;
  for (int p = 0; p < n; p++) {
    if (alive && !alive[p] && p != rank)
      continue; /* shrink: nothing to or from a lost rank */
    if (p == rank) {
      plan_step_t cp = {.kind = STEP_COPY,
                        .bytes = CTL_BLOCK,
                        .dst = {BUF_RECV, (size_t)rank * CTL_BLOCK},
                        .src = {BUF_SEND, 0}};
      plan_add(&b, &cp);
      continue;
    }
    plan_step_t st = {
        .kind = STEP_SEND, .peer = p, .msg = (uint32_t)p, .bytes = CTL_BLOCK, .src = {BUF_SEND, 0}};
    plan_step_t rv = {.kind = STEP_RECV,
                      .peer = p,
                      .msg = (uint32_t)rank,
                      .bytes = CTL_BLOCK,
                      .dst = {BUF_RECV, (size_t)p * CTL_BLOCK}};
    plan_add(&b, &st);
    plan_add(&b, &rv);
  }
  return plan_build_end(&b, out);
}

/* One round on c's progress thread, waited for. It takes a sequence
 * number like any collective: every rank of c makes the same calls in the
 * same order. */
static chorus_result ctl_round(chorus_comm_t *c, const void *mine, void *all, const bool *alive) {
  chorus_request_t *r;
  plan_t *own = NULL;

  if (alive ? ctl_plan_build(c->rank, c->size, alive, &own)
            : !c->ctl_plan && ctl_plan_build(c->rank, c->size, NULL, &c->ctl_plan))
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "allgather: out of memory");
  if (!(r = calloc(1, sizeof(*r)))) {
    plan_free(own);
    return comm_error(c, CHORUS_ERR_NO_MEMORY, "allgather: out of memory");
  }
  r->comm = c;
  r->slot = NULL;
  r->plan = own ? own : c->ctl_plan;
  r->sendbuf = mine;
  r->recvbuf = all;
  r->coll = COLL_ALLGATHER;
  if (alive) {
    /* shrink, on a failed communicator: its survivors may have begun
     * different numbers of calls, so the round has tags of its own */
    r->internal = r->recovery = true;
    r->seq = ++c->recovery_seq;
  } else {
    r->call_seq = ++c->seq;
    r->seq = (uint16_t)r->call_seq;
  }
  if (c->set.trace && !alive) {
    ckpt_call_t call = {.seq = r->call_seq,
                        .root = -1,
                        .kind = COLL_ALLGATHER,
                        .dtype = CHORUS_UINT8,
                        .count = (uint64_t)c->size * CTL_BLOCK,
                        .begin_ns = fsm_now_ns()};
    snprintf(call.algo, sizeof(call.algo), "split");
    ckpt_begin(&c->ckpt, &call);
  }
  comm_submit(c, r, true, 0);
  request_wait_done(r);
  chorus_result ret = r->result;
  /* request_complete touches nothing of r after marking it done */
  free(r);
  plan_free(own);
  return ret;
}

chorus_result comm_xport_allgather(chorus_comm_t *c, const bool *alive, const void *mine,
                                   size_t len, void ***out_ptrs, size_t **out_lens) {
  const size_t n = (size_t)c->size, first = CTL_BLOCK - CTL_HEAD;
  uint8_t block[CTL_BLOCK];
  uint8_t *all = calloc(n, CTL_BLOCK); /* a lost rank's block stays empty */
  uint64_t *lens64 = malloc(n * sizeof(*lens64));
  void **ptrs = NULL;
  size_t *lens = NULL;
  uint64_t max = 0, total = 0, my_len = len;
  chorus_result ret;

  if (!all || !lens64) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "allgather: out of memory");
    goto out;
  }
  memset(block, 0, sizeof(block));
  memcpy(block, &my_len, CTL_HEAD);
  if (len)
    memcpy(block + CTL_HEAD, mine, len < first ? len : first);
  if ((ret = ctl_round(c, block, all, alive)))
    goto out;
  for (size_t i = 0; i < n; i++) {
    memcpy(&lens64[i], all + i * CTL_BLOCK, CTL_HEAD);
    max = lens64[i] > max ? lens64[i] : max;
    total += lens64[i];
  }
  if (max > (1u << 30)) {
    ret = comm_error(c, CHORUS_ERR_CORRUPT, "allgather: a rank announced %llu bytes",
                     (unsigned long long)max);
    goto out;
  }
  ptrs = malloc(n * sizeof(void *) + total + 1);
  lens = malloc(n * sizeof(*lens));
  if (!ptrs || !lens) {
    ret = comm_error(c, CHORUS_ERR_NO_MEMORY, "allgather: out of memory");
    goto out;
  }
  uint8_t *data = (uint8_t *)(ptrs + n);
  for (size_t i = 0; i < n; i++) {
    ptrs[i] = data;
    lens[i] = lens64[i];
    memcpy(data, all + i * CTL_BLOCK + CTL_HEAD, lens64[i] < first ? lens64[i] : first);
    data += lens64[i];
  }
  /* the rest, CTL_BLOCK bytes a round, as long as the longest needs */
  for (uint64_t off = first; off < max; off += CTL_BLOCK) {
    memset(block, 0, sizeof(block));
    if (my_len > off)
      memcpy(block, (const uint8_t *)mine + off,
             my_len - off < CTL_BLOCK ? my_len - off : CTL_BLOCK);
    if ((ret = ctl_round(c, block, all, alive)))
      goto out;
    for (size_t i = 0; i < n; i++)
      if (lens64[i] > off)
        memcpy((uint8_t *)ptrs[i] + off, all + i * CTL_BLOCK,
               lens64[i] - off < CTL_BLOCK ? lens64[i] - off : CTL_BLOCK);
  }
  *out_ptrs = ptrs;
  *out_lens = lens;
  ptrs = NULL;
  lens = NULL;
out:
  free(all);
  free(lens64);
  free(ptrs);
  free(lens);
  return ret;
}
