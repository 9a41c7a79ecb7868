/*
 * naps.c - how a wait for several completions spends its time (src/tail.c,
 * wait_ready in src/queue.c), the same cases as the Go client's
 * (queue/spin_test.go, queue/queue_test.go): the learnt rules alone, then
 * waits on a queue with no daemon behind it, where this file posts the
 * completions, holds the spins' clock and replaces the nap's sleep.
 */
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "testhooks.h"

#define US 1000LL

/* ---- the rules alone ------------------------------------------------------------ */

/* The early wake-up is for completions that come fast only; a tail spin
 * that runs out backs it off for 1, 2, 4, ... waits, up to
 * TC__MAX_TAIL_SKIP, and one that finds its completions ends it. Slower
 * completions are woken one early, for a drained wait that spins. */
static void test_tail_early(void)
{
    struct tc__tail t;
    memset(&t, 0, sizeof t);
    CHECK(!tc__tail_fast(&t) && tc__tail_ahead(&t, 16, 1, 1) == 0 && !tc__tail_covers(&t, 2, 0));
    tc__tail_observe(&t, 3 * US, 16);
    REQUIRE(tc__tail_fast(&t));
    /* Not drained: half a behind spin; drained: half a tail spin. */
    CHECK(tc__tail_ahead(&t, 64, 0, 0) == (int)(TC__BEHIND_SPIN_NS / 2 / (3 * US)));
    CHECK(tc__tail_ahead(&t, 64, 1, 0) == (int)(TC__TAIL_SPIN_NS / 2 / (3 * US)));
    CHECK(tc__tail_ahead(&t, 5, 0, 0) == 4); /* the sleep waits for one at least */
    CHECK(tc__tail_covers(&t, 8, 0) && !tc__tail_covers(&t, 9, 0));
    CHECK(tc__tail_covers(&t, 16, 1) && !tc__tail_covers(&t, 64, 1));
    tc__tail_observe(&t, 1000 * US, 2); /* a sleep over few arrivals says nothing of the gap */
    CHECK(t.gap == 3 * US);

    for (int want = 1; want <= TC__MAX_TAIL_SKIP; want *= 2) {
        tc__tail_spun(&t, 0);
        for (int i = 0; i < want; i++) {
            if (tc__tail_fast(&t)) {
                fprintf(stderr, "back-off of %d: early wake-ups on after %d waits\n", want, i);
                CHECK(!tc__tail_fast(&t));
                break;
            }
            tc__tail_begin(&t);
        }
        CHECK(tc__tail_fast(&t));
    }
    tc__tail_spun(&t, 0);
    CHECK(t.off.skip == TC__MAX_TAIL_SKIP);
    t.off.skip = 0;
    tc__tail_spun(&t, 1);
    tc__tail_spun(&t, 0);
    CHECK(t.off.skip == 1);

    for (int i = 0; i < 20; i++)
        tc__tail_observe(&t, 11 * US, 8); /* 4 KiB file reads at QD32 */
    t.off.skip = 0;
    CHECK(!tc__tail_fast(&t) && tc__tail_ahead(&t, 16, 0, 1) == 0);
    CHECK(tc__tail_ahead(&t, 8, 1, 1) == 1);
    CHECK(tc__tail_ahead(&t, 8, 0, 1) == 0);
    CHECK(tc__tail_ahead(&t, 8, 1, 0) == 0);
    CHECK(tc__tail_ahead(&t, 1, 1, 1) == 0);
    for (int i = 0; i < 20; i++)
        tc__tail_observe(&t, TC__TAIL_SPIN_NS, 8);
    CHECK(tc__tail_ahead(&t, 8, 1, 1) == 0); /* beyond the spin */
}

/* A drained wait on a slower stream learns how early to be woken: late
 * wake-ups add one, up to half a tail spin's worth; one that finds all of
 * its lead missing takes one off; a tail spin that runs out sets it back. */
static void test_tail_lead(void)
{
    struct tc__tail t;
    memset(&t, 0, sizeof t);
    t.gap = 30 * US;
    CHECK(tc__tail_ahead(&t, 8, 1, 1) == 1);
    int most = (int)(TC__TAIL_SPIN_NS / 2 / t.gap);
    for (int i = 0; i < 10; i++)
        tc__tail_woke(&t, 0);
    CHECK(tc__tail_ahead(&t, 8, 1, 1) == most);
    CHECK(tc__tail_ahead(&t, 2, 1, 1) == 1);
    CHECK(tc__tail_covers(&t, most, 1) && !tc__tail_covers(&t, most + 1, 1) && !tc__tail_covers(&t, most, 0));
    tc__tail_woke(&t, 1);
    CHECK(tc__tail_leads(&t) == most);
    tc__tail_woke(&t, most);
    CHECK(tc__tail_leads(&t) == most - 1);
    tc__tail_spun(&t, 0);
    CHECK(tc__tail_leads(&t) == 1 && tc__tail_ahead(&t, 8, 1, 1) == 0);
    t.off.skip = 0;
    CHECK(tc__tail_ahead(&t, 8, 0, 1) == 0);
}

