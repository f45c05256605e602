/*
 * Allreduce with every rank a thread of this process over prov_inproc: the
 * same plans and executor as between processes, at 1..9 and 16 ranks.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "chorus.h"
#include "comm.h"

typedef struct job_arg {
  eng_local_job_t *job;
  int rank, size;
  size_t chunk_wrong;
  int failed;
} job_arg_t;

static void *rank_main(void *p) {
  job_arg_t *a = p;
  chorus_comm_t *c;
  static const size_t counts[] = {0, 1, 97, 4099};

  if (eng_comm_init_local(a->job, a->rank, &c)) {
    fprintf(stderr, "rank %d: init: %s\n", a->rank, chorus_last_error());
    a->failed = 1;
    return NULL;
  }
  for (int dt = 0; dt < CHORUS_DTYPE_COUNT && !a->failed; dt++)
    for (int op = 0; op < CHORUS_OP_COUNT && !a->failed; op++)
      for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]) && !a->failed; k++)
        for (int inplace = 0; inplace < 2 && !a->failed; inplace++) {
          size_t n = counts[k], es = chorus_dtype_size((chorus_dtype)dt);
          char *in = malloc(n * es + 1), *out = malloc(n * es + 1);
          chk_fill(in, n, (chorus_dtype)dt, (chorus_op)op, a->rank);
          chorus_result rc =
              chorus_allreduce(c, in, inplace ? in : out, n, (chorus_dtype)dt, (chorus_op)op);
          if (rc) {
            fprintf(stderr, "rank %d: %s: %s\n", a->rank, chorus_strerror(rc),
                    chorus_comm_last_error(c));
            a->failed = 1;
          } else if (chk_verify(inplace ? in : out, n, (chorus_dtype)dt, (chorus_op)op, a->size,
                                a->rank, "inproc")) {
            a->failed = 1;
          }
          free(in);
          free(out);
        }
  if (chorus_comm_destroy(c))
    a->failed = 1;
  return NULL;
}

static void run_job(int n) {
  eng_local_job_t *job = eng_local_job_create(n);
  pthread_t th[16];
  job_arg_t args[16];

  cr_assert_not_null(job);
  for (int r = 0; r < n; r++) {
    args[r] = (job_arg_t){.job = job, .rank = r, .size = n};
    cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
  }
  int failed = 0;
  for (int r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    failed += args[r].failed;
  }
  eng_local_job_destroy(job);
  cr_assert_eq(failed, 0, "%d of %d ranks failed", failed, n);
}

TestSuite(allreduce_inproc, .timeout = 120);

ParameterizedTestParameters(allreduce_inproc, ranks) {
  static int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};
  return cr_make_param_array(int, ns, sizeof(ns) / sizeof(ns[0]));
}

ParameterizedTest(int *n, allreduce_inproc, ranks) {
  /* small chunks: many chunks per segment, so the pipeline really overlaps */
  setenv("CHORUS_CHUNK_BYTES", "1024", 1);
  setenv("CHORUS_SPIN_US", "5", 1);
  run_job(*n);
}
