/*
 * settings.h - every CHORUS_* environment variable, declared once.
 *
 * The table in settings.c is the single place that reads the environment
 * (the launcher variables of chorus_comm_init_from_env included). Each entry
 * has a name, a type, a default and its doc (a summary line, then the
 * full explanation); `chorus-info --env` prints the table, and
 * `chorus-info --settings --markdown` docs/settings.md. Values are parsed
 * and checked when a communicator is created; a malformed value is an error
 * naming the variable.
 */
#ifndef CHORUS_SETTINGS_H
#define CHORUS_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct chorus_settings {
  char provider[64];   /* CHORUS_PROVIDER: "" = auto (shm on one host, else tcp) */
  char sock_iface[64]; /* CHORUS_SOCK_IFACE: "" = FI_TCP_IFACE, else the first up non-lo */
  size_t sock_sndbuf;  /* CHORUS_SOCK_SNDBUF: sock's send buffer inside a host, 0 = kernel's */
  char job_token[256]; /* CHORUS_JOB_TOKEN */
  char rendezvous_addr[256]; /* CHORUS_RENDEZVOUS_ADDR: chorus_get_unique_id's listener */
  double connect_timeout_s;  /* CHORUS_CONNECT_TIMEOUT */
  size_t chunk_bytes;        /* CHORUS_CHUNK_BYTES: pipeline chunk */
  size_t shm_bounce;         /* CHORUS_SHM_BOUNCE: largest shm message bounced, 0 = none */
  size_t shm_stage;          /* CHORUS_SHM_STAGE: largest shm collective staged, 0 = none */
  size_t max_posted;         /* CHORUS_MAX_POSTED: receives/sends in flight per rank */
  int spin_us;               /* CHORUS_SPIN_US: progress thread's busy-poll before sleeping */
  int wait_spin_us;          /* CHORUS_WAIT_SPIN_US: a blocked caller's polling before sleeping */
  bool spread_cores;         /* CHORUS_SPREAD_CORES: a waiting caller goes back to its own core */
  int log_level;             /* CHORUS_LOG: 0 error, 1 warn, 2 info, 3 debug */
  bool journal;              /* CHORUS_JOURNAL: fsm transition journal on */
  size_t journal_records;    /* CHORUS_JOURNAL_RECORDS */
  char algo[512];            /* CHORUS_ALGO: overrides, "" = automatic (select.c parses) */
  size_t buffsize;           /* CHORUS_BUFFSIZE: scratch per communicator for staging */
  bool verify;               /* CHORUS_VERIFY: check compiled schedules */
  bool deterministic;        /* CHORUS_DETERMINISTIC: reduction order fixed by (nranks, count) */
  char topo[256];            /* CHORUS_TOPO: "" = real hosts, "hosts=HxR" emulates (topo.c) */
  bool trace;                /* CHORUS_TRACE: fingerprints, checkpoints and the watchdog */
  double timeout_s;          /* CHORUS_TIMEOUT: a collective stuck this long fails everywhere */
  double peer_timeout_s;     /* CHORUS_PEER_TIMEOUT: a rank silent this long is lost */
  int watchdog_ms;           /* CHORUS_WATCHDOG_MS: heartbeat and check period */
  char trace_dir[512];       /* CHORUS_TRACE_DIR: where dumps go; "" = none */
  bool checksum;             /* CHORUS_CHECKSUM: CRC-32C of every message, checked */
  char faults[4100];         /* CHORUS_FAULTS: fault injection spec (providers/fault.h) */
} chorus_settings_t;

/* Read and validate the whole table from the environment.
 * Returns 0, or -1 with a message naming the bad variable in err. */
int settings_load(chorus_settings_t *s, char *err, size_t errlen);
/* Print the table (name, default, current value, help) to f. */
void settings_print(FILE *f);
/* Print the table as Markdown, whatever the environment holds:
 * SETTINGS_MD_DOC docs/settings.md whole (summary and explanation of each
 * setting, the launcher variables); SETTINGS_MD_TABLE README's table, one
 * row per setting (name, default, summary). */
enum settings_md { SETTINGS_MD_DOC, SETTINGS_MD_TABLE };
void settings_print_markdown(FILE *f, enum settings_md what);

/* Launcher environment: what chorus_comm_init_from_env needs. */
typedef struct chorus_launch_env {
  int rank, size, local_rank, local_size; /* local_* = -1 when unknown */
  char rendezvous[512];                   /* "host:port" */
  const char *source;                     /* "chorus", "torchrun", "slurm", "openmpi" */
} chorus_launch_env_t;

/* Returns 0, or -1 with an explanation (which variables are missing or bad). */
int settings_launch_env(chorus_launch_env_t *e, char *err, size_t errlen);
/* The value of one launcher variable of the table (e.g. "MASTER_ADDR"), or
 * NULL when it is unset or empty or not a launcher variable. */
const char *settings_launch_var(const char *name);

/* The same two readers over another source of values than the environment
 * (tests, fuzzing): get(name, arg) returns the value of `name` or NULL; the
 * string must stay valid until the call returns. */
typedef const char *(*settings_getenv_fn)(const char *name, void *arg);
int settings_load_from(chorus_settings_t *s, settings_getenv_fn get, void *arg, char *err,
                       size_t errlen);
int settings_launch_env_from(chorus_launch_env_t *e, settings_getenv_fn get, void *arg, char *err,
                             size_t errlen);

#endif
