/*
 * fuzz_topo.c - the CHORUS_TOPO parser (topo_parse), then the topology it
 * describes.
 *
 * Input: byte 0: the communicator's ranks (1..64, or 1..8161 in steps of 32
 * when byte 0 >= 0xf0, byte 1 then picking the multiple); the rest is the
 * CHORUS_TOPO text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eng.h"
#include "fuzz_common.h"
#include "topo.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  eng_log_level = -1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[512], desc[256];
  int nranks, skip = 1, *labels;
  char *spec;
  topo_t *t;

  if (size < 1)
    return 0;
  nranks = 1 + data[0] % 64;
  if (data[0] >= 0xf0 && size >= 2) {
    nranks = 1 + data[1] * 32;
    skip = 2;
  }
  spec = fuzz_string(data + skip, size - (size_t)skip);
  labels = malloc((size_t)nranks * sizeof(*labels));
  if (!spec || !labels)
    goto out;
  memset(err, 0x5a, sizeof(err));
  if (topo_parse(spec, nranks, labels, err, sizeof(err))) {
    if (strnlen(err, sizeof(err)) == sizeof(err) || !strstr(err, "CHORUS_TOPO"))
      abort();
    goto out;
  }
  for (int r = 0; r < nranks; r++)
    if (labels[r] < 0)
      abort(); /* topo_from_labels takes labels >= 0 */
  t = topo_from_labels(labels, nranks);
  if (!t)
    goto out;
  if (t->nranks != nranks || t->nhosts < 1 || t->nhosts > nranks)
    abort();
  for (int r = 0; r < nranks; r++)
    if (t->host_of[r] < 0 || t->host_of[r] >= t->nhosts)
      abort();
  topo_describe(t, desc, sizeof(desc));
  topo_free(t);
out:
  free(labels);
  free(spec);
  return 0;
}
