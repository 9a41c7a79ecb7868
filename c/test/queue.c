/*
 * queue.c - the shared-memory queue (tc_queue_*) against real daemons:
 * bytes moved both ways through it and checked, the daemon's refusals with
 * their codes in their own completions, NOP, backpressure from a client
 * that does not reap, waits that time out, shutdown and close waking a
 * waiting reap, a lost-wakeup stress on two threads (with and without
 * spinning), notified WRITEs to a peer through the data area, OpenQueue
 * answers that do not match their mapping, and a daemon SIGKILLed while a
 * reap waits in it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"

#define SECOND_NS 1000000000LL

static const tc_queue_opts no_opts;

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void pause_us(uint64_t us)
{
    struct timespec ts = {0, (long)(us * 1000)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* count_fds is how many fds this process has open. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* queue_mapped reports whether a queue's memfd is mapped in this process. */
static int queue_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return -1;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "tensorcast-queue"))
            found = 1;
    fclose(f);
    return found;
}

static tc_queue *open_q(tc_conn *c, uint32_t entries, const tc_queue_opts *o)
{
    tc_queue *q = NULL;
    int rc = tc_queue_open(c, entries, o, &q);
    if (rc) {
        fprintf(stderr, "tc_queue_open(%u): %s\n", entries, tc_strerror(rc));
        fail_now();
    }
    return q;
}

/* reap_n reaps n completions of user data base..base+n-1 into by[ud-base],
 * each exactly once, failing if one does not come within 10 s. */
static void reap_n(tc_queue *q, size_t n, uint64_t base, tc_cqe *by)
{
    char *seen = calloc(n, 1);
    REQUIRE(seen);
    tc_cqe cqes[64];
    for (size_t got = 0; got < n;) {
        size_t k = 0;
        int rc = tc_queue_reap(q, cqes, 64, 1, 10 * SECOND_NS, &k);
        if (rc) {
            fprintf(stderr, "reap after %zu of %zu completions: %s\n", got, n, tc_strerror(rc));
            fail_now();
        }
        for (size_t i = 0; i < k; i++) {
            uint64_t ud = cqes[i].user_data - base;
            REQUIRE(cqes[i].user_data >= base && ud < n && !seen[ud]);
            seen[ud] = 1;
            by[ud] = cqes[i];
        }
        got += k;
    }
    free(seen);
}

static uint64_t conn_counter(tc_conn *c, const char *name)
{
    tc_stats *st = NULL;
    REQUIRE(tc_stats_get(c, &st, NULL) == TC_OK);
    uint64_t v = counter(&st->connection, name);
    tc_free(st);
    return v;
}

/* ---- opening ------------------------------------------------------------ */

