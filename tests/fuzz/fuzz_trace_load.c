/*
 * fuzz_trace_load.c - chorus-trace on a dump directory: the loader of
 * `*.trace` files (tools/trace/load.c, chorus.trace.Dump of
 * schemas/trace.proto), the diagnosis of each communicator (diag.c) and
 * everything it prints or draws (text.c, chrome.c, html.c, dot.c).
 *
 * Input: up to 4 dump files separated by FUZZ_SEP, written as r0.trace ..
 * r3.trace (an empty piece is an empty file) into a directory of this
 * process's own, made once under /dev/shm (else $TMPDIR or /tmp) and
 * emptied after each input. tr_load() reads it; every communicator is
 * diagnosed, its wait-for graph and ranks printed and its Chrome trace,
 * HTML page and dot graph written, all to /dev/null, as `chorus-trace DIR
 * -v --html --chrome --dot` would. The loader must keep its promises
 * (ranks in range and in their place, one dump per rank); the diagnosis
 * must name a culprit in range; nothing may leak. FUZZ_VERBOSE=1 in the
 * environment prints what the loader skips and each diagnosis (to check
 * seeds).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "trace.h"

#define MAX_FILES 4

static char dir[256];
static FILE *devnull;
static bool verbose;

static void file_name(char *buf, size_t n, int i) {
  snprintf(buf, n, "%s/r%d.trace", dir, i);
}

static void cleanup(void) {
  char path[300];

  for (int i = 0; i < MAX_FILES; i++) {
    file_name(path, sizeof(path), i);
    unlink(path);
  }
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *tmp = getenv("TMPDIR");

  if (access("/dev/shm", W_OK) == 0)
    tmp = "/dev/shm";
  else if (!tmp || !*tmp)
    tmp = "/tmp";
  snprintf(dir, sizeof(dir), "%s/chorus-fuzz-trace-XXXXXX", tmp);
  if (!mkdtemp(dir)) {
    perror(dir);
    exit(1);
  }
  atexit(cleanup);
  verbose = getenv("FUZZ_VERBOSE") != NULL;
  devnull = fopen("/dev/null", "w");
  if (!devnull) {
    perror("/dev/null");
    exit(1);
  }
  return 0;
}

static void write_piece(int i, const uint8_t *p, size_t len) {
  char path[300];
  int fd;

  file_name(path, sizeof(path), i);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    perror(path);
    abort();
  }
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      perror(path);
      abort();
    }
    p += w;
    len -= (size_t)w;
  }
  close(fd);
}

static void check_set(const tr_set_t *set, int nfiles) {
  if (set->nfiles != (size_t)nfiles || set->nskipped > set->nfiles ||
      set->ncomms + set->nsplits > set->nfiles)
    abort();
  for (size_t i = 0; i < set->ncomms; i++) {
    const tr_comm_t *c = &set->comms[i];

    const tr_comm_t *prev = i ? &set->comms[i - 1] : NULL;
    /* by (id, sub_id): a split whose head left no dump stays among them */
    if (c->size < 1 || c->size > TR_MAX_RANKS || c->ndumps < 1 || c->ndumps > c->size ||
        (prev && (c->id < prev->id || (c->id == prev->id && c->sub_id <= prev->sub_id))))
      abort();
    for (size_t k = 0; k < c->nkids; k++)
      if (c->sub_id || c->kids[k] < set->splits || c->kids[k] >= set->splits + set->nsplits ||
          c->kids[k]->id != c->id || !c->kids[k]->sub_id)
        abort();
    for (int r = 0, n = 0; r < c->size; r++) {
      const tr_dump_t *d = c->ranks[r].d;

      if (!d)
        continue;
      if (d->rank != r || d->size != c->size || d->comm_id != c->id || d->sub_id != c->sub_id ||
          !c->ranks[r].file)
        abort();
      if (++n > c->ndumps)
        abort();
    }
  }
}

static void check_diag(const tr_diag_t *d, const tr_comm_t *c) {
  if (d->comm != c || !d->text || d->culprit < -1 || d->culprit >= c->size || d->fsm_rank < -1 ||
      d->fsm_rank >= c->size || (d->kind != TR_NONE) != (d->culprit >= 0 || d->kind == TR_CYCLE))
    abort();
  for (size_t i = 0; i < d->nedges; i++)
    if (d->edges[i].from < 0 || d->edges[i].from >= c->size || d->edges[i].to < 0 ||
        d->edges[i].to >= c->size || !d->edges[i].step)
      abort();
  for (size_t i = 0; i < d->ncycle; i++)
    if (d->cycle[i] < 0 || d->cycle[i] >= c->size)
      abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *pieces[MAX_FILES];
  size_t lens[MAX_FILES];
  tr_set_t set;
  int n, rc;

  n = fuzz_split(data, size, pieces, lens, MAX_FILES);
  for (int i = 0; i < n; i++)
    write_piece(i, pieces[i], lens[i]);
  rc = tr_load(dir, &set, verbose ? stderr : devnull);
  if (rc) {
    if (rc != -ENOMEM)
      abort(); /* the directory is there */
    goto out;
  }
  check_set(&set, n);
  for (size_t i = 0; i < set.ncomms; i++) {
    tr_diag_t d;

    if (tr_diagnose(&set.comms[i], &d) == 0) {
      check_diag(&d, &set.comms[i]);
      if (verbose)
        fprintf(stderr, "fuzz_trace_load: comm %u (%d ranks, %d dumps): %s\n",
                (unsigned)set.comms[i].id, set.comms[i].size, set.comms[i].ndumps, d.text);
      tr_print_graph(&d, devnull, true);
      tr_print_ranks(&d, devnull);
      int (*const draw[])(const tr_diag_t *, FILE *) = {tr_write_chrome, tr_write_html,
                                                        tr_write_dot};
      for (size_t k = 0; k < sizeof(draw) / sizeof(draw[0]); k++) {
        int w = draw[k](&d, devnull);
        if (w && w != -ENOMEM)
          abort(); /* /dev/null takes everything */
      }
    }
    tr_diag_free(&d);
  }
out:
  tr_set_free(&set);
  for (int i = 0; i < n; i++) {
    char path[300];

    file_name(path, sizeof(path), i);
    unlink(path);
  }
  return 0;
}
