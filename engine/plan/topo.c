/*
 * topo.c - host topology of a communicator: built from host identities,
 * CHORUS_TOPO emulation, or a parent communicator's topology (topo.h).
 *
 *   labels (any ints)      3 3 7 3 1        hosts as the sources name them
 *   renumbered (topo_t)    0 0 1 0 2        in order of each host's lowest rank
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"
#include "topo.h"

static topo_t *topo_alloc(int nranks) {
  topo_t *t = calloc(1, sizeof(*t) + (size_t)(nranks > 0 ? nranks : 1) * sizeof(int));

  if (!t)
    return NULL;
  t->nranks = nranks;
  t->host_of = (const int *)(t + 1);
  return t;
}

static int *topo_hosts_rw(topo_t *t) {
  return (int *)(t + 1);
}

void topo_free(topo_t *t) {
  free(t);
}

/* Sorting keeps this O(n log n) for tens of thousands of ranks. */
struct topo_key {
  const char *s; /* topo_from_hosts: the identity, or NULL */
  int label;
  int rank;
  int first; /* lowest rank of its host */
};

static int key_cmp_label(const void *a, const void *b) {
  const struct topo_key *x = a, *y = b;

  if (x->label != y->label)
    return x->label < y->label ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int key_cmp_host(const void *a, const void *b) {
  const struct topo_key *x = a, *y = b;
  int c;

  /* a NULL identity is a host of its own: it sorts by rank, alone */
  if (!x->s || !y->s) {
    if (x->s || y->s)
      return x->s ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
  }
  if ((c = strcmp(x->s, y->s)))
    return c;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int key_cmp_rank(const void *a, const void *b) {
  const struct topo_key *x = a, *y = b;

  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* keys sorted so that equal hosts are adjacent, lowest rank first; `same`
 * says whether two neighbours share a host. */
static topo_t *topo_from_sorted(struct topo_key *k, int n,
                                bool (*same)(const struct topo_key *, const struct topo_key *)) {
  topo_t *t = topo_alloc(n);

  if (!t)
    return NULL;
  /* label each rank with its host's lowest rank, then number hosts in rank order */
  for (int i = 0; i < n; i++)
    k[i].first = i > 0 && same(&k[i - 1], &k[i]) ? k[i - 1].first : k[i].rank;
  qsort(k, (size_t)n, sizeof(*k), key_cmp_rank);
  int *h = topo_hosts_rw(t);
  for (int r = 0; r < n; r++)
    h[r] = k[r].first == r ? t->nhosts++ : h[k[r].first];
  return t;
}

static bool same_label(const struct topo_key *a, const struct topo_key *b) {
  return a->label == b->label;
}

static bool same_host(const struct topo_key *a, const struct topo_key *b) {
  return a->s && b->s && strcmp(a->s, b->s) == 0;
}

topo_t *topo_from_labels(const int *labels, int nranks) {
  struct topo_key *k = malloc((size_t)(nranks > 0 ? nranks : 1) * sizeof(*k));
  topo_t *t;

  if (!k)
    return NULL;
  for (int r = 0; r < nranks; r++)
    k[r] = (struct topo_key){.label = labels[r], .rank = r};
  qsort(k, (size_t)nranks, sizeof(*k), key_cmp_label);
  t = topo_from_sorted(k, nranks, same_label);
  free(k);
  return t;
}

topo_t *topo_from_hosts(const char *const *hosts, int nranks) {
  struct topo_key *k = malloc((size_t)(nranks > 0 ? nranks : 1) * sizeof(*k));
  topo_t *t;

  if (!k)
    return NULL;
  for (int r = 0; r < nranks; r++)
    k[r] = (struct topo_key){.s = hosts[r], .rank = r};
  qsort(k, (size_t)nranks, sizeof(*k), key_cmp_host);
  t = topo_from_sorted(k, nranks, same_host);
  free(k);
  return t;
}

static int parse_int(const char *s, char **end, long max) {
  long v;

  if (*s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtol(s, end, 10);
  if (errno || v < 0 || v > max)
    return -1;
  return (int)v;
}

int topo_parse(const char *spec, int nranks, int *labels, char *err, size_t errlen) {
  char *end;

  if (!spec || !*spec) {
    for (int r = 0; r < nranks; r++)
      labels[r] = 0;
    return 0;
  }
  if (strncmp(spec, "hosts=", 6) == 0) {
    int h = parse_int(spec + 6, &end, 32767), per = -1;
    if (h > 0 && (*end == 'x' || *end == 'X'))
      per = parse_int(end + 1, &end, 32767);
    if (h <= 0 || per <= 0 || *end) {
      eng_errf(err, errlen,
               "CHORUS_TOPO=\"%s\": expected hosts=HxR (H hosts of R ranks, both >= 1), "
               "e.g. hosts=2x4",
               spec);
      return -1;
    }
    if ((long)h * per != nranks) {
      eng_errf(err, errlen,
               "CHORUS_TOPO=\"%s\" describes %ld ranks (%d hosts of %d) but the communicator has "
               "%d",
               spec, (long)h * per, h, per, nranks);
      return -1;
    }
    for (int r = 0; r < nranks; r++)
      labels[r] = r / per;
    return 0;
  }
  if (strncmp(spec, "map=", 4) == 0) {
    const char *p = spec + 4;
    int n = 0;
    while (*p) {
      int v = parse_int(p, &end, INT_MAX);
      if (v < 0 || (*end && *end != ',') || (*end == ',' && !end[1])) {
        eng_errf(err, errlen,
                 "CHORUS_TOPO=\"%s\": expected map= followed by one host number (>= 0) per "
                 "rank, separated by commas, e.g. map=0,0,1,1",
                 spec);
        return -1;
      }
      if (n < nranks)
        labels[n] = v;
      n++;
      p = *end ? end + 1 : end;
    }
    if (n != nranks) {
      eng_errf(err, errlen, "CHORUS_TOPO=\"%s\" maps %d ranks but the communicator has %d", spec, n,
               nranks);
      return -1;
    }
    return 0;
  }
  eng_errf(err, errlen,
           "CHORUS_TOPO=\"%s\": unknown form; use hosts=HxR (e.g. hosts=2x4) or map=h0,h1,... "
           "(one host number per rank)",
           spec);
  return -1;
}

topo_t *topo_refine(const topo_t *a, const topo_t *b, int nranks) {
  int *labels = malloc((size_t)(nranks > 0 ? nranks : 1) * sizeof(*labels));
  topo_t *t;

  if (!labels)
    return NULL;
  /* (a, b) pairs as one label; host numbers are < nranks */
  for (int r = 0; r < nranks; r++)
    labels[r] = (a ? a->host_of[r] : 0) * nranks + (b ? b->host_of[r] : 0);
  t = topo_from_labels(labels, nranks);
  free(labels);
  return t;
}

topo_t *topo_sub(const topo_t *t, const int *members, int n) {
  int *labels = malloc((size_t)(n > 0 ? n : 1) * sizeof(*labels));
  topo_t *s;

  if (!labels)
    return NULL;
  for (int i = 0; i < n; i++)
    labels[i] = t ? t->host_of[members[i]] : 0;
  s = topo_from_labels(labels, n);
  free(labels);
  return s;
}

topo_t *topo_dup(const topo_t *t, int nranks) {
  topo_t *d = topo_alloc(t ? t->nranks : nranks);

  if (!d)
    return NULL;
  if (t) {
    d->nhosts = t->nhosts;
    memcpy(topo_hosts_rw(d), t->host_of, (size_t)t->nranks * sizeof(int));
  } else {
    d->nhosts = 1;
  }
  return d;
}

int topo_host_size(const topo_t *t, int h) {
  int n = 0;

  if (!t)
    return 0;
  for (int r = 0; r < t->nranks; r++)
    n += t->host_of[r] == h;
  return n;
}

bool topo_one_rank_per_host(const topo_t *t) {
  return t && t->nhosts == t->nranks;
}

void topo_describe(const topo_t *t, char *out, size_t len) {
  size_t used;
  int n;

  if (!len)
    return;
  if (!t) {
    snprintf(out, len, "1 host");
    return;
  }
  n = snprintf(out, len, "%d host%s:", t->nhosts, t->nhosts == 1 ? "" : "s");
  used = n < 0 ? 0 : (size_t)n;
  for (int r = 0; r < t->nranks && used < len; r++) {
    n = snprintf(out + used, len - used, " %d", t->host_of[r]);
    if (n < 0)
      break;
    used += (size_t)n;
  }
}
