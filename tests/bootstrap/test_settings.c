/*
 * test_settings.c - the settings table and the launcher environment.
 *
 * Criterion runs each test in a process of its own, so the environment a
 * test sets up does not leak into the next one; each test still starts by
 * clearing every variable the table knows.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "settings.h"

static const char *const all_vars[] = {
    "CHORUS_PROVIDER",
    "CHORUS_JOB_TOKEN",
    "CHORUS_CONNECT_TIMEOUT",
    "CHORUS_CHUNK_BYTES",
    "CHORUS_SOCK_SNDBUF",
    "CHORUS_MAX_POSTED",
    "CHORUS_SPIN_US",
    "CHORUS_LOG",
    "CHORUS_VERIFY",
    "CHORUS_SPREAD_CORES",
    "CHORUS_JOURNAL",
    "CHORUS_JOURNAL_RECORDS",
    "CHORUS_RANK",
    "CHORUS_WORLD_SIZE",
    "CHORUS_LOCAL_RANK",
    "CHORUS_RENDEZVOUS",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
};

static void clean_env(void) {
  for (size_t i = 0; i < sizeof(all_vars) / sizeof(all_vars[0]); i++)
    unsetenv(all_vars[i]);
}

TestSuite(settings, .init = clean_env, .timeout = 10);

/* ---- tuning settings ---- */

