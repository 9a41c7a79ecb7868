/*
 * check.h - the C tests' assertions: each failed check prints where and
 * what, and counts; the program exits non-zero if any failed.
 */
#ifndef TC_TEST_CHECK_H
#define TC_TEST_CHECK_H

#include <stdio.h>

#include "tensorcast.h"

extern int check_failures;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            check_failures++;                                                         \
        }                                                                             \
    } while (0)

/* CHECK_RC checks that expr returns want, naming both codes otherwise. */
#define CHECK_RC(expr, want)                                                                      \
    do {                                                                                          \
        int rc_ = (expr), want_ = (want);                                                         \
        if (rc_ != want_) {                                                                       \
            fprintf(stderr, "%s:%d: %s = %d (%s), want %d (%s)\n", __FILE__, __LINE__, #expr, rc_, \
                    tc_strerror(rc_), want_, tc_strerror(want_));                                 \
            check_failures++;                                                                     \
        }                                                                                         \
    } while (0)

/* REQUIRE is CHECK that ends the program at once: what follows needs it. */
#define REQUIRE(cond)                                                                    \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #cond); \
            fail_now();                                                                  \
        }                                                                                \
    } while (0)

/* fail_now stops the daemons the test started and exits non-zero. */
void fail_now(void);

#endif
