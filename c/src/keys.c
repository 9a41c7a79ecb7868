/*
 * keys.c - store key lists (keys.h).
 */
#include <string.h>

#include "keys.h"

static size_t get16(const uint8_t *p) { return (size_t)p[0] | (size_t)p[1] << 8; }

size_t tc__keys_len(const tc_keys *k)
{
    if (!k || k->n == 0 || k->n > TC_MAX_KEYS)
        return 0;
    if (k->keys) {
        size_t total = 0;
        for (size_t i = 0; i < k->n; i++) {
            const tc_key *e = &k->keys[i];
            if (e->len > TC__MAX_PACKED_KEY || (e->len && !e->data))
                return 0;
            total += TC__KEY_HEADER + e->len;
        }
        return total;
    }
    /* Packed: exactly n keys filling packed_len. */
    const uint8_t *p = k->packed;
    size_t len = k->packed_len, off = 0;
    if (!p || len == 0)
        return 0;
    for (size_t i = 0; i < k->n; i++) {
        if (len - off < TC__KEY_HEADER)
            return 0;
        size_t n = get16(p + off);
        off += TC__KEY_HEADER;
        if (n > len - off)
            return 0;
        off += n;
    }
    return off == len ? len : 0;
}

void tc__keys_put(const tc_keys *k, uint8_t *dst, size_t len)
{
    if (!k->keys) {
        memcpy(dst, k->packed, len);
        return;
    }
    size_t off = 0;
    for (size_t i = 0; i < k->n; i++) {
        const tc_key *e = &k->keys[i];
        dst[off] = (uint8_t)e->len;
        dst[off + 1] = (uint8_t)(e->len >> 8);
        off += TC__KEY_HEADER;
        if (e->len)
            memcpy(dst + off, e->data, e->len);
        off += e->len;
    }
}

void tc__keys_begin(tc__key_iter *it, const tc_keys *k)
{
    it->k = k;
    it->i = 0;
    it->off = 0;
}

int tc__keys_next(tc__key_iter *it, const uint8_t **data, size_t *len)
{
    const tc_keys *k = it->k;
    if (it->i >= k->n)
        return 0;
    if (k->keys) {
        *data = k->keys[it->i].data;
        *len = k->keys[it->i].len;
    } else {
        const uint8_t *p = (const uint8_t *)k->packed + it->off;
        *len = get16(p);
        *data = p + TC__KEY_HEADER;
        it->off += TC__KEY_HEADER + *len;
    }
    it->i++;
    return 1;
}

size_t tc_keys_packed_len(const tc_keys *keys) { return tc__keys_len(keys); }

size_t tc_keys_pack(const tc_keys *keys, void *dst, size_t cap)
{
    size_t n = tc__keys_len(keys);
    if (n == 0 || n > cap || !dst)
        return 0;
    tc__keys_put(keys, dst, n);
    return n;
}
