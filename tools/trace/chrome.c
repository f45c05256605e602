/*
 * chrome.c - the dumps as Chrome trace events (chrome://tracing, Perfetto's
 * legacy JSON importer): {"traceEvents": [...]}, times in microseconds on
 * rank 0's clock (each rank's time + its clock_offset_ns).
 *
 *   pid = rank       tid 1 "collectives"  complete events ("X") per call
 *                    tid 2 "steps"        messages (posted..done), pending
 *                                         steps (since..dump, cname red),
 *                                         journal transitions (instants)
 *                    tid 3 "events"       faults, the verdict, the dump
 *   flows ("s" -> "f") from a SEND's slice to its RECV's slice when both
 *   ranks recorded the message; one global instant holds the diagnosis.
 */
#include <errno.h>
#include <stdlib.h>

#include "trace.h"

#define JOURNAL_EVENTS 4096 /* newest transitions drawn per rank */

enum { TID_CALLS = 1, TID_STEPS = 2, TID_EVENTS = 3 };

typedef struct out {
  FILE *f;
  bool first;
  tr_buf_t b;
} out_t;

/* Starts an event: the separator, then what fprintf adds. */
static void ev(out_t *o) {
  fputs(o->first ? "\n" : ",\n", o->f);
  o->first = false;
}

static const char *js(out_t *o, const char *s) {
  tr_bclear(&o->b);
  tr_json_str(&o->b, s, 1000);
  return tr_bstr(&o->b);
}

static double us(const tr_dump_t *d, uint64_t t) {
  return tr_global_ns(d, t) / 1e3;
}

static void meta(out_t *o, const tr_diag_t *dg, int r) {
  const tr_dump_t *d = dg->comm->ranks[r].d;
  tr_buf_t n = {0};
  tr_bprintf(&n, "rank %d", r);
  if (!d)
    tr_bputs(&n, " (no dump)");
  else if (d->host[0])
    tr_bprintf(&n, " %.64s pid %d", d->host, (int)d->pid);
  if (r == dg->culprit)
    tr_bprintf(&n, " - CULPRIT: %s", tr_kind_name(dg->kind));
  ev(o);
  fprintf(o->f,
          "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":%s}}", r,
          js(o, tr_bstr(&n)));
  ev(o);
  fprintf(o->f,
          "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"sort_index\":%d}}",
          r, r);
  static const char *const tn[] = {NULL, "collectives", "steps", "events"};
  for (int t = TID_CALLS; d && t <= TID_EVENTS; t++) {
    ev(o);
    fprintf(
        o->f,
        "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
        r, t, tn[t]);
  }
  tr_bfree(&n);
}

static void calls(out_t *o, int r, const tr_dump_t *d) {
  tr_buf_t c = {0};
  const tr_call_t *cl;
  for (size_t i = 0; (cl = tr_call_nth(d, i)); i++) {
    if (!cl->begin_ns)
      continue;
    bool open = !cl->end_ns || cl->end_ns < cl->begin_ns;
    uint64_t end = open ? d->t_dump_ns : cl->end_ns;
    if (end < cl->begin_ns)
      end = cl->begin_ns;
    tr_bclear(&c);
    tr_call_str(&c, cl);
    ev(o);
    fprintf(o->f,
            "{\"ph\":\"X\",\"cat\":\"collective\",\"name\":\"#%llu %s\",\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f,\"dur\":%.3f,%s\"args\":{\"call\":%s,",
            (unsigned long long)cl->seq, tr_coll_name((int)cl->kind), r, TID_CALLS,
            us(d, cl->begin_ns), (double)(end - cl->begin_ns) / 1e3,
            open ? "\"cname\":\"terrible\"," : "", js(o, tr_bstr(&c)));
    fprintf(o->f, "\"algo\":%s,\"status\":%d,\"finished\":%s}}", js(o, cl->algo), (int)cl->status,
            open ? "false" : "true");
  }
  tr_bfree(&c);
}

/* A pending step as a stuck span: s holds its label (its state is added),
 * sd is the dump that holds it (a split's, for a wait inside a split). */
