/*
 * jsonscan.h - the string scan of the JSON readers (jsonfast.c, and the
 * informer's scanner, kube/infscan.c), inline where the bytes are read: the
 * plain run of a string, 16 bytes at a time where SSE2 is there.
 */
#ifndef GG_JSONSCAN_H
#define GG_JSONSCAN_H

#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) && !defined(JF_NO_SIMD)
#include <emmintrin.h>
#define JF_SSE2 1
#endif

static inline int needs_look(unsigned char c)
{
    return (unsigned char)(c - 0x20) >= 0x60 || c == '"' || c == '\\';
}

/* The first byte in [q, end) that is '"', '\\', below 0x20 or above 0x7f; end if none. */
static inline const unsigned char *scan_plain(const unsigned char *q, const unsigned char *end)
{
#ifdef JF_SSE2
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i bslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    while (end - q >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)q);
        /* signed compare: bytes >= 0x80 are negative, so "< 0x20" catches them too */
        __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quote), _mm_cmpeq_epi8(x, bslash)),
                                 _mm_cmplt_epi8(x, space));
        unsigned mask = (unsigned)_mm_movemask_epi8(m);
        if (mask)
            return q + __builtin_ctz(mask);
        q += 16;
    }
    for (; q < end; q++)
        if (needs_look(*q))
            return q;
    return end;
#else
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    for (;;) {
        while (end - q >= 8) {
            uint64_t x;
            memcpy(&x, q, 8);
            uint64_t qt = x ^ (ones * '"'), bs = x ^ (ones * '\\');
            /* zero bytes of qt/bs, bytes below 0x20 or above 0x7f; false
             * positives only above a true one */
            uint64_t hit = ((qt - ones) & ~qt) | ((bs - ones) & ~bs) | (x - ones * 0x20) | x;
            if (hit & highs)
                break;
            q += 8;
        }
        const unsigned char *lim = end - q > 8 ? q + 8 : end;
        for (; q < lim; q++)
            if (needs_look(*q))
                return q;
        if (q == end)
            return end;
    }
#endif
}

/* scan_plain over chars: what jf_scan_plain (jsonfast.h) is, inline. */
static inline const char *jf_scan_plain_inline(const char *p, const char *end)
{
    return (const char *)scan_plain((const unsigned char *)p, (const unsigned char *)end);
}

#endif
