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
 *        tc_compat store-write SOCKET PREFIX SEED SIZE
 *          stores PREFIX/sock with a copying put on the socket (SEED's
 *          pattern, from a buffer) and PREFIX/queue zero-copy through a queue
 *          (reserve, SEED+1's pattern written in place, durable commit).
 *        tc_compat store-check SOCKET PREFIX SEED SIZE
 *          reads another client's keys back: a copying read on the socket, a
 *          get in place through a queue (its raw results records), an unpin,
 *          an exists and a lookup_prefix through the queue and a stat, and
 *          prints one JSON line of what each answered.
 *
 *        tc_compat export-to SOCKET NAME SEED SIZE GRANT...
 *          registers a buffer of SIZE bytes holding SEED's pattern, exports
 *          it read-only as NAME granting the tenants GRANT... (none: "-"),
 *          prints one JSON line with the exported size (or the code the
 *          daemon refused it with), holds it until stdin closes, then
 *          unexports it and prints one JSON line.
 *
 *        tc_compat restart SOCKET PREFIX N
 *          connects with tc_options.reconnect, puts N keys PREFIX/I
 *          zero-copy (reserve, I+1's pattern of 512+I*61 bytes written in
 *          the pool mapping, commit), makes a buffer and a tc_kv, prints
 *          one JSON line, then for each line on stdin (the daemon has been
 *          restarted) goes on with that same connection: a ping (the first
 *          may find the connection broken), which reconnects by itself;
 *          then checks that a new connection maps the same pool (device and
 *          inode of the memfd) as the one it kept, that the buffer and the
 *          tc_kv from before the restart are released without touching
 *          what the new daemon gave out since (their calls end with
 *          TC_ECLOSED), that every value is still in its mapping where it
 *          was put, that a new tc_kv finds each at that offset, and that
 *          the daemon reads each back byte-exact into a new buffer; one
 *          JSON line per check.
 *
 * The pattern: xorshift64 (13, 7, 17) from SEED, each state stored
 * little-endian, 8 bytes at a time.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* ---- the store ----------------------------------------------------------------- */

/* sha256, for the digests of the values read (FIPS 180-4). */
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return x >> n | x << (32 - n); }

static void sha_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

/* sha256_hex writes the digest of n bytes at p as 64 hex digits and a NUL. */
static void sha256_hex(const uint8_t *p, size_t n, char out[65])
{
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        sha_block(h, p + i);
    uint8_t tail[128];
    memset(tail, 0, sizeof tail);
    size_t r = n - i;
    memcpy(tail, p + i, r);
    tail[r] = 0x80;
    size_t tn = r + 9 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int j = 0; j < 8; j++)
        tail[tn - 1 - j] = (uint8_t)(bits >> (8 * j));
    for (size_t j = 0; j < tn; j += 64)
        sha_block(h, tail + j);
    for (int j = 0; j < 8; j++)
        snprintf(out + 8 * j, 9, "%08x", h[j]);
}

/* A JSON line being built. */
static char line[16384];
static size_t used;

static void put(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + used, sizeof line - used, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof line - used)
        used += (size_t)n;
}

/* one_call reaps the completion of the store op just staged (staged_rc,
 * *accepted). */
static int one_call(tc_queue *q, int staged_rc, const size_t *accepted, tc_cqe *cqe)
{
    if (staged_rc)
        return staged_rc;
    if (!*accepted)
        return TC_BUSY;
    size_t n;
    int rc = tc_queue_reap(q, cqe, 1, 1, 10000000000LL, &n);
    return rc ? rc : n == 1 ? TC_OK : TC_EINTERNAL;
}

static tc_keys keys_of(tc_key *k, char (*text)[96], const char *prefix, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        snprintf(text[i], sizeof text[i], "%s/%s", prefix, names[i]);
        k[i].data = text[i];
        k[i].len = strlen(text[i]);
    }
    tc_keys ks = {.n = n, .keys = k};
    return ks;
}