static void stuck(out_t *o, int r, tr_buf_t *s, const tr_step_t *p, const tr_dump_t *sd,
                  const char *seq_key) {
  uint64_t since = p->since_ns && p->since_ns <= sd->t_dump_ns ? p->since_ns : sd->t_dump_ns;
  tr_bputs(s, " [");
  tr_step_state_str(s, p);
  tr_bputs(s, "]");
  ev(o);
  fprintf(o->f,
          "{\"ph\":\"X\",\"cat\":\"stuck\",\"name\":%s,\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
          "\"dur\":%.3f,\"cname\":\"terrible\",\"args\":{\"%s\":%llu,\"step\":%u,"
          "\"state\":\"%s\",\"bytes\":%llu,\"waited_s\":%.3f}}",
          js(o, tr_bstr(s)), r, TID_STEPS, us(sd, since), (double)(sd->t_dump_ns - since) / 1e3,
          seq_key, (unsigned long long)p->seq, (unsigned)p->index, tr_state_name((int)p->state),
          (unsigned long long)p->bytes, (double)(sd->t_dump_ns - since) / 1e9);
}

static void steps(out_t *o, const tr_diag_t *dg, int r, const tr_dump_t *d) {
  tr_buf_t s = {0};
  int size = dg->comm->size;
  for (size_t i = 0; i < d->n_messages; i++) {
    const Chorus__Trace__Message *m = d->messages[i];
    if (!m->posted_ns || !m->done_ns || m->done_ns < m->posted_ns)
      continue;
    tr_bclear(&s);
    tr_step_t st = CHORUS__TRACE__STEP__INIT;
    st.kind = m->send ? CHORUS__TRACE__STEP_KIND__STEP_SEND : CHORUS__TRACE__STEP_KIND__STEP_RECV;
    st.peer = m->peer;
    st.chunk = m->chunk;
    tr_step_str(&s, &st, size);
    ev(o);
    fprintf(o->f,
            "{\"ph\":\"X\",\"cat\":\"message\",\"name\":%s,\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
            "\"dur\":%.3f,\"args\":{\"seq\":%llu,\"step\":%u,\"msg\":%u,\"bytes\":%llu}}",
            js(o, tr_bstr(&s)), r, TID_STEPS, us(d, m->posted_ns),
            (double)(m->done_ns - m->posted_ns) / 1e3, (unsigned long long)m->seq,
            (unsigned)m->step, (unsigned)m->msg, (unsigned long long)m->bytes);
  }
  const tr_ckpt_t *ck = tr_ckpt(d);
  for (size_t i = 0; ck && i < ck->n_pending; i++) {
    tr_bclear(&s);
    tr_step_str(&s, ck->pending[i], size);
    stuck(o, r, &s, ck->pending[i], d, "seq");
  }
  /* its waits inside splits of this communicator (their steps are the split's) */
  for (size_t i = 0; i < dg->nedges; i++) {
    const tr_edge_t *e = &dg->edges[i];
    if (e->from != r || !e->via || !e->dump)
      continue;
    tr_bclear(&s);
    tr_edge_step_str(&s, e, size);
    stuck(o, r, &s, e->step, e->dump, "split_seq");
  }
  size_t from = d->n_journal > JOURNAL_EVENTS ? d->n_journal - JOURNAL_EVENTS : 0;
  for (size_t i = from; i < d->n_journal; i++) {
    const Chorus__Trace__Transition *t = d->journal[i];
    tr_bclear(&s);
    tr_bprintf(&s, "#%llu step %u: ", (unsigned long long)t->group, (unsigned)t->actor);
    tr_transition_str(&s, d, t);
    ev(o);
    fprintf(o->f,
            "{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"fsm\",\"name\":%s,\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f}",
            js(o, tr_bstr(&s)), r, TID_STEPS, us(d, t->t_ns));
  }
  tr_bfree(&s);
}

