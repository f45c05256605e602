/*
 * util.c - chorus-trace's strings: a growing buffer, escapes for JSON, HTML
 * and dot that survive any bytes a dump holds, and the names of calls,
 * steps and durations.
 */
#include <stdlib.h>
#include <string.h>

#include "trace.h"

/* ---- buffer ---- */

static bool grow(tr_buf_t *b, size_t more) {
  if (b->oom)
    return false;
  if (b->len + more + 1 <= b->cap)
    return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + more + 1) {
    if (cap > SIZE_MAX / 2) {
      b->oom = true;
      return false;
    }
    cap *= 2;
  }
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = true;
    return false;
  }
  b->p = p;
  b->cap = cap;
  return true;
}

void tr_bprintf(tr_buf_t *b, const char *fmt, ...) {
  va_list ap;
  char small[256];
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0 || !grow(b, (size_t)n))
    return;
  if ((size_t)n < sizeof(small)) {
    memcpy(b->p + b->len, small, (size_t)n + 1);
  } else {
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  b->len += (size_t)n;
}

static void put(tr_buf_t *b, const char *s, size_t n) {
  if (!grow(b, n))
    return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

void tr_bputs(tr_buf_t *b, const char *s) {
  put(b, s, strlen(s));
}

void tr_bclear(tr_buf_t *b) {
  b->len = 0;
  if (b->p)
    b->p[0] = 0;
}

const char *tr_bstr(const tr_buf_t *b) {
  return b->p ? b->p : "";
}

void tr_bfree(tr_buf_t *b) {
  free(b->p);
  *b = (tr_buf_t){0};
}

/* ---- escapes ---- */

/* Length of the valid UTF-8 sequence at s (of at most n bytes), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  size_t len;
  unsigned min;
  if (c < 0x80)
    return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
    min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (len > n)
    return 0;
  unsigned cp = c & (0x7f >> len);
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return len;
}

enum esc_lang { ESC_JSON, ESC_HTML, ESC_DOT, ESC_TEXT };

static void escape(tr_buf_t *b, const char *str, size_t max, enum esc_lang lang) {
  const unsigned char *s = (const unsigned char *)(str ? str : "");
  size_t n = strlen((const char *)s);
  if (max && n > max)
    n = max;
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    size_t l = utf8_len(s + i, n - i);
    if (l == 0) {
      if (lang == ESC_JSON)
        tr_bputs(b, "\\ufffd");
      else
        tr_bputs(b, "\xef\xbf\xbd");
      i++;
      continue;
    }
    if (l > 1) {
      put(b, (const char *)s + i, l);
      i += l;
      continue;
    }
    i++;
    switch (lang) {
    case ESC_JSON:
      if (c == '"' || c == '\\')
        tr_bprintf(b, "\\%c", c);
      else if (c == '\n')
        tr_bputs(b, "\\n");
      else if (c < 0x20 || c == 0x7f || c == '<' || c == '>' || c == '&')
        tr_bprintf(b, "\\u%04x", c);
      else
        put(b, (const char *)&s[i - 1], 1);
      break;
    case ESC_HTML:
      if (c == '&')
        tr_bputs(b, "&amp;");
      else if (c == '<')
        tr_bputs(b, "&lt;");
      else if (c == '>')
        tr_bputs(b, "&gt;");
      else if (c == '"')
        tr_bputs(b, "&quot;");
      else if (c == '\'')
        tr_bputs(b, "&#39;");
      else if (c == '\n' || c == '\t')
        put(b, " ", 1);
      else if (c >= 0x20 && c != 0x7f)
        put(b, (const char *)&s[i - 1], 1);
      break;
    case ESC_DOT:
      if (c == '"' || c == '\\')
        tr_bprintf(b, "\\%c", c);
      else if (c == '\n')
        tr_bputs(b, "\\n");
      else if (c >= 0x20 && c != 0x7f)
        put(b, (const char *)&s[i - 1], 1);
      break;
    case ESC_TEXT:
      if (c == '\n' || c == '\t')
        put(b, " ", 1);
      else if (c >= 0x20 && c != 0x7f)
        put(b, (const char *)&s[i - 1], 1);
      break;
    }
  }
}

void tr_json_str(tr_buf_t *b, const char *s, size_t max) {
  put(b, "\"", 1);
  escape(b, s, max, ESC_JSON);
  put(b, "\"", 1);
}

void tr_html_str(tr_buf_t *b, const char *s, size_t max) {
  escape(b, s, max, ESC_HTML);
}

void tr_dot_str(tr_buf_t *b, const char *s, size_t max) {
  escape(b, s, max, ESC_DOT);
}

void tr_text_str(tr_buf_t *b, const char *s, size_t max) {
  escape(b, s, max, ESC_TEXT);
}

/* ---- names ---- */

#define NAME(table, v) ((v) >= 0 && (size_t)(v) < sizeof(table) / sizeof(table[0]) ? table[v] : "?")

const char *tr_coll_name(int kind) {
  static const char *const t[] = {"?",         "allreduce",      "bcast",    "reduce",
                                  "allgather", "reduce_scatter", "alltoall", "gather",
                                  "scatter",   "barrier",        "send",     "recv"};
  return NAME(t, kind);
}

const char *tr_dtype_name(int dtype) {
  static const char *const t[] = {"?",       "int8",     "uint8",   "int32",  "int64",
                                  "float16", "bfloat16", "float32", "float64"};
  return NAME(t, dtype);
}

const char *tr_op_name(int op) {
  static const char *const t[] = {"?", "sum", "prod", "min", "max", "avg"};
  return NAME(t, op);
}

const char *tr_step_kind_name(int kind) {
  static const char *const t[] = {"STEP", "SEND", "RECV", "REDUCE", "COPY", "SCALE"};
  return NAME(t, kind);
}

const char *tr_state_name(int state) {
  static const char *const t[] = {"?", "WAIT", "READY", "POSTED", "DONE", "FAILED"};
  return NAME(t, state);
}

const char *tr_reason_name(int reason) {
  static const char *const t[] = {"UNSPECIFIED", "TIMEOUT",  "REQUEST",  "ERROR",
                                  "FATAL",       "DIVERGED", "MISMATCH", "PEER_LOST"};
  return NAME(t, reason);
}

const char *tr_peer_state_name(int st) {
  static const char *const t[] = {"UNKNOWN", "ALIVE", "SUSPECT", "LOST"};
  return NAME(t, st);
}

const char *tr_kind_name(tr_kind k) {
  static const char *const t[] = {"none",    "mismatched call", "diverged",       "lost",
                                  "stalled", "lost messages",   "deadlock cycle", "blamed"};
  return NAME(t, (int)k);
}

static bool rooted(int kind) {
  return kind == CHORUS__TRACE__COLL_KIND__COLL_BCAST ||
         kind == CHORUS__TRACE__COLL_KIND__COLL_REDUCE ||
         kind == CHORUS__TRACE__COLL_KIND__COLL_GATHER ||
         kind == CHORUS__TRACE__COLL_KIND__COLL_SCATTER;
}

static bool reducing(int kind) {
  return kind == CHORUS__TRACE__COLL_KIND__COLL_ALLREDUCE ||
         kind == CHORUS__TRACE__COLL_KIND__COLL_REDUCE ||
         kind == CHORUS__TRACE__COLL_KIND__COLL_REDUCE_SCATTER;
}

void tr_call_str(tr_buf_t *b, const tr_call_t *c) {
  if (!c) {
    tr_bputs(b, "?");
    return;
  }
  int k = (int)c->kind;
  tr_bputs(b, tr_coll_name(k));
  if (k == CHORUS__TRACE__COLL_KIND__COLL_BARRIER)
    return;
  tr_bprintf(b, "(%s, %llu", tr_dtype_name((int)c->dtype), (unsigned long long)c->count);
  if (reducing(k))
    tr_bprintf(b, ", %s", tr_op_name((int)c->op));
  if (rooted(k))
    tr_bprintf(b, ", root %d", (int)c->root);
  else if (k == CHORUS__TRACE__COLL_KIND__COLL_SEND || k == CHORUS__TRACE__COLL_KIND__COLL_RECV)
    tr_bprintf(b, ", peer %d", (int)c->root);
  tr_bputs(b, ")");
}

void tr_step_str(tr_buf_t *b, const tr_step_t *s, int size) {
  int kind = (int)s->kind;
  tr_bprintf(b, "%s chunk %u", tr_step_kind_name(kind), (unsigned)s->chunk);
  bool valid = s->peer >= 0 && s->peer < size;
  if (kind == CHORUS__TRACE__STEP_KIND__STEP_SEND)
    tr_bprintf(b, valid ? " to rank %d" : " to rank %d?", (int)s->peer);
  else if (kind == CHORUS__TRACE__STEP_KIND__STEP_RECV)
    tr_bprintf(b, valid ? " from rank %d" : " from rank %d?", (int)s->peer);
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

void tr_edge_step_str(tr_buf_t *b, const tr_edge_t *e, int size) {
  const tr_comm_t *v = e->via;
  if (!v || !v->world_of) {
    tr_step_str(b, e->step, size);
    return;
  }
  int *ranks = malloc((size_t)v->size * sizeof(*ranks));
  for (int m = 0; ranks && m < v->size; m++)
    ranks[m] = (int)v->world_of[m];
  tr_bputs(b, "in the split of ranks ");
  if (ranks) {
    qsort(ranks, (size_t)v->size, sizeof(*ranks), cmp_int);
    tr_ranks_str(b, ranks, (size_t)v->size, 16);
    free(ranks);
  }
  const tr_call_t *call = e->dump ? tr_call_at(e->dump, e->step->seq) : NULL;
  if (call) {
    tr_bprintf(b, " (its #%llu ", (unsigned long long)e->step->seq);
    tr_call_str(b, call);
    tr_bputs(b, ")");
  }
  int kind = (int)e->step->kind, p = e->step->peer;
  tr_bprintf(b, ": %s chunk %u", tr_step_kind_name(kind), (unsigned)e->step->chunk);
  if (p >= 0 && p < v->size &&
      (kind == CHORUS__TRACE__STEP_KIND__STEP_SEND || kind == CHORUS__TRACE__STEP_KIND__STEP_RECV))
    tr_bprintf(b, " %s rank %d", kind == CHORUS__TRACE__STEP_KIND__STEP_SEND ? "to" : "from",
               (int)v->world_of[p]);
}

void tr_step_state_str(tr_buf_t *b, const tr_step_t *s) {
  tr_bputs(b, tr_state_name((int)s->state));
  if (s->state == CHORUS__TRACE__STEP_STATE__STATE_FAILED && s->error)
    tr_bprintf(b, " (%s)", strerror((int)s->error));
}

void tr_dur_str(tr_buf_t *b, uint64_t ns) {
  double t = (double)ns;
  if (t >= 1e9)
    tr_bprintf(b, "%.1f s", t / 1e9);
  else if (t >= 1e6)
    tr_bprintf(b, "%.0f ms", t / 1e6);
  else
    tr_bprintf(b, "%.0f us", t / 1e3);
}

void tr_ranks_str(tr_buf_t *b, const int *r, size_t n, size_t max) {
  size_t shown = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j + 1 < n && r[j + 1] == r[j] + 1)
      j++;
    if (shown >= max) {
      tr_bputs(b, ",...");
      return;
    }
    if (i)
      tr_bputs(b, ",");
    if (j >= i + 3) {
      tr_bprintf(b, "%d-%d", r[i], r[j]);
      i = j + 1;
    } else {
      tr_bprintf(b, "%d", r[i]);
      i++;
    }
    shown++;
  }
}
