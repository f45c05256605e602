/*
 * trace.h - chorus-trace's insides: a dump directory read into
 * communicators of ranks (load.c), the diagnosis of one communicator
 * (diag.c), and its drawings (chrome.c, html.c, dot.c).
 *
 *   DIR/ *.trace --tr_load--> tr_set_t { tr_comm_t { tr_rank_t[size] } }
 *                                  |
 *                             tr_diagnose
 *                                  v
 *   tr_diag_t: wait-for edges, culprit or cycle, the diagnosis paragraph
 *        --> text (tr_print_*), Chrome trace JSON, HTML page, Graphviz dot
 *
 * Everything read comes from outside: a field may hold any value, a
 * sub-message may be missing. Readers of a dump go through the accessors
 * below, which bound ranks, enums and times.
 */
#ifndef CHORUS_TRACE_TOOL_H
#define CHORUS_TRACE_TOOL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trace.pb-c.h"

typedef Chorus__Trace__Dump tr_dump_t;
typedef Chorus__Trace__Call tr_call_t;
typedef Chorus__Trace__Step tr_step_t;
typedef Chorus__Trace__Checkpoint tr_ckpt_t;

/* Limits on what is read: beyond them a file or an item is skipped. */
#define TR_MAX_FILE_BYTES (64u << 20) /* one dump */
#define TR_MAX_TOTAL_BYTES (1u << 30) /* all dumps of a directory */
#define TR_MAX_FILES 65536
#define TR_MAX_RANKS 65536 /* a communicator's size */
/* A posted SEND counts as waiting on its peer once it is this old. */
#define TR_OLD_SEND_NS 1000000000ull
/* A rank is stalled when its progress engine has been silent this long
 * and TR_STALL_FACTOR times longer than any other waiting rank's. */
#define TR_STALL_MIN_NS 1000000000ull
#define TR_STALL_FACTOR 4

struct tr_edge;

/* ---- a growing string ---- */
typedef struct tr_buf {
  char *p; /* NUL-terminated; NULL until the first append */
  size_t len, cap;
  bool oom; /* an append failed: the text is cut */
} tr_buf_t;

