/*
 * load.c - a dump directory into communicators of ranks.
 *
 * Files are read in name order (so reports are stable), each whole and
 * bounded in size, then unpacked by protobuf-c, which refuses truncated or
 * malformed input. A dump is then checked against what its communicator's
 * first dump says (size) and against the others (one dump per rank); what
 * fails is reported and left out. Nothing here trusts a count or an index
 * of the file: the per-rank arrays are sized from the checked `size`.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trace.h"

/* A dump's name: *.trace, not hidden, and printable (it is printed). */
static bool wanted(const char *name) {
  size_t n = strlen(name);
  if (n <= 6 || strcmp(name + n - 6, ".trace") || name[0] == '.')
    return false;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p < 0x20 || *p == 0x7f)
      return false;
  return true;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads a whole regular file of at most TR_MAX_FILE_BYTES. Returns 0 with
 * *buf (malloc'ed) and *len, or -errno (-EFBIG when too large). */
static int read_file(int dirfd, const char *name, uint8_t **buf, size_t *len) {
  struct stat st;
  int rc = 0;
  int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return -errno;
  if (fstat(fd, &st)) {
    rc = -errno;
    goto out_close;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = -EISDIR;
    goto out_close;
  }
  if (st.st_size > (off_t)TR_MAX_FILE_BYTES) {
    rc = -EFBIG;
    goto out_close;
  }
  size_t cap = (size_t)st.st_size + 1, n = 0;
  uint8_t *p = malloc(cap);
  if (!p) {
    rc = -ENOMEM;
    goto out_close;
  }
  /* the file may grow or shrink under us: read what is there, up to cap */
  for (;;) {
    ssize_t r = read(fd, p + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      rc = -errno;
      free(p);
      goto out_close;
    }
    if (r == 0)
      break;
    n += (size_t)r;
    if (n == cap) {
      rc = -EFBIG;
      free(p);
      goto out_close;
    }
  }
  *buf = p;
  *len = n;
out_close:
  close(fd);
  return rc;
}

static int cmp_dumps(const void *a, const void *b) {
  const tr_file_t *x = *(tr_file_t *const *)a, *y = *(tr_file_t *const *)b;
  if (x->dump->comm_id != y->dump->comm_id)
    return x->dump->comm_id < y->dump->comm_id ? -1 : 1;
  if (x->dump->sub_id != y->dump->sub_id)
    return x->dump->sub_id < y->dump->sub_id ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* The size most of a communicator's n dumps agree on (the smallest of
 * equals); -1 without memory. */
static int mode_size(tr_file_t *const *f, size_t n) {
  int *v = malloc(n * sizeof(*v));
  if (!v)
    return -1;
  for (size_t i = 0; i < n; i++)
    v[i] = f[i]->dump->size;
  qsort(v, n, sizeof(*v), cmp_int);
  int best = v[0];
  size_t best_n = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && v[j] == v[i])
      j++;
    if (j - i > best_n) {
      best = v[i];
      best_n = j - i;
    }
    i = j;
  }
  free(v);
  return best;
}

/* A split's members' ranks in its head, if every dump of it gives the same. */
static const uint32_t *split_world_of(const tr_comm_t *c) {
  const uint32_t *w = NULL;
  for (int r = 0; r < c->size; r++) {
    const tr_dump_t *d = c->ranks[r].d;
    if (!d)
      continue;
    if (d->n_world_of != (size_t)c->size ||
        (w && memcmp(w, d->world_of, (size_t)c->size * sizeof(*w))))
      return NULL;
    w = d->world_of;
  }
  return w;
}

/* Splits move from comms to splits, each a kid of the communicator of its
 * id that heads its family; one whose head left no dump stays in comms. */
static int adopt(tr_set_t *set) {
  size_t nsplit = 0, nhead = 0;
  for (size_t i = 0; i < set->ncomms; i++)
    if (set->comms[i].sub_id)
      nsplit++;
  if (!nsplit)
    return 0;
  tr_comm_t *heads = calloc(set->ncomms, sizeof(*heads));
  tr_comm_t *splits = calloc(nsplit, sizeof(*splits));
  if (!heads || !splits) {
    free(heads);
    free(splits);
    return -ENOMEM;
  }
  for (size_t i = 0; i < set->ncomms; i++) {
    tr_comm_t *c = &set->comms[i];
    bool has_head = false;
    for (size_t k = 0; c->sub_id && k < set->ncomms; k++)
      has_head |= !set->comms[k].sub_id && set->comms[k].id == c->id;
    if (c->sub_id && has_head) {
      c->world_of = split_world_of(c);
      splits[set->nsplits++] = *c;
    } else {
      heads[nhead++] = *c;
    }
  }
  free(set->comms);
  set->comms = heads;
  set->ncomms = nhead;
  set->splits = splits;
  for (size_t i = 0; i < set->ncomms; i++) {
    tr_comm_t *h = &set->comms[i];
    for (size_t k = 0; !h->sub_id && k < set->nsplits; k++) {
      if (set->splits[k].id != h->id)
        continue;
      tr_comm_t **nk = realloc(h->kids, (h->nkids + 1) * sizeof(*nk));
      if (!nk)
        return -ENOMEM;
      h->kids = nk;
      h->kids[h->nkids++] = &set->splits[k];
    }
  }
  return 0;
}

