/*
 * test_left_behind.c - nothing a job's processes made outlives them in
 * /dev/shm (issue 43), however they end.
 *
 * Each run starts 4 ranks of left_behind_rank (creation, 20 allreduces of
 * 64 KiB, destroy), by hand as torchrun, srun and mpirun do (nobody cleans
 * up after them) or under chorus-run, and has one rank, or all, die at a
 * random point: SIGKILL or exit(1) without chorus_comm_destroy, during
 * creation (at a random time, or within microseconds of its shm region
 * showing in /dev/shm, before its peers have mapped it), in a collective or
 * in destroy. The other ranks fail as a trainer would: they destroy, or
 * exit(1) at once. Then /dev/shm must hold nothing of the job's processes
 * that was not there before: over shm, over sock (which makes nothing
 * there at all) and over shm+sock (CHORUS_TOPO: two emulated hosts).
 *
 * When every rank dies at once while regions still have names (the few
 * milliseconds of creation before every peer has mapped them), nobody is
 * left to remove them: the next communicator created on the host does
 * (its transport's open sweeps what is proven stale), and the test checks
 * that it does.
 *
 * Every rank also reports how many files of its own it finds in /dev/shm
 * right after chorus_comm_init returned: none, whatever the transport.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mp.h"
#include "prov.h"

extern char **environ;

#define RANK_PROG CHORUS_BUILD_DIR "/tests/guest/left_behind_rank"
#define LAUNCHER CHORUS_BUILD_DIR "/tools/chorus-run"
#define NRANKS 4
#define JOB_LIMIT_S 60.0
#define MAX_NAMES 4096

TestSuite(left_behind, .timeout = 900);

static unsigned seed;

static void init_seed(void) {
  const char *s = getenv("LEFT_BEHIND_SEED");
  seed = s ? (unsigned)strtoul(s, NULL, 0) : (unsigned)time(NULL) ^ (unsigned)getpid();
  cr_log_info("left_behind: LEFT_BEHIND_SEED=%u", seed);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- /dev/shm ---- */

typedef struct names {
  int n;
  char *name[MAX_NAMES];
} names_t;

static void names_read(names_t *s) {
  DIR *d = opendir("/dev/shm");
  struct dirent *e;

  cr_assert_not_null(d);
  s->n = 0;
  while ((e = readdir(d)) && s->n < MAX_NAMES)
    if (e->d_name[0] != '.')
      s->name[s->n++] = strdup(e->d_name);
  closedir(d);
}

static void names_free(names_t *s) {
  for (int i = 0; i < s->n; i++)
    free(s->name[i]);
  s->n = 0;
}

static bool names_has(const names_t *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->name[i], name) == 0)
      return true;
  return false;
}

/* Whether a /dev/shm entry was made by process pid: Chorus's regions
 * ("chorus-PID-..."), or libfabric's own names ("PID:..."). */
static bool made_by(const char *name, int pid) {
  int p;
  char tail;
  unsigned a, b;
  return (sscanf(name, "chorus-%d-", &p) == 1 ||
          sscanf(name, "%d:%u:%u%c", &p, &a, &b, &tail) == 3) &&
         p == pid;
}

/* ---- a job ---- */

typedef struct job {
  const char *prov; /* CHORUS_PROVIDER */
  const char *topo; /* CHORUS_TOPO, or NULL */
  bool launcher;    /* under chorus-run */
  char die[8];      /* LB_DIE: a rank, or "all" */
  bool by_exit;     /* exit(1) instead of SIGKILL */
  char when[32];    /* LB_WHEN */
  bool exit_on_error;
} job_t;

typedef struct outcome {
  int pids[NRANKS * 2], npids;
  int named_after_init; /* files a rank found of its own once creation returned (sum) */
  int inits;            /* ranks whose creation returned */
  int deaths;           /* ranks that died as planned */
  int done_ok;          /* ranks that ended their calls and destroy without an error */
  int died_named;       /* deaths with a region of the dying rank still named */
  char phases[128];     /* where the dying ranks were */
  int left;             /* files of the job's processes left */
  char left_names[512];
  double wall;
} outcome_t;

