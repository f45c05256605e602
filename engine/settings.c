/*
 * settings.c - the one table of CHORUS_* environment variables, and the one
 * place that reads the environment.
 *
 * Two groups live in the same table:
 *  - tuning settings, parsed into chorus_settings_t by settings_load();
 *  - launcher variables (ours, torchrun's, Open MPI's, Slurm's), read by
 *    settings_launch_env() to find this process's rank, the job size and the
 *    rendezvous address.
 *
 * An empty variable counts as unset. A malformed value is an error that
 * names the variable and quotes the value (the job token is never quoted).
 *
 * Launcher precedence, highest first: CHORUS_* > torchrun > Open MPI > Slurm.
 * Rank and size are taken as a pair from the first launcher that sets either
 * of them (a stale WORLD_SIZE in a shell must not be mixed with mpirun's
 * rank); the local rank/size hints are taken variable by variable in the
 * same order. The rendezvous address is CHORUS_RENDEZVOUS, else
 * MASTER_ADDR:MASTER_PORT; Slurm and Open MPI provide neither.
 */
#include "eng.h"
#include "settings.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum set_type {
  SET_STRING,  /* char[] field, length-checked */
  SET_SECRET,  /* like SET_STRING, never echoed */
  SET_BOOL,    /* 0/1, true/false, yes/no, on/off */
  SET_INT,     /* int field */
  SET_SIZE,    /* size_t field, K/M/G suffixes (powers of 1024) */
  SET_COUNT,   /* size_t field, plain integer */
  SET_SECONDS, /* double field */
  SET_LOG,     /* int field: error|warn|info|debug or 0-3 */
  SET_LAUNCH,  /* launcher variable: read by settings_launch_env only */
};

struct setting {
  const char *name;
  enum set_type type;
  const char *def; /* default, as a user would write it; NULL = none */
  const char *doc;
  size_t offset;   /* in chorus_settings_t (not for SET_LAUNCH) */
  size_t size;     /* of the field */
  double min, max; /* accepted range of numeric values */
};

#define FIELD(f) offsetof(chorus_settings_t, f), sizeof(((chorus_settings_t *)0)->f)
#define LAUNCH 0, 0, 0, 0 /* no field, no range */

