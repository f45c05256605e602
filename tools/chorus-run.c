/*
 * chorus-run - start the N ranks of a job on this host and watch them.
 *
 *   chorus-run -n 4 [options] -- prog args...
 *
 * A plain POSIX program (it does not link the library): it picks a free TCP
 * port on 127.0.0.1 for rank 0's rendezvous, makes a random job token and
 * starts N children with the torchrun-style environment. Each child is the
 * leader of a process group of its own, so that a signal reaches everything a
 * rank started and so that the terminal's Ctrl-C reaches only the launcher,
 * which forwards it.
 *
 *             +-------------------------- chorus-run ---------------------------+
 *   rank r -->| stdout pipe --> line buffer --> "[r] line\n" --> stdout          |
 *             | stderr pipe --> line buffer --> "[r] line\n" --> stderr          |
 *   SIGCHLD,  |                                                                  |
 *   SIGINT..->| handler --> self-pipe --> poll() loop: read, reap, deadlines      |
 *             +------------------------------------------------------------------+
 *
 * One poll() loop does everything; it sleeps until output, a signal or the
 * next deadline (the job timeout, or the end of the grace period after
 * SIGTERM). Lines are written whole with one write() each batch, so output
 * of different ranks never mixes inside a line.
 *
 * When a rank exits, whatever is left in its process group is killed (its
 * pid cannot have been reused yet: the rank is reaped only afterwards, see
 * reap_ranks()). When a rank fails, the others get SIGTERM, then SIGKILL after
 * the grace period.
 *
 * Once a rank is reaped, the shared-memory regions it left in /dev/shm are
 * removed (remove_rank_regions). The library names a region only while a
 * communicator is created, until every peer on the host has mapped it, and
 * the others remove a dead rank's; but when every rank dies in those
 * milliseconds nobody is left to do it, and each region holds 16 MiB of
 * memory until the next communicator on the host sweeps it (or the machine
 * restarts).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <dirent.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#define RUN_EXIT_USAGE 2
#define RUN_EXIT_TIMEOUT 124
#define RUN_MAX_RANKS 65536
#define RUN_READ_CHUNK 65536
#define RUN_MAX_LINE (1u << 20)  /* longer lines are cut into pieces this long */
#define RUN_DRAIN_AFTER_EXIT 1.0 /* s to wait for pipes held by escaped processes */

static const char usage_text[] =
    "usage: chorus-run [-n N] [--provider NAME] [--timeout S] [--linger S] [--grace S]\n"
    "                  [--tag-output | --no-tag] -- PROGRAM [ARGS...]\n"
    "\n"
    "Start N ranks of PROGRAM on this host for a Chorus job and watch them.\n"
    "\n"
    "Options\n"
    "  -n N, --np N       number of ranks (default 1)\n"
    "  --provider NAME    set CHORUS_PROVIDER=NAME for every rank (e.g. shm, tcp);\n"
    "                     without it the variable is passed on as it is\n"
    "  --timeout S        stop the job when it runs longer than S seconds and exit 124,\n"
    "                     naming the ranks still running (default, and 0: no limit)\n"
    "  --linger S         seconds the other ranks get to end on their own after one\n"
    "                     failed (Chorus tells them which rank failed and why, and\n"
    "                     they report it) before they are stopped (default 3)\n"
    "  --grace S          seconds between SIGTERM and SIGKILL when stopping ranks\n"
    "                     (default 2)\n"
    "  --tag-output       prefix every output line with \"[rank] \" (the default)\n"
    "  --no-tag           pass output lines through without a prefix\n"
    "  -h, --help         show this help\n"
    "The options end at \"--\", which is required; everything after it is the\n"
    "program and its arguments. PROGRAM is looked up in PATH unless it has a '/'.\n"
    "\n"
    "Environment of each rank\n"
    "  RANK, LOCAL_RANK                0 .. N-1\n"
    "  WORLD_SIZE, LOCAL_WORLD_SIZE    N\n"
    "  MASTER_ADDR, MASTER_PORT        127.0.0.1 and a port that was free at launch\n"
    "  CHORUS_RANK, CHORUS_WORLD_SIZE, CHORUS_RENDEZVOUS\n"
    "                                  the same, in Chorus's own names (host:port)\n"
    "  CHORUS_JOB_TOKEN                a random token shared by the ranks of this job\n"
    "  CHORUS_PROVIDER                 with --provider\n"
    "\n"
    "Output\n"
    "  Each rank's stdout and stderr go through pipes; every line is written to the\n"
    "  launcher's stdout or stderr respectively, whole, prefixed with the rank:\n"
    "  \"[2] text\". A last line without a newline gets one; lines longer than\n"
    "  1 MiB are cut into pieces that each get a prefix. The order between a rank's\n"
    "  stdout and stderr lines is not preserved. Rank 0 reads the launcher's stdin\n"
    "  unless that is a terminal; the other ranks read /dev/null.\n"
    "\n"
    "Failures and signals\n"
    "  When a rank exits with a non-zero status or is killed by a signal, the\n"
    "  launcher says so (\"chorus-run: rank 2 exited with status 3\"), lets the other\n"
    "  ranks end on their own for the linger time (their calls fail, naming the rank),\n"
    "  then sends SIGTERM to those still running and SIGKILL after the grace period.\n"
    "  Each rank runs in a process group of its own and signals go to the whole\n"
    "  group; when a rank exits, what remains of its group is killed. On Linux a\n"
    "  rank is also killed if the launcher dies. Shared-memory regions a rank\n"
    "  leaves in /dev/shm (chorus-PID-*: a rank killed after its peers had gone)\n"
    "  are removed once it has exited, with a line that says so.\n"
    "  SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the launcher are forwarded to the\n"
    "  ranks, which then get the grace period to exit before SIGKILL; a second one\n"
    "  kills them at once. SIGUSR1 and SIGUSR2 are forwarded and nothing else.\n"
    "  A signal ignored when the launcher starts (nohup) stays ignored, ranks too.\n"
    "\n"
    "Exit status\n"
    "  0    every rank exited with status 0\n"
    "  S    the first rank to fail exited with status S, or 128+SIG when it was\n"
    "       killed by signal SIG\n"
    "  124  --timeout expired\n"
    "  128+SIG  the launcher was stopped by signal SIG (forwarded to the ranks)\n"
    "  2    bad usage: bad option or value, missing \"--\", program not found\n"
    "  1    the launcher itself failed (no free port, fork failed...)\n";

