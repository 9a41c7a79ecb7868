/*
 * compat.c - the C client of the cross-client compatibility test
 * (python/tests/test_compat.py runs it beside the Go and Python clients
 * against one daemon).
 *
 * usage: tc_compat write SOCKET SEED SIZE
 *          registers a buffer, writes SEED's pattern in it, moves it into a
 *          pool block with a WRITE, reads the block back into a second
 *          buffer with a READ, checks both, prints one JSON line naming the
 *          block, and holds the connection (and so the block) until stdin
 *          closes.
 *        tc_compat check SOCKET SEED OFFSET SIZE
 *          checks that the pool holds SEED's pattern at OFFSET, as written
 *          by another client, and prints one JSON line.
 *
 * The pattern: xorshift64 (13, 7, 17) from SEED, each state stored
 * little-endian, 8 bytes at a time.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensorcast.h"

static void fill(uint8_t *b, size_t n, uint64_t seed)
{
    uint64_t x = seed ? seed : 1;
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for (size_t j = 0; j < 8 && i + j < n; j++)
            b[i + j] = (uint8_t)(x >> (8 * j));
    }
}

static int fail(const char *what, int rc)
{
    printf("{\"client\": \"c\", \"ok\": false, \"error\": \"%s: %s\"}\n", what, tc_strerror(rc));
    return 1;
}

static int run_write(tc_conn *c, uint64_t seed, uint64_t size)
{
    const tc_pool *p = tc_pool_info(c);
    tc_buffer *src, *dst;
    int rc = tc_buffer_create(c, size, &src, NULL);
    if (rc)
        return fail("buffer", rc);
    if ((rc = tc_buffer_create(c, size, &dst, NULL)))
        return fail("buffer", rc);
    fill(src->data, size, seed);
    uint64_t off;
    if ((rc = tc_blocks_alloc(c, 1, size, &off, NULL)))
        return fail("alloc blocks", rc);
    tc_request w = {src->id, 0, p->segment, off, size, TC_OP_WRITE};
    int code;
    if ((rc = tc_transfer(c, &w, 1, NULL, 10000, &code, NULL, NULL, NULL)) || (rc = code))
        return fail("write", rc);
    tc_request r = {dst->id, 0, p->segment, off, size, TC_OP_READ};
    if ((rc = tc_transfer(c, &r, 1, NULL, 10000, &code, NULL, NULL, NULL)) || (rc = code))
        return fail("read", rc);
    int ok = memcmp(dst->data, src->data, size) == 0 && memcmp((uint8_t *)p->base + off, src->data, size) == 0;
    printf("{\"client\": \"c\", \"ok\": %s, \"daemon\": \"%s\", \"segment\": %" PRIu64 ", \"offset\": %" PRIu64
           ", \"size\": %" PRIu64 "}\n",
           ok ? "true" : "false", tc_hello_info(c)->daemon_id, p->segment, off, size);
    fflush(stdout);
    char sink[256];
    while (read(0, sink, sizeof sink) > 0)
        ;
    return ok ? 0 : 1;
}

static int run_check(tc_conn *c, uint64_t seed, uint64_t off, uint64_t size)
{
    const tc_pool *p = tc_pool_info(c);
    if (off > p->size || size > p->size - off)
        return fail("check", TC_INVALID_ARGUMENT);
    uint8_t *want = malloc(size);
    if (!want)
        return fail("check", TC_ENOMEM);
    fill(want, size, seed);
    int ok = memcmp((uint8_t *)p->base + off, want, size) == 0;
    free(want);
    printf("{\"client\": \"c\", \"ok\": %s}\n", ok ? "true" : "false");
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    int wr = argc == 5 && strcmp(argv[1], "write") == 0;
    int ck = argc == 6 && strcmp(argv[1], "check") == 0;
    if (!wr && !ck) {
        fprintf(stderr, "usage: %s write SOCKET SEED SIZE | check SOCKET SEED OFFSET SIZE\n", argv[0]);
        return 2;
    }
    tc_options o;
    memset(&o, 0, sizeof o);
    o.socket = argv[2];
    o.name = "tc_compat";
    tc_conn *c;
    int rc = tc_connect(&o, &c);
    if (rc)
        return fail("connect", rc);
    uint64_t seed = strtoull(argv[3], NULL, 0);
    if (wr)
        rc = run_write(c, seed, strtoull(argv[4], NULL, 0));
    else
        rc = run_check(c, seed, strtoull(argv[4], NULL, 0), strtoull(argv[5], NULL, 0));
    tc_close(c);
    return rc;
}
