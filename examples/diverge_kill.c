/* diverge_kill.c - one rank dies in the middle of training.
 *
 * The training loop of diverge_skip.c, but at step 2 the culprit is killed
 * with SIGKILL, as the kernel's OOM killer or a node failure would: no exit
 * handler runs and nothing says goodbye to the other ranks. The survivors'
 * calls fail with CHORUS_ERR_PEER_LOST naming the dead rank (rank 0's
 * watchdog sees the rank's connection close), instead of waiting for it
 * forever.
 *
 *   CHORUS_TRACE_DIR=/tmp/dumps chorus-run -n 4 -- ./diverge_kill [--culprit R] [--steps N]
 *   chorus-trace /tmp/dumps
 *
 * The culprit leaves no dump, and chorus-run reports it killed by signal 9
 * and exits with 137 whatever the survivors do. Exit status of a survivor:
 * 0 when its call failed with CHORUS_ERR_PEER_LOST. */
#include "example_util.h"

#include <signal.h>

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
    if (job.rank == job.culprit && step == 2) {
      printf("rank %d: step %d: killed (SIGKILL)\n", job.rank, step);
      fflush(stdout);
      raise(SIGKILL); /* the bug: this rank dies without a word */
    }
    for (int i = 0; i < NGRAD; i++)
      grad[i] = (float)(job.rank + 1) / (float)(step + 1);

    snprintf(where, sizeof(where), "step %d allreduce", step);
    rc = chorus_allreduce(job.comm, grad, grad, NGRAD, CHORUS_FLOAT32, CHORUS_AVG);
    if (rc != CHORUS_SUCCESS)
      break;
    snprintf(where, sizeof(where), "step %d bcast", step);
    rc = chorus_bcast(job.comm, params, params, NPARAM, CHORUS_FLOAT32, 0);
  }
  if (rc == CHORUS_SUCCESS) {
    snprintf(where, sizeof(where), "final barrier");
    rc = chorus_barrier(job.comm);
  }
  return ex_finish(&job, where, rc, CHORUS_ERR_PEER_LOST);
}
