/*
 * fault.c - fault plans: the spec parser, its canonical writer, and the
 * pure decisions (which rule targets what, the seeded draws).
 *
 *   spec    := clause { ';' clause }                 (empty clauses skipped)
 *   clause  := 'seed' '=' UINT | KIND [ ':' param { ',' param } ]
 *   param   := KEY '=' VALUE                          (whitespace around tokens)
 *
 * The parser walks the text once, by index, with no allocation but the
 * plan: every error names the clause and the character (from 1) where it
 * is, and is a single line whatever the input holds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"

static const char *const kind_names[FAULT_KIND_COUNT] = {"drop",    "delay", "dup",  "reorder",
                                                         "corrupt", "kill",  "stall"};

/* The engine's collective kinds (coll_kind_str in engine/plan/algos/algos.c;
 * providers do not include the engine, tests/providers/test_fault.c checks
 * that every one of them is accepted here), and the stages of forming a
 * communicator. */
static const char *const coll_names[] = {"allreduce",      "bcast",    "reduce", "allgather",
                                         "reduce_scatter", "alltoall", "gather", "scatter",
                                         "barrier",        "send",     "recv",   FAULT_AT_CREATE};

const char *fault_kind_str(fault_kind_t kind) {
  return (unsigned)kind < FAULT_KIND_COUNT ? kind_names[kind] : "?";
}

bool fault_kind_is_call(fault_kind_t kind) {
  return kind == FAULT_KILL || kind == FAULT_STALL;
}

/* ---- decisions ---- */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t fault_hash(uint64_t seed, uint64_t rule, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);

  h = mix64(h ^ (rule + 0x632be59bd9b4e019ull));
  h = mix64(h ^ a);
  h = mix64(h ^ (b + 0x85ebca6bull));
  h = mix64(h ^ c);
  return mix64(h ^ (d + 0xc2b2ae35ull));
}

double fault_unit(uint64_t h) {
  return (double)(h >> 11) * 0x1.0p-53;
}

bool fault_rule_targets(const fault_rule_t *r, int rank, int peer, int seq_bits, uint64_t seq) {
  uint64_t mask;

  if (fault_kind_is_call(r->kind))
    return false;
  if ((r->rank >= 0 && r->rank != rank) || (r->peer >= 0 && r->peer != peer))
    return false;
  if (!r->has_at && !r->has_from && !r->has_to)
    return true;
  if (seq_bits <= 0)
    return false;
  mask = seq_bits >= 64 ? ~0ull : (1ull << seq_bits) - 1;
  seq &= mask;
  if (r->has_at)
    return seq == (r->at & mask);
  if (r->has_from && seq < (r->from & mask))
    return false;
  return !r->has_to || seq <= (r->to & mask);
}

fault_call_t fault_plan_on_call(const fault_plan_t *plan, int rank, const char *kind_name,
                                uint64_t seq, double *stall_s) {
  if (!plan)
    return FAULT_CALL_NONE;
  for (int i = 0; i < plan->nrules; i++) {
    const fault_rule_t *r = &plan->rules[i];

    if (!fault_kind_is_call(r->kind) || r->rank != rank || !r->has_at || r->at != seq)
      continue;
    if (r->coll[0] && (!kind_name || strcmp(kind_name, r->coll) != 0))
      continue;
    /* a stage of forming the communicator is no call number */
    if (!r->coll[0] && kind_name && strcmp(kind_name, FAULT_AT_CREATE) == 0)
      continue;
    if (r->p < 1.0 && !(fault_unit(fault_hash(plan->seed, (uint64_t)i, (uint64_t)(uint32_t)rank,
                                              seq, 0xca11, 0)) < r->p))
      continue;
    if (r->kind == FAULT_STALL && stall_s)
      *stall_s = r->s;
    return r->kind == FAULT_KILL ? FAULT_CALL_KILL : FAULT_CALL_STALL;
  }
  return FAULT_CALL_NONE;
}

int fault_plan_transport_rules(const fault_plan_t *plan) {
  int n = 0;

  for (int i = 0; plan && i < plan->nrules; i++)
    n += !fault_kind_is_call(plan->rules[i].kind);
  return n;
}

/* ---- numbers in the C locale, whatever the program set ---- */

struct c_numeric {
  locale_t c, old;
};

static void c_numeric_enter(struct c_numeric *cn) {
  cn->c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  cn->old = cn->c ? uselocale(cn->c) : (locale_t)0;
}