/* Groups the read dumps by communicator (and split). */
static int group(tr_set_t *set, FILE *log) {
  size_t n = 0;
  tr_file_t **by = calloc(set->nfiles ? set->nfiles : 1, sizeof(*by));
  if (!by)
    return -ENOMEM;
  for (size_t i = 0; i < set->nfiles; i++)
    if (set->files[i].dump)
      by[n++] = &set->files[i];
  qsort(by, n, sizeof(*by), cmp_dumps);
  set->comms = calloc(n ? n : 1, sizeof(*set->comms));
  if (!set->comms) {
    free(by);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && by[j]->dump->comm_id == by[i]->dump->comm_id &&
           by[j]->dump->sub_id == by[i]->dump->sub_id)
      j++;
    tr_comm_t *c = &set->comms[set->ncomms];
    c->id = by[i]->dump->comm_id;
    c->sub_id = by[i]->dump->sub_id;
    c->size = mode_size(by + i, j - i);
    if (c->size < 0) {
      free(by);
      return -ENOMEM;
    }
    c->ranks = calloc((size_t)c->size, sizeof(*c->ranks));
    if (!c->ranks) {
      free(by);
      return -ENOMEM;
    }
    set->ncomms++;
    for (size_t k = i; k < j; k++) {
      tr_file_t *f = by[k];
      int r = f->dump->rank;
      if (f->dump->size != c->size) {
        fprintf(log, "chorus-trace: %s: comm %u rank %d: size %d, but most dumps say %d; skipped\n",
                f->name, (unsigned)c->id, r, (int)f->dump->size, c->size);
        set->nskipped++;
        continue;
      }
      if (c->ranks[r].d) {
        fprintf(log, "chorus-trace: %s: comm %u rank %d: already read from %s; skipped\n", f->name,
                (unsigned)c->id, r, c->ranks[r].file);
        set->nskipped++;
        continue;
      }
      c->ranks[r] = (tr_rank_t){.d = f->dump, .file = f->name};
      c->ndumps++;
    }
    i = j;
  }
  free(by);
  return adopt(set);
}

