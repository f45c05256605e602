/*
 * chorus-info - what this Chorus is and how it is configured.
 *
 *   chorus-info          version, and the settings table
 *   chorus-info --env    the settings table only
 */
#include <stdio.h>
#include <string.h>

#include "chorus.h"
#include "settings.h"

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--env") != 0) {
    fprintf(stderr, "usage: chorus-info [--env]\n");
    return 2;
  }
  if (argc == 1)
    printf("chorus %s\n\n", chorus_version());
  settings_print(stdout);
  return 0;
}
