/* copy.c - tc_kv_read's copy of a batch of values out of the pool into
 * the caller's memory.
 *
 * A batch of large values is mostly memory traffic. Its destination, an
 * engine's host buffers, is seldom in the cache, and an ordinary store
 * first reads each destination line in (to own it), then writes it back,
 * moving each byte twice. Where the batch is larger than a core's share
 * of the cache, the copy uses non-temporal stores instead, which write
 * whole lines to memory without reading them; the bytes go on to a device
 * from there. A small batch is copied with memcpy and stays in the cache.
 * (tc_kv_put copies with memcpy: the blocks it reserves are often ones
 * just freed, still in the cache.) */
#include <stdint.h>
#include <string.h>

#include "internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>

static void copy_stream(uint8_t *d, const uint8_t *s, size_t n)
{
    size_t head = (16 - ((uintptr_t)d & 15)) & 15; /* to a 16-byte aligned d */
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    memcpy(d, s, n);
}

void tc__copy_values(const tc__span *spans, size_t n, uint64_t total)
{
    if (total < TC__STREAM_MIN) {
        for (size_t i = 0; i < n; i++)
            memcpy(spans[i].dst, spans[i].src, spans[i].len);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (spans[i].len < TC__STREAM_VALUE_MIN)
            memcpy(spans[i].dst, spans[i].src, spans[i].len);
        else
            copy_stream((uint8_t *)spans[i].dst, (const uint8_t *)spans[i].src, spans[i].len);
    }
    /* Non-temporal stores are weakly ordered: they are made visible before
     * the call returns (and before the unpin lets the block be reused). */
    _mm_sfence();
}

#else

void tc__copy_values(const tc__span *spans, size_t n, uint64_t total)
{
    (void)total;
    for (size_t i = 0; i < n; i++)
        memcpy(spans[i].dst, spans[i].src, spans[i].len);
}

#endif