static void env_add(char **env, int *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void env_add(char **env, int *n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cr_assert_geq(vasprintf(&env[(*n)++], fmt, ap), 0);
  va_end(ap);
  env[*n] = NULL;
}

static pid_t spawn(char *const argv[], char **env) {
  posix_spawn_file_actions_t fa;
  pid_t pid;

  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, env);
  posix_spawn_file_actions_destroy(&fa);
  cr_assert_eq(rc, 0, "posix_spawn %s: %s", argv[0], strerror(rc));
  return pid;
}

/* Waits for every child in pids (-1: done) until the deadline, then kills. */
static void wait_all(pid_t *pids, int n, double deadline) {
  int left = n;
  while (left > 0) {
    for (int i = 0; i < n; i++)
      if (pids[i] > 0 && waitpid(pids[i], NULL, WNOHANG) == pids[i]) {
        pids[i] = -1;
        left--;
      }
    if (!left)
      break;
    if (now_s() > deadline) {
      for (int i = 0; i < n; i++)
        if (pids[i] > 0)
          kill(pids[i], SIGKILL);
      deadline = now_s() + 3600;
      cr_log_info("left_behind: a job ran past %g s: killed", JOB_LIMIT_S);
    }
    usleep(2000);
  }
}

static void read_report(const char *path, outcome_t *o) {
  FILE *f = fopen(path, "r");
  char line[256];

  cr_assert_not_null(f, "no report from the ranks");
  while (fgets(line, sizeof(line), f)) {
    int pid, rank, v;
    char what[32];
    if (sscanf(line, "start %d %d", &pid, &rank) == 2 && o->npids < NRANKS * 2) {
      o->pids[o->npids++] = pid;
    } else if (sscanf(line, "init %d %d %d", &pid, &rank, &v) == 3) {
      o->inits++;
      o->named_after_init += v;
    } else if (sscanf(line, "done %d %d %d", &pid, &rank, &v) == 3) {
      o->done_ok += v == 0;
    } else if (sscanf(line, "die %d %d %31s %d", &pid, &rank, what, &v) == 4) {
      o->deaths++;
      o->died_named += v > 0;
      size_t l = strlen(o->phases);
      snprintf(o->phases + l, sizeof(o->phases) - l, "%s%d:%s%s", l ? " " : "", rank, what,
               v > 0 ? "(named)" : "");
    }
  }
  fclose(f);
}

/* Files of the job's processes in /dev/shm that were not there before;
 * removed too with `remove` (once counted: a failed run must not leave them
 * on the machine). */
static void count_left(const names_t *before, outcome_t *o, bool remove) {
  names_t after;
  names_read(&after);
  o->left = 0;
  o->left_names[0] = '\0';
  for (int i = 0; i < after.n; i++) {
    if (names_has(before, after.name[i]))
      continue;
    for (int k = 0; k < o->npids; k++)
      if (made_by(after.name[i], o->pids[k])) {
        size_t l = strlen(o->left_names);
        snprintf(o->left_names + l, sizeof(o->left_names) - l, " %s", after.name[i]);
        o->left++;
        if (remove) {
          char path[300];
          snprintf(path, sizeof(path), "/dev/shm/%s", after.name[i]);
          unlink(path);
        }
        break;
      }
  }
  names_free(&after);
}

