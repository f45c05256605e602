/*
 * fuzz_settings.c - every CHORUS_* setting and the launcher variables, read
 * by the real readers (settings_load_from, settings_launch_env_from) from an
 * environment made of the input.
 *
 * Input: lines "NAME=value" (the first line naming a variable wins; a
 * variable no line names is unset).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"
#include "fuzz_common.h"
#include "settings.h"

#define MAX_LINES 64

struct env {
  char *lines[MAX_LINES];
  int n;
};

static const char *lookup(const char *name, void *arg) {
  const struct env *e = arg;
  size_t len = strlen(name);

  for (int i = 0; i < e->n; i++)
    if (!strncmp(e->lines[i], name, len) && e->lines[i][len] == '=')
      return e->lines[i] + len + 1;
  return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  eng_log_level = -1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  chorus_settings_t s;
  chorus_launch_env_t l;
  struct env e = {.n = 0};
  char err[1024];
  char *text = fuzz_string(data, size), *p, *save = NULL;

  if (!text)
    return 0;
  for (p = strtok_r(text, "\n", &save); p && e.n < MAX_LINES; p = strtok_r(NULL, "\n", &save))
    e.lines[e.n++] = p;

  memset(err, 0x5a, sizeof(err));
  if (settings_load_from(&s, lookup, &e, err, sizeof(err))) {
    if (strnlen(err, sizeof(err)) == sizeof(err))
      abort();
  } else {
    /* what the table promises its readers */
    if (s.connect_timeout_s < 0.001 || !(s.connect_timeout_s <= 7 * 86400.0) || s.chunk_bytes < 1 ||
        s.max_posted < 1 || s.spin_us < 0 || s.log_level < 0 || s.log_level > 3 ||
        s.journal_records < 1 || s.buffsize < 4096 ||
        strnlen(s.provider, sizeof(s.provider)) == sizeof(s.provider) ||
        strnlen(s.job_token, sizeof(s.job_token)) == sizeof(s.job_token) ||
        strnlen(s.algo, sizeof(s.algo)) == sizeof(s.algo) ||
        strnlen(s.topo, sizeof(s.topo)) == sizeof(s.topo))
      abort();
  }

  memset(err, 0x5a, sizeof(err));
  if (settings_launch_env_from(&l, lookup, &e, err, sizeof(err))) {
    if (strnlen(err, sizeof(err)) == sizeof(err))
      abort();
  } else {
    if (l.rank < 0 || l.size < 1 || l.rank >= l.size || !l.source ||
        (l.local_size >= 0 && l.local_size > l.size) ||
        (l.local_rank >= 0 && l.local_size > 0 && l.local_rank >= l.local_size) ||
        strnlen(l.rendezvous, sizeof(l.rendezvous)) == sizeof(l.rendezvous) ||
        !strchr(l.rendezvous, ':'))
      abort();
  }
  free(text);
  return 0;
}