static int run_store_write(tc_conn *c, const char *prefix, uint64_t seed, uint64_t size)
{
    tc_key k[1];
    char text[1][96];
    static const char *const sock[] = {"sock"}, *const queue[] = {"queue"};
    tc_buffer *b;
    int rc = tc_buffer_create(c, size, &b, NULL), code;
    if (rc)
        return fail("buffer", rc);
    fill(b->data, size, seed);
    tc_keys ks = keys_of(k, text, prefix, sock, 1);
    tc_extent v = {b->id, 0, size};
    if ((rc = tc_store_put(c, &ks, &v, 0, &code, NULL)) || (rc = code))
        return fail("store put", rc);
    tc_queue *q;
    tc_results *r;
    if ((rc = tc_queue_open(c, 8, NULL, &q)) || (rc = tc_results_create(c, 4, &r)))
        return fail("queue", rc);
    ks = keys_of(k, text, prefix, queue, 1);
    size_t acc = 0;
    tc_cqe e;
    uint64_t off;
    rc = one_call(q, tc_queue_store_reserve(q, &ks, size, r, 1, &acc), &acc, &e);
    if (rc || (rc = tc_results_check(r, &e, &code, &off, NULL)) || (rc = code))
        return fail("reserve", rc);
    fill((uint8_t *)tc_pool_info(c)->base + off, size, seed + 1);
    rc = one_call(q, tc_queue_store_commit(q, &ks, 1, r, 2, &acc), &acc, &e);
    if (rc || (rc = tc_results_check(r, &e, &code, NULL, NULL)) || (rc = code))
        return fail("commit", rc);
    printf("{\"client\": \"c\", \"ok\": true, \"size\": %" PRIu64 "}\n", size);
    return 0;
}

static int run_store_check(tc_conn *c, const char *prefix, uint64_t seed, uint64_t size)
{
    static const char *const names[] = {"queue", "sock", "none"};
    tc_key k[3];
    char text[3][96];
    tc_keys ks = keys_of(k, text, prefix, names, 3);
    uint8_t *want[2] = {malloc(size), malloc(size)};
    if (!want[0] || !want[1])
        return fail("check", TC_ENOMEM);
    fill(want[0], size, seed + 1);
    fill(want[1], size, seed);
    int ok = 1, rc, codes[3];
    char sha[65];
    used = 0;

    /* A copying read on the socket. */
    tc_buffer *b;
    if ((rc = tc_buffer_create(c, 3 * size, &b, NULL)))
        return fail("buffer", rc);
    tc_extent d[3];
    for (int i = 0; i < 3; i++)
        d[i] = (tc_extent){b->id, (uint64_t)i * size, size};
    uint64_t lens[3];
    if ((rc = tc_store_read(c, &ks, d, lens, codes, NULL)))
        return fail("store read", rc);
    put("{\"client\": \"c\", \"ok\": @OK@, \"read_codes\": [%d, %d, %d], \"read_lengths\": [%" PRIu64 ", %" PRIu64
        ", %" PRIu64 "], \"read_sha\": [",
        codes[0], codes[1], codes[2], lens[0], lens[1], lens[2]);
    for (int i = 0, first = 1; i < 3; i++) {
        if (codes[i] != TC_OK)
            continue;
        const uint8_t *got = (const uint8_t *)b->data + (size_t)i * size;
        sha256_hex(got, (size_t)lens[i], sha);
        put("%s\"%s\"", first ? "" : ", ", sha);
        first = 0;
        ok &= i < 2 && lens[i] == size && memcmp(got, want[i], size) == 0;
    }

    /* A get in place through a queue: its results records as the daemon
     * wrote them. */
    tc_queue *q;
    tc_buffer *rb;
    tc_results *r;
    if ((rc = tc_queue_open(c, 8, NULL, &q)) || (rc = tc_buffer_create(c, 4096, &rb, NULL)) ||
        (rc = tc_results_in(c, rb, 0, 4, &r)))
        return fail("queue", rc);
    size_t acc = 0;
    tc_cqe e;
    uint64_t offs[3];
    rc = one_call(q, tc_queue_store_get(q, &ks, r, 1, &acc), &acc, &e);
    if (rc || (rc = tc_results_check(r, &e, codes, offs, lens)))
        return fail("get", rc);
    put("], \"get_records\": [");
    for (int i = 0; i < 3; i++) {
        put("%s\"", i ? ", " : "");
        for (int j = 0; j < 16; j++)
            put("%02x", ((const uint8_t *)rb->data)[i * 16 + j]);
        put("\"");
    }
    put("], \"get_sha\": [");
    const uint8_t *base = tc_pool_info(c)->base;
    tc_key pk[3];
    size_t np = 0;
    for (int i = 0; i < 3; i++) {
        if (codes[i] != TC_OK)
            continue;
        sha256_hex(base + offs[i], (size_t)lens[i], sha);
        put("%s\"%s\"", np ? ", " : "", sha);
        ok &= i < 2 && lens[i] == size && memcmp(base + offs[i], want[i], size) == 0;
        pk[np++] = k[i];
    }
    if (np) {
        tc_keys pks = {.n = np, .keys = pk};
        rc = one_call(q, tc_queue_store_unpin(q, &pks, r, 2, &acc), &acc, &e);
        if (rc || (rc = tc_results_check(r, &e, codes, NULL, NULL)))
            return fail("unpin", rc);
    }

    /* Exists and lookup_prefix through the queue; a stat on the socket. */
    rc = one_call(q, tc_queue_store_exists(q, &ks, r, 3, &acc), &acc, &e);
    if (rc || (rc = tc_results_check(r, &e, codes, NULL, NULL)))
        return fail("exists", rc);
    put("], \"exists\": [%d, %d, %d]", codes[0], codes[1], codes[2]);
    tc_key chain[3] = {k[1], k[0], k[2]};
    tc_keys cks = {.n = 3, .keys = chain};
    size_t found;
    rc = one_call(q, tc_queue_store_lookup_prefix(q, &cks, 0, 4, &acc), &acc, &e);
    if (rc || (rc = tc_prefix_check(q, &e, 3, &found)))
        return fail("lookup prefix", rc);
    tc_key_info info;
    if ((rc = tc_store_stat(c, k[0].data, k[0].len, &info, NULL)))
        return fail("stat", rc);
    put(", \"prefix\": %zu, \"stat_size\": %" PRIu64 ", \"stat_l2\": %s}", found, info.size,
        info.in_l2 ? "true" : "false");
    char *at = strstr(line, "@OK@");
    if (at) {
        /* "true" fits; "false" needs one more byte. */
        const char *v = ok ? "true" : "false";
        memmove(at + strlen(v), at + 4, strlen(at + 4) + 1);
        memcpy(at, v, strlen(v));
    }
    puts(line);
    free(want[0]);
    free(want[1]);
    return ok ? 0 : 1;
}