static void open_errors(tc_conn *c)
{
    tc_queue *q = (tc_queue *)1;
    tc_queue_opts o = no_opts;
    CHECK_RC(tc_queue_open(NULL, 8, NULL, &q), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_queue_open(c, 8, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_queue_open(c, 0, NULL, &q), TC_INVALID_ARGUMENT);
    CHECK(q == NULL);
    CHECK_RC(tc_queue_open(c, TC_QUEUE_MAX_ENTRIES + 1, NULL, &q), TC_INVALID_ARGUMENT);
    o.flags = 8;
    CHECK_RC(tc_queue_open(c, 8, &o, &q), TC_INVALID_ARGUMENT);
    /* The daemon's limits and checks (4096 entries, 4 MiB of data). */
    CHECK_RC(tc_queue_open(c, 8192, NULL, &q), TC_RESOURCE_EXHAUSTED);
    o = no_opts;
    o.data_size = 8 << 20;
    CHECK_RC(tc_queue_open(c, 8, &o, &q), TC_RESOURCE_EXHAUSTED);
    o = no_opts;
    o.cq_entries = 8; /* less than twice the submission ring */
    CHECK_RC(tc_queue_open(c, 8, &o, &q), TC_INVALID_ARGUMENT);
    CHECK(q == NULL);
    CHECK_RC(tc_ping(c, "still", 5, NULL), TC_OK);

    /* Sizes are rounded up, as the answer and the mapping say. */
    tc_queue *a = open_q(c, 5, NULL), *b = open_q(c, 1, NULL);
    tc_queue_info ia, ib;
    tc_queue_get_info(a, &ia);
    tc_queue_get_info(b, &ib);
    CHECK(ia.sq_entries == 8 && ia.cq_entries == 16 && ia.data_size == 256 << 10 && ia.state == 0);
    CHECK(ib.sq_entries == 2 && ib.cq_entries == 4 && ia.id != 0 && ib.id != ia.id);
    CHECK(conn_counter(c, "queues") == 2);

    /* Bad arguments, refused here. */
    size_t n = 99;
    tc_cqe cqe;
    uint64_t ud = 1;
    CHECK_RC(tc_queue_submit(a, NULL, &ud, 1, &n), TC_INVALID_ARGUMENT);
    CHECK(n == 0);
    CHECK_RC(tc_queue_submit(a, NULL, NULL, 0, &n), TC_OK);
    CHECK(n == 0);
    CHECK_RC(tc_queue_submit(NULL, NULL, NULL, 0, &n), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_queue_nop(a, 1, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_queue_reap(a, &cqe, 1, 2, 0, &n), TC_INVALID_ARGUMENT); /* min > max */
    tc_cqe many[32];
    CHECK_RC(tc_queue_reap(a, many, 32, 17, 0, &n), TC_INVALID_ARGUMENT); /* min > the ring */
    CHECK_RC(tc_queue_reap(a, NULL, 1, 0, 0, &n), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_queue_reap(a, &cqe, 1, 0, 0, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_queue_wait(a, 17, 0), TC_INVALID_ARGUMENT);

    CHECK_RC(tc_queue_close(a), TC_OK);
    CHECK_RC(tc_queue_close(b), TC_OK);
    CHECK_RC(tc_queue_close(NULL), TC_OK);
    CHECK(conn_counter(c, "queues") == 0);
}

/* ---- moving bytes ------------------------------------------------------------ */

static void round_trip(tc_conn *c)
{
    tc_segment_id pool = tc_pool_info(c)->segment;
    uint8_t *base = tc_pool_info(c)->base;
    tc_queue_opts o = no_opts;
    o.request_timeout_us = 5000000;
    tc_queue *q = open_q(c, 64, &o);
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 1 << 20, &b, NULL) == TC_OK);
    fill(b->data, 1 << 20, 77);
    uint64_t offs[16];
    REQUIRE(tc_blocks_alloc(c, 16, 64 << 10, offs, NULL) == TC_OK);

    tc_request reqs[16];
    uint64_t uds[16];
    for (int i = 0; i < 16; i++) {
        reqs[i] = req(TC_OP_WRITE, b->id, (uint64_t)i << 16, pool, offs[i], 64 << 10);
        uds[i] = 1000 + (uint64_t)i;
    }
    size_t n = 0;
    CHECK_RC(tc_queue_submit(q, reqs, uds, 16, &n), TC_OK);
    CHECK(n == 16);
    tc_cqe by[16];
    reap_n(q, 16, 1000, by);
    for (int i = 0; i < 16; i++) {
        CHECK(by[i].code == TC_OK && by[i].state == TC_TASK_COMPLETED && by[i].transferred == 64 << 10);
        CHECK(memcmp(base + offs[i], (uint8_t *)b->data + ((size_t)i << 16), 64 << 10) == 0);
    }
    /* Read back into the buffer's second half, 32 KiB of each block. */
    memset((uint8_t *)b->data + (1 << 19), 0, 1 << 19);
    for (int i = 0; i < 16; i++) {
        reqs[i] = req(TC_OP_READ, b->id, (1u << 19) + ((uint64_t)i << 15), pool, offs[i], 32 << 10);
        uds[i] = 2000 + (uint64_t)i;
    }
    CHECK_RC(tc_queue_submit(q, reqs, uds, 16, &n), TC_OK);
    CHECK(n == 16);
    reap_n(q, 16, 2000, by);
    for (int i = 0; i < 16; i++) {
        CHECK(by[i].code == TC_OK && by[i].transferred == 32 << 10);
        CHECK(memcmp((uint8_t *)b->data + (1 << 19) + ((size_t)i << 15), base + offs[i], 32 << 10) == 0);
    }
    tc_queue_info info;
    tc_queue_get_info(q, &info);
    CHECK(info.submitted == 32 && info.reaped == 32);
    CHECK_RC(tc_queue_close(q), TC_OK);
    int codes[16];
    CHECK_RC(tc_blocks_free(c, offs, 16, codes, NULL), TC_OK);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);
}

/* Each refused entry is answered by its own completion, with its code. */
static void refusals(tc_conn *c)
{
    tc_segment_id pool = tc_pool_info(c)->segment;
    tc_queue *q = open_q(c, 16, NULL);
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 64 << 10, &b, NULL) == TC_OK);
    uint64_t off;
    REQUIRE(tc_blocks_alloc(c, 1, 64 << 10, &off, NULL) == TC_OK);
    tc_request good = req(TC_OP_WRITE, b->id, 0, pool, off, 4096);
    tc_request reqs[9] = {
        good,
        req(TC_OP_WRITE, b->id, 0, pool, off + 4096, 64 << 10), /* past the block */
        req(7, b->id, 0, pool, off, 16),                        /* no such op */
        good,
        req(TC_OP_WRITE, b->id, 0, pool, off, 0),            /* nothing to move */
        req(TC_OP_WRITE, 999999, 0, pool, off, 16),          /* unknown segment */
        good,
        req(TC_OP_READ, b->id, 64 << 10, pool, off, 16), /* past the buffer */
        req(0x1ff, b->id, 0, pool, off, 16),             /* an op no entry can carry */
    };
    const int want[9] = {TC_OK, TC_PERMISSION_DENIED, TC_INVALID_ARGUMENT, TC_OK, TC_INVALID_ARGUMENT,
                         TC_NOT_FOUND, TC_OK, TC_INVALID_ARGUMENT, TC_INVALID_ARGUMENT};
    uint64_t uds[9];
    for (int i = 0; i < 9; i++)
        uds[i] = 300 + (uint64_t)i;
    size_t n = 0;
    CHECK_RC(tc_queue_submit(q, reqs, uds, 9, &n), TC_OK);
    CHECK(n == 9);
    tc_cqe by[9];
    reap_n(q, 9, 300, by);
    for (int i = 0; i < 9; i++) {
        if (by[i].code != want[i])
            fprintf(stderr, "entry %d: code %d (%s), want %d\n", i, by[i].code, tc_strerror(by[i].code), want[i]);
        CHECK(by[i].code == want[i]);
        CHECK(by[i].state == (want[i] == TC_OK ? TC_TASK_COMPLETED : TC_TASK_FAILED));
        CHECK(by[i].transferred == (want[i] == TC_OK ? 4096u : 0u));
    }

    /* A NOP: a round trip through the queue alone. */
    CHECK_RC(tc_queue_nop(q, 77, &n), TC_OK);
    CHECK(n == 1);
    reap_n(q, 1, 77, by);
    CHECK(by[0].code == TC_OK && by[0].state == TC_TASK_COMPLETED && by[0].transferred == 0);
    CHECK_RC(tc_queue_close(q), TC_OK);
    int code;
    CHECK_RC(tc_blocks_free(c, &off, 1, &code, NULL), TC_OK);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);
}

