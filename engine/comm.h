/*
 * comm.h - the communicator and its requests (engine-private).
 */
#ifndef CHORUS_COMM_H
#define CHORUS_COMM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "algos/algos.h"
#include "bootstrap.h"
#include "chorus.h"
#include "exec.h"
#include "plan.h"
#include "prov.h"
#include "settings.h"

struct event_base;
struct event;

#define COMM_PLAN_CACHE 8

typedef struct comm_plan_slot {
  plan_t *plan;
  size_t chunk_bytes;
  unsigned refs; /* requests using it (application thread only) */
  uint64_t last_use;
} comm_plan_slot_t;

typedef struct eng_local_job eng_local_job_t;

struct chorus_request {
  chorus_comm_t *comm;
  comm_plan_slot_t *slot; /* cached plan in use, or NULL when plan is owned */
  plan_t *plan;
  const void *sendbuf;
  void *recvbuf;
  uint16_t seq;
  atomic_int done;
  chorus_result result;
  chorus_request_t *next_cmd;              /* command queue link */
  chorus_request_t *prev_live, *next_live; /* comm's list of unreleased requests */
};

struct chorus_comm {
  int rank, size;
  chorus_settings_t set;
  boot_t *boot;           /* NULL for an in-process job */
  eng_local_job_t *local; /* in-process job, or NULL */
  prov_t *prov;
  exec_ctx_t ex; /* progress thread only */
  topo_t *topo;  /* hosts of the ranks (topo.c); NULL until known = one host */

  /* progress thread */
  pthread_t thread;
  bool thread_started;
  struct event_base *base;
  struct event *ev_cmd, *ev_wait, *ev_timer;
  int cmd_fd; /* eventfd: wakes the progress thread */
  atomic_int cmd_pending;
  atomic_int sleeping;
  atomic_int stop;

  /* shared between application and progress threads, under lock */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int waiters;
  chorus_request_t *cmd_head, *cmd_tail;
  char last_error[1024];

  /* application thread */
  uint16_t seq;
  uint64_t uses;
  comm_plan_slot_t plans[COMM_PLAN_CACHE];
  chorus_request_t *live; /* requests not yet released */
};

/* Record a failure on comm (any thread); returns rc. */
chorus_result comm_error(chorus_comm_t *c, chorus_result rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* In-process jobs: every rank a thread of this process, over prov_inproc. */
eng_local_job_t *eng_local_job_create(int nranks);
void eng_local_job_destroy(eng_local_job_t *job);
chorus_result eng_comm_init_local(eng_local_job_t *job, int rank, chorus_comm_t **out);

/* Requests (request.c). */
void request_complete(chorus_request_t *req, chorus_result rc);
void request_release(chorus_request_t *req);

#endif
