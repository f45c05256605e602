/*
 * fuzz_rndv_desc.c - the rendezvous descriptor a peer sends over shm in
 * place of a large message (prov_ofi.c, single-copy rendezvous): the checks
 * it goes through before this rank copies the data it points at.
 *
 * Input: bytes 0-1: the receive buffer's size (little-endian, up to 64 KiB);
 * bytes 2-3: the size of the sender's region the descriptor may name (as if
 * mapped); the rest: the message that came in (a descriptor when it has a
 * descriptor's size). prov_ofi_test_rndv_desc (prov_internal.h) runs the
 * real checks of ofi_rndv_pull and ofi_map_region; when they say the data
 * lies in the region, it is copied from a buffer of the region's size into
 * one of the receive buffer's, as ofi_rndv_pull copies it from the mapping:
 * AddressSanitizer sees any byte outside either. The data of a descriptor
 * outside the region would come by process_vm_readv from the peer's
 * process, which the kernel bounds: only its size is checked here.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "prov_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t rlen, rsize;
  uint64_t off, n;
  uint8_t *msg, *rbuf, *region;
  int rc;

  if (size < 4)
    return 0;
  rlen = (size_t)data[0] | (size_t)data[1] << 8;
  rsize = (size_t)data[2] | (size_t)data[3] << 8;
  /* a copy of its own size, so that reading past the message is seen */
  msg = malloc(size - 4 ? size - 4 : 1);
  rbuf = malloc(rlen ? rlen : 1);
  region = malloc(rsize ? rsize : 1);
  if (!msg || !rbuf || !region)
    goto out;
  memcpy(msg, data + 4, size - 4);
  memset(region, 0xa5, rsize);
  rc = prov_ofi_test_rndv_desc(msg, size - 4, rlen, rsize, &off, &n);
  switch (rc) {
  case 0:
    if (n > rlen || off > rsize || n > rsize - off)
      abort();
    memcpy(rbuf, region + off, (size_t)n);
    break;
  case 2:
    if (n > rlen)
      abort(); /* process_vm_readv into the receive buffer */
    break;
  case 1:
  case -EPROTO:
  case -EMSGSIZE:
    break;
  default:
    abort();
  }
out:
  free(msg);
  free(rbuf);
  free(region);
  return 0;
}
