/*
 * html.c - one self-contained page: the diagnosis at the top (#diagnosis),
 * a timeline with a lane per rank on rank 0's clock (collectives, steps,
 * message arrows, stuck steps and the wait-for edges in red, the culprit's
 * lane red: class "culprit"), the wait-for graph, a table of the ranks and
 * their stuck steps. Style and script are embedded (page.css, page.js via
 * embed.cmake); the data the script draws is a JSON block built here.
 * Without a script the diagnosis, the table and the graph as text remain.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"
#include "trace_page.h"

#define HTML_LANES 256    /* lanes drawn */
#define HTML_CALLS 200    /* newest calls per lane */
#define HTML_MESSAGES 400 /* newest completed messages per lane */
#define HTML_PENDING 200  /* stuck steps per lane */
#define HTML_MARKS 100    /* faults per lane */
#define HTML_ARROWS 3000  /* message arrows in all */
#define HTML_TABLE_RANKS 1024
#define HTML_STUCK_RANKS 64
#define HTML_STUCK_STEPS 16

typedef struct page {
  FILE *f;
  const tr_diag_t *dg;
  const tr_comm_t *c;
  uint8_t *shown; /* [size] lanes drawn */
  size_t nshown;
  bool measuring; /* first pass: only the time bounds */
  bool have_t;
  double t0, t1; /* global ns */
  tr_buf_t b;    /* scratch for escapes */
  size_t narrows;
} page_t;

static const char *json(page_t *p, const char *s) {
  tr_bclear(&p->b);
  tr_json_str(&p->b, s, 2000);
  return tr_bstr(&p->b);
}

static const char *html(page_t *p, const char *s) {
  tr_bclear(&p->b);
  tr_html_str(&p->b, s, 4000);
  return tr_bstr(&p->b);
}

/* A time on the page: ms since t0 (first pass: widens the bounds). */
static double ms(page_t *p, const tr_dump_t *d, uint64_t t) {
  double g = tr_global_ns(d, t);
  if (p->measuring) {
    if (!p->have_t || g < p->t0)
      p->t0 = g;
    if (!p->have_t || g > p->t1)
      p->t1 = g;
    p->have_t = true;
  }
  return (g - p->t0) / 1e6;
}

static void pick_lanes(page_t *p) {
  const tr_diag_t *dg = p->dg;
  int size = p->c->size;
  if (size <= HTML_LANES) {
    memset(p->shown, 1, (size_t)size);
    p->nshown = (size_t)size;
    return;
  }
#define SHOW(r)                                                                                    \
  do {                                                                                             \
    if (!p->shown[r] && p->nshown < HTML_LANES) {                                                  \
      p->shown[r] = 1;                                                                             \
      p->nshown++;                                                                                 \
    }                                                                                              \
  } while (0)
  if (dg->culprit >= 0)
    SHOW(dg->culprit);
  for (size_t i = 0; i < dg->ncycle; i++)
    SHOW(dg->cycle[i]);
  for (size_t i = 0; i < dg->nedges; i++) {
    SHOW(dg->edges[i].from);
    SHOW(dg->edges[i].to);
  }
  for (int r = 0; r < size; r++)
    SHOW(r);
#undef SHOW
}

/* ---- the data block ---- */

static void lane_calls(page_t *p, const tr_dump_t *d) {
  size_t n = 0;
  const tr_call_t *c;
  while (tr_call_nth(d, n))
    n++;
  bool first = true;
  tr_buf_t t = {0};
  for (size_t i = n > HTML_CALLS ? n - HTML_CALLS : 0; (c = tr_call_nth(d, i)); i++) {
    if (!c->begin_ns)
      continue;
    bool open = !c->end_ns || c->end_ns < c->begin_ns;
    uint64_t end = open ? d->t_dump_ns : c->end_ns;
    double s = ms(p, d, c->begin_ns), e = ms(p, d, end > c->begin_ns ? end : c->begin_ns);
    if (p->measuring)
      continue;
    tr_bclear(&t);
    tr_bprintf(&t, "#%llu ", (unsigned long long)c->seq);
    tr_call_str(&t, c);
    if (c->algo[0])
      tr_bprintf(&t, " [%.32s]", c->algo);
    tr_bputs(&t, open ? ", not finished at the dump" : ", took ");
    if (!open)
      tr_dur_str(&t, c->end_ns - c->begin_ns);
    if (c->status)
      tr_bprintf(&t, ", status %d", (int)c->status);
    fprintf(p->f, "%s[%.3f,%.3f,\"#%llu %s\",", first ? "" : ",", s, e, (unsigned long long)c->seq,
            tr_coll_name((int)c->kind));
    fprintf(p->f, "%s,%d]", json(p, tr_bstr(&t)), open);
    first = false;
  }
  tr_bfree(&t);
}

