/*
 * topo.h - which host each rank of a communicator is on (topo_t, algos.h).
 *
 * Sources, combined:
 *  - the real hosts: the bootstrap's table of host identities (ranks with
 *    the same identity share a host);
 *  - CHORUS_TOPO, which cuts the real hosts further to emulate several
 *    hosts on one machine:
 *      hosts=HxR        H hosts of R ranks: rank r on host r / R (H*R ranks)
 *      map=h0,h1,...    rank i on host label hi (one label per rank, >= 0)
 *    Two ranks share a host only if both sources say so.
 * Hosts are numbered 0..nhosts-1 in order of their lowest rank, whatever
 * the labels were, so every rank derives the same topology from the same
 * inputs. A topology is one allocation; topo_free releases it.
 */
#ifndef CHORUS_TOPO_H
#define CHORUS_TOPO_H

#include <stdbool.h>
#include <stddef.h>

#include "algos/algos.h"

/* From any non-negative host labels (labels[i] for rank i): renumbered by
 * lowest rank. NULL on allocation failure. */
topo_t *topo_from_labels(const int *labels, int nranks);
/* From host identity strings (a NULL entry is a host of its own). */
topo_t *topo_from_hosts(const char *const *hosts, int nranks);
/* Parses a CHORUS_TOPO value for a communicator of nranks ranks into host
 * labels (labels[nranks]). Returns 0, or -1 with a message naming
 * CHORUS_TOPO in err. An empty spec gives every rank label 0. */
int topo_parse(const char *spec, int nranks, int *labels, char *err, size_t errlen);
/* Ranks on the same host in both a and b (either may be NULL: one host). */
topo_t *topo_refine(const topo_t *a, const topo_t *b, int nranks);
/* The topology of a sub-communicator whose rank i is members[i] of t
 * (t may be NULL: one host). */
topo_t *topo_sub(const topo_t *t, const int *members, int n);
/* A copy (t may be NULL: one host of nranks). */
topo_t *topo_dup(const topo_t *t, int nranks);
void topo_free(topo_t *t);

/* Ranks on host h. */
int topo_host_size(const topo_t *t, int h);
/* True when every host holds exactly one rank. */
bool topo_one_rank_per_host(const topo_t *t);
/* "2 hosts: 0 0 1 1" (truncated to len), for logs. */
void topo_describe(const topo_t *t, char *out, size_t len);

#endif
