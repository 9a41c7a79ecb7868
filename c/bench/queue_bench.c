/*
 * queue_bench.c - the C half of scripts/bench-clib.sh: the per-request cost
 * of a queue round trip at depth 1 through libtensorcast, the same loop as
 * the Go client's BenchmarkQueueNop and BenchmarkQueueWrite4K
 * (client/queue_bench_test.go): submit one request, reap its completion
 * (the reap spins, then sleeps), again.
 *
 * A second part streams 64 KiB local copies the way tcbench's local-64k
 * job does (and BenchmarkQueueStream64K): 32 in flight, each wait for 16
 * completions followed by 16 submits, WRITE (a client buffer into pool
 * blocks) then READ, over 128 MiB on each side (more than the caches
 * hold); memcpy of the same chunks between two 128 MiB regions of this
 * process is its reference.
 * Here a wait is for part of what is in flight while the daemon's worker is
 * busy copying: what the wait's naps are for (src/tail.h).
 *
 * usage: tc_qbench SOCKET OPS [STREAM_OPS [CASE]]
 * Prints "nop NS" and "write4k NS": nanoseconds per request over OPS
 * requests, after OPS/10 of warm-up; then, unless STREAM_OPS is 0 (default
 * OPS/2), "stream-write64k GIBS CPU", "stream-read64k GIBS CPU" and
 * "memcpy64k GIBS CPU": GiB/s over STREAM_OPS requests (or chunks) and this
 * process's CPU time (user + system) in ns per request. CASE (one of those
 * names, or depth1) runs that part alone, so that a caller can read the
 * daemon's CPU around it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tensorcast.h"

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int die(const char *what, int rc)
{
    fprintf(stderr, "tc_qbench: %s: %s\n", what, tc_strerror(rc));
    return 1;
}

/* round makes one depth-1 round trip: a NOP when r is NULL. */
static int round_trip(tc_queue *q, const tc_request *r, uint64_t ud)
{
    size_t n = 0;
    int rc = r ? tc_queue_submit(q, r, &ud, 1, &n) : tc_queue_nop(q, ud, &n);
    if (rc || n != 1)
        return rc ? rc : TC_BUSY;
    tc_cqe cqe;
    if ((rc = tc_queue_reap(q, &cqe, 1, 1, 10000000000LL, &n)))
        return rc;
    return cqe.code;
}

/* run times ops round trips after ops/10 of warm-up: ns per request, or
 * -1 with *rc set. */
static double run(tc_queue *q, const tc_request *r, unsigned long ops, int *rc)
{
    for (unsigned long i = 0; i < ops / 10; i++)
        if ((*rc = round_trip(q, r, i)))
            return -1;
    int64_t t0 = now_ns();
    for (unsigned long i = 0; i < ops; i++)
        if ((*rc = round_trip(q, r, i)))
            return -1;
    return (double)(now_ns() - t0) / (double)ops;
}

#define CHUNK (64u << 10)
#define SET (128u << 20)
#define SLOTS (SET / CHUNK)
#define DEPTH 32
#define BATCH 16

/* cpu_ns is this process's CPU time (user + system) so far. */
static int64_t cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
}

/* stream keeps DEPTH copies of CHUNK bytes in flight between the buffer and
 * the pool blocks (op TC_OP_WRITE or TC_OP_READ), reaping BATCH at a time
 * and submitting as many, until ops have completed after ops/10 of
 * warm-up. It prints GiB/s and CPU ns per request, or returns a code. */
static int stream(tc_queue *q, tc_segment_id buf, tc_segment_id pool, const uint64_t *blocks, uint32_t op,
                  unsigned long ops, const char *name)
{
    unsigned long warm = ops / 10, total = warm + ops, issued = 0, done = 0;
    tc_request reqs[DEPTH];
    uint64_t uds[DEPTH];
    tc_cqe cqes[DEPTH];
    int64_t t0 = now_ns(), c0 = cpu_ns(); /* restarted once warm */
    size_t inflight = 0;
    for (;;) {
        size_t want = inflight == 0 ? DEPTH : BATCH;
        size_t k = 0;
        for (; k < want && issued < total; k++, issued++) {
            uint32_t i = (uint32_t)(issued % SLOTS);
            tc_request r = {buf, (uint64_t)i * CHUNK, pool, blocks[i], CHUNK, op};
            reqs[k] = r;
            uds[k] = issued;
        }
        size_t acc = 0;
        int rc = tc_queue_submit(q, reqs, uds, k, &acc);
        if (rc || acc != k)
            return rc ? rc : TC_BUSY;
        inflight += k;
        if (inflight == 0)
            break;
        size_t min = inflight < BATCH ? inflight : BATCH, n = 0;
        if ((rc = tc_queue_reap(q, cqes, DEPTH, min, 10000000000LL, &n)))
            return rc;
        for (size_t j = 0; j < n; j++)
            if (cqes[j].code != TC_OK || cqes[j].transferred != CHUNK)
                return cqes[j].code != TC_OK ? cqes[j].code : TC_EPROTO;
        inflight -= n;
        if (done < warm && done + n >= warm) {
            t0 = now_ns();
            c0 = cpu_ns();
        }
        done += n;
    }
    double s = (double)(now_ns() - t0) / 1e9, bytes = (double)(done - warm) * CHUNK;
    printf("%s %.3f %.0f\n", name, bytes / s / (double)(1u << 30), (double)(cpu_ns() - c0) / (double)(done - warm));
    return TC_OK;
}