int tr_load(const char *dir, tr_set_t *set, FILE *log) {
  char **names = NULL;
  size_t nnames = 0, cap = 0, total = 0;
  int rc = 0;
  *set = (tr_set_t){0};
  DIR *dp = opendir(dir);
  if (!dp)
    return -errno;
  for (struct dirent *e; (e = readdir(dp));) {
    if (!wanted(e->d_name))
      continue;
    if (nnames == TR_MAX_FILES) {
      fprintf(log, "chorus-trace: %s: more than %d dump files; the rest are ignored\n", dir,
              TR_MAX_FILES);
      break;
    }
    if (nnames == cap) {
      size_t ncap = cap ? cap * 2 : 64;
      char **p = realloc(names, ncap * sizeof(*p));
      if (!p) {
        rc = -ENOMEM;
        goto out_names;
      }
      names = p;
      cap = ncap;
    }
    if (!(names[nnames] = strdup(e->d_name))) {
      rc = -ENOMEM;
      goto out_names;
    }
    nnames++;
  }
  if (nnames)
    qsort(names, nnames, sizeof(*names), cmp_names);
  set->files = calloc(nnames ? nnames : 1, sizeof(*set->files));
  if (!set->files) {
    rc = -ENOMEM;
    goto out_names;
  }
  for (size_t i = 0; i < nnames; i++) {
    tr_file_t *f = &set->files[set->nfiles++];
    uint8_t *buf = NULL;
    size_t len = 0;
    f->name = names[i];
    names[i] = NULL;
    int err = read_file(dirfd(dp), f->name, &buf, &len);
    if (err == -EISDIR)
      continue; /* not a dump */
    if (!err && total + len > TR_MAX_TOTAL_BYTES)
      err = -E2BIG;
    if (err) {
      fprintf(log, "chorus-trace: %s: %s; skipped\n", f->name,
              err == -EFBIG   ? "larger than a dump can be"
              : err == -E2BIG ? "the dumps read so far already fill the memory allowed"
                              : strerror(-err));
      free(buf);
      set->nskipped++;
      continue;
    }
    total += len;
    /* protobuf-c takes no bytes as a Dump of defaults: not one here */
    f->dump = len ? chorus__trace__dump__unpack(NULL, len, buf) : NULL;
    free(buf);
    const char *why = NULL;
    if (!f->dump)
      why = len ? "truncated or malformed (not a chorus.trace.Dump)" : "empty file";
    else if (f->dump->version > 1)
      fprintf(log,
              "chorus-trace: %s: dump version %u is newer than this tool (1); reading anyway\n",
              f->name, (unsigned)f->dump->version);
    if (!why && (f->dump->size <= 0 || f->dump->size > TR_MAX_RANKS))
      why = "its communicator size is out of range";
    else if (!why && (f->dump->rank < 0 || f->dump->rank >= f->dump->size))
      why = "its rank is out of range";
    if (why) {
      if (f->dump)
        fprintf(log, "chorus-trace: %s: %s (rank %d, size %d); skipped\n", f->name, why,
                (int)f->dump->rank, (int)f->dump->size);
      else
        fprintf(log, "chorus-trace: %s: %s; skipped\n", f->name, why);
      if (f->dump)
        chorus__trace__dump__free_unpacked(f->dump, NULL);
      f->dump = NULL;
      set->nskipped++;
    }
  }
  rc = group(set, log);
out_names:
  for (size_t i = 0; i < nnames; i++)
    free(names[i]);
  free(names);
  closedir(dp);
  return rc;
}

void tr_set_free(tr_set_t *set) {
  for (size_t i = 0; i < set->ncomms; i++) {
    free(set->comms[i].ranks);
    free(set->comms[i].kids);
  }
  free(set->comms);
  for (size_t i = 0; i < set->nsplits; i++)
    free(set->splits[i].ranks);
  free(set->splits);
  for (size_t i = 0; i < set->nfiles; i++) {
    if (set->files[i].dump)
      chorus__trace__dump__free_unpacked(set->files[i].dump, NULL);
    free(set->files[i].name);
  }
  free(set->files);
  *set = (tr_set_t){0};
}

/* ---- accessors ---- */

const tr_ckpt_t *tr_ckpt(const tr_dump_t *d) {
  return d ? d->checkpoint : NULL;
}

bool tr_in_coll(const tr_dump_t *d) {
  const tr_ckpt_t *c = tr_ckpt(d);
  if (!c)
    return false;
  if (c->in_collective)
    return true;
  /* a step still live says so too, whatever the flag */
  for (size_t i = 0; i < c->n_pending; i++)
    if (c->pending[i]->state >= CHORUS__TRACE__STEP_STATE__STATE_WAIT &&
        c->pending[i]->state <= CHORUS__TRACE__STEP_STATE__STATE_POSTED)
      return true;
  return false;
}

uint64_t tr_last_begun(const tr_dump_t *d) {
  const tr_ckpt_t *c = tr_ckpt(d);
  return c ? c->last_begun : 0;
}

uint64_t tr_last_finished(const tr_dump_t *d) {
  const tr_ckpt_t *c = tr_ckpt(d);
  return c ? c->last_finished : 0;
}

const tr_call_t *tr_call_at(const tr_dump_t *d, uint64_t seq) {
  const tr_ckpt_t *c = tr_ckpt(d);
  if (!c || !seq)
    return NULL;
  if (c->current && c->current->seq == seq)
    return c->current;
  for (size_t i = c->n_recent; i-- > 0;)
    if (c->recent[i]->seq == seq)
      return c->recent[i];
  return NULL;
}

const tr_call_t *tr_current(const tr_dump_t *d) {
  const tr_ckpt_t *c = tr_ckpt(d);
  if (!c)
    return NULL;
  if (c->current)
    return c->current;
  const tr_call_t *at = tr_call_at(d, c->last_begun);
  if (at)
    return at;
  return c->n_recent ? c->recent[c->n_recent - 1] : NULL;
}

uint64_t tr_age(uint64_t now, uint64_t then) {
  return then && now > then ? now - then : 0;
}

