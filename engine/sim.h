/*
 * sim.h - run every rank's plan in one process, without a transport.
 *
 * The reference interpreter for plans: steps become ready as their
 * dependencies finish; a ready SEND and the ready RECV of its peer with the
 * same (source, destination, message number) meet and copy; local steps run
 * at once. Every buffer access is checked against the sizes given. Used by
 * algorithm tests, the scale simulation and chorus-plan.
 */
#ifndef CHORUS_SIM_H
#define CHORUS_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"

typedef struct sim_buf {
  const void *send;
  size_t send_bytes;
  void *recv;
  size_t recv_bytes;
} sim_buf_t;

typedef struct sim_stats {
  uint64_t steps;    /* steps run, all ranks */
  uint64_t messages; /* matched send/recv pairs */
  uint64_t bytes;    /* bytes moved by them */
} sim_stats_t;

/* Runs plans[r] over bufs[r] for every rank r < nranks. bufs may be NULL
 * (no data: steps are matched and counted, nothing is copied). Returns 0, or
 * a negative errno with a message in err: -EDEADLK when steps remain that
 * can never run (an unmatched send or receive, or a dependency cycle across
 * ranks), -EPROTO when a matched send and receive differ in size or a
 * message number is used twice, -EFAULT when a step reaches outside its
 * buffer, -EINVAL for a malformed plan, -ENOMEM. stats may be NULL. */
int sim_exec(plan_t *const *plans, int nranks, const sim_buf_t *bufs, sim_stats_t *stats, char *err,
             size_t errlen);

#endif
