/*
 * uid.c - communicators from an id the caller hands around (NCCL's unique
 * id pattern): chorus_get_unique_id, chorus_unique_id_release,
 * chorus_comm_init_rank.
 *
 * The id is text in a fixed block: "chorus-uid-1 HOST:PORT TOKEN NONCE",
 * NUL-padded. chorus_get_unique_id binds rank 0's rendezvous listener at once
 * (a port the kernel picks, so no launcher's port is ever taken) and keeps it
 * in this process's table of pending listeners under the id's nonce; rank 0's
 * chorus_comm_init_rank in the same process takes it from there, so the
 * ranks that connect early find it listening. The token is fresh and random:
 * only holders of the id get past the rendezvous.
 */
#include "bootstrap.h"
#include "comm.h"
#include "eng.h"
#include "settings.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define UID_MAGIC "chorus-uid-1"
#define UID_TOKEN_HEX 32 /* 128 random bits */
#define UID_NONCE_HEX 16

/* A listener made by chorus_get_unique_id that no communicator took yet. */
struct uid_pending {
  struct uid_pending *next;
  char nonce[UID_NONCE_HEX + 1];
  int fd;
};

static pthread_mutex_t uid_lock = PTHREAD_MUTEX_INITIALIZER;
static struct uid_pending *uid_pending_list;

typedef struct uid_parsed {
  char addr[200];
  char token[UID_TOKEN_HEX + 1];
  char nonce[UID_NONCE_HEX + 1];
} uid_parsed_t;