Test(settings, defaults) {
  chorus_settings_t s;
  char err[256] = "";

  memset(&s, 0x5a, sizeof(s));
  cr_assert_eq(settings_load(&s, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(s.provider, "");
  cr_assert_str_eq(s.job_token, "");
  cr_assert_float_eq(s.connect_timeout_s, 60.0, 1e-9);
  cr_assert_eq(s.chunk_bytes, 256u << 10);
  cr_assert_eq(s.sock_sndbuf, 256u << 10);
  cr_assert_eq(s.max_posted, 256);
  cr_assert_eq(s.spin_us, 50);
  cr_assert_eq(s.log_level, 1);
  cr_assert(s.verify);
  cr_assert(s.spread_cores);
  cr_assert(s.journal);
  cr_assert_eq(s.journal_records, 65536);
}

Test(settings, values) {
  chorus_settings_t s;
  char err[256] = "";

  setenv("CHORUS_PROVIDER", "tcp", 1);
  setenv("CHORUS_JOB_TOKEN", "s3cret", 1);
  setenv("CHORUS_CONNECT_TIMEOUT", "2.5", 1);
  setenv("CHORUS_CHUNK_BYTES", "512K", 1);
  setenv("CHORUS_SOCK_SNDBUF", "0", 1);
  setenv("CHORUS_MAX_POSTED", "32", 1);
  setenv("CHORUS_SPIN_US", "0", 1);
  setenv("CHORUS_LOG", "debug", 1);
  setenv("CHORUS_VERIFY", "off", 1);
  setenv("CHORUS_SPREAD_CORES", "no", 1);
  setenv("CHORUS_JOURNAL", "false", 1);
  setenv("CHORUS_JOURNAL_RECORDS", "1024", 1);
  cr_assert_eq(settings_load(&s, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(s.provider, "tcp");
  cr_assert_str_eq(s.job_token, "s3cret");
  cr_assert_float_eq(s.connect_timeout_s, 2.5, 1e-9);
  cr_assert_eq(s.chunk_bytes, 512u << 10);
  cr_assert_eq(s.sock_sndbuf, 0);
  cr_assert_eq(s.max_posted, 32);
  cr_assert_eq(s.spin_us, 0);
  cr_assert_eq(s.log_level, 3);
  cr_assert(!s.verify);
  cr_assert(!s.spread_cores);
  cr_assert(!s.journal);
  cr_assert_eq(s.journal_records, 1024);
}

Test(settings, size_suffixes) {
  static const struct {
    const char *text;
    size_t bytes;
  } cases[] = {{"4096", 4096},           {"1k", 1024},       {"8K", 8192},
               {"1M", 1u << 20},         {"4MiB", 4u << 20}, {"2g", (size_t)2 << 30},
               {"3GB", (size_t)3 << 30}, {" 16 ", 16},       {"64B", 64}};
  chorus_settings_t s;
  char err[256];

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    setenv("CHORUS_CHUNK_BYTES", cases[i].text, 1);
    cr_assert_eq(settings_load(&s, err, sizeof(err)), 0, "%s: %s", cases[i].text, err);
    cr_assert_eq(s.chunk_bytes, cases[i].bytes, "%s -> %zu", cases[i].text, s.chunk_bytes);
  }
}

Test(settings, log_levels) {
  static const char *const names[] = {"error", "WARN", "info", "debug", "0", "1", "2", "3"};
  chorus_settings_t s;
  char err[256];

  for (int i = 0; i < 8; i++) {
    setenv("CHORUS_LOG", names[i], 1);
    cr_assert_eq(settings_load(&s, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(s.log_level, i % 4, "%s", names[i]);
  }
}

Test(settings, empty_means_unset) {
  chorus_settings_t s;
  char err[256];

  setenv("CHORUS_CHUNK_BYTES", "", 1);
  setenv("CHORUS_LOG", "", 1);
  cr_assert_eq(settings_load(&s, err, sizeof(err)), 0, "%s", err);
  cr_assert_eq(s.chunk_bytes, 256u << 10);
  cr_assert_eq(s.log_level, 1);
}

Test(settings, malformed_values_name_the_variable) {
  static const struct {
    const char *var, *value;
  } cases[] = {
      {"CHORUS_CONNECT_TIMEOUT", "soon"},
      {"CHORUS_CONNECT_TIMEOUT", "-1"},
      {"CHORUS_CONNECT_TIMEOUT", "0"},
      {"CHORUS_CONNECT_TIMEOUT", "nan"},
      {"CHORUS_CHUNK_BYTES", "12Q"},
      {"CHORUS_CHUNK_BYTES", "-4K"},
      {"CHORUS_CHUNK_BYTES", "0"},
      {"CHORUS_CHUNK_BYTES", "99999999999999999999"},
      {"CHORUS_CHUNK_BYTES", "1M2"},
      {"CHORUS_MAX_POSTED", "lots"},
      {"CHORUS_MAX_POSTED", "0"},
      {"CHORUS_SPIN_US", "-5"},
      {"CHORUS_SPIN_US", "5000000"},
      {"CHORUS_LOG", "verbose"},
      {"CHORUS_LOG", "4"},
      {"CHORUS_VERIFY", "maybe"},
      {"CHORUS_SPREAD_CORES", "2"},
      {"CHORUS_JOURNAL", "2"},
      {"CHORUS_JOURNAL_RECORDS", "1.5"},
  };
  chorus_settings_t s;
  char err[256];

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    clean_env();
    setenv(cases[i].var, cases[i].value, 1);
    memset(err, 0, sizeof(err));
    cr_assert_eq(settings_load(&s, err, sizeof(err)), -1, "%s=%s accepted", cases[i].var,
                 cases[i].value);
    cr_assert(strstr(err, cases[i].var), "%s: '%s'", cases[i].var, err);
    cr_assert(strstr(err, cases[i].value), "%s: '%s' does not quote the value", cases[i].var, err);
  }
}

Test(settings, long_strings_refused) {
  char big[300], err[256];
  chorus_settings_t s;

  memset(big, 'x', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  setenv("CHORUS_JOB_TOKEN", big, 1);
  cr_assert_eq(settings_load(&s, err, sizeof(err)), -1);
  cr_assert(strstr(err, "CHORUS_JOB_TOKEN"), "%s", err);
  cr_assert(!strstr(err, "xxxx"), "the token was echoed: %s", err);
  big[100] = '\0';
  setenv("CHORUS_PROVIDER", big, 1);
  unsetenv("CHORUS_JOB_TOKEN");
  cr_assert_eq(settings_load(&s, err, sizeof(err)), -1);
  cr_assert(strstr(err, "CHORUS_PROVIDER"), "%s", err);
}

/* ---- launcher environment ---- */

Test(settings, launch_chorus) {
  chorus_launch_env_t e;
  char err[512] = "";

  setenv("CHORUS_RANK", "3", 1);
  setenv("CHORUS_WORLD_SIZE", "8", 1);
  setenv("CHORUS_LOCAL_RANK", "1", 1);
  setenv("CHORUS_RENDEZVOUS", "node001:29500", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.source, "chorus");
  cr_assert_eq(e.rank, 3);
  cr_assert_eq(e.size, 8);
  cr_assert_eq(e.local_rank, 1);
  cr_assert_eq(e.local_size, -1);
  cr_assert_str_eq(e.rendezvous, "node001:29500");
}

Test(settings, launch_torchrun) {
  chorus_launch_env_t e;
  char err[512] = "";

  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "16", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.7", 1);
  setenv("MASTER_PORT", "29400", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.source, "torchrun");
  cr_assert_eq(e.rank, 5);
  cr_assert_eq(e.size, 16);
  cr_assert_eq(e.local_rank, 1);
  cr_assert_eq(e.local_size, 4);
  cr_assert_str_eq(e.rendezvous, "10.0.0.7:29400");
}

Test(settings, launch_torchrun_ipv6) {
  chorus_launch_env_t e;
  char err[512] = "";

  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "fd00::7", 1);
  setenv("MASTER_PORT", "29400", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.rendezvous, "[fd00::7]:29400");
}

Test(settings, launch_openmpi) {
  chorus_launch_env_t e;
  char err[512] = "";

  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  setenv("CHORUS_RENDEZVOUS", "head:1234", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.source, "openmpi");
  cr_assert_eq(e.rank, 2);
  cr_assert_eq(e.size, 4);
  cr_assert_eq(e.local_rank, 0);
  cr_assert_eq(e.local_size, 2);
  cr_assert_str_eq(e.rendezvous, "head:1234");
}

Test(settings, launch_slurm) {
  chorus_launch_env_t e;
  char err[512] = "";

  setenv("SLURM_PROCID", "7", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "3", 1);
  setenv("MASTER_ADDR", "node9", 1);
  setenv("MASTER_PORT", "29500", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.source, "slurm");
  cr_assert_eq(e.rank, 7);
  cr_assert_eq(e.size, 8);
  cr_assert_eq(e.local_rank, 3);
  cr_assert_eq(e.local_size, -1);
  cr_assert_str_eq(e.rendezvous, "node9:29500");
}

Test(settings, slurm_without_rendezvous_says_what_to_set) {
  chorus_launch_env_t e;
  char err[512] = "";

  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "2", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), -1);
  cr_assert(strstr(err, "Slurm"), "%s", err);
  cr_assert(strstr(err, "CHORUS_RENDEZVOUS="), "%s", err);
}

Test(settings, openmpi_without_rendezvous_says_what_to_set) {
  chorus_launch_env_t e;
  char err[512] = "";

  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), -1);
  cr_assert(strstr(err, "Open MPI"), "%s", err);
  cr_assert(strstr(err, "CHORUS_RENDEZVOUS="), "%s", err);
}