static uint64_t restart_size(size_t i) { return 512 + (uint64_t)i * 61; }

/* What the restart mode made before the daemon restarted. */
struct before {
    const tc_keys *ks;
    const uint64_t *offs;
    tc_buffer *buf; /* released at the first check */
    tc_kv *kv;      /* likewise */
};

/* restart_check goes on with c (tc_options.reconnect) after the daemon
 * restarted and checks the keys put before against c's mapping and
 * through c. */
static int restart_check(tc_conn *c, const char *sock, struct before *bf)
{
    const tc_keys *ks = bf->ks;
    int first = tc_ping(c, "x", 1, NULL);
    int rc = first == TC_OK ? TC_OK : tc_ping(c, "x", 1, NULL);
    if (rc)
        return fail("a ping after the restart", rc);

    tc_options o;
    memset(&o, 0, sizeof o);
    o.socket = sock;
    o.name = "tc_compat-restart-new";
    tc_conn *fresh;
    if ((rc = tc_connect(&o, &fresh)))
        return fail("connect after the restart", rc);
    struct stat s0, s1;
    int same = fstat(tc_pool_info(c)->fd, &s0) == 0 && fstat(tc_pool_info(fresh)->fd, &s1) == 0 &&
               s0.st_dev == s1.st_dev && s0.st_ino == s1.st_ino && tc_pool_info(c)->size == tc_pool_info(fresh)->size;
    tc_close(fresh);

    /* A buffer of the new daemon first: its segment id may be the old
     * buffer's, which the old one's release must not unregister. */
    uint64_t big = restart_size(ks->n);
    tc_buffer *b;
    if ((rc = tc_buffer_create(c, big, &b, NULL)))
        return fail("buffer", rc);
    int stale_ok = 1;
    if (bf->buf) {
        stale_ok = tc_buffer_destroy(c, bf->buf, NULL) == TC_OK;
        bf->buf = NULL;
    }
    if (bf->kv) {
        int code = -1;
        tc_keys one = {1, &ks->keys[0], NULL, 0};
        uint64_t off = 0;
        stale_ok = stale_ok && tc_kv_get(bf->kv, &one, &off, NULL, &code) == TC_ECLOSED;
        tc_kv_close(bf->kv);
        bf->kv = NULL;
    }
    tc_kv *kv;
    if ((rc = tc_kv_open(c, NULL, &kv))) {
        tc_buffer_destroy(c, b, NULL);
        return fail("kv after the restart", rc);
    }
    uint8_t *want = malloc(big);
    if (!want) {
        tc_kv_close(kv);
        tc_buffer_destroy(c, b, NULL);
        return fail("malloc", TC_ENOMEM);
    }
    const uint8_t *base = tc_pool_info(c)->base;
    size_t in_old = 0, in_place = 0, read_back = 0;
    for (size_t i = 0; i < ks->n; i++) {
        uint64_t n = restart_size(i);
        fill(want, n, i + 1);
        if (memcmp(base + bf->offs[i], want, n) == 0)
            in_old++;
        tc_keys one = {1, &ks->keys[i], NULL, 0};
        uint64_t off = 0, len = 0;
        int code = -1;
        if (tc_kv_get(kv, &one, &off, &len, &code) == TC_OK && code == TC_OK) {
            if (off == bf->offs[i] && len == n)
                in_place++;
            tc_kv_unpin(kv, &one, &code);
        }
        tc_extent dst = {b->id, 0, big};
        code = -1;
        if (tc_store_read(c, &one, &dst, &len, &code, NULL) == TC_OK && code == TC_OK && len == n &&
            memcmp(b->data, want, n) == 0)
            read_back++;
    }
    free(want);
    tc_kv_close(kv);
    rc = tc_buffer_destroy(c, b, NULL);
    if (rc)
        return fail("destroying the new buffer", rc);
    printf("{\"client\": \"c\", \"ok\": true, \"reconnects\": %u, \"same_pool\": %s, \"stale_released\": %s, "
           "\"in_old_mapping\": %zu, \"in_place\": %zu, \"read_back\": %zu}\n",
           tc_reconnects(c), same ? "true" : "false", stale_ok ? "true" : "false", in_old, in_place, read_back);
    fflush(stdout);
    return 0;
}