/* copy_ref times memcpy of the same chunks between two SET-byte regions. */
static void copy_ref(unsigned long ops)
{
    char *a = malloc(SET), *b = malloc(SET);
    if (!a || !b) {
        free(a);
        free(b);
        return;
    }
    memset(a, 1, SET);
    memset(b, 2, SET);
    for (unsigned long i = 0; i < ops / 10; i++)
        memcpy(b + (i % SLOTS) * CHUNK, a + (i % SLOTS) * CHUNK, CHUNK);
    int64_t t0 = now_ns(), c0 = cpu_ns();
    for (unsigned long i = 0; i < ops; i++) {
        memcpy(b + (i % SLOTS) * CHUNK, a + (i % SLOTS) * CHUNK, CHUNK);
        __asm__ __volatile__("" : : "r"(b) : "memory"); /* each copy happens */
    }
    double s = (double)(now_ns() - t0) / 1e9;
    printf("memcpy64k %.3f %.0f\n", (double)ops * CHUNK / s / (double)(1u << 30),
           (double)(cpu_ns() - c0) / (double)ops);
    free(a);
    free(b);
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 5) {
        fprintf(stderr, "usage: %s SOCKET OPS [STREAM_OPS [CASE]]\n", argv[0]);
        return 2;
    }
    unsigned long ops = strtoul(argv[2], NULL, 10);
    unsigned long stream_ops = argc >= 4 ? strtoul(argv[3], NULL, 10) : ops / 2;
    const char *only = argc == 5 ? argv[4] : NULL;
#define RUNS(name) (!only || !strcmp(only, name))
    if (only && !RUNS("depth1") && !RUNS("stream-write64k") && !RUNS("stream-read64k") && !RUNS("memcpy64k")) {
        fprintf(stderr, "%s: no case %s\n", argv[0], only);
        return 2;
    }
    if (RUNS("memcpy64k") && only) {
        copy_ref(stream_ops);
        return 0;
    }
    tc_options o;
    memset(&o, 0, sizeof o);
    o.socket = argv[1];
    o.name = "tc_qbench";
    tc_conn *c;
    int rc = tc_connect(&o, &c);
    if (rc)
        return die("connect", rc);
    tc_queue *q;
    tc_buffer *b;
    uint64_t off;
    if ((rc = tc_queue_open(c, 64, NULL, &q)))
        return die("open queue", rc);
    if ((rc = tc_buffer_create(c, 4096, &b, NULL)))
        return die("buffer", rc);
    if ((rc = tc_blocks_alloc(c, 1, 4096, &off, NULL)))
        return die("block", rc);
    tc_request w = {b->id, 0, tc_pool_info(c)->segment, off, 4096, TC_OP_WRITE};
    if (RUNS("depth1")) {
        double nop = run(q, NULL, ops, &rc);
        if (nop < 0)
            return die("nop", rc);
        double write = run(q, &w, ops, &rc);
        if (write < 0)
            return die("write", rc);
        printf("nop %.0f\nwrite4k %.0f\n", nop, write);
    }
    if (stream_ops && (!only || strncmp(only, "stream-", 7) == 0)) {
        tc_buffer *sb;
        uint64_t blocks[SLOTS];
        if ((rc = tc_buffer_create(c, SET, &sb, NULL)))
            return die("stream buffer", rc);
        if ((rc = tc_blocks_alloc(c, SLOTS, CHUNK, blocks, NULL)))
            return die("stream blocks", rc);
        memset(sb->data, 3, SET);
        tc_segment_id pool = tc_pool_info(c)->segment;
        if (RUNS("stream-write64k") && (rc = stream(q, sb->id, pool, blocks, TC_OP_WRITE, stream_ops, "stream-write64k")))
            return die("stream write", rc);
        if (RUNS("stream-read64k") && (rc = stream(q, sb->id, pool, blocks, TC_OP_READ, stream_ops, "stream-read64k")))
            return die("stream read", rc);
        int codes[SLOTS];
        if ((rc = tc_blocks_free(c, blocks, SLOTS, codes, NULL)))
            return die("free stream blocks", rc);
        if (!only)
            copy_ref(stream_ops);
    }
    tc_queue_close(q);
    tc_close(c);
    return 0;
}
