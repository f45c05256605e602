/*
 * verify.h - checking compiled schedules before they run.
 *
 * A collective's plans, one per rank, are checked together: every SEND has
 * exactly one RECV of equal size on its peer (same source, destination and
 * message number), and the graph of all ranks' steps, with an edge from each
 * send to its receive, from each step to its successors, and from each
 * message to the next one of the same sender and receiver by message number
 * (the order the executor posts them in), has no cycle.
 * Algorithms are pure functions, so any rank can build its peers' plans and
 * check the whole schedule on its own.
 */
#ifndef CHORUS_VERIFY_H
#define CHORUS_VERIFY_H

#include <stddef.h>

#include "algos/algos.h"
#include "plan.h"
#include "sim.h"

/* Checks plans[0..nranks). Returns 0, or -EPROTO (unmatched or mismatched
 * message), -EDEADLK (cycle), -EINVAL (malformed), -ENOMEM, with a message
 * in err naming the ranks and steps. */
int verify_plans(plan_t *const *plans, int nranks, char *err, size_t errlen);

/* Checks a graph built by sim.h (sim_graph_from_plans or sim_graph_build),
 * as verify_plans does; g stays the caller's and can go on to sim_time. */
int verify_graph(sim_graph_t *g, char *err, size_t errlen);

/* Builds every rank's plan of `d` for the shape of `a` (a->rank ignored)
 * into a graph (sim_graph_build) and checks it with verify_graph. */
int verify_algo(const algo_desc_t *d, const algo_args_t *a, char *err, size_t errlen);

#endif
