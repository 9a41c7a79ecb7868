/*
 * qstore.c - the KV block store on a queue: results regions, the store
 * ops staged on a tc_queue (queue/doc.go, "Store calls"), the check of
 * their answers, and tc_kv, which makes them synchronously on a queue of
 * its own and copies values in and out of process memory.
 *
 * A store op's keys go packed into the queue's data area (queue.c stages
 * them); its per-key results come back in a region of a client buffer, 16
 * bytes per key: u8 code, three zero bytes, u32 length, u64 offset. Before
 * staging, every record's code is set to the unwritten marker (0xff); the
 * daemon writes every record before it posts the completion and never
 * reads them. tc_results_check refuses an answer that is not whole.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "keys.h"
#ifdef TC_TEST_HOOKS
#include "testhooks.h"
#endif

/* The store ops (queue/entry.go). */
#define OP_GET 16
#define OP_RESERVE 17
#define OP_COMMIT 18
#define OP_EXISTS 19
#define OP_LOOKUP_PREFIX 20
#define OP_UNPIN 21
#define FLAG_DURABLE 2
#define FLAG_PIN 4

#define RESULT_SIZE 16
#define UNWRITTEN 0xff

#define KV_DEFAULT_KEYS 1024u
/* The data area of a tc_kv's queue holds three of its longest key lists:
 * one staged while the last one's bytes may not be freed yet (the daemon
 * publishes its head after it took them), with room for the wrap. */
#define KV_LISTS 3u
#define KV_MAX_DATA (4u << 20) /* the daemon's default max_queue_data */

struct tc_results {
    tc_conn *c;
    tc_buffer *own; /* the buffer tc_results_create made, else NULL */
    tc_segment_id seg;
    uint64_t off;
    uint8_t *mem;
    uint32_t cap;
    /* The call staged into it last. */
    uint32_t n;
    uint8_t op;
    uint64_t size;
    struct tc_results *next; /* on c->results, under c->qmu */
};

struct tc_kv {
    tc_conn *c;
    tc_queue *q;
    tc_results *r;
    uint32_t max_keys;
    size_t max_list; /* the longest key list a call may have */
    int64_t timeout_ns; /* -1: none */
    int64_t due;        /* the call's deadline (tc__now_ns); 0: none */
    struct tc_kv *next; /* on c->kvs, under c->qmu */

    /* mu serializes the calls; it guards the fields below. */
    pthread_mutex_t mu;
    int broken;
    uint64_t seq;
    /* A call whose wait ran out of the timeout leaves its entry with the
     * daemon: late is its user_data (0: none), late_op and late_flags its
     * op, and late_keys (max_list bytes, made at the first timeout) its
     * keys, packed, late_len bytes. The next call takes its answer first
     * and gives back what it pinned or reserved (settle). */
    uint64_t late;
    uint8_t late_op, late_flags;
    uint8_t *late_keys;
    size_t late_len, late_n;
    /* Scratch of max_keys entries, and a key list of max_list bytes. */
    int *codes;
    uint64_t *offs, *lens;
    size_t *pos;
    tc__span *spans;
    uint8_t *sub;
};

/* ---- results regions ------------------------------------------------------- */

static void link_results(tc_results *r)
{
    TC__LIST_PUSH(r->c, results, r);
}

