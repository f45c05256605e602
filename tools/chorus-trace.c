/*
 * chorus-trace - why a job hangs, from the dumps its ranks wrote.
 *
 *   chorus-trace DIR [--html out.html] [--chrome out.json] [--dot out.dot]
 *                    [--comm ID] [-v]
 *
 * Reads every *.trace file of DIR (one chorus.trace.Dump per rank and
 * communicator, schemas/trace.proto), and per communicator prints first the
 * diagnosis, one paragraph that names the collective and the culprit:
 *
 *   collective #42 allreduce(float32, 1048576, sum): ranks 0,1,3 wait; rank 3
 *   in 'RECV chunk 2 from rank 2' for 12.4 s, ...; rank 2 is at #41 barrier
 *   and never called #42: rank 2 diverged
 *
 * then the wait-for graph between ranks with its root(s) or cycle, and with
 * -v every rank's state, stuck steps, verdict and views of its peers. The
 * rules are in tools/trace/diag.c. Without --comm the communicators with a
 * culprit are shown (every one when none has). --html, --chrome and --dot
 * draw one communicator: --comm's, else the first with a culprit.
 *
 * Exit: 0 a culprit (or a wait cycle) was found, 1 dumps read but no
 * culprit, 2 usage error, no readable dump, or an output not written.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace/trace.h"

typedef struct opts {
  const char *dir;
  const char *html, *chrome, *dot;
  bool have_comm;
  uint32_t comm;
  bool verbose;
} opts_t;

static void usage(FILE *f) {
  fprintf(f, "usage: chorus-trace DIR [--html OUT] [--chrome OUT] [--dot OUT] [--comm ID] [-v]\n"
             "Reads the *.trace dumps of DIR (one per rank), names the rank that holds the\n"
             "job up and why (diverged, mismatched call, lost, stalled, or a wait cycle),\n"
             "then prints the wait-for graph between ranks.\n"
             "  --html OUT    a self-contained page: a lane per rank on one clock, message\n"
             "                arrows, stuck steps and the culprit highlighted\n"
             "  --chrome OUT  Chrome trace-event JSON (Perfetto, chrome://tracing)\n"
             "  --dot OUT     Graphviz of the wait-for graph and of one rank's stuck steps\n"
             "  --comm ID     only this communicator (default: those with a culprit)\n"
             "  -v            every rank's state, stuck steps, verdict and peer views\n"
             "Exit: 0 culprit or cycle found, 1 no culprit, 2 usage or no readable dump.\n");
}

static int parse_args(int argc, char **argv, opts_t *o) {
  static const struct option longopts[] = {{"html", required_argument, NULL, 'H'},
                                           {"chrome", required_argument, NULL, 'C'},
                                           {"dot", required_argument, NULL, 'D'},
                                           {"comm", required_argument, NULL, 'c'},
                                           {"verbose", no_argument, NULL, 'v'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  int c;
  *o = (opts_t){0};
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":vh", longopts, NULL)) != -1) {
    switch (c) {
    case 'H':
      o->html = optarg;
      break;
    case 'C':
      o->chrome = optarg;
      break;
    case 'D':
      o->dot = optarg;
      break;
    case 'c': {
      char *end;
      errno = 0;
      unsigned long v = strtoul(optarg, &end, 10);
      if (errno || end == optarg || *end || optarg[0] == '-' || v > UINT32_MAX) {
        fprintf(stderr, "chorus-trace: bad communicator id '%s'\n", optarg);
        return 2;
      }
      o->comm = (uint32_t)v;
      o->have_comm = true;
      break;
    }
    case 'v':
      o->verbose = true;
      break;
    case 'h':
      usage(stdout);
      return 0;
    case ':':
      fprintf(stderr, "chorus-trace: %s needs an argument\n", argv[optind - 1]);
      usage(stderr);
      return 2;
    default:
      fprintf(stderr, "chorus-trace: unknown option '%s'\n", argv[optind - 1]);
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "chorus-trace: %s\n",
            optind == argc ? "which dump directory?" : "one dump directory only");
    usage(stderr);
    return 2;
  }
  o->dir = argv[optind];
  return -1;
}

typedef int (*writer_fn)(const tr_diag_t *, FILE *);

static int write_out(const char *path, writer_fn fn, const tr_diag_t *d, const char *what) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "chorus-trace: %s: %s\n", path, strerror(errno));
    return -1;
  }
  int rc = fn(d, f);
  if (fclose(f) && !rc)
    rc = -EIO;
  if (rc) {
    fprintf(stderr, "chorus-trace: %s: writing the %s failed: %s\n", path, what, strerror(-rc));
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  opts_t o;
  tr_set_t set;
  tr_diag_t *diags = NULL;
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0)
    return rc;
  int err = tr_load(o.dir, &set, stderr);
  if (err) {
    fprintf(stderr, "chorus-trace: %s: %s\n", o.dir, strerror(-err));
    rc = 2;
    goto out;
  }
  if (!set.ncomms) {
    fprintf(stderr, "chorus-trace: %s: no readable dump (*.trace) in it\n", o.dir);
    rc = 2;
    goto out;
  }
  if (o.verbose)
    fprintf(stderr, "chorus-trace: %s: %zu files, %zu skipped, %zu communicators\n", o.dir,
            set.nfiles, set.nskipped, set.ncomms);
  diags = calloc(set.ncomms, sizeof(*diags));
  if (!diags) {
    fprintf(stderr, "chorus-trace: out of memory\n");
    rc = 2;
    goto out;
  }
  size_t primary = set.ncomms, nculprit = 0;
  bool found = false;
  for (size_t i = 0; i < set.ncomms; i++) {
    if (o.have_comm && set.comms[i].id != o.comm)
      continue;
    found = true;
    if (tr_diagnose(&set.comms[i], &diags[i])) {
      fprintf(stderr, "chorus-trace: out of memory\n");
      rc = 2;
      goto out;
    }
    if (diags[i].kind != TR_NONE) {
      nculprit++;
      if (primary == set.ncomms || diags[primary].kind == TR_NONE)
        primary = i;
    } else if (primary == set.ncomms) {
      primary = i;
    }
  }
  if (!found) {
    fprintf(stderr, "chorus-trace: %s: no dump of communicator %u; there are:", o.dir,
            (unsigned)o.comm);
    for (size_t i = 0; i < set.ncomms; i++)
      fprintf(stderr, " %u", (unsigned)set.comms[i].id);
    fprintf(stderr, "\n");
    rc = 2;
    goto out;
  }
  /* which to show: the one asked for; else those with a culprit; else all */
  size_t nshown = 0;
  bool *show = calloc(set.ncomms, sizeof(*show));
  if (!show) {
    rc = 2;
    goto out;
  }
  for (size_t i = 0; i < set.ncomms; i++) {
    show[i] = diags[i].comm && (nculprit == 0 || diags[i].kind != TR_NONE);
    nshown += show[i];
  }
  bool prefix = set.ncomms > 1;
  /* the diagnoses first, the primary one on the first line */
  for (size_t k = 0; k <= set.ncomms; k++) {
    size_t i = k == 0 ? primary : k - 1;
    if (k && i == primary)
      continue;
    if (!show[i])
      continue;
    if (prefix)
      printf(set.comms[i].sub_id ? "comm %u split %llx: " : "comm %u: ", (unsigned)set.comms[i].id,
             (unsigned long long)set.comms[i].sub_id);
    printf("%s\n", diags[i].text);
  }
  for (size_t k = 0; k <= set.ncomms; k++) {
    size_t i = k == 0 ? primary : k - 1;
    if ((k && i == primary) || !show[i])
      continue;
    printf("\n");
    tr_print_graph(&diags[i], stdout, o.verbose);
    if (o.verbose) {
      printf("\n");
      tr_print_ranks(&diags[i], stdout);
    }
  }
  if (nshown < set.ncomms) {
    printf("\nwithout a culprit:");
    for (size_t i = 0; i < set.ncomms; i++)
      if (diags[i].comm && !show[i])
        printf(" comm %u", (unsigned)set.comms[i].id);
    printf(" (--comm ID shows one)\n");
  }
  free(show);
  fflush(stdout);
  rc = nculprit ? 0 : 1;
  const tr_diag_t *pd = &diags[primary];
  if ((o.html && write_out(o.html, tr_write_html, pd, "page")) ||
      (o.chrome && write_out(o.chrome, tr_write_chrome, pd, "Chrome trace")) ||
      (o.dot && write_out(o.dot, tr_write_dot, pd, "dot graph")))
    rc = 2;
out:
  for (size_t i = 0; diags && i < set.ncomms; i++)
    tr_diag_free(&diags[i]);
  free(diags);
  tr_set_free(&set);
  return rc;
}