/* A nap lasts until the last missing completion is due at the nap's gap,
 * less how late naps end (the slack until one has ended), within
 * [TC__NAP_MIN_NS, TC__NAP_MAX_NS]. What a nap saw moves the nap's gap
 * (halfway when the wait's last had not come, kept within it when it had,
 * below it when everything in flight was done), never the learnt gap; a
 * nap gap or lateness that leaves no nap creeps back. */
static void test_tail_nap(void)
{
    struct tc__tail t;
    memset(&t, 0, sizeof t);
    CHECK(tc__tail_nap(&t, 16, 0) == 0);
    t.gap = 10 * US;
    CHECK(tc__tail_nap(&t, 1, 0) == 0);
    CHECK(tc__tail_nap(&t, 16, 0) == 160 * US);
    CHECK(tc__tail_nap(&t, 16, 50 * US) == 110 * US);
    CHECK(tc__tail_nap(&t, 3, 25 * US) == 0); /* 30 µs less 25 is below the shortest nap */
    CHECK(tc__tail_nap(&t, 1000, 0) == TC__NAP_MAX_NS);

    tc__tail_napped(&t, 80 * US, 100 * US, 0, 0, 0);
    CHECK(tc__tail_nap_gap(&t) == 10 * US && t.late == 20 * US);
    CHECK(tc__tail_nap(&t, 16, 50 * US) == 140 * US); /* 20 µs late, whatever the slack */
    tc__tail_napped(&t, 140 * US, 140 * US, 10, 0, 0);
    CHECK(tc__tail_nap_gap(&t) == 12 * US && t.late == 15 * US);
    tc__tail_napped(&t, 160 * US, 160 * US, 16, 1, 0);
    CHECK(tc__tail_nap_gap(&t) == 10 * US);
    tc__tail_napped(&t, 320 * US, 320 * US, 16, 1, 0);
    CHECK(tc__tail_nap_gap(&t) == 10 * US);
    tc__tail_napped(&t, 160 * US, 160 * US, 32, 1, 1);
    CHECK(tc__tail_nap_gap(&t) == 5 * US * 3 / 4);
    CHECK(t.gap == 10 * US);
    int most = (int)(TC__BEHIND_SPIN_NS / 2 / tc__tail_nap_gap(&t));
    CHECK(tc__tail_spins_after_nap(&t, most) && !tc__tail_spins_after_nap(&t, most + 1));

    t.ngap = 1 * US; /* too low for any nap of 4 */
    t.late = 0;
    int i = 0;
    while (tc__tail_nap(&t, 4, 0) == 0 && i < 100)
        i++;
    CHECK(i < 100 && t.ngap <= t.gap);

    t.late = 0;
    tc__tail_napped(&t, 100 * US, 100000 * US, 10, 0, 0); /* preempted */
    CHECK(t.late == TC__MAX_LATE_NS);
    for (i = 0; tc__tail_nap(&t, 16, 50 * US) == 0 && i < 100; i++)
        ;
    CHECK(i < 100 && t.late >= 50 * US);
}

/* A doorbell after a wait that napped stops naps for 1, 2, 4, ... waits;
 * a nap with no doorbell after it ends the back-off. A doorbell after a
 * wait that did not nap, or a worker asleep now, stop that wait's nap only. */
static void test_napback(void)
{
    struct tc__napback b;
    memset(&b, 0, sizeof b);
    CHECK(tc__napback_busy(&b, 0, 0) && !tc__napback_busy(&b, 1, 0) && !tc__napback_busy(&b, 0, 1));
    for (int want = 1; want <= TC__MAX_TAIL_SKIP; want *= 2) {
        b.napped = 1;
        CHECK(!tc__napback_busy(&b, 1, 0));
        int i = 1;
        while (i < want && !tc__napback_busy(&b, 0, 0))
            i++;
        CHECK(i == want);
        CHECK(tc__napback_busy(&b, 0, 0));
    }
    b.napped = 1;
    tc__napback_busy(&b, 1, 0);
    CHECK(b.off.skip == TC__MAX_TAIL_SKIP - 1);
    b.off.skip = 0;
    b.napped = 1;
    tc__napback_busy(&b, 0, 0);
    b.napped = 1;
    tc__napback_busy(&b, 1, 0);
    CHECK(b.off.back == 1);
}