void tr_bprintf(tr_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tr_bputs(tr_buf_t *b, const char *s);
/* Empties the text (keeps the memory). */
void tr_bclear(tr_buf_t *b);
/* The text (never NULL) ; the buffer keeps owning it. */
const char *tr_bstr(const tr_buf_t *b);
void tr_bfree(tr_buf_t *b);

/* Escapes for the three output languages. Bytes that are not UTF-8 become
 * U+FFFD; control characters are escaped or dropped; at most `max` bytes
 * of `s` are used (0: all). */
void tr_json_str(tr_buf_t *b, const char *s, size_t max); /* with quotes; safe inside <script> */
void tr_html_str(tr_buf_t *b, const char *s, size_t max);
void tr_dot_str(tr_buf_t *b, const char *s, size_t max);  /* without quotes */
void tr_text_str(tr_buf_t *b, const char *s, size_t max); /* one line for a terminal */

/* ---- names ---- */
const char *tr_coll_name(int kind); /* "allreduce", "?" */
const char *tr_dtype_name(int dtype);
const char *tr_op_name(int op);
const char *tr_step_kind_name(int kind); /* "RECV" */
const char *tr_state_name(int state);    /* "POSTED" */
const char *tr_reason_name(int reason);  /* "TIMEOUT" */
const char *tr_peer_state_name(int st);  /* "LOST" */
/* "allreduce(float32, 1048576, sum)", "barrier", "bcast(int8, 4, root 3)" */
void tr_call_str(tr_buf_t *b, const tr_call_t *c);
/* "RECV chunk 2 from rank 2", "REDUCE chunk 0" */
void tr_step_str(tr_buf_t *b, const tr_step_t *s, int size);
/* An edge's step: tr_step_str, or in a split "in the split of ranks 0,2
 * (#3 allreduce(...)): RECV chunk 0 from its rank 1" */
void tr_edge_step_str(tr_buf_t *b, const struct tr_edge *e, int size);
/* "POSTED", "FAILED (Connection reset by peer)" */
void tr_step_state_str(tr_buf_t *b, const tr_step_t *s);
/* "12.4 s", "340 ms", "85 us" */
void tr_dur_str(tr_buf_t *b, uint64_t ns);
/* "0,1,3" or "0-5,7" (runs of 4 or more; ranks[i] ascending; at most `max` listed, then "..."). */
void tr_ranks_str(tr_buf_t *b, const int *ranks, size_t n, size_t max);

/* ---- the dumps ---- */
typedef struct tr_rank {
  const tr_dump_t *d; /* NULL: no readable dump */
  const char *file;   /* its file's name, or NULL */
} tr_rank_t;

typedef struct tr_comm {
  uint32_t id;
  int size;
  tr_rank_t *ranks; /* [size] */
  int ndumps;
  /* A split (chorus_comm_split): its sub_id (0: not one) and each member's
   * rank in its family's head, the communicator of the same id (NULL where
   * its dumps disagree or give none). */
  uint64_t sub_id;
  const uint32_t *world_of;
  /* A head: the splits of its family, whose waits join its wait-for graph */
  struct tr_comm **kids;
  size_t nkids;
} tr_comm_t;

typedef struct tr_file {
  char *name;
  tr_dump_t *dump; /* NULL: skipped */
} tr_file_t;

typedef struct tr_set {
  tr_file_t *files;
  size_t nfiles;
  tr_comm_t *comms; /* by id, ascending: communicators, and splits whose head left no dump */
  size_t ncomms;
  tr_comm_t *splits; /* splits of the communicators in comms (their kids) */
  size_t nsplits;
  size_t nskipped; /* files not used (malformed, duplicate, inconsistent) */
} tr_set_t;

/* Reads every regular `*.trace` file of `dir` (others, `*.tmp` among them,
 * are ignored); a file that cannot be read, is malformed or truncated, or
 * contradicts the others is reported on `log` and skipped. Returns 0, or
 * -errno when the directory cannot be read (or -ENOMEM). tr_set_free()
 * releases the set in both cases. */
int tr_load(const char *dir, tr_set_t *set, FILE *log);
void tr_set_free(tr_set_t *set);

/* Accessors bounded against the dump's communicator. */
const tr_ckpt_t *tr_ckpt(const tr_dump_t *d); /* NULL when absent */
bool tr_in_coll(const tr_dump_t *d);
uint64_t tr_last_begun(const tr_dump_t *d);
uint64_t tr_last_finished(const tr_dump_t *d);
/* The call at `seq` in the dump's checkpoint (current or recent), or NULL. */
const tr_call_t *tr_call_at(const tr_dump_t *d, uint64_t seq);
/* The call in progress (in a collective), else the last one; may be NULL. */
const tr_call_t *tr_current(const tr_dump_t *d);
/* The dump's calls, oldest first: recent[] then the current one when it is
 * not among them; NULL past the end. */
const tr_call_t *tr_call_nth(const tr_dump_t *d, size_t i);
/* "WAIT -dep-> READY" of a journal record, with the dump's machine table
 * (numbers where it has no names). */
void tr_transition_str(tr_buf_t *b, const tr_dump_t *d, const Chorus__Trace__Transition *t);
/* Calls fn for each message both ends recorded: rank `from`'s completed
 * SEND and rank `to`'s completed RECV of the same (seq, msg). Returns 0 or
 * -ENOMEM; fn returns false to stop. */
typedef bool (*tr_pair_fn)(void *arg, int from, const Chorus__Trace__Message *send, int to,
                           const Chorus__Trace__Message *recv);
int tr_match_messages(const tr_comm_t *c, tr_pair_fn fn, void *arg);
/* `now` minus `then` on one rank's clock; 0 when `then` is unset or later. */
uint64_t tr_age(uint64_t now, uint64_t then);
/* A time of rank d on rank 0's clock, in nanoseconds (as a double). */
double tr_global_ns(const tr_dump_t *d, uint64_t t);
/* The peer of a step when it is another rank of the communicator, else -1. */
int tr_step_peer(const tr_step_t *s, int size, int self);

/* ---- the diagnosis ---- */
typedef enum tr_kind {
  TR_NONE = 0, /* no culprit */
  TR_MISMATCH, /* same collective, other arguments */
  TR_DIVERGED, /* never called the collective, or called another one */
  TR_LOST,     /* no dump, or seen lost, while others wait on it */
  TR_STALLED,  /* alive and in the collective, not moving */
  TR_LOST_MSG, /* left the collective while others wait for its messages */
  TR_CYCLE,    /* waits form a cycle and no rank stands out */
  TR_BLAMED,   /* no evidence across ranks, but the ranks' own verdicts name one */
} tr_kind;

const char *tr_kind_name(tr_kind k); /* "diverged", ... */

/* A waits for B: A's oldest step blocked on B (and how many are). */
typedef struct tr_edge {
  int from, to;
  const tr_step_t *step;
  const tr_comm_t *via;  /* the split the step is in (its ranks there), NULL: this communicator */
  const tr_dump_t *dump; /* the dump that holds the step (from's, in via when via is set) */
  uint64_t age_ns;
  uint32_t nsteps;
  bool in_cycle;
} tr_edge_t;

typedef struct tr_diag {
  const tr_comm_t *comm;
  tr_kind kind;
  int culprit;                   /* -1: none */
  uint64_t seq;                  /* the collective in question; 0: none */
  const tr_call_t *call;         /* the waiting (or majority) ranks' call at seq */
  const tr_call_t *culprit_call; /* mismatch/diverged: the culprit's call at seq */
  tr_edge_t *edges;              /* sorted by (from, to) */
  size_t nedges;
  int *cycle; /* TR_CYCLE (and a cycle met on the way): ranks, cycle[0] again last */
  size_t ncycle;
  int fsm_rank; /* whose stuck steps the dot output draws; -1: none */
  char *text;   /* the diagnosis paragraph, no newline */
} tr_diag_t;

/* Diagnoses one communicator; returns 0 or -ENOMEM. tr_diag_free() in both. */
int tr_diagnose(const tr_comm_t *c, tr_diag_t *out);
void tr_diag_free(tr_diag_t *d);

/* "in #42 allreduce(...) for 12.4 s", "in no collective, last #41 barrier",
 * "no dump" */
void tr_where(tr_buf_t *b, const tr_dump_t *d);
/* The wait-for graph as text: edges, then its root(s) or cycle. */
void tr_print_graph(const tr_diag_t *d, FILE *f, bool all);
/* Per rank: where it stands, its pending steps, its verdict and views. */
void tr_print_ranks(const tr_diag_t *d, FILE *f);

/* ---- drawings; each returns 0 or -errno (-EIO on a write error) ---- */
int tr_write_chrome(const tr_diag_t *d, FILE *f);
int tr_write_html(const tr_diag_t *d, FILE *f);
int tr_write_dot(const tr_diag_t *d, FILE *f);

#endif
