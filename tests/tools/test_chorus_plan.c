/*
 * test_chorus_plan.c - chorus-plan run as a user runs it, on small shapes:
 * a row per algorithm with numbers that follow from the algorithm, JSON
 * that parses (one object per line), Graphviz output, usage errors.
 */
#include <criterion/criterion.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "algos/algos.h"

#define PLAN_TOOL CHORUS_BUILD_DIR "/tools/chorus-plan"

typedef struct out {
  char *text;
  int status; /* exit code */
} out_t;

static out_t run(const char *args) {
  char cmd[512];
  out_t o = {0};
  size_t len = 0, cap = 1 << 16;
  snprintf(cmd, sizeof(cmd), "%s %s 2>&1", PLAN_TOOL, args);
  FILE *f = popen(cmd, "r");
  cr_assert_not_null(f);
  o.text = malloc(cap);
  for (size_t n; (n = fread(o.text + len, 1, cap - len - 1, f)) > 0;) {
    len += n;
    if (cap - len < 4096)
      cr_assert_not_null(o.text = realloc(o.text, cap *= 2));
  }
  o.text[len] = 0;
  int st = pclose(f);
  cr_assert(WIFEXITED(st), "%s: no exit status", cmd);
  o.status = WEXITSTATUS(st);
  return o;
}

/* The line that starts with `prefix`, or NULL. */
static const char *line_with(const char *text, const char *prefix) {
  size_t n = strlen(prefix);
  for (const char *p = text; p && *p;) {
    if (!strncmp(p, prefix, n))
      return p;
    p = strchr(p, '\n');
    if (p)
      p++;
  }
  return NULL;
}

/* ---- a small JSON syntax check ---- */

static const char *ws(const char *p) {
  while (*p == ' ' || *p == '\t')
    p++;
  return p;
}

static const char *json_value(const char *p);

static const char *json_string(const char *p) {
  if (*p != '"')
    return NULL;
  for (p++; *p && *p != '"'; p++)
    if (*p == '\\' && !*++p)
      return NULL;
  return *p == '"' ? p + 1 : NULL;
}

static const char *json_value(const char *p) {
  p = ws(p);
  if (*p == '{' || *p == '[') {
    char close = *p == '{' ? '}' : ']';
    p = ws(p + 1);
    if (*p == close)
      return p + 1;
    for (;;) {
      if (close == '}') {
        if (!(p = json_string(ws(p))))
          return NULL;
        p = ws(p);
        if (*p++ != ':')
          return NULL;
      }
      if (!(p = json_value(p)))
        return NULL;
      p = ws(p);
      if (*p == close)
        return p + 1;
      if (*p++ != ',')
        return NULL;
    }
  }
  if (*p == '"')
    return json_string(p);
  if (!strncmp(p, "true", 4) || !strncmp(p, "null", 4))
    return p + 4;
  if (!strncmp(p, "false", 5))
    return p + 5;
  const char *s = p;
  if (*p == '-')
    p++;
  while (isdigit((unsigned char)*p) || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' ||
         *p == '-')
    p++;
  return p > s ? p : NULL;
}

/* Every line one JSON object; returns the number of lines. */
static int json_lines(const char *text) {
  int n = 0;
  for (const char *p = text; *p;) {
    const char *nl = strchr(p, '\n');
    cr_assert_not_null(nl, "unterminated line: %s", p);
    cr_assert_eq(*p, '{', "not an object: %.*s", (int)(nl - p), p);
    const char *end = json_value(p);
    cr_assert(end && end == nl, "bad JSON: %.*s", (int)(nl - p), p);
    n++;
    p = nl + 1;
  }
  return n;
}

static unsigned long long json_num(const char *line, const char *key) {
  char k[64];
  snprintf(k, sizeof(k), "\"%s\":", key);
  const char *p = strstr(line, k);
  cr_assert_not_null(p, "no %s in %s", key, line);
  return strtoull(p + strlen(k), NULL, 10);
}