static const struct setting settings_table[] = {
    {"CHORUS_PROVIDER", SET_STRING, "",
     "transport: a libfabric provider (tcp, shm, verbs...), sock (Chorus's own TCP transport), "
     "A+B (A inside a host, B between hosts, e.g. shm+sock) or inproc; empty = auto (shm on one "
     "host, else tcp)",
     FIELD(provider), 0, 0},
    {"CHORUS_SOCK_IFACE", SET_STRING, "",
     "sock transport: network interface to listen on (e.g. eth0, lo); empty = FI_TCP_IFACE when "
     "set, else the first IPv4 interface that is up and not loopback, else loopback",
     FIELD(sock_iface), 0, 0},
    {"CHORUS_SOCK_SNDBUF", SET_SIZE, "256K",
     "sock transport: send buffer (SO_SNDBUF) of a connection between two ranks on one host, "
     "where TCP is the kernel copying memory and less in flight stays in the caches; between "
     "hosts, and with 0, the kernel sizes it",
     FIELD(sock_sndbuf), 0, 1073741824.0},
    {"CHORUS_JOB_TOKEN", SET_SECRET, "",
     "shared secret of the job; every rank must present rank 0's token at the rendezvous",
     FIELD(job_token), 0, 0},
    {"CHORUS_CONNECT_TIMEOUT", SET_SECONDS, "60",
     "seconds to wait for every rank at the rendezvous (and for each bootstrap round)",
     FIELD(connect_timeout_s), 0.001, 7 * 86400.0},
    {"CHORUS_CHUNK_BYTES", SET_SIZE, "256K",
     "pipeline chunk size in bytes; K, M and G suffixes accepted (powers of 1024)",
     FIELD(chunk_bytes), 1, 1099511627776.0 /* 1 TiB */},
    {"CHORUS_SHM_BOUNCE", SET_SIZE, "64K",
     "shm: largest message from ordinary memory that is copied into a mappable bounce slot and "
     "read out by the receiver instead of a CMA copy (at most 64K when ranks outnumber cores); "
     "0 = CMA only",
     FIELD(shm_bounce), 0, 262144},
    {"CHORUS_SHM_STAGE", SET_SIZE, "64M",
     "shm: size of the communicator's mappable staging buffer, the largest broadcast, allgather "
     "block or allreduce (at most 16M) from memory peers can not map that is copied into it so "
     "that peers read it in place instead of by CMA; only past CHORUS_SHM_BOUNCE, when ranks "
     "outnumber cores; with ranks on cores of their own, allgather blocks from 128K and "
     "broadcasts from 8M; "
     "0 = never",
     FIELD(shm_stage), 0, 1099511627776.0},
    {"CHORUS_MAX_POSTED", SET_COUNT, "256", "sends and receives in flight per rank",
     FIELD(max_posted), 1, 1048576},
    {"CHORUS_SPIN_US", SET_INT, "50",
     "microseconds the progress thread busy-polls after its last completion before sleeping; "
     "0 = always sleep",
     FIELD(spin_us), 0, 1000000},
    {"CHORUS_WAIT_SPIN_US", SET_INT, "1000",
     "microseconds a caller blocked in a call keeps polling (yielding the CPU between polls) "
     "while nothing completes, before it sleeps; 0 = sleep at once",
     FIELD(wait_spin_us), 0, 1000000},
    {"CHORUS_SPREAD_CORES", SET_BOOL, "1",
     "when a host's ranks fit its cores, the thread that creates a communicator, and a caller "
     "waiting in a call (at most every 10 ms), that find themselves off the rank's own core "
     "(local rank i: the i-th CPU it may run on) move back there, by a one-CPU affinity "
     "restored at once; 0 = leave placement to the kernel",
     FIELD(spread_cores), 0, 1},
    {"CHORUS_LOG", SET_LOG, "warn", "log level: error, warn, info, debug (or 0-3)",
     FIELD(log_level), 0, 3},
    {"CHORUS_JOURNAL", SET_BOOL, "1",
     "journal state-machine transitions in a bounded ring (dumped on hangs and errors)",
     FIELD(journal), 0, 1},
    {"CHORUS_JOURNAL_RECORDS", SET_COUNT, "65536", "records kept in the transition journal ring",
     FIELD(journal_records), 1, 268435456},
    {"CHORUS_ALGO", SET_STRING, "",
     "algorithm overrides, e.g. allreduce=ring;bcast=tree or allreduce=rd:0-64K,ring:64K- "
     "(collective=algo[:min-max],...;...); empty = chosen by the cost model",
     FIELD(algo), 0, 0},
    {"CHORUS_BUFFSIZE", SET_SIZE, "4M",
     "largest scratch buffer a communicator keeps between collectives for good (a schedule "
     "needing more gets its own, kept while such calls follow and given back after ~1 s "
     "unused); K, M, G suffixes",
     FIELD(buffsize), 4096, 1099511627776.0},
    {"CHORUS_VERIFY", SET_BOOL, "1",
     "check each compiled schedule before its first run (every send has one matching receive, "
     "no dependency cycle across ranks)",
     FIELD(verify), 0, 1},
    {"CHORUS_DETERMINISTIC", SET_BOOL, "0",
     "reduce every element in one fixed order set by (nranks, count), whatever the algorithm "
     "and timing (restricts the algorithms reductions may use)",
     FIELD(deterministic), 0, 1},
    {"CHORUS_TOPO", SET_STRING, "",
     "emulate hosts on one machine, e.g. hosts=4x2 (4 hosts of 2 ranks; traffic between them "
     "goes over the network provider); empty = the real hosts",
     FIELD(topo), 0, 0},
    {"CHORUS_TRACE", SET_BOOL, "1",
     "call fingerprints on every message (a mismatched call fails at its first message), "
     "checkpoints and the watchdog that catches divergence, lost and stalled ranks; 0 = off",
     FIELD(trace), 0, 1},
    {"CHORUS_TIMEOUT", SET_SECONDS, "600",
     "seconds a collective may wait before the watchdog fails it on every rank, naming the "
     "rank it waits for",
     FIELD(timeout_s), 0.1, 30 * 86400.0},
    {"CHORUS_PEER_TIMEOUT", SET_SECONDS, "30",
     "seconds without a heartbeat from a rank (frozen, unreachable) before every rank fails "
     "with CHORUS_ERR_PEER_LOST; a rank whose process ends is reported at once",
     FIELD(peer_timeout_s), 0.1, 30 * 86400.0},
    {"CHORUS_WATCHDOG_MS", SET_INT, "1000",
     "milliseconds between heartbeats (checkpoint summaries) to rank 0's watchdog",
     FIELD(watchdog_ms), 10, 600000},
    {"CHORUS_TRACE_DIR", SET_STRING, "",
     "directory for trace dumps (one file per rank, read with chorus-trace) written on a "
     "timeout, divergence, lost peer, abort, SIGUSR1, a fatal signal or chorus_comm_dump(); "
     "empty = no dumps",
     FIELD(trace_dir), 0, 0},
    {"CHORUS_CHECKSUM", SET_BOOL, "0",
     "end-to-end CRC-32C of every message, checked by its receiver: a corrupted message fails "
     "with CHORUS_ERR_CORRUPT naming the link instead of a wrong result (costs a pass over the "
     "data on each side; set it alike on every rank)",
     FIELD(checksum), 0, 1},
    {"CHORUS_FAULTS", SET_STRING, "",
     "fault injection, e.g. seed=7;drop:p=0.01;delay:ms=50,p=0.1;kill:rank=3,at=allreduce#100;"
     "stall:rank=1,at=#40,s=30 (see README); empty = none",
     FIELD(faults), 0, 0},

    {"CHORUS_RANK", SET_LAUNCH, NULL, "this process's rank (chorus-run or by hand)", LAUNCH},
    {"CHORUS_WORLD_SIZE", SET_LAUNCH, NULL, "number of ranks in the job", LAUNCH},
    {"CHORUS_LOCAL_RANK", SET_LAUNCH, NULL, "rank among the processes of this host", LAUNCH},
    {"CHORUS_RENDEZVOUS", SET_LAUNCH, NULL,
     "host:port of rank 0's rendezvous server (rank 0 listens on that port); overrides "
     "MASTER_ADDR/MASTER_PORT",
     LAUNCH},
    {"RANK", SET_LAUNCH, NULL, "torchrun: global rank", LAUNCH},
    {"WORLD_SIZE", SET_LAUNCH, NULL, "torchrun: number of ranks", LAUNCH},
    {"LOCAL_RANK", SET_LAUNCH, NULL, "torchrun: rank on this host", LAUNCH},
    {"LOCAL_WORLD_SIZE", SET_LAUNCH, NULL, "torchrun: ranks on this host", LAUNCH},
    {"MASTER_ADDR", SET_LAUNCH, NULL, "torchrun: host of rank 0 (rendezvous host)", LAUNCH},
    {"MASTER_PORT", SET_LAUNCH, NULL, "torchrun: rendezvous port", LAUNCH},
    {"OMPI_COMM_WORLD_RANK", SET_LAUNCH, NULL, "Open MPI mpirun: global rank", LAUNCH},
    {"OMPI_COMM_WORLD_SIZE", SET_LAUNCH, NULL, "Open MPI mpirun: number of ranks", LAUNCH},
    {"OMPI_COMM_WORLD_LOCAL_RANK", SET_LAUNCH, NULL, "Open MPI mpirun: rank on this host", LAUNCH},
    {"OMPI_COMM_WORLD_LOCAL_SIZE", SET_LAUNCH, NULL, "Open MPI mpirun: ranks on this host", LAUNCH},
    {"SLURM_PROCID", SET_LAUNCH, NULL, "Slurm srun: global rank", LAUNCH},
    {"SLURM_NTASKS", SET_LAUNCH, NULL, "Slurm srun: number of ranks", LAUNCH},
    {"SLURM_LOCALID", SET_LAUNCH, NULL, "Slurm srun: rank on this host", LAUNCH},
};

