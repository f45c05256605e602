/*
 * chorus-info - what this Chorus is and how it is configured.
 *
 *   chorus-info                             version, and the settings table
 *   chorus-info --env                       the settings table only, with current values
 *   chorus-info --settings --markdown       docs/settings.md (every setting explained)
 *   chorus-info --settings --markdown-table README's settings table (one row per setting)
 *
 * The Markdown forms come from engine/base/settings.c's table alone, whatever the
 * environment holds, so that the documents can be regenerated and checked
 * (ctest -R docs_settings).
 */
#include <stdio.h>
#include <string.h>

#include "chorus.h"
#include "settings.h"

static int usage(void) {
  fprintf(stderr, "usage: chorus-info [--env | --settings --markdown | --settings "
                  "--markdown-table]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--settings") == 0) {
    if (strcmp(argv[2], "--markdown") == 0)
      settings_print_markdown(stdout, SETTINGS_MD_DOC);
    else if (strcmp(argv[2], "--markdown-table") == 0)
      settings_print_markdown(stdout, SETTINGS_MD_TABLE);
    else
      return usage();
    return fflush(stdout) == 0 ? 0 : 1;
  }
  if (argc > 2 || (argc == 2 && strcmp(argv[1], "--env") != 0))
    return usage();
  if (argc == 1)
    printf("chorus %s\n\n", chorus_version());
  settings_print(stdout);
  return 0;
}