/* ---- backpressure ------------------------------------------------------------- */

/* A client that does not reap: exactly cq_entries completions are posted,
 * the submission ring then fills and refuses more; one reap lets the
 * daemon (asleep for want of completion slots) take what waited. */
static void backpressure(tc_conn *c)
{
    tc_queue_opts o = no_opts;
    o.cq_entries = 32;
    tc_queue *q = open_q(c, 16, &o);
    size_t n = 0;
    /* 32 completions fill the completion ring and 16 entries then wait
     * behind them: 48 NOPs go in, as fast as the daemon takes them. */
    int64_t deadline = now_ms() + 10000;
    for (uint64_t sent = 0; sent < 48;) {
        CHECK_RC(tc_queue_nop(q, sent, &n), TC_OK);
        if (n == 1)
            sent++;
        else {
            REQUIRE(now_ms() < deadline); /* the daemon takes nothing */
            pause_us(500);
        }
    }
    CHECK_RC(tc_queue_wait(q, 32, 10 * SECOND_NS), TC_OK);
    CHECK_RC(tc_queue_nop(q, 48, &n), TC_OK);
    CHECK(n == 0); /* the ring is full: the daemon took only what it has completion slots for */
    CHECK(conn_counter(c, "queue_unreaped") == 32);
    tc_cqe cqes[64];
    CHECK_RC(tc_queue_reap(q, cqes, 64, 0, 0, &n), TC_OK);
    CHECK(n == 32);
    /* The reap rang the daemon: the 16 waiting entries complete. */
    CHECK_RC(tc_queue_wait(q, 16, 10 * SECOND_NS), TC_OK);
    size_t more = 0;
    CHECK_RC(tc_queue_reap(q, cqes + n, 64 - n, 16, 10 * SECOND_NS, &more), TC_OK);
    CHECK(more == 16);
    char seen[48] = {0};
    for (size_t i = 0; i < n + more; i++) {
        CHECK(cqes[i].user_data < 48 && !seen[cqes[i].user_data] && cqes[i].code == TC_OK);
        if (cqes[i].user_data < 48)
            seen[cqes[i].user_data] = 1;
    }
    CHECK_RC(tc_queue_nop(q, 48, &n), TC_OK);
    CHECK(n == 1);
    CHECK_RC(tc_queue_reap(q, cqes, 1, 1, 10 * SECOND_NS, &n), TC_OK);
    CHECK(n == 1 && cqes[0].user_data == 48);
    tc_queue_info info;
    tc_queue_get_info(q, &info);
    printf("tc_test: queue backpressure: 32 posted of 48, then the rest; %llu reap doorbells\n",
           (unsigned long long)info.reap_doorbells);
    CHECK_RC(tc_queue_close(q), TC_OK);
}

/* ---- waits ---------------------------------------------------------------------- */

static void waits(tc_conn *c)
{
    tc_queue *q = open_q(c, 8, NULL);
    tc_cqe cqe;
    size_t n = 99;
    int64_t t0 = now_ms();
    CHECK_RC(tc_queue_reap(q, &cqe, 1, 1, 0, &n), TC_DEADLINE_EXCEEDED);
    CHECK(n == 0);
    CHECK_RC(tc_queue_wait(q, 1, 0), TC_DEADLINE_EXCEEDED);
    CHECK_RC(tc_queue_reap(q, &cqe, 1, 1, 50 * 1000000LL, &n), TC_DEADLINE_EXCEEDED);
    int64_t took = now_ms() - t0;
    CHECK(n == 0 && took >= 50 && took < 5000);
    CHECK_RC(tc_queue_reap(q, &cqe, 1, 0, -1, &n), TC_OK); /* min 0 never waits */
    CHECK(n == 0);
    CHECK_RC(tc_queue_wait(q, 0, -1), TC_OK);
    CHECK_RC(tc_queue_nop(q, 5, &n), TC_OK);
    CHECK_RC(tc_queue_wait(q, 1, -1), TC_OK);
    CHECK_RC(tc_queue_reap(q, &cqe, 1, 1, 0, &n), TC_OK); /* ready: no wait needed */
    CHECK(n == 1 && cqe.user_data == 5);
    tc_queue_info info;
    tc_queue_get_info(q, &info);
    CHECK(info.sleeps >= 1); /* the 50 ms wait slept */
    CHECK_RC(tc_queue_close(q), TC_OK);
}

