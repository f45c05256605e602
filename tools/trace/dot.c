/*
 * dot.c - Graphviz of the wait-for graph (culprit red, cycle edges red) and,
 * in a second cluster, the step machine of one rank's stuck steps: its
 * states, the transitions its journal shows them take (else the machine of
 * engine/exec/exec.h), and a note per stuck step pointing at the state it is in.
 *
 *   chorus-trace DIR --dot w.dot && dot -Tsvg w.dot > w.svg
 */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

#define DOT_ALL_RANKS 64 /* up to this size every rank is a node */
#define DOT_NODES 256
#define DOT_EDGES 1024
#define DOT_STEPS 12
#define DOT_STATES 32
#define DOT_TRANSITIONS 64

typedef struct out {
  FILE *f;
  tr_buf_t b;
} out_t;

static const char *esc_n(out_t *o, const char *s, size_t max) {
  tr_bclear(&o->b);
  tr_dot_str(&o->b, s, max);
  return tr_bstr(&o->b);
}

static const char *esc(out_t *o, const char *s) {
  tr_bclear(&o->b);
  tr_dot_str(&o->b, s, 300);
  return tr_bstr(&o->b);
}

static void rank_node(out_t *o, const tr_diag_t *dg, int r) {
  const tr_dump_t *d = dg->comm->ranks[r].d;
  tr_buf_t l = {0};
  tr_bprintf(&l, "rank %d\n", r);
  if (!d) {
    tr_bputs(&l, "no dump");
  } else if (tr_in_coll(d)) {
    const tr_call_t *c = tr_current(d);
    tr_bprintf(&l, "in #%llu %s", (unsigned long long)(c ? c->seq : tr_last_begun(d)),
               tr_coll_name(c ? (int)c->kind : 0));
  } else if (tr_last_begun(d)) {
    const tr_call_t *c = tr_call_at(d, tr_last_begun(d));
    tr_bprintf(&l, "idle, last #%llu %s", (unsigned long long)tr_last_begun(d),
               tr_coll_name(c ? (int)c->kind : 0));
  } else {
    tr_bputs(&l, "idle");
  }
  if (r == dg->culprit)
    tr_bprintf(&l, "\nCULPRIT: %s", tr_kind_name(dg->kind));
  fprintf(o->f, "    r%d [label=\"%s\"", r, esc(o, tr_bstr(&l)));
  if (r == dg->culprit)
    fprintf(o->f, ", class=\"culprit\", color=red, fontcolor=red, fillcolor=\"#ffd6d6\", "
                  "penwidth=2.5");
  if (!d)
    fprintf(o->f, ", style=\"rounded,dashed,filled\", fillcolor=\"%s\"",
            r == dg->culprit ? "#ffd6d6" : "#eeeeee");
  fprintf(o->f, "];\n");
  tr_bfree(&l);
}

static void wait_graph(out_t *o, const tr_diag_t *dg) {
  const tr_comm_t *c = dg->comm;
  uint8_t *show = calloc((size_t)c->size, 1);
  if (!show)
    return;
  size_t n = 0;
  if (c->size <= DOT_ALL_RANKS) {
    memset(show, 1, (size_t)c->size);
    n = (size_t)c->size;
  } else {
    if (dg->culprit >= 0) {
      show[dg->culprit] = 1;
      n++;
    }
    for (size_t i = 0; i < dg->nedges && n + 2 <= DOT_NODES; i++) {
      n += !show[dg->edges[i].from] + !show[dg->edges[i].to];
      show[dg->edges[i].from] = show[dg->edges[i].to] = 1;
    }
  }
  fprintf(o->f, "  subgraph cluster_wait {\n    label=\"wait-for graph, comm %u (%d ranks)\";\n",
          (unsigned)c->id, c->size);
  for (int r = 0; r < c->size; r++)
    if (show[r])
      rank_node(o, dg, r);
  size_t drawn = 0;
  for (size_t i = 0; i < dg->nedges && drawn < DOT_EDGES; i++) {
    const tr_edge_t *e = &dg->edges[i];
    if (!show[e->from] || !show[e->to])
      continue;
    tr_buf_t l = {0};
    tr_edge_step_str(&l, e, c->size);
    tr_bputs(&l, "\n");
    tr_dur_str(&l, e->age_ns);
    if (e->nsteps > 1)
      tr_bprintf(&l, " (+%u)", e->nsteps - 1);
    fprintf(o->f, "    r%d -> r%d [label=\"%s\"%s];\n", e->from, e->to, esc(o, tr_bstr(&l)),
            (dg->kind == TR_CYCLE ? e->in_cycle : e->to == dg->culprit) ? ", color=red, penwidth=2"
                                                                        : "");
    tr_bfree(&l);
    drawn++;
  }
  if (c->size > DOT_ALL_RANKS)
    fprintf(o->f, "    note [shape=plaintext, label=\"%zu of %d ranks shown\"];\n", n, c->size);
  fprintf(o->f, "  }\n");
  free(show);
}

