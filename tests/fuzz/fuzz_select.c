/*
 * fuzz_select.c - the CHORUS_ALGO parser (select_init), then the selector
 * on shapes each parsed rule covers.
 *
 * Input: byte 0 bits 0-2: ranks - 1 (1..8), bit 3: CHORUS_DETERMINISTIC;
 * the rest is the CHORUS_ALGO text.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"
#include "fuzz_common.h"
#include "select.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  eng_log_level = -1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  select_ctx_t s;
  char err[512], why[512];
  char *text;
  int nranks;

  if (size < 1)
    return 0;
  nranks = 1 + (data[0] & 7);
  text = fuzz_string(data + 1, size - 1);
  if (!text)
    return 0;
  memset(err, 0x5a, sizeof(err));
  if (select_init(&s, text, (data[0] & 8) != 0, err, sizeof(err))) {
    if (strnlen(err, sizeof(err)) == sizeof(err) || !strstr(err, "CHORUS_ALGO"))
      abort(); /* a refusal must say what was wrong, in a string */
    free(text);
    return 0;
  }
  for (size_t i = 0; i < s.nrules && i < 8; i++) {
    const select_rule_t *r = &s.rules[i];
    size_t bytes = r->min_bytes < (1u << 20) ? r->min_bytes : (1u << 20);
    algo_args_t a = {.coll = (coll_kind)r->coll,
                     .rank = 0,
                     .nranks = nranks,
                     .root = nranks > 1 ? 1 : 0,
                     .count = bytes / 4,
                     .dtype = CHORUS_FLOAT32,
                     .op = CHORUS_SUM,
                     .chunk_bytes = 256 << 10};

    if (!r->algo || r->min_bytes >= r->max_bytes)
      abort(); /* a parsed rule names an algorithm and a non-empty range */
    select_algo(&s, &a, why, sizeof(why));
    if (strnlen(why, sizeof(why)) == sizeof(why))
      abort();
  }
  select_fini(&s);
  free(text);
  return 0;
}