static void unlink_results(tc_results *r)
{
    pthread_mutex_lock(&r->c->qmu);
    for (tc_results **p = &r->c->results; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    pthread_mutex_unlock(&r->c->qmu);
}

static tc_results *new_results(tc_conn *c, const tc_buffer *b, uint64_t off, uint32_t max_keys)
{
    tc_results *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->c = c;
    r->seg = b->id;
    r->off = off;
    r->mem = (uint8_t *)b->data + off;
    r->cap = max_keys;
    return r;
}

int tc_results_create(tc_conn *c, uint32_t max_keys, tc_results **out)
{
    if (!out)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    if (!c || max_keys == 0 || max_keys > TC_MAX_KEYS)
        return TC_INVALID_ARGUMENT;
    tc_buffer *b;
    int rc = tc_buffer_create(c, (uint64_t)max_keys * RESULT_SIZE, &b, NULL);
    if (rc)
        return rc;
    tc_results *r = new_results(c, b, 0, max_keys);
    if (!r) {
        tc_buffer_destroy(c, b, NULL);
        return TC_ENOMEM;
    }
    r->own = b;
    link_results(r);
    *out = r;
    return TC_OK;
}

int tc_results_in(tc_conn *c, const tc_buffer *buf, uint64_t offset, uint32_t max_keys, tc_results **out)
{
    if (!out)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    uint64_t size = (uint64_t)max_keys * RESULT_SIZE;
    if (!c || !buf || max_keys == 0 || max_keys > TC_MAX_KEYS || offset % 8 || offset > buf->size ||
        size > buf->size - offset || !tc__owns_buffer(c, buf))
        return TC_INVALID_ARGUMENT;
    tc_results *r = new_results(c, buf, offset, max_keys);
    if (!r)
        return TC_ENOMEM;
    link_results(r);
    *out = r;
    return TC_OK;
}

void tc_results_destroy(tc_results *r)
{
    if (!r)
        return;
    unlink_results(r);
    if (r->own)
        tc_buffer_destroy(r->c, r->own, NULL);
    free(r);
}

/* ---- staging ------------------------------------------------------------------ */

/* store_call checks and stages one store op; r is NULL for a lookup_prefix. */
static int store_call(tc_queue *q, uint8_t op, uint8_t flags, const tc_keys *keys, uint64_t length, tc_results *r,
                      uint64_t user_data, size_t *accepted)
{
    if (accepted)
        *accepted = 0;
    if (!q || !accepted)
        return TC_INVALID_ARGUMENT;
    size_t len = tc__keys_len(keys);
    if (len == 0 || len > tc__queue_data_size(q))
        return TC_INVALID_ARGUMENT;
    tc__store_entry e = {.op = op, .flags = flags, .length = length, .user_data = user_data};
    if (op != OP_LOOKUP_PREFIX) {
        if (!r || r->c != tc__queue_conn(q) || keys->n > r->cap)
            return TC_INVALID_ARGUMENT;
        /* Every record starts unwritten: one the daemon leaves so is a
         * short answer. */
        for (size_t i = 0; i < keys->n; i++)
            r->mem[i * RESULT_SIZE] = UNWRITTEN;
        r->n = (uint32_t)keys->n;
        r->op = op;
        r->size = length;
        e.local = r->seg;
        e.local_off = r->off;
    }
    return tc__queue_store(q, &e, keys, len, accepted);
}

int tc_queue_store_get(tc_queue *q, const tc_keys *keys, tc_results *r, uint64_t user_data, size_t *accepted)
{
    return store_call(q, OP_GET, 0, keys, 0, r, user_data, accepted);
}

int tc_queue_store_reserve(tc_queue *q, const tc_keys *keys, uint64_t size, tc_results *r, uint64_t user_data,
                           size_t *accepted)
{
    return store_call(q, OP_RESERVE, 0, keys, size, r, user_data, accepted);
}

int tc_queue_store_commit(tc_queue *q, const tc_keys *keys, int durable, tc_results *r, uint64_t user_data,
                          size_t *accepted)
{
    return store_call(q, OP_COMMIT, durable ? FLAG_DURABLE : 0, keys, 0, r, user_data, accepted);
}

int tc_queue_store_exists(tc_queue *q, const tc_keys *keys, tc_results *r, uint64_t user_data, size_t *accepted)
{
    return store_call(q, OP_EXISTS, 0, keys, 0, r, user_data, accepted);
}

int tc_queue_store_unpin(tc_queue *q, const tc_keys *keys, tc_results *r, uint64_t user_data, size_t *accepted)
{
    return store_call(q, OP_UNPIN, 0, keys, 0, r, user_data, accepted);
}

int tc_queue_store_lookup_prefix(tc_queue *q, const tc_keys *keys, int pin, uint64_t user_data, size_t *accepted)
{
    return store_call(q, OP_LOOKUP_PREFIX, pin ? FLAG_PIN : 0, keys, 0, NULL, user_data, accepted);
}

/* ---- checking answers ---------------------------------------------------------- */

/* broken fails the whole connection over an answer that did not verify:
 * what the daemon did for the call (pins, reservations) is unknown, and
 * closing the connection releases it. */
static int broken(tc_conn *c)
{
    tc_shutdown(c);
    return TC_EPROTO;
}

#ifdef TC_TEST_HOOKS
void (*tc__test_results_read)(uint8_t *region, uint32_t n);
#endif

int tc_results_check(tc_results *r, const tc_cqe *cqe, int *codes, uint64_t *offsets, uint64_t *lengths)
{
    if (!r || !cqe || !codes || r->n == 0)
        return TC_INVALID_ARGUMENT;
    if (cqe->code < TC_OK || cqe->code > TC_INTERNAL)
        return broken(r->c); /* a code the protocol does not name (TC_EPROTO from the reap) */
    /* The region is memory the daemon writes: each record is copied out
     * once and what is returned is that copy, checked, never a second read
     * of the region (which could say something else by then). */
    int loc = r->op == OP_GET || r->op == OP_RESERVE;
    int whole = cqe->code == TC_OK || cqe->code == TC_FAILED_PRECONDITION;
    uint64_t pool = tc_pool_info(r->c)->size, ok = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        uint8_t rec[RESULT_SIZE];
        memcpy(rec, r->mem + (size_t)i * RESULT_SIZE, sizeof rec);
        uint8_t code = rec[0];
        uint64_t len = tc__get32(rec + 4), off = tc__get64(rec + 8);
        if ((rec[1] | rec[2] | rec[3]) != 0 || code > TC_INTERNAL) {
            if (!whole)
                break; /* not every record written: codes say nothing */
            return broken(r->c); /* never written (or not by the daemon) */
        }
        codes[i] = code;
        if (!whole || code != TC_OK || !loc) {
            len = off = 0;
        } else if (off >= pool || len > pool - off || (r->op == OP_RESERVE && len != r->size)) {
            return broken(r->c);
        }
        ok += whole && code == TC_OK;
        if (offsets)
            offsets[i] = off;
        if (lengths)
            lengths[i] = len;
    }
#ifdef TC_TEST_HOOKS
    if (tc__test_results_read)
        tc__test_results_read(r->mem, r->n);
#endif
    if (!whole) {
        /* The call failed as a whole, or its entry was refused. When the
         * daemon wrote every record anyway (an all-or-nothing unpin refused
         * over an absent key), codes say which keys refused it. */
        return cqe->code;
    }
    if (ok != cqe->transferred)
        return broken(r->c);
    return cqe->code;
}