/* ---- tests ---- */

Test(chorus_plan, table_for_allreduce_on_hosts) {
  out_t o = run("-c allreduce -n 16 --hosts 4x4 -s 1M");
  cr_assert_eq(o.status, 0, "%s", o.text);
  cr_assert(strstr(o.text, "allreduce 1 MiB (float32 sum), 16 ranks on 4 hosts of 4"), "%s",
            o.text);
  cr_assert(line_with(o.text, "algo "), "%s", o.text);
  int rows = 0;
  for (const algo_desc_t *d = algo_table; d->name; d++) {
    if (d->coll != COLL_ALLREDUCE)
      continue;
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "%s ", d->name);
    cr_assert(line_with(o.text, prefix), "no row for %s:\n%s", d->name, o.text);
    rows++;
  }
  cr_assert_gt(rows, 0);
  /* ring: 1 MiB / 16 = 64 KiB segments, one chunk each: 5 * 15 steps, 2 * 15 * 16
   * messages, 2 * 15/16 MiB = 1.9 MiB sent per rank */
  const char *ring = line_with(o.text, "ring ");
  cr_assert_not_null(ring);
  unsigned steps;
  unsigned long long msgs;
  char chunk[16], unit[8];
  cr_assert_eq(sscanf(ring, "ring %15s %7s %u %llu", chunk, unit, &steps, &msgs), 4, "%s", ring);
  cr_assert_eq(steps, 75, "%s", ring);
  cr_assert_eq(msgs, 480, "%s", ring);
  cr_assert(strstr(ring, "1.9 MiB"), "%s", ring);
  const char *sel = line_with(o.text, "selected: ");
  cr_assert_not_null(sel, "%s", o.text);
  char picked[32];
  cr_assert_eq(sscanf(sel, "selected: %31s", picked), 1);
  char prefix[40];
  snprintf(prefix, sizeof(prefix), "%s * ", picked);
  cr_assert(line_with(o.text, prefix), "the pick %s is not marked:\n%s", picked, o.text);
  cr_assert(strstr(sel, "allreduce 1 MiB on 16 ranks/4 hosts"), "%s", sel);
  free(o.text);
}

Test(chorus_plan, json_rows) {
  out_t o = run("-c allreduce -n 16 --hosts 4x4 -s 1M --json");
  cr_assert_eq(o.status, 0, "%s", o.text);
  int n = json_lines(o.text), want = 1;
  for (const algo_desc_t *d = algo_table; d->name; d++)
    want += d->coll == COLL_ALLREDUCE;
  cr_assert_eq(n, want, "%d lines, want %d:\n%s", n, want, o.text);
  const char *ring = strstr(o.text, "{\"coll\":\"allreduce\",\"algo\":\"ring\"");
  cr_assert_not_null(ring, "%s", o.text);
  cr_assert_eq(json_num(ring, "messages"), 480);
  cr_assert_eq(json_num(ring, "steps_max"), 75);
  cr_assert_eq(json_num(ring, "sent_max"), 2ull * 15 * (1 << 20) / 16);
  /* bytes within and across hosts add up to all bytes sent */
  cr_assert_eq(json_num(ring, "bytes_intra") + json_num(ring, "bytes_inter"),
               json_num(ring, "bytes_total"));
  /* the flat ring crosses hosts at 4 of its 16 links */
  cr_assert_eq(json_num(ring, "bytes_inter") * 4, json_num(ring, "bytes_total"));
  const char *last = strstr(o.text, "{\"selected\":");
  cr_assert_not_null(last, "%s", o.text);
  cr_assert(strstr(last, "\"why\":\"allreduce 1 MiB on 16 ranks/4 hosts: "), "%s", last);
  free(o.text);
}