/* ---- state ---- */

typedef struct stream {
  int fd;     /* read end of the rank's pipe; -1 once closed */
  int out_fd; /* where its lines go: 1 or 2 */
  char *buf;  /* bytes of a line not yet complete */
  size_t len; /* bytes in buf */
  size_t cap; /* allocated size of buf */
} stream_t;

typedef struct rank {
  pid_t pid;    /* leader of the rank's process group */
  int running;  /* not reaped yet */
  int signaled; /* the launcher sent it SIGTERM/SIGKILL (its death is expected) */
  stream_t out; /* its stdout */
  stream_t err; /* its stderr */
} rank_t;

typedef enum phase {
  PHASE_RUNNING,  /* all is well so far */
  PHASE_LINGER,   /* a rank failed: the others may end on their own until stop_at */
  PHASE_STOPPING, /* SIGTERM (or a forwarded signal) sent, waiting for the grace period */
  PHASE_KILLED,   /* SIGKILL sent to the ranks still running */
} phase_t;

typedef struct job {
  int nranks;
  rank_t *ranks;
  int tag;          /* prefix lines with "[rank] " */
  double timeout_s; /* 0 = none */
  double grace_s;   /* SIGTERM -> SIGKILL */
  double start;     /* monotonic time of the launch */
  phase_t phase;
  double kill_at;    /* in PHASE_STOPPING: when to send SIGKILL */
  double stop_at;    /* in PHASE_LINGER: when to send SIGTERM */
  double linger_s;   /* a rank failed -> SIGTERM to the others */
  int exit_code;     /* -1 until something decided it */
  int running;       /* ranks not reaped yet */
  double all_exited; /* monotonic time the last rank was reaped; 0 before */
  int out_dead[3];   /* writing to fd 1 / 2 failed: drop further output */
} job_t;

static int sig_pipe[2] = {-1, -1}; /* the signal handler writes signal numbers here */

/* ---- small helpers ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Write all of buf, waiting when fd is non-blocking and full. Returns 0 or -1. */
static int write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t w = write(fd, buf, len);
    if (w > 0) {
      buf += w;
      len -= (size_t)w;
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      if (poll(&p, 1, -1) < 0 && errno != EINTR)
        return -1;
    } else {
      return -1;
    }
  }
  return 0;
}