/* A reap waiting on its own thread. */
typedef struct reaper {
    pthread_t th;
    tc_queue *q;
    volatile pid_t tid;
    int rc;
    size_t n;
    int64_t returned_ms;
} reaper;

static void *reaper_run(void *arg)
{
    reaper *r = arg;
    tc_cqe cqes[4];
    __atomic_store_n(&r->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    r->rc = tc_queue_reap(r->q, cqes, 4, 1, 30 * SECOND_NS, &r->n);
    r->returned_ms = now_ms();
    return NULL;
}

/* start_reaper starts r and returns once it sleeps on the queue's futex
 * (checked in /proc every millisecond, for up to 10 s). */
static void start_reaper(reaper *r, tc_queue *q)
{
    memset(r, 0, sizeof *r);
    r->q = q;
    REQUIRE(pthread_create(&r->th, NULL, reaper_run, r) == 0);
    int64_t deadline = now_ms() + 10000;
    pid_t tid;
    while (!(tid = __atomic_load_n(&r->tid, __ATOMIC_ACQUIRE)) || !blocked_in(tid, SYS_futex)) {
        REQUIRE(now_ms() < deadline);
        pause_us(1000);
    }
}

/* Shutdown and close wake a reap that waits on another thread, and so does
 * tc_shutdown of the connection. */
static void wakeups(const tcd *d, tc_conn *c)
{
    tc_queue *q = open_q(c, 8, NULL);
    reaper r;
    start_reaper(&r, q);
    int64_t t0 = now_ms();
    tc_queue_shutdown(q);
    pthread_join(r.th, NULL);
    CHECK_RC(r.rc, TC_ECLOSED);
    CHECK(r.n == 0 && r.returned_ms - t0 < 1000);
    size_t n = 9;
    tc_request rq = req(TC_OP_WRITE, 1, 0, 1, 0, 1);
    uint64_t ud = 1;
    CHECK_RC(tc_queue_submit(q, &rq, &ud, 1, &n), TC_ECLOSED);
    CHECK(n == 0);
    CHECK_RC(tc_queue_nop(q, 1, &n), TC_ECLOSED);
    CHECK_RC(tc_queue_wait(q, 1, -1), TC_ECLOSED);
    CHECK_RC(tc_queue_close(q), TC_OK);

    q = open_q(c, 8, NULL);
    start_reaper(&r, q);
    t0 = now_ms();
    CHECK_RC(tc_queue_close(q), TC_OK); /* returns after the reap has left */
    pthread_join(r.th, NULL);
    CHECK_RC(r.rc, TC_ECLOSED);
    CHECK(r.returned_ms - t0 < 1000);

    tc_conn *c2 = dial(d->socket, 0);
    q = open_q(c2, 8, NULL);
    start_reaper(&r, q);
    t0 = now_ms();
    tc_shutdown(c2);
    pthread_join(r.th, NULL);
    CHECK_RC(r.rc, TC_ECLOSED);
    CHECK(r.returned_ms - t0 < 1000);
    CHECK_RC(tc_queue_close(q), TC_ECLOSED);
    tc_close(c2);
    CHECK(conn_counter(c, "queues") == 0);
}

/* ---- the lost-wakeup stress ------------------------------------------------------ */

/* A submitting thread and a reaping thread with random batches and random
 * pauses on both sides, so that the daemon and the reap each sleep and are
 * woken over and over: a lost wake-up leaves a wait to its 10 s timeout and
 * fails. Credits bound what is in flight to both rings together, so the
 * completion ring fills when the reaper pauses (the daemon then sleeps for
 * completion slots and a reap must ring it); a submission that finds the
 * ring full waits for the reaper's next reap. */
typedef struct stress {
    tc_queue *q;
    uint64_t total;
    tc_segment_id buf, pool;
    uint64_t block;
    sem_t credits;
    pthread_mutex_t mu; /* guards reaps */
    pthread_cond_t cv;
    uint64_t reaps;
    int failed;
    uint64_t partial;
} stress;

static void take_credit(sem_t *s)
{
    while (sem_wait(s) < 0 && errno == EINTR)
        ;
}

static void *stress_submit(void *arg)
{
    stress *s = arg;
    uint64_t rng = 0x1234567u ^ s->total;
    tc_request reqs[32];
    uint64_t uds[32];
    for (uint64_t sent = 0; sent < s->total && !__atomic_load_n(&s->failed, __ATOMIC_RELAXED);) {
        uint64_t k = 1 + xorshift(&rng) % 32;
        if (k > s->total - sent)
            k = s->total - sent;
        int nops = xorshift(&rng) % 2;
        for (uint64_t j = 0; j < k; j++) {
            take_credit(&s->credits);
            reqs[j] = req(TC_OP_WRITE, s->buf, (j % 16) * 4096, s->pool, s->block + (j % 16) * 4096, 4096);
            uds[j] = sent + j;
        }
        for (uint64_t done = 0; done < k;) {
            pthread_mutex_lock(&s->mu);
            uint64_t gen = s->reaps;
            pthread_mutex_unlock(&s->mu);
            size_t n = 0;
            int rc;
            if (nops)
                rc = tc_queue_nop(s->q, uds[done], &n);
            else
                rc = tc_queue_submit(s->q, reqs + done, uds + done, (size_t)(k - done), &n);
            if (rc) {
                fprintf(stderr, "stress: submit: %s\n", tc_strerror(rc));
                __atomic_store_n(&s->failed, 1, __ATOMIC_RELAXED);
                return NULL;
            }
            done += n;
            if (done < k && (!nops || n == 0)) {
                /* The ring is full: the reaper's next reap frees it. */
                s->partial++;
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += 10;
                pthread_mutex_lock(&s->mu);
                int stuck = 0;
                while (s->reaps == gen && !stuck && !__atomic_load_n(&s->failed, __ATOMIC_RELAXED))
                    stuck = pthread_cond_timedwait(&s->cv, &s->mu, &until) == ETIMEDOUT;
                pthread_mutex_unlock(&s->mu);
                if (stuck) {
                    fprintf(stderr, "stress: no reap for 10 s with the ring full\n");
                    __atomic_store_n(&s->failed, 1, __ATOMIC_RELAXED);
                }
                if (__atomic_load_n(&s->failed, __ATOMIC_RELAXED))
                    return NULL;
            }
        }
        sent += k;
        if (xorshift(&rng) % 8 == 0)
            pause_us(xorshift(&rng) % 200);
    }
    return NULL;
}

static void stress_run(tc_conn *c, uint32_t flags, uint64_t total)
{
    stress s;
    memset(&s, 0, sizeof s);
    tc_queue_opts o = no_opts;
    o.flags = flags;
    o.cq_entries = 128;
    s.q = open_q(c, 64, &o);
    s.total = total;
    s.pool = tc_pool_info(c)->segment;
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 64 << 10, &b, NULL) == TC_OK);
    REQUIRE(tc_blocks_alloc(c, 1, 64 << 10, &s.block, NULL) == TC_OK);
    s.buf = b->id;
    REQUIRE(sem_init(&s.credits, 0, 64 + 128) == 0);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    char *seen = calloc(total, 1);
    REQUIRE(seen);

    int64_t t0 = now_ms();
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, stress_submit, &s) == 0);
    uint64_t rng = 0xfeedu ^ flags;
    tc_cqe cqes[64];
    uint64_t got = 0, bad = 0;
    while (got < total && !__atomic_load_n(&s.failed, __ATOMIC_RELAXED)) {
        size_t n = 0;
        int rc = tc_queue_reap(s.q, cqes, 64, 1, 10 * SECOND_NS, &n);
        if (rc) {
            tc_queue_info info;
            tc_queue_get_info(s.q, &info);
            fprintf(stderr, "stress: reap after %llu of %llu completions (%llu submitted): %s\n",
                    (unsigned long long)got, (unsigned long long)total, (unsigned long long)info.submitted,
                    tc_strerror(rc));
            __atomic_store_n(&s.failed, 1, __ATOMIC_RELAXED);
            break;
        }
        tc_queue_info info;
        tc_queue_get_info(s.q, &info);
        if (info.missed_wakeups) {
            fprintf(stderr, "stress: a reap slept through its slice with completions posted: a lost wake-up\n");
            __atomic_store_n(&s.failed, 1, __ATOMIC_RELAXED);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            uint64_t ud = cqes[i].user_data;
            if (ud >= total || seen[ud] || cqes[i].code != TC_OK || cqes[i].state != TC_TASK_COMPLETED)
                bad++;
            else
                seen[ud] = 1;
            sem_post(&s.credits);
        }
        got += n;
        pthread_mutex_lock(&s.mu);
        s.reaps++;
        pthread_cond_broadcast(&s.cv);
        pthread_mutex_unlock(&s.mu);
        if (xorshift(&rng) % 8 == 0)
            pause_us(xorshift(&rng) % 200);
    }
    /* A failed run: the submitter may wait for credits or a reap. */
    for (uint64_t i = 0; i < (s.failed ? total : 0); i++)
        sem_post(&s.credits);
    pthread_mutex_lock(&s.mu);
    s.reaps++;
    pthread_cond_broadcast(&s.cv);
    pthread_mutex_unlock(&s.mu);
    pthread_join(th, NULL);
    CHECK(!s.failed);
    CHECK(got == total && bad == 0);
    tc_queue_info info;
    tc_queue_get_info(s.q, &info);
    CHECK(info.submitted == total && info.reaped == total);
    CHECK(info.missed_wakeups == 0);
    if (flags & TC_QUEUE_NOSPIN)
        CHECK(info.sleeps > 0);
    printf("tc_test: queue stress (%s): %llu requests in %.1f s; %llu submit and %llu reap doorbells, %llu sleeps "
           "(%llu missed wake-ups), %llu full-ring waits\n",
           (flags & TC_QUEUE_NOSPIN) ? "no spin" : "spin", (unsigned long long)total,
           (double)(now_ms() - t0) / 1000, (unsigned long long)info.submit_doorbells,
           (unsigned long long)info.reap_doorbells, (unsigned long long)info.sleeps,
           (unsigned long long)info.missed_wakeups, (unsigned long long)s.partial);
    CHECK_RC(tc_queue_close(s.q), TC_OK);
    int code;
    CHECK_RC(tc_blocks_free(c, &s.block, 1, &code, NULL), TC_OK);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);
    free(seen);
    sem_destroy(&s.credits);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
}

