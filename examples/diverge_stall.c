/* diverge_stall.c - one rank freezes inside a collective.
 *
 * The training loop of diverge_skip.c, but the culprit's progress engine is
 * frozen for an hour as it begins the allreduce of step 2: it neither sends
 * nor receives, as a rank stuck in a driver call, swapping or stopped in a
 * debugger would. The freeze is injected by the engine itself through
 * CHORUS_FAULTS, which this program sets before creating the communicator:
 *
 *   stall:rank=R,at=allreduce#K,s=3600
 *
 * (K is the allreduce's sequence number on the communicator: 2 calls per
 * step, counted from 1.) After CHORUS_TIMEOUT seconds (5 here unless you
 * set it) every rank's call fails with CHORUS_ERR_TIMEOUT naming the rank
 * the others wait for.
 *
 *   CHORUS_TRACE_DIR=/tmp/dumps chorus-run -n 4 -- ./diverge_stall [--culprit R] [--steps N]
 *   chorus-trace /tmp/dumps
 *
 * Exit status 0 when this rank's call failed with CHORUS_ERR_TIMEOUT. */
#include "example_util.h"

#define NGRAD 4096
#define NPARAM 1024
#define STALL_STEP 2

int main(int argc, char **argv) {
  static float grad[NGRAD], params[NPARAM];
  char faults[128];
  ex_job_t job;

  int st = ex_parse(argc, argv, &job);
  if (st)
    return st;
  /* Settings are read by chorus_comm_init, so the fault goes in before it.
   * The rule names the culprit, whose default depends on the job's size:
   * here that comes from the launcher's variables. */
  const char *ws = getenv("CHORUS_WORLD_SIZE") ? getenv("CHORUS_WORLD_SIZE") : getenv("WORLD_SIZE");
  int culprit = job.culprit >= 0 ? job.culprit : ex_default_culprit(ws ? atoi(ws) : 0);
  snprintf(faults, sizeof(faults), "stall:rank=%d,at=allreduce#%d,s=3600", culprit,
           2 * STALL_STEP + 1);
  setenv("CHORUS_FAULTS", faults, 1);
  setenv("CHORUS_TIMEOUT", "5", 0); /* a short timeout for the demo, unless you set one */
  if ((st = ex_connect(&job)))
    return st;

  chorus_result rc = CHORUS_SUCCESS;
  char where[64] = "";
  for (int step = 0; step < job.steps && rc == CHORUS_SUCCESS; step++) {
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
  return ex_finish(&job, where, rc, CHORUS_ERR_TIMEOUT);
}