#define NSETTINGS (sizeof(settings_table) / sizeof(settings_table[0]))

/* One launcher flavour; NULL where the launcher has no such variable. */
struct launcher {
  const char *source; /* chorus_launch_env_t.source */
  const char *title;  /* for messages */
  const char *rank, *size, *local_rank, *local_size;
};

/* In order of precedence. */
static const struct launcher launchers[] = {
    {"chorus", "chorus-run/CHORUS_*", "CHORUS_RANK", "CHORUS_WORLD_SIZE", "CHORUS_LOCAL_RANK",
     NULL},
    {"torchrun", "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
};

#define NLAUNCHERS (sizeof(launchers) / sizeof(launchers[0]))

/* Where values come from: the environment (src NULL), or a caller's lookup. */
struct env_src {
  settings_getenv_fn get;
  void *arg;
};

/* The only getenv of the project for these variables. Empty counts as unset. */
static const char *env_get(const struct env_src *src, const char *name) {
  const char *v = src ? src->get(name, src->arg) : getenv(name);
  return v && *v ? v : NULL;
}

/* A value quoted in a message: printable and not too long. */
static const char *quote(const char *v, char *buf, size_t len) {
  size_t i, n = strlen(v);
  size_t max = len - 4;

  for (i = 0; i < n && i < max; i++)
    buf[i] = isprint((unsigned char)v[i]) ? v[i] : '?';
  if (n > max)
    memcpy(buf + max, "...", 4);
  else
    buf[i] = '\0';
  return buf;
}

static const char *skip_space(const char *p) {
  while (isspace((unsigned char)*p))
    p++;
  return p;
}

/* Unsigned decimal integer with optional surrounding blanks.
 * Returns 0, -ERANGE on overflow or a leading '-', -EINVAL otherwise. */
static int parse_u64(const char *s, uint64_t *out, const char **end) {
  const char *p = skip_space(s);
  uint64_t v = 0;

  if (*p == '-')
    return -ERANGE;
  if (*p == '+')
    p++;
  if (!isdigit((unsigned char)*p))
    return -EINVAL;
  for (; isdigit((unsigned char)*p); p++) {
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10)
      return -ERANGE;
    v = v * 10 + d;
  }
  if (end)
    *end = p;
  else if (*skip_space(p))
    return -EINVAL;
  *out = v;
  return 0;
}