double tr_global_ns(const tr_dump_t *d, uint64_t t) {
  return (double)t + (double)d->clock_offset_ns;
}

int tr_step_peer(const tr_step_t *s, int size, int self) {
  if (s->kind != CHORUS__TRACE__STEP_KIND__STEP_SEND &&
      s->kind != CHORUS__TRACE__STEP_KIND__STEP_RECV)
    return -1;
  if (s->peer < 0 || s->peer >= size || s->peer == self)
    return -1;
  return s->peer;
}

const tr_call_t *tr_call_nth(const tr_dump_t *d, size_t i) {
  const tr_ckpt_t *c = tr_ckpt(d);
  if (!c)
    return NULL;
  if (i < c->n_recent)
    return c->recent[i];
  if (i > c->n_recent || !c->current)
    return NULL;
  for (size_t k = 0; k < c->n_recent; k++)
    if (c->recent[k]->seq == c->current->seq)
      return NULL;
  return c->current;
}

static const char *name_in(char **names, size_t n, uint32_t i) {
  return i < n && names[i][0] ? names[i] : NULL;
}

void tr_transition_str(tr_buf_t *b, const tr_dump_t *d, const Chorus__Trace__Transition *t) {
  const Chorus__Trace__Machine *m = NULL;
  for (size_t i = 0; i < d->n_machines && !m; i++)
    if (d->machines[i]->id == t->machine)
      m = d->machines[i];
  const char *from = m ? name_in(m->states, m->n_states, t->from) : NULL;
  const char *ev = m ? name_in(m->events, m->n_events, t->event) : NULL;
  const char *to = m ? name_in(m->states, m->n_states, t->to) : NULL;
  if (m && m->name[0])
    tr_bprintf(b, "%.40s ", m->name);
  if (from)
    tr_bprintf(b, "%.40s", from);
  else
    tr_bprintf(b, "%u", (unsigned)t->from);
  if (ev)
    tr_bprintf(b, " -%.40s-> ", ev);
  else
    tr_bprintf(b, " -%u-> ", (unsigned)t->event);
  if (t->to == 0xffff)
    tr_bputs(b, "(no transition)");
  else if (to)
    tr_bprintf(b, "%.40s", to);
  else
    tr_bprintf(b, "%u", (unsigned)t->to);
}

typedef struct mref {
  int rank, peer;
  uint64_t seq;
  uint32_t msg;
  const Chorus__Trace__Message *m;
} mref_t;

static int cmp_mref(const void *pa, const void *pb) {
  const mref_t *a = pa, *b = pb;
  if (a->rank != b->rank)
    return a->rank < b->rank ? -1 : 1;
  if (a->peer != b->peer)
    return a->peer < b->peer ? -1 : 1;
  if (a->seq != b->seq)
    return a->seq < b->seq ? -1 : 1;
  return (a->msg > b->msg) - (a->msg < b->msg);
}

int tr_match_messages(const tr_comm_t *c, tr_pair_fn fn, void *arg) {
  size_t n = 0, nr = 0;
  for (int r = 0; r < c->size; r++)
    if (c->ranks[r].d)
      n += c->ranks[r].d->n_messages;
  mref_t *recv = malloc((n ? n : 1) * sizeof(*recv));
  if (!recv)
    return -ENOMEM;
  for (int r = 0; r < c->size; r++) {
    const tr_dump_t *d = c->ranks[r].d;
    for (size_t i = 0; d && i < d->n_messages; i++) {
      const Chorus__Trace__Message *m = d->messages[i];
      if (!m->send && m->done_ns && m->peer >= 0 && m->peer < c->size && m->peer != r)
        recv[nr++] = (mref_t){r, m->peer, m->seq, m->msg, m};
    }
  }
  if (nr)
    qsort(recv, nr, sizeof(*recv), cmp_mref);
  bool go = true;
  for (int r = 0; r < c->size && go; r++) {
    const tr_dump_t *d = c->ranks[r].d;
    for (size_t i = 0; d && i < d->n_messages && go; i++) {
      const Chorus__Trace__Message *m = d->messages[i];
      if (!m->send || !m->posted_ns || !m->done_ns || m->peer < 0 || m->peer >= c->size ||
          m->peer == r)
        continue;
      mref_t key = {m->peer, r, m->seq, m->msg, NULL};
      const mref_t *hit = nr ? bsearch(&key, recv, nr, sizeof(*recv), cmp_mref) : NULL;
      if (hit)
        go = fn(arg, r, m, m->peer, hit->m);
    }
  }
  free(recv);
  return 0;
}
