/*
 * trace_fixture.c - builds chorus.trace.Dump messages with protobuf-c and
 * writes them as the engine's dump writer does (see trace_fixture.h).
 *
 * Every element is allocated on its own and remembered in a pool; repeated
 * fields are arrays of pointers grown with realloc. tf_free() releases the
 * pool, then the arrays.
 */
#include "trace_fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct tf_dump {
  Chorus__Trace__Dump dump;
  Chorus__Trace__Checkpoint ckpt;
  void **pool;
  size_t npool, cap;
  bool oom;
};

static void *keep(tf_dump_t *d, void *p) {
  if (!p) {
    d->oom = true;
    return NULL;
  }
  if (d->npool == d->cap) {
    size_t ncap = d->cap ? d->cap * 2 : 64;
    void **np = realloc(d->pool, ncap * sizeof(*np));
    if (!np) {
      d->oom = true;
      free(p);
      return NULL;
    }
    d->pool = np;
    d->cap = ncap;
  }
  d->pool[d->npool++] = p;
  return p;
}

static char *str(tf_dump_t *d, const char *s) {
  return keep(d, strdup(s ? s : ""));
}

/* Appends elem to the array *arr of *n pointers. */
static void push(tf_dump_t *d, void *arr, size_t *n, void *elem) {
  void ***a = arr;
  if (!elem)
    return;
  void **na = realloc(*a, (*n + 1) * sizeof(void *));
  if (!na) {
    d->oom = true;
    return;
  }
  na[(*n)++] = elem;
  *a = na;
}

tf_dump_t *tf_new(uint32_t comm, int rank, int size, uint64_t t_dump, int64_t clock_offset_ns) {
  tf_dump_t *d = calloc(1, sizeof(*d));
  if (!d)
    return NULL;
  chorus__trace__dump__init(&d->dump);
  chorus__trace__checkpoint__init(&d->ckpt);
  d->dump.version = 1;
  d->dump.comm_id = comm;
  d->dump.rank = rank;
  d->dump.size = size;
  d->dump.pid = 1000 + rank;
  d->dump.host = str(d, "node-a");
  d->dump.t_dump_ns = t_dump;
  d->dump.clock_offset_ns = clock_offset_ns;
  d->dump.checkpoint = &d->ckpt;
  return d;
}

Chorus__Trace__Dump *tf_msg(tf_dump_t *d) {
  return &d->dump;
}

Chorus__Trace__Call *tf_call(tf_dump_t *d, uint64_t seq, int kind, int dtype, uint64_t count,
                             int op, int root, uint64_t begin, uint64_t end) {
  Chorus__Trace__Call *c = keep(d, malloc(sizeof(*c)));
  if (!c)
    return NULL;
  chorus__trace__call__init(c);
  c->seq = seq;
  c->kind = (Chorus__Trace__CollKind)kind;
  c->dtype = (Chorus__Trace__Dtype)dtype;
  c->count = count;
  c->op = (Chorus__Trace__Op)op;
  c->root = root;
  c->algo = str(d, kind == TF_BARRIER ? "dissemination" : "ring");
  c->fingerprint = seq * 0x9e3779b97f4a7c15ull ^ count ^ ((uint64_t)kind << 56);
  c->begin_ns = begin;
  c->end_ns = end;
  push(d, &d->ckpt.recent, &d->ckpt.n_recent, c);
  return c;
}

void tf_split(tf_dump_t *d, uint64_t sub_id, const uint32_t *world_of, int n) {
  uint32_t *w = keep(d, malloc((size_t)(n > 0 ? n : 1) * sizeof(*w)));
  if (!w)
    return;
  memcpy(w, world_of, (size_t)n * sizeof(*w));
  d->dump.sub_id = sub_id;
  d->dump.n_world_of = (size_t)n;
  d->dump.world_of = w;
}

void tf_where(tf_dump_t *d, uint64_t last_begun, uint64_t last_finished, bool in_collective,
              uint64_t progress_ns) {
  d->ckpt.last_begun = last_begun;
  d->ckpt.last_finished = last_finished;
  d->ckpt.in_collective = in_collective;
  d->ckpt.progress_ns = progress_ns;
  d->ckpt.current = NULL;
  for (size_t i = 0; i < d->ckpt.n_recent; i++)
    if (d->ckpt.recent[i]->seq == last_begun)
      d->ckpt.current = d->ckpt.recent[i];
}

Chorus__Trace__Step *tf_step(tf_dump_t *d, uint64_t seq, uint32_t index, int kind, int state,
                             int peer, uint32_t chunk, uint64_t since) {
  Chorus__Trace__Step *s = keep(d, malloc(sizeof(*s)));
  if (!s)
    return NULL;
  chorus__trace__step__init(s);
  s->seq = seq;
  s->index = index;
  s->kind = (Chorus__Trace__StepKind)kind;
  s->state = (Chorus__Trace__StepState)state;
  s->peer = peer;
  s->chunk = chunk;
  s->msg = chunk;
  s->bytes = 262144;
  s->since_ns = since;
  push(d, &d->ckpt.pending, &d->ckpt.n_pending, s);
  return s;
}

