/*
 * store.c - the KV block store's calls against real daemons: the socket
 * calls (put and read through buffers and pool blocks, remove, pin with a
 * TTL, unpin all or nothing, reserve and commit or abort, stat, list,
 * flush, retention handles and placement leases), the
 * queue's store ops with their results regions, tc_kv (get in place, put
 * and read copying), key lists in both forms, answers that are not whole
 * (short, long, unwritten, with nonzero reserved bytes, outside the pool),
 * and daemons killed while a call waits in them.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "tensorcast.h"
#include "testhooks.h" /* the test build's hooks (src/testhooks.h) */

#define SECOND_NS 1000000000LL
#define VAL 4096u /* the values' size */

/* keyset holds up to 8 keys "<prefix><i>" as a tc_keys. */
typedef struct keyset {
    char text[8][64];
    tc_key k[8];
    tc_keys ks;
} keyset;

static const tc_keys *keys_of(keyset *s, const char *prefix, const int *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        snprintf(s->text[i], sizeof s->text[i], "%s%d", prefix, ids[i]);
        s->k[i].data = s->text[i];
        s->k[i].len = strlen(s->text[i]);
    }
    memset(&s->ks, 0, sizeof s->ks);
    s->ks.n = n;
    s->ks.keys = s->k;
    return &s->ks;
}

static const tc_keys *one_key(keyset *s, const char *key)
{
    snprintf(s->text[0], sizeof s->text[0], "%s", key);
    s->k[0].data = s->text[0];
    s->k[0].len = strlen(key);
    memset(&s->ks, 0, sizeof s->ks);
    s->ks.n = 1;
    s->ks.keys = s->k;
    return &s->ks;
}

static int all_ok(const int *codes, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (codes[i] != TC_OK)
            return 0;
    return 1;
}

/* ---- the socket ------------------------------------------------------------- */