/* ---- entry points ------------------------------------------------------------------ */

void test_queue(const tcd *d)
{
    tc_conn *c = dial(d->socket, 10000);
    open_errors(c);
    round_trip(c);
    refusals(c);
    backpressure(c);
    waits(c);
    wakeups(d, c);
    stress_run(c, 0, 300000);
    stress_run(c, TC_QUEUE_NOSPIN, 300000);
    /* tc_close releases a queue still open (the leak checker would see it
     * otherwise), and the daemon releases it with the connection. */
    tc_queue *q = open_q(c, 8, NULL);
    size_t n;
    CHECK_RC(tc_queue_nop(q, 1, &n), TC_OK);
    tc_close(c);
}

/* transport_counter is the daemon's transport counter name. */
static uint64_t transport_counter(tc_conn *c, const char *name)
{
    tc_stats *st = NULL;
    REQUIRE(tc_stats_get(c, &st, NULL) == TC_OK);
    uint64_t v = counter(&st->transports, name);
    tc_free(st);
    return v;
}

/* pipe_for_bell replaces the doorbell passed after the queue's memfd with
 * the write end of a pipe whose read end is closed: a write to it raises
 * SIGPIPE, which tc_test leaves at its default, ending the process. */
static void pipe_for_bell(int *fds, int nfds)
{
    int p[2];
    if (nfds < 2 || pipe2(p, O_CLOEXEC) < 0)
        return;
    close(p[0]);
    close(fds[1]);
    fds[1] = p[1];
}

