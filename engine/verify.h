/*
 * verify.h - checking compiled schedules before they run.
 *
 * A collective's plans, one per rank, are checked together: every SEND has
 * exactly one RECV of equal size on its peer (same source, destination and
 * message number), and the graph of all ranks' steps, with an edge from each
 * send to its receive and from each step to its successors, has no cycle.
 * Algorithms are pure functions, so any rank can build its peers' plans and
 * check the whole schedule on its own.
 */
#ifndef CHORUS_VERIFY_H
#define CHORUS_VERIFY_H

#include <stddef.h>

#include "algos/algos.h"
#include "plan.h"

/* Checks plans[0..nranks). Returns 0, or -EPROTO (unmatched or mismatched
 * message), -EDEADLK (cycle), -EINVAL (malformed), -ENOMEM, with a message
 * in err naming the ranks and steps. */
int verify_plans(plan_t *const *plans, int nranks, char *err, size_t errlen);

/* Builds every rank's plan of `d` for the shape of `a` (a->rank ignored)
 * and checks them with verify_plans. */
int verify_algo(const algo_desc_t *d, const algo_args_t *a, char *err, size_t errlen);

#endif