/* A message of the launcher's own, as one line on stderr. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char line[1024];
  int n = snprintf(line, sizeof(line), "chorus-run: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof(line) - 2)
    len = sizeof(line) - 2;
  line[len++] = '\n';
  if (write_all(2, line, len) < 0) {
    /* nowhere left to complain */
  }
}

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  say("%s", msg);
  say("try 'chorus-run --help'");
  exit(RUN_EXIT_USAGE);
}

static int set_flags(int fd, int cloexec, int nonblock) {
  int fdf = fcntl(fd, F_GETFD);
  int fl = fcntl(fd, F_GETFL);
  if (fdf < 0 || fl < 0)
    return -1;
  if (cloexec && fcntl(fd, F_SETFD, fdf | FD_CLOEXEC) < 0)
    return -1;
  if (nonblock && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return -1;
  return 0;
}

static const char *signal_name(int sig) {
  switch (sig) {
  case SIGINT:
    return "SIGINT";
  case SIGTERM:
    return "SIGTERM";
  case SIGHUP:
    return "SIGHUP";
  case SIGQUIT:
    return "SIGQUIT";
  case SIGUSR1:
    return "SIGUSR1";
  case SIGUSR2:
    return "SIGUSR2";
  default:
    return "signal";
  }
}

/* ---- options ---- */

typedef struct options {
  int nranks;
  const char *provider; /* NULL: leave CHORUS_PROVIDER alone */
  double timeout_s;
  double grace_s;
  double linger_s;
  int tag;
  char **argv; /* program and arguments, NULL-terminated */
} options_t;

/* "-n 4", "-n4", "--np 4", "--np=4": the value of option `name` at argv[*i], or NULL. */
static const char *option_value(const char *name, int *i, int argc, char **argv) {
  const char *arg = argv[*i];
  size_t len = strlen(name);
  if (strncmp(arg, name, len) != 0)
    return NULL;
  if (arg[len] == '\0') {
    if (*i + 1 >= argc)
      usage_error("option %s needs a value", name);
    return argv[++*i];
  }
  if (arg[len] == '=')
    return arg + len + 1;
  if (name[1] != '-') /* short option with the value attached: -n4 */
    return arg + len;
  return NULL;
}

static double parse_seconds(const char *opt, const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < 0)
    usage_error("%s wants a number of seconds >= 0, not '%s'", opt, s);
  return v;
}

static void parse_options(int argc, char **argv, options_t *o) {
  *o = (options_t){.nranks = 1, .grace_s = 2.0, .linger_s = 3.0, .tag = 1};
  int i;
  for (i = 1; i < argc; i++) {
    const char *arg = argv[i], *v;
    if (strcmp(arg, "--") == 0)
      break;
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      fputs(usage_text, stdout);
      exit(0);
    }
    if ((v = option_value("-n", &i, argc, argv)) || (v = option_value("--np", &i, argc, argv))) {
      char *end;
      errno = 0;
      long n = strtol(v, &end, 10);
      if (errno || end == v || *end || n < 1 || n > RUN_MAX_RANKS)
        usage_error("the number of ranks must be an integer from 1 to %d, not '%s'", RUN_MAX_RANKS,
                    v);
      o->nranks = (int)n;
    } else if ((v = option_value("--provider", &i, argc, argv))) {
      if (!*v)
        usage_error("--provider needs a name");
      o->provider = v;
    } else if ((v = option_value("--timeout", &i, argc, argv))) {
      o->timeout_s = parse_seconds("--timeout", v);
    } else if ((v = option_value("--linger", &i, argc, argv))) {
      o->linger_s = parse_seconds("--linger", v);
    } else if ((v = option_value("--grace", &i, argc, argv))) {
      o->grace_s = parse_seconds("--grace", v);
    } else if (strcmp(arg, "--tag-output") == 0) {
      o->tag = 1;
    } else if (strcmp(arg, "--no-tag") == 0) {
      o->tag = 0;
    } else if (arg[0] == '-') {
      usage_error("unknown option '%s'", arg);
    } else {
      usage_error("expected \"--\" before the program ('%s')", arg);
    }
  }
  if (i >= argc)
    usage_error("missing \"--\" and the program to run");
  if (i + 1 >= argc)
    usage_error("no program after \"--\"");
  o->argv = argv + i + 1;
}

