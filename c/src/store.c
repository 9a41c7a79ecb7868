/*
 * store.c - the KV block store's calls on the control socket: put, read,
 * remove, pin, unpin, reserve, commit, abort, stat, list, flush.
 *
 * Each batch call checks its key list (keys.h) before it takes the
 * connection; the codec packs it straight into the frame. The answer must
 * have exactly one code (and one length or offset) per key, and what it
 * says about memory (a read's length, a reservation's offset) must fit what
 * the call named, or the call fails with TC_EPROTO and breaks the
 * connection.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "keys.h"

static const tc_trip plain = {.send_fd = -1};

static int trip(tc_conn *c, uint32_t wait_ms)
{
    tc_trip t = plain;
    t.extra_ms = wait_ms;
    return tc__round_trip(c, &t);
}

/* begin checks a batch call's connection, keys and codes, takes the
 * connection and sets the request's keys. */
static int begin(tc_conn *c, int kind, const tc_keys *keys, const int *codes, const tc_call_opts *o)
{
    if (!c || !codes)
        return TC_INVALID_ARGUMENT;
    size_t len = tc__keys_len(keys);
    if (len == 0)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, kind, o);
    if (rc)
        return rc;
    c->req.keys = keys;
    c->req.keys_len = len;
    return TC_OK;
}

/* answer makes the round trip and checks and copies the answer's codes,
 * one per key. */
static int answer(tc_conn *c, uint32_t wait_ms, int *codes)
{
    size_t n = c->req.keys->n;
    int rc = trip(c, wait_ms);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_codes, n);
    if (rc == TC_OK)
        for (size_t i = 0; i < n; i++)
            codes[i] = c->resp.codes[i];
    return rc;
}

int tc_store_put(tc_conn *c, const tc_keys *keys, const tc_extent *values, int durable, int *codes,
                 const tc_call_opts *o)
{
    if (!values)
        return TC_INVALID_ARGUMENT;
    int rc = begin(c, TCW_STORE_PUT, keys, codes, o);
    if (rc)
        return rc;
    c->req.extents = values;
    c->req.durable = durable != 0;
    return tc__finish(c, answer(c, 0, codes));
}

/* trip_u64s makes the call and checks that its answer holds a code and a
 * number for each of the n keys. */
static int trip_u64s(tc_conn *c, size_t n)
{
    int rc = trip(c, 0);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_codes, n);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_u64s, n);
    return rc;
}

int tc_store_read(tc_conn *c, const tc_keys *keys, const tc_extent *dests, uint64_t *lengths, int *codes,
                  const tc_call_opts *o)
{
    if (!dests || !lengths)
        return TC_INVALID_ARGUMENT;
    int rc = begin(c, TCW_STORE_READ, keys, codes, o);
    if (rc)
        return rc;
    c->req.extents = dests;
    size_t n = keys->n;
    rc = trip_u64s(c, n);
    for (size_t i = 0; rc == TC_OK && i < n; i++)
        if (c->resp.codes[i] == TC_OK && c->resp.u64s[i] > dests[i].length)
            rc = tc__fail(c, TC_EPROTO); /* more copied than the destination holds */
    if (rc == TC_OK)
        for (size_t i = 0; i < n; i++) {
            codes[i] = c->resp.codes[i];
            lengths[i] = c->resp.u64s[i];
        }
    return tc__finish(c, rc);
}

int tc_store_remove(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o)
{
    int rc = begin(c, TCW_STORE_REMOVE, keys, codes, o);
    if (rc)
        return rc;
    return tc__finish(c, answer(c, 0, codes));
}

int tc_store_pin(tc_conn *c, const tc_keys *keys, uint32_t ttl_ms, int *codes, const tc_call_opts *o)
{
    int rc = begin(c, TCW_STORE_PIN, keys, codes, o);
    if (rc)
        return rc;
    c->req.ttl_ms = ttl_ms;
    return tc__finish(c, answer(c, 0, codes));
}

int tc_store_unpin(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o)
{
    int rc = begin(c, TCW_STORE_UNPIN, keys, codes, o);
    if (rc)
        return rc;
    return tc__finish(c, answer(c, 0, codes));
}