Test(settings, precedence) {
  chorus_launch_env_t e;
  char err[512] = "";

  /* Slurm < Open MPI < torchrun < CHORUS_*, added one by one. */
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_NTASKS", "10", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("MASTER_ADDR", "m", 1);
  setenv("MASTER_PORT", "1000", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.source, "slurm");
  cr_assert_eq(e.rank, 1);

  setenv("OMPI_COMM_WORLD_RANK", "2", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "20", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.source, "openmpi");
  cr_assert_eq(e.rank, 2);
  cr_assert_eq(e.size, 20);
  cr_assert_eq(e.local_rank, 2);

  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "30", 1);
  setenv("LOCAL_RANK", "3", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.source, "torchrun");
  cr_assert_eq(e.rank, 3);
  cr_assert_eq(e.size, 30);
  cr_assert_eq(e.local_rank, 3);
  cr_assert_str_eq(e.rendezvous, "m:1000");

  setenv("CHORUS_RANK", "4", 1);
  setenv("CHORUS_WORLD_SIZE", "40", 1);
  setenv("CHORUS_RENDEZVOUS", "c:2000", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), 0, "%s", err);
  cr_assert_str_eq(e.source, "chorus");
  cr_assert_eq(e.rank, 4);
  cr_assert_eq(e.size, 40);
  cr_assert_eq(e.local_rank, 3); /* CHORUS_LOCAL_RANK unset: torchrun's LOCAL_RANK */
  cr_assert_str_eq(e.rendezvous, "c:2000");
}

Test(settings, no_launcher) {
  chorus_launch_env_t e;
  char err[512] = "";

  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), -1);
  cr_assert(strstr(err, "CHORUS_RANK"), "%s", err);
  cr_assert(strstr(err, "torchrun"), "%s", err);
}