static void run_job(const job_t *j, const names_t *before, outcome_t *o) {
  char report[] = "/tmp/left_behind_XXXXXX";
  int fd = mkstemp(report);
  cr_assert_geq(fd, 0);
  close(fd);
  memset(o, 0, sizeof(*o));

  char *env[256];
  int n = 0;
  for (char **e = environ; *e && n < 200; e++)
    if (strncmp(*e, "CHORUS_", 7) != 0 && strncmp(*e, "LB_", 3) != 0)
      env[n++] = *e; /* borrowed: not freed below */
  int own = n;
  env[n] = NULL;
  env_add(env, &n, "CHORUS_PROVIDER=%s", j->prov);
  if (j->topo)
    env_add(env, &n, "CHORUS_TOPO=%s", j->topo);
  env_add(env, &n, "CHORUS_CONNECT_TIMEOUT=8");
  env_add(env, &n, "CHORUS_TIMEOUT=8");
  env_add(env, &n, "CHORUS_PEER_TIMEOUT=3");
  env_add(env, &n, "CHORUS_LOG=%s", getenv("CHORUS_LOG") ? getenv("CHORUS_LOG") : "error");
  env_add(env, &n, "LB_REPORT=%s", report);
  env_add(env, &n, "LB_DIE=%s", j->die);
  env_add(env, &n, "LB_HOW=%s", j->by_exit ? "exit" : "kill");
  env_add(env, &n, "LB_WHEN=%s", j->when);
  env_add(env, &n, "LB_ON_ERROR=%s", j->exit_on_error ? "exit" : "destroy");

  double t0 = now_s();
  if (j->launcher) {
    char *argv[] = {LAUNCHER, "-n", "4", "--", RANK_PROG, NULL};
    pid_t pid = spawn(argv, env);
    wait_all(&pid, 1, t0 + JOB_LIMIT_S);
  } else {
    pid_t pids[NRANKS];
    int port = mp_free_port();
    for (int r = 0; r < NRANKS; r++) {
      int m = n;
      env_add(env, &m, "LB_RANK=%d", r);
      env_add(env, &m, "LB_SIZE=%d", NRANKS);
      env_add(env, &m, "LB_RENDEZVOUS=127.0.0.1:%d", port);
      char *argv[] = {RANK_PROG, NULL};
      pids[r] = spawn(argv, env);
      for (int k = n; k < m; k++)
        free(env[k]);
      env[n] = NULL;
    }
    wait_all(pids, NRANKS, t0 + JOB_LIMIT_S);
  }
  o->wall = now_s() - t0;
  for (int k = own; k < n; k++)
    free(env[k]);
  read_report(report, o);
  unlink(report);
  count_left(before, o, false);
}

/* What the next communicator on the host does first: its shm transport's
 * open sweeps what dead processes of ours left. */
static void open_next_transport(void) {
  prov_config_t cfg = {.name = "shm", .rank = 0, .nranks = 1, .job_id = "left-behind-next"};
  char err[256];
  prov_t *p = NULL;

  cr_assert_eq(prov_open(&cfg, &p, err, sizeof(err)), 0, "%s", err);
  p->ops->close(p);
}

/* ---- the runs ---- */

typedef struct tally {
  int runs, named_runs, left_runs, left_files, swept_runs, left_after_sweep;
} tally_t;

static void random_when(char *buf, size_t len, int which) {
  switch (which) {
  case 0: /* anywhere in creation: the bootstrap, the transport, settle */
    snprintf(buf, len, "init:%u", rand_r(&seed) % 400000);
    break;
  case 1: /* while the region has its name: before every peer mapped it */
    snprintf(buf, len, "window:%u", rand_r(&seed) % 300);
    break;
  case 2:
    snprintf(buf, len, "coll:%u:%u", rand_r(&seed) % 20, rand_r(&seed) % 3000);
    break;
  default:
    snprintf(buf, len, "destroy:%u", rand_r(&seed) % 2000);
    break;
  }
}

