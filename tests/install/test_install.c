/*
 * Installs the library into a temporary prefix, builds the README example
 * with `pkg-config --cflags --libs chorus` alone, and runs it on 2 ranks.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

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
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  sh(cmd);
}
