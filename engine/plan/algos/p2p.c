/*
 * p2p.c - point to point: one rank's half of a send/recv pair.
 *
 * COLL_SEND sends send[count] to peer a->root, COLL_RECV receives recv[count]
 * from it. The bytes are cut into chunk_bytes messages 0..k-1, so that a
 * large transfer pipelines through the transport instead of waiting on one
 * rendezvous of the whole buffer:
 *
 *   sender   SEND#0  SEND#1  ...  SEND#k-1     (all independent)
 *              |       |             |
 *   receiver RECV#0  RECV#1  ...  RECV#k-1
 *
 * A count of 0 is an empty plan on both sides (nothing is exchanged).
 */
#include <errno.h>

#include "algos.h"

int algo_p2p(const algo_args_t *a, plan_t **out) {
  const size_t es = chorus_dtype_size(a->dtype);
  const bool is_send = a->coll == COLL_SEND;
  plan_builder_t b;
  int rc;

  *out = NULL;
  if ((a->coll != COLL_SEND && a->coll != COLL_RECV) || !es || a->nranks <= 0 || a->rank < 0 ||
      a->rank >= a->nranks || a->root < 0 || a->root >= a->nranks || a->root == a->rank)
    return -EINVAL;
  if (a->count > SIZE_MAX / es)
    return -E2BIG;
  const size_t bytes = a->count * es, unit = algo_chunk_unit(a->chunk_bytes, es);
  const size_t nmsg = algo_npieces(bytes, unit);
  if (nmsg > ALGO_MAX_MSGS)
    return -E2BIG;
  if ((rc = plan_build_begin(&b, "p2p", a->rank, a->nranks, a->count, a->dtype, a->op, false)))
    return rc;
  for (size_t i = 0; i < nmsg; i++) {
    size_t off = i * unit, len = bytes - off < unit ? bytes - off : unit;
    plan_step_t st = {
        .kind = is_send ? STEP_SEND : STEP_RECV, .peer = a->root, .msg = (uint32_t)i, .bytes = len};
    if (is_send)
      st.src = (plan_ref_t){BUF_SEND, off};
    else
      st.dst = (plan_ref_t){BUF_RECV, off};
    plan_add(&b, &st);
  }
  return plan_build_end(&b, out);
}
