/*
 * split.c - chorus_comm_split and chorus_comm_shrink.
 *
 * A split is three rounds of the parent's allgather (its bootstrap, or its
 * in-process job, or again its transport), in which every parent rank takes
 * part, NONE included, so that the rounds stay matched:
 *
 *   1. (color, key) of every parent rank -> each member finds its group,
 *      ordered by (key, parent rank), and its rank in it; the child's
 *      topology is the parent's, restricted to the group.
 *   2. in-process jobs only: the group's first member makes the child's job
 *      (its own world of transports) and publishes it.
 *   3. the members open a transport of their own for the child (shm, sock or
 *      shm+sock by the child's topology, as at init) and publish its
 *      endpoint record; each inserts its group's records.
 *
 * The child then has its own endpoint, progress thread and sequence
 * numbers, and no tie to the parent: parent and children are used
 * concurrently and destroyed in any order. What a child needs collectively
 * afterwards (the barrier in chorus_comm_destroy, splitting it again) runs
 * over its own transport: comm_xport_allgather (xgather.c), or the child's
 * in-process job.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "fsm.h"
#include "eng.h"
#include "topo.h"
#include "watch.h"

/* ---- split ---- */

typedef struct split_entry {
  int32_t color, key;
} split_entry_t;

typedef struct split_member {
  int32_t key;
  int rank;
} split_member_t;