int tc_store_reserve(tc_conn *c, const tc_keys *keys, const uint64_t *sizes, uint64_t *offsets, int *codes,
                     const tc_call_opts *o)
{
    if (!sizes || !offsets)
        return TC_INVALID_ARGUMENT;
    int rc = begin(c, TCW_STORE_RESERVE, keys, codes, o);
    if (rc)
        return rc;
    c->req.sizes = sizes;
    size_t n = keys->n;
    rc = trip_u64s(c, n);
    for (size_t i = 0; rc == TC_OK && i < n; i++) {
        uint64_t off = c->resp.u64s[i];
        if (c->resp.codes[i] == TC_OK && (off >= c->pool.size || sizes[i] > c->pool.size - off))
            rc = tc__fail(c, TC_EPROTO); /* a reservation outside the pool */
    }
    if (rc == TC_OK)
        for (size_t i = 0; i < n; i++) {
            codes[i] = c->resp.codes[i];
            offsets[i] = codes[i] == TC_OK ? c->resp.u64s[i] : 0;
        }
    return tc__finish(c, rc);
}

int tc_store_commit(tc_conn *c, const tc_keys *keys, int durable, int *codes, const tc_call_opts *o)
{
    int rc = begin(c, TCW_STORE_COMMIT, keys, codes, o);
    if (rc)
        return rc;
    c->req.durable = durable != 0;
    return tc__finish(c, answer(c, 0, codes));
}

int tc_store_abort(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o)
{
    int rc = begin(c, TCW_STORE_ABORT, keys, codes, o);
    if (rc)
        return rc;
    return tc__finish(c, answer(c, 0, codes));
}

int tc_store_stat(tc_conn *c, const void *key, size_t len, tc_key_info *out, const tc_call_opts *o)
{
    if (!c || !out || len > TC__MAX_PACKED_KEY || (len && !key))
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_STORE_STAT, o);
    if (rc)
        return rc;
    c->req.blob = key;
    c->req.blob_len = len;
    rc = trip(c, 0);
    if (rc == TC_OK) {
        *out = c->resp.info;
        out->key = NULL;
        out->key_len = 0;
    }
    return tc__finish(c, rc);
}

int tc_store_list(tc_conn *c, const void *prefix, size_t plen, const void *after, size_t alen, uint32_t max,
                  tc_key_info **out, size_t *n, int *more, const tc_call_opts *o)
{
    if (!c || !out || !n || !more || plen > TC__MAX_PACKED_KEY || alen > TC__MAX_PACKED_KEY || (plen && !prefix) ||
        (alen && !after))
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    *n = 0;
    *more = 0;
    int rc = tc__start(c, TCW_STORE_LIST, o);
    if (rc)
        return rc;
    c->req.blob = prefix;
    c->req.blob_len = plen;
    c->req.blob2 = after;
    c->req.blob2_len = alen;
    c->req.max = max;
    rc = trip(c, 0);
    size_t k = c->resp.n_infos;
    if (rc == TC_OK && max > 0 && k > max)
        rc = tc__fail(c, TC_EPROTO); /* more keys than asked */
    if (rc || k == 0) {
        if (rc == TC_OK)
            *more = c->resp.more;
        return tc__finish(c, rc);
    }
    const tc_key_info *src = c->resp.infos;
    size_t bytes = k * sizeof(tc_key_info);
    for (size_t i = 0; i < k; i++)
        bytes += src[i].key_len;
    tc_key_info *dst = malloc(bytes);
    if (!dst)
        return tc__finish(c, TC_ENOMEM);
    uint8_t *p = (uint8_t *)(dst + k);
    for (size_t i = 0; i < k; i++) {
        dst[i] = src[i];
        if (src[i].key_len)
            memcpy(p, src[i].key, src[i].key_len);
        dst[i].key = p;
        p += src[i].key_len;
    }
    *out = dst;
    *n = k;
    *more = c->resp.more;
    return tc__finish(c, TC_OK);
}

int tc_store_flush(tc_conn *c, uint32_t timeout_ms, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_STORE_FLUSH, o);
    if (rc)
        return rc;
    c->req.timeout_ms = timeout_ms;
    return tc__finish(c, trip(c, timeout_ms));
}
