/*
 * keys.h - store key lists: checking, packing and walking the two forms a
 * tc_keys takes (separate keys, or the protocol's packed key list).
 */
#ifndef TC_KEYS_H
#define TC_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "tensorcast.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The bytes of a packed key's length prefix, and the longest key the
 * format carries. */
#define TC__KEY_HEADER 2
#define TC__MAX_PACKED_KEY 65535u

/* tc__keys_len checks k (n in 1 .. TC_MAX_KEYS; every key at most
 * TC__MAX_PACKED_KEY bytes; a packed list holding exactly n keys and
 * nothing more) and returns its packed length; 0 when it is not a valid key
 * list. */
size_t tc__keys_len(const tc_keys *k);

/* tc__keys_put writes k (checked by tc__keys_len, len bytes) packed at
 * dst. */
void tc__keys_put(const tc_keys *k, uint8_t *dst, size_t len);

/* A walk over a checked key list. */
typedef struct tc__key_iter {
    const tc_keys *k;
    size_t i;   /* the next key */
    size_t off; /* packed form: where it starts */
} tc__key_iter;

void tc__keys_begin(tc__key_iter *it, const tc_keys *k);

/* tc__keys_next sets the next key and advances; 0 past the last. */
int tc__keys_next(tc__key_iter *it, const uint8_t **data, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* TC_KEYS_H */