static int cmp_member(const void *a, const void *b) {
  const split_member_t *x = a, *y = b;

  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* The parent ranks of our group in child-rank order; their number in *n. */
static int *split_members(const split_entry_t *tab, int size, int color, int *n) {
  split_member_t *m = malloc((size_t)size * sizeof(*m));
  int *out = malloc((size_t)size * sizeof(*out));

  *n = 0;
  if (!m || !out) {
    free(m);
    free(out);
    return NULL;
  }
  for (int r = 0; r < size; r++)
    if (tab[r].color == color)
      m[(*n)++] = (split_member_t){tab[r].key, r};
  qsort(m, (size_t)*n, sizeof(*m), cmp_member);
  for (int i = 0; i < *n; i++)
    out[i] = m[i].rank;
  free(m);
  return out;
}

/* Round 1: every parent rank's (color, key). */
static chorus_result split_gather_colors(chorus_comm_t *p, int color, int key,
                                         split_entry_t **out) {
  split_entry_t mine = {color, key};
  split_entry_t *tab = malloc((size_t)p->size * sizeof(*tab));
  void **ptrs = NULL;
  size_t *lens = NULL;
  chorus_result ret;

  if (!tab)
    return comm_error(p, CHORUS_ERR_NO_MEMORY, "comm_split: out of memory");
  ret = comm_allgather(p, &mine, sizeof(mine), &ptrs, &lens, p->set.connect_timeout_s);
  if (ret) {
    free(tab);
    return ret;
  }
  for (int r = 0; r < p->size; r++) {
    if (lens[r] != sizeof(mine)) {
      ret = comm_error(p, CHORUS_ERR_BOOTSTRAP, "comm_split: malformed entry from rank %d", r);
      break;
    }
    memcpy(&tab[r], ptrs[r], sizeof(mine));
  }
  free(ptrs);
  free(lens);
  if (ret)
    free(tab);
  else
    *out = tab;
  return ret;
}

/* Round 2 (in-process jobs): the group's first member makes the job. */
static chorus_result split_share_job(chorus_comm_t *p, chorus_comm_t *c, const int *members) {
  eng_local_job_t *job = NULL;
  void **ptrs = NULL;
  size_t *lens = NULL;
  chorus_result ret;

  if (c && c->rank == 0)
    job = eng_local_job_create_shared(c->size);
  ret = comm_allgather(p, &job, job ? sizeof(job) : 0, &ptrs, &lens, p->set.connect_timeout_s);
  if (ret) {
    /* the others may hold it: nobody can tell, so it is left (out of memory only) */
    return ret;
  }
  if (c) {
    if (lens[members[0]] != sizeof(job))
      ret = comm_error(p, CHORUS_ERR_NO_MEMORY, "comm_split: rank %d could not make the group",
                       members[0]);
    else
      memcpy(&c->local, ptrs[members[0]], sizeof(job));
  }
  free(ptrs);
  free(lens);
  return ret;
}

/* Round 3: endpoint records; ours is empty when we are in no group or our
 * transport did not open (the group's other members then fail cleanly). */
static chorus_result split_exchange(chorus_comm_t *p, chorus_comm_t *c, const int *members,
                                    chorus_result opened) {
  uint8_t *packed = NULL;
  size_t plen = 0;
  void **ptrs = NULL;
  size_t *lens = NULL;
  chorus_result ret = opened;

  if (c && !ret)
    ret = comm_pack_endpoint(c, "", &packed, &plen);
  chorus_result gret = comm_allgather(p, packed ? (const void *)packed : "", plen, &ptrs, &lens,
                                      p->set.connect_timeout_s);
  free(packed);
  if (gret)
    return gret;
  if (c && !ret)
    ret = comm_add_peer_records(c, ptrs, lens, members, false);
  free(ptrs);
  free(lens);
  return ret;
}

/* A child's sub_id from its parent's, the parent's split count and the
 * color: the same on every member, distinct between groups (splitmix64). */
static uint64_t sub_id_of(uint64_t parent, unsigned split_no, int color) {
  uint64_t z = parent * 0x9e3779b97f4a7c15ull + ((uint64_t)split_no << 32) + (uint32_t)color + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z ? z : 1;
}

CHORUS_API chorus_result chorus_comm_split(chorus_comm_t *comm, int color, int key,
                                           chorus_comm_t **newcomm) {
  split_entry_t *tab = NULL;
  chorus_comm_t *c = NULL;
  int *members = NULL, n = 0;
  chorus_result ret;

  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM,
                     "chorus_comm_split: not a live communicator (NULL or destroyed)");
  if (!newcomm)
    return comm_error(comm, CHORUS_ERR_INVALID_ARG, "comm_split: newcomm is NULL");
  *newcomm = NULL;
  if (color < CHORUS_SPLIT_NONE)
    return comm_error(comm, CHORUS_ERR_INVALID_ARG,
                      "comm_split: color %d is negative (CHORUS_SPLIT_NONE, -1, joins no group)",
                      color);

  unsigned split_no = atomic_fetch_add(&comm->nsplits, 1); /* the same count on every rank */
  if ((ret = split_gather_colors(comm, color, key, &tab)))
    return ret;
  if (color != CHORUS_SPLIT_NONE) {
    members = split_members(tab, comm->size, color, &n);
    int me = -1;
    for (int i = 0; members && i < n; i++)
      if (members[i] == comm->rank)
        me = i;
    c = members && me >= 0 ? comm_alloc(me, n) : NULL;
    if (c) {
      c->set = comm->set;
      memcpy(c->sock_listen, comm->sock_listen, sizeof(c->sock_listen));
      c->set.faults[0] = '\0'; /* faults target the world's call numbers */
      c->topo = topo_sub(comm->topo, members, n);
      if (comm->family && (c->world_of = malloc((size_t)n * sizeof(*c->world_of)))) {
        c->family = comm->family;
        c->sub_id = sub_id_of(comm->sub_id, split_no, color);
        for (int i = 0; i < n; i++)
          c->world_of[i] = comm->world_of ? comm->world_of[members[i]] : (uint32_t)members[i];
      }
    }
    if (!c || !c->topo || (comm->family && !c->world_of))
      ret = comm_error(comm, CHORUS_ERR_NO_MEMORY, "comm_split: out of memory");
  }
  /* From here every parent rank goes through the same rounds whatever
   * failed locally, so that the others are not left waiting. */
  if (comm->local) {
    chorus_result sret = split_share_job(comm, ret ? NULL : c, members);
    ret = ret ? ret : sret;
  }
  chorus_result opened = ret;
  if (c && !opened)
    opened = comm_open_transport(c);
  chorus_result xret = split_exchange(comm, ret ? NULL : c, members, opened);
  ret = ret ? ret : xret;
  if (!ret && c) {
    c->home_cpu = comm->home_cpu; /* the process's core, whatever group it joins */
    if ((ret = comm_start(c)) || (ret = comm_register(c)))
      comm_error(comm, ret, "comm_split: %s", c->last_error);
    else
      watch_family_add(c);
  } else if (ret && c && c->last_error[0] && strcmp(c->last_error, "no error") != 0) {
    comm_error(comm, ret, "comm_split: %s", c->last_error);
  }
  if (ret) {
    if (c)
      comm_free(c);
    c = NULL;
  } else if (c) {
    eng_log(ENG_INFO, comm->rank, "comm", "split: color %d, rank %d of %d over %s", color, c->rank,
            c->size, c->prov->name);
  }
  free(members);
  free(tab);
  *newcomm = c;
  return ret;
}

