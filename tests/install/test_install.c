/*
 * Installs the library into a temporary prefix, builds the README example
 * with `pkg-config --cflags --libs chorus` alone, and runs it on 2 ranks;
 * the install said, in one line, what makes libchorus findable, and what it
 * said makes Python's ctypes.util.find_library("chorus") find it.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

/* an instrumented libchorus needs the sanitizer's runtime loaded first: Python
 * only looks it up */
#ifdef __SANITIZE_ADDRESS__
#define LOAD_IN_PYTHON 0
#else
#define LOAD_IN_PYTHON 1
#endif

static int sh(const char *cmd) {
  fprintf(stderr, "+ %s\n", cmd);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(install, pkg_config_build_and_run, .timeout = 300) {
  char dir[] = "/tmp/chorus-install-XXXXXX";
  char cmd[4096];
  cr_assert_not_null(mkdtemp(dir));

  snprintf(cmd, sizeof(cmd), "cmake --install %s --prefix %s > %s/install.log 2>&1",
           CHORUS_BUILD_DIR, dir, dir);
  cr_assert_eq(sh(cmd), 0, "cmake --install failed (see %s/install.log)", dir);
  snprintf(cmd, sizeof(cmd),
           "export PKG_CONFIG_PATH=$(dirname $(find %s -name chorus.pc)); "
           "cc %s %s/examples/hello_allreduce.c $(pkg-config --cflags --libs chorus) -o %s/hello",
           dir, EXAMPLE_CFLAGS, CHORUS_SOURCE_DIR, dir);
  cr_assert_eq(sh(cmd), 0, "building against the installed library failed");
  snprintf(cmd, sizeof(cmd),
           "export LD_LIBRARY_PATH=$(dirname $(find %s -name 'libchorus.so' | head -1)); "
           "ldd %s/hello | grep -q \"$LD_LIBRARY_PATH/libchorus.so\" && "
           "%s/bin/chorus-run -n 2 --timeout 60 -- %s/hello",
           dir, dir, dir, dir);
  cr_assert_eq(sh(cmd), 0, "the installed example failed to run on 2 ranks");

  /* a prefix outside the dynamic linker's path: the install said so, in one
   * line, and what it said makes Python's ctypes find and load libchorus */
  snprintf(cmd, sizeof(cmd),
           "grep -q 'is not on the dynamic linker.s path: set LD_LIBRARY_PATH=%s/' %s/install.log",
           dir, dir);
  cr_assert_eq(sh(cmd), 0, "the install did not say how to make libchorus findable (see %s)", dir);
  snprintf(cmd, sizeof(cmd),
           "command -v python3 >/dev/null || exit 0; "
           "export LD_LIBRARY_PATH=$(sed -n 's/.*LD_LIBRARY_PATH=\\([^ ]*\\) .*/\\1/p' "
           "%s/install.log); "
           "python3 -c 'import ctypes, ctypes.util, sys; n = ctypes.util.find_library(\"chorus\"); "
           "print(\"find_library:\", n); sys.exit(n is None or (%d and ctypes.CDLL(n) is None))'",
           dir, LOAD_IN_PYTHON);
  cr_assert_eq(sh(cmd), 0, "with the install's hint, ctypes.util.find_library(\"chorus\") failed");
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  sh(cmd);
}