/* A doorbell that is no eventfd but a pipe nobody reads is refused at
 * open: ringing it would raise SIGPIPE in the engine. */
static void pipe_doorbell(const tcd *d)
{
    int fds = count_fds();
    relay r;
    memset(&r, 0, sizeof r);
    r.mutate_at = 3; /* Hello, PoolInfo, then OpenQueue */
    r.mutate_fds = pipe_for_bell;
    relay_start(&r, d->dir, d->socket);
    tc_conn *c = dial(r.path, 5000);
    tc_queue *q = NULL;
    int rc = tc_queue_open(c, 8, NULL, &q);
    if (rc == TC_OK) {
        /* Taken: the daemon's worker sleeps for entries once idle, and a
         * nop then rings the pipe. */
        for (int i = 0; i < 20; i++) {
            struct timespec gap = {0, 20 * 1000000L};
            nanosleep(&gap, NULL);
            size_t n;
            tc_queue_nop(q, (uint64_t)i, &n);
        }
        tc_queue_close(q);
    }
    CHECK_RC(rc, TC_EPROTO);
    CHECK(queue_mapped() == 0);
    tc_close(c);
    relay_join(&r);
    CHECK(count_fds() == fds);
}

/* test_queue_eventfd runs the lost-wakeup stress against a daemon whose
 * worker waits on eventfd doorbells (as where io_uring has no
 * IORING_OP_FUTEX_WAIT; forced here): the library rings the eventfd passed
 * with the queue, every sleeping worker is woken by it (no wait times
 * out), and no sleep of the worker was bounded for want of a doorbell. */
void test_queue_eventfd(void)
{
    static const char *const extra[] = {"--data-doorbell", "eventfd", "--data-workers", "1", NULL};
    tcd d;
    start(&d, extra);
    int fds = count_fds();
    tc_conn *c = dial(d.socket, 10000);
    int rings = transport_counter(c, "uring.ring0.entries") != UINT64_MAX;
    if (!rings) {
        /* Without rings the workers run their own threads: the test still
         * runs, with futex doorbells; where CI provides io_uring it fails. */
        fprintf(stderr, "tc_test: queue_eventfd: the daemon has no io_uring rings: no eventfd doorbells\n");
        CHECK(!provides("io_uring"));
    }
    round_trip(c);
    stress_run(c, 0, 100000);
    stress_run(c, TC_QUEUE_NOSPIN, 100000);
    uint64_t sleeps = transport_counter(c, "reactor.worker0.sleeps");
    uint64_t deaf = transport_counter(c, "reactor.worker0.deaf");
    CHECK(sleeps > 0 && sleeps != UINT64_MAX);
    CHECK(deaf == 0);
    tc_close(c);
    if (rings)
        pipe_doorbell(&d);
    stop(&d);
    CHECK(count_fds() == fds);
}

/* test_queue_basic opens, uses and closes a queue: run through the
 * recording relay, it adds the queue's answers to the decoder's seeds. */
void test_queue_basic(tc_conn *c)
{
    tc_queue *q = open_q(c, 4, NULL);
    size_t n = 0;
    CHECK_RC(tc_queue_nop(q, 9, &n), TC_OK);
    tc_cqe cqe;
    CHECK_RC(tc_queue_reap(q, &cqe, 1, 1, 10 * SECOND_NS, &n), TC_OK);
    CHECK(n == 1 && cqe.user_data == 9 && cqe.code == TC_OK);
    CHECK_RC(tc_queue_close(q), TC_OK);
}

/* The OpenQueue answer's body (OpenQueueResponse) field slot, in frame f. */
static uint8_t *open_queue_field(uint8_t *f, size_t n, int slot)
{
    uint8_t *root = f + 4 + get32(f + 4);
    uint8_t *body = field(f, n, root, 3); /* Response.body */
    if (!body)
        return NULL;
    return field(f, n, body + get32(body), slot);
}

static void add64(uint8_t *p, int64_t d)
{
    uint64_t v;
    memcpy(&v, p, 8);
    v += (uint64_t)d;
    memcpy(p, &v, 8);
}