static void lane_steps(page_t *p, const tr_dump_t *d) {
  bool first = true;
  tr_buf_t t = {0};
  int size = p->c->size;
  size_t from = d->n_messages > HTML_MESSAGES ? d->n_messages - HTML_MESSAGES : 0;
  for (size_t i = from; i < d->n_messages; i++) {
    const Chorus__Trace__Message *m = d->messages[i];
    if (!m->posted_ns || !m->done_ns || m->done_ns < m->posted_ns)
      continue;
    double s = ms(p, d, m->posted_ns), e = ms(p, d, m->done_ns);
    if (p->measuring)
      continue;
    tr_step_t st = CHORUS__TRACE__STEP__INIT;
    st.kind = m->send ? CHORUS__TRACE__STEP_KIND__STEP_SEND : CHORUS__TRACE__STEP_KIND__STEP_RECV;
    st.peer = m->peer;
    st.chunk = m->chunk;
    tr_bclear(&t);
    tr_bprintf(&t, "#%llu step %u: ", (unsigned long long)m->seq, (unsigned)m->step);
    tr_step_str(&t, &st, size);
    tr_bprintf(&t, ", %llu bytes, ", (unsigned long long)m->bytes);
    tr_dur_str(&t, m->done_ns - m->posted_ns);
    fprintf(p->f, "%s[%.3f,%.3f,\"\",", first ? "" : ",", s, e);
    fprintf(p->f, "%s,0]", json(p, tr_bstr(&t)));
    first = false;
  }
  const tr_ckpt_t *ck = tr_ckpt(d);
  size_t n = ck ? ck->n_pending : 0;
  for (size_t i = 0; i < n && i < HTML_PENDING; i++) {
    const tr_step_t *s = ck->pending[i];
    uint64_t since = s->since_ns && s->since_ns <= d->t_dump_ns ? s->since_ns : d->t_dump_ns;
    double a = ms(p, d, since), e = ms(p, d, d->t_dump_ns);
    if (p->measuring)
      continue;
    tr_bclear(&t);
    tr_bprintf(&t, "stuck: #%llu step %u: ", (unsigned long long)s->seq, (unsigned)s->index);
    tr_step_str(&t, s, size);
    tr_bputs(&t, ", ");
    tr_step_state_str(&t, s);
    tr_bputs(&t, " for ");
    tr_dur_str(&t, d->t_dump_ns - since);
    fprintf(p->f, "%s[%.3f,%.3f,\"\",", first ? "" : ",", a, e);
    fprintf(p->f, "%s,1]", json(p, tr_bstr(&t)));
    first = false;
  }
  tr_bfree(&t);
}

static void lane_marks(page_t *p, const tr_dump_t *d) {
  bool first = true;
  tr_buf_t t = {0};
  size_t from = d->n_faults > HTML_MARKS ? d->n_faults - HTML_MARKS : 0;
  for (size_t i = from; i < d->n_faults; i++) {
    const Chorus__Trace__Fault *f = d->faults[i];
    double at = ms(p, d, f->t_ns ? f->t_ns : d->t_dump_ns);
    if (p->measuring)
      continue;
    tr_bclear(&t);
    tr_bprintf(&t, "fault %.40s", f->kind[0] ? f->kind : "?");
    if (f->peer >= 0)
      tr_bprintf(&t, ", peer %d", (int)f->peer);
    if (f->seq)
      tr_bprintf(&t, ", #%llu", (unsigned long long)f->seq);
    if (f->detail[0])
      tr_bprintf(&t, ": %.200s", f->detail);
    fprintf(p->f, "%s[%.3f,\"fault\",", first ? "" : ",", at);
    fprintf(p->f, "%s]", json(p, tr_bstr(&t)));
    first = false;
  }
  if (d->verdict) {
    const Chorus__Trace__Verdict *v = d->verdict;
    double at = ms(p, d, v->t_ns ? v->t_ns : d->t_dump_ns);
    if (!p->measuring) {
      tr_bclear(&t);
      tr_bprintf(&t, "verdict %s", tr_reason_name((int)v->reason));
      if (v->culprit >= 0)
        tr_bprintf(&t, ", blames rank %d", (int)v->culprit);
      if (v->text[0])
        tr_bprintf(&t, ": %.300s", v->text);
      fprintf(p->f, "%s[%.3f,\"verdict\",", first ? "" : ",", at);
      fprintf(p->f, "%s]", json(p, tr_bstr(&t)));
    }
  }
  tr_bfree(&t);
}

