/*
 * test_doors.c - what a job leaves open to the network, seen from inside
 * its ranks (forked processes, rendezvous on 127.0.0.1), and buffers at any
 * alignment through the collectives.
 *
 *  - sock: with no interface named (neither CHORUS_SOCK_IFACE nor
 *    FI_TCP_IFACE), each rank listens on the address it reached rank 0's
 *    rendezvous from (here loopback, the job being on one host), and once
 *    every peer is connected no rank holds a listening socket at all: the
 *    rendezvous closed when the job formed, sock's listeners when their
 *    last peer came; and the same for a communicator split from it.
 *    libfabric's tcp (which keeps its listener) listens on loopback too,
 *    not on the first interface up.
 *  - allreduce over buffers 1, 2 and 3 bytes off their alignment, every
 *    dtype, over shm and sock: exact (in the sanitizer build, UBSan checks
 *    every load and store of the reduction kernels).
 *  - a rank killed while the communicator forms (CHORUS_FAULTS
 *    kill:at=create#STAGE, each of the four stages, over shm and sock):
 *    every other rank's init ends within two watchdog periods, naming it.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "mp.h"
#include "reduce.h"

TestSuite(doors, .timeout = 240);

/* The TCP sockets of this process: how many listen, and how many are
 * bound to an address other than 127.0.0.1 (named in `bad`). */
static void tcp_sockets(int *listening, int *elsewhere, char *bad, size_t badlen) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *de;

  *listening = *elsewhere = 0;
  bad[0] = '\0';
  if (!d)
    return;
  while ((de = readdir(d))) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss), ol = sizeof(int);
    int fd = atoi(de->d_name), type = 0, acc = 0;
    char ip[INET6_ADDRSTRLEN] = "?";
    bool lo = false;

    if (de->d_name[0] < '0' || de->d_name[0] > '9' || fd == dirfd(d))
      continue;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &ol) || type != SOCK_STREAM ||
        getsockname(fd, (struct sockaddr *)&ss, &sl) ||
        (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
      continue;
    ol = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &ol);
    if (ss.ss_family == AF_INET) {
      struct sockaddr_in *in = (struct sockaddr_in *)&ss;

      inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
      lo = in->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
    } else {
      struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;

      inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
      lo = IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
    }
    *listening += acc != 0;
    if (!lo) {
      (*elsewhere)++;
      snprintf(bad + strlen(bad), badlen - strlen(bad), " fd %d %s on %s;", fd,
               acc ? "listening" : "connected", ip);
    }
  }
  closedir(d);
}

static int sock_job_body(int rank, int size, const char *rdv, void *arg) {
  float in[256], out[256];
  chorus_comm_t *c, *children[1] = {NULL};
  chorus_result rc;
  int listening = -1, elsewhere = -1;
  char bad[512];
  struct timespec pause = {0, 20 * 1000 * 1000};
  /* libfabric's tcp keeps its listener for the communicator's life */
  const bool keeps_listening = arg != NULL;

  unsetenv("FI_TCP_IFACE"); /* ctest sets it: the job must find its address itself */
  rc = chorus_comm_init(&c, rank, size, rdv);
  if (rc) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  for (int i = 0; i < 256; i++)
    in[i] = (float)(rank + i);
  rc = chorus_allreduce(c, in, out, 256, CHORUS_FLOAT32, CHORUS_SUM);
  for (int i = 0; !rc && i < 256; i++) {
    if (out[i] != (float)(size * (size - 1) / 2 + size * i)) {
      fprintf(stderr, "rank %d: element %d is %g\n", rank, i, (double)out[i]);
      return 1;
    }
  }
  if (rc) {
    fprintf(stderr, "rank %d: allreduce: %s\n", rank, chorus_last_error());
    return 1;
  }
  /* a child communicator (chorus_comm_split: no rendezvous of its own)
   * opens its own sock endpoints: they too listen where the parent does */
  if (size > 2) {
    chorus_comm_t *child = NULL;

    rc = chorus_comm_split(c, rank % 2, rank, &child);
    if (!rc && child)
      rc = chorus_allreduce(child, in, out, 256, CHORUS_FLOAT32, CHORUS_SUM);
    if (rc || !child) {
      fprintf(stderr, "rank %d: split: %s\n", rank, chorus_last_error());
      return 1;
    }
    rc = CHORUS_SUCCESS;
    children[0] = child;
  }
  /* every peer has connected by now, or is about to (the progress thread
   * takes the last connections in while this one looks) */
  for (int k = 0; k < 250; k++) {
    tcp_sockets(&listening, &elsewhere, bad, sizeof(bad));
    if (keeps_listening)
      listening = 0;
    if (listening == 0 && elsewhere == 0)
      break;
    nanosleep(&pause, NULL);
  }
  if (listening || elsewhere)
    fprintf(stderr, "rank %d: %d listening sockets, %d off loopback:%s\n", rank, listening,
            elsewhere, bad);
  if (children[0] && chorus_comm_destroy(children[0]))
    rc = CHORUS_ERR_INTERNAL;
  if (chorus_comm_destroy(c))
    rc = CHORUS_ERR_INTERNAL;
  return listening || elsewhere || rc ? 1 : 0;
}