/* "1048576", "1M", "512k", "4MiB", "2GB". */
static int parse_size(const char *s, uint64_t *out) {
  const char *p;
  uint64_t v, mult = 1;
  int rc = parse_u64(s, &v, &p);

  if (rc)
    return rc;
  switch (toupper((unsigned char)*p)) {
  case 'K':
    mult = UINT64_C(1) << 10;
    p++;
    break;
  case 'M':
    mult = UINT64_C(1) << 20;
    p++;
    break;
  case 'G':
    mult = UINT64_C(1) << 30;
    p++;
    break;
  default:
    break;
  }
  if (mult > 1 && *p == 'i')
    p++;
  if (toupper((unsigned char)*p) == 'B')
    p++;
  if (*skip_space(p))
    return -EINVAL;
  if (v > UINT64_MAX / mult)
    return -ERANGE;
  *out = v * mult;
  return 0;
}

static int parse_bool(const char *s, bool *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  size_t i;

  for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
    if (!strcasecmp(s, yes[i])) {
      *out = true;
      return 0;
    }
    if (!strcasecmp(s, no[i])) {
      *out = false;
      return 0;
    }
  }
  return -EINVAL;
}

static int parse_log(const char *s, int *out) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  uint64_t v;
  int i;

  for (i = 0; i < 4; i++) {
    if (!strcasecmp(s, names[i])) {
      *out = i;
      return 0;
    }
  }
  if (!strcasecmp(s, "warning")) {
    *out = 1;
    return 0;
  }
  if (parse_u64(s, &v, NULL) || v > 3)
    return -EINVAL;
  *out = (int)v;
  return 0;
}

