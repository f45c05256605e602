/*
 * test_shm_names.c - shm's regions in /dev/shm (prov_ofi.c, "Names"): named
 * from the transport's open until settle, when every peer has mapped them;
 * a peer that closes, dies or never comes fails settle instead of leaving
 * it waiting; reap removes a dead peer's region, and every open sweeps the
 * regions that dead processes of ours left, and nothing else.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "prov.h"
#include "prov_test.h"

#define N 3

static prov_t *eps[N];
static unsigned char addr[N][512];
static const void *addrs[N];
static size_t lens[N];

static void teardown(void) {
  pt_close_job(eps, N);
}

TestSuite(shm_names, .fini = teardown, .timeout = 120);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Files of process pid in /dev/shm ("chorus-PID-..."). */
static int files_of(pid_t pid) {
  char prefix[32];
  int n = 0, plen = snprintf(prefix, sizeof(prefix), "chorus-%d-", (int)pid);
  DIR *d = opendir("/dev/shm");
  struct dirent *e;

  cr_assert_not_null(d);
  while ((e = readdir(d)))
    n += strncmp(e->d_name, prefix, (size_t)plen) == 0;
  closedir(d);
  return n;
}

/* Opens n shm endpoints of one job here, without adding peers. */
static void open_job(int n) {
  static unsigned seq;
  char job[64], err[256];

  snprintf(job, sizeof(job), "names-%d-%u", (int)getpid(), seq++);
  for (int i = 0; i < n; i++) {
    prov_config_t cfg = {.name = "shm", .rank = i, .nranks = n, .job_id = job};
    cr_assert_eq(prov_open(&cfg, &eps[i], err, sizeof(err)), 0, "%s", err);
    lens[i] = sizeof(addr[i]);
    cr_assert_eq(eps[i]->ops->getname(eps[i], addr[i], &lens[i]), 0);
    addrs[i] = addr[i];
  }
}

static void add_peers(int i, int n) {
  cr_assert_eq(eps[i]->ops->add_peers(eps[i], addrs, lens, n), 0, "%s", eps[i]->last_error);
}

/* One message of len bytes from rank a to rank b. */
static void send_one(int a, int b, size_t len) {
  static pt_op_t s, r;
  pt_op_t *all[2] = {&s, &r};
  char *sb = malloc(len + 1), *rb = malloc(len + 1);

  cr_assert(sb && rb);
  pt_op_init(&s);
  pt_op_init(&r);
  s.buf = sb;
  r.buf = rb;
  pt_fill(sb, len, len);
  cr_assert_eq(pt_recv(eps, N, eps[b], a, &r, len, 7, 1000), 0);
  cr_assert_eq(pt_send(eps, N, eps[a], b, &s, len, 7, 5000), 0, "%s", eps[a]->last_error);
  cr_assert(pt_drive(eps, N, all, 2, 20000), "rank %d -> %d, %zu bytes: not done", a, b, len);
  cr_assert_eq(s.status, 0, "%s", eps[a]->last_error);
  cr_assert_eq(r.status, 0, "%s", eps[b]->last_error);
  cr_assert_eq(pt_check(rb, len, len), (size_t)-1, "%zu bytes: wrong data", len);
  free(sb);
  free(rb);
}

/* Every region has its name until settle; the first settle removes them all
 * (every peer had mapped every one), and the job runs on without them. */
Test(shm_names, settle_removes_every_name) {
  open_job(N);
  cr_assert_eq(files_of(getpid()), N, "a region each from the open");
  for (int i = 0; i < N; i++)
    add_peers(i, N);
  cr_assert_eq(files_of(getpid()), N, "add_peers maps, the names stay");
  cr_assert_eq(eps[1]->ops->settle(eps[1], 10.0), 0, "%s", eps[1]->last_error);
  cr_assert_eq(files_of(getpid()), 0, "names left after settle");
  for (int i = 0; i < N; i++)
    cr_assert_eq(eps[i]->ops->settle(eps[i], 10.0), 0, "%s", eps[i]->last_error);
  /* inject, CMA and the bounce slots' sizes, both ways, with no name left */
  static const size_t sizes[] = {1, 4097, 65536, 4 << 20};
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    send_one(0, 2, sizes[k]);
    send_one(2, 1, sizes[k]);
    send_one(1, 0, sizes[k]);
  }
  pt_close_job(eps, N);
  cr_assert_eq(files_of(getpid()), 0);
}

