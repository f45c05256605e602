/*
 * fuzz_fault_spec.c - the fault plan parser (CHORUS_FAULTS, prov_config.faults)
 * and its canonical writer.
 *
 * Input: the spec text (cut at its first NUL). A rejected spec must come
 * with one line of reason; an accepted one must hold what the rules promise,
 * and its canonical text must parse back to an equal plan that writes the
 * same text again.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "fuzz_common.h"

static void check_rule(const fault_rule_t *r) {
  if ((unsigned)r->kind >= FAULT_KIND_COUNT || !(r->p >= 0.0 && r->p <= 1.0) || r->rank < -1 ||
      r->peer < -1 || strnlen(r->coll, sizeof(r->coll)) == sizeof(r->coll))
    abort();
  if (r->ms > FAULT_DELAY_MS_MAX || (r->ms && r->kind != FAULT_DELAY))
    abort();
  if (r->kind == FAULT_STALL ? !(r->s > 0.0 && r->s <= FAULT_STALL_S_MAX) : r->s != 0.0)
    abort();
  if (fault_kind_is_call(r->kind)) {
    if (r->rank < 0 || !r->has_at || r->peer >= 0 || r->has_from || r->has_to || r->n)
      abort();
  } else {
    if (r->coll[0] || (r->has_at && (r->has_from || r->has_to)) ||
        (r->has_from && r->has_to && r->from > r->to))
      abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char text[FAULT_SPEC_MAX + 1], again[FAULT_SPEC_MAX + 1];
  fault_plan_t *a = (fault_plan_t *)0x1, *b = NULL;
  char err[512];
  char *spec = fuzz_string(data, size);
  int rc, n;

  if (!spec)
    return 0;
  memset(err, 0x5a, sizeof(err));
  rc = fault_plan_parse(spec, &a, err, sizeof(err));
  if (rc) {
    if ((rc != -EINVAL && rc != -ENOMEM) || a || strnlen(err, sizeof(err)) == sizeof(err) ||
        strchr(err, '\n') || strncmp(err, "faults: ", 8) != 0)
      abort();
    free(spec);
    return 0;
  }
  if (!a || a->nrules < 0 || a->nrules > FAULT_MAX_RULES)
    abort();
  for (int i = 0; i < a->nrules; i++)
    check_rule(&a->rules[i]);

  n = fault_plan_format(a, text, sizeof(text));
  if (n < 0 || n > FAULT_SPEC_MAX || (size_t)n != strlen(text) ||
      fault_plan_format(a, NULL, 0) != n)
    abort();
  if (fault_plan_parse(text, &b, err, sizeof(err)) || !fault_plan_equal(a, b))
    abort();
  if (fault_plan_format(b, again, sizeof(again)) != n || strcmp(text, again) != 0)
    abort();

  /* the decisions read the plan only: any values are safe */
  for (int i = 0; i < a->nrules; i++) {
    double s = 0;
    const fault_rule_t *r = &a->rules[i];

    if (fault_kind_is_call(r->kind)) {
      fault_call_t c = fault_plan_on_call(a, r->rank, r->coll[0] ? r->coll : NULL, r->at, &s);

      if (c == FAULT_CALL_STALL && !(s > 0.0))
        abort();
    } else {
      (void)fault_rule_targets(r, r->rank, r->peer, 16, r->has_at ? r->at : 0);
    }
  }
  fault_plan_free(a);
  fault_plan_free(b);
  free(spec);
  return 0;
}