Test(chorus_plan, bcast_without_hosts) {
  out_t o = run("-c bcast -n 8 -s 64K --root 3");
  cr_assert_eq(o.status, 0, "%s", o.text);
  cr_assert(line_with(o.text, "tree "), "%s", o.text);
  cr_assert(line_with(o.text, "chain "), "%s", o.text);
  if (algo_find(COLL_BCAST, "hier"))
    cr_assert(strstr(o.text, "hier           (needs more than one host: --hosts)"), "%s", o.text);
  /* a bcast of 64 KiB from one root: every other rank receives it once */
  out_t j = run("-c bcast -n 8 -s 64K --root 3 --json --algo tree");
  cr_assert_eq(j.status, 0, "%s", j.text);
  cr_assert_eq(json_lines(j.text), 2);
  cr_assert_eq(json_num(j.text, "bytes_total"), 7ull * 65536);
  free(o.text);
  free(j.text);
}

Test(chorus_plan, dot_and_json_schedule) {
  out_t o = run("-c allreduce -n 16 --hosts 4x4 -s 1M --algo ring --dot 0");
  cr_assert_eq(o.status, 0, "%s", o.text);
  cr_assert_eq(strncmp(o.text, "digraph ", 8), 0, "%s", o.text);
  cr_assert(strstr(o.text, "s74 [label=\"74 RECV"), "%s", o.text);
  cr_assert(!strstr(o.text, "s75 ["), "%s", o.text);
  cr_assert(strstr(o.text, "s0 -> "), "%s", o.text);
  cr_assert_eq(strcmp(o.text + strlen(o.text) - 2, "}\n"), 0);
  free(o.text);

  o = run("-c allreduce -n 16 -s 1M --algo ring --dot 3 --json");
  cr_assert_eq(o.status, 0, "%s", o.text);
  cr_assert_eq(json_lines(o.text), 1);
  cr_assert_eq(strncmp(o.text, "{\"coll\":\"allreduce\",\"algo\":\"ring\",\"rank\":3,", 42), 0,
               "%s", o.text);
  cr_assert(strstr(o.text, "{\"i\":74,\"kind\":\"RECV\""), "%s", o.text);

  /* without --algo: the selector's pick */
  out_t p = run("-c bcast -n 8 -s 8 --dot 2");
  cr_assert_eq(p.status, 0, "%s", p.text);
  cr_assert_eq(strncmp(p.text, "digraph \"bcast ", 15), 0, "%s", p.text);
  free(o.text);
  free(p.text);
}

static void usage_fails(const char *args, const char *want) {
  out_t o = run(args);
  cr_assert_eq(o.status, 2, "%s: exit %d\n%s", args, o.status, o.text);
  cr_assert(strstr(o.text, want), "%s: no '%s' in\n%s", args, want, o.text);
  free(o.text);
}

Test(chorus_plan, usage_errors) {
  usage_fails("-n 4", "-c COLL is required");
  usage_fails("-c allreduce", "-n RANKS (or --hosts HxR) is required");
  usage_fails("-c allreducex -n 4", "unknown collective 'allreducex'");
  usage_fails("-c allreduce -n 4 --algo nosuch",
              "no algorithm 'nosuch' for allreduce (known: ring");
  usage_fails("-c allreduce -n 15 --hosts 4x4", "-n 15 differs from --hosts 4x4");
  usage_fails("-c allreduce -n 4 --hosts 4", "--hosts wants HxR");
  usage_fails("-c allreduce -n 4 -s 12Q", "bad size for -s: '12Q'");
  usage_fails("-c allreduce -n 4 -s 6", "not a whole number of float32 elements");
  usage_fails("-c bcast -n 4 --root 4", "--root 4 is not a rank of 4");
  usage_fails("-c allreduce -n 4 --bogus", "unknown option '--bogus'");
  usage_fails("-c allreduce -n 4 -d float33", "unknown dtype 'float33'");
  out_t o = run("--help");
  cr_assert_eq(o.status, 0);
  cr_assert(strstr(o.text, "usage: chorus-plan"), "%s", o.text);
  free(o.text);
}
