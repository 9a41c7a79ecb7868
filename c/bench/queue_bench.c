/*
 * queue_bench.c - the C half of scripts/bench-clib.sh: the per-request cost
 * of a queue round trip at depth 1 through libtensorcast, the same loop as
 * the Go client's BenchmarkQueueNop and BenchmarkQueueWrite4K
 * (client/queue_bench_test.go): submit one request, reap its completion
 * (the reap spins, then sleeps), again.
 *
 * usage: tc_qbench SOCKET OPS
 * Prints "nop NS" and "write4k NS": nanoseconds per request over OPS
 * requests, after OPS/10 of warm-up.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SOCKET OPS\n", argv[0]);
        return 2;
    }
    unsigned long ops = strtoul(argv[2], NULL, 10);
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
    double nop = run(q, NULL, ops, &rc);
    if (nop < 0)
        return die("nop", rc);
    double write = run(q, &w, ops, &rc);
    if (write < 0)
        return die("write", rc);
    printf("nop %.0f\nwrite4k %.0f\n", nop, write);
    tc_queue_close(q);
    tc_close(c);
    return 0;
}