int tc_prefix_check(tc_queue *q, const tc_cqe *cqe, size_t n, size_t *found)
{
    if (found)
        *found = 0;
    if (!q || !cqe || !found)
        return TC_INVALID_ARGUMENT;
    if (cqe->code < TC_OK || cqe->code > TC_INTERNAL)
        return broken(tc__queue_conn(q));
    if (cqe->code != TC_OK)
        return cqe->code;
    if (cqe->transferred > n)
        return broken(tc__queue_conn(q));
    *found = (size_t)cqe->transferred;
    return TC_OK;
}

/* ---- tc_kv ------------------------------------------------------------------------ */

static void free_kv(tc_kv *kv)
{
    pthread_mutex_destroy(&kv->mu);
    free(kv->codes);
    free(kv->offs);
    free(kv->lens);
    free(kv->pos);
    free(kv->spans);
    free(kv->sub);
    free(kv->late_keys);
    free(kv);
}

int tc_kv_open(tc_conn *c, const tc_kv_opts *opts, tc_kv **out)
{
    static const tc_kv_opts none;
    if (!out)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    if (!opts)
        opts = &none;
    uint32_t max = opts->max_keys ? opts->max_keys : KV_DEFAULT_KEYS;
    if (!c || max > TC_MAX_KEYS || (opts->flags & ~(uint32_t)TC_QUEUE_NOSPIN))
        return TC_INVALID_ARGUMENT;
    size_t list = (size_t)max * (TC__KEY_HEADER + TC_MAX_KEY);
    size_t data = (KV_LISTS * list + 4095) & ~(size_t)4095;
    if (data > KV_MAX_DATA) {
        data = KV_MAX_DATA;
        list = data / KV_LISTS;
    }
    tc_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return TC_ENOMEM;
    int err = pthread_mutex_init(&kv->mu, NULL);
    if (err) {
        free(kv);
        errno = err;
        return TC_ESYS;
    }
    kv->c = c;
    kv->max_keys = max;
    kv->max_list = list;
    kv->timeout_ns = opts->timeout_ms ? (int64_t)opts->timeout_ms * 1000000LL : -1;
    kv->codes = calloc(max, sizeof *kv->codes);
    kv->offs = calloc(max, sizeof *kv->offs);
    kv->lens = calloc(max, sizeof *kv->lens);
    kv->pos = calloc(max, sizeof *kv->pos);
    kv->spans = calloc(max, sizeof *kv->spans);
    kv->sub = malloc(list);
    if (!kv->codes || !kv->offs || !kv->lens || !kv->pos || !kv->spans || !kv->sub) {
        free_kv(kv);
        return TC_ENOMEM;
    }
    tc_queue_opts qo;
    memset(&qo, 0, sizeof qo);
    qo.data_size = (uint32_t)data;
    qo.spin_us = opts->spin_us;
    qo.flags = opts->flags;
    int rc = tc_queue_open(c, 2, &qo, &kv->q);
    if (rc == TC_OK && (rc = tc_results_create(c, max, &kv->r))) {
        tc_queue_close(kv->q);
        kv->q = NULL;
    }
    if (rc) {
        free_kv(kv);
        return rc;
    }
    TC__LIST_PUSH(c, kvs, kv);
    *out = kv;
    return TC_OK;
}