/* OpenQueueResponse: queue_id (0), sq_entries (1), cq_entries (2),
 * data_size (3), size (4). */
static void other_queue_id(uint8_t *f, size_t *n)
{
    uint8_t *p = open_queue_field(f, *n, 0);
    if (p)
        add64(p, 1);
}

static void short_size(uint8_t *f, size_t *n)
{
    uint8_t *p = open_queue_field(f, *n, 4);
    if (p)
        add64(p, -4096);
}

static void half_sq(uint8_t *f, size_t *n)
{
    uint8_t *p = open_queue_field(f, *n, 1);
    if (p)
        put32(p, get32(p) / 2);
}

/* more_data claims a data area twice as large, with the size to match:
 * consistent, but longer than the memfd. */
static void more_data(uint8_t *f, size_t *n)
{
    uint8_t *d = open_queue_field(f, *n, 3), *s = open_queue_field(f, *n, 4);
    if (d && s) {
        uint32_t data = get32(d);
        put32(d, 2 * data);
        add64(s, data);
    }
}

/* ahead_head passes a sealed copy of the queue's memfd whose sq_head is
 * ahead of its sq_tail, by 5 entries: a ring that is not empty at open. */
static void ahead_head(int *fds, int nfds) { memfd_copy(fds, nfds, 0x040, 5, F_SEAL_SHRINK | F_SEAL_GROW); }

/* open_relayed opens a queue through a relay whose OpenQueue answer passes
 * the fds mutate_fds makes of the daemon's (a copy it keeps in
 * unsealed_fd), and returns tc_queue_open's code. */
static int open_relayed(const tcd *d, void (*mutate_fds)(int *, int), relay *r, tc_conn **c, tc_queue **q)
{
    memset(r, 0, sizeof *r);
    r->mutate_at = 3; /* Hello, PoolInfo, then OpenQueue */
    r->mutate_fds = mutate_fds;
    relay_start(r, d->dir, d->socket);
    *c = dial(r->path, 5000);
    *q = (tc_queue *)1;
    return tc_queue_open(*c, 8, NULL, q);
}

/* end_relayed closes what open_relayed made and checks that no fd is left
 * of the fds open before it. */
static void end_relayed(relay *r, tc_conn *c, int fds)
{
    tc_close(c);
    relay_join(r);
    CHECK(unsealed_fd >= 0);
    close(unsealed_fd);
    unsealed_fd = -1;
    CHECK(count_fds() == fds);
}

/* test_queue_ahead opens a queue whose rings are not empty: refused, or a
 * submit would count 5 more free slots than the ring has. */
static void test_queue_ahead(const tcd *d)
{
    int fds = count_fds();
    relay r;
    tc_conn *c;
    tc_queue *q;
    int rc = open_relayed(d, ahead_head, &r, &c, &q);
    if (rc == TC_OK)
        tc_queue_close(q);
    CHECK_RC(rc, TC_EPROTO);
    CHECK(rc == TC_OK || (q == NULL && queue_mapped() == 0));
    end_relayed(&r, c, fds);
}

/* An OpenQueue answer that does not match the mapping it came with is
 * refused (TC_EPROTO, the connection broken) and leaves nothing behind:
 * no fd, no mapping. */
void test_queue_answers(const tcd *d)
{
    void (*cases[])(uint8_t *, size_t *) = {other_queue_id, short_size, half_sq, more_data};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fds = count_fds();
        relay r;
        memset(&r, 0, sizeof r);
        r.mutate_at = 3; /* Hello, PoolInfo, then OpenQueue */
        r.mutate = cases[i];
        relay_start(&r, d->dir, d->socket);
        tc_conn *c = dial(r.path, 5000);
        tc_queue *q = (tc_queue *)1;
        CHECK_RC(tc_queue_open(c, 8, NULL, &q), TC_EPROTO);
        CHECK(q == NULL && r.mutated);
        CHECK(queue_mapped() == 0);
        CHECK_RC(tc_ping(c, "z", 1, NULL), TC_ECLOSED);
        tc_close(c);
        relay_join(&r);
        CHECK(count_fds() == fds);
    }

    /* A queue's memfd not sealed against shrinking: refused, since a
     * truncation of it would fault every later touch of the rings. */
    int fds = count_fds();
    relay r;
    tc_conn *c;
    tc_queue *q;
    int rc = open_relayed(d, unsealed_copy, &r, &c, &q);
    if (rc == TC_OK) {
        /* Taken: the copy shrinks, and the next submit faults. */
        REQUIRE(unsealed_fd >= 0 && ftruncate(unsealed_fd, 0) == 0);
        size_t n;
        tc_queue_nop(q, 1, &n);
        tc_queue_close(q);
    }
    CHECK_RC(rc, TC_EPROTO);
    CHECK(q == NULL && queue_mapped() == 0);
    CHECK_RC(tc_ping(c, "z", 1, NULL), TC_ECLOSED);
    end_relayed(&r, c, fds);
    test_queue_ahead(d);
}

/* Notified WRITEs through the queue: the payloads go through a data area of
 * two payloads' room, so submissions stop early and the area wraps many
 * times; every payload reaches the receiver intact, and each completion
 * comes only after the peer acknowledged. */