/* ---- shrink ----
 *
 * The survivors of a failure agree on who is alive without a rendezvous:
 * the watchdog's one verdict names the lost ranks to every rank alike
 * (comm->lost). Each survivor opens a new endpoint and the survivors
 * exchange their records in one round over the old communicator's
 * transport, between themselves only (it runs although that communicator
 * failed: an internal round). Ranks keep their order. */
CHORUS_API chorus_result chorus_comm_shrink(chorus_comm_t *comm, chorus_comm_t **newcomm) {
  chorus_comm_t *c = NULL;
  bool *alive = NULL;
  int *members = NULL, n = 0, me = -1;
  chorus_result ret = CHORUS_SUCCESS;

  if (!eng_handle_valid(comm, ENG_HANDLE_COMM))
    return eng_error(CHORUS_ERR_INVALID_COMM,
                     "chorus_comm_shrink: not a live communicator (NULL or destroyed)");
  if (!newcomm)
    return comm_error(comm, CHORUS_ERR_INVALID_ARG, "comm_shrink: newcomm is NULL");
  *newcomm = NULL;
  if (comm->local)
    return comm_error(comm, CHORUS_ERR_UNSUPPORTED,
                      "comm_shrink: not for in-process jobs (their ranks can not be lost)");
  alive = calloc((size_t)comm->size, sizeof(bool));
  members = calloc((size_t)comm->size, sizeof(int));
  if (!alive || !members) {
    ret = comm_error(comm, CHORUS_ERR_NO_MEMORY, "comm_shrink: out of memory");
    goto out;
  }
  pthread_mutex_lock(&comm->lock);
  for (int i = 0; i < comm->size; i++) {
    alive[i] = !comm->lost || !comm->lost[i];
    if (alive[i]) {
      if (i == comm->rank)
        me = n;
      members[n++] = i;
    }
  }
  pthread_mutex_unlock(&comm->lock);
  if (me < 0) {
    ret = comm_error(comm, CHORUS_ERR_PEER_LOST,
                     "comm_shrink: the watchdog declared this rank lost: it can not rejoin");
    goto out;
  }
  c = comm_alloc(me, n);
  if (c) {
    c->set = comm->set;
    memcpy(c->sock_listen, comm->sock_listen, sizeof(c->sock_listen));
    c->set.faults[0] = '\0';
    c->topo = topo_sub(comm->topo, members, n);
  }
  if (!c || !c->topo)
    ret = comm_error(comm, CHORUS_ERR_NO_MEMORY, "comm_shrink: out of memory");
  chorus_result opened = ret ? ret : comm_open_transport(c);
  uint8_t *packed = NULL;
  size_t plen = 0;
  if (!opened)
    opened = comm_pack_endpoint(c, "", &packed, &plen);
  /* everyone alive takes part in the round, whatever failed locally */
  void **ptrs = NULL;
  size_t *lens = NULL;
  chorus_result gret =
      comm_xport_allgather(comm, alive, packed ? (const void *)packed : "", plen, &ptrs, &lens);
  free(packed);
  ret = ret ? ret : opened ? opened : gret;
  if (!ret) {
    for (int i = 0; i < n && !ret; i++)
      if (lens[members[i]] == 0)
        ret = comm_error(comm, CHORUS_ERR_PEER_LOST,
                         "comm_shrink: rank %d took part but opened no endpoint", members[i]);
  }
  if (!ret)
    ret = comm_add_peer_records(c, ptrs, lens, members, false);
  free(ptrs);
  free(lens);
  if (!ret) {
    c->home_cpu = comm->home_cpu; /* the process's core, as in a split */
    if ((ret = comm_start(c)) || (ret = comm_register(c)))
      comm_error(comm, ret, "comm_shrink: %s", c->last_error);
  }
  if (ret && c) {
    comm_free(c);
    c = NULL;
  } else if (c) {
    eng_log(ENG_INFO, comm->rank, "comm", "shrink: rank %d of %d survivors over %s", c->rank,
            c->size, c->prov->name);
  }
out:
  free(alive);
  free(members);
  *newcomm = c;
  return ret;
}