static int settle(tc_kv *kv, int64_t wait);

void tc_kv_close(tc_kv *kv)
{
    if (!kv)
        return;
    tc_conn *c = kv->c;
    pthread_mutex_lock(&c->qmu);
    for (tc_kv **p = &c->kvs; *p; p = &(*p)->next)
        if (*p == kv) {
            *p = kv->next;
            break;
        }
    pthread_mutex_unlock(&c->qmu);
    pthread_mutex_lock(&kv->mu);
    if (kv->late && !kv->broken) {
        /* The late answer is waited for and settled within the timeout
         * (1 s without one); one not there by then leaves its pins the
         * connection's until it closes. */
        kv->due = tc__now_ns() + (kv->timeout_ns >= 0 ? kv->timeout_ns : 1000000000LL);
        (void)settle(kv, -1);
    }
    pthread_mutex_unlock(&kv->mu);
    tc_queue_close(kv->q);
    tc_results_destroy(kv->r);
    free_kv(kv);
}

void tc__store_release(tc_conn *c)
{
    pthread_mutex_lock(&c->qmu);
    tc_kv *kv = c->kvs;
    tc_results *r = c->results;
    c->kvs = NULL;
    c->results = NULL;
    pthread_mutex_unlock(&c->qmu);
    while (kv) {
        tc_kv *next = kv->next;
        free_kv(kv); /* its queue and buffer go with the connection's */
        kv = next;
    }
    while (r) {
        tc_results *next = r->next;
        free(r);
        r = next;
    }
}

/* kv_begin checks a call's keys against kv and takes it; the call's
 * ops share one deadline, from now. */
static int kv_begin(tc_kv *kv, const tc_keys *keys, const void *out)
{
    if (!kv || !out)
        return TC_INVALID_ARGUMENT;
    size_t len = tc__keys_len(keys);
    if (len == 0 || keys->n > kv->max_keys || len > kv->max_list)
        return TC_INVALID_ARGUMENT;
    pthread_mutex_lock(&kv->mu);
    if (kv->broken) {
        pthread_mutex_unlock(&kv->mu);
        return TC_ECLOSED;
    }
    kv->due = kv->timeout_ns >= 0 ? tc__now_ns() + kv->timeout_ns : 0;
    return TC_OK;
}

static int kv_end(tc_kv *kv, int rc)
{
    if (rc == TC_EPROTO || rc == TC_ECLOSED)
        kv->broken = 1;
    pthread_mutex_unlock(&kv->mu);
    return rc;
}

/* pack writes the keys of keys whose position pos lists (k of them, in
 * order; pos NULL: all of them) into dst, packed, as *out. dst holds
 * max_list bytes, and keys fit it (kv_begin). */
