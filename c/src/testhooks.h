/*
 * testhooks.h - what the test build of the library (TC_TEST_HOOKS, the
 * objects under build/asan) lets a test reach: a queue with no daemon
 * behind it, the wait's learnt state, its clock and its nap, the daemon's
 * sq_head held back (src/queue.c), and a write of a results region by the daemon just after tc_results_check
 * has read it (src/qstore.c).
 */
#ifndef TC_TESTHOOKS_H
#define TC_TESTHOOKS_H

#include <stdint.h>

#include "tail.h"
#include "tensorcast.h"

int tc__test_queue(uint32_t entries, tc_queue **out, uint8_t **mem);
void tc__test_queue_free(tc_queue *q);
struct tc__tail *tc__test_tail(tc_queue *q);
void tc__test_tune(tc_queue *q, int64_t spin_budget_ns, int64_t spin_max_ns, int64_t slack_ns);
extern int64_t (*tc__test_spin_clock)(void);
extern void (*tc__test_nap)(int64_t ns);
/* While set, the queues read the daemon's sq_head as the value they read
 * last: the daemon has taken entries and not yet published its head. */
extern int tc__test_hold_sq_head;
/* Called by tc_results_check, when set, once it has read the n records of
 * region and before it returns. */
extern void (*tc__test_results_read)(uint8_t *region, uint32_t n);

#endif