/* The file execv() should run for `prog`, found like execvp() would; malloc'd. */
static char *resolve_program(const char *prog) {
  struct stat st;
  if (strchr(prog, '/')) {
    if (stat(prog, &st) < 0)
      usage_error("program not found: %s", prog);
    if (!S_ISREG(st.st_mode) || access(prog, X_OK) < 0)
      usage_error("not an executable file: %s", prog);
    return strdup(prog);
  }
  const char *path = getenv("PATH");
  if (!path)
    path = "/usr/local/bin:/usr/bin:/bin";
  int found_not_executable = 0;
  for (const char *p = path;; p++) {
    const char *colon = strchr(p, ':');
    size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
    size_t len = dlen + 1 + strlen(prog) + 1;
    char *cand = malloc(len);
    if (!cand) {
      say("out of memory");
      exit(1);
    }
    if (dlen == 0)
      snprintf(cand, len, "./%s", prog); /* an empty PATH entry is the current directory */
    else
      snprintf(cand, len, "%.*s/%s", (int)dlen, p, prog);
    if (stat(cand, &st) == 0 && S_ISREG(st.st_mode)) {
      if (access(cand, X_OK) == 0)
        return cand;
      found_not_executable = 1;
    }
    free(cand);
    if (!colon)
      break;
    p = colon;
  }
  if (found_not_executable)
    usage_error("not an executable file: %s", prog);
  usage_error("program not found in PATH: %s", prog);
}

/* ---- job setup ---- */

/* A TCP port that is free on 127.0.0.1 right now (the kernel's pick). */
static int pick_port(void) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(a);
  int port = -1;
  if (bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(s, (struct sockaddr *)&a, &alen) == 0)
    port = ntohs(a.sin_port);
  close(s);
  return port;
}

/* 128 random bits from /dev/urandom as 32 hex digits. */
static int make_token(char *out, size_t outlen) {
  unsigned char raw[16];
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t r = read(fd, raw + got, sizeof(raw) - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      close(fd);
      return -1;
    }
    got += (size_t)r;
  }
  close(fd);
  for (size_t i = 0; i < sizeof(raw) && 2 * i + 2 < outlen; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
  return 0;
}

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (write(sig_pipe[1], &b, 1) < 0) {
    /* pipe full: enough wakeups are pending already */
  }
  errno = saved;
}

/* Signals the launcher catches; the ranks get back the dispositions it found. */
static const int caught_signals[] = {SIGCHLD, SIGPIPE, SIGINT,  SIGTERM,
                                     SIGHUP,  SIGQUIT, SIGUSR1, SIGUSR2};
#define NCAUGHT ((int)(sizeof(caught_signals) / sizeof(caught_signals[0])))
static int ignored_at_start[NCAUGHT]; /* e.g. SIGHUP under nohup: stays ignored, for all */

static int install_handlers(void) {
  if (pipe(sig_pipe) < 0 || set_flags(sig_pipe[0], 1, 1) < 0 || set_flags(sig_pipe[1], 1, 1) < 0)
    return -1;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (int i = 0; i < NCAUGHT; i++) {
    struct sigaction old;
    if (sigaction(caught_signals[i], NULL, &old) < 0)
      return -1;
    ignored_at_start[i] = old.sa_handler == SIG_IGN;
    if (caught_signals[i] == SIGPIPE) {
      signal(SIGPIPE, SIG_IGN); /* a closed stdout must not kill the launcher */
      continue;
    }
    if (ignored_at_start[i] && caught_signals[i] != SIGCHLD)
      continue;
    if (sigaction(caught_signals[i], &sa, NULL) < 0)
      return -1;
  }
  return 0;
}

/*
 * In the child, between fork() and exec: only async-signal-safe calls (the
 * launcher is single-threaded, and the environment was set before fork()).
 */
static void child_exec(const char *path, char **argv, int rank, int out_w, int err_w,
                       pid_t launcher, const sigset_t *oldmask) {
  setpgid(0, 0);
#ifdef __linux__
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) /* the launcher died before prctl() */
    _exit(127);
#else
  (void)launcher;
#endif
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < NCAUGHT; i++) {
    sa.sa_handler = ignored_at_start[i] ? SIG_IGN : SIG_DFL;
    sigaction(caught_signals[i], &sa, NULL);
  }
  sigprocmask(SIG_SETMASK, oldmask, NULL);

  if (rank != 0 || isatty(0)) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0 && devnull != 0) {
      dup2(devnull, 0);
      close(devnull);
    }
  }
  if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
    _exit(127);
  execv(path, argv);
  int e = errno;
  const char *parts[] = {"chorus-run: cannot execute ", path, ": ", strerror(e), "\n"};
  for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
    if (write(2, parts[i], strlen(parts[i])) < 0)
      break;
  _exit(127);
}