static void socket_calls(tc_conn *c)
{
    const tc_pool *pool = tc_pool_info(c);
    tc_buffer *src, *dst;
    REQUIRE(tc_buffer_create(c, 8 * VAL, &src, NULL) == TC_OK);
    REQUIRE(tc_buffer_create(c, 8 * VAL, &dst, NULL) == TC_OK);
    for (int i = 0; i < 8; i++)
        fill((uint8_t *)src->data + i * VAL, VAL, 100 + (uint64_t)i);

    /* Put: positional codes, one per key. */
    keyset s;
    int ids[6] = {0, 1, 2, 0, 3, 4};
    const tc_keys *k = keys_of(&s, "sock/", ids, 6);
    char longkey[300];
    memset(longkey, 'k', sizeof longkey);
    s.k[4].data = longkey; /* over TC_MAX_KEY */
    s.k[4].len = sizeof longkey;
    tc_extent v[6];
    for (int i = 0; i < 6; i++)
        v[i] = (tc_extent){src->id, (uint64_t)i * VAL, VAL};
    v[2].segment = 999999; /* not a segment of this connection */
    v[5].length = 0;
    int codes[8];
    CHECK_RC(tc_store_put(c, k, v, 0, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_OK);
    CHECK(codes[2] == TC_NOT_FOUND);
    CHECK(codes[3] == TC_ALREADY_EXISTS); /* sock/0 again, in the same call */
    CHECK(codes[4] == TC_INVALID_ARGUMENT);
    CHECK(codes[5] == TC_INVALID_ARGUMENT);

    /* A durable put from pool blocks this connection holds. */
    uint64_t off;
    REQUIRE(tc_blocks_alloc(c, 1, VAL, &off, NULL) == TC_OK);
    fill((uint8_t *)pool->base + off, VAL, 7);
    tc_extent pv = {pool->segment, off, VAL};
    CHECK_RC(tc_store_put(c, one_key(&s, "sock/durable"), &pv, 1, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    tc_extent other = {pool->segment, off + VAL, VAL}; /* pool bytes it does not hold */
    CHECK_RC(tc_store_put(c, one_key(&s, "sock/notmine"), &other, 0, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_PERMISSION_DENIED);

    /* Read: bytes, lengths, a missing key, a destination too short. */
    int rids[4] = {1, 0, 9, 1};
    k = keys_of(&s, "sock/", rids, 4);
    tc_extent d[4];
    for (int i = 0; i < 4; i++)
        d[i] = (tc_extent){dst->id, (uint64_t)i * VAL, VAL};
    d[3].length = VAL - 1;
    uint64_t lens[4];
    memset(dst->data, 0, 4 * VAL);
    CHECK_RC(tc_store_read(c, k, d, lens, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && lens[0] == VAL && matches(dst->data, VAL, 101));
    CHECK(codes[1] == TC_OK && lens[1] == VAL && matches((uint8_t *)dst->data + VAL, VAL, 100));
    CHECK(codes[2] == TC_NOT_FOUND && lens[2] == 0);
    CHECK(codes[3] == TC_INVALID_ARGUMENT && lens[3] == VAL);

    /* The same keys packed: the same answer. */
    uint8_t packed[256];
    size_t plen = tc_keys_pack(k, packed, sizeof packed);
    CHECK(plen == tc_keys_packed_len(k) && plen == 4 * 2 + strlen("sock/1") * 3 + strlen("sock/9"));
    tc_keys pk = {.n = 4, .packed = packed, .packed_len = plen};
    int pcodes[4];
    CHECK_RC(tc_store_read(c, &pk, d, lens, pcodes, NULL), TC_OK);
    CHECK(memcmp(pcodes, codes, sizeof pcodes) == 0);
    /* A packed list that is not n keys exactly is refused here. */
    pk.packed_len = plen + 1;
    CHECK_RC(tc_store_read(c, &pk, d, lens, pcodes, NULL), TC_INVALID_ARGUMENT);
    pk.packed_len = plen;
    pk.n = 3;
    CHECK_RC(tc_store_read(c, &pk, d, lens, pcodes, NULL), TC_INVALID_ARGUMENT);
    pk.n = 0;
    CHECK_RC(tc_store_remove(c, &pk, pcodes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_store_remove(c, NULL, pcodes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_keys_pack(k, packed, plen - 1), 0); /* does not fit */

    /* Stat and list. */
    tc_key_info info;
    CHECK_RC(tc_store_stat(c, "sock/1", 6, &info, NULL), TC_OK);
    CHECK(info.size == VAL && info.in_l1 && info.pins == 0 && info.key == NULL);
    CHECK_RC(tc_store_stat(c, "sock/9", 6, &info, NULL), TC_NOT_FOUND);
    tc_key_info *list;
    size_t n;
    int more;
    CHECK_RC(tc_store_list(c, "sock/", 5, NULL, 0, 0, &list, &n, &more, NULL), TC_OK);
    CHECK(n == 3 && !more);
    if (n == 3) {
        CHECK(list[0].key_len == 6 && memcmp(list[0].key, "sock/0", 6) == 0);
        CHECK(list[1].key_len == 6 && memcmp(list[1].key, "sock/1", 6) == 0);
        CHECK(list[2].key_len == 12 && memcmp(list[2].key, "sock/durable", 12) == 0 && list[2].size == VAL);
    }
    tc_free(list);
    CHECK_RC(tc_store_list(c, "sock/", 5, "sock/0", 6, 1, &list, &n, &more, NULL), TC_OK);
    CHECK(n == 1 && more && list[0].key_len == 6 && memcmp(list[0].key, "sock/1", 6) == 0);
    tc_free(list);
    CHECK_RC(tc_store_list(c, "none/", 5, NULL, 0, 0, &list, &n, &more, NULL), TC_OK);
    CHECK(n == 0 && list == NULL && !more);

    /* Pin all or nothing; a pinned key cannot be removed; unpin below zero
     * is refused. */
    int pids[3] = {0, 9, 1};
    k = keys_of(&s, "sock/", pids, 3);
    CHECK_RC(tc_store_pin(c, k, 0, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_FAILED_PRECONDITION && codes[1] == TC_NOT_FOUND && codes[2] == TC_FAILED_PRECONDITION);
    CHECK_RC(tc_store_stat(c, "sock/0", 6, &info, NULL), TC_OK);
    CHECK(info.pins == 0); /* nothing changed */
    int pin2[2] = {0, 1};
    k = keys_of(&s, "sock/", pin2, 2);
    CHECK_RC(tc_store_pin(c, k, 60000, codes, NULL), TC_OK); /* a lease of a minute */
    CHECK(all_ok(codes, 2));
    CHECK_RC(tc_store_stat(c, "sock/1", 6, &info, NULL), TC_OK);
    CHECK(info.pins == 1);
    CHECK_RC(tc_store_remove(c, k, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_FAILED_PRECONDITION && codes[1] == TC_FAILED_PRECONDITION);
    CHECK_RC(tc_store_pin(c, k, 0, codes, NULL), TC_OK);
    CHECK_RC(tc_store_stat(c, "sock/0", 6, &info, NULL), TC_OK);
    CHECK(info.pins == 2); /* the lease and the untimed pin */
    CHECK_RC(tc_store_unpin(c, k, codes, NULL), TC_OK); /* the untimed pins first */
    CHECK(all_ok(codes, 2));
    CHECK_RC(tc_store_stat(c, "sock/0", 6, &info, NULL), TC_OK);
    CHECK(info.pins == 1);
    CHECK_RC(tc_store_unpin(c, k, codes, NULL), TC_OK); /* then the leases */
    CHECK(all_ok(codes, 2));
    CHECK_RC(tc_store_unpin(c, k, codes, NULL), TC_OK); /* below zero: refused, all of it */
    CHECK(codes[0] == TC_FAILED_PRECONDITION && codes[1] == TC_FAILED_PRECONDITION);
    CHECK_RC(tc_store_stat(c, "sock/0", 6, &info, NULL), TC_OK);
    CHECK(info.pins == 0);

    /* Reserve in the pool, write in place, commit (durable). */
    int rsv[3] = {10, 11, 0};
    k = keys_of(&s, "sock/", rsv, 3);
    uint64_t sizes[3] = {VAL, 2 * VAL, VAL}, offs[3];
    CHECK_RC(tc_store_reserve(c, k, sizes, offs, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_OK && codes[2] == TC_ALREADY_EXISTS && offs[2] == 0);
    fill((uint8_t *)pool->base + offs[0], VAL, 10);
    fill((uint8_t *)pool->base + offs[1], 2 * VAL, 11);
    CHECK_RC(tc_store_stat(c, "sock/10", 7, &info, NULL), TC_NOT_FOUND); /* invisible until committed */
    CHECK_RC(tc_store_commit(c, k, 1, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_OK && codes[2] == TC_ALREADY_EXISTS);
    CHECK_RC(tc_store_commit(c, one_key(&s, "sock/never"), 0, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_FAILED_PRECONDITION);
    tc_extent big = {dst->id, 0, 2 * VAL};
    CHECK_RC(tc_store_read(c, one_key(&s, "sock/11"), &big, lens, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && lens[0] == 2 * VAL && matches(dst->data, 2 * VAL, 11));
    CHECK_RC(tc_store_stat(c, "sock/11", 7, &info, NULL), TC_OK);
    CHECK(info.in_l2); /* durable: on L2 */
    CHECK_RC(tc_store_flush(c, 10000, NULL), TC_OK);

    /* Remove: absent keys are OK. */
    int rm[3] = {10, 11, 77};
    k = keys_of(&s, "sock/", rm, 3);
    CHECK_RC(tc_store_remove(c, k, codes, NULL), TC_OK);
    CHECK(all_ok(codes, 3));
    CHECK_RC(tc_store_stat(c, "sock/10", 7, &info, NULL), TC_NOT_FOUND);

    /* The store's figures in the stats. */
    tc_stats *st;
    CHECK_RC(tc_stats_get(c, &st, NULL), TC_OK);
    CHECK(counter(&st->store, "keys") >= 3 && counter(&st->store, "durable_puts") >= 2);
    CHECK(counter(&st->pool, "size") != UINT64_MAX); /* the groups before it intact */
    tc_free(st);

    CHECK_RC(tc_store_put(NULL, k, v, 0, codes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_store_put(c, k, NULL, 0, codes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_store_stat(c, NULL, 3, &info, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_buffer_destroy(c, src, NULL), TC_OK);
    CHECK_RC(tc_buffer_destroy(c, dst, NULL), TC_OK);
}

/* socket_abort: reservations given back with tc_store_abort free their
 * blocks at once (the store's l1_bytes and reserved as before, aborted
 * counted); a key never reserved, another connection's reservation (left
 * alone: it commits after) and one aborted already get
 * TC_FAILED_PRECONDITION; a commit after the abort finds nothing and the key
 * can be reserved again; an invalid key refuses the whole batch. */
static void socket_abort(tc_conn *c, const char *socket)
{
    const tc_pool *pool = tc_pool_info(c);
    tc_conn *other = dial(socket, 10000);
    keyset s, t;
    int codes[4];
    uint64_t offs[4], sizes[4] = {VAL, 3 * VAL, VAL, VAL};
    CHECK_RC(tc_store_reserve(other, one_key(&t, "abort/theirs"), sizes, offs, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    fill((uint8_t *)pool->base + offs[0], VAL, 77);

    tc_stats *st;
    REQUIRE(tc_stats_get(c, &st, NULL) == TC_OK);
    uint64_t l1 = counter(&st->store, "l1_bytes"), reserved = counter(&st->store, "reserved");
    uint64_t aborted = counter(&st->store, "aborted");
    tc_free(st);
    CHECK(aborted != UINT64_MAX);

    int mine[2] = {0, 1};
    CHECK_RC(tc_store_reserve(c, keys_of(&s, "abort/", mine, 2), sizes, offs, codes, NULL), TC_OK);
    CHECK(all_ok(codes, 2));
    fill((uint8_t *)pool->base + offs[1], 3 * VAL, 1); /* written in place, then given up */

    tc_key four[4] = {{"abort/0", 7}, {"abort/never", 11}, {"abort/theirs", 12}, {"abort/1", 7}};
    tc_keys fk = {4, four, NULL, 0};
    CHECK_RC(tc_store_abort(c, &fk, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_FAILED_PRECONDITION && codes[2] == TC_FAILED_PRECONDITION &&
          codes[3] == TC_OK);
    REQUIRE(tc_stats_get(c, &st, NULL) == TC_OK);
    CHECK(counter(&st->store, "l1_bytes") == l1);
    CHECK(counter(&st->store, "reserved") == reserved);
    CHECK(counter(&st->store, "aborted") == aborted + 2);
    tc_free(st);

    const tc_keys *k = keys_of(&s, "abort/", mine, 2);
    CHECK_RC(tc_store_abort(c, k, codes, NULL), TC_OK); /* twice */
    CHECK(codes[0] == TC_FAILED_PRECONDITION && codes[1] == TC_FAILED_PRECONDITION);
    CHECK_RC(tc_store_commit(c, k, 0, codes, NULL), TC_OK); /* nothing to commit */
    CHECK(codes[0] == TC_FAILED_PRECONDITION && codes[1] == TC_FAILED_PRECONDITION);
    tc_key_info info;
    CHECK_RC(tc_store_stat(c, "abort/1", 7, &info, NULL), TC_NOT_FOUND);

    /* The other connection's reservation is intact. */
    CHECK_RC(tc_store_commit(other, one_key(&t, "abort/theirs"), 0, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    CHECK_RC(tc_store_stat(c, "abort/theirs", 12, &info, NULL), TC_OK);
    CHECK(info.size == VAL);

    /* Reserved again and committed: the key is free. */
    CHECK_RC(tc_store_reserve(c, one_key(&s, "abort/0"), sizes, offs, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    fill((uint8_t *)pool->base + offs[0], VAL, 3);
    CHECK_RC(tc_store_commit(c, one_key(&s, "abort/0"), 0, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);

    /* An invalid key refuses the whole batch; the valid one stays reserved. */
    CHECK_RC(tc_store_reserve(c, one_key(&s, "abort/1"), sizes, offs, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    char longkey[300];
    memset(longkey, 'k', sizeof longkey);
    tc_key bad[2] = {{"abort/1", 7}, {longkey, sizeof longkey}};
    tc_keys bk = {2, bad, NULL, 0};
    CHECK_RC(tc_store_abort(c, &bk, codes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_store_abort(c, one_key(&s, "abort/1"), codes, NULL), TC_OK); /* still reserved */
    CHECK(codes[0] == TC_OK);

    CHECK_RC(tc_store_abort(NULL, k, codes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_store_abort(c, k, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_store_abort(c, NULL, codes, NULL), TC_INVALID_ARGUMENT);
    tc_close(other);
}

/* ---- the queue ----------------------------------------------------------------- */

/* run stages one store op (accepted at once: the queue is idle) and reaps
 * its completion. */
static tc_cqe run(tc_queue *q, int staged_rc)
{
    tc_cqe cqe;
    memset(&cqe, 0, sizeof cqe);
    CHECK_RC(staged_rc, TC_OK);
    size_t n = 0;
    CHECK_RC(tc_queue_reap(q, &cqe, 1, 1, 10 * SECOND_NS, &n), TC_OK);
    CHECK(n == 1);
    return cqe;
}

static void queue_calls(tc_conn *c, const char *socket)
{
    const tc_pool *pool = tc_pool_info(c);
    tc_queue *q;
    REQUIRE(tc_queue_open(c, 8, NULL, &q) == TC_OK);
    tc_results *r;
    REQUIRE(tc_results_create(c, 8, &r) == TC_OK);
    keyset s;
    int codes[8];
    uint64_t offs[8], lens[8];
    size_t acc = 0;

    /* Reserve 4 blocks, write them in place, commit: keys q/0..q/3. */
    int ids[4] = {0, 1, 2, 3};
    const tc_keys *k = keys_of(&s, "q/", ids, 4);
    tc_cqe e = run(q, tc_queue_store_reserve(q, k, VAL, r, 41, &acc));
    CHECK(acc == 1 && e.user_data == 41 && e.code == TC_OK && e.transferred == 4);
    CHECK_RC(tc_results_check(r, &e, codes, offs, lens), TC_OK);
    CHECK(all_ok(codes, 4));
    for (int i = 0; i < 4; i++) {
        CHECK(lens[i] == VAL && offs[i] + VAL <= pool->size);
        fill((uint8_t *)pool->base + offs[i], VAL, 200 + (uint64_t)i);
    }
    e = run(q, tc_queue_store_commit(q, k, 1, r, 42, &acc));
    CHECK_RC(tc_results_check(r, &e, codes, NULL, NULL), TC_OK);
    CHECK(all_ok(codes, 4));

    /* Exists: positional, and renews nothing. */
    int xids[3] = {2, 7, 0};
    k = keys_of(&s, "q/", xids, 3);
    e = run(q, tc_queue_store_exists(q, k, r, 43, &acc));
    CHECK(e.transferred == 2);
    CHECK_RC(tc_results_check(r, &e, codes, NULL, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_NOT_FOUND && codes[2] == TC_OK);

    /* Get: pinned, located in the pool, read in place; then unpinned. */
    e = run(q, tc_queue_store_get(q, k, r, 44, &acc));
    CHECK_RC(tc_results_check(r, &e, codes, offs, lens), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_NOT_FOUND && codes[2] == TC_OK);
    CHECK(lens[0] == VAL && matches((uint8_t *)pool->base + offs[0], VAL, 202));
    CHECK(lens[2] == VAL && matches((uint8_t *)pool->base + offs[2], VAL, 200));
    CHECK(offs[1] == 0 && lens[1] == 0);
    tc_key_info info;
    CHECK_RC(tc_store_stat(c, "q/2", 3, &info, NULL), TC_OK);
    CHECK(info.pins == 1);
    /* Unpin all or nothing: q/7 is not stored, so nothing is unpinned. */
    e = run(q, tc_queue_store_unpin(q, k, r, 45, &acc));
    CHECK(e.code == TC_FAILED_PRECONDITION && e.transferred == 0);
    CHECK_RC(tc_results_check(r, &e, codes, NULL, NULL), TC_FAILED_PRECONDITION);
    CHECK(codes[0] == TC_FAILED_PRECONDITION && codes[1] == TC_NOT_FOUND && codes[2] == TC_FAILED_PRECONDITION);
    CHECK_RC(tc_store_stat(c, "q/2", 3, &info, NULL), TC_OK);
    CHECK(info.pins == 1);
    /* Nor when q/3 holds no pin of this connection (below zero). */
    int zids[2] = {2, 3};
    e = run(q, tc_queue_store_unpin(q, keys_of(&s, "q/", zids, 2), r, 45, &acc));
    CHECK_RC(tc_results_check(r, &e, codes, NULL, NULL), TC_FAILED_PRECONDITION);
    CHECK(codes[0] == TC_FAILED_PRECONDITION && codes[1] == TC_FAILED_PRECONDITION);
    CHECK_RC(tc_store_stat(c, "q/2", 3, &info, NULL), TC_OK);
    CHECK(info.pins == 1);
    int uids[2] = {2, 0};
    k = keys_of(&s, "q/", uids, 2);
    e = run(q, tc_queue_store_unpin(q, k, r, 46, &acc));
    CHECK_RC(tc_results_check(r, &e, codes, NULL, NULL), TC_OK);
    CHECK(all_ok(codes, 2));
    CHECK_RC(tc_store_stat(c, "q/2", 3, &info, NULL), TC_OK);
    CHECK(info.pins == 0);

    /* Lookup prefix, with and without a pin. */
    int pids[5] = {0, 1, 2, 5, 3};
    k = keys_of(&s, "q/", pids, 5);
    size_t found = 9;
    e = run(q, tc_queue_store_lookup_prefix(q, k, 0, 47, &acc));
    CHECK_RC(tc_prefix_check(q, &e, 5, &found), TC_OK);
    CHECK(found == 3);
    e = run(q, tc_queue_store_lookup_prefix(q, k, 1, 48, &acc));
    CHECK_RC(tc_prefix_check(q, &e, 5, &found), TC_OK);
    CHECK(found == 3);
    CHECK_RC(tc_store_stat(c, "q/1", 3, &info, NULL), TC_OK);
    CHECK(info.pins == 1);
    k = keys_of(&s, "q/", pids, 3);
    e = run(q, tc_queue_store_unpin(q, k, r, 49, &acc));
    CHECK_RC(tc_results_check(r, &e, codes, NULL, NULL), TC_OK);
    CHECK(all_ok(codes, 3));

    /* What staging refuses: no results, a region too small or of another
     * connection, an unpacked list that is not one. */
    int many[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    tc_results *small;
    REQUIRE(tc_results_create(c, 2, &small) == TC_OK);
    CHECK_RC(tc_queue_store_exists(q, keys_of(&s, "q/", many, 3), small, 1, &acc), TC_INVALID_ARGUMENT);
    CHECK(acc == 0);
    CHECK_RC(tc_queue_store_exists(q, k, NULL, 1, &acc), TC_INVALID_ARGUMENT);
    tc_conn *c2 = dial(socket, 0);
    tc_results *theirs;
    REQUIRE(tc_results_create(c2, 8, &theirs) == TC_OK);
    CHECK_RC(tc_queue_store_exists(q, k, theirs, 1, &acc), TC_INVALID_ARGUMENT);
    tc_results_destroy(theirs);
    tc_close(c2);
    tc_key bad = {NULL, 3};
    tc_keys bk = {.n = 1, .keys = &bad};
    CHECK_RC(tc_queue_store_exists(q, &bk, r, 1, &acc), TC_INVALID_ARGUMENT);
    tc_results_destroy(small);

    /* A region in a buffer of the caller's, at an offset. */
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 4096, &b, NULL) == TC_OK);
    tc_results *in;
    CHECK_RC(tc_results_in(c, b, 4, 1, &in), TC_INVALID_ARGUMENT); /* not 8-aligned */
    CHECK_RC(tc_results_in(c, b, 4096 - 8, 1, &in), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_results_in(c, b, 1024, 4, &in), TC_OK);
    e = run(q, tc_queue_store_exists(q, keys_of(&s, "q/", many, 4), in, 50, &acc));
    CHECK_RC(tc_results_check(in, &e, codes, NULL, NULL), TC_OK);
    CHECK(all_ok(codes, 4));
    CHECK(((uint8_t *)b->data)[1024 + 3 * 16] == TC_OK && ((uint8_t *)b->data)[1024 + 16 + 4] == 0);
    tc_results_destroy(in);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);

    /* A refused entry: its completion carries the code, and so does the
     * check (nothing to read). */
    e = run(q, tc_queue_store_reserve(q, keys_of(&s, "q/", many, 8), 0, r, 51, &acc));
    CHECK(e.code == TC_OK); /* reserve of 0 bytes: each key refuses it */
    CHECK_RC(tc_results_check(r, &e, codes, NULL, NULL), TC_OK);
    CHECK(codes[4] == TC_INVALID_ARGUMENT);

    tc_results_destroy(r);
    CHECK_RC(tc_queue_close(q), TC_OK);
}

/* ---- tc_kv ---------------------------------------------------------------------- */

/* open_kv opens a tc_kv of max_keys keys per call on c. */
static tc_kv *open_kv(tc_conn *c, uint32_t max_keys)
{
    tc_kv *kv;
    tc_kv_opts o;
    memset(&o, 0, sizeof o);
    o.max_keys = max_keys;
    o.timeout_ms = 10000;
    REQUIRE(tc_kv_open(c, &o, &kv) == TC_OK);
    return kv;
}

static void kv_calls(tc_conn *c)
{
    tc_kv *kv = open_kv(c, 16);
    keyset s;
    int codes[8];
    uint64_t offs[8], lens[8];

    /* Put from malloc'd memory: one size (the queue's reserve), then sizes
     * that differ (the socket's). */
    uint8_t *vals[4];
    uint64_t vl[4] = {VAL, VAL, VAL, VAL};
    for (int i = 0; i < 4; i++) {
        vals[i] = malloc(3 * VAL);
        REQUIRE(vals[i]);
        fill(vals[i], 3 * VAL, 300 + (uint64_t)i);
    }
    int ids[4] = {0, 1, 2, 3};
    const tc_keys *k = keys_of(&s, "kv/", ids, 4);
    CHECK_RC(tc_kv_put(kv, k, (const void *const *)vals, vl, 0, codes), TC_OK);
    CHECK(all_ok(codes, 4));
    CHECK_RC(tc_kv_put(kv, k, (const void *const *)vals, vl, 0, codes), TC_OK);
    CHECK(codes[0] == TC_ALREADY_EXISTS && codes[3] == TC_ALREADY_EXISTS);
    int more[3] = {10, 11, 12};
    k = keys_of(&s, "kv/", more, 3);
    uint64_t vl2[3] = {VAL, 3 * VAL, 0};
    CHECK_RC(tc_kv_put(kv, k, (const void *const *)vals, vl2, 1, codes), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_OK && codes[2] == TC_INVALID_ARGUMENT);

    /* Exists, lookup_prefix. */
    int xids[4] = {0, 1, 4, 11};
    k = keys_of(&s, "kv/", xids, 4);
    CHECK_RC(tc_kv_exists(kv, k, codes), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_OK && codes[2] == TC_NOT_FOUND && codes[3] == TC_OK);
    size_t found;
    CHECK_RC(tc_kv_lookup_prefix(kv, k, 0, &found), TC_OK);
    CHECK(found == 2);

    /* Read, copying: a short destination says the length. */
    int rids[4] = {11, 2, 9, 3};
    k = keys_of(&s, "kv/", rids, 4);
    uint8_t *outs[4];
    uint64_t caps[4] = {3 * VAL, VAL, VAL, VAL - 1};
    for (int i = 0; i < 4; i++) {
        outs[i] = calloc(1, 3 * VAL);
        REQUIRE(outs[i]);
    }
    CHECK_RC(tc_kv_read(kv, k, (void *const *)outs, caps, lens, codes), TC_OK);
    CHECK(codes[0] == TC_OK && lens[0] == 3 * VAL && matches(outs[0], 3 * VAL, 301));
    CHECK(codes[1] == TC_OK && lens[1] == VAL && matches(outs[1], VAL, 302));
    CHECK(codes[2] == TC_NOT_FOUND && lens[2] == 0);
    CHECK(codes[3] == TC_INVALID_ARGUMENT && lens[3] == VAL);
    tc_key_info info;
    CHECK_RC(tc_store_stat(c, "kv/3", 4, &info, NULL), TC_OK);
    CHECK(info.pins == 0); /* read unpins every key it pinned */

    /* Get in place, then unpin. */
    const tc_pool *pool = tc_pool_info(c);
    CHECK_RC(tc_kv_get(kv, k, offs, lens, codes), TC_OK);
    CHECK(codes[0] == TC_OK && matches((uint8_t *)pool->base + offs[0], 3 * VAL, 301));
    CHECK(codes[2] == TC_NOT_FOUND);
    CHECK_RC(tc_kv_unpin(kv, k, codes), TC_FAILED_PRECONDITION); /* kv/9 is not stored: nothing unpinned */
    CHECK(codes[0] == TC_FAILED_PRECONDITION && codes[2] == TC_NOT_FOUND);
    int pinned[3] = {11, 2, 3};
    k = keys_of(&s, "kv/", pinned, 3);
    CHECK_RC(tc_kv_unpin(kv, k, codes), TC_OK);
    CHECK(all_ok(codes, 3));

    /* Lookup with pin, reserve and commit through the tc_kv. */
    CHECK_RC(tc_kv_lookup_prefix(kv, keys_of(&s, "kv/", ids, 4), 1, &found), TC_OK);
    CHECK(found == 4);
    CHECK_RC(tc_kv_unpin(kv, &s.ks, codes), TC_OK);
    int nids[2] = {20, 21};
    k = keys_of(&s, "kv/", nids, 2);
    CHECK_RC(tc_kv_reserve(kv, k, VAL, offs, codes), TC_OK);
    CHECK(all_ok(codes, 2));
    fill((uint8_t *)pool->base + offs[1], VAL, 21);
    CHECK_RC(tc_kv_commit(kv, k, 0, codes), TC_OK);
    CHECK(all_ok(codes, 2));
    CHECK_RC(tc_kv_read(kv, one_key(&s, "kv/21"), (void *const *)outs, caps, lens, codes), TC_OK);
    CHECK(codes[0] == TC_OK && matches(outs[0], VAL, 21));

    /* What a tc_kv refuses before sending. */
    tc_key many[17];
    for (int i = 0; i < 17; i++)
        many[i] = (tc_key){"x", 1};
    tc_keys mk = {.n = 17, .keys = many};
    CHECK_RC(tc_kv_exists(kv, &mk, codes), TC_INVALID_ARGUMENT); /* more than max_keys */
    CHECK_RC(tc_kv_exists(NULL, k, codes), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_kv_exists(kv, k, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_kv_put(kv, k, NULL, vl, 0, codes), TC_INVALID_ARGUMENT);
    /* ... and still works after. */
    CHECK_RC(tc_kv_exists(kv, k, codes), TC_OK);
    CHECK(all_ok(codes, 2));

    for (int i = 0; i < 4; i++) {
        free(vals[i]);
        free(outs[i]);
    }
    tc_kv_close(kv);
}

/* A read of a batch past TC__STREAM_MIN (4 MiB) takes copy.c's
 * non-temporal path: values of odd sizes, some under its per-value
 * minimum, into destinations that are not 16-byte aligned, arrive whole
 * and touch no byte around them. */
static void kv_large_read(tc_conn *c)
{
    tc_kv *kv = open_kv(c, 8);
    enum { N = 6 };
    /* 4 MiB and 97 bytes in all, in blocks of 4 MiB and 8 KiB: within the
     * session's reservations (a quarter of the test daemon's L1). */
    const uint64_t sizes[N] = {1u << 20, 1u << 20, 100, (1u << 20) - 1, 5, (1u << 20) - 7};
    uint8_t *vals[N], *outs[N];
    void *dsts[N];
    uint64_t caps[N], lens[N];
    int codes[N], ids[N];
    for (int i = 0; i < N; i++) {
        ids[i] = i;
        vals[i] = malloc(sizes[i]);
        outs[i] = malloc(sizes[i] + 2);
        REQUIRE(vals[i] && outs[i]);
        fill(vals[i], sizes[i], 700 + (uint64_t)i);
        memset(outs[i], 0xa5, sizes[i] + 2);
        dsts[i] = outs[i] + 1;
        caps[i] = sizes[i];
    }
    keyset s;
    const tc_keys *k = keys_of(&s, "big/", ids, N);
    CHECK_RC(tc_kv_put(kv, k, (const void *const *)vals, sizes, 0, codes), TC_OK);
    CHECK(all_ok(codes, N));
    CHECK_RC(tc_kv_read(kv, k, (void *const *)dsts, caps, lens, codes), TC_OK);
    CHECK(all_ok(codes, N));
    for (int i = 0; i < N; i++) {
        CHECK(lens[i] == sizes[i]);
        CHECK(matches(outs[i] + 1, sizes[i], 700 + (uint64_t)i));
        CHECK(outs[i][0] == 0xa5 && outs[i][sizes[i] + 1] == 0xa5);
    }
    CHECK_RC(tc_store_remove(c, k, codes, NULL), TC_OK);
    for (int i = 0; i < N; i++) {
        free(vals[i]);
        free(outs[i]);
    }
    tc_kv_close(kv);
}

/* pins_of is key's pin count over all connections. */
static uint32_t pins_of(tc_conn *c, const char *key)
{
    tc_key_info info;
    CHECK_RC(tc_store_stat(c, key, strlen(key), &info, NULL), TC_OK);
    return info.pins;
}

/* socket_grants: a retention handle pins its keys until released, renews
 * with a new token (its id kept), is refused forged or released twice; a
 * lease create retried with its operation id joins (one pin), with other
 * keys is refused; releases give the pins back. */
static void socket_grants(tc_conn *c)
{
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 2 * VAL, &b, NULL) == TC_OK);
    fill(b->data, 2 * VAL, 9);
    keyset s, t;
    int ids[2] = {0, 1}, codes[2];
    const tc_keys *k = keys_of(&s, "grant/", ids, 2);
    tc_extent v[2] = {{b->id, 0, VAL}, {b->id, VAL, VAL}};
    CHECK_RC(tc_store_put(c, k, v, 0, codes, NULL), TC_OK);
    CHECK(all_ok(codes, 2));

    tc_handle h;
    CHECK_RC(tc_handle_issue(c, k, 60000, &h, NULL), TC_OK);
    CHECK(h.token_len > 0 && h.id != 0 && h.expiry_unix_ms != 0);
    CHECK(pins_of(c, "grant/0") == 1 && pins_of(c, "grant/1") == 1);
    tc_handle none;
    CHECK_RC(tc_handle_issue(c, one_key(&t, "grant/absent"), 60000, &none, NULL), TC_NOT_FOUND);
    tc_handle old = h;
    CHECK_RC(tc_handle_renew(c, h.token, h.token_len, 120000, &h, NULL), TC_OK);
    CHECK(h.id == old.id && h.expiry_unix_ms >= old.expiry_unix_ms &&
          (h.token_len != old.token_len || memcmp(h.token, old.token, h.token_len) != 0));
    tc_handle forged = h;
    forged.token[forged.token_len - 1] ^= 1;
    CHECK_RC(tc_handle_release(c, forged.token, forged.token_len, NULL), TC_PERMISSION_DENIED);
    CHECK_RC(tc_handle_release(c, h.token, h.token_len, NULL), TC_OK);
    CHECK_RC(tc_handle_release(c, h.token, h.token_len, NULL), TC_PERMISSION_DENIED);
    CHECK(pins_of(c, "grant/0") == 0);
    CHECK_RC(tc_handle_release(c, h.token, 0, NULL), TC_INVALID_ARGUMENT);

    uint64_t exp1 = 0, exp2 = 0;
    int joined = -1;
    CHECK_RC(tc_lease_create(c, "op-c", 4, k, 60000, &exp1, &joined, NULL), TC_OK);
    CHECK(joined == 0 && exp1 != 0);
    CHECK_RC(tc_lease_create(c, "op-c", 4, k, 60000, &exp2, &joined, NULL), TC_OK);
    CHECK(joined == 1 && exp2 == exp1);
    CHECK(pins_of(c, "grant/0") == 1);
    CHECK_RC(tc_lease_create(c, "op-c", 4, one_key(&t, "grant/0"), 60000, NULL, NULL, NULL), TC_FAILED_PRECONDITION);
    CHECK_RC(tc_lease_release(c, "op-c", 4, NULL), TC_OK);
    CHECK(pins_of(c, "grant/0") == 0);
    CHECK_RC(tc_lease_release(c, "op-none", 7, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_lease_create(c, "", 0, k, 60000, NULL, NULL, NULL), TC_INVALID_ARGUMENT);

    CHECK_RC(tc_store_remove(c, k, codes, NULL), TC_OK);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);
}

void test_store(const tcd *d)
{
    tc_conn *c = dial(d->socket, 10000);
    /* A daemon without peers has no store across hosts. */
    tc_key_location *nowhere = NULL;
    CHECK_RC(tc_cluster_locate(c, "k", 1, &nowhere, NULL), TC_UNAVAILABLE);
    CHECK(nowhere == NULL);
    socket_calls(c);
    socket_abort(c, d->socket);
    socket_grants(c);
    queue_calls(c, d->socket);
    kv_calls(c);
    kv_large_read(c);
    tc_close(c);

    /* tc_close frees what is still open: a tc_kv and a region (ASan's leak
     * check says whether it did). */
    c = dial(d->socket, 10000);
    tc_kv *kv;
    tc_results *r;
    REQUIRE(tc_kv_open(c, NULL, &kv) == TC_OK);
    REQUIRE(tc_results_create(c, 4, &r) == TC_OK);
    keyset s;
    int code;
    CHECK_RC(tc_kv_exists(kv, one_key(&s, "kv/0"), &code), TC_OK);
    CHECK(code == TC_OK);
    tc_close(c);
}

/* test_store_basic makes each socket call once on fresh keys (through the
 * recording relay, so that fuzz_answers mutates the store's answers). */
void test_store_basic(tc_conn *c)
{
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 2 * VAL, &b, NULL) == TC_OK);
    fill(b->data, VAL, 5);
    keyset s;
    int ids[2] = {0, 1};
    const tc_keys *k = keys_of(&s, "rec/", ids, 2);
    tc_extent v[2] = {{b->id, 0, VAL}, {b->id, VAL, VAL}};
    int codes[2];
    uint64_t lens[2], offs[2], sizes[2] = {VAL, VAL};
    CHECK_RC(tc_store_put(c, k, v, 0, codes, NULL), TC_OK);
    tc_extent d[2] = {{b->id, VAL, VAL}, {b->id, 0, VAL}}; /* swapped */
    CHECK_RC(tc_store_read(c, k, d, lens, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && lens[0] == VAL && matches((uint8_t *)b->data + VAL, VAL, 5));
    tc_key_info info, *list;
    size_t n;
    int more;
    CHECK_RC(tc_store_stat(c, "rec/0", 5, &info, NULL), TC_OK);
    CHECK_RC(tc_store_list(c, "rec/", 4, NULL, 0, 0, &list, &n, &more, NULL), TC_OK);
    CHECK(n == 2);
    tc_free(list);
    CHECK_RC(tc_store_pin(c, k, 0, codes, NULL), TC_OK);
    CHECK_RC(tc_store_unpin(c, k, codes, NULL), TC_OK);
    int rids[2] = {2, 3};
    const tc_keys *rk = keys_of(&s, "rec/", rids, 2);
    CHECK_RC(tc_store_reserve(c, rk, sizes, offs, codes, NULL), TC_OK);
    CHECK_RC(tc_store_commit(c, rk, 0, codes, NULL), TC_OK);
    CHECK(all_ok(codes, 2));
    CHECK_RC(tc_store_remove(c, rk, codes, NULL), TC_OK);
    CHECK_RC(tc_store_reserve(c, one_key(&s, "rec/4"), sizes, offs, codes, NULL), TC_OK);
    CHECK_RC(tc_store_abort(c, one_key(&s, "rec/4"), codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    CHECK_RC(tc_store_flush(c, 10000, NULL), TC_OK);
    k = keys_of(&s, "rec/", ids, 2); /* rec/0 and rec/1 again: s was reused */
    tc_handle h;
    CHECK_RC(tc_handle_issue(c, k, 60000, &h, NULL), TC_OK);
    CHECK_RC(tc_handle_renew(c, h.token, h.token_len, 60000, &h, NULL), TC_OK);
    CHECK_RC(tc_handle_release(c, h.token, h.token_len, NULL), TC_OK);
    int joined;
    CHECK_RC(tc_lease_create(c, "rec-op", 6, k, 60000, NULL, &joined, NULL), TC_OK);
    CHECK_RC(tc_lease_release(c, "rec-op", 6, NULL), TC_OK);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);
}

/* ---- answers that are not whole ---------------------------------------------- */

/* The socket: a read of five keys answering OK, NOT_FOUND, OK, NOT_FOUND,
 * OK, its codes made one short or one long by a relay. */
static void relayed_read(const tcd *d, void (*mutate)(uint8_t *, size_t *))
{
    relay rl;
    memset(&rl, 0, sizeof rl);
    rl.mutate_at = 4;
    rl.mutate = mutate;
    relay_start(&rl, d->dir, d->socket);
    tc_conn *c = dial(rl.path, 5000);
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 5 * VAL, &b, NULL) == TC_OK); /* request 3 */
    keyset s;
    int ids[5] = {0, 9, 1, 9, 0};
    const tc_keys *k = keys_of(&s, "sock/", ids, 5);
    tc_extent dst[5];
    for (int i = 0; i < 5; i++)
        dst[i] = (tc_extent){b->id, (uint64_t)i * VAL, VAL};
    int codes[5];
    uint64_t lens[5];
    CHECK_RC(tc_store_read(c, k, dst, lens, codes, NULL), TC_EPROTO); /* request 4 */
    CHECK(rl.mutated);
    CHECK_RC(tc_ping(c, "again", 5, NULL), TC_ECLOSED);
    tc_close(c);
    relay_join(&rl);
}

/* rewrite_offsets is a daemon that writes a results region again after
 * the check read it: every record's offset now points past any pool. */
static void rewrite_offsets(uint8_t *region, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        region[(size_t)i * 16 + 15] = 0x7f;
}

void test_store_answers(const tcd *d)
{
    relayed_read(d, short_codes);
    relayed_read(d, long_codes);

    /* The queue: a real answer, then copies of it altered one way each. */
    tc_conn *c = dial(d->socket, 10000);
    const tc_pool *pool = tc_pool_info(c);
    tc_queue *q;
    REQUIRE(tc_queue_open(c, 8, NULL, &q) == TC_OK);
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 4096, &b, NULL) == TC_OK);
    tc_results *r;
    REQUIRE(tc_results_in(c, b, 0, 4, &r) == TC_OK);
    keyset s;
    int ids[3] = {0, 9, 1};
    const tc_keys *k = keys_of(&s, "sock/", ids, 3);
    size_t acc;
    tc_cqe e = run(q, tc_queue_store_get(q, k, r, 7, &acc));
    int codes[3];
    uint64_t offs[3];
    CHECK_RC(tc_results_check(r, &e, codes, offs, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_NOT_FOUND && codes[2] == TC_OK && e.transferred == 2);
    uint8_t *reg = b->data, saved[48];
    memcpy(saved, reg, sizeof saved);
    /* The region changing after the check read it: what the check returns
     * is what it checked, not a second reading of the region. */
    uint64_t checked[3] = {offs[0], offs[1], offs[2]};
    tc__test_results_read = rewrite_offsets;
    CHECK_RC(tc_results_check(r, &e, codes, offs, NULL), TC_OK);
    tc__test_results_read = NULL;
    CHECK(offs[0] == checked[0] && offs[2] == checked[2] && offs[0] < pool->size && offs[2] < pool->size);
    memcpy(reg, saved, sizeof saved);
    struct {
        const char *what;
        int rec, byte, value; /* a byte of the region to set, or rec -1 */
        int64_t count;        /* added to the completion's count */
    } cases[] = {
        {"a record never written", 1, 0, 0xff, 0},
        {"a code that is none", 0, 0, TC_INTERNAL + 1, 0},
        {"nonzero reserved bytes", 0, 2, 1, 0},
        {"an offset outside the pool", 2, 15, 0x7f, 0},
        {"a length past the pool", 2, 7, 0x7f, 0},
        {"a short count", -1, 0, 0, -1},
        {"a long count", -1, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(reg, saved, sizeof saved);
        tc_cqe bad = e;
        if (cases[i].rec >= 0)
            reg[cases[i].rec * 16 + cases[i].byte] = (uint8_t)cases[i].value;
        bad.transferred = (uint64_t)((int64_t)e.transferred + cases[i].count);
        int rc = tc_results_check(r, &bad, codes, offs, NULL);
        if (rc != TC_EPROTO)
            fprintf(stderr, "store answers: %s: %s\n", cases[i].what, tc_strerror(rc));
        CHECK_RC(rc, TC_EPROTO);
    }
    /* Random alterations: each answer verifies or is refused whole, and
     * what verifies keeps its records inside the pool. */
    uint64_t x = 0x2545f4914f6cdd1dull;
    int refused = 0, verified = 0;
    for (int i = 0; i < 3000; i++) {
        memcpy(reg, saved, sizeof saved);
        tc_cqe bad = e;
        for (int m = 0; m < 1 + i % 3; m++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            reg[x % sizeof saved] ^= (uint8_t)(1u << (x >> 32) % 8);
        }
        if (i % 7 == 0)
            bad.transferred = x % 5;
        if (i % 11 == 0)
            bad.code = TC_FAILED_PRECONDITION;
        int rc = tc_results_check(r, &bad, codes, offs, NULL);
        CHECK(rc == TC_OK || rc == TC_EPROTO || rc == bad.code);
        if (rc == TC_EPROTO) {
            refused++;
            continue;
        }
        verified++;
        for (int j = 0; j < 3; j++)
            CHECK(codes[j] != TC_OK || offs[j] < pool->size);
    }
    CHECK(refused > 0 && verified > 0);
    /* A prefix longer than the keys asked. */
    tc_cqe pe = {.user_data = 1, .transferred = 4, .code = TC_OK, .state = TC_TASK_COMPLETED};
    size_t found;
    CHECK_RC(tc_prefix_check(q, &pe, 3, &found), TC_EPROTO);
    pe.transferred = 3;
    CHECK_RC(tc_prefix_check(q, &pe, 3, &found), TC_OK);
    CHECK(found == 3);
    /* A completion that failed as a whole says so, whatever the region. */
    tc_cqe failed = {.user_data = 1, .code = TC_UNAVAILABLE, .state = TC_TASK_FAILED};
    CHECK_RC(tc_results_check(r, &failed, codes, NULL, NULL), TC_UNAVAILABLE);
    /* The connection is broken: what the daemon holds for it is unknown. */
    CHECK_RC(tc_ping(c, "x", 1, NULL), TC_ECLOSED);
    tc_close(c);
}

/* ---- daemons killed mid-call --------------------------------------------------- */

typedef struct caller {
    pthread_t th;
    tc_conn *c;
    tc_kv *kv;
    volatile pid_t tid;
    int rc;
    int64_t returned_ms;
} caller;

static void *kv_caller(void *arg)
{
    caller *w = arg;
    keyset s;
    int code;
    __atomic_store_n(&w->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    w->rc = tc_kv_exists(w->kv, one_key(&s, "k/0"), &code);
    __atomic_store_n(&w->returned_ms, now_ms(), __ATOMIC_RELEASE);
    return NULL;
}

static void *socket_caller(void *arg)
{
    caller *w = arg;
    tc_key_info info;
    __atomic_store_n(&w->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    w->rc = tc_store_stat(w->c, "k/0", 3, &info, NULL);
    w->returned_ms = now_ms();
    return NULL;
}

static int blocked_in_futex(pid_t tid) { return blocked_in(tid, SYS_futex); }

/* start_caller starts w and returns once it sleeps in the library
 * (blocked says where; checked every millisecond for up to 10 s). */
static void start_caller(caller *w, void *(*fn)(void *), int (*blocked)(pid_t))
{
    REQUIRE(pthread_create(&w->th, NULL, fn, w) == 0);
    int64_t deadline = now_ms() + 10000;
    pid_t tid;
    while (!(tid = __atomic_load_n(&w->tid, __ATOMIC_ACQUIRE)) || !blocked(tid)) {
        REQUIRE(now_ms() < deadline);
        usleep(1000);
    }
}

void test_store_daemon_killed(void)
{
    tcd d;
    start(&d, NULL);
    tc_conn *c = dial(d.socket, 0), *c2 = dial(d.socket, 0);
    tc_kv *kv;
    REQUIRE(tc_kv_open(c, NULL, &kv) == TC_OK);
    keyset s;
    uint8_t val[VAL];
    fill(val, VAL, 1);
    const void *vp = val;
    uint64_t vl = VAL;
    int code;
    CHECK_RC(tc_kv_put(kv, one_key(&s, "k/0"), &vp, &vl, 1, &code), TC_OK);
    CHECK(code == TC_OK);

    /* Both calls wait in the library for a daemon that is stopped: a tc_kv
     * sleeping on its queue, a socket call in poll. */
    tcd_freeze(&d);
    caller a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.kv = kv;
    b.c = c2;
    start_caller(&a, kv_caller, blocked_in_futex);
    start_caller(&b, socket_caller, blocked_in_poll);
    int64_t t0 = now_ms();
    forget(&d);
    tcd_kill(&d);
    pthread_join(a.th, NULL);
    pthread_join(b.th, NULL);
    CHECK_RC(a.rc, TC_ECLOSED);
    CHECK_RC(b.rc, TC_ECLOSED);
    CHECK(a.returned_ms - t0 < 3000 && b.returned_ms - t0 < 3000);

    /* Every later call says so, on the socket and through the tc_kv. */
    uint64_t off;
    CHECK_RC(tc_kv_get(kv, one_key(&s, "k/0"), &off, NULL, &code), TC_ECLOSED);
    CHECK_RC(tc_kv_put(kv, one_key(&s, "k/1"), &vp, &vl, 0, &code), TC_ECLOSED);
    tc_extent ext = {tc_pool_info(c)->segment, 0, VAL};
    CHECK_RC(tc_store_put(c, one_key(&s, "k/1"), &ext, 0, &code, NULL), TC_ECLOSED);
    CHECK_RC(tc_store_put(c2, one_key(&s, "k/1"), &ext, 0, &code, NULL), TC_ECLOSED);
    tc_kv_close(kv);
    tc_close(c);
    tc_close(c2);
    tcd_stop(&d);
}

static int blocked_in_nanosleep(pid_t tid) { return blocked_in(tid, SYS_clock_nanosleep); }

/* thread_cpu_ms is how much CPU time thread th has used. */
static int64_t thread_cpu_ms(pthread_t th)
{
    clockid_t id;
    struct timespec ts;
    if (pthread_getcpuclockid(th, &id) != 0 || clock_gettime(id, &ts) != 0)
        return -1;
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A tc_kv without a timeout whose next entry finds no room (the daemon
 * took the last ones and, held back here, has not published its head)
 * naps while it waits, using little CPU, and a daemon killed meanwhile
 * ends the call with TC_ECLOSED within its hang-up check. */
void test_store_room_killed(void)
{
    tcd d;
    start(&d, NULL);
    tc_conn *c = dial(d.socket, 0);
    tc_kv *kv;
    REQUIRE(tc_kv_open(c, NULL, &kv) == TC_OK);
    keyset s;
    int code;
    /* Two entries fill the tc_kv's ring of two as this side counts it: it
     * reads the daemon's head only when the ring looks full. */
    CHECK_RC(tc_kv_exists(kv, one_key(&s, "k/0"), &code), TC_OK);
    CHECK_RC(tc_kv_exists(kv, one_key(&s, "k/0"), &code), TC_OK);
    __atomic_store_n(&tc__test_hold_sq_head, 1, __ATOMIC_RELEASE);
    caller a;
    memset(&a, 0, sizeof a);
    a.kv = kv;
    start_caller(&a, kv_caller, blocked_in_nanosleep);
    int64_t cpu0 = thread_cpu_ms(a.th), w0 = now_ms();
    usleep(300 * 1000);
    int64_t cpu = thread_cpu_ms(a.th) - cpu0, wall = now_ms() - w0;
    CHECK(cpu >= 0 && cpu * 4 < wall);
    int64_t t0 = now_ms();
    forget(&d);
    tcd_kill(&d);
    /* Bounded: a wait that never checks would otherwise spin for good. */
    while (!__atomic_load_n(&a.returned_ms, __ATOMIC_ACQUIRE) && now_ms() - t0 < 5000)
        usleep(1000);
    __atomic_store_n(&tc__test_hold_sq_head, 0, __ATOMIC_RELEASE);
    pthread_join(a.th, NULL);
    CHECK_RC(a.rc, TC_ECLOSED);
    CHECK(a.returned_ms - t0 < 3000);
    CHECK_RC(tc_kv_exists(kv, one_key(&s, "k/0"), &code), TC_ECLOSED);
    tc_kv_close(kv);
    tc_close(c);
    tcd_stop(&d);
}

/* pins says how many pins key has, or -1 when it is not stored. */
static int pins(tc_conn *c, const char *key)
{
    tc_key_info info;
    int rc = tc_store_stat(c, key, strlen(key), &info, NULL);
    return rc == TC_OK ? (int)info.pins : -1;
}

/* A tc_kv call whose wait runs out (the daemon held stopped) leaves its
 * entry with the daemon: the tc_kv's next call takes the late answer and
 * gives back what it took, a get's pins, a pinning lookup's, a reserve's
 * blocks, and the tc_kv stays in use. A late answer still not there when
 * the next call's own timeout runs out is TC_ETIMEDOUT again. */
void test_store_kv_late(void)
{
    tcd d;
    start(&d, NULL);
    tc_conn *c = dial(d.socket, 0);
    tc_kv *kv;
    tc_kv_opts o;
    memset(&o, 0, sizeof o);
    o.timeout_ms = 200;
    REQUIRE(tc_kv_open(c, &o, &kv) == TC_OK);
    keyset s;
    uint8_t val[VAL];
    fill(val, VAL, 7);
    const void *vp[2] = {val, val};
    uint64_t vl[2] = {VAL, VAL};
    int codes[2], code;
    uint64_t offs[2];
    int ids[2] = {0, 1};
    CHECK_RC(tc_kv_put(kv, keys_of(&s, "late/", ids, 2), vp, vl, 0, codes), TC_OK);
    CHECK(all_ok(codes, 2));

    /* A get, late: its pins are given back by the next call. */
    tcd_freeze(&d);
    CHECK_RC(tc_kv_get(kv, keys_of(&s, "late/", ids, 2), offs, NULL, codes), TC_ETIMEDOUT);
    tcd_thaw(&d);
    CHECK_RC(tc_kv_exists(kv, one_key(&s, "late/0"), &code), TC_OK);
    CHECK(code == TC_OK);
    CHECK(pins(c, "late/0") == 0 && pins(c, "late/1") == 0);

    /* Late past the next call's timeout too: still given back after. */
    tcd_freeze(&d);
    CHECK_RC(tc_kv_lookup_prefix(kv, keys_of(&s, "late/", ids, 2), 1, &(size_t){0}), TC_ETIMEDOUT);
    CHECK_RC(tc_kv_exists(kv, one_key(&s, "late/0"), &code), TC_ETIMEDOUT);
    tcd_thaw(&d);
    size_t found = 0;
    CHECK_RC(tc_kv_lookup_prefix(kv, keys_of(&s, "late/", ids, 2), 0, &found), TC_OK);
    CHECK(found == 2);
    CHECK(pins(c, "late/0") == 0 && pins(c, "late/1") == 0);

    /* A reserve, late: its blocks are given back, and a put of the key
     * then finds it free (not BUSY behind the reservation). */
    tcd_freeze(&d);
    CHECK_RC(tc_kv_reserve(kv, one_key(&s, "late/2"), VAL, offs, codes), TC_ETIMEDOUT);
    tcd_thaw(&d);
    CHECK_RC(tc_kv_put(kv, one_key(&s, "late/2"), vp, vl, 0, &code), TC_OK);
    CHECK(code == TC_OK);
    CHECK(pins(c, "late/2") == 0);

    /* Closed with a late get: its answer is waited for and settled. */
    tcd_freeze(&d);
    CHECK_RC(tc_kv_get(kv, keys_of(&s, "late/", ids, 2), offs, NULL, codes), TC_ETIMEDOUT);
    tcd_thaw(&d);
    int64_t deadline = now_ms() + 10000;
    while (pins(c, "late/1") != 1 && now_ms() < deadline)
        usleep(1000); /* the daemon pins, then answers, in its own time */
    CHECK(pins(c, "late/1") == 1);
    tc_kv_close(kv);
    CHECK(pins(c, "late/0") == 0 && pins(c, "late/1") == 0);
    tc_close(c);
    tcd_stop(&d);
}

/* located waits (10 s at most) until key's home names n holders, as d's
 * daemon sees it, and returns that location (tc_free it). */
static tc_key_location *located(tc_conn *c, const char *key, size_t n)
{
    int64_t deadline = now_ms() + 10000;
    for (;;) {
        tc_key_location *loc = NULL;
        int rc = tc_cluster_locate(c, key, strlen(key), &loc, NULL);
        if (rc == TC_OK && loc->n_holders == n)
            return loc;
        if (now_ms() > deadline) {
            fprintf(stderr, "%s: rc %d, %zu holders, want %zu\n", key, rc, loc ? loc->n_holders : 0, n);
            tc_free(loc);
            return NULL;
        }
        tc_free(loc);
        usleep(10000); /* the announcements reach the home in the background */
    }
}

/* holds reports whether loc names id as a holder of size bytes. */
static int holds(const tc_key_location *loc, const char *id, uint64_t size)
{
    for (size_t i = 0; i < loc->n_holders; i++)
        if (strcmp(loc->holders[i].id, id) == 0)
            return loc->holders[i].size == size && loc->holders[i].epoch != 0 && loc->holders[i].tier == 1 &&
                   loc->holders[i].crc32c != 0;
    return 0;
}

/* test_store_cluster: two daemons of one cluster. tc_cluster_locate on
 * either names a key's shard, home and generation and the holders its home
 * knows; a put with tc_call_opts.replicas = 2 is copied to the other daemon
 * (both hold it), one with replicas beyond the limit is refused. */
void test_store_cluster(void)
{
    tcd A, B;
    char keydir[] = "/tmp/tc-ctest-key-XXXXXX";
    char key[4096];
    cluster_key(keydir, key, sizeof key);
    const char *a_args[] = {"--daemon-id", "host-a", "--peer-listen", "127.0.0.1:0", "--cluster-key-file", key,
                            "--rdma", "off", "--peer", "host-b=", NULL};
    start(&A, a_args);
    tc_conn *a = dial(A.socket, 10000);
    char peer[128];
    snprintf(peer, sizeof peer, "host-a=%s", tc_hello_info(a)->peer_addr);
    const char *b_args[] = {"--daemon-id", "host-b", "--peer-listen", "127.0.0.1:0", "--cluster-key-file", key,
                            "--rdma", "off", "--peer", peer, NULL};
    start(&B, b_args);
    tc_conn *b = dial(B.socket, 10000);

    tc_buffer *buf;
    REQUIRE(tc_buffer_create(a, 2 * VAL, &buf, NULL) == TC_OK);
    fill(buf->data, 2 * VAL, 11);
    keyset s;
    int code;
    tc_extent v = {buf->id, 0, VAL};
    CHECK_RC(tc_store_put(a, one_key(&s, "cl/one"), &v, 0, &code, NULL), TC_OK);
    CHECK(code == TC_OK);
    tc_key_location *loc = located(b, "cl/one", 1);
    REQUIRE(loc);
    CHECK(holds(loc, "host-a", VAL));
    CHECK((strcmp(loc->home, "host-a") == 0 || strcmp(loc->home, "host-b") == 0) && loc->generation != 0);
    uint32_t shard = loc->shard;
    tc_free(loc);
    /* The other daemon says the same shard. */
    REQUIRE(tc_cluster_locate(a, "cl/one", 6, &loc, NULL) == TC_OK);
    CHECK(loc->shard == shard && holds(loc, "host-a", VAL));
    tc_free(loc);

    /* Two copies asked for one put: the other daemon holds one too. */
    tc_call_opts two = {.replicas = 2};
    tc_extent v2 = {buf->id, VAL, VAL};
    CHECK_RC(tc_store_put(a, one_key(&s, "cl/two"), &v2, 0, &code, &two), TC_OK);
    CHECK(code == TC_OK);
    loc = located(b, "cl/two", 2);
    REQUIRE(loc);
    CHECK(holds(loc, "host-a", VAL) && holds(loc, "host-b", VAL));
    CHECK(loc->holders[0].crc32c == loc->holders[1].crc32c);
    tc_free(loc);
    /* Without it, the daemon's default (1): one copy. */
    loc = located(b, "cl/one", 1);
    REQUIRE(loc);
    tc_free(loc);
    tc_call_opts nine = {.replicas = 9};
    int rc = tc_store_put(a, one_key(&s, "cl/nine"), &v, 0, &code, &nine);
    CHECK(rc == TC_INVALID_ARGUMENT || (rc == TC_OK && code == TC_INVALID_ARGUMENT));

    /* A key nobody holds: its home, no holders; bad arguments. */
    REQUIRE(tc_cluster_locate(b, "cl/none", 7, &loc, NULL) == TC_OK);
    CHECK(loc->n_holders == 0 && loc->holders == NULL && *loc->home);
    tc_free(loc);
    CHECK_RC(tc_cluster_locate(b, "", 0, &loc, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_cluster_locate(b, "k", 1, NULL, NULL), TC_INVALID_ARGUMENT);

    CHECK_RC(tc_buffer_destroy(a, buf, NULL), TC_OK);
    tc_close(a);
    tc_close(b);
    stop(&B);
    stop(&A);
    unlink(key);
    rmdir(keydir);
}
