/*
 * fuzz_seeds.c - writes seed inputs for the fuzz targets, and a dictionary
 * of the CHORUS_ALGO words, under DIR (scripts/fuzz.sh runs it):
 *   DIR/fuzz_boot_server/seed-*   valid jobs: Hellos, rounds, Byes
 *   DIR/fuzz_boot_client/seed-*   a server's Welcome and Gathered answers
 *   DIR/fuzz_select/seed-*        one override per (collective, algorithm)
 *   DIR/fuzz_topo/seed-*, DIR/fuzz_settings/seed-*
 *   DIR/fuzz_fault_spec/seed-*    fault plans using every kind and key
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
#include "fuzz_common.h"

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
      "CHORUS_PROGRESS_THREAD=off\nCHORUS_JOURNAL=yes\nCHORUS_JOURNAL_RECORDS=1024\n"
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
  return 0;
}