static void pack(const tc_keys *keys, const size_t *pos, size_t k, uint8_t *dst, tc_keys *out)
{
    tc__key_iter it;
    tc__keys_begin(&it, keys);
    const uint8_t *d;
    size_t len, off = 0, j = 0;
    for (size_t i = 0; j < k && tc__keys_next(&it, &d, &len); i++) {
        if (pos && pos[j] != i)
            continue;
        dst[off] = (uint8_t)len;
        dst[off + 1] = (uint8_t)(len >> 8);
        if (len)
            memcpy(dst + off + TC__KEY_HEADER, d, len);
        off += TC__KEY_HEADER + len;
        j++;
    }
    memset(out, 0, sizeof *out);
    out->n = k;
    out->packed = dst;
    out->packed_len = off;
}

/* subset packs the keys whose position kv->pos lists (k of them) into
 * kv->sub, as *out. */
static void subset(tc_kv *kv, const tc_keys *keys, size_t k, tc_keys *out)
{
    pack(keys, kv->pos, k, kv->sub, out);
}

/* left is the time to kv->due, for a wait: -1 none, at least 1 ns, or 0
 * once it has passed. */
static int64_t left(const tc_kv *kv)
{
    if (!kv->due)
        return -1;
    int64_t l = kv->due - tc__now_ns();
    return l > 0 ? l : 0;
}

static int kv_run(tc_kv *kv, uint8_t op, uint8_t flags, const tc_keys *keys, uint64_t length, int *codes,
                  uint64_t *offs, uint64_t *lens);

/* settle takes the answer of kv's late call, waiting at most wait ns (-1:
 * until kv->due), and gives back what that call took and its caller never
 * learnt of: a get's pins, a pinning lookup's, a reserve's blocks. An
 * answer not here by then leaves kv late: TC_ETIMEDOUT. (kv->mu held.) */
static int settle(tc_kv *kv, int64_t wait)
{
    tc_cqe cqe;
    size_t n = 0;
    int rc = tc_queue_reap(kv->q, &cqe, 1, 1, wait < 0 ? left(kv) : wait, &n);
    if (rc == TC_DEADLINE_EXCEEDED)
        return TC_ETIMEDOUT;
    if (rc)
        return rc;
    if (n != 1 || cqe.user_data != kv->late)
        return broken(kv->c); /* a completion of nothing this tc_kv submitted */
    kv->late = 0;
    tc_keys keys = {.n = kv->late_n, .packed = kv->late_keys, .packed_len = kv->late_len};
    size_t k = 0;
    if (kv->late_op == OP_LOOKUP_PREFIX) {
        if (!(kv->late_flags & FLAG_PIN))
            return TC_OK;
        rc = tc_prefix_check(kv->q, &cqe, keys.n, &k);
        if (rc == TC_EPROTO)
            return rc;
        for (size_t i = 0; i < k; i++)
            kv->pos[i] = i; /* the leading run found is pinned */
    } else if (kv->late_op == OP_GET || kv->late_op == OP_RESERVE) {
        rc = tc_results_check(kv->r, &cqe, kv->codes, NULL, NULL);
        if (rc == TC_EPROTO)
            return rc;
        if (rc == TC_OK || rc == TC_FAILED_PRECONDITION)
            for (size_t i = 0; i < keys.n; i++)
                if (kv->codes[i] == TC_OK)
                    kv->pos[k++] = i;
    }
    if (k == 0)
        return TC_OK;
    tc_keys sub;
    subset(kv, &keys, k, &sub);
    if (kv->late_op == OP_RESERVE)
        return tc_store_abort(kv->c, &sub, kv->codes, NULL) == TC_ECLOSED ? TC_ECLOSED : TC_OK;
    rc = kv_run(kv, OP_UNPIN, 0, &sub, 0, kv->codes, NULL, NULL);
    return rc == TC_FAILED_PRECONDITION ? TC_OK : rc;
}

/* late keeps what settle needs of the call whose wait for answer ud ran
 * out: its entry is the daemon's, and its answer will land in the region. */
