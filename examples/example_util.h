/* example_util.h - what the diverge_* examples share: their options, the
 * communicator from the launcher's environment, and the one line each rank
 * prints at the end. Public API only (chorus.h).
 *
 *   chorus-run -n 4 -- ./diverge_skip [--culprit R] [--steps N]
 *
 * --culprit R  the rank that misbehaves (default: size - 2, rank 1 at 2 ranks)
 * --steps N    training steps (default 4; the culprit acts at step 2) */
#ifndef EXAMPLE_UTIL_H
#define EXAMPLE_UTIL_H

#include <chorus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ex_job {
  chorus_comm_t *comm;
  int rank, size;
  int culprit; /* the rank that misbehaves */
  int steps;   /* training steps */
} ex_job_t;

/* Name of a result code as it is spelled in chorus.h. */
static inline const char *ex_code_name(chorus_result rc) {
  static const char *const names[] = {"CHORUS_SUCCESS",
                                      "CHORUS_ERR_INVALID_ARG",
                                      "CHORUS_ERR_INVALID_DTYPE",
                                      "CHORUS_ERR_INVALID_OP",
                                      "CHORUS_ERR_INVALID_COMM",
                                      "CHORUS_ERR_COUNT_OVERFLOW",
                                      "CHORUS_ERR_NO_MEMORY",
                                      "CHORUS_ERR_TRANSPORT",
                                      "CHORUS_ERR_BOOTSTRAP",
                                      "CHORUS_ERR_AUTH",
                                      "CHORUS_ERR_TIMEOUT",
                                      "CHORUS_ERR_PEER_LOST",
                                      "CHORUS_ERR_MISMATCH",
                                      "CHORUS_ERR_DIVERGED",
                                      "CHORUS_ERR_CORRUPT",
                                      "CHORUS_ERR_ABORTED",
                                      "CHORUS_ERR_INTERNAL",
                                      "CHORUS_ERR_UNSUPPORTED",
                                      "CHORUS_ERR_INVALID_REQUEST",
                                      "CHORUS_ERR_ENV"};
  int i = -(int)rc;
  return i >= 0 && i < (int)(sizeof(names) / sizeof(names[0])) ? names[i] : "unknown code";
}

static inline int ex_usage(const char *prog) {
  fprintf(stderr, "usage: chorus-run -n N -- %s [--culprit R] [--steps N]\n", prog);
  return 2;
}

/* The culprit when --culprit is not given. */
static inline int ex_default_culprit(int size) {
  return size > 2 ? size - 2 : 1;
}

/* Parses the options (job->culprit -1 without --culprit); returns 0, or the
 * exit status to return from main. */
static inline int ex_parse(int argc, char **argv, ex_job_t *job) {
  job->culprit = -1;
  job->steps = 4;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--culprit") == 0 && i + 1 < argc)
      job->culprit = atoi(argv[++i]);
    else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
      job->steps = atoi(argv[++i]);
    else
      return ex_usage(argv[0]);
  }
  return 0;
}

/* Creates the communicator (rank, size and rendezvous from the launcher's
 * environment); returns 0, or the exit status to return from main. */
static inline int ex_connect(ex_job_t *job) {
  if (chorus_comm_init_from_env(&job->comm) != CHORUS_SUCCESS) {
    fprintf(stderr, "init: %s\n", chorus_last_error());
    return 1;
  }
  chorus_comm_rank(job->comm, &job->rank);
  chorus_comm_size(job->comm, &job->size);
  if (job->culprit < 0)
    job->culprit = ex_default_culprit(job->size);
  if (job->size < 2 || job->culprit >= job->size || job->steps < 3) {
    fprintf(stderr, "need 2 ranks or more, a culprit among them and 3 steps or more\n");
    chorus_comm_destroy(job->comm);
    return 2;
  }
  return 0;
}

static inline int ex_init(int argc, char **argv, ex_job_t *job) {
  int st = ex_parse(argc, argv, job);
  return st ? st : ex_connect(job);
}

/* Prints this rank's line (the call that failed, the code and the
 * communicator's last error, which starts with "rank N:"), destroys the
 * communicator; returns the exit status: 0 when the call failed with the
 * code the example is about. */
static inline int ex_finish(ex_job_t *job, const char *where, chorus_result rc,
                            chorus_result expected) {
  if (rc == CHORUS_SUCCESS)
    printf("rank %d: every call succeeded (expected %s)\n", job->rank, ex_code_name(expected));
  else
    printf("%s: %s: %s\n", where, ex_code_name(rc), chorus_comm_last_error(job->comm));
  fflush(stdout);
  chorus_comm_destroy(job->comm);
  return rc == expected ? 0 : 1;
}

#endif /* EXAMPLE_UTIL_H */
