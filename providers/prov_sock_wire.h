/*
 * prov_sock_wire.h - what the sock transport (prov_sock.c) shows the world:
 * the address a rank publishes and the hello a connecting rank writes
 * first. Private to providers/ and its tests (test_sock.c plays strangers).
 */
#ifndef CHORUS_PROV_SOCK_WIRE_H
#define CHORUS_PROV_SOCK_WIRE_H

#include <stdint.h>

#define SOCK_ADDR_MAGIC 0x43534b41u  /* "CSKA" */
#define SOCK_HELLO_MAGIC 0x43534b48u /* "CSKH" */
#define SOCK_EAGER_MAX (64 * 1024)   /* larger messages wait for their receive (RTS/CTS) */

/* getname(): where a rank listens. */
struct sock_addr {
  uint32_t magic;
  uint32_t ip; /* network order */
  uint16_t port;
  uint16_t pad;
  int32_t rank;
  uint64_t job; /* hash of the job id */
};

/* The first bytes on a connection, from the higher rank of the pair. */
struct sock_hello {
  uint32_t magic;
  int32_t rank;
  int32_t nranks;
  uint32_t pad;
  uint64_t job;
};

#endif