/* A peer that closes before it inserted the others (its creation failed)
 * fails settle at once; the names stay until close. */
Test(shm_names, a_peer_that_closes_first_fails_settle) {
  open_job(2);
  add_peers(0, 2);
  eps[1]->ops->close(eps[1]);
  eps[1] = NULL;
  double t0 = now_s();
  cr_assert_eq(eps[0]->ops->settle(eps[0], 30.0), -ECONNRESET);
  cr_assert_lt(now_s() - t0, 5.0, "settle waited for a peer that had closed");
  cr_assert(strstr(eps[0]->last_error, "rank 1"), "%s", eps[0]->last_error);
  cr_assert_eq(files_of(getpid()), 1, "rank 0's name stays until its close");
  pt_close_job(eps, 2);
  cr_assert_eq(files_of(getpid()), 0);
}

/* A peer that never inserts the others: settle gives up at its timeout. */
Test(shm_names, settle_times_out) {
  open_job(2);
  add_peers(0, 2);
  double t0 = now_s();
  cr_assert_eq(eps[0]->ops->settle(eps[0], 0.3), -ETIMEDOUT);
  cr_assert_geq(now_s() - t0, 0.3);
  cr_assert(strstr(eps[0]->last_error, "rank 1"), "%s", eps[0]->last_error);
  add_peers(1, 2);
  cr_assert_eq(eps[1]->ops->settle(eps[1], 10.0), 0, "%s", eps[1]->last_error);
  cr_assert_eq(files_of(getpid()), 0);
}

/* A peer killed after it published its address, before it inserted ours:
 * settle finds it dead, and reap removes the region it left. */
Test(shm_names, a_peer_killed_before_settle_is_reaped) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    prov_config_t cfg = {.name = "shm", .rank = 1, .nranks = 2, .job_id = "names-killed"};
    unsigned char mine[512];
    size_t mylen = sizeof(mine);
    char err[256];
    prov_t *p;
    close(sv[0]);
    if (prov_open(&cfg, &p, err, sizeof(err)) || p->ops->getname(p, mine, &mylen) ||
        write(sv[1], mine, mylen) != (ssize_t)mylen)
      _exit(1);
    for (;;)
      pause(); /* never inserts the peers */
  }
  close(sv[1]);
  prov_config_t cfg = {.name = "shm", .rank = 0, .nranks = 2, .job_id = "names-killed"};
  char err[256];
  cr_assert_eq(prov_open(&cfg, &eps[0], err, sizeof(err)), 0, "%s", err);
  lens[0] = sizeof(addr[0]);
  cr_assert_eq(eps[0]->ops->getname(eps[0], addr[0], &lens[0]), 0);
  ssize_t got = read(sv[0], addr[1], sizeof(addr[1]));
  cr_assert_gt(got, 0, "the child published no address");
  lens[1] = (size_t)got;
  addrs[0] = addr[0];
  addrs[1] = addr[1];
  add_peers(0, 2);
  cr_assert_eq(files_of(child), 1, "the child's region");
  kill(child, SIGKILL);
  int status;
  cr_assert_eq(waitpid(child, &status, 0), child);
  close(sv[0]);
  cr_assert_eq(eps[0]->ops->settle(eps[0], 30.0), -ECONNRESET);
  cr_assert(strstr(eps[0]->last_error, "ended"), "%s", eps[0]->last_error);
  cr_assert_eq(files_of(child), 1, "a killed process can not remove its region");
  cr_assert_geq(eps[0]->ops->reap(eps[0]), 1);
  cr_assert_eq(files_of(child), 0, "reap left the dead peer's region");
}

/* ---- the sweep ---- */

static unsigned long long my_start(void) {
  char buf[1024];
  FILE *f = fopen("/proc/self/stat", "r");
  cr_assert_not_null(f);
  cr_assert_not_null(fgets(buf, sizeof(buf), f));
  fclose(f);
  const char *p = strrchr(buf, ')');
  cr_assert_not_null(p);
  for (int field = 2; field < 22; field++)
    cr_assert_not_null(p = strchr(p + 1, ' '));
  return strtoull(p + 1, NULL, 10);
}

