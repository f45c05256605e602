/*
 * mp.h - multi-process test fixture: run a function as N ranks, each in its
 * own forked process, with a rendezvous address on loopback.
 */
#ifndef CHORUS_TEST_MP_H
#define CHORUS_TEST_MP_H

#include <stddef.h>
#include <sys/types.h>

/* Body of one rank: return 0 on success; print the reason before failing. */
typedef int (*mp_rank_fn)(int rank, int size, const char *rendezvous, void *arg);

typedef struct mp_result {
  int failed;       /* ranks that returned non-zero, crashed or timed out */
  int timed_out;    /* 1 when the run was killed at the timeout */
  int status[64];   /* exit status per rank (-signal when killed) */
  int pids[64];     /* process id of each rank */
  long started;     /* CLOCK_REALTIME seconds when the ranks were forked */
  double ended[64]; /* CLOCK_MONOTONIC seconds when each rank was seen to end
                       (within 2 ms of its exit; 0 if never) */
} mp_result_t;

/* CLOCK_MONOTONIC in seconds (mp_result_t.ended's clock). */
double mp_now_s(void);
/* A free TCP port on 127.0.0.1. */
int mp_free_port(void);
/* Runs fn as `size` ranks (size <= 64). `env` is a NULL-terminated list of
 * "NAME=value" set in every rank (may be NULL). Returns the result. */
mp_result_t mp_run(int size, mp_rank_fn fn, void *arg, double timeout_s, const char *const *env);

/* Runs the shell command cmd, its standard output (the first len - 1 bytes)
 * into out, NUL-terminated. Returns its wait status, -1 if it could not run. */
int mp_capture(const char *cmd, char *out, size_t len);
/* chorus-trace (of this build) on the dump directory dir: the first line of
 * what it prints (its diagnosis) into line. Returns its exit status (0: a
 * culprit or cycle found), -1 if it could not run. */
int mp_trace_line(const char *dir, char *line, size_t len);
/* Open file descriptors of this process. */
int mp_count_fds(void);
/* Resident set size of this process in KiB. */
long mp_rss_kib(void);
/* Entries in /dev/shm left by the given processes: libfabric's shm provider
 * names its regions "<pid>:<n>:<n>", Chorus "chorus-<pid>-...". */
int mp_count_dev_shm_of(const mp_result_t *r, int n);
/* Removes what mp_count_dev_shm_of would count for that one rank (what a
 * launcher does for a rank that died after its peers had gone: nobody was
 * left to do it); returns how many files it removed. */
int mp_remove_dev_shm_of_rank(const mp_result_t *r, int rank);
/* The state letter of process pid in /proc/<pid>/stat ('R', 'S', 'Z'...),
 * 0 when it can not be read (no such process). */
char mp_proc_state(pid_t pid);

#endif