static int late(tc_kv *kv, uint64_t ud, uint8_t op, uint8_t flags, const tc_keys *keys)
{
    if (!kv->late_keys && !(kv->late_keys = malloc(kv->max_list)))
        return TC_ECLOSED; /* what it pinned cannot be given back: the connection's until it closes */
    tc_keys packed;
    pack(keys, NULL, keys->n, kv->late_keys, &packed);
    kv->late = ud;
    kv->late_op = op;
    kv->late_flags = flags;
    kv->late_n = keys->n;
    kv->late_len = packed.packed_len;
    return TC_ETIMEDOUT;
}

/* kv_call makes one store op on kv's queue and waits for its completion
 * until kv->due, first settling a late call's answer (kv->mu held). */
static int kv_call(tc_kv *kv, uint8_t op, uint8_t flags, const tc_keys *keys, uint64_t length, tc_cqe *cqe)
{
    if (kv->late) {
        int rc = settle(kv, -1);
        if (rc)
            return rc;
    }
    uint64_t ud = ++kv->seq;
    size_t accepted = 0;
    for (;;) {
        int rc = store_call(kv->q, op, flags, keys, length, op == OP_LOOKUP_PREFIX ? NULL : kv->r, ud, &accepted);
        if (rc)
            return rc;
        if (accepted)
            break;
        /* Nothing else is in flight on this queue: the daemon has taken the
         * last entry but not yet published its head, which frees its keys'
         * bytes. The wait ends too when the daemon went away. */
        rc = tc__queue_wait_room(kv->q, kv->due);
        if (rc == TC_DEADLINE_EXCEEDED)
            return TC_ETIMEDOUT;
        if (rc)
            return rc;
    }
    size_t n = 0;
    int rc = tc_queue_reap(kv->q, cqe, 1, 1, left(kv), &n);
    if (rc == TC_DEADLINE_EXCEEDED)
        return late(kv, ud, op, flags, keys);
    if (rc)
        return rc;
    if (n != 1 || cqe->user_data != ud)
        return broken(kv->c); /* a completion of nothing this tc_kv submitted */
    return TC_OK;
}

/* kv_run makes one op and checks its results into codes, offs, lens. */
static int kv_run(tc_kv *kv, uint8_t op, uint8_t flags, const tc_keys *keys, uint64_t length, int *codes,
                  uint64_t *offs, uint64_t *lens)
{
    tc_cqe cqe;
    int rc = kv_call(kv, op, flags, keys, length, &cqe);
    if (rc == TC_OK)
        rc = tc_results_check(kv->r, &cqe, codes, offs, lens);
    return rc;
}

int tc_kv_get(tc_kv *kv, const tc_keys *keys, uint64_t *offsets, uint64_t *lengths, int *codes)
{
    int rc = kv_begin(kv, keys, codes);
    if (rc)
        return rc;
    return kv_end(kv, kv_run(kv, OP_GET, 0, keys, 0, codes, offsets, lengths));
}

int tc_kv_reserve(tc_kv *kv, const tc_keys *keys, uint64_t size, uint64_t *offsets, int *codes)
{
    int rc = kv_begin(kv, keys, codes);
    if (rc)
        return rc;
    return kv_end(kv, kv_run(kv, OP_RESERVE, 0, keys, size, codes, offsets, NULL));
}

int tc_kv_commit(tc_kv *kv, const tc_keys *keys, int durable, int *codes)
{
    int rc = kv_begin(kv, keys, codes);
    if (rc)
        return rc;
    return kv_end(kv, kv_run(kv, OP_COMMIT, durable ? FLAG_DURABLE : 0, keys, 0, codes, NULL, NULL));
}

int tc_kv_exists(tc_kv *kv, const tc_keys *keys, int *codes)
{
    int rc = kv_begin(kv, keys, codes);
    if (rc)
        return rc;
    return kv_end(kv, kv_run(kv, OP_EXISTS, 0, keys, 0, codes, NULL, NULL));
}

int tc_kv_unpin(tc_kv *kv, const tc_keys *keys, int *codes)
{
    int rc = kv_begin(kv, keys, codes);
    if (rc)
        return rc;
    return kv_end(kv, kv_run(kv, OP_UNPIN, 0, keys, 0, codes, NULL, NULL));
}

