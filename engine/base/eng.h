/*
 * eng.h - what the files of the engine room share: logging, error
 * recording, handle validation. Not installed.
 */
#ifndef CHORUS_ENG_H
#define CHORUS_ENG_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "chorus.h"

#define ENG_ERR 0
#define ENG_WARN 1
#define ENG_INFO 2
#define ENG_DEBUG 3

extern int eng_log_level;
/* One line to stderr: "chorus[rank] sub: message". rank < 0 for none. */
void eng_log(int level, int rank, const char *sub, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Record a failure that has no communicator (per thread); returns rc. */
chorus_result eng_error(chorus_result rc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Write a formatted reason into err (err may be NULL or errlen 0). */
void eng_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Live-handle registry: a destroyed communicator or a released request is
 * recognised as such without dereferencing it. */
enum eng_handle_kind { ENG_HANDLE_COMM = 1, ENG_HANDLE_REQUEST = 2 };
int eng_handle_add(const void *p, enum eng_handle_kind kind);
void eng_handle_remove(const void *p);
bool eng_handle_valid(const void *p, enum eng_handle_kind kind);

#endif