static int random_hex(char *out, size_t nhex) {
  unsigned char raw[32];
  size_t n = (nhex + 1) / 2, got = 0;

  while (got < n) {
    ssize_t r = getrandom(raw + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    got += (size_t)r;
  }
  for (size_t i = 0; i < nhex; i++)
    out[i] = "0123456789abcdef"[(raw[i / 2] >> (i % 2 ? 0 : 4)) & 15];
  out[nhex] = '\0';
  return 0;
}

static bool all_hex(const char *s, size_t n) {
  if (strlen(s) != n)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  return true;
}

/* 0, or -1 when the bytes are not an id of ours. */
static int uid_parse(const chorus_unique_id *id, uid_parsed_t *p) {
  const char *b = id->internal;
  const char *nul = memchr(b, '\0', sizeof(id->internal));
  char fmt[64];

  if (!nul || strncmp(b, UID_MAGIC " ", sizeof(UID_MAGIC)))
    return -1;
  for (const char *q = nul; q < b + sizeof(id->internal); q++)
    if (*q)
      return -1;
  snprintf(fmt, sizeof(fmt), UID_MAGIC " %%%zus %%%ds %%%ds", sizeof(p->addr) - 1, UID_TOKEN_HEX,
           UID_NONCE_HEX);
  if (sscanf(b, fmt, p->addr, p->token, p->nonce) != 3)
    return -1;
  if (!strchr(p->addr, ':') || !all_hex(p->token, UID_TOKEN_HEX) ||
      !all_hex(p->nonce, UID_NONCE_HEX))
    return -1;
  /* nothing after the nonce */
  if (strcmp(b + strlen(b) - UID_NONCE_HEX, p->nonce))
    return -1;
  return 0;
}

/* Take the pending listener of this nonce out of the table: its fd, or -1. */
static int uid_take(const char *nonce) {
  struct uid_pending **pp, *e;
  int fd = -1;

  pthread_mutex_lock(&uid_lock);
  for (pp = &uid_pending_list; *pp; pp = &(*pp)->next) {
    if (!strcmp((*pp)->nonce, nonce)) {
      e = *pp;
      *pp = e->next;
      fd = e->fd;
      free(e);
      break;
    }
  }
  pthread_mutex_unlock(&uid_lock);
  return fd;
}

/* Rank 0's listener: on CHORUS_RENDEZVOUS_ADDR (strict), else MASTER_ADDR
 * when it is this host's, else the interface's address. */
static chorus_result uid_listen(const chorus_settings_t *set, int *fd, char *addr, size_t addrlen) {
  char err[512], host[64];
  const char *master;

  if (set->rendezvous_addr[0]) {
    if (boot_listen(set->rendezvous_addr, fd, addr, addrlen, err, sizeof(err)))
      return eng_error(CHORUS_ERR_BOOTSTRAP, "chorus_get_unique_id: CHORUS_RENDEZVOUS_ADDR: %s",
                       err);
    return CHORUS_SUCCESS;
  }
  master = settings_launch_var("MASTER_ADDR");
  if (master && !boot_listen(master, fd, addr, addrlen, err, sizeof(err)))
    return CHORUS_SUCCESS;
  if (boot_iface_address(set->sock_iface, host, sizeof(host), err, sizeof(err)))
    return eng_error(CHORUS_ERR_BOOTSTRAP, "chorus_get_unique_id: CHORUS_SOCK_IFACE: %s", err);
  if (boot_listen(host, fd, addr, addrlen, err, sizeof(err)))
    return eng_error(CHORUS_ERR_BOOTSTRAP, "chorus_get_unique_id: %s", err);
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_get_unique_id(chorus_unique_id *id) {
  chorus_settings_t *set;
  struct uid_pending *e;
  char err[512], addr[200], token[UID_TOKEN_HEX + 1];
  chorus_result ret;
  int fd = -1, n, rc;

  if (!id)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_get_unique_id: id is NULL");
  memset(id, 0, sizeof(*id));
  /* the settings are large (fault specs, paths): not on the caller's stack */
  set = malloc(sizeof(*set));
  e = calloc(1, sizeof(*e));
  if (!set || !e) {
    ret = eng_error(CHORUS_ERR_NO_MEMORY, "chorus_get_unique_id: out of memory");
    goto out_free;
  }
  if (settings_load(set, err, sizeof(err))) {
    ret = eng_error(CHORUS_ERR_ENV, "chorus_get_unique_id: %s", err);
    goto out_free;
  }
  if ((rc = random_hex(token, UID_TOKEN_HEX)) || (rc = random_hex(e->nonce, UID_NONCE_HEX))) {
    ret = eng_error(CHORUS_ERR_INTERNAL, "chorus_get_unique_id: getrandom: %s", strerror(-rc));
    goto out_free;
  }
  if ((ret = uid_listen(set, &fd, addr, sizeof(addr))))
    goto out_free;
  n = snprintf(id->internal, sizeof(id->internal), UID_MAGIC " %s %s %s", addr, token, e->nonce);
  if (n < 0 || (size_t)n >= sizeof(id->internal)) {
    memset(id, 0, sizeof(*id));
    close(fd);
    ret = eng_error(CHORUS_ERR_INVALID_ARG, "chorus_get_unique_id: address %s too long", addr);
    goto out_free;
  }
  e->fd = fd;
  pthread_mutex_lock(&uid_lock);
  e->next = uid_pending_list;
  uid_pending_list = e;
  pthread_mutex_unlock(&uid_lock);
  free(set);
  return CHORUS_SUCCESS;

out_free:
  free(e);
  free(set);
  return ret;
}

CHORUS_API chorus_result chorus_unique_id_release(const chorus_unique_id *id) {
  uid_parsed_t p;
  int fd;

  if (!id)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_unique_id_release: id is NULL");
  if (uid_parse(id, &p))
    return eng_error(CHORUS_ERR_INVALID_ARG,
                     "chorus_unique_id_release: the bytes are not a Chorus unique id");
  fd = uid_take(p.nonce);
  if (fd >= 0)
    close(fd);
  return CHORUS_SUCCESS;
}

CHORUS_API chorus_result chorus_comm_init_rank(chorus_comm_t **comm, int size,
                                               const chorus_unique_id *id, int rank,
                                               const chorus_init_opts *opts) {
  comm_init_t in = {.who = "chorus_comm_init_rank", .rank = rank, .size = size};
  uid_parsed_t p;

  if (!comm)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_init_rank: comm is NULL");
  *comm = NULL;
  if (!id)
    return eng_error(CHORUS_ERR_INVALID_ARG, "chorus_comm_init_rank: id is NULL");
  if (uid_parse(id, &p))
    return eng_error(CHORUS_ERR_INVALID_ARG,
                     "chorus_comm_init_rank: the id's bytes are not a Chorus unique id (made by "
                     "chorus_get_unique_id and passed on unchanged?)");
  if (opts) {
    if (opts->struct_size < offsetof(chorus_init_opts, connect_timeout_s) + sizeof(double) ||
        opts->struct_size > sizeof(*opts))
      return eng_error(CHORUS_ERR_INVALID_ARG,
                       "chorus_comm_init_rank: opts->struct_size is %zu, expected %zu "
                       "(sizeof(chorus_init_opts))",
                       opts->struct_size, sizeof(*opts));
    if (!(opts->timeout_s >= 0) || !(opts->connect_timeout_s >= 0) || opts->timeout_s > 1e9 ||
        opts->connect_timeout_s > 1e9)
      return eng_error(CHORUS_ERR_INVALID_ARG,
                       "chorus_comm_init_rank: timeouts must be 0 (the setting's) or positive "
                       "seconds, got timeout_s %g, connect_timeout_s %g",
                       opts->timeout_s, opts->connect_timeout_s);
    in.timeout_s = opts->timeout_s;
    in.connect_timeout_s = opts->connect_timeout_s;
  }
  in.rendezvous = p.addr;
  in.token = p.token;
  if (rank == 0 && size >= 1) {
    in.listen_fd = uid_take(p.nonce);
    in.has_listen_fd = in.listen_fd >= 0;
  }
  return comm_init_with(comm, &in);
}