static void events(out_t *o, const tr_diag_t *dg, int r, const tr_dump_t *d) {
  for (size_t i = 0; i < d->n_faults; i++) {
    const Chorus__Trace__Fault *f = d->faults[i];
    tr_buf_t n = {0};
    tr_bputs(&n, "fault: ");
    tr_bputs(&n, f->kind[0] ? f->kind : "?");
    ev(o);
    fprintf(o->f,
            "{\"ph\":\"i\",\"s\":\"p\",\"cat\":\"fault\",\"name\":%s,\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f,",
            js(o, tr_bstr(&n)), r, TID_EVENTS, us(d, f->t_ns ? f->t_ns : d->t_dump_ns));
    fprintf(o->f, "\"args\":{\"peer\":%d,\"seq\":%llu,\"detail\":%s}}", (int)f->peer,
            (unsigned long long)f->seq, js(o, f->detail));
    tr_bfree(&n);
  }
  if (d->verdict) {
    const Chorus__Trace__Verdict *v = d->verdict;
    ev(o);
    fprintf(o->f,
            "{\"ph\":\"i\",\"s\":\"p\",\"cat\":\"verdict\",\"name\":\"verdict: %s\",\"pid\":%d,"
            "\"tid\":%d,\"ts\":%.3f,",
            tr_reason_name((int)v->reason), r, TID_EVENTS, us(d, v->t_ns ? v->t_ns : d->t_dump_ns));
    fprintf(o->f, "\"args\":{\"culprit\":%d,\"status\":%d,\"text\":%s}}", (int)v->culprit,
            (int)v->status, js(o, v->text));
  }
  ev(o);
  fprintf(o->f,
          "{\"ph\":\"i\",\"s\":\"p\",\"cat\":\"dump\",\"name\":\"dump%s\",\"pid\":%d,\"tid\":%d,"
          "\"ts\":%.3f}",
          r == dg->culprit ? " (culprit)" : "", r, TID_EVENTS, us(d, d->t_dump_ns));
}

/* ---- flows: a rank's SEND to its peer's RECV of the same (seq, msg) ---- */

typedef struct flow_arg {
  out_t *o;
  const tr_comm_t *c;
  size_t id;
} flow_arg_t;

static bool flow(void *arg, int from, const Chorus__Trace__Message *s, int to,
                 const Chorus__Trace__Message *r) {
  flow_arg_t *a = arg;
  a->id++;
  ev(a->o);
  fprintf(a->o->f,
          "{\"ph\":\"s\",\"cat\":\"message\",\"name\":\"msg\",\"id\":%zu,\"pid\":%d,"
          "\"tid\":%d,\"ts\":%.3f}",
          a->id, from, TID_STEPS, us(a->c->ranks[from].d, s->posted_ns));
  ev(a->o);
  fprintf(a->o->f,
          "{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"message\",\"name\":\"msg\",\"id\":%zu,"
          "\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
          a->id, to, TID_STEPS, us(a->c->ranks[to].d, r->done_ns));
  return true;
}

static int flows(out_t *o, const tr_diag_t *dg) {
  flow_arg_t a = {.o = o, .c = dg->comm};
  return tr_match_messages(dg->comm, flow, &a);
}

int tr_write_chrome(const tr_diag_t *dg, FILE *f) {
  const tr_comm_t *c = dg->comm;
  out_t o = {.f = f, .first = true};
  double last = 0;
  bool any = false;
  int rc = 0;
  fputs("{\"traceEvents\":[", f);
  for (int r = 0; r < c->size; r++) {
    const tr_dump_t *d = c->ranks[r].d;
    meta(&o, dg, r);
    if (!d)
      continue;
    calls(&o, r, d);
    steps(&o, dg, r, d);
    events(&o, dg, r, d);
    double t = us(d, d->t_dump_ns);
    if (!any || t > last)
      last = t;
    any = true;
  }
  rc = flows(&o, dg);
  ev(&o);
  fprintf(f,
          "{\"ph\":\"i\",\"s\":\"g\",\"cat\":\"diagnosis\",\"name\":\"diagnosis: %s\",\"pid\":%d,"
          "\"tid\":%d,\"ts\":%.3f,",
          tr_kind_name(dg->kind), dg->culprit >= 0 ? dg->culprit : 0, TID_EVENTS, last);
  fprintf(f, "\"args\":{\"culprit\":%d,\"text\":%s}}", dg->culprit, js(&o, dg->text));
  fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"tool\":\"chorus-trace\",\"comm\":%u,",
          (unsigned)c->id);
  fprintf(f, "\"diagnosis\":%s,\"culprit\":%d}}\n", js(&o, dg->text), dg->culprit);
  if (!rc && o.b.oom)
    rc = -ENOMEM;
  tr_bfree(&o.b);
  if (!rc && ferror(f))
    rc = -EIO;
  return rc;
}
