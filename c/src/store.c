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

/* keyed makes the batch call r over keys once it has checked the
 * connection, the keys (keys.h) and codes; decode copies the answer, a code
 * per key and what goes with it. */
static int keyed(tc_conn *c, tcw_req *r, const tc_keys *keys, const int *codes, tc__decode decode, void *out,
                 const tc_call_opts *o)
{
    if (!c || !codes)
        return TC_INVALID_ARGUMENT;
    r->keys_len = tc__keys_len(keys);
    if (r->keys_len == 0)
        return TC_INVALID_ARGUMENT;
    r->keys = keys;
    return tc__call(c, r, decode, out, o);
}

/* key_codes decodes a code per key. */
static int key_codes(tc_conn *c, void *codes)
{
    return tc__codes(c, codes, c->req.keys->n);
}

/* coded makes a batch call whose answer is a code per key. */
static int coded(tc_conn *c, tcw_req *r, const tc_keys *keys, int *codes, const tc_call_opts *o)
{
    return keyed(c, r, keys, codes, key_codes, codes, o);
}

int tc_store_put(tc_conn *c, const tc_keys *keys, const tc_extent *values, int durable, int *codes,
                 const tc_call_opts *o)
{
    if (!values)
        return TC_INVALID_ARGUMENT;
    tcw_req r = {.kind = TCW_STORE_PUT, .extents = values, .durable = durable != 0};
    return coded(c, &r, keys, codes, o);
}

/* Where a read's or a reservation's answer goes: a code and a number per
 * key. */
struct u64s_out {
    int *codes;
    uint64_t *u64s;
};

/* fits reports whether key i's number, of a key that succeeded, is one the
 * call allows: a read's length no more than its destination holds, a
 * reservation's offset inside the pool. */
static int fits(const tc_conn *c, size_t i)
{
    uint64_t v = c->resp.u64s[i];
    if (c->req.kind == TCW_STORE_READ)
        return v <= c->req.extents[i].length;
    return v < c->pool.size && c->req.sizes[i] <= c->pool.size - v;
}

/* key_u64s decodes a read's or a reservation's answer: a code and a number
 * (fits) per key; a key that failed has no offset (0). */
static int key_u64s(tc_conn *c, void *out)
{
    const struct u64s_out *d = out;
    size_t n = c->req.keys->n;
    int rc = tc__positional(c, c->resp.n_codes, n);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_u64s, n);
    for (size_t i = 0; rc == TC_OK && i < n; i++)
        if (c->resp.codes[i] == TC_OK && !fits(c, i))
            rc = tc__fail(c, TC_EPROTO);
    for (size_t i = 0; rc == TC_OK && i < n; i++) {
        d->codes[i] = tc__code(c->resp.codes[i]);
        d->u64s[i] = c->req.kind == TCW_STORE_RESERVE && d->codes[i] != TC_OK ? 0 : c->resp.u64s[i];
    }
    return rc;
}

int tc_store_read(tc_conn *c, const tc_keys *keys, const tc_extent *dests, uint64_t *lengths, int *codes,
                  const tc_call_opts *o)
{
    if (!dests || !lengths)
        return TC_INVALID_ARGUMENT;
    tcw_req r = {.kind = TCW_STORE_READ, .extents = dests};
    struct u64s_out d = {codes, lengths};
    return keyed(c, &r, keys, codes, key_u64s, &d, o);
}

int tc_store_remove(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o)
{
    tcw_req r = {.kind = TCW_STORE_REMOVE};
    return coded(c, &r, keys, codes, o);
}

int tc_store_pin(tc_conn *c, const tc_keys *keys, uint32_t ttl_ms, int *codes, const tc_call_opts *o)
{
    tcw_req r = {.kind = TCW_STORE_PIN, .ttl_ms = ttl_ms};
    return coded(c, &r, keys, codes, o);
}

int tc_store_unpin(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o)
{
    tcw_req r = {.kind = TCW_STORE_UNPIN};
    return coded(c, &r, keys, codes, o);
}

int tc_store_reserve(tc_conn *c, const tc_keys *keys, const uint64_t *sizes, uint64_t *offsets, int *codes,
                     const tc_call_opts *o)
{
    if (!sizes || !offsets)
        return TC_INVALID_ARGUMENT;
    tcw_req r = {.kind = TCW_STORE_RESERVE, .sizes = sizes};
    struct u64s_out d = {codes, offsets};
    return keyed(c, &r, keys, codes, key_u64s, &d, o);
}

int tc_store_commit(tc_conn *c, const tc_keys *keys, int durable, int *codes, const tc_call_opts *o)
{
    tcw_req r = {.kind = TCW_STORE_COMMIT, .durable = durable != 0};
    return coded(c, &r, keys, codes, o);
}

int tc_store_abort(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o)
{
    tcw_req r = {.kind = TCW_STORE_ABORT};
    return coded(c, &r, keys, codes, o);
}

/* key_info copies a stat's answer into out, without the key (the caller's). */
static int key_info(tc_conn *c, void *out)
{
    tc_key_info *info = out;
    *info = c->resp.info;
    info->key = NULL;
    info->key_len = 0;
    return TC_OK;
}

int tc_store_stat(tc_conn *c, const void *key, size_t len, tc_key_info *out, const tc_call_opts *o)
{
    if (!c || !out || len > TC__MAX_PACKED_KEY || (len && !key))
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_STORE_STAT, .blob = key, .blob_len = len};
    return tc__call(c, &r, key_info, out, o);
}

/* Where a list's answer goes: one block of keys at *out, *n of them, and
 * whether there are more. */
struct list_out {
    tc_key_info **out;
    size_t *n;
    int *more;
};

static int copy_list(tc_conn *c, void *out)
{
    const struct list_out *d = out;
    size_t k = c->resp.n_infos;
    int rc = tc__at_most(c, k, c->req.max); /* no more keys than asked */
    if (rc)
        return rc;
    if (k > 0) {
        const tc_key_info *src = c->resp.infos;
        size_t bytes = k * sizeof(tc_key_info);
        for (size_t i = 0; i < k; i++)
            bytes += src[i].key_len;
        tc_key_info *dst = malloc(bytes);
        if (!dst)
            return TC_ENOMEM;
        uint8_t *p = (uint8_t *)(dst + k);
        for (size_t i = 0; i < k; i++) {
            dst[i] = src[i];
            if (src[i].key_len)
                memcpy(p, src[i].key, src[i].key_len);
            dst[i].key = p;
            p += src[i].key_len;
        }
        *d->out = dst;
        *d->n = k;
    }
    *d->more = c->resp.more;
    return TC_OK;
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
    const tcw_req r = {.kind = TCW_STORE_LIST,
                       .blob = prefix,
                       .blob_len = plen,
                       .blob2 = after,
                       .blob2_len = alen,
                       .max = max};
    struct list_out d = {out, n, more};
    return tc__call(c, &r, copy_list, &d, o);
}

int tc_store_flush(tc_conn *c, uint32_t timeout_ms, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_STORE_FLUSH, .timeout_ms = timeout_ms};
    return tc__call(c, &r, NULL, NULL, o);
}
