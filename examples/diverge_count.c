/* diverge_count.c - one rank calls allreduce with another count.
 *
 * The training loop of diverge_skip.c, but at step 2 the culprit allreduces
 * one gradient element more than the others (a bucket built from a
 * different parameter list, an off-by-one in a padding rule). Every call
 * carries a fingerprint of its arguments in its messages, so the ranks fail
 * at the first message of that allreduce with CHORUS_ERR_MISMATCH, naming
 * both calls and ranks, long before any timeout.
 *
 *   CHORUS_TRACE_DIR=/tmp/dumps chorus-run -n 4 -- ./diverge_count [--culprit R] [--steps N]
 *   chorus-trace /tmp/dumps
 *
 * Exit status 0 when this rank's call failed with CHORUS_ERR_MISMATCH. */
#include "example_util.h"

#define NGRAD 4096
#define NPARAM 1024

int main(int argc, char **argv) {
  static float grad[NGRAD + 1], params[NPARAM];
  ex_job_t job;
  int st = ex_init(argc, argv, &job);
  if (st)
    return st;

  chorus_result rc = CHORUS_SUCCESS;
  char where[64] = "";
  for (int step = 0; step < job.steps && rc == CHORUS_SUCCESS; step++) {
    for (int i = 0; i < NGRAD; i++)
      grad[i] = (float)(job.rank + 1) / (float)(step + 1);
    size_t count = NGRAD;
    if (job.rank == job.culprit && step == 2)
      count = NGRAD + 1; /* the bug: one element more on this rank */

    snprintf(where, sizeof(where), "step %d allreduce of %zu", step, count);
    rc = chorus_allreduce(job.comm, grad, grad, count, CHORUS_FLOAT32, CHORUS_AVG);
    if (rc != CHORUS_SUCCESS)
      break;
    snprintf(where, sizeof(where), "step %d bcast", step);
    rc = chorus_bcast(job.comm, params, params, NPARAM, CHORUS_FLOAT32, 0);
  }
  if (rc == CHORUS_SUCCESS) {
    snprintf(where, sizeof(where), "final barrier");
    rc = chorus_barrier(job.comm);
  }
  return ex_finish(&job, where, rc, CHORUS_ERR_MISMATCH);
}