/* ---- the step machine of one rank's stuck steps ---- */

typedef struct states {
  char *name[DOT_STATES];
  size_t n;
} states_t;

/* The node of a state name (case-insensitive), added when new; -1 when full. */
static int state_id(states_t *s, const char *name) {
  for (size_t i = 0; i < s->n; i++)
    if (!strcasecmp(s->name[i], name))
      return (int)i;
  if (s->n == DOT_STATES)
    return -1;
  s->name[s->n] = strdup(name);
  if (!s->name[s->n])
    return -1;
  for (char *p = s->name[s->n]; *p; p++)
    *p = (char)toupper((unsigned char)*p);
  return (int)s->n++;
}

typedef struct trans {
  int from, to;
  const char *event;
  size_t count;
} trans_t;

static void add_trans(trans_t *t, size_t *n, int from, int to, const char *event) {
  if (from < 0 || to < 0)
    return;
  for (size_t i = 0; i < *n; i++)
    if (t[i].from == from && t[i].to == to && !strcmp(t[i].event, event)) {
      t[i].count++;
      return;
    }
  if (*n < DOT_TRANSITIONS)
    t[(*n)++] = (trans_t){from, to, event, 1};
}

static bool stuck_step(const tr_ckpt_t *ck, uint64_t seq, uint32_t index) {
  for (size_t i = 0; i < ck->n_pending; i++)
    if (ck->pending[i]->seq == seq && ck->pending[i]->index == index)
      return true;
  return false;
}

static const char *name_at(char **names, size_t n, uint32_t i) {
  return i < n && names[i][0] ? names[i] : NULL;
}

