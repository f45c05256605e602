/*
 * fuzz_seeds.c - writes seed inputs for the fuzz targets, and a dictionary
 * of the CHORUS_ALGO words, under DIR (scripts/fuzz.sh runs it):
 *   DIR/fuzz_boot_server/seed-*   valid jobs: Hellos, rounds, Byes
 *   DIR/fuzz_boot_client/seed-*   a server's Welcome and Gathered answers
 *   DIR/fuzz_select/seed-*        one override per (collective, algorithm)
 *   DIR/fuzz_topo/seed-*, DIR/fuzz_settings/seed-*
 *   DIR/fuzz_fault_spec/seed-*    fault plans using every kind and key
 *   DIR/fuzz_trace_load/seed-*   dump directories of hung jobs: a rank that
 *                                diverged, a mismatch, a lost rank, a stall,
 *                                a wait cycle, a blamed rank, a healthy job,
 *                                two communicators, bad files among good
 *   DIR/fuzz_peer_record/seed-*  endpoint records with ofi, doorbell and
 *                                multi addresses, as made and as split
 *   DIR/fuzz_rndv_desc/seed-*    rendezvous descriptors: in a region, in a
 *                                bounce region, by CMA, out of bounds, bad
 *   DIR/fuzz_sock_stream/seed-*  scripts and a peer's sock streams: eager
 *                                messages expected and not, rendezvous
 *                                both ways (RTS, CTS, DATA), truncation
 *   DIR/fuzz_select.dict, DIR/fuzz_fault_spec.dict
 * Valid inputs let the fuzzers start deep in each decoder instead of
 * guessing protobuf framing from nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "algos/algos.h"
#include "bootstrap.pb-c.h"
#include "endpoint.pb-c.h"
#include "fuzz_common.h"
#include "prov_sock_wire.h"
#include "trace_fixture.h"

struct buf {
  uint8_t data[1 << 16];
  size_t len;
};

static void put(struct buf *b, const void *p, size_t n) {
  if (b->len + n > sizeof(b->data)) {
    fprintf(stderr, "fuzz_seeds: seed too large\n");
    exit(1);
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

static void put_env(struct buf *b, const Chorus__Boot__Envelope *env) {
  size_t n = chorus__boot__envelope__get_packed_size(env);
  uint8_t hdr[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
  uint8_t *body = malloc(n ? n : 1);

  if (!body)
    exit(1);
  chorus__boot__envelope__pack(env, body);
  put(b, hdr, 4);
  put(b, body, n);
  free(body);
}

static void put_hello(struct buf *b, const char *token, int rank, int size) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Hello h = CHORUS__BOOT__HELLO__INIT;

  h.version = 1;
  h.token.data = (uint8_t *)token;
  h.token.len = strlen(token);
  h.rank = (uint32_t)rank;
  h.size = (uint32_t)size;
  h.host = "seed/host";
  h.timeout_ms = 60000;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_HELLO;
  env.hello = &h;
  put_env(b, &env);
}

static void put_contrib(struct buf *b, uint64_t round, const char *data) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Contribution m = CHORUS__BOOT__CONTRIBUTION__INIT;

  m.round = round;
  m.data.data = (uint8_t *)data;
  m.data.len = strlen(data);
  m.timeout_ms = 60000;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_CONTRIBUTION;
  env.contribution = &m;
  put_env(b, &env);
}

static void put_bye(struct buf *b) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Bye bye = CHORUS__BOOT__BYE__INIT;

  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_BYE;
  env.bye = &bye;
  put_env(b, &env);
}

static void put_welcome(struct buf *b, int size) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Welcome w = CHORUS__BOOT__WELCOME__INIT;
  char *hosts[4] = {"a/1", "a/1", "b/2", "b/2"};

  w.size = (uint32_t)size;
  w.n_hosts = (size_t)size;
  w.hosts = hosts;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_WELCOME;
  env.welcome = &w;
  put_env(b, &env);
}

static void put_gathered(struct buf *b, uint64_t round, int size) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Gathered g = CHORUS__BOOT__GATHERED__INIT;
  ProtobufCBinaryData d[4] = {
      {4, (uint8_t *)"\0\0\0\0"}, {4, (uint8_t *)"\1\0\0\0"}, {0, NULL}, {2, (uint8_t *)"zz"}};

  g.round = round;
  g.n_data = (size_t)size;
  g.data = d;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_GATHERED;
  env.gathered = &g;
  put_env(b, &env);
}

static void put_error(struct buf *b) {
  Chorus__Boot__Envelope env = CHORUS__BOOT__ENVELOPE__INIT;
  Chorus__Boot__Error e = CHORUS__BOOT__ERROR__INIT;
  uint32_t ranks[2] = {1, 3};

  e.code = CHORUS__BOOT__ERROR_CODE__ERROR_TIMEOUT;
  e.message = "ranks 1,3 never arrived";
  e.n_ranks = 2;
  e.ranks = ranks;
  env.msg_case = CHORUS__BOOT__ENVELOPE__MSG_ERROR;
  env.error = &e;
  put_env(b, &env);
}

static const char *root;

static void save(const char *target, int *n, const void *p, size_t len) {
  char path[4096];
  FILE *f;

  snprintf(path, sizeof(path), "%s/%s", root, target);
  if (mkdir(path, 0755) && errno != EEXIST) {
    perror(path);
    exit(1);
  }
  snprintf(path, sizeof(path), "%s/%s/seed-%03d", root, target, (*n)++);
  f = fopen(path, "wb");
  if (!f || fwrite(p, 1, len, f) != len || fclose(f)) {
    perror(path);
    exit(1);
  }
}

static void save_str(const char *target, int *n, uint8_t first, const char *s) {
  struct buf b = {.len = 0};

  put(&b, &first, 1);
  put(&b, s, strlen(s));
  save(target, n, b.data, b.len);
}

static void server_seeds(void) {
  static const uint8_t garbage[] = {0, 0, 0, 6, 0xff, 0xfe, 0x01, 0x02, 0x03, 0x04};
  int n = 0;

  for (int size = 1; size <= 4; size++) {
    for (int tok = 0; tok < 2; tok++) {
      struct buf b = {.len = 0};
      uint8_t setup = (uint8_t)((size - 1) | (tok ? 4 : 0));

      put(&b, &setup, 1);
      for (int r = 0; r < size; r++) {
        if (r)
          put(&b, FUZZ_SEP, FUZZ_SEP_LEN);
        put_hello(&b, tok ? "fuzz" : "", r, size);
        put_contrib(&b, 0, "addr");
        put_contrib(&b, 1, "");
        put_bye(&b);
      }
      save("fuzz_boot_server", &n, b.data, b.len);
    }
  }
  {
    struct buf b = {.len = 0};
    uint8_t setup = 1;

    put(&b, &setup, 1);
    put_hello(&b, "", 0, 2);
    put(&b, FUZZ_SEP, FUZZ_SEP_LEN);
    put(&b, garbage, sizeof(garbage));
    put(&b, FUZZ_SEP, FUZZ_SEP_LEN);
    put_hello(&b, "", 0, 2);
    put(&b, FUZZ_SEP, FUZZ_SEP_LEN);
    put_hello(&b, "wrong", 1, 2);
    save("fuzz_boot_server", &n, b.data, b.len);
  }
}

static void client_seeds(void) {
  int n = 0;

  for (int size = 1; size <= 4; size++) {
    struct buf b = {.len = 0};
    uint8_t setup[2] = {(uint8_t)((size - 1) | (3 << 2)), (uint8_t)(size - 1)};

    put(&b, setup, 2);
    put_welcome(&b, size);
    for (int r = 0; r < 3; r++)
      put_gathered(&b, (uint64_t)r, size);
    save("fuzz_boot_client", &n, b.data, b.len);
  }
  {
    struct buf b = {.len = 0};
    uint8_t setup[2] = {3, 0};

    put(&b, setup, 2);
    put_error(&b);
    save("fuzz_boot_client", &n, b.data, b.len);
  }
}

static void select_seeds(void) {
  char path[4096], line[256];
  FILE *dict;
  int n = 0;

  snprintf(path, sizeof(path), "%s/fuzz_select.dict", root);
  dict = fopen(path, "w");
  if (!dict) {
    perror(path);
    exit(1);
  }
  for (int c = 0; c < COLL_KIND_COUNT; c++)
    fprintf(dict, "\"%s\"\n", coll_kind_str((coll_kind)c));
  for (const algo_desc_t *d = algo_table; d->name; d++) {
    fprintf(dict, "\"%s\"\n", d->name);
    snprintf(line, sizeof(line), "%s=%s", coll_kind_str(d->coll), d->name);
    save_str("fuzz_select", &n, 3, line);
    snprintf(line, sizeof(line), "%s=%s:0-64K,%s:64K-", coll_kind_str(d->coll), d->name, d->name);
    save_str("fuzz_select", &n, 8 | 7, line);
  }
  fprintf(dict, "\"=\"\n\";\"\n\",\"\n\":\"\n\"-\"\n\"K\"\n\"M\"\n\"G\"\n\"KiB\"\n\"MB\"\n");
  if (fclose(dict)) {
    perror(path);
    exit(1);
  }
  save_str("fuzz_select", &n, 3, "allreduce=ring;bcast=tree");
  save_str("fuzz_select", &n, 3, "allreduce=rd:0-64K,ring:64K-; bcast = tree : 1M - 2G ");
}

static void topo_seeds(void) {
  int n = 0;

  save_str("fuzz_topo", &n, 7, "hosts=2x4");
  save_str("fuzz_topo", &n, 3, "map=0,0,1,1");
  save_str("fuzz_topo", &n, 5, "map=7,3,7,3,2,1");
  save_str("fuzz_topo", &n, 0, "");
  save_str("fuzz_topo", &n, 0xf0, "\x01hosts=3x11");
}

static void settings_seeds(void) {
  static const char *const seeds[] = {
      "CHORUS_PROVIDER=tcp\nCHORUS_JOB_TOKEN=s3cret\nCHORUS_CONNECT_TIMEOUT=2.5\n"
      "CHORUS_CHUNK_BYTES=1MiB\nCHORUS_MAX_POSTED=64\nCHORUS_SPIN_US=0\nCHORUS_LOG=debug\n"
      "CHORUS_TRACE=off\nCHORUS_JOURNAL=yes\nCHORUS_JOURNAL_RECORDS=1024\n"
      "CHORUS_ALGO=allreduce=ring\nCHORUS_BUFFSIZE=4M\nCHORUS_VERIFY=0\n"
      "CHORUS_DETERMINISTIC=true\nCHORUS_TOPO=hosts=2x2\n",
      "CHORUS_RANK=1\nCHORUS_WORLD_SIZE=4\nCHORUS_LOCAL_RANK=1\nCHORUS_RENDEZVOUS=node1:29500\n",
      "RANK=3\nWORLD_SIZE=8\nLOCAL_RANK=1\nLOCAL_WORLD_SIZE=4\nMASTER_ADDR=fe80::1\n"
      "MASTER_PORT=29500\n",
      "OMPI_COMM_WORLD_RANK=0\nOMPI_COMM_WORLD_SIZE=2\nOMPI_COMM_WORLD_LOCAL_RANK=0\n"
      "OMPI_COMM_WORLD_LOCAL_SIZE=2\nCHORUS_RENDEZVOUS=[::1]:1234\n",
      "SLURM_PROCID=5\nSLURM_NTASKS=6\nSLURM_LOCALID=2\nMASTER_ADDR=10.0.0.1\nMASTER_PORT=80\n",
  };
  int n = 0;

  for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
    save("fuzz_settings", &n, seeds[i], strlen(seeds[i]));
}

static void fault_spec_seeds(void) {
  static const char *const seeds[] = {
      /* the example of prov.h and the README */
      ("seed=7;drop:p=0.01;delay:ms=50,p=0.1;dup:p=0.01;reorder:p=0.05;corrupt:p=0.001;"
       "kill:rank=3,at=allreduce#100;stall:rank=1,at=#40,s=30"),
      "drop:rank=0,peer=2,p=1;dup:from=#3,to=#9,n=2;corrupt:at=#5",
      " seed = 42 ; delay : ms = 5 , p = .5 ; reorder:n=3 ;",
      "stall:rank=0,at=reduce_scatter#2,s=0.25,p=0.5;kill:rank=1,at=#18446744073709551615",
      "drop:p=1e-300;drop:p=0.30000000000000004;stall:rank=2,at=bcast#1,s=6e5",
      "",
  };
  /* dictionary words, separated by spaces */
  static const char words[] = "seed drop delay dup reorder corrupt kill stall p ms s rank peer at "
                              "from to n allreduce bcast reduce allgather reduce_scatter "
                              "alltoall gather scatter barrier send recv = ; , : # e- .5 0.";
  char path[4096];
  FILE *dict;
  int n = 0;

  for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
    save("fuzz_fault_spec", &n, seeds[i], strlen(seeds[i]));
  snprintf(path, sizeof(path), "%s/fuzz_fault_spec.dict", root);
  dict = fopen(path, "w");
  if (!dict) {
    perror(path);
    exit(1);
  }
  for (const char *w = words, *e; *w; w = *e ? e + 1 : e) {
    e = strchr(w, ' ');
    if (!e)
      e = w + strlen(w);
    fprintf(dict, "\"%.*s\"\n", (int)(e - w), w);
  }
  if (fclose(dict)) {
    perror(path);
    exit(1);
  }
}