static int set_rank_env(int rank, int nranks, int port, const char *token, const char *provider) {
  char r[16], n[16], p[16], rdv[64];
  snprintf(r, sizeof(r), "%d", rank);
  snprintf(n, sizeof(n), "%d", nranks);
  snprintf(p, sizeof(p), "%d", port);
  snprintf(rdv, sizeof(rdv), "127.0.0.1:%d", port);
  int rc = setenv("RANK", r, 1) | setenv("LOCAL_RANK", r, 1) | setenv("WORLD_SIZE", n, 1) |
           setenv("LOCAL_WORLD_SIZE", n, 1) | setenv("MASTER_ADDR", "127.0.0.1", 1) |
           setenv("MASTER_PORT", p, 1) | setenv("CHORUS_RANK", r, 1) |
           setenv("CHORUS_WORLD_SIZE", n, 1) | setenv("CHORUS_RENDEZVOUS", rdv, 1) |
           setenv("CHORUS_JOB_TOKEN", token, 1);
  if (provider)
    rc |= setenv("CHORUS_PROVIDER", provider, 1);
  return rc ? -1 : 0;
}

/* ---- output ---- */

/* Append "[r] " + line + "\n" to the batch buffer *ob. */
static int batch_line(job_t *job, int rank, const char *line, size_t len, char **ob, size_t *olen,
                      size_t *ocap) {
  char prefix[24];
  int plen = job->tag ? snprintf(prefix, sizeof(prefix), "[%d] ", rank) : 0;
  size_t need = *olen + (size_t)plen + len + 1;
  if (need > *ocap) {
    size_t cap = *ocap ? *ocap : 4096;
    while (cap < need)
      cap *= 2;
    char *nb = realloc(*ob, cap);
    if (!nb)
      return -1;
    *ob = nb;
    *ocap = cap;
  }
  memcpy(*ob + *olen, prefix, (size_t)plen);
  memcpy(*ob + *olen + plen, line, len);
  (*ob)[*olen + (size_t)plen + len] = '\n';
  *olen = need;
  return 0;
}

static void emit(job_t *job, int fd, const char *buf, size_t len) {
  if (len == 0 || job->out_dead[fd])
    return;
  if (write_all(fd, buf, len) < 0)
    job->out_dead[fd] = 1; /* e.g. the reader of our stdout went away */
}

/* Turn s->buf into whole lines (and, when `flush`, the last partial one too). */
static void emit_lines(job_t *job, int rank, stream_t *s, int flush) {
  if (s->len == 0)
    return;
  char *ob = NULL;
  size_t olen = 0, ocap = 0, start = 0;
  for (;;) {
    if (start == s->len)
      break;
    char *nl = memchr(s->buf + start, '\n', s->len - start);
    size_t llen;
    if (nl)
      llen = (size_t)(nl - (s->buf + start));
    else if (s->len - start >= RUN_MAX_LINE || (flush && s->len > start))
      llen = s->len - start < RUN_MAX_LINE ? s->len - start : RUN_MAX_LINE;
    else
      break;
    if (batch_line(job, rank, s->buf + start, llen, &ob, &olen, &ocap) < 0) {
      emit(job, s->out_fd, ob, olen); /* out of memory: write what we have, raw */
      olen = 0;
      emit(job, s->out_fd, s->buf + start, llen);
    }
    start += llen + (nl ? 1 : 0);
  }
  emit(job, s->out_fd, ob, olen);
  free(ob);
  memmove(s->buf, s->buf + start, s->len - start);
  s->len -= start;
}

static void close_stream(job_t *job, int rank, stream_t *s) {
  if (s->fd < 0)
    return;
  emit_lines(job, rank, s, 1);
  close(s->fd);
  s->fd = -1;
}

/* Read what the pipe has (without blocking); close it at EOF. */
static void pump_stream(job_t *job, int rank, stream_t *s) {
  while (s->fd >= 0) {
    if (s->cap - s->len < RUN_READ_CHUNK) {
      size_t cap = s->len + RUN_READ_CHUNK;
      char *nb = realloc(s->buf, cap);
      if (!nb) {
        emit_lines(job, rank, s, 1);
        return;
      }
      s->buf = nb;
      s->cap = cap;
    }
    ssize_t r = read(s->fd, s->buf + s->len, RUN_READ_CHUNK);
    if (r > 0) {
      s->len += (size_t)r;
      emit_lines(job, rank, s, 0);
      if (r < RUN_READ_CHUNK)
        return; /* likely drained; poll() says when there is more */
    } else if (r == 0) {
      close_stream(job, rank, s);
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return;
    } else {
      close_stream(job, rank, s);
    }
  }
}

