/*
 * fuzz_boot_server.c - the rendezvous server reading what clients send.
 *
 * Input: one byte of setup, then up to 16 client streams separated by
 * FUZZ_SEP. Setup bits 0-1: job size - 1; bit 2: the job token is "fuzz"
 * (else none). Each stream is fed to the real server (boot_serve_bytes) as
 * one connection that sends it and closes: framing, decoding, Hello checks,
 * rounds, Bye, refusals, job failure. The server must deal with every
 * connection and leave nothing behind (leaks are reported by LeakSanitizer).
 */
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "eng.h"
#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  signal(SIGPIPE, SIG_IGN);
  eng_log_level = -1; /* one refusal per input would flood the output */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *streams[FUZZ_MAX_STREAMS];
  size_t lens[FUZZ_MAX_STREAMS];
  int n, rc;

  if (size < 1)
    return 0;
  n = fuzz_split(data + 1, size - 1, streams, lens, FUZZ_MAX_STREAMS);
  rc = boot_serve_bytes(1 + (data[0] & 3), (data[0] & 4) ? "fuzz" : "", streams, lens, n);
  if (rc == -EDEADLK)
    abort(); /* a connection outlived its end of file */
  return 0;
}
