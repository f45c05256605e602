/*
 * watch.h - the watchdog client of a communicator, and trace dumps.
 *
 * A communicator made by chorus_comm_init (one with a bootstrap) runs a
 * watchdog thread with its own connection to rank 0's rendezvous server
 * (bootstrap.proto): every CHORUS_WATCHDOG_MS it sends a heartbeat with
 * its checkpoint in brief (ckpt.h: the recent calls, how long the oldest
 * open one waits and on which step, whether the progress engine runs);
 * it answers polls; and it applies the judge's verdict (watch_srv.h):
 * dump the trace (CHORUS_TRACE_DIR), then fail the communicator with it,
 * so that every pending call returns that code and message. It also dumps
 * on SIGUSR1 and, best effort, on a fatal signal (when CHORUS_TRACE_DIR is
 * set). If rank 0's server goes away, or judges nothing while a call waits
 * past CHORUS_TIMEOUT + 5 s, the thread decides alone.
 */
#ifndef CHORUS_WATCH_H
#define CHORUS_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "chorus.h"

struct chorus_comm;
typedef struct watch watch_t;

/* Connects and starts the thread; sets c->watch, c->watch_bell and
 * c->clock_offset_ns.
 * A failure leaves the communicator without a watchdog (a warning). */
chorus_result watch_start(struct chorus_comm *c);
/* Says goodbye to the judge and stops (NULL: nothing). */
void watch_stop(watch_t *w);
/* A split child of a communicator with a watchdog (c->family set): its
 * waits go into the head's beats, and the head's verdicts reach it. */
void watch_family_add(struct chorus_comm *c);
void watch_family_remove(struct chorus_comm *c);
/* chorus_comm_destroy began: send a heartbeat now (it says so), so that
 * the judge can tell the ranks waiting for this one at once. */
void watch_notify_leaving(watch_t *w);
/* Waits up to timeout_s for a verdict on the communicator; true if one came. */
bool watch_await_verdict(watch_t *w, double timeout_s);

/* Writes c's dump into dir (dump.c); reason: trace.proto Verdict.Reason.
 * Returns 0 (the file name in path) or -errno. Any thread. */
int dump_write(struct chorus_comm *c, const char *dir, int reason, int culprit, int status,
               const char *text, const uint32_t *lost, size_t nlost, char *path, size_t pathlen);

#endif