static int run_restart(tc_conn *c, const char *sock, const char *prefix, size_t n)
{
    tc_key *keys = calloc(n, sizeof *keys);
    char (*names)[64] = calloc(n, sizeof *names);
    uint64_t *sizes = calloc(n, sizeof *sizes), *offs = calloc(n, sizeof *offs);
    int *codes = calloc(n, sizeof *codes);
    int rc = keys && names && sizes && offs && codes ? TC_OK : TC_ENOMEM;
    for (size_t i = 0; rc == TC_OK && i < n; i++) {
        snprintf(names[i], sizeof names[i], "%s/%zu", prefix, i);
        keys[i] = (tc_key){names[i], strlen(names[i])};
        sizes[i] = restart_size(i);
    }
    tc_keys ks = {n, keys, NULL, 0};
    const tc_pool *p = tc_pool_info(c);
    if (rc == TC_OK)
        rc = tc_store_reserve(c, &ks, sizes, offs, codes, NULL);
    for (size_t i = 0; rc == TC_OK && i < n; i++) {
        if (codes[i] != TC_OK)
            rc = codes[i];
        else
            fill((uint8_t *)p->base + offs[i], sizes[i], i + 1);
    }
    if (rc == TC_OK)
        rc = tc_store_commit(c, &ks, 0, codes, NULL);
    for (size_t i = 0; rc == TC_OK && i < n; i++)
        rc = codes[i];
    struct before bf = {&ks, offs, NULL, NULL};
    if (rc == TC_OK)
        rc = tc_buffer_create(c, 4096, &bf.buf, NULL);
    if (rc == TC_OK)
        rc = tc_kv_open(c, NULL, &bf.kv);
    if (rc) {
        fail("put", rc);
    } else {
        printf("{\"client\": \"c\", \"ok\": true, \"put\": %zu}\n", n);
        fflush(stdout);
        char go[64];
        while (rc == 0 && fgets(go, sizeof go, stdin))
            rc = restart_check(c, sock, &bf);
    }
    free(keys);
    free(names);
    free(sizes);
    free(offs);
    free(codes);
    return rc ? 1 : 0;
}