static void c_numeric_leave(struct c_numeric *cn) {
  if (!cn->c)
    return;
  uselocale(cn->old);
  freelocale(cn->c);
}

/* ---- the parser ---- */

enum key { KEY_P, KEY_MS, KEY_S, KEY_RANK, KEY_PEER, KEY_AT, KEY_FROM, KEY_TO, KEY_N, KEY_COUNT };

static const char *const key_names[KEY_COUNT] = {"p",  "ms",   "s",  "rank", "peer",
                                                 "at", "from", "to", "n"};

struct parser {
  const char *s; /* the spec */
  size_t len;
  char *err;
  size_t errlen;
  int clause;               /* number of the clause being read, from 1 */
  size_t cs, ce;            /* its bounds, whitespace trimmed */
  size_t seed_at;           /* where seed= was given (1-based), 0 if not yet */
  size_t keypos[KEY_COUNT]; /* where each key of the current rule is, 0 if absent */
};

static bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

static bool is_word(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}

/* Copies s[a, b) into out (cap bytes) with anything unprintable shown as
 * '?', cut to `most` characters plus "..." - quoting input in one line. */
static void quote(char *out, size_t cap, const char *s, size_t a, size_t b, size_t most) {
  size_t o = 0;

  if (!cap)
    return;
  for (size_t i = a; i < b && o + 1 < cap; i++) {
    unsigned char c = (unsigned char)s[i];

    if (i - a == most) {
      for (int k = 0; k < 3 && o + 1 < cap; k++)
        out[o++] = '.';
      break;
    }
    out[o++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
  }
  out[o] = '\0';
}

/* Fills err: "faults: clause N "TEXT", character P: REASON". Returns -EINVAL. */
static int perr(struct parser *ps, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int perr(struct parser *ps, size_t pos, const char *fmt, ...) {
  char clause[64];
  va_list ap;
  int n;

  if (!ps->err || !ps->errlen)
    return -EINVAL;
  quote(clause, sizeof(clause), ps->s, ps->cs, ps->ce, 48);
  n = snprintf(ps->err, ps->errlen, "faults: clause %d \"%s\", character %zu: ", ps->clause, clause,
               pos + 1);
  if (n < 0 || (size_t)n >= ps->errlen)
    return -EINVAL;
  va_start(ap, fmt);
  vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
  va_end(ap);
  return -EINVAL;
}

static size_t skip_ws(const struct parser *ps, size_t i, size_t end) {
  while (i < end && is_ws(ps->s[i]))
    i++;
  return i;
}

static size_t trim_end(const struct parser *ps, size_t a, size_t b) {
  while (b > a && is_ws(ps->s[b - 1]))
    b--;
  return b;
}

static bool word_is(const struct parser *ps, size_t a, size_t b, const char *w) {
  return strlen(w) == b - a && memcmp(ps->s + a, w, b - a) == 0;
}

/* The rest of a value after its number, quoted for an error. */
static int junk(struct parser *ps, size_t at, size_t ve, const char *key) {
  char q[40];

  quote(q, sizeof(q), ps->s, at, ve, 24);
  return perr(ps, at, "junk after the number of %s=: \"%s\"", key, q);
}

/* Unsigned decimal integer filling s[vs, ve), at most max. */
static int parse_uint(struct parser *ps, size_t vs, size_t ve, uint64_t max, const char *key,
                      uint64_t *out) {
  uint64_t v = 0;
  size_t i = vs;

  if (i >= ve || !is_digit(ps->s[i]))
    return perr(ps, i, "%s= takes a whole number", key);
  for (; i < ve && is_digit(ps->s[i]); i++) {
    unsigned d = (unsigned)(ps->s[i] - '0');

    if (v > (max - d) / 10)
      return perr(ps, vs, "%s= is too large (at most %llu)", key, (unsigned long long)max);
    v = v * 10 + d;
  }
  if (i != ve)
    return junk(ps, i, ve, key);
  *out = v;
  return 0;
}

/* Decimal number (123, 0.5, .5, 1e-3) filling s[vs, ve), in [lo, hi]. */
static int parse_dec(struct parser *ps, size_t vs, size_t ve, double lo, double hi, const char *key,
                     double *out) {
  struct c_numeric cn;
  char buf[64];
  size_t i = vs, digits = 0;
  double v;

  while (i < ve && is_digit(ps->s[i]))
    i++, digits++;
  if (i < ve && ps->s[i] == '.')
    for (i++; i < ve && is_digit(ps->s[i]); i++)
      digits++;
  if (!digits)
    return perr(ps, vs, "%s= takes a number", key);
  if (i < ve && (ps->s[i] == 'e' || ps->s[i] == 'E')) {
    size_t e = i + 1;

    if (e < ve && (ps->s[e] == '+' || ps->s[e] == '-'))
      e++;
    if (e < ve && is_digit(ps->s[e])) {
      while (e < ve && is_digit(ps->s[e]))
        e++;
      i = e;
    }
  }
  if (i != ve)
    return junk(ps, i, ve, key);
  if (i - vs >= sizeof(buf))
    return perr(ps, vs, "%s= has too many digits", key);
  memcpy(buf, ps->s + vs, i - vs);
  buf[i - vs] = '\0';
  c_numeric_enter(&cn);
  v = strtod(buf, NULL);
  c_numeric_leave(&cn);
  if (!(v >= lo && v <= hi)) {
    if (lo == 0.0 && hi == 1.0)
      return perr(ps, vs, "%s=%s is outside [0, 1]", key, buf);
    return perr(ps, vs, "%s=%s is outside [%g, %g]", key, buf, lo, hi);
  }
  *out = v;
  return 0;
}

/* #SEQ (from=, to=) or [KIND]#SEQ (at=). */
static int parse_seq(struct parser *ps, size_t vs, size_t ve, bool kind_ok, const char *key,
                     fault_rule_t *r, uint64_t *out) {
  size_t i = vs;

  while (i < ve && is_word(ps->s[i]))
    i++;
  if (i == ve || ps->s[i] != '#') {
    if (kind_ok)
      return perr(ps, i, "%s= takes #SEQ or KIND#SEQ (e.g. at=allreduce#100)", key);
    return perr(ps, i, "%s= takes #SEQ (e.g. %s=#100)", key, key);
  }
  if (i > vs) {
    size_t k, ncoll = sizeof(coll_names) / sizeof(coll_names[0]);
    char q[40];

    if (!kind_ok)
      return perr(ps, vs, "%s= takes #SEQ without a collective kind", key);
    for (k = 0; k < ncoll && !word_is(ps, vs, i, coll_names[k]); k++)
      ;
    if (k == ncoll) {
      quote(q, sizeof(q), ps->s, vs, i, 24);
      return perr(ps, vs,
                  "unknown collective \"%s\" in %s= (allreduce, bcast, reduce, allgather, "
                  "reduce_scatter, alltoall, gather, scatter, barrier, send, recv, create)",
                  q, key);
    }
    snprintf(r->coll, sizeof(r->coll), "%s", coll_names[k]);
  }
  return parse_uint(ps, i + 1, ve, UINT64_MAX, key, out);
}

static int parse_param(struct parser *ps, size_t a, size_t b, fault_rule_t *r) {
  size_t i = skip_ws(ps, a, b), ks, ke, vs, ve;
  uint64_t u;
  int k, rc = 0;
  char q[40];

  b = trim_end(ps, i, b);
  if (i == b)
    return perr(ps, i, "empty parameter (stray ',')");
  ks = i;
  while (i < b && is_word(ps->s[i]))
    i++;
  ke = i;
  if (ks == ke)
    return perr(ps, ks, "expected a key (p, ms, s, rank, peer, at, from, to, n)");
  for (k = 0; k < KEY_COUNT && !word_is(ps, ks, ke, key_names[k]); k++)
    ;
  if (k == KEY_COUNT) {
    quote(q, sizeof(q), ps->s, ks, ke, 24);
    return perr(ps, ks, "unknown key \"%s\" for %s (p, ms, s, rank, peer, at, from, to, n)", q,
                fault_kind_str(r->kind));
  }
  i = skip_ws(ps, ke, b);
  if (i == b || ps->s[i] != '=')
    return perr(ps, i, "expected '=' after %s", key_names[k]);
  vs = skip_ws(ps, i + 1, b);
  ve = b;
  if (vs == ve)
    return perr(ps, vs, "missing value for %s=", key_names[k]);
  if (ps->keypos[k])
    return perr(ps, ks, "duplicate key %s= (first at character %zu)", key_names[k], ps->keypos[k]);
  ps->keypos[k] = ks + 1;

  switch (k) {
  case KEY_MS:
    if (r->kind != FAULT_DELAY)
      return perr(ps, ks, "ms= applies to delay only");
    rc = parse_uint(ps, vs, ve, FAULT_DELAY_MS_MAX, "ms", &u);
    r->ms = (uint32_t)u;
    break;
  case KEY_S:
    if (r->kind != FAULT_STALL)
      return perr(ps, ks, "s= applies to stall only");
    rc = parse_dec(ps, vs, ve, 0.0, FAULT_STALL_S_MAX, "s", &r->s);
    if (!rc && !(r->s > 0.0))
      return perr(ps, vs, "s= must be more than 0 seconds");
    break;
  case KEY_P:
    rc = parse_dec(ps, vs, ve, 0.0, 1.0, "p", &r->p);
    break;
  case KEY_RANK:
  case KEY_PEER:
    if (k == KEY_PEER && fault_kind_is_call(r->kind))
      return perr(ps, ks, "peer= does not apply to %s (a fault of calls, not messages)",
                  fault_kind_str(r->kind));
    rc = parse_uint(ps, vs, ve, INT32_MAX, key_names[k], &u);
    if (k == KEY_RANK)
      r->rank = (int)u;
    else
      r->peer = (int)u;
    break;
  case KEY_AT:
    rc = parse_seq(ps, vs, ve, true, "at", r, &r->at);
    r->has_at = true;
    if (!rc && r->coll[0] && !fault_kind_is_call(r->kind))
      return perr(ps, vs,
                  "a collective kind in at= applies to kill and stall only: messages carry the "
                  "sequence number alone (write at=#%llu)",
                  (unsigned long long)r->at);
    break;
  case KEY_FROM:
  case KEY_TO:
    if (fault_kind_is_call(r->kind))
      return perr(ps, ks, "%s= does not apply to %s (it takes at=)", key_names[k],
                  fault_kind_str(r->kind));
    rc = parse_seq(ps, vs, ve, false, key_names[k], r, k == KEY_FROM ? &r->from : &r->to);
    if (k == KEY_FROM)
      r->has_from = true;
    else
      r->has_to = true;
    break;
  case KEY_N:
    if (fault_kind_is_call(r->kind))
      return perr(ps, ks, "n= does not apply to %s (it happens once, at at=)",
                  fault_kind_str(r->kind));
    rc = parse_uint(ps, vs, ve, UINT64_MAX, "n", &r->n);
    if (!rc && r->n == 0)
      return perr(ps, vs, "n= must be at least 1");
    break;
  }
  return rc;
}

/* What a rule needs once all its keys are read. */
static int check_rule(struct parser *ps, fault_rule_t *r) {
  const char *kn = fault_kind_str(r->kind);
  size_t *kp = ps->keypos;

  if (r->kind == FAULT_DELAY && !kp[KEY_MS])
    return perr(ps, ps->cs, "delay needs ms= (milliseconds)");
  if (r->kind == FAULT_STALL && !kp[KEY_S])
    return perr(ps, ps->cs, "stall needs s= (seconds)");
  if (fault_kind_is_call(r->kind)) {
    if (!kp[KEY_RANK])
      return perr(ps, ps->cs, "%s needs rank=", kn);
    if (!kp[KEY_AT])
      return perr(ps, ps->cs, "%s needs at= (e.g. at=allreduce#100)", kn);
  } else {
    if (kp[KEY_AT] && (kp[KEY_FROM] || kp[KEY_TO]))
      return perr(ps, (kp[KEY_FROM] ? kp[KEY_FROM] : kp[KEY_TO]) - 1,
                  "at= and from=/to= exclude each other");
    if (r->has_from && r->has_to && r->from > r->to)
      return perr(ps, kp[KEY_TO] - 1, "to=#%llu comes before from=#%llu", (unsigned long long)r->to,
                  (unsigned long long)r->from);
    if (!kp[KEY_P] && !kp[KEY_AT] && !kp[KEY_FROM] && !kp[KEY_TO] && !kp[KEY_N])
      return perr(ps, ps->cs, "%s needs p= (or a target: at=, from=, to=, n=)", kn);
  }
  return 0;
}

static int parse_clause(struct parser *ps, fault_plan_t *plan) {
  size_t i = ps->cs, ws, we, end = ps->ce;
  fault_rule_t *r;
  int k, rc;
  char q[40];

  ws = i;
  while (i < end && is_word(ps->s[i]))
    i++;
  we = i;
  if (ws == we)
    return perr(ps, ws,
                "expected a fault kind (drop, delay, dup, reorder, corrupt, kill, stall) "
                "or seed=");
  i = skip_ws(ps, we, end);
  if (word_is(ps, ws, we, "seed")) {
    uint64_t seed;

    if (i == end || ps->s[i] != '=')
      return perr(ps, i, "seed takes seed=N");
    if (ps->seed_at)
      return perr(ps, ws, "duplicate seed= (first at character %zu)", ps->seed_at);
    rc = parse_uint(ps, skip_ws(ps, i + 1, end), end, UINT64_MAX, "seed", &seed);
    if (rc)
      return rc;
    ps->seed_at = ws + 1;
    plan->seed = seed;
    return 0;
  }
  for (k = 0; k < FAULT_KIND_COUNT && !word_is(ps, ws, we, kind_names[k]); k++)
    ;
  if (k == FAULT_KIND_COUNT) {
    quote(q, sizeof(q), ps->s, ws, we, 24);
    return perr(ps, ws,
                "unknown fault kind \"%s\" (drop, delay, dup, reorder, corrupt, kill, stall; or "
                "seed=)",
                q);
  }
  if (plan->nrules >= FAULT_MAX_RULES)
    return perr(ps, ws, "too many rules (at most %d)", FAULT_MAX_RULES);
  r = &plan->rules[plan->nrules];
  memset(r, 0, sizeof(*r));
  r->kind = (fault_kind_t)k;
  r->rank = r->peer = -1;
  r->p = 1.0;
  memset(ps->keypos, 0, sizeof(ps->keypos));
  if (i < end) {
    if (ps->s[i] != ':')
      return perr(ps, i, "expected ':' after %s", kind_names[k]);
    for (size_t a = i + 1, b; a <= end; a = b + 1) {
      for (b = a; b < end && ps->s[b] != ','; b++)
        ;
      if (b == end && skip_ws(ps, a, b) == b && a == i + 1)
        break; /* "drop:" with nothing after the colon */
      rc = parse_param(ps, a, b, r);
      if (rc)
        return rc;
    }
  }
  rc = check_rule(ps, r);
  if (rc)
    return rc;
  plan->nrules++;
  return 0;
}

int fault_plan_parse(const char *spec, fault_plan_t **out, char *err, size_t errlen) {
  struct parser ps = {.s = spec ? spec : "", .err = err, .errlen = errlen};
  fault_plan_t *plan;
  int rc = 0, n;

  if (err && errlen)
    err[0] = '\0';
  if (!out)
    return -EINVAL;
  *out = NULL;
  ps.len = strnlen(ps.s, FAULT_SPEC_MAX + 1);
  if (ps.len > FAULT_SPEC_MAX) {
    if (err && errlen)
      snprintf(err, errlen, "faults: spec longer than %d bytes", FAULT_SPEC_MAX);
    return -EINVAL;
  }
  plan = calloc(1, sizeof(*plan));
  if (!plan) {
    if (err && errlen)
      snprintf(err, errlen, "faults: out of memory");
    return -ENOMEM;
  }
  for (size_t a = 0, b; a <= ps.len; a = b + 1) {
    for (b = a; b < ps.len && ps.s[b] != ';'; b++)
      ;
    ps.clause++;
    ps.cs = skip_ws(&ps, a, b);
    ps.ce = trim_end(&ps, ps.cs, b);
    if (ps.cs == ps.ce)
      continue;
    rc = parse_clause(&ps, plan);
    if (rc)
      goto out_free_plan;
  }
  /* The canonical text may write a number longer than it was given (.5 as
   * 0.5): a plan must still fit the limit written out, to parse back. */
  n = fault_plan_format(plan, NULL, 0);
  if (n > FAULT_SPEC_MAX) {
    if (err && errlen)
      snprintf(err, errlen,
               "faults: spec too long: written out canonically it takes %d bytes "
               "(at most %d)",
               n, FAULT_SPEC_MAX);
    rc = -EINVAL;
    goto out_free_plan;
  }
  *out = plan;
  return 0;

out_free_plan:
  free(plan);
  return rc;
}

void fault_plan_free(fault_plan_t *plan) {
  free(plan);
}

/* ---- canonical text ---- */

struct writer {
  char *buf;
  size_t cap, pos; /* pos counts what the whole text needs, even past cap */
};

static void wprintf(struct writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wprintf(struct writer *w, const char *fmt, ...) {
  va_list ap;
  int n;

  va_start(ap, fmt);
  if (w->pos < w->cap)
    n = vsnprintf(w->buf + w->pos, w->cap - w->pos, fmt, ap);
  else
    n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n > 0)
    w->pos += (size_t)n;
}

/* The shortest text that reads back as exactly v: plain decimals when
 * they stay short (30, 0.001), else the exponent form (1e-300). */
static void wdouble(struct writer *w, double v) {
  char b[48];

  for (int d = 0; d <= 20; d++) {
    int n = snprintf(b, sizeof(b), "%.*f", d, v);

    if (n > 0 && n <= 24 && strtod(b, NULL) == v) {
      wprintf(w, "%s", b);
      return;
    }
  }
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(b, sizeof(b), "%.*g", prec, v);
    if (strtod(b, NULL) == v)
      break;
  }
  wprintf(w, "%s", b);
}

int fault_plan_format(const fault_plan_t *plan, char *buf, size_t len) {
  struct writer w = {.buf = buf, .cap = buf ? len : 0};
  struct c_numeric cn;
  const char *sep = "";

  if (buf && len)
    buf[0] = '\0';
  if (!plan || plan->nrules < 0 || plan->nrules > FAULT_MAX_RULES)
    return -EINVAL;
  c_numeric_enter(&cn);
  if (plan->seed) {
    wprintf(&w, "seed=%llu", (unsigned long long)plan->seed);
    sep = ";";
  }
  for (int i = 0; i < plan->nrules; i++) {
    const fault_rule_t *r = &plan->rules[i];
    bool target = r->has_at || r->has_from || r->has_to || r->n;
    char c = ':';

    wprintf(&w, "%s%s", sep, fault_kind_str(r->kind));
    sep = ";";
    if (r->rank >= 0) {
      wprintf(&w, "%crank=%d", c, r->rank);
      c = ',';
    }
    if (r->peer >= 0) {
      wprintf(&w, "%cpeer=%d", c, r->peer);
      c = ',';
    }
    if (r->has_at) {
      wprintf(&w, "%cat=%s#%llu", c, r->coll, (unsigned long long)r->at);
      c = ',';
    }
    if (r->has_from) {
      wprintf(&w, "%cfrom=#%llu", c, (unsigned long long)r->from);
      c = ',';
    }
    if (r->has_to) {
      wprintf(&w, "%cto=#%llu", c, (unsigned long long)r->to);
      c = ',';
    }
    if (r->n) {
      wprintf(&w, "%cn=%llu", c, (unsigned long long)r->n);
      c = ',';
    }
    if (r->kind == FAULT_DELAY) {
      wprintf(&w, "%cms=%u", c, (unsigned)r->ms);
      c = ',';
    }
    if (r->kind == FAULT_STALL) {
      wprintf(&w, "%cs=", c);
      wdouble(&w, r->s);
      c = ',';
    }
    /* p=1 is the default where a target (or a call fault's at=) is given */
    if (r->p != 1.0 || !(target || fault_kind_is_call(r->kind))) {
      wprintf(&w, "%cp=", c);
      wdouble(&w, r->p);
    }
  }
  c_numeric_leave(&cn);
  if (w.pos > INT32_MAX)
    return -ENOSPC;
  if (buf && w.pos >= len)
    return -ENOSPC;
  return (int)w.pos;
}

bool fault_plan_equal(const fault_plan_t *a, const fault_plan_t *b) {
  if (!a || !b)
    return a == b;
  if (a->seed != b->seed || a->nrules != b->nrules)
    return false;
  for (int i = 0; i < a->nrules; i++) {
    const fault_rule_t *x = &a->rules[i], *y = &b->rules[i];

    if (x->kind != y->kind || x->rank != y->rank || x->peer != y->peer || x->has_at != y->has_at ||
        x->has_from != y->has_from || x->has_to != y->has_to || x->n != y->n || x->p != y->p ||
        x->ms != y->ms || x->s != y->s || strcmp(x->coll, y->coll) != 0)
      return false;
    if ((x->has_at && x->at != y->at) || (x->has_from && x->from != y->from) ||
        (x->has_to && x->to != y->to))
      return false;
  }
  return true;
}