/* ---- ranks ---- */

static void signal_rank(rank_t *r, int sig) {
  if (!r->running)
    return;
  /* the group first; the leader too in case it left its group */
  if (kill(-r->pid, sig) < 0)
    kill(r->pid, sig);
}

static void signal_all(job_t *job, int sig) {
  for (int i = 0; i < job->nranks; i++)
    if (job->ranks[i].running) {
      signal_rank(&job->ranks[i], sig);
      if (sig == SIGTERM || sig == SIGKILL || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT)
        job->ranks[i].signaled = 1;
    }
}

/* Begin stopping every rank: `sig` now, SIGKILL after the grace period. */
static void stop_job(job_t *job, int sig) {
  if (job->phase != PHASE_RUNNING && job->phase != PHASE_LINGER)
    return;
  job->phase = PHASE_STOPPING;
  job->kill_at = now_s() + job->grace_s;
  signal_all(job, sig);
}

static void kill_job(job_t *job) {
  int any = 0;
  char names[256] = "";
  size_t used = 0;
  for (int i = 0; i < job->nranks; i++)
    if (job->ranks[i].running) {
      any = 1;
      if (used < sizeof(names) - 16)
        used += (size_t)snprintf(names + used, sizeof(names) - used, " %d", i);
      else if (used < sizeof(names) - 4)
        used += (size_t)snprintf(names + used, sizeof(names) - used, " ...");
    }
  if (any && job->grace_s > 0)
    say("ranks still running %g s after the signal, sending SIGKILL:%s", job->grace_s, names);
  signal_all(job, SIGKILL);
  job->phase = PHASE_KILLED;
}

static int rank_of_pid(const job_t *job, pid_t pid) {
  for (int i = 0; i < job->nranks; i++)
    if (job->ranks[i].running && job->ranks[i].pid == pid)
      return i;
  return -1;
}

static void rank_exited(job_t *job, int i, int status) {
  rank_t *r = &job->ranks[i];
  r->running = 0;
  job->running--;
  if (job->running == 0)
    job->all_exited = now_s();
  int failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  if (!failed || (r->signaled && job->phase != PHASE_RUNNING))
    return; /* a success, or a death the launcher asked for */
  int code;
  if (WIFEXITED(status)) {
    code = WEXITSTATUS(status);
    say("rank %d exited with status %d", i, code);
  } else {
    int sig = WTERMSIG(status);
    code = 128 + sig;
    say("rank %d killed by signal %d (%s)", i, sig, strsignal(sig));
  }
  if (job->exit_code < 0)
    job->exit_code = code;
  /* the survivors of a Chorus job fail too, each naming what happened:
   * their failures do not cut the linger short */
  if (job->phase == PHASE_LINGER)
    return;
  if (job->phase == PHASE_RUNNING && job->running > 0 && job->linger_s > 0) {
    say("the other ranks get %g s to end on their own", job->linger_s);
    job->phase = PHASE_LINGER;
    job->stop_at = now_s() + job->linger_s;
    return;
  }
  if (job->phase == PHASE_RUNNING && job->running > 0)
    say("stopping the other ranks");
  stop_job(job, SIGTERM);
}

/*
 * Removes what the rank with this pid left in /dev/shm: the regions the
 * library's shm transport names "chorus-PID-RANK-..." (prov_ofi.c,
 * "Names"). Once the rank is reaped nothing else can own the name: a later
 * process with the same pid makes a new nonce, and peers that still map a
 * region keep it. Only regions of the rank's own pid: one a rank's child
 * process made (a wrapper that forks the program) is not found.
 */
static void remove_rank_regions(pid_t pid) {
  char prefix[32];
  int plen = snprintf(prefix, sizeof(prefix), "chorus-%d-", (int)pid);
  DIR *d = opendir("/dev/shm");
  struct dirent *e;

  if (!d)
    return;
  while ((e = readdir(d))) {
    char path[300];
    if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
      continue;
    snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
    if (unlink(path) == 0)
      say("removed /dev/shm/%s, left by the rank with pid %d", e->d_name, (int)pid);
  }
  closedir(d);
}

/*
 * Reap every rank that exited. WNOWAIT first leaves it a zombie, which keeps
 * its pid (= its process group id) from being reused while the rest of its
 * group is killed; then the rank's pipes are drained, so that its last words
 * come out before the launcher's report; then it is reaped.
 */