void tf_message(tf_dump_t *d, uint64_t seq, uint32_t step, bool send, int peer, uint32_t msg,
                uint32_t chunk, uint64_t bytes, uint64_t posted, uint64_t done) {
  Chorus__Trace__Message *m = keep(d, malloc(sizeof(*m)));
  if (!m)
    return;
  chorus__trace__message__init(m);
  m->seq = seq;
  m->step = step;
  m->send = send;
  m->peer = peer;
  m->msg = msg;
  m->chunk = chunk;
  m->bytes = bytes;
  m->posted_ns = posted;
  m->done_ns = done;
  push(d, &d->dump.messages, &d->dump.n_messages, m);
}

void tf_peer(tf_dump_t *d, int rank, int state, uint64_t last_seq, uint64_t last_heard) {
  Chorus__Trace__PeerView *p = keep(d, malloc(sizeof(*p)));
  if (!p)
    return;
  chorus__trace__peer_view__init(p);
  p->rank = rank;
  p->state = (Chorus__Trace__PeerView__State)state;
  p->last_seq = last_seq;
  p->last_heard_ns = last_heard;
  push(d, &d->dump.peers, &d->dump.n_peers, p);
}

void tf_verdict(tf_dump_t *d, int reason, int culprit, const char *text, uint64_t t) {
  Chorus__Trace__Verdict *v = keep(d, malloc(sizeof(*v)));
  if (!v)
    return;
  chorus__trace__verdict__init(v);
  v->reason = (Chorus__Trace__Verdict__Reason)reason;
  v->culprit = culprit;
  v->text = str(d, text);
  v->t_ns = t;
  d->dump.verdict = v;
}

void tf_fault(tf_dump_t *d, uint64_t t, const char *kind, int peer, uint64_t seq,
              const char *detail) {
  Chorus__Trace__Fault *f = keep(d, malloc(sizeof(*f)));
  if (!f)
    return;
  chorus__trace__fault__init(f);
  f->t_ns = t;
  f->kind = str(d, kind);
  f->peer = peer;
  f->seq = seq;
  f->detail = str(d, detail);
  push(d, &d->dump.faults, &d->dump.n_faults, f);
}

static void step_machine(tf_dump_t *d) {
  static const char *const states[] = {"WAIT", "READY", "POSTED", "DONE", "FAILED"};
  static const char *const events[] = {"dep", "posted", "complete", "run", "error"};
  if (d->dump.n_machines)
    return;
  Chorus__Trace__Machine *m = keep(d, malloc(sizeof(*m)));
  if (!m)
    return;
  chorus__trace__machine__init(m);
  m->id = 1;
  m->name = str(d, "step");
  for (size_t i = 0; i < 5; i++)
    push(d, &m->states, &m->n_states, str(d, states[i]));
  for (size_t i = 0; i < 5; i++)
    push(d, &m->events, &m->n_events, str(d, events[i]));
  push(d, &d->dump.machines, &d->dump.n_machines, m);
}

void tf_journal(tf_dump_t *d, uint64_t t, uint32_t step, uint64_t seq, int from, int event,
                int to) {
  step_machine(d);
  Chorus__Trace__Transition *r = keep(d, malloc(sizeof(*r)));
  if (!r)
    return;
  chorus__trace__transition__init(r);
  r->t_ns = t;
  r->actor = step;
  r->group = seq;
  r->machine = 1;
  r->from = (uint32_t)from;
  r->event = (uint32_t)event;
  r->to = (uint32_t)to;
  push(d, &d->dump.journal, &d->dump.n_journal, r);
}

uint8_t *tf_pack(const tf_dump_t *d, size_t *len) {
  if (d->oom)
    return NULL;
  size_t n = chorus__trace__dump__get_packed_size(&d->dump);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf)
    return NULL;
  *len = chorus__trace__dump__pack(&d->dump, buf);
  return buf;
}

int tf_write_bytes(const char *dir, const char *file, const void *buf, size_t len) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, file);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return -errno;
  const uint8_t *p = buf;
  for (size_t off = 0; off < len;) {
    ssize_t w = write(fd, p + off, len - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0) {
      int e = -errno;
      close(fd);
      return e;
    }
    off += (size_t)w;
  }
  return close(fd) ? -errno : 0;
}

int tf_write(const tf_dump_t *d, const char *dir, const char *name) {
  size_t len = 0;
  uint8_t *buf = tf_pack(d, &len);
  char tmp[512], final[512], from[4096], to[4096];
  if (!buf)
    return -ENOMEM;
  snprintf(tmp, sizeof(tmp), "%s.trace.tmp", name);
  snprintf(final, sizeof(final), "%s.trace", name);
  int rc = tf_write_bytes(dir, tmp, buf, len);
  free(buf);
  if (rc)
    return rc;
  snprintf(from, sizeof(from), "%s/%s", dir, tmp);
  snprintf(to, sizeof(to), "%s/%s", dir, final);
  return rename(from, to) ? -errno : 0;
}

void tf_free(tf_dump_t *d) {
  if (!d)
    return;
  for (size_t i = 0; i < d->dump.n_machines; i++) {
    free(d->dump.machines[i]->states);
    free(d->dump.machines[i]->events);
  }
  free(d->dump.machines);
  free(d->dump.journal);
  free(d->dump.messages);
  free(d->dump.faults);
  free(d->dump.peers);
  free(d->ckpt.recent);
  free(d->ckpt.pending);
  for (size_t i = 0; i < d->npool; i++)
    free(d->pool[i]);
  free(d->pool);
  free(d);
}