Test(settings, launcher_malformed) {
  static const struct {
    const char *vars[6];
    const char *needles[2];
  } cases[] = {
      {{"RANK", "x", "WORLD_SIZE", "4", NULL}, {"RANK='x'", "not a number"}},
      {{"RANK", "-1", "WORLD_SIZE", "4", NULL}, {"RANK='-1'", "negative"}},
      {{"RANK", "4", "WORLD_SIZE", "4", NULL}, {"RANK=4", "WORLD_SIZE=4"}},
      {{"RANK", "1", "WORLD_SIZE", "0", NULL}, {"WORLD_SIZE='0'", "range"}},
      {{"RANK", "1", NULL}, {"WORLD_SIZE", "RANK"}},
      {{"CHORUS_WORLD_SIZE", "2", NULL}, {"CHORUS_RANK", "CHORUS_WORLD_SIZE"}},
      {{"SLURM_PROCID", "9", "SLURM_NTASKS", "4", NULL}, {"SLURM_PROCID=9", "SLURM_NTASKS=4"}},
      {{"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2x", NULL},
       {"OMPI_COMM_WORLD_SIZE='2x'", NULL}},
      {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "70000"}, {"MASTER_ADDR", NULL}},
      {{"CHORUS_RANK", "0", "CHORUS_WORLD_SIZE", "2", "CHORUS_RENDEZVOUS", "host:0"},
       {"CHORUS_RENDEZVOUS='host:0'", "port"}},
      {{"CHORUS_RANK", "0", "CHORUS_WORLD_SIZE", "2", "CHORUS_RENDEZVOUS", "host"},
       {"CHORUS_RENDEZVOUS='host'", "host:port"}},
      {{"CHORUS_RANK", "0", "CHORUS_WORLD_SIZE", "2", "CHORUS_RENDEZVOUS", "h:99999"},
       {"CHORUS_RENDEZVOUS='h:99999'", NULL}},
      {{"CHORUS_RANK", "0", "CHORUS_WORLD_SIZE", "2", "LOCAL_RANK", "abc"}, {"LOCAL_RANK", NULL}},
      {{"RANK", "0", "WORLD_SIZE", "4", "LOCAL_WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE=8", NULL}},
  };
  chorus_launch_env_t e;
  char err[512];

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    clean_env();
    for (int v = 0; v < 6 && cases[i].vars[v]; v += 2)
      setenv(cases[i].vars[v], cases[i].vars[v + 1], 1);
    if (!getenv("CHORUS_RENDEZVOUS") && !getenv("MASTER_PORT"))
      setenv("CHORUS_RENDEZVOUS", "h:1", 1);
    err[0] = '\0';
    cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), -1, "case %zu accepted", i);
    for (int n = 0; n < 2; n++)
      if (cases[i].needles[n])
        cr_assert(strstr(err, cases[i].needles[n]), "case %zu: '%s' not in '%s'", i,
                  cases[i].needles[n], err);
  }
  /* MASTER_PORT out of range, with MASTER_ADDR present. */
  clean_env();
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "m", 1);
  setenv("MASTER_PORT", "70000", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), -1);
  cr_assert(strstr(err, "MASTER_PORT='70000'"), "%s", err);
  /* Local rank beyond the local size. */
  clean_env();
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "2", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "m", 1);
  setenv("MASTER_PORT", "1", 1);
  cr_assert_eq(settings_launch_env(&e, err, sizeof(err)), -1);
  cr_assert(strstr(err, "LOCAL_RANK=2"), "%s", err);
}

Test(settings, print_table) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);

  cr_assert(f);
  setenv("CHORUS_JOB_TOKEN", "topsecret", 1);
  setenv("CHORUS_CHUNK_BYTES", "2M", 1);
  settings_print(f);
  fclose(f);
  for (size_t i = 0; i < sizeof(all_vars) / sizeof(all_vars[0]); i++)
    cr_assert(strstr(text, all_vars[i]), "%s missing from the table", all_vars[i]);
  cr_assert(strstr(text, "DEFAULT") && strstr(text, "CURRENT") && strstr(text, "HELP"));
  cr_assert(strstr(text, "2M"));
  cr_assert(!strstr(text, "topsecret"), "the job token was printed");
  free(text);
}