static void reap_ranks(job_t *job) {
  for (;;) {
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) < 0) {
      if (errno == EINTR)
        continue;
      return; /* ECHILD: nothing left */
    }
    if (si.si_pid == 0)
      return;
    pid_t pid = si.si_pid;
    int i = rank_of_pid(job, pid);
    if (i >= 0) {
      kill(-pid, SIGKILL);
      pump_stream(job, i, &job->ranks[i].out);
      pump_stream(job, i, &job->ranks[i].err);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (i >= 0) {
      remove_rank_regions(pid);
      rank_exited(job, i, status);
    }
  }
}

static int launch(job_t *job, const options_t *o, const char *path, int port, const char *token) {
  sigset_t all, old;
  sigfillset(&all);
  pid_t self = getpid();
  for (int i = 0; i < job->nranks; i++) {
    rank_t *r = &job->ranks[i];
    int po[2], pe[2];
    if (pipe(po) < 0) {
      say("cannot create a pipe for rank %d: %s", i, strerror(errno));
      return -1;
    }
    if (pipe(pe) < 0) {
      say("cannot create a pipe for rank %d: %s", i, strerror(errno));
      close(po[0]);
      close(po[1]);
      return -1;
    }
    set_flags(po[0], 1, 1);
    set_flags(pe[0], 1, 1);
    set_flags(po[1], 1, 0);
    set_flags(pe[1], 1, 0);
    if (set_rank_env(i, job->nranks, port, token, o->provider) < 0) {
      say("cannot set the environment for rank %d: %s", i, strerror(errno));
      close(po[0]);
      close(po[1]);
      close(pe[0]);
      close(pe[1]);
      return -1;
    }
    /* no handler may run in the child before it resets them */
    sigprocmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0)
      child_exec(path, o->argv, i, po[1], pe[1], self, &old);
    int fork_errno = errno;
    if (pid > 0)
      setpgid(pid, pid); /* also here, so that signals sent from now on reach the group */
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
      say("cannot start rank %d: %s", i, strerror(fork_errno));
      close(po[0]);
      close(pe[0]);
      return -1;
    }
    r->pid = pid;
    r->running = 1;
    r->out = (stream_t){.fd = po[0], .out_fd = 1};
    r->err = (stream_t){.fd = pe[0], .out_fd = 2};
    job->running++;
  }
  return 0;
}

/* ---- the loop ---- */

static void handle_signals(job_t *job) {
  unsigned char sigs[64];
  ssize_t n;
  while ((n = read(sig_pipe[0], sigs, sizeof(sigs))) > 0 || (n < 0 && errno == EINTR)) {
    for (ssize_t k = 0; k < n; k++) {
      int sig = sigs[k];
      if (sig == SIGCHLD)
        continue; /* reap_ranks() runs on every wakeup */
      if (sig == SIGUSR1 || sig == SIGUSR2) {
        signal_all(job, sig);
        continue;
      }
      if (job->phase == PHASE_RUNNING || job->phase == PHASE_LINGER) {
        say("got %s, forwarding it to the ranks", signal_name(sig));
        if (job->exit_code < 0)
          job->exit_code = 128 + sig;
        stop_job(job, sig);
      } else if (job->phase == PHASE_STOPPING) {
        say("got %s again, killing the ranks", signal_name(sig));
        if (job->exit_code < 0)
          job->exit_code = 128 + sig;
        kill_job(job);
      }
    }
  }
}

static void check_deadlines(job_t *job) {
  double t = now_s();
  if (job->phase == PHASE_RUNNING && job->timeout_s > 0 && job->running > 0 &&
      t >= job->start + job->timeout_s) {
    char names[512] = "";
    size_t used = 0;
    for (int i = 0; i < job->nranks && used < sizeof(names) - 16; i++)
      if (job->ranks[i].running)
        used += (size_t)snprintf(names + used, sizeof(names) - used, " %d", i);
    say("timeout: the job ran longer than %g s; ranks still running:%s", job->timeout_s, names);
    job->exit_code = RUN_EXIT_TIMEOUT;
    stop_job(job, SIGTERM);
  }
  if (job->phase == PHASE_LINGER && job->running > 0 && t >= job->stop_at) {
    say("stopping the other ranks");
    stop_job(job, SIGTERM);
  }
  if (job->phase == PHASE_STOPPING && job->running > 0 && t >= job->kill_at)
    kill_job(job);
}

