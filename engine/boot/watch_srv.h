/*
 * watch_srv.h - the watchdog's judge, inside rank 0's rendezvous server.
 *
 * Every rank sends it heartbeats (Beat: its checkpoint in brief) over a
 * connection of its own (bootstrap.proto, "the watchdog"). On every beat and
 * every tick it looks, in this order, for
 *   1. a lost rank: its connection closed without goodbye (PEER_LOST at
 *      once), or no heartbeat for the peer timeout (PEER_LOST);
 *   2. two ranks whose calls at one sequence number differ: another
 *      collective (DIVERGED) or other arguments (MISMATCH); the culprit is
 *      the rank outside the largest group of agreeing ranks;
 *   3. endings: a call some ranks began and a rank in chorus_comm_destroy
 *      never did can not complete (DIVERGED at once): the minority is the
 *      culprit, the ranks that left early or the ones that called after the
 *      others left; undecided ranks that could tip it are waited for;
 *   4. a deadlock: a cycle in the graph of what the applications wait in
 *      (a receive from or send to a peer, a collective that a rank has not
 *      begun), every member blocked together for a watchdog period
 *      (DIVERGED at once, no single culprit);
 *   5. a failure a rank reported (its own mismatch, a transport error): it
 *      polls every rank for a fresh beat first, so that rule 2 can name the
 *      culprit, then passes the failure on;
 *   6. a call waiting past the timeout: the rank that never made it
 *      (DIVERGED: skipped the call, waits in an unmatched send or receive,
 *      or left), the rank still in an earlier call, the rank whose progress
 *      engine stopped (TIMEOUT: stalled), the end of the chain of ranks
 *      waiting for each other (TIMEOUT), or a cycle (TIMEOUT, no single
 *      culprit).
 * Its one verdict goes to every rank, which fails its communicator with it.
 * Runs on the server's thread only.
 */
#ifndef CHORUS_WATCH_SRV_H
#define CHORUS_WATCH_SRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bootstrap.pb-c.h"

typedef struct wsrv wsrv_t;

typedef struct wsrv_config {
  int size;
  double timeout_s;      /* CHORUS_TIMEOUT */
  double peer_timeout_s; /* CHORUS_PEER_TIMEOUT */
  double tick_s;         /* CHORUS_WATCHDOG_MS */
  /* sends one packed frame to rank r's watchdog connection */
  void (*send)(void *arg, int rank, const uint8_t *frame, size_t len);
  void *arg;
} wsrv_config_t;

wsrv_t *wsrv_new(const wsrv_config_t *cfg, double now);
void wsrv_free(wsrv_t *w);
/* A rank's watchdog connection was admitted. */
void wsrv_join(wsrv_t *w, int rank, double now);
void wsrv_beat(wsrv_t *w, int rank, const Chorus__Boot__Beat *b, double now);
/* A rank said goodbye (WatchBye); its connection may close. */
void wsrv_bye(wsrv_t *w, int rank);
/* A rank's connection (either) closed without goodbye: why, for a person. */
void wsrv_lost(wsrv_t *w, int rank, const char *why, double now);
void wsrv_tick(wsrv_t *w, double now);
/* The verdict sent, if any (tests, logs). */
bool wsrv_decided(const wsrv_t *w, int *code, int *culprit);

#endif
