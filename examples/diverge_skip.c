/* diverge_skip.c - one rank skips a training step.
 *
 * A toy data-parallel training loop: every step allreduces the gradients
 * (average) and broadcasts rank 0's parameters. At step 2 the culprit's loss
 * spikes and it skips the step with `continue` (a guard meant to drop a bad
 * batch, taken on one rank only). From then on its calls run one step ahead
 * of everyone else's: its final barrier meets the others' allreduce of the
 * last step, and every rank's call fails with CHORUS_ERR_DIVERGED naming the
 * culprit, instead of the job hanging.
 *
 *   CHORUS_TRACE_DIR=/tmp/dumps chorus-run -n 4 -- ./diverge_skip [--culprit R] [--steps N]
 *   chorus-trace /tmp/dumps
 *
 * Exit status 0 when this rank's call failed with CHORUS_ERR_DIVERGED. */
#include "example_util.h"

#define NGRAD 4096
#define NPARAM 1024

int main(int argc, char **argv) {
  static float grad[NGRAD], params[NPARAM];
  ex_job_t job;
  int st = ex_init(argc, argv, &job);
  if (st)
    return st;

  chorus_result rc = CHORUS_SUCCESS;
  char where[64] = "";
  for (int step = 0; step < job.steps && rc == CHORUS_SUCCESS; step++) {
    /* forward and backward pass: a loss and this rank's gradients */
    float loss = job.rank == job.culprit && step == 2 ? 1e6f : 1.0f / (float)(step + 1);
    if (loss > 100)
      continue; /* the bug: this rank alone skips the step's collectives */
    for (int i = 0; i < NGRAD; i++)
      grad[i] = loss * (float)(job.rank + 1);

    snprintf(where, sizeof(where), "step %d allreduce", step);
    rc = chorus_allreduce(job.comm, grad, grad, NGRAD, CHORUS_FLOAT32, CHORUS_AVG);
    if (rc != CHORUS_SUCCESS)
      break;
    if (job.rank == 0) /* the optimizer step, on rank 0 */
      for (int i = 0; i < NPARAM; i++)
        params[i] -= 0.01f * grad[i];
    snprintf(where, sizeof(where), "step %d bcast", step);
    rc = chorus_bcast(job.comm, params, params, NPARAM, CHORUS_FLOAT32, 0);
  }
  if (rc == CHORUS_SUCCESS) {
    snprintf(where, sizeof(where), "final barrier");
    rc = chorus_barrier(job.comm);
  }
  return ex_finish(&job, where, rc, CHORUS_ERR_DIVERGED);
}