/* ---- fuzz_trace_load: dump files, FUZZ_SEP between them ---- */

#define T0 1000000000000ull /* rank 0's clock at the job's start */

static int64_t off_of(int r) {
  return ((int64_t)r * 7 - 10) * 1000000;
}

/* rank r's clock at `ms` milliseconds of rank 0's */
static uint64_t L(int r, double ms) {
  return (uint64_t)((int64_t)T0 + (int64_t)(ms * 1e6) - off_of(r));
}

/* Appends d's packed bytes (the first `cut` of them when cut != 0) to b,
 * after a separator unless b is empty; frees d. */
static void put_dump(struct buf *b, tf_dump_t *d, size_t cut) {
  size_t len = 0;
  uint8_t *p = tf_pack(d, &len);

  if (!p) {
    fprintf(stderr, "fuzz_seeds: packing a dump failed\n");
    exit(1);
  }
  if (b->len)
    put(b, FUZZ_SEP, FUZZ_SEP_LEN);
  put(b, p, cut && cut < len ? cut : len);
  free(p);
  tf_free(d);
}

/* The history every rank of a job shares: #40 allreduce (with its ring
 * messages), #41 barrier, a step machine journal, its peers alive. */
static tf_dump_t *job_rank(uint32_t comm, int r, int size, double t_dump_ms) {
  int prev = (r + size - 1) % size, next = (r + 1) % size;
  tf_dump_t *d = tf_new(comm, r, size, L(r, t_dump_ms), off_of(r));

  tf_call(d, 40, TF_ALLREDUCE, TF_FLOAT32, 1 << 20, TF_SUM, -1, L(r, 100), L(r, 150));
  tf_call(d, 41, TF_BARRIER, 0, 0, 0, -1, L(r, 160), L(r, 170));
  for (uint32_t c = 0; c < 2; c++) {
    tf_message(d, 40, 2 * c, true, next, c, c, 1 << 19, L(r, 100 + 10 * c), L(r, 104 + 10 * c));
    tf_message(d, 40, 2 * c + 1, false, prev, c, c, 1 << 19, L(r, 101 + 10 * c),
               L(r, 106 + 10 * c));
  }
  tf_journal(d, L(r, 100), 0, 40, TF_J_WAIT, TF_E_DEP, TF_J_READY);
  tf_journal(d, L(r, 101), 0, 40, TF_J_READY, TF_E_POSTED, TF_J_POSTED);
  tf_journal(d, L(r, 104), 0, 40, TF_J_POSTED, TF_E_COMPLETE, TF_J_DONE);
  tf_journal(d, L(r, 105), 1, 40, TF_J_DONE, TF_E_RUN, 0xffff); /* a miss */
  for (int p = 0; p < size; p++)
    if (p != r)
      tf_peer(d, p, TF_ALIVE, 41, L(r, 170));
  return d;
}