static void lanes(page_t *p) {
  bool first = true;
  tr_buf_t t = {0};
  for (int r = 0; r < p->c->size; r++) {
    if (!p->shown[r])
      continue;
    const tr_dump_t *d = p->c->ranks[r].d;
    if (!p->measuring) {
      fprintf(p->f, "%s\n{\"r\":%d,\"dump\":%s,\"culprit\":%s,", first ? "" : ",", r,
              d ? "true" : "false", r == p->dg->culprit ? "true" : "false");
      tr_bclear(&t);
      tr_bprintf(&t, "rank %d%s", r, r == p->dg->culprit ? " (culprit)" : "");
      fprintf(p->f, "\"name\":%s,", json(p, tr_bstr(&t)));
      tr_bclear(&t);
      if (d && d->host[0])
        tr_bprintf(&t, "%.40s pid %d", d->host, (int)d->pid);
      else if (d)
        tr_bprintf(&t, "pid %d", (int)d->pid);
      fprintf(p->f, "\"sub\":%s,", json(p, tr_bstr(&t)));
      tr_bclear(&t);
      tr_where(&t, d);
      fprintf(p->f, "\"where\":%s,", json(p, tr_bstr(&t)));
      first = false;
    }
    if (!d) {
      if (!p->measuring)
        fprintf(p->f, "\"tdump\":null,\"calls\":[],\"steps\":[],\"marks\":[]}");
      continue;
    }
    double td = ms(p, d, d->t_dump_ns);
    if (!p->measuring)
      fprintf(p->f, "\"tdump\":%.3f,\"calls\":[", td);
    lane_calls(p, d);
    if (!p->measuring)
      fprintf(p->f, "],\"steps\":[");
    lane_steps(p, d);
    if (!p->measuring)
      fprintf(p->f, "],\"marks\":[");
    lane_marks(p, d);
    if (!p->measuring)
      fprintf(p->f, "]}");
  }
  tr_bfree(&t);
}

static bool arrow(void *arg, int from, const Chorus__Trace__Message *s, int to,
                  const Chorus__Trace__Message *r) {
  page_t *p = arg;
  if (!p->shown[from] || !p->shown[to])
    return true;
  if (p->narrows == HTML_ARROWS)
    return false;
  const tr_dump_t *fd = p->c->ranks[from].d, *td = p->c->ranks[to].d;
  tr_buf_t t = {0};
  tr_bprintf(&t, "#%llu message %u: rank %d -> rank %d, %llu bytes", (unsigned long long)s->seq,
             (unsigned)s->msg, from, to, (unsigned long long)s->bytes);
  fprintf(p->f, "%s\n[%d,%.3f,%d,%.3f,", p->narrows ? "," : "", from, ms(p, fd, s->posted_ns), to,
          ms(p, td, r->done_ns));
  fprintf(p->f, "%s]", json(p, tr_bstr(&t)));
  tr_bfree(&t);
  p->narrows++;
  return true;
}

static void waits(page_t *p) {
  const tr_diag_t *dg = p->dg;
  tr_buf_t t = {0};
  bool first = true;
  for (size_t i = 0; i < dg->nedges; i++) {
    const tr_edge_t *e = &dg->edges[i];
    if (!p->shown[e->from] || !p->shown[e->to])
      continue;
    const tr_dump_t *d = p->c->ranks[e->from].d;
    tr_bclear(&t);
    tr_bprintf(&t, "rank %d waits for rank %d: ", e->from, e->to);
    tr_edge_step_str(&t, e, p->c->size);
    tr_bputs(&t, ", ");
    tr_step_state_str(&t, e->step);
    tr_bputs(&t, " for ");
    tr_dur_str(&t, e->age_ns);
    if (e->nsteps > 1)
      tr_bprintf(&t, " (+%u more steps)", e->nsteps - 1);
    fprintf(p->f, "%s\n[%d,%d,%.3f,", first ? "" : ",", e->from, e->to, ms(p, d, d->t_dump_ns));
    fprintf(p->f, "%s,%d]", json(p, tr_bstr(&t)),
            dg->kind == TR_CYCLE ? e->in_cycle : e->to == dg->culprit);
    first = false;
  }
  tr_bfree(&t);
}