static int parse_seconds(const char *s, double *out) {
  char *end;
  double v;

  errno = 0;
  v = strtod(s, &end);
  if (end == s || errno || !isfinite(v) || *skip_space(end))
    return -EINVAL;
  *out = v;
  return 0;
}

static const char *expected(const struct setting *st) {
  switch (st->type) {
  case SET_BOOL:
    return "expected 0/1, true/false, yes/no or on/off";
  case SET_INT:
  case SET_COUNT:
    return "expected a whole number";
  case SET_SIZE:
    return "expected a number of bytes, optionally with a K, M or G suffix, e.g. 1M";
  case SET_SECONDS:
    return "expected a number of seconds, e.g. 60 or 2.5";
  case SET_LOG:
    return "expected error, warn, info, debug or 0-3";
  default:
    return "";
  }
}

/* Parse one tuning setting from text v into its field of s. */
static int setting_apply(const struct setting *st, const char *v, chorus_settings_t *s, char *err,
                         size_t errlen) {
  char *field = (char *)s + st->offset;
  char q[80];
  uint64_t u = 0;
  double d = 0;
  bool b;
  int lvl, rc;

  switch (st->type) {
  case SET_STRING:
  case SET_SECRET:
    if (strlen(v) >= st->size) {
      eng_errf(err, errlen, "%s is too long (%zu characters, at most %zu)", st->name, strlen(v),
               st->size - 1);
      return -1;
    }
    memcpy(field, v, strlen(v) + 1);
    return 0;
  case SET_BOOL:
    if (parse_bool(v, &b))
      goto bad;
    *(bool *)field = b;
    return 0;
  case SET_LOG:
    if (parse_log(v, &lvl))
      goto bad;
    *(int *)field = lvl;
    return 0;
  case SET_SECONDS:
    if (parse_seconds(v, &d))
      goto bad;
    if (d < st->min || d > st->max)
      goto range;
    *(double *)field = d;
    return 0;
  case SET_INT:
  case SET_COUNT:
  case SET_SIZE:
    rc = st->type == SET_SIZE ? parse_size(v, &u) : parse_u64(v, &u, NULL);
    if (rc == -EINVAL)
      goto bad;
    if (rc || (double)u < st->min || (double)u > st->max)
      goto range;
    if (st->type == SET_INT)
      *(int *)field = (int)u;
    else
      *(size_t *)field = (size_t)u;
    return 0;
  case SET_LAUNCH:
    break;
  }
  return 0;

bad:
  eng_errf(err, errlen, "%s='%s' is not valid (%s)", st->name, quote(v, q, sizeof(q)),
           expected(st));
  return -1;
range:
  eng_errf(err, errlen, "%s='%s' is out of range (accepted: %g to %g)", st->name,
           quote(v, q, sizeof(q)), st->min, st->max);
  return -1;
}

static int load(chorus_settings_t *s, const struct env_src *src, char *err, size_t errlen) {
  chorus_settings_t tmp;
  size_t i;

  if (!s) {
    eng_errf(err, errlen, "settings_load: NULL settings");
    return -1;
  }
  memset(&tmp, 0, sizeof(tmp));
  /* Defaults first: the table's own text goes through the same parser. */
  for (i = 0; i < NSETTINGS; i++) {
    const struct setting *st = &settings_table[i];
    if (st->type != SET_LAUNCH && setting_apply(st, st->def, &tmp, err, errlen))
      return -1;
  }
  for (i = 0; i < NSETTINGS; i++) {
    const struct setting *st = &settings_table[i];
    const char *v;

    if (st->type == SET_LAUNCH || !(v = env_get(src, st->name)))
      continue;
    if (setting_apply(st, v, &tmp, err, errlen))
      return -1;
  }
  *s = tmp;
  return 0;
}

int settings_load(chorus_settings_t *s, char *err, size_t errlen) {
  return load(s, NULL, err, errlen);
}

int settings_load_from(chorus_settings_t *s, settings_getenv_fn get, void *arg, char *err,
                       size_t errlen) {
  struct env_src src = {get, arg};

  if (!get) {
    eng_errf(err, errlen, "settings_load_from: NULL lookup");
    return -1;
  }
  return load(s, &src, err, errlen);
}