/* ---- waits on a queue with no daemon ------------------------------------------- */

/* The layout's words (queue/doc.go). */
#define OFF_SQ_HEAD 0x040
#define OFF_SQ_TAIL 0x080
#define OFF_SQ_FLAGS 0x0c0
#define OFF_CQ_HEAD 0x100
#define OFF_CQ_TAIL 0x140
#define OFF_CQ_FLAGS 0x180
#define OFF_CQ_WAKE 0x184
#define OFF_CQ_TARGET 0x188
#define FLAG_NEED_WAKEUP 1u
#define WAIT_BITS 3u /* FLAG_WAITING | FLAG_WAIT_TARGET */
#define ENTRIES 64u

/* The daemon's side, played here: completions are posted and the client
 * woken as queue/daemon.go's Post does. */
static struct {
    tc_queue *q;
    uint8_t *m;
    uint32_t cq_tail, inflight;
    uint64_t wakes;  /* client wakes made */
    int during;      /* completions the nap posts */
    uint64_t naps;   /* the test nap's calls (atomic) */
    int64_t asked;   /* the last nap's length */
    int64_t now;     /* the spins' clock (atomic) */
    uint64_t reads;  /* its readings (atomic) */
    int64_t step;    /* how far each reading moves the clock once a nap was taken (atomic) */
} fk;

static uint32_t *w32(size_t off) { return (uint32_t *)(void *)(fk.m + off); }

static void post(uint64_t ud)
{
    uint8_t *e = fk.m + 4096 + ENTRIES * 64 + (size_t)(fk.cq_tail & (2 * ENTRIES - 1)) * 32;
    memset(e, 0, 32);
    memcpy(e, &ud, sizeof ud);
    fk.cq_tail++;
    fk.inflight--;
    __atomic_store_n(w32(OFF_CQ_TAIL), fk.cq_tail, __ATOMIC_SEQ_CST);
    uint32_t f = __atomic_load_n(w32(OFF_CQ_FLAGS), __ATOMIC_SEQ_CST);
    if (!(f & 1u))
        return;
    if ((f & 2u) && fk.inflight && (int32_t)(fk.cq_tail - __atomic_load_n(w32(OFF_CQ_TARGET), __ATOMIC_SEQ_CST)) < 0)
        return;
    if (__atomic_fetch_and(w32(OFF_CQ_FLAGS), ~WAIT_BITS, __ATOMIC_SEQ_CST) & WAIT_BITS) {
        __atomic_fetch_add(w32(OFF_CQ_WAKE), 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, w32(OFF_CQ_WAKE), FUTEX_WAKE, 1, NULL, NULL, 0);
        fk.wakes++;
    }
}

