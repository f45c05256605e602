/*
 * ofi_lib.c - libfabric, loaded on first use, behind a guard that leaves
 * every signal's disposition as it was (see ofi_lib.h for why).
 *
 *   ofi_lib_open:  lock
 *                  save dispositions 1..SIGRTMAX
 *                  once: IPATH_NO_BACKTRACE=1 (if unset), dlopen, unset it
 *                  prov_ofi_ops.open (fi_getinfo, fi_endpoint...)
 *                  put back every disposition that changed
 *                  unlock
 *
 * What is lost: shm's handlers unlinked its regions on SIGINT, SIGTERM,
 * SIGBUS and SIGSEGV before passing the signal on; prov_ofi removes its
 * regions itself.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ofi_lib.h"
#include "prov_internal.h"

/* Set by providers/CMakeLists.txt from the libfabric we build against. */
#ifndef OFI_LIB_SONAME
#define OFI_LIB_SONAME "libfabric.so.1"
#endif
#ifndef OFI_LIB_V_GETINFO
#define OFI_LIB_V_GETINFO ""
#define OFI_LIB_V_FREEINFO ""
#define OFI_LIB_V_DUPINFO ""
#define OFI_LIB_V_FABRIC ""
#define OFI_LIB_V_STRERROR ""
#endif

static int no_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
                      const struct fi_info *hints, struct fi_info **info) {
  if (info)
    *info = NULL;
  return -FI_ENOSYS;
}

static void no_freeinfo(struct fi_info *info) {}

static struct fi_info *no_dupinfo(const struct fi_info *info) {
  return NULL;
}

static int no_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context) {
  return -FI_ENOSYS;
}

static const char *no_strerror(int errnum) {
  return "libfabric is not loaded";
}

ofi_lib_t ofi_lib = {
    .getinfo = no_getinfo,
    .freeinfo = no_freeinfo,
    .dupinfo = no_dupinfo,
    .fabric = no_fabric,
    .strerror = no_strerror,
};

static pthread_mutex_t ofi_lib_lock = PTHREAD_MUTEX_INITIALIZER;
static bool ofi_lib_tried;   /* under ofi_lib_lock */
static void *ofi_lib_handle; /* under ofi_lib_lock; never closed */
static char ofi_lib_err[256];

/* Dispositions 1 .. NSIG-1 (SIGRTMAX); ok[s]: sigaction could read s (not
 * glibc's reserved 32 and 33). */
typedef struct ofi_sigs {
  struct sigaction act[NSIG];
  bool ok[NSIG];
} ofi_sigs_t;

static void sig_read(int sig, struct sigaction *a, bool *ok) {
  memset(a, 0, sizeof(*a));
  *ok = sigaction(sig, NULL, a) == 0;
}

static void sigs_save(ofi_sigs_t *s) {
  for (int sig = 1; sig < NSIG; sig++)
    sig_read(sig, &s->act[sig], &s->ok[sig]);
}

/* sa_mask compared signal by signal: glibc fills only the kernel's part. */
static bool sig_same(const struct sigaction *a, const struct sigaction *b) {
  if (a->sa_handler != b->sa_handler || a->sa_flags != b->sa_flags)
    return false;
  for (int sig = 1; sig < NSIG; sig++)
    if (sigismember(&a->sa_mask, sig) != sigismember(&b->sa_mask, sig))
      return false;
  return true;
}

/* Puts back a disposition exactly as sigaction read it. glibc's sigaction
 * adds SA_RESTORER (and its own restorer) to every disposition it sets, so
 * a default one read with flags 0 would come back with SA_RESTORER: the
 * kernel's rt_sigaction takes the flags and restorer that were read. */