static void data(page_t *p) {
  p->measuring = true;
  lanes(p);
  p->measuring = false;
  if (!p->have_t)
    p->t0 = p->t1 = 0;
  fprintf(p->f, "{\"comm\":%u,\"size\":%d,\"culprit\":%d,\"kind\":\"%s\",\"hidden\":%zu,",
          (unsigned)p->c->id, p->c->size, p->dg->culprit, tr_kind_name(p->dg->kind),
          (size_t)p->c->size - p->nshown);
  fprintf(p->f, "\"span\":%.3f,\"diagnosis\":%s,\n\"ranks\":[", (p->t1 - p->t0) / 1e6,
          json(p, p->dg->text));
  lanes(p);
  fprintf(p->f, "],\n\"arrows\":[");
  tr_match_messages(p->c, arrow, p);
  fprintf(p->f, "],\n\"waits\":[");
  waits(p);
  fprintf(p->f, "]}");
}

/* ---- static parts ---- */

static void rank_table(page_t *p) {
  const tr_comm_t *c = p->c;
  tr_buf_t t = {0};
  fprintf(p->f, "<table class=\"ranks\"><tr><th>rank</th><th>host</th><th>pid</th><th>where</th>"
                "<th>last finished</th><th>stuck steps</th><th>progress ran</th>"
                "<th>its verdict</th><th>file</th></tr>\n");
  size_t rows = 0;
  for (int r = 0; r < c->size; r++) {
    if (c->size > HTML_TABLE_RANKS && !p->shown[r])
      continue;
    const tr_dump_t *d = c->ranks[r].d;
    const tr_ckpt_t *ck = tr_ckpt(d);
    const char *cls = r == p->dg->culprit ? (d ? "rank culprit" : "rank culprit missing")
                      : d                 ? "rank"
                                          : "rank missing";
    fprintf(p->f, "<tr class=\"%s\" data-rank=\"%d\"><td>%d%s</td>", cls, r, r,
            r == p->dg->culprit ? " (culprit)" : "");
    if (!d) {
      fprintf(p->f, "<td colspan=\"8\">no dump</td></tr>\n");
      continue;
    }
    fprintf(p->f, "<td>%s</td><td>%d</td>", html(p, d->host), (int)d->pid);
    tr_bclear(&t);
    tr_where(&t, d);
    fprintf(p->f, "<td>%s</td>", html(p, tr_bstr(&t)));
    fprintf(p->f, "<td>#%llu</td><td>%zu</td>", (unsigned long long)tr_last_finished(d),
            ck ? ck->n_pending : 0);
    tr_bclear(&t);
    if (ck && ck->progress_ns) {
      tr_dur_str(&t, tr_age(d->t_dump_ns, ck->progress_ns));
      tr_bputs(&t, " before the dump");
    }
    fprintf(p->f, "<td>%s</td>", tr_bstr(&t));
    tr_bclear(&t);
    if (d->verdict) {
      tr_bputs(&t, tr_reason_name((int)d->verdict->reason));
      if (d->verdict->culprit >= 0)
        tr_bprintf(&t, " (blames rank %d)", (int)d->verdict->culprit);
      if (d->verdict->text[0])
        tr_bprintf(&t, ": %.300s", d->verdict->text);
    }
    fprintf(p->f, "<td>%s</td>", html(p, tr_bstr(&t)));
    fprintf(p->f, "<td>%s</td></tr>\n", html(p, c->ranks[r].file));
    rows++;
  }
  fprintf(p->f, "</table>\n");
  if (c->size > HTML_TABLE_RANKS)
    fprintf(p->f, "<p class=\"meta\">%zu of %d ranks listed.</p>\n", rows, c->size);
  tr_bfree(&t);
}

static void stuck_lists(page_t *p) {
  const tr_comm_t *c = p->c;
  tr_buf_t t = {0};
  size_t shown = 0;
  for (int r = 0; r < c->size && shown < HTML_STUCK_RANKS; r++) {
    const tr_dump_t *d = c->ranks[r].d;
    const tr_ckpt_t *ck = tr_ckpt(d);
    if (!ck || !ck->n_pending || !p->shown[r])
      continue;
    fprintf(p->f, "<details%s><summary>rank %d: %zu stuck steps</summary><ul>\n",
            r == p->dg->culprit || r == p->dg->fsm_rank ? " open" : "", r, ck->n_pending);
    for (size_t i = 0; i < ck->n_pending && i < HTML_STUCK_STEPS; i++) {
      const tr_step_t *s = ck->pending[i];
      tr_bclear(&t);
      tr_bprintf(&t, "#%llu step %u: ", (unsigned long long)s->seq, (unsigned)s->index);
      tr_step_str(&t, s, c->size);
      tr_bputs(&t, ", ");
      tr_step_state_str(&t, s);
      tr_bputs(&t, " for ");
      tr_dur_str(&t, tr_age(d->t_dump_ns, s->since_ns));
      fprintf(p->f, "<li>%s</li>\n", html(p, tr_bstr(&t)));
    }
    if (ck->n_pending > HTML_STUCK_STEPS)
      fprintf(p->f, "<li>... %zu more</li>\n", ck->n_pending - HTML_STUCK_STEPS);
    fprintf(p->f, "</ul></details>\n");
    shown++;
  }
  if (!shown)
    fprintf(p->f, "<p>No rank has a stuck step.</p>\n");
  tr_bfree(&t);
}