/* ---- launcher environment ---- */

/* Read a launcher integer. Returns 1 when set (*out filled), 0 when unset,
 * -1 on a malformed value (err filled). */
static int launch_int(const struct env_src *src, const char *name, long min, long *out, char *err,
                      size_t errlen) {
  const char *v = env_get(src, name);
  char q[80];
  uint64_t u;
  int rc;

  if (!v)
    return 0;
  rc = parse_u64(v, &u, NULL);
  if (rc == -ERANGE && *skip_space(v) == '-') {
    eng_errf(err, errlen, "%s='%s' is negative (expected a whole number >= %ld)", name,
             quote(v, q, sizeof(q)), min);
    return -1;
  }
  if (rc) {
    eng_errf(err, errlen, "%s='%s' is not a number (expected a whole number >= %ld)", name,
             quote(v, q, sizeof(q)), min);
    return -1;
  }
  if (u > INT32_MAX || (long)u < min) {
    eng_errf(err, errlen, "%s='%s' is out of range (expected a whole number >= %ld and < 2^31)",
             name, quote(v, q, sizeof(q)), min);
    return -1;
  }
  *out = (long)u;
  return 1;
}

/* A TCP port in 1-65535. */
static int parse_port(const char *s, long *port) {
  uint64_t u;

  if (parse_u64(s, &u, NULL) || u < 1 || u > 65535)
    return -1;
  *port = (long)u;
  return 0;
}

/* Check "host:port" ("[v6addr]:port" for IPv6 literals). */
static int check_hostport(const char *name, const char *v, char *err, size_t errlen) {
  const char *colon = strrchr(v, ':');
  char q[80];
  long port;

  if (!colon || colon == v) {
    eng_errf(err, errlen, "%s='%s' is not host:port (e.g. %s=node001:29500)", name,
             quote(v, q, sizeof(q)), name);
    return -1;
  }
  if (v[0] == '[' ? colon[-1] != ']' || colon - v < 3 : memchr(v, ':', colon - v) != NULL) {
    eng_errf(err, errlen, "%s='%s' is not host:port (write IPv6 addresses as [addr]:port)", name,
             quote(v, q, sizeof(q)));
    return -1;
  }
  if (parse_port(colon + 1, &port)) {
    eng_errf(err, errlen, "%s='%s': port '%s' is out of range (expected 1-65535)", name,
             quote(v, q, sizeof(q)), colon + 1);
    return -1;
  }
  return 0;
}

static int launch_rendezvous(const struct env_src *src, chorus_launch_env_t *e,
                             const struct launcher *l, char *err, size_t errlen) {
  const char *rv = env_get(src, "CHORUS_RENDEZVOUS");
  const char *addr = env_get(src, "MASTER_ADDR");
  const char *port = env_get(src, "MASTER_PORT");
  char q[80];
  long p;
  int n;

  if (rv) {
    if (check_hostport("CHORUS_RENDEZVOUS", rv, err, errlen))
      return -1;
    n = snprintf(e->rendezvous, sizeof(e->rendezvous), "%s", rv);
    goto check_len;
  }
  if (addr && port) {
    if (parse_port(port, &p)) {
      eng_errf(err, errlen, "MASTER_PORT='%s' is not a port (expected a number in 1-65535)",
               quote(port, q, sizeof(q)));
      return -1;
    }
    if (strchr(addr, ':') && addr[0] != '[')
      n = snprintf(e->rendezvous, sizeof(e->rendezvous), "[%s]:%ld", addr, p);
    else
      n = snprintf(e->rendezvous, sizeof(e->rendezvous), "%s:%ld", addr, p);
    goto check_len;
  }
  if (addr || port) {
    eng_errf(err, errlen,
             "%s is set but %s is not: set both MASTER_ADDR and MASTER_PORT, or "
             "CHORUS_RENDEZVOUS=host:port",
             addr ? "MASTER_ADDR" : "MASTER_PORT", addr ? "MASTER_PORT" : "MASTER_ADDR");
    return -1;
  }
  if (!strcmp(l->source, "slurm"))
    eng_errf(
        err, errlen,
        "rank and size come from Slurm (SLURM_PROCID, SLURM_NTASKS) but no rendezvous "
        "address is set: export CHORUS_RENDEZVOUS=<host of rank 0>:<free port>, e.g. "
        "CHORUS_RENDEZVOUS=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1):29500 "
        "(or set MASTER_ADDR and MASTER_PORT)");
  else if (!strcmp(l->source, "openmpi"))
    eng_errf(err, errlen,
             "rank and size come from Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE) but no "
             "rendezvous address is set: pass CHORUS_RENDEZVOUS=<host of rank 0>:<free port> to "
             "every rank, e.g. mpirun -x CHORUS_RENDEZVOUS=node001:29500 ... (or set MASTER_ADDR "
             "and MASTER_PORT)");
  else
    eng_errf(err, errlen,
             "rank and size come from %s (%s, %s) but no rendezvous address is set: set "
             "CHORUS_RENDEZVOUS=<host of rank 0>:<free port> (or MASTER_ADDR and MASTER_PORT)",
             l->title, l->rank, l->size);
  return -1;

check_len:
  if (n < 0 || (size_t)n >= sizeof(e->rendezvous)) {
    eng_errf(err, errlen, "the rendezvous address is too long (%d characters, at most %zu)", n,
             sizeof(e->rendezvous) - 1);
    return -1;
  }
  return 0;
}

