/*
 * prov_sock_wire.h - what the sock transport (prov_sock.c) shows the world:
 * the address a rank publishes, the hello a connecting rank writes first,
 * and the header of each message on the stream after it. Private to
 * providers/ and its tests (test_sock.c plays strangers, fuzz_sock_stream.c
 * a peer whose bytes are anything).
 */
#ifndef CHORUS_PROV_SOCK_WIRE_H
#define CHORUS_PROV_SOCK_WIRE_H

#include <stdint.h>

#define SOCK_ADDR_MAGIC 0x43534b41u  /* "CSKA" */
#define SOCK_HELLO_MAGIC 0x43534b48u /* "CSKH" */
#define SOCK_HDR_MAGIC 0x43534b4du   /* "CSKM" */
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

/* What a header announces. */
enum sock_htype {
  H_EAGER = 1, /* tag, len, data; the payload follows */
  H_RTS,       /* tag, len, data, cookie (the sender's id); nothing follows */
  H_CTS,       /* cookie: the RTS's; data: the receiver's id; nothing follows */
  H_DATA,      /* tag: the receiver's id from its CTS, len; the payload follows */
};

struct sock_hdr {
  uint32_t magic;
  uint32_t type; /* enum sock_htype */
  uint64_t tag;
  uint64_t len;
  uint64_t data;
  uint64_t cookie;
};

#endif