/* submit puts n NOPs in flight, taken by the daemon, none completed. */
static void submit(uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        size_t k = 0;
        CHECK_RC(tc_queue_nop(fk.q, i, &k), TC_OK);
        REQUIRE(k == 1);
    }
    __atomic_store_n(w32(OFF_SQ_HEAD), __atomic_load_n(w32(OFF_SQ_TAIL), __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
    fk.inflight += n;
}

static void reap_all(void)
{
    tc_cqe c[2 * ENTRIES];
    size_t n = 0;
    CHECK_RC(tc_queue_reap(fk.q, c, 2 * ENTRIES, 0, 0, &n), TC_OK);
}

static int64_t test_clock(void)
{
    __atomic_fetch_add(&fk.reads, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&fk.naps, __ATOMIC_SEQ_CST) == 1)
        __atomic_fetch_add(&fk.now, __atomic_load_n(&fk.step, __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
    return __atomic_load_n(&fk.now, __ATOMIC_SEQ_CST);
}

/* test_nap checks that no wake-up was asked for, posts what the case says
 * comes during the nap and moves the clock by the nap's length. */
static void test_nap(int64_t ns)
{
    uint32_t f = __atomic_load_n(w32(OFF_CQ_FLAGS), __ATOMIC_SEQ_CST);
    if (f & WAIT_BITS) {
        fprintf(stderr, "naps.c: flags %#x during a nap: the daemon was asked for a wake-up\n", f);
        check_failures++;
    }
    fk.asked = ns;
    for (int i = 0; i < fk.during; i++)
        post((uint64_t)i);
    __atomic_fetch_add(&fk.now, ns, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&fk.naps, 1, __ATOMIC_SEQ_CST);
}

struct waiter {
    pthread_t th;
    uint32_t min;
    int rc;
};

static void *wait_main(void *arg)
{
    struct waiter *w = arg;
    w->rc = tc_queue_wait(fk.q, w->min, 10 * 1000000000LL);
    return NULL;
}

static void waiter_start(struct waiter *w, uint32_t min)
{
    w->min = min;
    REQUIRE(pthread_create(&w->th, NULL, wait_main, w) == 0);
}

/* eventually returns once cond(arg) holds, or fails after 10 s. */
static void eventually(int (*cond)(void), const char *what)
{
    int64_t end = now_ms() + 10000;
    while (!cond()) {
        if (now_ms() > end) {
            fprintf(stderr, "naps.c: not seen in 10 s: %s\n", what);
            fail_now();
        }
        sched_yield();
    }
}

static int client_sleeps(void) { return (__atomic_load_n(w32(OFF_CQ_FLAGS), __ATOMIC_SEQ_CST) & WAIT_BITS) == WAIT_BITS; }

static int client_spins_after_nap(void)
{
    return __atomic_load_n(&fk.naps, __ATOMIC_SEQ_CST) == 1 && __atomic_load_n(&fk.reads, __ATOMIC_SEQ_CST) >= 4;
}

/* put_case puts 32 in flight, of which the nap posts during. */
static void put_case(int during)
{
    submit(32);
    fk.during = during;
    __atomic_store_n(&fk.naps, 0, __ATOMIC_SEQ_CST);
}

/* begin_case is put_case with a fresh tail: a learnt gap of 20 µs, no spin
 * for a last completion and no slack. */
static void begin_case(int during)
{
    struct tc__tail *t = tc__test_tail(fk.q);
    memset(t, 0, sizeof *t);
    t->gap = 20 * US;
    tc__test_tune(fk.q, 0, 0, 0);
    put_case(during);
}

/* end_case reaps the wait's completions, then posts and reaps the rest. */
static void end_case(void)
{
    reap_all();
    while (fk.inflight)
        post(99);
    reap_all();
}

/* A client waiting for 16 of its 32 in flight, with a gap learnt, naps
 * with no wake-up asked for: completions that come during the nap cost no
 * wake-up; some missing after it are slept for (one wake-up) or, when few,
 * spun for. A wait for everything in flight does not nap, nor one whose
 * worker sleeps now or rang since the last wait. */
static void test_wait_naps(void)
{
    tc_queue_info info;
    tc_queue_waits waits;
    /* All 16 come during the nap. */
    begin_case(16);
    CHECK_RC(tc_queue_wait(fk.q, 16, 10 * 1000000000LL), TC_OK);
    tc_queue_get_info(fk.q, &info);
    tc_queue_get_waits(fk.q, &waits);
    CHECK(fk.naps == 1 && fk.asked == 16 * 20 * US && waits.naps == 1);
    CHECK(fk.wakes == 0 && info.sleeps == 0);
    CHECK(tc__tail_nap_gap(tc__test_tail(fk.q)) == 20 * US && tc__test_tail(fk.q)->gap == 20 * US);
    end_case();

    /* 10 of 16 come during the nap: the client sleeps for the other 6 and
     * is woken once; the nap's gap moves halfway to the 32 µs it saw. */
    begin_case(10);
    struct waiter w;
    waiter_start(&w, 16);
    eventually(client_sleeps, "the client sleeping after its nap");
    for (int i = 10; i < 16; i++)
        post((uint64_t)i);
    pthread_join(w.th, NULL);
    CHECK_RC(w.rc, TC_OK);
    CHECK(tc__tail_nap_gap(tc__test_tail(fk.q)) == 20 * US + (32 * US - 20 * US) / 2);
    CHECK(fk.naps == 1 && fk.wakes == 1);
    end_case();

    /* 15 of 16 come during the nap: the client spins for the last (due
     * within half a behind spin at the 20 µs gap; the clock stands still,
     * so the spin lasts until it comes). */
    begin_case(15);
    tc_queue_get_info(fk.q, &info);
    uint64_t sleeps = info.sleeps, wakes = fk.wakes;
    __atomic_store_n(&fk.reads, 0, __ATOMIC_SEQ_CST);
    waiter_start(&w, 16);
    eventually(client_spins_after_nap, "the client spinning after its nap");
    post(15);
    pthread_join(w.th, NULL);
    CHECK_RC(w.rc, TC_OK);
    tc_queue_get_info(fk.q, &info);
    CHECK(info.sleeps == sleeps && fk.wakes == wakes);
    end_case();

    /* 14 of 16: the 2 left are due in 40 µs, more than half a behind spin
     * (the daemon keeps working whatever the client does): the client
     * sleeps for them at once, without spinning. */
    begin_case(14);
    tc_queue_get_info(fk.q, &info);
    sleeps = info.sleeps;
    __atomic_store_n(&fk.reads, 0, __ATOMIC_SEQ_CST);
    waiter_start(&w, 16);
    eventually(client_sleeps, "the client sleeping after its nap");
    for (int i = 14; i < 16; i++)
        post((uint64_t)i);
    pthread_join(w.th, NULL);
    CHECK_RC(w.rc, TC_OK);
    tc_queue_get_info(fk.q, &info);
    CHECK(info.sleeps == sleeps + 1 && __atomic_load_n(&fk.reads, __ATOMIC_SEQ_CST) < 4);
    end_case();

    /* 15 of 16 come during the nap and the last only once the spin for it
     * has run out (each reading of the clock after the nap moves it a
     * quarter of a behind spin on): the client sleeps for it, and the
     * spin, learnt as a tail spin, backs off as those do (the first miss
     * forgiven): after two such waits, the next naps and sleeps at once. */
    struct tc__tail *tl = tc__test_tail(fk.q);
    memset(tl, 0, sizeof *tl);
    tl->gap = 20 * US;
    for (int k = 0; k < 3; k++) {
        put_case(15);
        __atomic_store_n(&fk.reads, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&fk.step, TC__BEHIND_SPIN_NS / 4, __ATOMIC_SEQ_CST);
        waiter_start(&w, 16);
        eventually(client_sleeps, "the client sleeping after its nap and spin");
        post(15);
        pthread_join(w.th, NULL);
        CHECK_RC(w.rc, TC_OK);
        /* A spin reads the clock at its start and every 64 polls until it
         * runs out; without one, the nap's bookkeeping reads it at most
         * twice. */
        uint64_t reads = __atomic_load_n(&fk.reads, __ATOMIC_SEQ_CST);
        int spun = reads >= 4, want = k < 2;
        if (spun != want || fk.naps != 1) {
            fprintf(stderr, "naps.c: run-out wait %d: spun after the nap %d (%llu clock reads, %llu naps), want %d\n", k,
                    spun, (unsigned long long)reads, (unsigned long long)fk.naps, want);
            check_failures++;
        }
        end_case();
    }
    __atomic_store_n(&fk.step, 0, __ATOMIC_SEQ_CST);

    /* No nap: drained; the worker asleep now; a doorbell since the last wait. */
    static const struct {
        const char *name;
        uint32_t in_flight;
        int asleep, rang;
    } cases[] = {{"drained", 16, 0, 0}, {"worker asleep", 32, 1, 0}, {"doorbell since the last wait", 32, 0, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct tc__tail *t = tc__test_tail(fk.q);
        memset(t, 0, sizeof *t);
        t->gap = 20 * US;
        if (cases[k].rang)
            __atomic_fetch_or(w32(OFF_SQ_FLAGS), FLAG_NEED_WAKEUP, __ATOMIC_SEQ_CST);
        submit(cases[k].in_flight);
        if (cases[k].asleep)
            __atomic_fetch_or(w32(OFF_SQ_FLAGS), FLAG_NEED_WAKEUP, __ATOMIC_SEQ_CST);
        __atomic_store_n(&fk.naps, 0, __ATOMIC_SEQ_CST);
        fk.during = 0;
        waiter_start(&w, 16);
        eventually(client_sleeps, cases[k].name);
        while (fk.inflight)
            post(0);
        pthread_join(w.th, NULL);
        CHECK_RC(w.rc, TC_OK);
        if (fk.naps) {
            fprintf(stderr, "naps.c: %s: %llu naps\n", cases[k].name, (unsigned long long)fk.naps);
            check_failures++;
        }
        __atomic_fetch_and(w32(OFF_SQ_FLAGS), ~FLAG_NEED_WAKEUP, __ATOMIC_SEQ_CST);
        reap_all();
    }
}

/* The target of a wait's sleep: some before the last when completions come
 * fast, one before it for a drained wait within a spin of each other, the
 * last otherwise. */
static void test_wait_target(void)
{
    static const struct {
        int64_t gap, spin;
        uint32_t want;
    } cases[] = {
        {6 * US, 0, 32 - (uint32_t)(TC__TAIL_SPIN_NS / 2 / (6 * US))},
        {11 * US, 0, 32}, /* file reads at QD32 */
        {30 * US, 0, 32}, /* no spin for the last: woken by it */
        {30 * US, 40 * US, 31},
        {70 * US, 40 * US, 31}, /* 1 MiB copies */
        {TC__TAIL_SPIN_NS, 40 * US, 32},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct tc__tail *t = tc__test_tail(fk.q);
        memset(t, 0, sizeof *t);
        t->gap = cases[k].gap;
        tc__test_tune(fk.q, cases[k].spin, TC__SPIN_CEILING_NS, 0);
        submit(32);
        uint32_t head = __atomic_load_n(w32(OFF_CQ_HEAD), __ATOMIC_SEQ_CST);
        struct waiter w;
        waiter_start(&w, 32);
        eventually(client_sleeps, "the client sleeping for its target");
        uint32_t got = __atomic_load_n(w32(OFF_CQ_TARGET), __ATOMIC_SEQ_CST) - head;
        if (got != cases[k].want) {
            fprintf(stderr, "naps.c: gap %lld ns: the client sleeps for %u of 32, want %u\n",
                    (long long)cases[k].gap, got, cases[k].want);
            check_failures++;
        }
        while (fk.inflight)
            post(0);
        pthread_join(w.th, NULL);
        CHECK_RC(w.rc, TC_OK);
        reap_all();
    }
}

/* A completion's code and state the protocol does not name (the
 * daemon's u32 code, u8 state) reach the caller as TC_EPROTO, each. */
static void test_unknown_codes(void)
{
    static const struct {
        uint32_t code;
        uint8_t state;
        int want_code, want_state;
    } cases[] = {
        {TC_OK, TC_TASK_COMPLETED, TC_OK, TC_TASK_COMPLETED},
        {TC_INTERNAL, TC_TASK_CANCELED, TC_INTERNAL, TC_TASK_CANCELED},
        {TC_INTERNAL + 1, TC_TASK_FAILED, TC_EPROTO, TC_TASK_FAILED},
        {0xffffffffu, TC_TASK_FAILED, TC_EPROTO, TC_TASK_FAILED},
        {TC_NOT_FOUND, TC_TASK_CANCELED + 1, TC_NOT_FOUND, TC_EPROTO},
        {TC_NOT_FOUND, 0xff, TC_NOT_FOUND, TC_EPROTO},
    };
    enum { N = sizeof cases / sizeof cases[0] };
    submit(N);
    for (uint32_t i = 0; i < N; i++) {
        uint8_t *e = fk.m + 4096 + ENTRIES * 64 + (size_t)(fk.cq_tail & (2 * ENTRIES - 1)) * 32;
        post(i); /* published, and read only by the reap below */
        memcpy(e + 16, &cases[i].code, sizeof cases[i].code);
        e[20] = cases[i].state;
    }
    tc_cqe c[N];
    size_t n = 0;
    CHECK_RC(tc_queue_reap(fk.q, c, N, N, 0, &n), TC_OK);
    CHECK(n == N);
    for (size_t i = 0; i < n; i++) {
        if (c[i].user_data != i || c[i].code != cases[i].want_code || c[i].state != cases[i].want_state) {
            fprintf(stderr, "completion %zu: code %d state %d, want %d and %d\n", i, c[i].code, c[i].state,
                    cases[i].want_code, cases[i].want_state);
            CHECK(0);
        }
    }
}

void test_queue_waits(void)
{
    test_tail_early();
    test_tail_lead();
    test_tail_nap();
    test_napback();

    memset(&fk, 0, sizeof fk);
    REQUIRE(tc__test_queue(ENTRIES, &fk.q, &fk.m) == TC_OK);
    int64_t (*clock)(void) = tc__test_spin_clock;
    void (*nap)(int64_t) = tc__test_nap;
    tc__test_spin_clock = test_clock;
    tc__test_nap = test_nap;
    test_wait_naps();
    tc__test_spin_clock = clock;
    tc__test_nap = nap;
    test_wait_target();
    test_unknown_codes();
    tc__test_queue_free(fk.q);
    printf("tc_test: queue waits: the tail's rules, naps and wake-up targets on a queue with no daemon\n");
}
