/*
 * dump.c - a rank's trace dump (schemas/trace.proto): its checkpoint, its
 * pending steps, its verdict and the recent transition journal, one file
 * per rank and communicator, written as *.tmp and renamed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "eng.h"
#include "fsm.h"
#include "trace.pb-c.h"
#include "watch.h"

#define DUMP_MAX_PENDING 8192
#define DUMP_MAX_JOURNAL 16384

static void call_to(Chorus__Trace__Call *o, const ckpt_call_t *k) {
  chorus__trace__call__init(o);
  o->seq = k->seq;
  o->kind = (Chorus__Trace__CollKind)(k->kind + 1);
  o->dtype = (Chorus__Trace__Dtype)(k->dtype + 1);
  o->count = k->count;
  o->root = k->root;
  o->op = k->kind == COLL_ALLREDUCE || k->kind == COLL_REDUCE || k->kind == COLL_REDUCE_SCATTER
              ? (Chorus__Trace__Op)(k->op + 1)
              : CHORUS__TRACE__OP__OP_UNKNOWN;
  o->algo = (char *)k->algo;
  o->fingerprint = k->fp;
  o->begin_ns = k->begin_ns;
  o->end_ns = k->end_ns;
  o->status = k->status;
}

/* Pending steps, read under prog_lock (the executor's owner), waited for
 * at most a second: a stuck executor still gets its rank dumped. */
static size_t read_pending(chorus_comm_t *c, exec_pending_t *out, size_t max,
                           prov_fault_event_t *fev, int *nfev) {
  struct timespec ts;
  size_t n = 0;

  *nfev = 0;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 1;
  if (pthread_mutex_timedlock(&c->prog_lock, &ts) == 0) {
    n = exec_pending(&c->ex, out, max);
    int k = c->prov && fev ? prov_fault_events(c->prov, fev, PROV_FAULT_JOURNAL) : -1;
    *nfev = k > 0 ? k : 0;
    pthread_mutex_unlock(&c->prog_lock);
  }
  return n;
}

