/*
 * text.c - the wait-for graph and the ranks' states as plain text, after
 * the diagnosis paragraph.
 */
#include <stdlib.h>

#include "trace.h"

#define GRAPH_EDGES 64 /* edges printed without -v */
#define RANK_STEPS 16  /* pending steps printed per rank */

void tr_where(tr_buf_t *b, const tr_dump_t *d) {
  if (!d) {
    tr_bputs(b, "no dump");
    return;
  }
  const tr_call_t *c = tr_current(d);
  uint64_t lb = tr_last_begun(d);
  if (tr_in_coll(d)) {
    tr_bprintf(b, "in #%llu ", (unsigned long long)(c && c->seq ? c->seq : lb));
    tr_call_str(b, c);
    if (c && c->begin_ns) {
      tr_bputs(b, " for ");
      tr_dur_str(b, tr_age(d->t_dump_ns, c->begin_ns));
    }
  } else if (lb) {
    tr_bprintf(b, "in no collective, last #%llu ", (unsigned long long)lb);
    tr_call_str(b, tr_call_at(d, lb));
    if (tr_last_finished(d) < lb)
      tr_bputs(b, " (not finished)");
  } else {
    tr_bputs(b, "in no collective, never called one");
  }
}

void tr_print_graph(const tr_diag_t *d, FILE *f, bool all) {
  const tr_comm_t *c = d->comm;
  int *in = calloc((size_t)c->size, sizeof(*in)), *out = calloc((size_t)c->size, sizeof(*out));
  tr_buf_t b = {0};
  if (!in || !out)
    goto out;
  for (size_t i = 0; i < d->nedges; i++) {
    in[d->edges[i].to]++;
    out[d->edges[i].from]++;
  }
  fprintf(f, "wait-for graph (comm %u", (unsigned)c->id);
  if (c->sub_id) /* a split whose head left no dump */
    fprintf(f, " split %llx", (unsigned long long)c->sub_id);
  fprintf(f, ": %d ranks, %d dumps, %zu edges):\n", c->size, c->ndumps, d->nedges);
  if (!d->nedges)
    fprintf(f, "  no rank waits on another\n");
  for (size_t i = 0; i < d->nedges; i++) {
    const tr_edge_t *e = &d->edges[i];
    if (!all && i == GRAPH_EDGES) {
      fprintf(f, "  ... %zu more (-v prints them all)\n", d->nedges - i);
      break;
    }
    tr_bclear(&b);
    tr_edge_step_str(&b, e, c->size);
    tr_bputs(&b, ", ");
    tr_step_state_str(&b, e->step);
    tr_bputs(&b, " for ");
    tr_dur_str(&b, e->age_ns);
    if (e->nsteps > 1)
      tr_bprintf(&b, " (+%u more steps)", e->nsteps - 1);
    fprintf(f, "  rank %d -> rank %d: %s%s\n", e->from, e->to, tr_bstr(&b),
            e->in_cycle ? "  [cycle]" : "");
  }
  size_t nroots = 0;
  for (int r = 0; r < c->size; r++) {
    if (!in[r] || out[r])
      continue;
    if (!all && nroots == GRAPH_EDGES) {
      fprintf(f, "  ... more roots (-v prints them all)\n");
      break;
    }
    tr_bclear(&b);
    tr_where(&b, c->ranks[r].d);
    fprintf(f, "root: rank %d (%s), waited on by %d%s\n", r, tr_bstr(&b), in[r],
            r == d->culprit ? "  [culprit]" : "");
    nroots++;
  }
  if (d->ncycle) {
    fprintf(f, "cycle:");
    for (size_t i = 0; i < d->ncycle; i++)
      fprintf(f, "%s rank %d", i ? " ->" : "", d->cycle[i]);
    fprintf(f, "\n");
  }
  if (d->culprit >= 0 && !(in[d->culprit] && !out[d->culprit])) {
    tr_bclear(&b);
    tr_where(&b, c->ranks[d->culprit].d);
    fprintf(f, "culprit: rank %d (%s)\n", d->culprit, tr_bstr(&b));
  }
out:
  tr_bfree(&b);
  free(in);
  free(out);
}