void test_queue_notify(tc_conn *sender, tc_segment_id remote, tc_conn *receiver, const char *segment)
{
    enum { N = 24, PAYLOAD = 4000 };
    tc_queue_opts o = no_opts;
    o.data_size = 8192;
    tc_queue *q = open_q(sender, 16, &o);
    tc_buffer *b;
    REQUIRE(tc_buffer_create(sender, N * 4096, &b, NULL) == TC_OK);
    fill(b->data, N * 4096, 555);
    static uint8_t payloads[N][PAYLOAD];
    tc_request reqs[N];
    tc_notify notes[N];
    uint64_t uds[N];
    for (int i = 0; i < N; i++) {
        fill(payloads[i], PAYLOAD, 1000 + (uint64_t)i);
        memcpy(payloads[i], &i, sizeof i);
        reqs[i] = req(TC_OP_WRITE, b->id, (uint64_t)i * 4096, remote, (512u << 10) + (uint64_t)i * 4096, 4096);
        notes[i].payload = payloads[i];
        notes[i].len = PAYLOAD;
        uds[i] = 500 + (uint64_t)i;
    }
    size_t n = 0, early = 0;
    tc_cqe by[N];
    char seen[N] = {0};
    tc_cqe cqes[N];
    for (size_t sent = 0, got = 0; got < N;) {
        if (sent < N) {
            CHECK_RC(tc_queue_submit_notify(q, reqs + sent, notes + sent, uds + sent, N - sent, &n), TC_OK);
            sent += n;
            early += sent < N;
        }
        size_t k = 0;
        REQUIRE(tc_queue_reap(q, cqes, N, 1, 10 * SECOND_NS, &k) == TC_OK);
        for (size_t j = 0; j < k; j++) {
            uint64_t i = cqes[j].user_data - 500;
            REQUIRE(i < N && !seen[i]);
            seen[i] = 1;
            by[i] = cqes[j];
        }
        got += k;
    }
    CHECK(early > 0); /* the data area held fewer than all */
    for (int i = 0; i < N; i++)
        CHECK(by[i].code == TC_OK && by[i].transferred == 4096);

    /* Every payload arrives, whole. */
    char arrived[N] = {0};
    int64_t deadline = now_ms() + 10000;
    for (int got = 0; got < N && now_ms() < deadline;) {
        tc_notification *ns = NULL;
        size_t k = 0;
        REQUIRE(tc_notify_poll(receiver, 0, 5000, &ns, &k, NULL) == TC_OK);
        for (size_t j = 0; j < k; j++) {
            int i = -1;
            if (ns[j].len == PAYLOAD)
                memcpy(&i, ns[j].payload, sizeof i);
            CHECK(strcmp(ns[j].segment, segment) == 0);
            CHECK(i >= 0 && i < N && !arrived[i] && memcmp(ns[j].payload, payloads[i], PAYLOAD) == 0);
            if (i >= 0 && i < N)
                arrived[i] = 1;
            got++;
        }
        tc_free(ns);
    }
    CHECK(memchr(arrived, 0, N) == NULL);

    /* A payload over the limit: the requests before it go in. */
    static uint8_t big[TC_MAX_NOTIFY + 1];
    tc_notify two[2] = {{payloads[0], 16}, {big, sizeof big}};
    CHECK_RC(tc_queue_submit_notify(q, reqs, two, uds, 2, &n), TC_INVALID_ARGUMENT);
    CHECK(n == 1);
    REQUIRE(tc_queue_reap(q, cqes, 2, 1, 10 * SECOND_NS, &n) == TC_OK);
    CHECK(n == 1 && cqes[0].code == TC_OK);
    tc_notification *ns = NULL;
    size_t k = 0;
    CHECK_RC(tc_notify_poll(receiver, 0, 5000, &ns, &k, NULL), TC_OK);
    CHECK(k == 1 && ns && ns[0].len == 16);
    tc_free(ns);
    CHECK_RC(tc_queue_close(q), TC_OK);
    CHECK_RC(tc_buffer_destroy(sender, b, NULL), TC_OK);
}

/* A daemon SIGKILLed while a reap sleeps in it: the reap returns
 * TC_ECLOSED within its hang-up check, nothing crashes, and closing
 * leaves no fd and no mapping behind. */
void test_queue_daemon_killed(void)
{
    tcd d;
    start(&d, NULL);
    int fds = count_fds();
    tc_conn *c = dial(d.socket, 0);
    tc_queue *q = open_q(c, 8, NULL);
    size_t n = 0;
    CHECK_RC(tc_queue_nop(q, 1, &n), TC_OK);
    tc_cqe cqe;
    CHECK_RC(tc_queue_reap(q, &cqe, 1, 1, 10 * SECOND_NS, &n), TC_OK);
    CHECK(queue_mapped() == 1);
    reaper r;
    start_reaper(&r, q);
    int64_t t0 = now_ms();
    forget(&d);
    tcd_kill(&d);
    pthread_join(r.th, NULL);
    CHECK_RC(r.rc, TC_ECLOSED);
    CHECK(r.n == 0 && r.returned_ms - t0 < 3000);
    /* The queue knows now: submits say so too. */
    CHECK_RC(tc_queue_nop(q, 2, &n), TC_ECLOSED);
    CHECK_RC(tc_queue_close(q), TC_ECLOSED);
    CHECK(queue_mapped() == 0);
    tc_close(c);
    tcd_stop(&d);
    CHECK(count_fds() == fds);
}
