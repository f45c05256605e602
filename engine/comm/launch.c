/*
 * launch.c - chorus_comm_init_from_env: a communicator from the launcher's
 * variables (settings.c reads them all), rank 0 found through what the
 * launcher already runs.
 *
 * Where rank 0's rendezvous is:
 *  - CHORUS_RENDEZVOUS=host:port (chorus-run, or by hand): rank 0 listens
 *    there, every rank connects (chorus_comm_init).
 *  - else MASTER_ADDR:MASTER_PORT (torchrun; Slurm or mpirun scripts written
 *    for torch): a TCPStore listens there, or will (torchrun's agent store,
 *    or the one dist.init_process_group starts), so Chorus never binds it:
 *
 *      a TCPStore answers (tcpstore.c)    nothing listens (refused)
 *        rank 0: chorus_get_unique_id       rank 0 listens at once on
 *          (a port the kernel picks),         CHORUS_RENDEZVOUS_PORT, else
 *          SET key = the id                   MASTER_PORT+1; every rank
 *        others: WAIT key, GET key            meets there
 *        all: chorus_comm_init_rank
 *
 *    key = /chorus/from_env/<TORCHELASTIC_RESTART_COUNT or 0>/<n>, n
 *    counting this process's inits through MASTER_ADDR (1, 2...): the same on
 *    every rank of a job that makes its communicators in the same order, and
 *    new after torchrun restarts its workers (the agent's store outlives
 *    them). "/" first, as torch's Python API writes its own keys, so that
 *    store.get("chorus/from_env/0/1") reads it.
 *  - Slurm and Open MPI without either: an error that says what to set
 *    (settings.c).
 */
#include "comm.h"
#include "eng.h"
#include "settings.h"
#include "tcpstore.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WHO "chorus_comm_init_from_env"
/* rank 0 waits this long for its own port to be free (TIME_WAIT, a
 * communicator of this process still closing) before naming its holder */
#define OWN_PORT_RETRY_S 1.0

static atomic_uint launch_inits; /* inits through MASTER_ADDR:MASTER_PORT so far */

static double now_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A port in 1-65535, or -1. */
static long parse_port(const char *s) {
  char *end;
  long p;

  if (!s || *s < '0' || *s > '9')
    return -1;
  errno = 0;
  p = strtol(s, &end, 10);
  return errno || *end || p < 1 || p > 65535 ? -1 : p;
}

/* A listening socket on host:port (host's address only when numeric, else
 * every interface), nonblocking; -errno on failure. Retries while the port
 * is in use, until the deadline. */
static int own_listen(const char *host, uint16_t port, double deadline) {
  struct sockaddr_storage ss;
  socklen_t sl;
  int fd, one = 1, zero = 0, rc;

  for (;;) {
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    bool any = false;

    memset(&ss, 0, sizeof(ss));
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
      a4->sin_family = AF_INET;
      a4->sin_port = htons(port);
      sl = sizeof(*a4);
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
      a6->sin6_family = AF_INET6;
      a6->sin6_port = htons(port);
      sl = sizeof(*a6);
    } else {
      a6->sin6_family = AF_INET6;
      a6->sin6_addr = in6addr_any;
      a6->sin6_port = htons(port);
      sl = sizeof(*a6);
      any = true;
    }
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 && any) { /* no IPv6: every IPv4 interface */
      memset(&ss, 0, sizeof(ss));
      a4->sin_family = AF_INET;
      a4->sin_addr.s_addr = htonl(INADDR_ANY);
      a4->sin_port = htons(port);
      sl = sizeof(*a4);
      fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    }
    if (fd < 0)
      return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ss.ss_family == AF_INET6 && any)
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (bind(fd, (struct sockaddr *)&ss, sl) == 0 && listen(fd, 4096) == 0)
      return fd;
    rc = -errno;
    close(fd);
    if (rc != -EADDRINUSE || now_s() >= deadline)
      return rc;
    usleep(20000);
  }
}

/* Nothing listens at MASTER_ADDR:MASTER_PORT: rank 0 listens on a port of
 * its own, CHORUS_RENDEZVOUS_PORT or MASTER_PORT + 1, never on MASTER_PORT
 * itself (a dist.init_process_group later in the job starts its store
 * there). */