static unsigned long long my_pidns(void) {
  struct stat st;
  cr_assert_eq(stat("/proc/self/ns/pid", &st), 0);
  return (unsigned long long)st.st_ino;
}

/* A pid no process has any more: a child's, reaped. */
static pid_t dead_pid(void) {
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0)
    _exit(0);
  cr_assert_eq(waitpid(pid, NULL, 0), pid);
  return pid;
}

static void make(const char *name, bool dir) {
  char path[300];
  snprintf(path, sizeof(path), "/dev/shm/%s", name);
  if (dir) {
    cr_assert_eq(mkdir(path, 0700), 0, "%s: %s", path, strerror(errno));
  } else {
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    close(fd);
  }
}

static bool there(const char *name) {
  char path[300];
  struct stat st;
  snprintf(path, sizeof(path), "/dev/shm/%s", name);
  return lstat(path, &st) == 0;
}

static void gone(const char *name) {
  char path[300];
  snprintf(path, sizeof(path), "/dev/shm/%s", name);
  if (unlink(path))
    rmdir(path);
}

/* Removed: regions of our PID namespace whose process is gone, or whose pid
 * has another process now (another start time). Kept: a live process's, one
 * from another namespace (its pid means another process here), a name of
 * another form, another user's, and what is not a file. */
Test(shm_names, the_sweep_removes_only_what_is_proven_stale) {
  unsigned long long start = my_start(), ns = my_pidns();
  pid_t dead = dead_pid(), me = getpid();
  char dead_ours[128], reused[128], alive[128], other_ns[128], old_form[128], other_user[128],
      a_dir[128];
  const char *fmt = "chorus-%d-0-00000000000000%02x-%llu-%llu";
  snprintf(dead_ours, sizeof(dead_ours), fmt, (int)dead, 1, start, ns);
  snprintf(reused, sizeof(reused), fmt, (int)me, 2, start + 1, ns);
  snprintf(alive, sizeof(alive), fmt, (int)me, 3, start, ns);
  snprintf(other_ns, sizeof(other_ns), fmt, (int)dead, 4, start, ns + 1);
  snprintf(old_form, sizeof(old_form), "chorus-%d-0-00000000000000%02x", (int)dead, 5);
  snprintf(other_user, sizeof(other_user), fmt, (int)dead, 6, start, ns);
  snprintf(a_dir, sizeof(a_dir), fmt, (int)dead, 7, start, ns);
  make(dead_ours, false);
  make(reused, false);
  make(alive, false);
  make(other_ns, false);
  make(old_form, false);
  make(other_user, false);
  make(a_dir, true);
  char path[300];
  snprintf(path, sizeof(path), "/dev/shm/%s", other_user);
  bool chowned = chown(path, 65534, 65534) == 0; /* root only */
  if (!chowned)
    gone(other_user);

  /* the next communicator's transport */
  prov_config_t cfg = {.name = "shm", .rank = 0, .nranks = 1, .job_id = "names-sweep"};
  char err[256];
  cr_assert_eq(prov_open(&cfg, &eps[0], err, sizeof(err)), 0, "%s", err);

  bool r_dead = there(dead_ours), r_reused = there(reused), r_alive = there(alive),
       r_other_ns = there(other_ns), r_old = there(old_form), r_user = chowned && there(other_user),
       r_dir = there(a_dir);
  gone(reused);
  gone(alive);
  gone(dead_ours);
  gone(other_ns);
  gone(old_form);
  gone(other_user);
  gone(a_dir);
  cr_expect(!r_dead, "a dead process's region stayed");
  cr_expect(!r_reused, "a region whose pid has another process now stayed");
  cr_expect(r_alive, "a live process's region was removed");
  cr_expect(r_other_ns, "a region of another PID namespace was removed");
  cr_expect(r_old, "a name of another form was removed");
  cr_expect(!chowned || r_user, "another user's region was removed");
  cr_expect(r_dir, "a directory was removed");
}