/* In #42 allreduce: RECV from the previous rank and SEND to the next
 * posted, a REDUCE waiting for the RECV. */
static void in_42(tf_dump_t *d, int r, int size, double progress_ms) {
  int prev = (r + size - 1) % size, next = (r + 1) % size;

  tf_call(d, 42, TF_ALLREDUCE, TF_FLOAT32, 1 << 20, TF_SUM, -1, L(r, 200), 0);
  tf_where(d, 42, 41, true, L(r, progress_ms));
  tf_step(d, 42, 5, TF_RECV, TF_POSTED, prev, 2, L(r, 250));
  tf_step(d, 42, 6, TF_SEND, TF_POSTED, next, 3, L(r, 250));
  tf_step(d, 42, 7, TF_REDUCE, TF_WAIT, -1, 2, L(r, 200))->ndeps_left = 1;
  tf_journal(d, L(r, 240), 5, 42, TF_J_WAIT, TF_E_DEP, TF_J_READY);
  tf_journal(d, L(r, 250), 5, 42, TF_J_READY, TF_E_POSTED, TF_J_POSTED);
  tf_message(d, 42, 6, true, next, 3, 3, 1 << 18, L(r, 250), 0);
}

static void trace_seeds(void) {
  int n = 0;

  { /* rank 2 finished #41 and never called #42: diverged */
    struct buf b = {.len = 0};
    for (int r = 0; r < 4; r++) {
      tf_dump_t *d = job_rank(7, r, 4, 12650);
      if (r != 2) {
        in_42(d, r, 4, 12600);
        tf_verdict(d, TF_TIMEOUT, -1, "collective #42 waited past CHORUS_TIMEOUT (12 s)",
                   L(r, 12640));
        if (r == 0)
          tf_fault(d, L(r, 300), "delay", 1, 42, "50 ms");
      } else {
        tf_where(d, 41, 41, false, L(r, 175));
        tf_verdict(d, TF_REQUEST, -1, "dump requested by rank 0", L(r, 12650));
      }
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* #7: rank 1 passed another count; rank 3 left no dump */
    struct buf b = {.len = 0};
    for (int r = 0; r < 3; r++) {
      tf_dump_t *d = tf_new(3, r, 4, L(r, 5310), off_of(r));
      tf_call(d, 6, TF_ALLREDUCE, TF_FLOAT32, 1024, TF_SUM, -1, L(r, 100), L(r, 120));
      tf_call(d, 7, TF_ALLREDUCE, TF_FLOAT32, r == 1 ? 1000 : 1024, TF_SUM, -1, L(r, 300), 0);
      tf_where(d, 7, 6, true, L(r, 5300));
      tf_step(d, 7, 1, TF_RECV, TF_POSTED, (r + 3) % 4, 0, L(r, 310));
      tf_verdict(d, TF_TIMEOUT, -1, "collective #7 waited past CHORUS_TIMEOUT", L(r, 5300));
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* rank 3 killed: no dump, seen lost by rank 0, suspect by rank 2 */
    struct buf b = {.len = 0};
    for (int r = 0; r < 3; r++) {
      tf_dump_t *d = tf_new(5, r, 4, L(r, 8510), off_of(r));
      tf_call(d, 11, TF_BCAST, TF_FLOAT32, 65536, 0, 3, L(r, 100), L(r, 130));
      tf_call(d, 12, TF_ALLREDUCE, TF_FLOAT32, 65536, TF_SUM, -1, L(r, 500), 0);
      tf_where(d, 12, 11, true, L(r, 8500));
      tf_step(d, 12, 1, TF_RECV, TF_POSTED, (r + 3) % 4, 0, L(r, 510));
      if (r == 2)
        tf_step(d, 12, 2, TF_SEND, TF_POSTED, 3, 0, L(r, 510));
      if (r == 0) {
        tf_peer(d, 3, TF_LOST, 11, L(r, 505));
        tf_fault(d, L(r, 506), "transport", 3, 12, "fi_cq_readerr: connection reset by peer");
      }
      if (r == 2)
        tf_peer(d, 3, TF_SUSPECT, 11, L(r, 505));
      tf_verdict(d, TF_TIMEOUT, -1, "collective #12 waited past CHORUS_TIMEOUT", L(r, 8500));
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* rank 1's progress engine silent for 40 s, its send still READY */
    struct buf b = {.len = 0};
    for (int r = 0; r < 4; r++) {
      tf_dump_t *d = tf_new(9, r, 4, L(r, 40500), off_of(r));
      tf_call(d, 19, TF_BARRIER, 0, 0, 0, -1, L(r, 100), L(r, 110));
      tf_call(d, 20, TF_ALLREDUCE, TF_FLOAT32, 262144, TF_SUM, -1, L(r, 500), 0);
      tf_where(d, 20, 19, true, L(r, r == 1 ? 600 : 40450));
      tf_step(d, 20, 1, TF_RECV, TF_POSTED, (r + 3) % 4, 0, L(r, 550));
      if (r == 1)
        tf_step(d, 20, 2, TF_SEND, TF_READY, 2, 0, L(r, 600));
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* two ranks waiting on each other, both alive: a cycle */
    struct buf b = {.len = 0};
    for (int r = 0; r < 2; r++) {
      tf_dump_t *d = tf_new(11, r, 2, L(r, 3200), off_of(r));
      tf_call(d, 5, TF_ALLREDUCE, TF_FLOAT32, 4096, TF_SUM, -1, L(r, 150), 0);
      tf_where(d, 5, 4, true, L(r, 3190));
      tf_step(d, 5, 0, TF_RECV, TF_POSTED, 1 - r, 0, L(r, 200));
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* no evidence across ranks, but rank 0's verdict blames rank 1 */
    struct buf b = {.len = 0};
    for (int r = 0; r < 2; r++) {
      tf_dump_t *d = job_rank(12, r, 2, 900);
      tf_where(d, 41, 41, false, L(r, 880));
      if (r == 0) {
        tf_msg(d)->journal_dropped = 17;
        tf_verdict(d, CHORUS__TRACE__VERDICT__REASON__MISMATCH, 1,
                   "a message of rank 1 carried fingerprint 0x1234, not ours", L(r, 890));
      }
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* healthy: both done with #5 */
    struct buf b = {.len = 0};
    for (int r = 0; r < 2; r++) {
      tf_dump_t *d = tf_new(1, r, 2, L(r, 900), off_of(r));
      tf_call(d, 5, TF_BCAST, TF_FLOAT32, 16, 0, 0, L(r, 100), L(r, 110));
      tf_where(d, 5, 5, false, L(r, 110));
      tf_verdict(d, TF_REQUEST, -1, "dump requested", L(r, 900));
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* two communicators: comm 1 (2 ranks, one in #42) and comm 2 (2 ranks) */
    struct buf b = {.len = 0};
    for (int k = 0; k < 4; k++) {
      int r = k % 2;
      tf_dump_t *d = job_rank(k < 2 ? 1 : 2, r, 2, 5000);
      if (k == 1)
        in_42(d, r, 2, 4990);
      else
        tf_where(d, 41, 41, false, L(r, 180));
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* bad among good: a truncated dump, the same rank twice, a size the
       others contradict */
    struct buf b = {.len = 0};
    tf_dump_t *d = job_rank(4, 0, 3, 3000);
    in_42(d, 0, 3, 2990);
    put_dump(&b, d, 0);
    d = job_rank(4, 1, 3, 3000);
    in_42(d, 1, 3, 2990);
    put_dump(&b, d, 40);
    d = job_rank(4, 0, 3, 3000);
    tf_where(d, 41, 41, false, L(0, 180));
    put_dump(&b, d, 0);
    d = job_rank(4, 2, 5, 3000);
    put_dump(&b, d, 0);
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* a split of both ranks (sub_id 0x51): rank 0 waits in it for rank 1,
       which waits in the world's #42 for rank 0 */
    static const uint32_t both[] = {1, 0};
    struct buf b = {.len = 0};
    for (int k = 0; k < 4; k++) {
      int r = k % 2;
      tf_dump_t *d = job_rank(13, k < 2 ? r : 1 - r, 2, 3000);
      if (k == 1)
        in_42(d, 1, 2, 2990);
      else if (k == 2) {
        tf_split(d, 0x51, both, 2);
        in_42(d, 0, 2, 2990);
      } else {
        if (k == 3)
          tf_split(d, 0x51, both, 2);
        tf_where(d, 41, 41, false, L(r, 180));
        tf_msg(d)->checkpoint->destroying = k == 3;
      }
      put_dump(&b, d, 0);
    }
    save("fuzz_trace_load", &n, b.data, b.len);
  }
  { /* one rank of a large communicator, every other rank without a dump */
    struct buf b = {.len = 0};
    tf_dump_t *d = job_rank(6, 5, 64, 2000);
    in_42(d, 5, 64, 1990);
    put_dump(&b, d, 0);
    save("fuzz_trace_load", &n, b.data, b.len);
  }
}

/* ---- fuzz_peer_record: endpoint records, FUZZ_SEP between them ---- */

#define OFI_MAGIC 0x43484f46u   /* prov_ofi.c OFI_ADDR_MAGIC */
#define MULTI_MAGIC 0x43484d55u /* prov_multi.c MULTI_ADDR_MAGIC */

static void put_hdr(struct buf *b, uint32_t magic, size_t l0, size_t l1) {
  uint16_t a = (uint16_t)l0, c = (uint16_t)l1;

  put(b, &magic, 4);
  put(b, &a, 2);
  put(b, &c, 2);
}

/* prov_ofi's address: the libfabric name, then the doorbell (when db). */
static void put_ofi_addr(struct buf *b, const void *fab, size_t fab_len, bool db, int rank) {
  char sock[32];
  int32_t pid = 4000 + rank, memfd = 9;
  uint64_t nonce = 0x5eed0000u + (uint64_t)rank, va = 0x7f0000001000ull;
  uint8_t nl;

  sock[0] = '\0'; /* abstract */
  nl = (uint8_t)(1 + snprintf(sock + 1, sizeof(sock) - 1, "chorus-db-%d-%d", pid, rank));
  put_hdr(b, OFI_MAGIC, fab_len, db ? 25u + nl : 0);
  put(b, fab, fab_len);
  if (db) {
    put(b, &pid, 4);
    put(b, &memfd, 4);
    put(b, &nonce, 8);
    put(b, &va, 8);
    put(b, &nl, 1);
    put(b, sock, nl);
  }
}

/* A transport address of `rank` for transport kind t (fuzz_peer_record.c). */
static void put_addr(struct buf *b, int t, int rank) {
  char shm[64];
  uint8_t in4[16] = {2, 0, 0x75, (uint8_t)(0x30 + rank), 10, 0, 0, (uint8_t)(1 + rank)};
  int sl = snprintf(shm, sizeof(shm), "chorus://chorus-%d-%d", 4000 + rank, rank);

  if (t == 0) {
    put_ofi_addr(b, shm, (size_t)sl, true, rank);
  } else if (t == 1 || t == 3) {
    put_ofi_addr(b, in4, sizeof(in4), false, rank);
  } else {
    struct buf p0 = {.len = 0}, p1 = {.len = 0};
    if (rank < 2) /* ranks 0 and 1 on our host */
      put_ofi_addr(&p0, shm, (size_t)sl, true, rank);
    put_ofi_addr(&p1, in4, sizeof(in4), false, rank);
    put_hdr(b, MULTI_MAGIC, p0.len, p1.len);
    put(b, p0.data, p0.len);
    put(b, p1.data, p1.len);
  }
}

static void put_record(struct buf *b, int t, int rank, const char *provider, const char *host) {
  static const char *const names[] = {"shm", "tcp;ofi_rxm", "shm+tcp;ofi_rxm", "verbs;ofi_rxm"};
  Chorus__Ep__Endpoint ep = CHORUS__EP__ENDPOINT__INIT;
  struct buf a = {.len = 0};
  uint8_t *packed;
  size_t n;

  put_addr(&a, t, rank);
  ep.rank = (uint32_t)rank;
  ep.provider = (char *)(provider ? provider : names[t]);
  ep.address.data = a.data;
  ep.address.len = a.len;
  ep.host = (char *)host;
  ep.pid = (uint32_t)(4000 + rank);
  n = chorus__ep__endpoint__get_packed_size(&ep);
  packed = malloc(n ? n : 1);
  if (!packed)
    exit(1);
  chorus__ep__endpoint__pack(&ep, packed);
  put(b, packed, n);
  free(packed);
}

static void peer_record_seeds(void) {
  int n = 0;

  for (int t = 0; t < 4; t++) {
    for (int size = 1; size <= 4; size *= 2) {
      for (int split = 0; split < 2; split++) {
        struct buf b = {.len = 0};
        /* rank size-1; CHORUS_TOPO checked at creation, not at a split */
        uint8_t setup = (uint8_t)((size - 1) | t << 4 | (split ? 0x80 : 0x40));

        put(&b, &setup, 1);
        /* split: first the record of a rank left out of the group (empty) */
        for (int i = 0; i < size; i++) {
          /* a split hands the members' records over in reverse */
          int r = split ? size - 1 - i : i;
          if (i || split)
            put(&b, FUZZ_SEP, FUZZ_SEP_LEN);
          put_record(&b, t, r, NULL, split ? "" : "node-a/boot-1|hosts=2x2");
        }
        save("fuzz_peer_record", &n, b.data, b.len);
      }
    }
  }
  { /* refusals: another transport, another CHORUS_TOPO */
    struct buf b = {.len = 0};
    uint8_t setup = 1 << 4 | 0x40;

    put(&b, &setup, 1);
    put_record(&b, 1, 0, NULL, "node-a/boot-1|hosts=2x1");
    put(&b, FUZZ_SEP, FUZZ_SEP_LEN);
    put_record(&b, 1, 1, "shm", "node-a/boot-1|hosts=2x1");
    save("fuzz_peer_record", &n, b.data, b.len);
    b.len = 0;
    put(&b, &setup, 1);
    put_record(&b, 1, 0, NULL, "node-a/boot-1|hosts=2x1");
    put(&b, FUZZ_SEP, FUZZ_SEP_LEN);
    put_record(&b, 1, 1, NULL, "node-b/boot-2|map=0,0");
    save("fuzz_peer_record", &n, b.data, b.len);
  }
}

/* ---- fuzz_rndv_desc: receive buffer and region sizes, then a message ---- */

/* prov_ofi.c's struct ofi_rndv_desc, as it travels */
struct rndv_desc {
  uint64_t addr, len, cookie;
  int32_t pid;
  uint32_t magic;
  uint64_t rid, ino, roff;
  int32_t rfd;
  uint32_t flags;
  uint64_t data;
};

static void save_desc(int *n, uint16_t rlen, uint16_t rsize, uint64_t len, uint64_t rid,
                      uint64_t roff, uint32_t magic, uint32_t flags) {
  struct rndv_desc d = {.addr = 0x7f1234560000ull,
                        .len = len,
                        .cookie = (uint64_t)7 << 32 | 3,
                        .pid = 4242,
                        .magic = magic,
                        .rid = rid,
                        .ino = 77,
                        .roff = roff,
                        .rfd = 12,
                        .flags = flags,
                        .data = 0x1234};
  struct buf b = {.len = 0};
  uint8_t sizes[4] = {(uint8_t)rlen, (uint8_t)(rlen >> 8), (uint8_t)rsize, (uint8_t)(rsize >> 8)};

  put(&b, sizes, 4);
  put(&b, &d, sizeof(d));
  save("fuzz_rndv_desc", n, b.data, b.len);
}

static void rndv_desc_seeds(void) {
  const uint32_t magic = 0x434d4152u; /* prov_ofi.c OFI_RNDV_DATA */
  int n = 0;

  save_desc(&n, 4096, 8192, 4096, 1, 4096, magic, 0);    /* in a mapped region */
  save_desc(&n, 4096, 8192, 1024, 2, 0, magic, 1);       /* in the sender's bounce region */
  save_desc(&n, 4096, 0, 4096, 0, 0, magic, 0);          /* no region: process_vm_readv */
  save_desc(&n, 4096, 8192, 4096, 1, 6144, magic, 0);    /* past the region's end */
  save_desc(&n, 1024, 8192, 4096, 1, 0, magic, 0);       /* longer than the receive buffer */
  save_desc(&n, 4096, 8192, 4096, 1, 0, 0x52414d43u, 0); /* not a descriptor */
}

/* ---- fuzz_sock_stream: a script, then the peer's pieces ---- */

/* A rendezvous message is over 64 KiB: these seeds need more room. */
struct sbuf {
  uint8_t data[1 << 18];
  size_t len;
};

static void sput(struct sbuf *b, const void *p, size_t n) {
  if (b->len + n > sizeof(b->data)) {
    fprintf(stderr, "fuzz_seeds: seed too large\n");
    exit(1);
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

static void put_sock_hdr(struct sbuf *b, uint32_t type, uint64_t tag, uint64_t len, uint64_t data,
                         uint64_t cookie) {
  struct sock_hdr h = {SOCK_HDR_MAGIC, type, tag, len, data, cookie};

  sput(b, &h, sizeof(h));
}

static void put_bytes(struct sbuf *b, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; i++)
    sput(b, &v, 1);
}

/* script (two bytes an op, fuzz_sock_stream.c), then FUZZ_SEP and pieces */
static void save_sock(int *n, const char *script, size_t slen, struct sbuf *pieces, int npieces) {
  struct sbuf *b = calloc(1, sizeof(*b));

  if (!b)
    exit(1);
  sput(b, script, slen);
  for (int i = 0; i < npieces; i++) {
    sput(b, FUZZ_SEP, FUZZ_SEP_LEN);
    sput(b, pieces[i].data, pieces[i].len);
  }
  save("fuzz_sock_stream", n, b->data, b->len);
  free(b);
}

static void sock_stream_seeds(void) {
  struct sbuf *pc = calloc(2, sizeof(*pc));
  int n = 0;

  if (!pc)
    exit(1);
  /* eager messages: one expected (R tag 1, 40 bytes), one not (tag 2) */
  put_sock_hdr(&pc[0], H_EAGER, 1, 40, 7, 0);
  put_bytes(&pc[0], 40, 0xab);
  put_sock_hdr(&pc[0], H_EAGER, 2, 4097, 8, 0);
  put_bytes(&pc[0], 4097, 0xcd);
  save_sock(&n, "\x07\x00\x02\x11\x00\x00\x01\x03\x02\x22\x01\x03", 12, pc, 1);
  /* a rendezvous to rank 0: RTS, its CTS goes out, then DATA (id 1) */
  memset(pc, 0, 2 * sizeof(*pc));
  put_sock_hdr(&pc[0], H_RTS, 3, 65537, 9, 77);
  put_sock_hdr(&pc[1], H_DATA, 1, 65537, 0, 0);
  put_bytes(&pc[1], 65537, 0x5a);
  save_sock(&n, "\x07\x00\x02\x33\x00\x00\x01\x03\x05\x00\x00\x00\x01\x07", 14, pc, 2);
  /* the same into a smaller receive (truncated), then an eager one */
  put_sock_hdr(&pc[1], H_EAGER, 4, 1, 0, 0);
  put_bytes(&pc[1], 1, 0x01);
  save_sock(&n, "\x07\x00\x02\x23\x02\x0c\x00\x00\x01\x03\x05\x00\x00\x00\x01\x07", 16, pc, 2);
  /* rank 0 sends a rendezvous (S 65537 bytes, tag 5, RTS id 1): the CTS */
  memset(pc, 0, 2 * sizeof(*pc));
  put_sock_hdr(&pc[0], H_CTS, 0, 0, 42, 1);
  save_sock(&n, "\x07\x00\x03\x35\x01\x03\x05\x00\x00\x00\x01\x07\x05\x00", 14, pc, 1);
  /* a stranger's hello, and garbage after a good one */
  memset(pc, 0, 2 * sizeof(*pc));
  put_bytes(&pc[0], 24, 0x41);
  save_sock(&n, "\x00\x00\x01\x03", 4, pc, 1);
  memset(pc, 0, 2 * sizeof(*pc));
  put_sock_hdr(&pc[0], 9, 0, 0, 0, 0);
  save_sock(&n, "\x07\x00\x00\x00\x01\x03\x06\x00\x01\x03", 10, pc, 1);
  free(pc);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  root = argv[1];
  if (mkdir(root, 0755) && errno != EEXIST) {
    perror(root);
    return 1;
  }
  server_seeds();
  client_seeds();
  select_seeds();
  topo_seeds();
  settings_seeds();
  fault_spec_seeds();
  trace_seeds();
  peer_record_seeds();
  rndv_desc_seeds();
  sock_stream_seeds();
  return 0;
}