/* The first launcher setting the local variable `which`, in precedence order.
 * Returns 1 and the value, 0 when none sets it, -1 on a malformed value. */
static int launch_local(const struct env_src *src, size_t which, long min, long *out,
                        const char **name, char *err, size_t errlen) {
  size_t i;

  for (i = 0; i < NLAUNCHERS; i++) {
    const char *var = which ? launchers[i].local_size : launchers[i].local_rank;
    int rc;

    if (!var)
      continue;
    rc = launch_int(src, var, min, out, err, errlen);
    if (rc) {
      *name = var;
      return rc;
    }
  }
  return 0;
}

static int launch_env(chorus_launch_env_t *e, const struct env_src *src, char *err, size_t errlen) {
  const struct launcher *l = NULL;
  const char *lr_name = NULL, *ls_name = NULL;
  long rank, size, lrank = -1, lsize = -1;
  size_t i;
  int rc;

  if (!e) {
    eng_errf(err, errlen, "settings_launch_env: NULL environment");
    return -1;
  }
  memset(e, 0, sizeof(*e));
  e->local_rank = e->local_size = -1;

  for (i = 0; i < NLAUNCHERS && !l; i++) {
    if (env_get(src, launchers[i].rank) || env_get(src, launchers[i].size))
      l = &launchers[i];
  }
  if (!l) {
    eng_errf(err, errlen,
             "no launcher environment found: set CHORUS_RANK, CHORUS_WORLD_SIZE and "
             "CHORUS_RENDEZVOUS=host:port, or launch with torchrun (RANK, WORLD_SIZE, "
             "MASTER_ADDR, MASTER_PORT), Open MPI mpirun (OMPI_COMM_WORLD_RANK, "
             "OMPI_COMM_WORLD_SIZE) or Slurm srun (SLURM_PROCID, SLURM_NTASKS)");
    return -1;
  }

  rc = launch_int(src, l->rank, 0, &rank, err, errlen);
  if (rc < 0)
    return -1;
  if (rc == 0) {
    eng_errf(err, errlen, "%s is set but %s is not (%s sets both)", l->size, l->rank, l->title);
    return -1;
  }
  rc = launch_int(src, l->size, 1, &size, err, errlen);
  if (rc < 0)
    return -1;
  if (rc == 0) {
    eng_errf(err, errlen, "%s is set but %s is not (%s sets both)", l->rank, l->size, l->title);
    return -1;
  }
  if (rank >= size) {
    eng_errf(err, errlen, "%s=%ld is out of range: %s=%ld (the rank must be below the size)",
             l->rank, rank, l->size, size);
    return -1;
  }

  if (launch_local(src, 0, 0, &lrank, &lr_name, err, errlen) < 0 ||
      launch_local(src, 1, 1, &lsize, &ls_name, err, errlen) < 0)
    return -1;
  if (lsize > size) {
    eng_errf(err, errlen, "%s=%ld is larger than the job: %s=%ld", ls_name, lsize, l->size, size);
    return -1;
  }
  if (lrank >= 0 && lsize > 0 && lrank >= lsize) {
    eng_errf(err, errlen, "%s=%ld is out of range: %s=%ld (the local rank must be below it)",
             lr_name, lrank, ls_name, lsize);
    return -1;
  }
  if (lrank >= size) {
    eng_errf(err, errlen, "%s=%ld is out of range: %s=%ld", lr_name, lrank, l->size, size);
    return -1;
  }

  if (launch_rendezvous(src, e, l, err, errlen))
    return -1;
  e->rank = (int)rank;
  e->size = (int)size;
  e->local_rank = (int)lrank;
  e->local_size = (int)lsize;
  e->source = l->source;
  return 0;
}