static chorus_result init_own_port(chorus_comm_t **comm, const chorus_launch_env_t *e,
                                   const char *host, long master_port) {
  const char *pv = settings_launch_var("CHORUS_RENDEZVOUS_PORT");
  comm_init_t in = {.who = WHO, .rank = e->rank, .size = e->size};
  char rdv[600], why[64], holder[600];
  long p;
  int fd;

  if (pv) {
    p = parse_port(pv);
    if (p < 0)
      return eng_error(CHORUS_ERR_ENV, "CHORUS_RENDEZVOUS_PORT='%.40s' is not a port (1-65535)",
                       pv);
    if (p == master_port)
      return eng_error(CHORUS_ERR_ENV,
                       "CHORUS_RENDEZVOUS_PORT=%ld is MASTER_PORT, which torch's store takes: "
                       "choose another port",
                       p);
    snprintf(why, sizeof(why), "CHORUS_RENDEZVOUS_PORT");
  } else {
    if (master_port == 65535)
      return eng_error(CHORUS_ERR_ENV,
                       "rank %d: " WHO ": nothing listens at MASTER_ADDR:MASTER_PORT %s:%ld, and "
                       "rank 0's rendezvous would take MASTER_PORT+1, which does not exist: set "
                       "CHORUS_RENDEZVOUS_PORT",
                       e->rank, host, master_port);
    p = master_port + 1;
    snprintf(why, sizeof(why), "MASTER_PORT+1");
  }
  snprintf(rdv, sizeof(rdv), strchr(host, ':') ? "[%s]:%ld" : "%s:%ld", host, p);
  in.rendezvous = rdv;
  eng_log(ENG_INFO, e->rank, "launch",
          "nothing listens at MASTER_ADDR:MASTER_PORT %s:%ld (no TCPStore there yet): rank 0's "
          "rendezvous is %s (%s)",
          host, master_port, rdv, why);
  if (e->rank == 0) {
    fd = own_listen(host, (uint16_t)p, now_s() + OWN_PORT_RETRY_S);
    if (fd == -EADDRINUSE) {
      tcpstore_t *st;
      char port[24], err[512];

      /* name the holder where it can be named: a store of another job */
      snprintf(port, sizeof(port), "%ld", p);
      if (tcpstore_open(host, port, 1.0, &st, err, sizeof(err)) == 0) {
        snprintf(holder, sizeof(holder),
                 "a torch TCPStore holds it (another job's MASTER_PORT, e.g. torchrun "
                 "--master_port %ld?)",
                 p);
        tcpstore_close(st);
      } else {
        snprintf(holder, sizeof(holder), "another process holds it");
      }
      return eng_error(CHORUS_ERR_BOOTSTRAP,
                       "rank 0: " WHO ": nothing listens at MASTER_ADDR:MASTER_PORT %s:%ld (no "
                       "TCPStore there yet), so rank 0's rendezvous takes %s, port %ld; but %s: "
                       "set CHORUS_RENDEZVOUS_PORT to a free port (the same on every rank)",
                       host, master_port, why, p, holder);
    }
    if (fd < 0)
      return eng_error(
          CHORUS_ERR_BOOTSTRAP, "rank 0: " WHO ": cannot listen for the rendezvous on %s: %s%s",
          rdv, strerror(-fd),
          fd == -EADDRNOTAVAIL ? " (MASTER_ADDR is not an address of this host, where rank 0 runs)"
                               : "");
    in.has_listen_fd = true;
    in.listen_fd = fd;
  }
  return comm_init_with(comm, &in);
}

/* The id from rank 0, through the store (ranks other than 0). */
static chorus_result fetch_id(tcpstore_t *st, const chorus_launch_env_t *e, const char *key,
                              double timeout_s, chorus_unique_id *id) {
  char err[1024];
  size_t len;
  int rc;

  rc = tcpstore_wait(st, key, timeout_s, err, sizeof(err));
  if (rc == -ETIMEDOUT)
    return eng_error(CHORUS_ERR_TIMEOUT,
                     "rank %d: " WHO ": rank 0 did not put its rendezvous address under key '%s' "
                     "of the TCPStore at %s (MASTER_ADDR:MASTER_PORT) within %.0f s "
                     "(CHORUS_CONNECT_TIMEOUT): did rank 0 call " WHO " as often as this rank?",
                     e->rank, key, tcpstore_addr(st), timeout_s);
  if (rc)
    return eng_error(CHORUS_ERR_BOOTSTRAP,
                     "rank %d: " WHO ": waiting for rank 0's rendezvous address under key '%s': "
                     "%s",
                     e->rank, key, err);
  memset(id, 0, sizeof(*id));
  rc = tcpstore_get(st, key, id->internal, sizeof(id->internal) - 1, &len, timeout_s, err,
                    sizeof(err));
  if (rc == -EMSGSIZE)
    return eng_error(CHORUS_ERR_BOOTSTRAP,
                     "rank %d: " WHO ": the value under key '%s' is no Chorus rendezvous "
                     "address: %s",
                     e->rank, key, err);
  if (rc)
    return eng_error(CHORUS_ERR_BOOTSTRAP,
                     "rank %d: " WHO ": reading rank 0's rendezvous address under key '%s': %s",
                     e->rank, key, err);
  return CHORUS_SUCCESS;
}