static void one_run(const char *prov, const char *topo, bool launcher, bool all, bool by_exit,
                    int which, bool exit_on_error, tally_t *t) {
  job_t j = {.prov = prov,
             .topo = topo,
             .launcher = launcher,
             .by_exit = by_exit,
             .exit_on_error = exit_on_error};
  names_t before;
  outcome_t o;

  if (which < 0)
    snprintf(j.die, sizeof(j.die), "none");
  else if (all)
    snprintf(j.die, sizeof(j.die), "all");
  else
    snprintf(j.die, sizeof(j.die), "%u", rand_r(&seed) % NRANKS);
  random_when(j.when, sizeof(j.when), which);
  names_read(&before);
  run_job(&j, &before, &o);
  t->runs++;
  t->named_runs += o.died_named > 0;
  cr_log_info("left_behind: %s%s%s %s die=%s %s %s, others %s: %.2f s, %d of %d creations "
              "returned, deaths [%s], %d files left%s",
              prov, topo ? " " : "", topo ? topo : "", launcher ? "chorus-run" : "by hand", j.die,
              by_exit ? "exit(1)" : "SIGKILL", j.when, exit_on_error ? "exit" : "destroy", o.wall,
              o.inits, NRANKS, o.phases, o.left, o.left_names);
  /* chorus-run stops the others when a rank dies: some may not have come as far as the
   * report (nor as far as Chorus) */
  if (launcher)
    cr_assert(o.npids >= 1 && o.npids <= NRANKS, "%d ranks started", o.npids);
  else
    cr_assert_eq(o.npids, NRANKS, "%d ranks started", o.npids);
  cr_assert_lt(o.wall, JOB_LIMIT_S, "the job hung");
  if (which < 0)
    cr_assert_eq(o.done_ok, NRANKS, "%s: a job without deaths: %d of %d ranks ended well", prov,
                 o.done_ok, NRANKS);
  else if (!launcher) /* chorus-run may stop the victims first */
    cr_assert_eq(o.deaths, all ? NRANKS : 1, "%s: %d ranks died as planned", prov, o.deaths);
  cr_expect_eq(o.named_after_init, 0,
               "%s: a rank found %d files of its own in /dev/shm after chorus_comm_init", prov,
               o.named_after_init);
  if (o.left) {
    t->left_runs++;
    t->left_files += o.left;
  }
  if (all && o.left && o.died_named) {
    /* nobody was left to remove them: the next communicator does */
    open_next_transport();
    count_left(&before, &o, false);
    t->swept_runs++;
    t->left_after_sweep += o.left;
    cr_expect_eq(o.left, 0,
                 "%s, every rank killed (%s): %d files still left after the next "
                 "transport's open:%s",
                 prov, j.when, o.left, o.left_names);
  } else {
    cr_expect_eq(o.left, 0, "%s %s, rank %s %s at %s, others %s: %d files left in /dev/shm:%s",
                 prov, launcher ? "under chorus-run" : "by hand", j.die,
                 by_exit ? "exit(1)" : "SIGKILL", j.when, exit_on_error ? "exit" : "destroy",
                 o.left, o.left_names);
  }
  count_left(&before, &o, true);
  names_free(&before);
}

/* Every point of death, both ways of dying, both ways of failing; one rank
 * and every rank. */
static void matrix(const char *prov, const char *topo, bool launcher) {
  tally_t t = {0};
  init_seed();
  one_run(prov, topo, launcher, false, false, -1, false, &t); /* nobody dies */
  for (int which = 0; which < 4; which++)
    for (int how = 0; how < 2; how++) {
      one_run(prov, topo, launcher, false, how, which, (which + how) % 2, &t);
      one_run(prov, topo, launcher, true, how, which, false, &t);
    }
  cr_log_info("left_behind: %s%s%s %s: %d runs, %d with a region still named at a death; "
              "files left after %d runs (%d files), every rank dead in %d of them: %d left "
              "after the next open",
              prov, topo ? " " : "", topo ? topo : "", launcher ? "chorus-run" : "by hand", t.runs,
              t.named_runs, t.left_runs, t.left_files, t.swept_runs, t.left_after_sweep);
}

Test(left_behind, shm_by_hand) {
  matrix("shm", NULL, false);
}

Test(left_behind, sock_by_hand) {
  matrix("sock", NULL, false);
}

Test(left_behind, shm_sock_two_hosts_by_hand) {
  matrix("shm+sock", "hosts=2x2", false);
}

Test(left_behind, shm_under_chorus_run) {
  matrix("shm", NULL, true);
}
