/*
 * Communicators from a unique id the caller hands around (NCCL's pattern):
 * rank 0 listens on a port of its own at once, bound to one address, and
 * every rank joins with the id's address and token; bad ids, a tampered
 * token and an address that is not this host's are refused with a message.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "chorus.h"
#include "mp.h"

/* Shared between the forked ranks: rank 0 publishes its id here. */
struct board {
  atomic_int ready; /* the generation of the id published: 1, 2... */
  chorus_unique_id id;
};

static struct board *board_new(void) {
  struct board *b =
      mmap(NULL, sizeof(*b), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert(b != MAP_FAILED);
  memset(b, 0, sizeof(*b));
  return b;
}

/* Rank 0 makes and publishes id number gen; the others wait for it (30 s
 * at most). */
static int board_id_gen(struct board *b, int rank, int gen, chorus_unique_id *id) {
  if (rank == 0) {
    chorus_result rc = chorus_get_unique_id(id);
    if (rc) {
      fprintf(stderr, "chorus_get_unique_id: %s: %s\n", chorus_strerror(rc), chorus_last_error());
      return 1;
    }
    b->id = *id;
    atomic_store(&b->ready, gen);
    return 0;
  }
  for (int i = 0; i < 30000 && atomic_load(&b->ready) != gen; i++)
    usleep(1000);
  if (atomic_load(&b->ready) != gen) {
    fprintf(stderr, "rank %d: no id from rank 0\n", rank);
    return 1;
  }
  *id = b->id;
  return 0;
}

static int board_id(struct board *b, int rank, chorus_unique_id *id) {
  return board_id_gen(b, rank, 1, id);
}

/* The "host:port" an id names (its second word). */
static void id_addr(const chorus_unique_id *id, char *out, size_t len) {
  char word[2][200];
  cr_assert_eq(sscanf(id->internal, "%199s %199s", word[0], word[1]), 2);
  snprintf(out, len, "%s", word[1]);
}

static int allreduce_ok(chorus_comm_t *c, int rank, int size) {
  float v[1000];
  for (int i = 0; i < 1000; i++)
    v[i] = (float)(rank + i);
  chorus_result rc = chorus_allreduce(c, v, v, 1000, CHORUS_FLOAT32, CHORUS_SUM);
  if (rc) {
    fprintf(stderr, "rank %d: allreduce: %s: %s\n", rank, chorus_strerror(rc),
            chorus_comm_last_error(c));
    return 1;
  }
  for (int i = 0; i < 1000; i++)
    if (v[i] != (float)(size * (size - 1) / 2 + size * i)) {
      fprintf(stderr, "rank %d: v[%d] = %g\n", rank, i, v[i]);
      return 1;
    }
  return 0;
}

struct job {
  struct board *board;
  int cycles;
};

static int rank_join(int rank, int size, const char *rv, void *arg) {
  struct job *j = arg;
  chorus_unique_id id;
  chorus_comm_t *c = NULL;
  chorus_init_opts o = {.struct_size = sizeof(o), .timeout_s = 30, .connect_timeout_s = 30};
  int fds0 = mp_count_fds();

  (void)rv;
  for (int cycle = 0; cycle < j->cycles; cycle++) {
    /* a rank reads id cycle + 1 only after the previous communicator's
     * barrier: rank 0 publishes it after that barrier too */
    if (board_id_gen(j->board, rank, cycle + 1, &id))
      return 1;
    chorus_result rc = chorus_comm_init_rank(&c, size, &id, rank, &o);
    if (rc) {
      fprintf(stderr, "rank %d: init_rank: %s: %s\n", rank, chorus_strerror(rc),
              chorus_last_error());
      return 1;
    }
    if (allreduce_ok(c, rank, size))
      return 1;
    /* nobody reads the board again until every rank is past it */
    if (chorus_barrier(c) || chorus_comm_destroy(c))
      return 1;
  }
  if (j->cycles > 1 && mp_count_fds() != fds0) {
    fprintf(stderr, "rank %d: %d fds before, %d after %d cycles\n", rank, fds0, mp_count_fds(),
            j->cycles);
    return 1;
  }
  return 0;
}

TestSuite(uid, .timeout = 240);

/* MASTER_PORT held by someone else (torchrun's store): the id's rendezvous
 * never touches it, and the ranks meet on the port rank 0 got. */
Test(uid, four_ranks_meet_beside_a_held_master_port) {
  int held = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  char port[16], penv[32];
  cr_assert(held >= 0);
  setsockopt(held, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  cr_assert_eq(bind(held, (struct sockaddr *)&a, sizeof(a)), 0);
  cr_assert_eq(listen(held, 16), 0);
  cr_assert_eq(getsockname(held, (struct sockaddr *)&a, &al), 0);
  snprintf(port, sizeof(port), "%u", (unsigned)ntohs(a.sin_port));
  snprintf(penv, sizeof(penv), "MASTER_PORT=%s", port);
  const char *env[] = {"MASTER_ADDR=127.0.0.1", penv, NULL};
  struct job j = {.board = board_new(), .cycles = 1};

  mp_result_t r = mp_run(4, rank_join, &j, 120, env);
  cr_assert_eq(r.failed, 0, "%d ranks failed", r.failed);
  /* MASTER_ADDR is this host's: the id is bound there */
  char addr[200];
  id_addr(&j.board->id, addr, sizeof(addr));
  cr_expect(strncmp(addr, "127.0.0.1:", 10) == 0, "id address %s", addr);
  cr_expect(strcmp(strchr(addr, ':') + 1, port) != 0, "the id took MASTER_PORT %s", port);
  close(held);
}

/* 30 communicators from 30 ids, one after the other: no fd stays behind. */
Test(uid, cycles_leave_no_fd) {
  struct job j = {.board = board_new(), .cycles = 30};
  const char *env[] = {"MASTER_ADDR=127.0.0.1", NULL};
  mp_result_t r = mp_run(2, rank_join, &j, 200, env);
  cr_assert_eq(r.failed, 0, "%d ranks failed", r.failed);
}

Test(uid, listener_bound_to_the_named_address_only) {
  chorus_unique_id id;
  char addr[200];
  struct sockaddr_in a = {.sin_family = AF_INET};
  setenv("CHORUS_RENDEZVOUS_ADDR", "127.0.0.2", 1);
  chorus_result rc = chorus_get_unique_id(&id);
  cr_assert_eq(rc, CHORUS_SUCCESS, "%s", chorus_last_error());
  id_addr(&id, addr, sizeof(addr));
  cr_assert(strncmp(addr, "127.0.0.2:", 10) == 0, "id address %s", addr);
  /* the same port on another loopback address has no listener */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_port = htons((uint16_t)atoi(strchr(addr, ':') + 1));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_expect_neq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0,
                "the listener answers on 127.0.0.1 too");
  close(fd);
  int before = mp_count_fds();
  cr_expect_eq(chorus_unique_id_release(&id), CHORUS_SUCCESS);
  cr_expect_eq(mp_count_fds(), before - 1, "release closed no listener");
  cr_expect_eq(chorus_unique_id_release(&id), CHORUS_SUCCESS, "a second release is a no-op");
  unsetenv("CHORUS_RENDEZVOUS_ADDR");
}

Test(uid, an_address_not_of_this_host_is_refused) {
  chorus_unique_id id;
  setenv("CHORUS_RENDEZVOUS_ADDR", "192.0.2.1", 1); /* TEST-NET-1 */
  chorus_result rc = chorus_get_unique_id(&id);
  cr_expect_eq(rc, CHORUS_ERR_BOOTSTRAP);
  cr_expect(strstr(chorus_last_error(), "CHORUS_RENDEZVOUS_ADDR") &&
                strstr(chorus_last_error(), "not one of this host's"),
            "message: %s", chorus_last_error());
  unsetenv("CHORUS_RENDEZVOUS_ADDR");
  /* MASTER_ADDR elsewhere is no error: the id goes to this host's interface */
  setenv("MASTER_ADDR", "192.0.2.1", 1);
  rc = chorus_get_unique_id(&id);
  cr_expect_eq(rc, CHORUS_SUCCESS, "%s", chorus_last_error());
  cr_expect(strstr(id.internal, "192.0.2.1") == NULL, "id %s", id.internal);
  chorus_unique_id_release(&id);
  unsetenv("MASTER_ADDR");
}

Test(uid, bad_ids_and_options) {
  chorus_unique_id id, bad;
  chorus_comm_t *c = (chorus_comm_t *)&id;
  chorus_init_opts o = {.struct_size = sizeof(o)};

  cr_expect_eq(chorus_get_unique_id(NULL), CHORUS_ERR_INVALID_ARG);
  cr_expect(strstr(chorus_last_error(), "id is NULL"), "%s", chorus_last_error());
  cr_assert_eq(chorus_get_unique_id(&id), CHORUS_SUCCESS, "%s", chorus_last_error());

  memset(&bad, 0, sizeof(bad));
  cr_expect_eq(chorus_comm_init_rank(&c, 2, &bad, 1, NULL), CHORUS_ERR_INVALID_ARG);
  cr_expect_null(c);
  cr_expect(strstr(chorus_last_error(), "not a Chorus unique id"), "%s", chorus_last_error());
  bad = id;
  bad.internal[strlen(bad.internal) - 1] = 'x'; /* nonce no longer hex */
  cr_expect_eq(chorus_comm_init_rank(&c, 2, &bad, 1, NULL), CHORUS_ERR_INVALID_ARG);
  bad = id;
  bad.internal[sizeof(bad.internal) - 1] = 'z'; /* garbage after the text */
  cr_expect_eq(chorus_comm_init_rank(&c, 2, &bad, 1, NULL), CHORUS_ERR_INVALID_ARG);
  cr_expect_eq(chorus_comm_init_rank(&c, 2, NULL, 1, NULL), CHORUS_ERR_INVALID_ARG);
  cr_expect(strstr(chorus_last_error(), "id is NULL"), "%s", chorus_last_error());
  cr_expect_eq(chorus_comm_init_rank(NULL, 2, &id, 1, NULL), CHORUS_ERR_INVALID_ARG);
  cr_expect_eq(chorus_comm_init_rank(&c, 2, &id, 2, NULL), CHORUS_ERR_INVALID_ARG);
  cr_expect(strstr(chorus_last_error(), "rank 2 out of range"), "%s", chorus_last_error());
  cr_expect_eq(chorus_comm_init_rank(&c, 0, &id, 0, NULL), CHORUS_ERR_INVALID_ARG);
  o.struct_size = 3;
  cr_expect_eq(chorus_comm_init_rank(&c, 2, &id, 1, &o), CHORUS_ERR_INVALID_ARG);
  cr_expect(strstr(chorus_last_error(), "struct_size"), "%s", chorus_last_error());
  o.struct_size = sizeof(o);
  o.timeout_s = -1;
  cr_expect_eq(chorus_comm_init_rank(&c, 2, &id, 1, &o), CHORUS_ERR_INVALID_ARG);
  cr_expect(strstr(chorus_last_error(), "timeout"), "%s", chorus_last_error());
  cr_expect_eq(chorus_unique_id_release(&bad), CHORUS_ERR_INVALID_ARG);
  cr_expect_eq(chorus_unique_id_release(NULL), CHORUS_ERR_INVALID_ARG);
  cr_expect_eq(chorus_unique_id_release(&id), CHORUS_SUCCESS);
}

/* A rank whose copy of the id has another token is refused at once. */
static int rank_tampered(int rank, int size, const char *rv, void *arg) {
  struct board *b = arg;
  chorus_unique_id id;
  chorus_comm_t *c = NULL;
  chorus_init_opts o = {.struct_size = sizeof(o), .connect_timeout_s = 4};
  (void)rv;
  if (board_id(b, rank, &id))
    return 1;
  if (rank == 1) {
    char *tok = strchr(strchr(id.internal, ' ') + 1, ' ') + 1;
    tok[0] = tok[0] == 'a' ? 'b' : 'a';
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  chorus_result rc = chorus_comm_init_rank(&c, size, &id, rank, &o);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  if (rc == CHORUS_SUCCESS) {
    fprintf(stderr, "rank %d joined with %s token\n", rank, rank == 1 ? "a wrong" : "the");
    chorus_comm_destroy(c);
    return 1;
  }
  if (rank == 1 && (rc != CHORUS_ERR_AUTH || s > 2.0)) {
    fprintf(stderr, "rank 1: %s after %.1f s: %s\n", chorus_strerror(rc), s, chorus_last_error());
    return 1;
  }
  return 0;
}

Test(uid, a_tampered_token_is_refused) {
  mp_result_t r = mp_run(2, rank_tampered, board_new(), 60, NULL);
  cr_assert_eq(r.failed, 0, "%d ranks failed", r.failed);
}