/* Rank 0's address through the TCPStore at MASTER_ADDR:MASTER_PORT. */
static chorus_result init_via_master(chorus_comm_t **comm, const chorus_launch_env_t *e) {
  const char *addr = settings_launch_var("MASTER_ADDR");
  const char *port = settings_launch_var("MASTER_PORT");
  const char *restart = settings_launch_var("TORCHELASTIC_RESTART_COUNT");
  unsigned n = atomic_fetch_add(&launch_inits, 1) + 1;
  char host[300], key[128], err[1024];
  chorus_settings_t *set;
  chorus_unique_id id;
  chorus_result ret;
  tcpstore_t *st;
  double timeout_s;
  size_t hl;
  int rc;

  if (!addr || !port || parse_port(port) < 0) /* settings_launch_env checked them */
    return eng_error(CHORUS_ERR_ENV, WHO ": MASTER_ADDR and MASTER_PORT are not set alike");
  if (restart && (strspn(restart, "0123456789") != strlen(restart) || strlen(restart) > 9))
    return eng_error(CHORUS_ERR_ENV,
                     "TORCHELASTIC_RESTART_COUNT='%.40s' is not a count (a whole number)", restart);
  hl = strlen(addr);
  if (hl >= sizeof(host) || (addr[0] == '[' && (hl < 3 || addr[hl - 1] != ']')))
    return eng_error(CHORUS_ERR_ENV, "MASTER_ADDR='%.60s' is not a host", addr);
  /* "[v6]" as a bare address for the resolver */
  snprintf(host, sizeof(host), "%.*s", (int)(addr[0] == '[' ? hl - 2 : hl),
           addr + (addr[0] == '['));
  snprintf(key, sizeof(key), "/chorus/from_env/%s/%u", restart ? restart : "0", n);
  /* the settings are large (fault specs, paths): not on the caller's stack */
  if (!(set = malloc(sizeof(*set))))
    return eng_error(CHORUS_ERR_NO_MEMORY, WHO ": out of memory");
  if (settings_load(set, err, sizeof(err))) {
    free(set);
    return eng_error(CHORUS_ERR_ENV, "rank %d: %s", e->rank, err);
  }
  timeout_s = set->connect_timeout_s;
  free(set);

  rc = tcpstore_open(host, port, timeout_s, &st, err, sizeof(err));
  if (rc == -ECONNREFUSED)
    return init_own_port(comm, e, host, parse_port(port));
  if (rc)
    return eng_error(rc == -ETIMEDOUT ? CHORUS_ERR_TIMEOUT : CHORUS_ERR_BOOTSTRAP,
                     "rank %d: " WHO ": rank 0's rendezvous address goes through the TCPStore at "
                     "MASTER_ADDR:MASTER_PORT (torchrun's, or dist.init_process_group's), but %s",
                     e->rank, err);
  eng_log(ENG_INFO, e->rank, "launch", "rendezvous through the TCPStore at %s (torch %s), key %s",
          tcpstore_addr(st), tcpstore_protocol(st) == TCPSTORE_V1 ? "1.x" : "2.x", key);
  if (e->rank == 0) {
    if ((ret = chorus_get_unique_id(&id))) {
      tcpstore_close(st);
      return ret;
    }
    rc = tcpstore_set(st, key, id.internal, strlen(id.internal), timeout_s, err, sizeof(err));
    tcpstore_close(st);
    if (rc) {
      chorus_unique_id_release(&id);
      return eng_error(rc == -ETIMEDOUT ? CHORUS_ERR_TIMEOUT : CHORUS_ERR_BOOTSTRAP,
                       "rank 0: " WHO ": putting the rendezvous address under key '%s': %s", key,
                       err);
    }
  } else {
    ret = fetch_id(st, e, key, timeout_s, &id);
    tcpstore_close(st);
    if (ret)
      return ret;
  }
  ret = chorus_comm_init_rank(comm, e->size, &id, e->rank, NULL);
  if (ret == CHORUS_ERR_INVALID_ARG && e->rank != 0)
    return eng_error(CHORUS_ERR_BOOTSTRAP,
                     "rank %d: " WHO ": the value under key '%s' of the TCPStore at %s:%s is no "
                     "Chorus rendezvous address (\"%.60s\"): another program's key?",
                     e->rank, key, host, port, id.internal);
  return ret;
}

CHORUS_API chorus_result chorus_comm_init_from_env(chorus_comm_t **comm) {
  chorus_launch_env_t e;
  char err[1024];

  if (!comm)
    return eng_error(CHORUS_ERR_INVALID_ARG, WHO ": comm is NULL");
  *comm = NULL;
  if (settings_launch_env(&e, err, sizeof(err)))
    return eng_error(CHORUS_ERR_ENV, "%s", err);
  if (!settings_launch_var("CHORUS_RENDEZVOUS")) /* then MASTER_ADDR and MASTER_PORT are set */
    return init_via_master(comm, &e);
  return comm_init_with(
      comm, &(comm_init_t){.who = WHO, .rank = e.rank, .size = e.size, .rendezvous = e.rendezvous});
}