int dump_write(chorus_comm_t *c, const char *dir, int reason, int culprit, int status,
               const char *text, const uint32_t *lost, size_t nlost, char *path, size_t pathlen) {
  char host[256], fname[1024], tmp[1100];
  int rc = 0;

  if (!dir || !*dir)
    return -EINVAL;
  if (mkdir(dir, 0777) && errno != EEXIST)
    return -errno;

  /* calls */
  ckpt_call_t calls[CKPT_RECENT], cur;
  size_t ncalls = ckpt_recent(&c->ckpt, calls, CKPT_RECENT);
  bool in_coll = ckpt_current(&c->ckpt, &cur);
  Chorus__Trace__Call rc_calls[CKPT_RECENT], *p_calls[CKPT_RECENT], current;
  for (size_t i = 0; i < ncalls; i++) {
    call_to(&rc_calls[i], &calls[i]);
    p_calls[i] = &rc_calls[i];
  }
  call_to(&current, &cur);

  /* pending steps */
  exec_pending_t *pend = calloc(DUMP_MAX_PENDING, sizeof(*pend));
  prov_fault_event_t *fev = calloc(PROV_FAULT_JOURNAL, sizeof(*fev));
  int nfev = 0;
  size_t npend = pend ? read_pending(c, pend, DUMP_MAX_PENDING, fev, &nfev) : 0;
  Chorus__Trace__Step *steps = calloc(npend ? npend : 1, sizeof(*steps));
  Chorus__Trace__Step **p_steps = calloc(npend ? npend : 1, sizeof(*p_steps));
  if (!steps || !p_steps)
    npend = 0;
  for (size_t i = 0; i < npend; i++) {
    Chorus__Trace__Step *s = &steps[i];
    chorus__trace__step__init(s);
    s->seq = pend[i].call_seq;
    s->index = pend[i].index;
    s->kind = (Chorus__Trace__StepKind)(pend[i].kind + 1);
    s->state = (Chorus__Trace__StepState)(pend[i].state + 1);
    s->peer = pend[i].kind == STEP_SEND || pend[i].kind == STEP_RECV ? pend[i].peer : -1;
    s->msg = pend[i].msg;
    s->bytes = pend[i].bytes;
    s->since_ns = pend[i].since_ns;
    s->ndeps_left = pend[i].deps_left;
    s->error = (uint32_t)pend[i].err;
    p_steps[i] = s;
  }

  Chorus__Trace__Checkpoint ck = CHORUS__TRACE__CHECKPOINT__INIT;
  /* destroying first: once set no call begins, so last_begun is then the last (as in beats) */
  ck.destroying = atomic_load(&c->ckpt.destroying);
  pthread_mutex_lock(&c->ckpt.lock);
  ck.last_begun = c->ckpt.last_begun;
  ck.last_finished = c->ckpt.last_finished;
  pthread_mutex_unlock(&c->ckpt.lock);
  ck.in_collective = in_coll;
  ck.current = cur.seq ? &current : NULL;
  ck.n_recent = ncalls;
  ck.recent = p_calls;
  ck.n_pending = npend;
  ck.pending = p_steps;
  ck.progress_ns = atomic_load(&c->ckpt.progress_ns);

  Chorus__Trace__Verdict v = CHORUS__TRACE__VERDICT__INIT;
  v.reason = (Chorus__Trace__Verdict__Reason)reason;
  v.culprit = culprit;
  v.status = status;
  v.text = (char *)(text ? text : "");
  v.t_ns = fsm_now_ns();

  /* peers: lost as the verdict says, else alive */
  Chorus__Trace__PeerView *pv = calloc((size_t)c->size, sizeof(*pv));
  Chorus__Trace__PeerView **p_pv = calloc((size_t)c->size, sizeof(*p_pv));
  size_t npv = 0;
  for (int r = 0; pv && p_pv && r < c->size; r++) {
    if (r == c->rank)
      continue;
    Chorus__Trace__PeerView *p = &pv[npv];
    chorus__trace__peer_view__init(p);
    p->rank = r;
    p->state = CHORUS__TRACE__PEER_VIEW__STATE__ALIVE;
    for (size_t k = 0; k < nlost; k++)
      if (lost[k] == (uint32_t)r)
        p->state = CHORUS__TRACE__PEER_VIEW__STATE__LOST;
    p_pv[npv++] = p;
  }

  /* machines and the journal */
  Chorus__Trace__Machine mach[16], *p_mach[16];
  size_t nmach = 0;
  for (uint16_t id = 1; id < 64 && nmach < 16; id++) {
    const fsm_machine_t *m = fsm_machine_lookup(id);
    if (!m)
      continue;
    Chorus__Trace__Machine *o = &mach[nmach];
    chorus__trace__machine__init(o);
    o->id = id;
    o->name = (char *)m->name;
    o->n_states = (size_t)m->nstates;
    o->states = (char **)m->state_names;
    o->n_events = (size_t)m->nevents;
    o->events = (char **)m->event_names;
    p_mach[nmach++] = o;
  }
  fsm_record_t *rec = malloc(DUMP_MAX_JOURNAL * sizeof(*rec));
  uint64_t total = fsm_journal_total();
  size_t nrec = rec ? fsm_journal_snapshot(rec, DUMP_MAX_JOURNAL) : 0;
  Chorus__Trace__Transition *tr = calloc(nrec ? nrec : 1, sizeof(*tr));
  Chorus__Trace__Transition **p_tr = calloc(nrec ? nrec : 1, sizeof(*p_tr));
  if (!tr || !p_tr)
    nrec = 0;
  for (size_t i = 0; i < nrec; i++) {
    chorus__trace__transition__init(&tr[i]);
    tr[i].t_ns = rec[i].t_ns;
    tr[i].actor = rec[i].actor;
    tr[i].group = rec[i].group;
    tr[i].machine = rec[i].machine;
    tr[i].from = rec[i].from;
    tr[i].event = rec[i].event;
    tr[i].to = rec[i].to;
    p_tr[i] = &tr[i];
  }

  /* injected faults: the transport's journal, and a stall of this rank */
  Chorus__Trace__Fault *flt = calloc((size_t)nfev + 1, sizeof(*flt));
  Chorus__Trace__Fault **p_flt = calloc((size_t)nfev + 1, sizeof(*p_flt));
  char(*fdet)[160] = calloc((size_t)nfev + 1, sizeof(*fdet));
  size_t nflt = 0;
  for (int i = 0; flt && p_flt && fdet && i < nfev; i++) {
    Chorus__Trace__Fault *f = &flt[nflt];
    chorus__trace__fault__init(f);
    f->t_ns = fev[i].t_ns;
    f->kind = (char *)fev[i].kind;
    f->peer = fev[i].peer;
    f->seq = (fev[i].tag >> 24) & 0xffff; /* exec_tag(): the call number's low 16 bits */
    snprintf(fdet[nflt], sizeof(fdet[nflt]), "%s (tag %#llx)", fev[i].detail,
             (unsigned long long)fev[i].tag);
    f->detail = fdet[nflt];
    p_flt[nflt++] = f;
  }
  if (flt && p_flt && fdet && atomic_load(&c->stall_until_ns)) {
    Chorus__Trace__Fault *f = &flt[nflt];
    chorus__trace__fault__init(f);
    f->t_ns = fsm_now_ns();
    f->kind = "stall";
    f->peer = -1;
    snprintf(fdet[nflt], sizeof(fdet[nflt]), "progress engine stalled: %s", c->stall_why);
    f->detail = fdet[nflt];
    p_flt[nflt++] = f;
  }

  const char *h = c->boot ? boot_host_of(c->boot, c->rank) : NULL;
  if (!h) {
    boot_host_identity(host, sizeof(host));
    h = host;
  }
  Chorus__Trace__Dump d = CHORUS__TRACE__DUMP__INIT;
  d.version = 1;
  d.comm_id = c->ex.comm_id;
  d.rank = c->rank;
  d.size = c->size;
  d.pid = (int32_t)getpid();
  d.host = (char *)h;
  d.t_dump_ns = fsm_now_ns();
  d.clock_offset_ns = c->clock_offset_ns;
  d.checkpoint = &ck;
  d.verdict = &v;
  d.n_peers = npv;
  d.peers = p_pv;
  d.n_machines = nmach;
  d.machines = p_mach;
  d.n_journal = nrec;
  d.journal = p_tr;
  d.journal_dropped = total > nrec ? total - nrec : 0;
  d.n_faults = nflt;
  d.faults = p_flt;
  if (c->world_of) { /* a split: chorus-trace joins its waits to its family head's */
    d.sub_id = c->sub_id;
    d.n_world_of = (size_t)c->size;
    d.world_of = c->world_of;
  }

  size_t len = chorus__trace__dump__get_packed_size(&d);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) {
    rc = -ENOMEM;
    goto out;
  }
  chorus__trace__dump__pack(&d, buf);
  if (c->world_of)
    snprintf(fname, sizeof(fname), "%s/rank%05d-comm%u-split%016llx-pid%d.trace", dir, c->rank,
             (unsigned)c->ex.comm_id, (unsigned long long)c->sub_id, (int)getpid());
  else
    snprintf(fname, sizeof(fname), "%s/rank%05d-comm%u-pid%d.trace", dir, c->rank,
             (unsigned)c->ex.comm_id, (int)getpid());
  snprintf(tmp, sizeof(tmp), "%s.tmp", fname);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    rc = -errno;
    goto out;
  }
  bool ok = fwrite(buf, 1, len, f) == len;
  ok = fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, fname)) {
    rc = -errno ? -errno : -EIO;
    unlink(tmp);
    goto out;
  }
  if (path)
    snprintf(path, pathlen, "%s", fname);
  eng_log(ENG_INFO, c->rank, "trace", "dump written: %s (%zu bytes)", fname, len);
out:
  free(flt);
  free(p_flt);
  free(fdet);
  free(fev);
  free(buf);
  free(tr);
  free(p_tr);
  free(rec);
  free(pv);
  free(p_pv);
  free(steps);
  free(p_steps);
  free(pend);
  return rc;
}