/* Milliseconds until the next deadline, or -1 for none. */
static int next_wait_ms(const job_t *job) {
  double deadline = INFINITY, t = now_s();
  if (job->running > 0) {
    if (job->phase == PHASE_RUNNING && job->timeout_s > 0)
      deadline = job->start + job->timeout_s;
    if (job->phase == PHASE_STOPPING)
      deadline = job->kill_at;
    if (job->phase == PHASE_LINGER)
      deadline = job->stop_at;
  } else {
    deadline = job->all_exited + RUN_DRAIN_AFTER_EXIT;
  }
  if (isinf(deadline))
    return -1;
  double ms = ceil((deadline - t) * 1000.0);
  if (ms < 0)
    return 0;
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

static int open_streams(const job_t *job) {
  int n = 0;
  for (int i = 0; i < job->nranks; i++)
    n += (job->ranks[i].out.fd >= 0) + (job->ranks[i].err.fd >= 0);
  return n;
}

static int run_loop(job_t *job) {
  size_t cap = 1 + 2 * (size_t)job->nranks;
  struct pollfd *pfd = calloc(cap, sizeof(*pfd));
  stream_t **who = calloc(cap, sizeof(*who));
  int *whorank = calloc(cap, sizeof(*whorank));
  if (!pfd || !who || !whorank) {
    say("out of memory");
    free(pfd);
    free(who);
    free(whorank);
    return -1;
  }
  for (;;) {
    reap_ranks(job);
    check_deadlines(job);
    if (job->running == 0 &&
        (open_streams(job) == 0 || now_s() >= job->all_exited + RUN_DRAIN_AFTER_EXIT))
      break;
    nfds_t n = 0;
    pfd[n++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
    for (int i = 0; i < job->nranks; i++) {
      stream_t *ss[2] = {&job->ranks[i].out, &job->ranks[i].err};
      for (int k = 0; k < 2; k++)
        if (ss[k]->fd >= 0) {
          who[n] = ss[k];
          whorank[n] = i;
          pfd[n++] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
        }
    }
    int rc = poll(pfd, n, next_wait_ms(job));
    if (rc < 0 && errno != EINTR) {
      say("poll: %s", strerror(errno));
      break;
    }
    if (rc <= 0)
      continue;
    if (pfd[0].revents)
      handle_signals(job);
    for (nfds_t k = 1; k < n; k++)
      if (pfd[k].revents)
        pump_stream(job, whorank[k], who[k]);
  }
  /* only after a poll() failure can ranks be left: never leave them behind */
  for (int i = 0; i < job->nranks; i++)
    if (job->ranks[i].running) {
      signal_rank(&job->ranks[i], SIGKILL);
      while (waitpid(job->ranks[i].pid, NULL, 0) < 0 && errno == EINTR) {
      }
      job->ranks[i].running = 0;
    }
  for (int i = 0; i < job->nranks; i++) {
    close_stream(job, i, &job->ranks[i].out);
    close_stream(job, i, &job->ranks[i].err);
  }
  free(pfd);
  free(who);
  free(whorank);
  return 0;
}

int main(int argc, char **argv) {
  options_t o;
  parse_options(argc, argv, &o);
  char *path = resolve_program(o.argv[0]);

  int port = pick_port();
  if (port < 0) {
    say("cannot find a free TCP port on 127.0.0.1: %s", strerror(errno));
    return 1;
  }
  char token[40];
  if (make_token(token, sizeof(token)) < 0) {
    say("cannot read /dev/urandom for the job token: %s", strerror(errno));
    return 1;
  }
  if (install_handlers() < 0) {
    say("cannot install signal handlers: %s", strerror(errno));
    return 1;
  }

  job_t job = {.nranks = o.nranks,
               .tag = o.tag,
               .timeout_s = o.timeout_s,
               .grace_s = o.grace_s,
               .linger_s = o.linger_s,
               .exit_code = -1};
  job.ranks = calloc((size_t)o.nranks, sizeof(*job.ranks));
  if (!job.ranks) {
    say("out of memory");
    return 1;
  }
  for (int i = 0; i < o.nranks; i++)
    job.ranks[i].out.fd = job.ranks[i].err.fd = -1;
  job.start = now_s();
  if (launch(&job, &o, path, port, token) < 0) {
    if (job.exit_code < 0)
      job.exit_code = 1;
    stop_job(&job, SIGTERM);
  }
  run_loop(&job);

  for (int i = 0; i < o.nranks; i++) {
    free(job.ranks[i].out.buf);
    free(job.ranks[i].err.buf);
  }
  free(job.ranks);
  free(path);
  return job.exit_code < 0 ? 0 : job.exit_code;
}
