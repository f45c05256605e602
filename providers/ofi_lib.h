/*
 * ofi_lib.h - libfabric, loaded on first use. Private to providers/.
 *
 * libchorus does not link libfabric: loading it runs the constructors of
 * the libraries it links (Debian's links the psm provider's libinfinipath,
 * which installs its own handlers for SIGILL, SIGABRT, SIGBUS, SIGSEGV,
 * SIGTERM and SIGINT), and its shm provider installs handlers for SIGINT,
 * SIGBUS, SIGSEGV and SIGTERM on its first endpoint. A library inside a
 * trainer's process must not: SIGTERM then ended a rank with exit code 1,
 * and Ctrl-C on a torchrun job waited out torchrun's grace period. So
 * prov_ofi is opened through ofi_lib_open, which dlopens libfabric the first
 * time and puts every signal's disposition back as it found it.
 *
 * Most of libfabric's API is static inline through ops tables and needs no
 * symbol; the few exported functions prov_ofi.c calls go through ofi_lib,
 * filled by dlvsym with the symbol versions a link against the library we
 * build with would have bound (providers/CMakeLists.txt reads them). Include
 * this after the <rdma/...> headers: the macros below send prov_ofi.c's calls
 * there.
 */
#ifndef CHORUS_OFI_LIB_H
#define CHORUS_OFI_LIB_H

#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include "prov.h"

/* libfabric's exported functions Chorus calls. Before the library is
 * loaded, or where it lacks one, each slot is a stub that fails
 * (-FI_ENOSYS, NULL, or a string saying libfabric is not loaded). */
typedef struct ofi_lib {
  int (*getinfo)(uint32_t version, const char *node, const char *service, uint64_t flags,
                 const struct fi_info *hints, struct fi_info **info);
  void (*freeinfo)(struct fi_info *info);
  struct fi_info *(*dupinfo)(const struct fi_info *info);
  int (*fabric)(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context);
  const char *(*strerror)(int errnum);
} ofi_lib_t;

extern ofi_lib_t ofi_lib;

#define fi_getinfo ofi_lib.getinfo
#define fi_freeinfo ofi_lib.freeinfo
#define fi_dupinfo ofi_lib.dupinfo
#define fi_fabric ofi_lib.fabric
#define fi_strerror ofi_lib.strerror
/* fabric.h's inline fi_allocinfo calls the exported fi_dupinfo by name */
#define fi_allocinfo() ofi_lib.dupinfo(NULL)

/* prov_ofi_ops.open, with libfabric loaded first (once per process) and
 * every signal's disposition, 1 to SIGRTMAX, as it was before the call when
 * it returns. Opens are serialized: one open's restoring must not undo
 * what another open is about to restore. IPATH_NO_BACKTRACE is set to 1
 * while libfabric loads unless the environment has it (then it is kept as
 * it is); the environment is as it was afterwards. Fails with -ENODEV (and
 * dlopen's reason in errbuf) when libfabric can not be loaded. Thread-safe.
 * A disposition that another thread changes during the call is put back too. */
int ofi_lib_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen);

#endif