static void sock_job(int size) {
  static const char *const env[] = {"CHORUS_PROVIDER=sock", NULL};
  mp_result_t r = mp_run(size, sock_job_body, NULL, 120.0, env);

  cr_assert_eq(r.timed_out, 0, "the job hung");
  for (int i = 0; i < size; i++)
    cr_assert_eq(r.status[i], 0, "rank %d of %d: status %d (see its lines above)", i, size,
                 r.status[i]);
}

/* libfabric's tcp and udp: listening only where the job is (loopback), not
 * on the first interface up, which libfabric picks by itself. */
static void ofi_job(const char *prov, int size) {
  char p[64];
  snprintf(p, sizeof(p), "CHORUS_PROVIDER=%s", prov);
  const char *const env[] = {p, NULL};
  mp_result_t r = mp_run(size, sock_job_body, (void *)prov, 120.0, env);

  cr_assert_eq(r.timed_out, 0, "the job hung");
  for (int i = 0; i < size; i++)
    cr_assert_eq(r.status[i], 0, "rank %d of %d: status %d (see its lines above)", i, size,
                 r.status[i]);
}

Test(doors, sock_listens_where_the_job_is_and_closes_2) {
  sock_job(2);
}

Test(doors, sock_listens_where_the_job_is_and_closes_4) {
  sock_job(4);
}

Test(doors, tcp_listens_where_the_job_is) {
  ofi_job("tcp", 4);
}

/* ---- buffers at any alignment ---- */

static size_t dt_size(chorus_dtype dt) {
  switch (dt) {
  case CHORUS_INT8:
  case CHORUS_UINT8:
    return 1;
  case CHORUS_FLOAT16:
  case CHORUS_BFLOAT16:
    return 2;
  case CHORUS_INT32:
  case CHORUS_FLOAT32:
    return 4;
  default:
    return 8;
  }
}

/* Element i of rank r's input, small integers every dtype holds exactly. */
static void put_value(chorus_dtype dt, unsigned char *p, int v) {
  switch (dt) {
  case CHORUS_INT8:
  case CHORUS_UINT8: {
    uint8_t x = (uint8_t)v;
    memcpy(p, &x, 1);
    break;
  }
  case CHORUS_FLOAT16: {
    uint16_t x = reduce_float_to_half((float)v);
    memcpy(p, &x, 2);
    break;
  }
  case CHORUS_BFLOAT16: {
    uint16_t x = reduce_float_to_bf16((float)v);
    memcpy(p, &x, 2);
    break;
  }
  case CHORUS_INT32: {
    int32_t x = v;
    memcpy(p, &x, 4);
    break;
  }
  case CHORUS_INT64: {
    int64_t x = v;
    memcpy(p, &x, 8);
    break;
  }
  case CHORUS_FLOAT32: {
    float x = (float)v;
    memcpy(p, &x, 4);
    break;
  }
  default: {
    double x = (double)v;
    memcpy(p, &x, 8);
    break;
  }
  }
}