int tc_kv_lookup_prefix(tc_kv *kv, const tc_keys *keys, int pin, size_t *found)
{
    if (found)
        *found = 0;
    int rc = kv_begin(kv, keys, found);
    if (rc)
        return rc;
    tc_cqe cqe;
    rc = kv_call(kv, OP_LOOKUP_PREFIX, pin ? FLAG_PIN : 0, keys, 0, &cqe);
    if (rc == TC_OK)
        rc = tc_prefix_check(kv->q, &cqe, keys->n, found);
    return kv_end(kv, rc);
}

int tc_kv_put(tc_kv *kv, const tc_keys *keys, const void *const *values, const uint64_t *lengths, int durable,
              int *codes)
{
    if (!values || !lengths)
        return TC_INVALID_ARGUMENT;
    int rc = kv_begin(kv, keys, codes);
    if (rc)
        return rc;
    size_t n = keys->n;
    int same = 1;
    for (size_t i = 0; i < n; i++) {
        if (lengths[i] && !values[i])
            return kv_end(kv, TC_INVALID_ARGUMENT);
        same &= lengths[i] == lengths[0];
    }
    /* One reserve on the queue when every value has the same size (the
     * queue's reserve has one size per call), else one on the socket, with
     * a size per key: the reservations are the connection's either way. */
    if (same)
        rc = kv_run(kv, OP_RESERVE, 0, keys, lengths[0], codes, kv->offs, NULL);
    else
        rc = tc_store_reserve(kv->c, keys, lengths, kv->offs, codes, NULL);
    if (rc)
        return kv_end(kv, rc);
    uint8_t *base = tc_pool_info(kv->c)->base;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (codes[i] != TC_OK)
            continue;
        /* memcpy: reserved blocks are often ones just freed, still in the
         * cache (copy.c says why a read streams instead). */
        memcpy(base + kv->offs[i], values[i], (size_t)lengths[i]);
        kv->pos[k++] = i;
    }
    if (k == 0)
        return kv_end(kv, TC_OK);
    tc_keys sub;
    subset(kv, keys, k, &sub);
    rc = kv_run(kv, OP_COMMIT, durable ? FLAG_DURABLE : 0, &sub, 0, kv->codes, NULL, NULL);
    if (rc == TC_OK) {
        for (size_t j = 0; j < k; j++)
            codes[kv->pos[j]] = kv->codes[j];
    } else {
        /* The commit as a whole failed: give the reservations back rather
         * than leave them held until the connection closes. Keys the
         * daemon did commit after all answer FAILED_PRECONDITION and stay;
         * the call's own error is what the caller gets either way. */
        (void)tc_store_abort(kv->c, &sub, kv->codes, NULL);
    }
    return kv_end(kv, rc);
}

int tc_kv_read(tc_kv *kv, const tc_keys *keys, void *const *outs, const uint64_t *capacities, uint64_t *lengths,
               int *codes)
{
    if (!outs || !capacities)
        return TC_INVALID_ARGUMENT;
    int rc = kv_begin(kv, keys, codes);
    if (rc)
        return rc;
    size_t n = keys->n;
    for (size_t i = 0; i < n; i++)
        if (capacities[i] && !outs[i])
            return kv_end(kv, TC_INVALID_ARGUMENT);
    rc = kv_run(kv, OP_GET, 0, keys, 0, codes, kv->offs, kv->lens);
    if (rc)
        return kv_end(kv, rc);
    const uint8_t *base = tc_pool_info(kv->c)->base;
    size_t k = 0, m = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (lengths)
            lengths[i] = kv->lens[i];
        if (codes[i] != TC_OK)
            continue;
        kv->pos[k++] = i; /* pinned: unpinned below, copied or not */
        if (kv->lens[i] > capacities[i]) {
            codes[i] = TC_INVALID_ARGUMENT;
            continue;
        }
        kv->spans[m++] = (tc__span){outs[i], base + kv->offs[i], (size_t)kv->lens[i]};
        total += kv->lens[i];
    }
    tc__copy_values(kv->spans, m, total);
    if (k == 0)
        return kv_end(kv, TC_OK);
    tc_keys sub;
    subset(kv, keys, k, &sub);
    return kv_end(kv, kv_run(kv, OP_UNPIN, 0, &sub, 0, kv->codes, NULL, NULL));
}
