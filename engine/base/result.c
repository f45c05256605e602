/*
 * result.c - result codes, names of datatypes and ops, error recording,
 * logging and the live-handle registry.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chorus.h"
#include "eng.h"

CHORUS_API const char *chorus_strerror(chorus_result rc) {
  switch (rc) {
  case CHORUS_SUCCESS:
    return "success";
  case CHORUS_ERR_INVALID_ARG:
    return "invalid argument";
  case CHORUS_ERR_INVALID_DTYPE:
    return "invalid datatype";
  case CHORUS_ERR_INVALID_OP:
    return "invalid reduction op";
  case CHORUS_ERR_INVALID_COMM:
    return "invalid or destroyed communicator";
  case CHORUS_ERR_COUNT_OVERFLOW:
    return "count overflows the address space";
  case CHORUS_ERR_NO_MEMORY:
    return "out of memory";
  case CHORUS_ERR_TRANSPORT:
    return "transport error";
  case CHORUS_ERR_BOOTSTRAP:
    return "bootstrap (rendezvous) failed";
  case CHORUS_ERR_AUTH:
    return "wrong job token";
  case CHORUS_ERR_TIMEOUT:
    return "timed out";
  case CHORUS_ERR_PEER_LOST:
    return "peer lost";
  case CHORUS_ERR_MISMATCH:
    return "mismatched collective call across ranks";
  case CHORUS_ERR_DIVERGED:
    return "ranks diverged";
  case CHORUS_ERR_CORRUPT:
    return "data corrupted in transit";
  case CHORUS_ERR_ABORTED:
    return "communicator aborted";
  case CHORUS_ERR_INTERNAL:
    return "internal error";
  case CHORUS_ERR_UNSUPPORTED:
    return "unsupported";
  case CHORUS_ERR_INVALID_REQUEST:
    return "invalid or released request";
  case CHORUS_ERR_ENV:
    return "launcher environment missing or malformed";
  }
  return "unknown result code";
}

static const char *const dtype_names[CHORUS_DTYPE_COUNT] = {
    "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"};
static const size_t dtype_sizes[CHORUS_DTYPE_COUNT] = {1, 1, 4, 8, 2, 2, 4, 8};
static const char *const op_names[CHORUS_OP_COUNT] = {"sum", "prod", "min", "max", "avg"};

CHORUS_API const char *chorus_dtype_name(chorus_dtype dtype) {
  return (unsigned)dtype < CHORUS_DTYPE_COUNT ? dtype_names[dtype] : NULL;
}

CHORUS_API size_t chorus_dtype_size(chorus_dtype dtype) {
  return (unsigned)dtype < CHORUS_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

CHORUS_API const char *chorus_op_name(chorus_op op) {
  return (unsigned)op < CHORUS_OP_COUNT ? op_names[op] : NULL;
}

CHORUS_API const char *chorus_version(void) {
#define STR2(x) #x
#define STR(x) STR2(x)
  return STR(CHORUS_VERSION_MAJOR) "." STR(CHORUS_VERSION_MINOR) "." STR(CHORUS_VERSION_PATCH);
}

/* ---- errors and logs ---- */
static _Thread_local char tls_error[1024] = "no error";
int eng_log_level = ENG_WARN;

CHORUS_API const char *chorus_last_error(void) {
  return tls_error;
}

chorus_result eng_error(chorus_result rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
  va_end(ap);
  return rc;
}

void eng_errf(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;

  if (!err || !errlen)
    return;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

void eng_log(int level, int rank, const char *sub, const char *fmt, ...) {
  static const char *const lv[] = {"error", "warn", "info", "debug"};
  char line[1024];
  va_list ap;
  int n;

  if (level > eng_log_level)
    return;
  if (rank >= 0)
    n = snprintf(line, sizeof(line), "chorus[%d] %s %s: ", rank, lv[level], sub);
  else
    n = snprintf(line, sizeof(line), "chorus %s %s: ", lv[level], sub);
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s\n", line);
}

/* ---- handle registry: open addressing over pointer values ---- */
struct handle_slot {
  const void *p; /* NULL empty, (void*)1 tombstone */
  int kind;
};

static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle_slot *handles;
static size_t handles_cap, handles_used; /* used counts live + tombstones */

#define TOMB ((const void *)1)

static size_t handle_hash(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

static int handles_grow(void) {
  size_t live = 0, ncap = 64;

  for (size_t i = 0; i < handles_cap; i++)
    live += handles[i].p && handles[i].p != TOMB;
  /* rehash in place of growing when tombstones, not live handles, filled it */
  while (ncap < live * 4)
    ncap *= 2;
  struct handle_slot *n = calloc(ncap, sizeof(*n));
  live = 0;

  if (!n)
    return -ENOMEM;
  for (size_t i = 0; i < handles_cap; i++) {
    const void *p = handles[i].p;
    if (!p || p == TOMB)
      continue;
    size_t j = handle_hash(p, ncap);
    while (n[j].p)
      j = (j + 1) & (ncap - 1);
    n[j] = handles[i];
    live++;
  }
  free(handles);
  handles = n;
  handles_cap = ncap;
  handles_used = live;
  return 0;
}

int eng_handle_add(const void *p, enum eng_handle_kind kind) {
  int rc = 0;

  pthread_mutex_lock(&handles_lock);
  if ((handles_used + 1) * 2 > handles_cap && (rc = handles_grow()))
    goto out;
  size_t j = handle_hash(p, handles_cap);
  while (handles[j].p && handles[j].p != TOMB)
    j = (j + 1) & (handles_cap - 1);
  if (!handles[j].p)
    handles_used++;
  handles[j].p = p;
  handles[j].kind = kind;
out:
  pthread_mutex_unlock(&handles_lock);
  return rc;
}

static struct handle_slot *handle_find(const void *p) {
  if (!handles_cap)
    return NULL;
  size_t j = handle_hash(p, handles_cap);
  while (handles[j].p) {
    if (handles[j].p == p)
      return &handles[j];
    j = (j + 1) & (handles_cap - 1);
  }
  return NULL;
}

void eng_handle_remove(const void *p) {
  pthread_mutex_lock(&handles_lock);
  struct handle_slot *s = handle_find(p);
  if (s) {
    s->p = TOMB;
    s->kind = 0;
  }
  pthread_mutex_unlock(&handles_lock);
}

bool eng_handle_valid(const void *p, enum eng_handle_kind kind) {
  bool ok;

  if (!p || p == TOMB)
    return false;
  pthread_mutex_lock(&handles_lock);
  struct handle_slot *s = handle_find(p);
  ok = s && s->kind == (int)kind;
  pthread_mutex_unlock(&handles_lock);
  return ok;
}

/* fork() copies handles_lock as it is: held, when another thread was
 * inside a chorus_* call, and then the child (a data loader's worker) hung
 * for good in handles_fini when it exit()ed. The lock is held across fork,
 * so the child's copy is consistent and free. */
static void handles_prefork(void) {
  pthread_mutex_lock(&handles_lock);
}

static void handles_postfork(void) {
  pthread_mutex_unlock(&handles_lock);
}

__attribute__((constructor)) static void handles_init(void) {
  pthread_atfork(handles_prefork, handles_postfork, handles_postfork);
}

/* Free the registry's table at exit so leak checkers see a clean process. */
__attribute__((destructor)) static void handles_fini(void) {
  pthread_mutex_lock(&handles_lock);
  free(handles);
  handles = NULL;
  handles_cap = handles_used = 0;
  pthread_mutex_unlock(&handles_lock);
}
