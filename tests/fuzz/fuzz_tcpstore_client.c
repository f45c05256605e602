/*
 * fuzz_tcpstore_client.c - the TCPStore client (engine/boot/tcpstore.c) reading
 * what a server at MASTER_ADDR:MASTER_PORT answers.
 *
 * Input: byte 0 bit 0: the protocol spoken (0: torch 1.x, 1: torch 2.x,
 * with its handshake); the rest is the server's whole answer before it
 * closes. The real client (tcpstore_client_bytes) asks for the key count,
 * sets a key, waits for it and gets it; whatever the bytes, it must end
 * cleanly, reading no more than the lengths it accepts.
 */
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "eng.h"
#include "tcpstore.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  signal(SIGPIPE, SIG_IGN);
  eng_log_level = -1;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  tcpstore_client_bytes(data[0] & 1 ? TCPSTORE_V2 : TCPSTORE_V1, data + 1, size - 1);
  return 0;
}