static void step_machine(out_t *o, const tr_diag_t *dg) {
  int r = dg->fsm_rank;
  const tr_dump_t *d = r >= 0 ? dg->comm->ranks[r].d : NULL;
  const tr_ckpt_t *ck = tr_ckpt(d);
  if (!ck || !ck->n_pending)
    return;
  states_t st = {0};
  trans_t tr[DOT_TRANSITIONS];
  size_t ntr = 0;
  /* the transitions the stuck steps took, as the journal has them */
  for (size_t i = 0; i < d->n_journal; i++) {
    const Chorus__Trace__Transition *t = d->journal[i];
    const Chorus__Trace__Machine *m = NULL;
    for (size_t k = 0; k < d->n_machines && !m; k++)
      if (d->machines[k]->id == t->machine)
        m = d->machines[k];
    if (!m || t->to == 0xffff || !stuck_step(ck, t->group, t->actor))
      continue;
    const char *from = name_at(m->states, m->n_states, t->from);
    const char *to = name_at(m->states, m->n_states, t->to);
    const char *ev = name_at(m->events, m->n_events, t->event);
    if (from && to)
      add_trans(tr, &ntr, state_id(&st, from), state_id(&st, to), ev ? ev : "");
  }
  bool journal = ntr > 0;
  if (!journal) {
    static const struct {
      const char *from, *ev, *to;
    } canon[] = {{"WAIT", "dep", "READY"},       {"READY", "posted", "POSTED"},
                 {"POSTED", "complete", "DONE"}, {"READY", "run", "DONE"},
                 {"WAIT", "error", "FAILED"},    {"READY", "error", "FAILED"},
                 {"POSTED", "error", "FAILED"}};
    for (size_t i = 0; i < sizeof(canon) / sizeof(canon[0]); i++)
      add_trans(tr, &ntr, state_id(&st, canon[i].from), state_id(&st, canon[i].to), canon[i].ev);
  }
  const tr_call_t *c = tr_current(d);
  tr_buf_t l = {0};
  tr_bprintf(&l, "rank %d: the step machine of its stuck steps", r);
  if (c)
    tr_bprintf(&l, " (#%llu %s)", (unsigned long long)c->seq, tr_coll_name((int)c->kind));
  tr_bputs(&l, journal ? ", transitions from its journal" : ", transitions of engine/exec/exec.h");
  fprintf(o->f, "  subgraph cluster_fsm {\n    label=\"%s\";\n", esc(o, tr_bstr(&l)));
  fprintf(o->f, "    node [shape=ellipse, style=filled, fillcolor=\"#f4f4f4\"];\n");
  /* stuck steps first: their states join the table before it is drawn */
  int at[DOT_STEPS];
  size_t nsteps = ck->n_pending < DOT_STEPS ? ck->n_pending : DOT_STEPS;
  for (size_t i = 0; i < nsteps; i++)
    at[i] = state_id(&st, tr_state_name((int)ck->pending[i]->state));
  for (size_t i = 0; i < st.n; i++)
    fprintf(o->f, "    s%zu [label=\"%s\"];\n", i, esc(o, st.name[i]));
  for (size_t i = 0; i < ntr; i++) {
    tr_bclear(&l);
    tr_bputs(&l, tr[i].event);
    if (tr[i].count > 1)
      tr_bprintf(&l, " (x%zu)", tr[i].count);
    fprintf(o->f, "    s%d -> s%d [label=\"%s\"];\n", tr[i].from, tr[i].to, esc(o, tr_bstr(&l)));
  }
  for (size_t i = 0; i < nsteps; i++) {
    const tr_step_t *s = ck->pending[i];
    tr_bclear(&l);
    tr_bprintf(&l, "step %u: ", (unsigned)s->index);
    tr_step_str(&l, s, dg->comm->size);
    tr_bprintf(&l, "\n%s for ", tr_state_name((int)s->state));
    tr_dur_str(&l, tr_age(d->t_dump_ns, s->since_ns));
    fprintf(o->f, "    step%zu [shape=note, color=red, fillcolor=\"#fff0e0\", label=\"%s\"];\n", i,
            esc(o, tr_bstr(&l)));
    if (at[i] >= 0)
      fprintf(o->f, "    step%zu -> s%d [style=dotted, color=red, arrowhead=none];\n", i, at[i]);
  }
  if (ck->n_pending > nsteps)
    fprintf(o->f, "    more [shape=plaintext, label=\"%zu more stuck steps\"];\n",
            ck->n_pending - nsteps);
  fprintf(o->f, "  }\n");
  tr_bfree(&l);
  for (size_t i = 0; i < st.n; i++)
    free(st.name[i]);
}

int tr_write_dot(const tr_diag_t *dg, FILE *f) {
  out_t o = {.f = f};
  int rc = 0;
  /* the diagnosis as the title, a line per clause */
  tr_buf_t title = {0};
  for (const char *p = dg->text ? dg->text : ""; *p; p++) {
    if (p[0] == ';' && p[1] == ' ') {
      tr_bputs(&title, ";\n");
      p++;
    } else {
      tr_bprintf(&title, "%c", *p);
    }
  }
  fprintf(f, "digraph chorus_trace {\n");
  fprintf(f,
          "  graph [label=\"%s\", labelloc=t, labeljust=l, fontname=\"Helvetica\", "
          "fontsize=12];\n",
          esc_n(&o, tr_bstr(&title), 4000));
  tr_bfree(&title);
  fprintf(f, "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#eef3fb\", "
             "fontname=\"Helvetica\", fontsize=10];\n");
  fprintf(f, "  edge [fontname=\"Helvetica\", fontsize=9];\n");
  wait_graph(&o, dg);
  step_machine(&o, dg);
  fprintf(f, "}\n");
  if (o.b.oom)
    rc = -ENOMEM;
  tr_bfree(&o.b);
  if (!rc && ferror(f))
    rc = -EIO;
  return rc;
}