static int run_export_to(tc_conn *c, const char *name, uint64_t seed, uint64_t size, const char *const *grants,
                         size_t n_grants)
{
    tc_buffer *b;
    int rc = tc_buffer_create(c, size, &b, NULL);
    if (rc)
        return fail("buffer", rc);
    fill(b->data, size, seed);
    uint64_t got = 0;
    rc = tc_segment_export_to(c, name, grants, n_grants, b->id, 0, 0, TC_RIGHT_READ, &got, NULL);
    if (rc) {
        printf("{\"client\": \"c\", \"ok\": false, \"code\": %d}\n", rc);
        fflush(stdout);
        return 0;
    }
    printf("{\"client\": \"c\", \"ok\": true, \"exported\": %" PRIu64 "}\n", got);
    fflush(stdout);
    char in[64];
    while (fgets(in, sizeof in, stdin))
        ;
    rc = tc_segment_unexport(c, name, NULL);
    printf("{\"client\": \"c\", \"ok\": %s, \"unexported\": %d}\n", rc == TC_OK ? "true" : "false", rc);
    fflush(stdout);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    int wr = argc == 5 && strcmp(argv[1], "write") == 0;
    int ck = argc == 6 && strcmp(argv[1], "check") == 0;
    int sw = argc == 6 && strcmp(argv[1], "store-write") == 0;
    int sc = argc == 6 && strcmp(argv[1], "store-check") == 0;
    int rs = argc == 5 && strcmp(argv[1], "restart") == 0;
    int ex = argc >= 7 && strcmp(argv[1], "export-to") == 0;
    if (!wr && !ck && !sw && !sc && !rs && !ex) {
        fprintf(stderr,
                "usage: %s write SOCKET SEED SIZE | check SOCKET SEED OFFSET SIZE |\n"
                "       store-write SOCKET PREFIX SEED SIZE | store-check SOCKET PREFIX SEED SIZE |\n"
                "       export-to SOCKET NAME SEED SIZE GRANT... | restart SOCKET PREFIX N\n",
                argv[0]);
        return 2;
    }
    tc_options o;
    memset(&o, 0, sizeof o);
    o.socket = argv[2];
    o.name = "tc_compat";
    o.reconnect = rs;
    tc_conn *c;
    int rc = tc_connect(&o, &c);
    if (rc)
        return fail("connect", rc);
    if (ex) {
        int none = argc == 7 && strcmp(argv[6], "-") == 0;
        rc = run_export_to(c, argv[3], strtoull(argv[4], NULL, 0), strtoull(argv[5], NULL, 0),
                           (const char *const *)(argv + 6), none ? 0 : (size_t)(argc - 6));
        tc_close(c);
        return rc;
    }
    if (rs) {
        rc = run_restart(c, argv[2], argv[3], (size_t)strtoull(argv[4], NULL, 0));
        tc_close(c);
        return rc;
    }
    if (sw || sc) {
        uint64_t seed = strtoull(argv[4], NULL, 0), size = strtoull(argv[5], NULL, 0);
        rc = sw ? run_store_write(c, argv[3], seed, size) : run_store_check(c, argv[3], seed, size);
        tc_close(c);
        return rc;
    }
    uint64_t seed = strtoull(argv[3], NULL, 0);
    if (wr)
        rc = run_write(c, seed, strtoull(argv[4], NULL, 0));
    else
        rc = run_check(c, seed, strtoull(argv[4], NULL, 0), strtoull(argv[5], NULL, 0));
    tc_close(c);
    return rc;
}