static int graph_text(page_t *p) {
  char *text = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&text, &len);
  if (!m)
    return -ENOMEM;
  tr_print_graph(p->dg, m, false);
  if (fclose(m)) {
    free(text);
    return -ENOMEM;
  }
  fprintf(p->f, "<pre id=\"graph-text\">");
  /* line by line: html() drops newlines */
  for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
    nl = strchr(line, '\n');
    if (nl)
      *nl = 0;
    fprintf(p->f, "%s\n", html(p, line));
  }
  fprintf(p->f, "</pre>\n");
  free(text);
  return 0;
}

int tr_write_html(const tr_diag_t *dg, FILE *f) {
  const tr_comm_t *c = dg->comm;
  page_t p = {.f = f, .dg = dg, .c = c};
  int rc = 0;
  p.shown = calloc((size_t)c->size, 1);
  if (!p.shown)
    return -ENOMEM;
  pick_lanes(&p);
  fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
  fprintf(f, "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
  fprintf(f, "<title>chorus-trace: comm %u, %s</title>\n", (unsigned)c->id, tr_kind_name(dg->kind));
  fprintf(f, "<style>\n%s</style>\n</head>\n<body>\n", (const char *)tr_page_css);
  fprintf(f, "<h1>chorus-trace: comm %u, %d ranks, %d dumps</h1>\n", (unsigned)c->id, c->size,
          c->ndumps);
  fprintf(f, "<div class=\"box%s\"><h2>diagnosis: %s", dg->kind == TR_NONE ? " none" : "",
          tr_kind_name(dg->kind));
  if (dg->culprit >= 0)
    fprintf(f, ", culprit rank %d", dg->culprit);
  fprintf(f, "</h2>\n<p id=\"diagnosis\">%s</p></div>\n", html(&p, dg->text));
  fprintf(f, "<h2>Timeline</h2>\n<div class=\"toolbar\"><button id=\"zoom-out\">&minus;</button>"
             "<button id=\"zoom-in\">+</button><button id=\"zoom-fit\">fit</button>"
             "<button id=\"zoom-end\">at the dumps</button>"
             "<span class=\"hint\">ctrl+wheel zooms; hover for details</span>\n"
             "<span class=\"legend\"><span><i style=\"background:#93c5fd\"></i>collective</span>"
             "<span><i style=\"background:#fca5a5;border-color:#b91c1c\"></i>unfinished</span>"
             "<span><i style=\"background:#c4b5fd\"></i>message</span>"
             "<span><i style=\"background:#fdba74;border-color:#dc2626\"></i>stuck step</span>"
             "<span><i style=\"background:#fff;border:0;border-top:2px dashed #dc2626\"></i>"
             "waits for</span><span><i style=\"background:#fee2e2\"></i>culprit</span></span>"
             "</div>\n");
  fprintf(f, "<div id=\"timeline\"><noscript>The timeline needs JavaScript; the diagnosis, the "
             "graph and the tables below do not.</noscript></div>\n");
  fprintf(f, "<h2>Wait-for graph</h2>\n<div id=\"graph\"></div>\n");
  if ((rc = graph_text(&p)))
    goto out;
  fprintf(f, "<h2>Ranks</h2>\n");
  rank_table(&p);
  fprintf(f, "<h2>Stuck steps</h2>\n");
  stuck_lists(&p);
  fprintf(f, "<div id=\"footer\" class=\"meta\">written by chorus-trace; times on rank 0's clock"
             "</div>\n");
  fprintf(f, "<script type=\"application/json\" id=\"trace-data\">");
  data(&p);
  fprintf(f, "</script>\n<script>\n%s</script>\n</body></html>\n", (const char *)tr_page_js);
out:
  if (!rc && p.b.oom)
    rc = -ENOMEM;
  tr_bfree(&p.b);
  free(p.shown);
  if (!rc && ferror(f))
    rc = -EIO;
  return rc;
}