#define MIS_COUNT 1031

static int misaligned_body(int rank, int size, const char *rdv, void *arg) {
  chorus_comm_t *c;
  chorus_result rc;
  int bad = 0;

  (void)arg;
  rc = chorus_comm_init(&c, rank, size, rdv);
  if (rc) {
    fprintf(stderr, "rank %d: init: %s\n", rank, chorus_last_error());
    return 1;
  }
  for (int dt = 0; dt < CHORUS_DTYPE_COUNT && !bad; dt++) {
    size_t es = dt_size((chorus_dtype)dt), n = MIS_COUNT * es;
    unsigned char *in = malloc(n + 8), *out = malloc(n + 8), *want = malloc(n);

    for (size_t off = 1; off < 4 && in && out && want && !bad; off++) {
      for (int i = 0; i < MIS_COUNT; i++) {
        int sum = 0;

        for (int r = 0; r < size; r++)
          sum += (r + i) % 7;
        put_value((chorus_dtype)dt, in + off + (size_t)i * es, (rank + i) % 7);
        put_value((chorus_dtype)dt, want + (size_t)i * es, sum);
      }
      rc = chorus_allreduce(c, in + off, out + (4 - off), MIS_COUNT, (chorus_dtype)dt, CHORUS_SUM);
      if (rc || memcmp(out + (4 - off), want, n)) {
        fprintf(stderr, "rank %d: %s allreduce at byte offsets %zu/%zu: %s\n", rank,
                chorus_dtype_name((chorus_dtype)dt), off, 4 - off,
                rc ? chorus_last_error() : "wrong result");
        bad = 1;
      }
      /* in place, the same offset */
      memcpy(out + off, in + off, n);
      rc = chorus_allreduce(c, out + off, out + off, MIS_COUNT, (chorus_dtype)dt, CHORUS_SUM);
      if (!bad && (rc || memcmp(out + off, want, n))) {
        fprintf(stderr, "rank %d: %s in-place allreduce at byte offset %zu: %s\n", rank,
                chorus_dtype_name((chorus_dtype)dt), off,
                rc ? chorus_last_error() : "wrong result");
        bad = 1;
      }
    }
    free(in);
    free(out);
    free(want);
  }
  rc = chorus_comm_destroy(c);
  return bad || rc;
}

static void misaligned_job(const char *provider) {
  char p[64];
  const char *env[] = {p, NULL};
  mp_result_t r;

  snprintf(p, sizeof(p), "CHORUS_PROVIDER=%s", provider);
  r = mp_run(2, misaligned_body, NULL, 180.0, env);
  cr_assert_eq(r.timed_out, 0, "the job hung");
  for (int i = 0; i < 2; i++)
    cr_assert_eq(r.status[i], 0, "rank %d over %s: status %d (see its lines above)", i, provider,
                 r.status[i]);
}

Test(doors, misaligned_buffers_shm) {
  misaligned_job("shm");
}

Test(doors, misaligned_buffers_sock) {
  misaligned_job("sock");
}

/* ---- a rank killed while the communicator forms ---- */

#define FORM_RANKS 4
#define FORM_VICTIM 2
#define FORM_WATCHDOG_MS 1000

typedef struct {
  double ended[FORM_RANKS];  /* as its init returned */
  double failed[FORM_RANKS]; /* as its first call failed, when init succeeded */
  int init_rc[FORM_RANKS], rc[FORM_RANKS];
  char err[FORM_RANKS][256];
} form_t;

