/*
 * fuzz_boot_client.c - a rank reading what the rendezvous server sends.
 *
 * Input: byte 0 bits 0-1: job size - 1, bits 2-3: bootstrap rounds to
 * attempt; byte 1: this rank (modulo the size); the rest is the server's
 * whole answer (frames: Welcome, Gathered, Error...) before it closes. The
 * real client (boot_client_bytes) says Hello, takes the host table, runs
 * the rounds and closes; whatever the bytes, it must fail cleanly.
 */
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "bootstrap.h"
#include "eng.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  signal(SIGPIPE, SIG_IGN);
  eng_log_level = -1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int nranks, rank, rounds;

  if (size < 2)
    return 0;
  nranks = 1 + (data[0] & 3);
  rounds = (data[0] >> 2) & 3;
  rank = data[1] % nranks;
  boot_client_bytes(rank, nranks, data + 2, size - 2, rounds);
  return 0;
}