void tr_print_ranks(const tr_diag_t *d, FILE *f) {
  const tr_comm_t *c = d->comm;
  tr_buf_t b = {0};
  fprintf(f, "ranks of comm %u:\n", (unsigned)c->id);
  for (int r = 0; r < c->size; r++) {
    const tr_dump_t *dp = c->ranks[r].d;
    if (!dp) {
      fprintf(f, "rank %d: no dump%s\n", r, r == d->culprit ? "  [culprit]" : "");
      continue;
    }
    const tr_ckpt_t *ck = tr_ckpt(dp);
    fprintf(f, "rank %d [%s] ", r, c->ranks[r].file);
    tr_bclear(&b);
    tr_text_str(&b, dp->host, 64);
    fprintf(f, "host %s pid %d: ", tr_bstr(&b), (int)dp->pid);
    tr_bclear(&b);
    tr_where(&b, dp);
    fprintf(f, "%s", tr_bstr(&b));
    if (ck) {
      fprintf(f, "; last finished #%llu", (unsigned long long)ck->last_finished);
      if (ck->progress_ns) {
        tr_bclear(&b);
        tr_dur_str(&b, tr_age(dp->t_dump_ns, ck->progress_ns));
        fprintf(f, "; progress ran %s before the dump", tr_bstr(&b));
      }
      fprintf(f, "; %zu pending steps", ck->n_pending);
    }
    fprintf(f, "%s\n", r == d->culprit ? "  [culprit]" : "");
    for (size_t i = 0; ck && i < ck->n_pending; i++) {
      if (i == RANK_STEPS) {
        fprintf(f, "    ... %zu more\n", ck->n_pending - i);
        break;
      }
      const tr_step_t *s = ck->pending[i];
      tr_bclear(&b);
      tr_step_str(&b, s, c->size);
      tr_bputs(&b, ": ");
      tr_step_state_str(&b, s);
      tr_bputs(&b, " for ");
      tr_dur_str(&b, tr_age(dp->t_dump_ns, s->since_ns));
      fprintf(f, "    #%llu step %u %s\n", (unsigned long long)s->seq, (unsigned)s->index,
              tr_bstr(&b));
    }
    if (dp->verdict) {
      const Chorus__Trace__Verdict *v = dp->verdict;
      fprintf(f, "    verdict %s", tr_reason_name((int)v->reason));
      if (v->culprit >= 0)
        fprintf(f, " (blames rank %d)", (int)v->culprit);
      if (v->text[0]) {
        tr_bclear(&b);
        tr_text_str(&b, v->text, 400);
        fprintf(f, ": %s", tr_bstr(&b));
      }
      fprintf(f, "\n");
    }
    size_t shown = 0;
    for (size_t i = 0; i < dp->n_peers; i++) {
      const Chorus__Trace__PeerView *p = dp->peers[i];
      if (p->state == CHORUS__TRACE__PEER_VIEW__STATE__ALIVE)
        continue;
      if (shown++ == RANK_STEPS) {
        fprintf(f, "    ... more peers\n");
        break;
      }
      tr_bclear(&b);
      tr_dur_str(&b, tr_age(dp->t_dump_ns, p->last_heard_ns));
      fprintf(f, "    sees rank %d %s (last seq %llu, heard %s%s)\n", (int)p->rank,
              tr_peer_state_name((int)p->state), (unsigned long long)p->last_seq,
              p->last_heard_ns ? tr_bstr(&b) : "never", p->last_heard_ns ? " before" : "");
    }
    if (dp->n_journal || dp->n_faults || dp->n_messages)
      fprintf(f, "    journal %zu transitions (%llu dropped), %zu messages, %zu faults\n",
              dp->n_journal, (unsigned long long)dp->journal_dropped, dp->n_messages, dp->n_faults);
  }
  tr_bfree(&b);
}