static int forming_body(int rank, int size, const char *rdv, void *arg) {
  form_t *f = arg;
  chorus_comm_t *c = NULL;
  chorus_result rc;
  float x = 1;

  rc = chorus_comm_init(&c, rank, size, rdv);
  f->ended[rank] = mp_now_s();
  f->init_rc[rank] = f->rc[rank] = rc;
  if (rank == FORM_VICTIM) {
    fprintf(stderr, "rank %d: init returned (%s) although CHORUS_FAULTS kills it there\n", rank,
            chorus_strerror(rc));
    return 1;
  }
  if (rc) {
    snprintf(f->err[rank], sizeof(f->err[rank]), "%s", chorus_last_error());
    return 0;
  }
  /* formed before the victim died (stage 4): the first call names it */
  rc = chorus_allreduce(c, &x, &x, 1, CHORUS_FLOAT32, CHORUS_SUM);
  f->failed[rank] = mp_now_s();
  f->rc[rank] = rc;
  snprintf(f->err[rank], sizeof(f->err[rank]), "%s",
           rc ? chorus_comm_last_error(c) : "the allreduce succeeded");
  chorus_comm_destroy(c);
  return 0;
}

static void killed_while_forming(const char *provider, int stage) {
  char p[64], faults[64], wd[64];
  const char *env[] = {p, faults, wd, "CHORUS_CONNECT_TIMEOUT=30", NULL};
  form_t *f = mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  mp_result_t r;

  cr_assert(f != MAP_FAILED);
  memset(f, 0, sizeof(*f));
  snprintf(p, sizeof(p), "CHORUS_PROVIDER=%s", provider);
  snprintf(faults, sizeof(faults), "CHORUS_FAULTS=kill:rank=%d,at=create#%d", FORM_VICTIM, stage);
  snprintf(wd, sizeof(wd), "CHORUS_WATCHDOG_MS=%d", FORM_WATCHDOG_MS);
  r = mp_run(FORM_RANKS, forming_body, f, 90.0, env);
  cr_assert_eq(r.timed_out, 0, "%s, create#%d: the job hung", provider, stage);
  cr_assert_eq(r.status[FORM_VICTIM], -SIGKILL, "%s, create#%d: rank %d ended with status %d",
               provider, stage, FORM_VICTIM, r.status[FORM_VICTIM]);
  for (int i = 0; i < FORM_RANKS; i++) {
    /* from the victim's death, as mp_run saw it (within 2 ms) */
    double died = r.ended[FORM_VICTIM], waited = f->ended[i] - died;

    if (i == FORM_VICTIM)
      continue;
    if (f->init_rc[i])
      cr_log_info("%s, rank %d killed at create#%d: rank %d's init failed %.3f s after its "
                  "death: %s",
                  provider, FORM_VICTIM, stage, i, waited, f->err[i]);
    else
      cr_log_info("%s, rank %d killed at create#%d: rank %d's init returned %.3f s after its "
                  "death, its first allreduce failed %.3f s after it: %s",
                  provider, FORM_VICTIM, stage, i, waited, f->failed[i] - died, f->err[i]);
    cr_assert_eq(r.status[i], 0, "%s, create#%d: rank %d failed (status %d)", provider, stage, i,
                 r.status[i]);
    cr_assert_neq(f->rc[i], CHORUS_SUCCESS, "%s, create#%d: rank %d: %s", provider, stage, i,
                  f->err[i]);
    cr_assert(strstr(f->err[i], "rank 2"), "%s, create#%d: rank %d's error names no rank 2: %s",
              provider, stage, i, f->err[i]);
    cr_assert_leq(waited, 2.0 * FORM_WATCHDOG_MS / 1000.0,
                  "%s, create#%d: rank %d's init ended %.3f s after rank 2 died: %s", provider,
                  stage, i, waited, f->err[i]);
  }
  munmap(f, sizeof(*f));
}

Test(doors, a_rank_killed_while_forming_shm, .timeout = 400) {
  for (int stage = 1; stage <= 4; stage++)
    killed_while_forming("shm", stage);
}

Test(doors, a_rank_killed_while_forming_sock, .timeout = 400) {
  for (int stage = 1; stage <= 4; stage++)
    killed_while_forming("sock", stage);
}
