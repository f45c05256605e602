/*
 * prov.c - transport registry: prov_open() picks an implementation by name.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "memcopy.h"
#include "ofi_lib.h"
#include "prov_internal.h"

void prov_errf(char *errbuf, size_t errlen, const char *fmt, ...) {
  va_list ap;

  if (!errbuf || !errlen)
    return;
  va_start(ap, fmt);
  vsnprintf(errbuf, errlen, fmt, ap);
  va_end(ap);
}

int prov_copy_name(const void *name, size_t n, void *addr, size_t *len) {
  if (!len)
    return -EINVAL;
  if (!addr || *len < n) {
    *len = n;
    return -ENOSPC;
  }
  memcpy(addr, name, n);
  *len = n;
  return 0;
}

int prov_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen) {
  const prov_ops_t *ops;

  if (out)
    *out = NULL;
  if (!cfg || !out || !cfg->name || !cfg->name[0]) {
    prov_errf(errbuf, errlen, "prov_open: missing configuration or provider name");
    return -EINVAL;
  }
  if (cfg->nranks <= 0 || cfg->rank < 0 || cfg->rank >= cfg->nranks) {
    prov_errf(errbuf, errlen, "prov_open: rank %d out of range for %d ranks", cfg->rank,
              cfg->nranks);
    return -EINVAL;
  }
  memcopy_init(); /* the data path's copies, chosen before the first */
  if (cfg->faults && cfg->faults[0])
    ops = &prov_fault_ops;
  else if (strchr(cfg->name, '+'))
    ops = &prov_multi_ops;
  else if (strcmp(cfg->name, "inproc") == 0)
    ops = &prov_inproc_ops;
  else if (strcmp(cfg->name, "sock") == 0)
    ops = &prov_sock_ops;
  else
    return ofi_lib_open(cfg, out, errbuf, errlen); /* prov_ofi_ops, libfabric loaded */
  return ops->open(cfg, out, errbuf, errlen);
}