static void sig_put(int sig, const struct sigaction *a) {
#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__)) /* the generic layout */
  struct {
    void *handler;
    unsigned long flags;
    void (*restorer)(void);
    uint64_t mask;
  } k = {.handler = (void *)a->sa_handler,
         .flags = (unsigned long)(unsigned)a->sa_flags,
         .restorer = a->sa_restorer};
  for (int s = 1; s <= 64 && s < NSIG; s++)
    if (sigismember(&a->sa_mask, s) == 1)
      k.mask |= 1ull << (s - 1);
  if (syscall(SYS_rt_sigaction, sig, &k, NULL, sizeof(k.mask)) == 0)
    return;
#endif
  sigaction(sig, a, NULL);
}

static void sigs_restore(const ofi_sigs_t *s) {
  struct sigaction now;
  bool ok;

  for (int sig = 1; sig < NSIG; sig++) {
    sig_read(sig, &now, &ok);
    if (s->ok[sig] && ok && !sig_same(&now, &s->act[sig]))
      sig_put(sig, &s->act[sig]);
  }
}

static void *lib_sym(const char *name, const char *version) {
  return version[0] ? dlvsym(ofi_lib_handle, name, version) : dlsym(ofi_lib_handle, name);
}

/* Under ofi_lib_lock, inside the disposition guard. 0 or -ENODEV. */
static int lib_load(void) {
  ofi_lib_t l;
  bool set_env;

  if (ofi_lib_tried)
    return ofi_lib_handle ? 0 : -ENODEV;
  ofi_lib_tried = true;
  /* libinfinipath reads it in its constructor. setenv races getenv in
   * other threads as every setenv does; the psm constructor gives no
   * other way in. */
  set_env = getenv("IPATH_NO_BACKTRACE") == NULL;
  if (set_env)
    setenv("IPATH_NO_BACKTRACE", "1", 0);
  ofi_lib_handle = dlopen(OFI_LIB_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (set_env)
    unsetenv("IPATH_NO_BACKTRACE");
  if (!ofi_lib_handle) {
    const char *e = dlerror();
    snprintf(ofi_lib_err, sizeof(ofi_lib_err), "%s", e ? e : "dlopen " OFI_LIB_SONAME " failed");
    return -ENODEV;
  }
  l.getinfo = lib_sym("fi_getinfo", OFI_LIB_V_GETINFO);
  l.freeinfo = lib_sym("fi_freeinfo", OFI_LIB_V_FREEINFO);
  l.dupinfo = lib_sym("fi_dupinfo", OFI_LIB_V_DUPINFO);
  l.fabric = lib_sym("fi_fabric", OFI_LIB_V_FABRIC);
  l.strerror = lib_sym("fi_strerror", OFI_LIB_V_STRERROR);
  if (!l.getinfo || !l.freeinfo || !l.dupinfo || !l.fabric || !l.strerror) {
    snprintf(ofi_lib_err, sizeof(ofi_lib_err),
             "%s lacks fi_getinfo@%s, fi_freeinfo@%s, fi_dupinfo@%s, fi_fabric@%s or "
             "fi_strerror@%s",
             OFI_LIB_SONAME, OFI_LIB_V_GETINFO, OFI_LIB_V_FREEINFO, OFI_LIB_V_DUPINFO,
             OFI_LIB_V_FABRIC, OFI_LIB_V_STRERROR);
    /* keep it loaded: its constructors ran, and may have started threads */
    ofi_lib_handle = NULL;
    return -ENODEV;
  }
  ofi_lib = l;
  return 0;
}

int ofi_lib_open(const prov_config_t *cfg, prov_t **out, char *errbuf, size_t errlen) {
  ofi_sigs_t *saved = malloc(sizeof(*saved));
  int rc;

  if (out)
    *out = NULL;
  if (!saved) {
    prov_errf(errbuf, errlen, "ofi: out of memory");
    return -ENOMEM;
  }
  pthread_mutex_lock(&ofi_lib_lock);
  sigs_save(saved);
  rc = lib_load();
  if (rc)
    prov_errf(errbuf, errlen, "ofi: can not load libfabric: %s", ofi_lib_err);
  else
    rc = prov_ofi_ops.open(cfg, out, errbuf, errlen);
  sigs_restore(saved);
  pthread_mutex_unlock(&ofi_lib_lock);
  free(saved);
  return rc;
}