int settings_launch_env(chorus_launch_env_t *e, char *err, size_t errlen) {
  return launch_env(e, NULL, err, errlen);
}

int settings_launch_env_from(chorus_launch_env_t *e, settings_getenv_fn get, void *arg, char *err,
                             size_t errlen) {
  struct env_src src = {get, arg};

  if (!get) {
    eng_errf(err, errlen, "settings_launch_env_from: NULL lookup");
    return -1;
  }
  return launch_env(e, &src, err, errlen);
}

/* ---- printing ---- */

/* Print `text` wrapped to `width` columns, continuation lines indented. */
static void print_wrapped(FILE *f, const char *text, int indent, int width) {
  const char *p = text;
  int col = indent;

  while (*p) {
    const char *w = p;
    int len;

    while (*w && *w != ' ')
      w++;
    len = (int)(w - p);
    if (col > indent && col + 1 + len > width) {
      fprintf(f, "\n%*s", indent, "");
      col = indent;
    } else if (col > indent) {
      fputc(' ', f);
      col++;
    }
    fprintf(f, "%.*s", len, p);
    col += len;
    p = *w ? w + 1 : w;
  }
  fputc('\n', f);
}

static void print_row(FILE *f, const struct setting *st) {
  const char *v = getenv(st->name);
  char cur[64], q[24];

  if (!v || !*v)
    snprintf(cur, sizeof(cur), "-");
  else if (st->type == SET_SECRET)
    snprintf(cur, sizeof(cur), "(set)");
  else
    snprintf(cur, sizeof(cur), "%s", quote(v, q, sizeof(q)));
  fprintf(f, "%-27s %-8s %-20s ", st->name, st->def ? (*st->def ? st->def : "\"\"") : "-", cur);
  print_wrapped(f, st->doc, 58, 110);
}

void settings_print(FILE *f) {
  chorus_settings_t s;
  chorus_launch_env_t e;
  char err[512];
  size_t i;

  if (!f)
    return;
  fprintf(f, "Chorus settings (environment; an empty value counts as unset)\n\n");
  fprintf(f, "%-27s %-8s %-20s %s\n", "NAME", "DEFAULT", "CURRENT", "HELP");
  for (i = 0; i < NSETTINGS; i++) {
    if (settings_table[i].type != SET_LAUNCH)
      print_row(f, &settings_table[i]);
  }
  fprintf(f, "\nLauncher variables (precedence: CHORUS_* > torchrun > Open MPI > Slurm)\n\n");
  for (i = 0; i < NSETTINGS; i++) {
    if (settings_table[i].type == SET_LAUNCH)
      print_row(f, &settings_table[i]);
  }
  fprintf(f, "\n");
  if (settings_load(&s, err, sizeof(err)))
    fprintf(f, "settings: ERROR: %s\n", err);
  else
    fprintf(f, "settings: ok\n");
  if (settings_launch_env(&e, err, sizeof(err)))
    fprintf(f, "launcher: %s\n", err);
  else
    fprintf(f, "launcher: %s, rank %d of %d, rendezvous %s\n", e.source, e.rank, e.size,
            e.rendezvous);
}
