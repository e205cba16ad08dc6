/*
 * jsonfast.c - a single-pass JSON parser that builds a document of nodes.
 *
 * jansson's own reader pulls every byte through a function pointer and a
 * token buffer (about 170 instructions per byte), and every value it makes
 * is a separate allocation, every object a hash table.  This parser walks
 * the text with a pointer, an explicit stack of open containers and gotos:
 * no recursion, no per-byte calls.  Strings are found with a 16-byte SSE2
 * scan (an 8-byte SWAR one elsewhere) for the bytes that need a look
 * ('"', '\\', control characters, non-ASCII) and stay where they are, in a
 * copy of the text: the closing quote becomes the NUL, escaped ones are
 * decoded in that copy (never longer than their escaped form).  The text
 * itself is only read, so error positions count its lines and columns.
 *
 * Values wait on a scratch stack while their container is open; when it
 * closes, its members move in one piece to the document's chunks
 * (jsondoc.c), where they stay: each node is copied once.
 *
 * It must stay pure: no I/O, no state between calls (the "C" locale used
 * by strtod_l is created once and never changes).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "util/jsonfast.h"
#include "util/jsonscan.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JF_INLINE_FRAMES 64
#define JF_INLINE_SCRATCH 128
#define JF_HANDOFF_MIN 4096 /* members: a run this long is not copied (close_container) */
#define JF_NEAR_MAX 20

#define JF_LIKELY(x) __builtin_expect(!!(x), 1)
#define JF_UNLIKELY(x) __builtin_expect(!!(x), 0)

struct jf_frame {
    size_t start; /* scratch index of the first member; the container's node is just before */
    int is_object;
};

struct jf_parser {
    const unsigned char *text;
    const unsigned char *end;
    char *copy; /* the document's copy of text: strings live there */
    struct jf_error *err;
    struct jf_frame *stack; /* stack_inline or a malloc'd copy */
    size_t cap;
    struct jf_node *scratch; /* values of open containers; scratch_inline or malloc'd */
    size_t used, room;
    struct jf_frame stack_inline[JF_INLINE_FRAMES];
    struct jf_node scratch_inline[JF_INLINE_SCRATCH];
};

/*** errors (cold path) ***/

/* Printable-ASCII rendition of s[0..n): other bytes as \xNN. */
static void render(char *out, size_t size, const unsigned char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < size; i++) {
        if (s[i] >= 0x20 && s[i] < 0x7f)
            out[o++] = (char)s[i];
        else
            o += (size_t)snprintf(out + o, size - o, "\\x%02x", s[i]);
    }
    out[o] = '\0';
}

__attribute__((cold, format(printf, 3, 4))) static void
set_error(struct jf_parser *P, const unsigned char *at, const char *fmt, ...)
{
    struct jf_error *err = P->err;
    if (!err)
        return;
    int line = 1, col = 0;
    for (const unsigned char *q = P->text; q < at; q++) {
        if (*q == '\n') {
            if (line < INT_MAX)
                line++;
            col = 0;
        } else if ((*q & 0xc0) != 0x80 && col < INT_MAX - 1) {
            col++;
        }
    }
    err->line = line;
    err->column = col + 1;
    err->position = (size_t)(at - P->text);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->text, sizeof(err->text), fmt, ap);
    va_end(ap);
}

/* "<what> near '<the bytes at `at` of class `run`>'" */
enum near_run { NEAR_CHAR, NEAR_WORD, NEAR_NUMBER };

__attribute__((cold)) static void set_error_near(struct jf_parser *P, const unsigned char *at,
                                                 const char *what, enum near_run run)
{
    size_t avail = (size_t)(P->end - at), n = 0;
    if (avail == 0) {
        set_error(P, at, "%s near end of input", what);
        return;
    }
    if (run == NEAR_CHAR) {
        n = 1;
        if (at[0] >= 0x80) /* the whole UTF-8 sequence, at most 4 bytes */
            while (n < 4 && n < avail && (at[n] & 0xc0) == 0x80)
                n++;
    } else {
        while (n < avail && n < JF_NEAR_MAX) {
            unsigned char c = at[n];
            int in = run == NEAR_WORD ? ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
                                      : ((c >= '0' && c <= '9') || c == '.' || c == 'e' ||
                                         c == 'E' || c == '+' || c == '-');
            if (!in && n > 0)
                break;
            n++;
        }
    }
    char near[4 * JF_NEAR_MAX + 1];
    render(near, sizeof(near), at, n);
    set_error(P, at, "%s near '%s'", what, near);
}

/*** scratch space ***/

/* A new node on the scratch stack, NULL when out of memory.  Its heap block is a run the
 * document can take over (close_container). */
static struct jf_node *push_node(struct jf_parser *P)
{
    if (JF_UNLIKELY(P->used == P->room)) {
        struct jf_node *fresh;
        if (P->room > SIZE_MAX / 2)
            return NULL;
        if (P->scratch == P->scratch_inline) {
            if ((fresh = jf_run_alloc(P->room * 2)))
                memcpy(fresh, P->scratch, P->used * sizeof(*fresh));
        } else {
            fresh = jf_run_realloc(P->scratch, P->room * 2);
        }
        if (!fresh)
            return NULL;
        P->scratch = fresh;
        P->room *= 2;
    }
    return &P->scratch[P->used++];
}

static int grow_stack(struct jf_parser *P, size_t max_depth)
{
    size_t want = P->cap * 2 < max_depth ? P->cap * 2 : max_depth;
    if (want > SIZE_MAX / sizeof(struct jf_frame))
        return -1;
    struct jf_frame *fresh;
    if (P->stack == P->stack_inline) {
        fresh = malloc(want * sizeof(*fresh));
        if (fresh)
            memcpy(fresh, P->stack, P->cap * sizeof(*fresh));
    } else {
        fresh = realloc(P->stack, want * sizeof(*fresh));
    }
    if (!fresh)
        return -1;
    P->stack = fresh;
    P->cap = want;
    return 0;
}

/*** strings ***/

const char *jf_scan_plain(const char *p, const char *end)
{
    return jf_scan_plain_inline(p, end);
}

/* Length of the valid UTF-8 sequence at q (lead byte >= 0x80), 0 if invalid. */
static inline size_t utf8_seq(const unsigned char *q, const unsigned char *end)
{
    unsigned c = q[0];
    size_t avail = (size_t)(end - q);
    unsigned lo = 0x80, hi = 0xbf;
    if (c < 0xc2 || c > 0xf4)
        return 0;
    if (c < 0xe0)
        return avail >= 2 && (q[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c < 0xf0) {
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
        return avail >= 3 && q[1] >= lo && q[1] <= hi && (q[2] & 0xc0) == 0x80 ? 3 : 0;
    }
    if (c == 0xf0)
        lo = 0x90; /* overlong */
    else if (c == 0xf4)
        hi = 0x8f; /* above U+10FFFF */
    return avail >= 4 && q[1] >= lo && q[1] <= hi && (q[2] & 0xc0) == 0x80 && (q[3] & 0xc0) == 0x80
               ? 4
               : 0;
}

bool jf_utf8_valid(const char *s, size_t len)
{
    const unsigned char *q = (const unsigned char *)s, *end = q + len;
    while (q < end) {
        uint64_t word;
        if (end - q >= 8 && (memcpy(&word, q, 8), (word & 0x8080808080808080u) == 0)) {
            q += 8;
            continue;
        }
        if (*q < 0x80) {
            q++;
            continue;
        }
        size_t n = utf8_seq(q, end);
        if (n == 0)
            return false;
        q += n;
    }
    return true;
}

static inline int hexval(unsigned c)
{
    if (c - '0' < 10)
        return (int)(c - '0');
    c |= 0x20;
    if (c - 'a' < 6)
        return (int)(c - 'a' + 10);
    return -1;
}

/*
 * Validate the string whose opening quote is at open: UTF-8, no control
 * characters, escapes well-formed (\u with four hex digits; surrogates
 * are checked when decoding).  Returns the closing quote, or NULL with the
 * error set; *escaped tells whether a decode pass is needed.
 */
static inline __attribute__((always_inline)) const unsigned char *
scan_string(struct jf_parser *P, const unsigned char *open, int *escaped)
{
    const unsigned char *q = open + 1, *end = P->end;
    int esc = 0;
    for (;;) {
        q = scan_plain(q, end);
        if (JF_UNLIKELY(q == end)) {
            set_error(P, open, "unterminated string");
            return NULL;
        }
        unsigned c = *q;
        if (JF_LIKELY(c == '"'))
            break;
        if (c == '\\') {
            esc = 1;
            if (end - q < 2) {
                set_error(P, open, "unterminated string");
                return NULL;
            }
            c = q[1];
            if (c == 'u') {
                if (end - q < 6 ||
                    (hexval(q[2]) | hexval(q[3]) | hexval(q[4]) | hexval(q[5])) < 0) {
                    size_t n = (size_t)(end - q) < 6 ? (size_t)(end - q) : 6;
                    char near[4 * 6 + 1];
                    render(near, sizeof(near), q, n);
                    set_error(P, q, "invalid escape near '%s'", near);
                    return NULL;
                }
                q += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                       c == 'r' || c == 't') {
                q += 2;
            } else {
                char near[4 * 2 + 1];
                render(near, sizeof(near), q, 2);
                set_error(P, q, "invalid escape near '%s'", near);
                return NULL;
            }
        } else if (c < 0x20) {
            set_error(P, q, "control character 0x%02x in string", c);
            return NULL;
        } else {
            size_t n = utf8_seq(q, end);
            if (JF_UNLIKELY(!n)) {
                set_error(P, q, "invalid UTF-8 in string");
                return NULL;
            }
            q += n;
        }
    }
    *escaped = esc;
    return q;
}

static inline unsigned hex4(const unsigned char *s)
{
    return (unsigned)(hexval(s[0]) << 12 | hexval(s[1]) << 8 | hexval(s[2]) << 4 | hexval(s[3]));
}

/*
 * Decode the escapes of the validated string body [s, close) into out
 * (room for close - s bytes is enough).  Returns the length, or -1 with
 * the error set for lone surrogates and \u0000.
 */
static ptrdiff_t decode_string(struct jf_parser *P, const unsigned char *s,
                               const unsigned char *close, char *out)
{
    char *o = out;
    for (;;) {
        const unsigned char *bs = memchr(s, '\\', (size_t)(close - s));
        if (!bs)
            bs = close;
        memcpy(o, s, (size_t)(bs - s));
        o += bs - s;
        if (bs == close)
            break;
        s = bs;
        switch (s[1]) {
        case 'b':
            *o++ = '\b';
            break;
        case 'f':
            *o++ = '\f';
            break;
        case 'n':
            *o++ = '\n';
            break;
        case 'r':
            *o++ = '\r';
            break;
        case 't':
            *o++ = '\t';
            break;
        case 'u':
            break;
        default: /* '"', '\\', '/' */
            *o++ = (char)s[1];
            break;
        }
        if (s[1] != 'u') {
            s += 2;
            continue;
        }
        unsigned cp = hex4(s + 2);
        if (cp - 0xd800 < 0x800) {
            if (cp >= 0xdc00 || !(close - s > 7 && s[6] == '\\' && s[7] == 'u')) {
                set_error(P, s, "invalid Unicode '\\u%04X'", cp);
                return -1;
            }
            unsigned lo = hex4(s + 8); /* the scan checked the second escape */
            if (lo - 0xdc00 >= 0x400) {
                set_error(P, s, "invalid Unicode '\\u%04X\\u%04X'", cp, lo);
                return -1;
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            s += 12;
        } else {
            if (cp == 0) {
                set_error(P, s, "\\u0000 is not allowed in strings");
                return -1;
            }
            s += 6;
        }
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else if (cp < 0x800) {
            *o++ = (char)(0xc0 | cp >> 6);
            *o++ = (char)(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
            *o++ = (char)(0xe0 | cp >> 12);
            *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
            *o++ = (char)(0x80 | (cp & 0x3f));
        } else {
            *o++ = (char)(0xf0 | cp >> 18);
            *o++ = (char)(0x80 | ((cp >> 12) & 0x3f));
            *o++ = (char)(0x80 | ((cp >> 6) & 0x3f));
            *o++ = (char)(0x80 | (cp & 0x3f));
        }
    }
    return o - out;
}

/*** numbers ***/

static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void c_locale_init(void)
{
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

/* strtod of the validated number text s[0..n), in the "C" locale. */
static int slow_strtod(struct jf_parser *P, const unsigned char *s, size_t n, double *out)
{
    char small[64];
    char *buf = n < sizeof(small) ? small : malloc(n + 1);
    if (!buf) {
        set_error(P, s, "out of memory");
        return -1;
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    pthread_once(&c_locale_once, c_locale_init);
    errno = 0;
    double d = c_locale ? strtod_l(buf, NULL, c_locale) : strtod(buf, NULL);
    int overflow = errno == ERANGE && (d == HUGE_VAL || d == -HUGE_VAL);
    if (buf != small)
        free(buf);
    if (overflow) {
        set_error(P, s, "real number overflow");
        return -1;
    }
    *out = d;
    return 0;
}

static inline int is_digit(unsigned c)
{
    return c - '0' < 10;
}

/*
 * A number starting at *pp ('-' or a digit) into v.  Returns 0 and
 * advances *pp, or -1 with the error set (*pp unchanged).
 */
static int parse_number(struct jf_parser *P, const unsigned char **pp, struct jf_node *v)
{
    static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                   1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                   1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    const unsigned char *s = *pp, *p = s, *end = P->end;
    int neg = *p == '-';
    p += neg;
    const unsigned char *ds = p;
    uint64_t m = 0;
    while (p < end && is_digit(*p)) {
        m = m * 10 + (unsigned)(*p - '0'); /* wraps past 19 digits; not used then */
        p++;
    }
    size_t nint = (size_t)(p - ds);
    if (JF_UNLIKELY(nint == 0 || (nint > 1 && *ds == '0'))) {
        set_error_near(P, s, "invalid number", NEAR_NUMBER);
        return -1;
    }
    if (JF_LIKELY(p == end || (*p != '.' && (*p | 0x20) != 'e'))) {
        if (JF_UNLIKELY(nint > 19 || m > (uint64_t)INT64_MAX + neg)) {
            set_error(P, s, neg ? "too big negative integer" : "too big integer");
            return -1;
        }
        v->type = JF_INTEGER;
        v->u.i = neg ? (m > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)m) : (int64_t)m;
        *pp = p;
        return 0;
    }

    const unsigned char *fs = p, *fe = p;
    if (*p == '.') {
        fs = ++p;
        while (p < end && is_digit(*p))
            p++;
        fe = p;
        if (fe == fs) {
            set_error_near(P, s, "invalid number", NEAR_NUMBER);
            return -1;
        }
    }
    long exp10 = 0;
    if (p < end && (*p | 0x20) == 'e') {
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        const unsigned char *es = p;
        while (p < end && is_digit(*p)) {
            if (exp10 < 1000000)
                exp10 = exp10 * 10 + (*p - '0');
            p++;
        }
        if (p == es) {
            set_error_near(P, s, "invalid number", NEAR_NUMBER);
            return -1;
        }
        if (eneg)
            exp10 = -exp10;
    }

    /* Exact when the digits fit 2^53 and the power of ten is exact (Clinger). */
    double d;
    uint64_t mant = 0;
    int sig = 0, exact = 1;
    for (const unsigned char *q = ds; q < fe && exact; q++) {
        if (q == ds + nint) {
            q = fs;
            if (q == fe)
                break;
        }
        unsigned dig = (unsigned)(*q - '0');
        if (q >= fs)
            exp10--;
        if (mant == 0 && dig == 0)
            continue;
        if (++sig > 19)
            exact = 0;
        else
            mant = mant * 10 + dig;
    }
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
    if (exact && mant == 0) {
        d = 0.0;
    } else if (exact && mant <= (1ull << 53) && exp10 >= -22 && exp10 <= 22) {
        d = (double)mant;
        d = exp10 < 0 ? d / pow10[-exp10] : d * pow10[exp10];
    } else
#endif
    {
        (void)pow10;
        if (slow_strtod(P, s, (size_t)(p - s), &d))
            return -1;
        neg = 0; /* strtod saw the sign */
    }
    v->type = JF_REAL;
    v->u.d = neg ? -d : d;
    *pp = p;
    return 0;
}

/*** the parser ***/

#define SKIP_WS(p, end)                                                                            \
    while ((p) < (end) && *(p) <= ' ' &&                                                           \
           (*(p) == ' ' || *(p) == '\n' || *(p) == '\r' || *(p) == '\t'))                          \
    (p)++

/* place_string's way for a string with escapes, or longer than 4 GiB. */
static __attribute__((noinline)) const char *place_escaped(struct jf_parser *P,
                                                           const unsigned char *open,
                                                           const unsigned char *close, int escaped,
                                                           uint32_t *len)
{
    char *at = P->copy + (open + 1 - P->text);
    ptrdiff_t n = close - open - 1;
    if (escaped && (n = decode_string(P, open + 1, close, at)) < 0)
        return NULL;
    if ((size_t)n > UINT32_MAX) {
        set_error(P, open, "string longer than 4 GiB");
        return NULL;
    }
    at[n] = '\0';
    *len = (uint32_t)n;
    return at;
}

/*
 * The string whose opening quote is at open and closing quote at close, in
 * the copy: decoded there when escaped, NUL-terminated.  Its start, with
 * *len set, or NULL with the error set.
 */
static inline const char *place_string(struct jf_parser *P, const unsigned char *open,
                                       const unsigned char *close, int escaped, uint32_t *len)
{
    size_t n = (size_t)(close - open - 1);
    if (JF_UNLIKELY(escaped || n > UINT32_MAX))
        return place_escaped(P, open, close, escaped, len);
    char *at = P->copy + (open + 1 - P->text);
    at[n] = '\0';
    *len = (uint32_t)n;
    return at;
}

static bool same_key(const struct jf_node *a, const struct jf_node *b)
{
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0;
}

/*
 * Drop repeated keys from the n members at m, as jansson does: the last
 * value at the first key's position.  Returns the members left.  Up to 16
 * members, a 64-bit filter of (length, last byte) lets most keys
 * skip the search among the earlier ones; above, an open-addressed table
 * of indices.
 */
static uint32_t merge_duplicates(struct jf_node *m, uint32_t n, bool *nomem)
{
    uint32_t *slot = NULL, kept = 0;
    size_t mask = 0;
    uint64_t seen = 0;
    if (n > 16) {
        for (mask = 32; mask < 2 * (size_t)n; mask *= 2)
            ;
        if (!(slot = malloc(mask * sizeof(*slot)))) {
            *nomem = true;
            return n;
        }
        memset(slot, 0xff, mask * sizeof(*slot));
        mask--;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t first = UINT32_MAX, len = m[i].key_len;
        const unsigned char *key = (const unsigned char *)m[i].key;
        if (slot) {
            uint32_t hash = 2166136261u;
            for (uint32_t k = 0; k < len; k++)
                hash = (hash ^ key[k]) * 16777619u;
            size_t h;
            for (h = hash & mask; slot[h] != UINT32_MAX; h = (h + 1) & mask)
                if (same_key(&m[slot[h]], &m[i])) {
                    first = slot[h];
                    break;
                }
            if (first == UINT32_MAX)
                slot[h] = kept;
        } else {
            uint64_t bit = 1ull << ((len + (len ? key[len - 1] : 0u)) & 63);
            for (uint32_t j = 0; (seen & bit) && j < kept; j++)
                if (same_key(&m[j], &m[i])) {
                    first = j;
                    break;
                }
            seen |= bit;
        }
        if (first == UINT32_MAX) {
            if (kept != i)
                m[kept] = m[i];
            kept++;
        } else {
            const char *k = m[first].key;
            m[first] = m[i];
            m[first].key = k;
        }
    }
    free(slot);
    return kept;
}

/*
 * The container open at the top of the stack ends: its members move from
 * the scratch stack to the document.  A long run (an array of a million
 * numbers) is not copied: the document takes the scratch block where it
 * is and the values of the containers still open move to a new one, so
 * the run is never in memory twice.  Returns 0, -1 when out of memory, -2
 * for more members than a node counts.
 */
static int close_container(struct jf_parser *P, struct jf_doc *doc, const struct jf_frame *f)
{
    size_t n = P->used - f->start;
    struct jf_node *items = NULL;
    if (JF_UNLIKELY(n > UINT32_MAX))
        return -2;
    /* Only where the run is most of the block: the open containers' values (start) are
     * copied again and the block's spare room goes with it, both bounded by the run. */
    if (n >= JF_HANDOFF_MIN && P->scratch != P->scratch_inline && f->start <= n / 4 &&
        P->room <= 2 * (f->start + n)) {
        size_t room = f->start * 2 > JF_INLINE_SCRATCH ? f->start * 2 : JF_INLINE_SCRATCH;
        struct jf_node *fresh = jf_run_alloc(room);
        if (!fresh)
            return -1;
        memcpy(fresh, P->scratch, f->start * sizeof(*fresh));
        items = P->scratch + f->start;
        jf_doc_adopt(doc, P->scratch);
        P->scratch = fresh;
        P->room = room;
    } else if (n) {
        if (!(items = jf_doc_nodes(doc, n)))
            return -1;
        memcpy(items, &P->scratch[f->start], n * sizeof(*items));
    }
    P->used = f->start;
    struct jf_node *node = &P->scratch[f->start - 1];
    node->n = (uint32_t)n;
    node->u.items = items;
    if (f->is_object && n > 1) {
        bool nomem = false;
        node->n = merge_duplicates(items, (uint32_t)n, &nomem);
        if (nomem)
            return -1;
    }
    return 0;
}

json_t *jf_loadb(const char *text, size_t len, size_t max_depth, struct jf_error *err)
{
    struct jf_doc doc;
    size_t deepest;
    json_t *v = NULL;
    if (jf_parse(text, len, max_depth, &doc, &deepest, err) == 0 && !(v = jf_to_json(doc.root)) &&
        err) {
        memset(err, 0, sizeof(*err));
        snprintf(err->text, sizeof(err->text), "out of memory");
    }
    jf_doc_free(&doc);
    return v;
}

/*
 * The parser's state machine, whole on purpose (about 200 lines): one loop
 * over the text with an explicit stack of open containers, so nesting costs
 * no recursion and every state reads the same locals (position, stack,
 * pending key); split into functions, each would pass all of them around.
 */
int jf_parse(const char *text, size_t len, size_t max_depth, struct jf_doc *doc, size_t *deepest,
             struct jf_error *err)
{
    struct jf_parser P;
    P.text = (const unsigned char *)(text ? text : "");
    P.end = P.text + (text ? len : 0);
    P.copy = NULL;
    P.err = err;
    P.stack = P.stack_inline;
    P.cap = JF_INLINE_FRAMES;
    P.scratch = P.scratch_inline;
    P.used = 0;
    P.room = JF_INLINE_SCRATCH;
    if (max_depth == 0)
        max_depth = JF_DEFAULT_MAX_DEPTH;
    memset(doc, 0, sizeof(*doc));

    const unsigned char *p = P.text, *end = P.end, *q;
    struct jf_frame *top = NULL;
    struct jf_node *v;
    size_t depth = 0, most = 0; /* open containers, and their most at once */
    const char *key = NULL;
    uint32_t klen = 0;
    int esc, closed, rc = -1;

    if (!text) {
        set_error(&P, p, "wrong arguments");
        goto out;
    }
    /* Room for the copy, and a first chunk of nodes sized for typical text. */
    if (!(doc->text = P.copy = malloc(len + 1)) || !jf_doc_reserve(doc, len / 16))
        goto nomem;
    memcpy(P.copy, text, len);

value:
    SKIP_WS(p, end);
    if (JF_UNLIKELY(p == end)) {
        set_error(&P, p, "premature end of input");
        goto out;
    }
    if (JF_UNLIKELY(depth >= max_depth)) {
        set_error(&P, p, "maximum nesting depth %zu exceeded", max_depth);
        goto out;
    }
    if (JF_UNLIKELY(!(v = push_node(&P))))
        goto nomem;
    if (depth && top->is_object) {
        v->key = key;
        v->key_len = klen;
    } else {
        v->key = NULL;
        v->key_len = 0;
    }
    switch (*p) {
    case '"':
        if (!(q = scan_string(&P, p, &esc)) || !(v->u.s = place_string(&P, p, q, esc, &v->n)))
            goto out;
        v->type = JF_STRING;
        p = q + 1;
        break;
    case '{':
    case '[':
        v->type = *p == '{' ? JF_OBJECT : JF_ARRAY;
        if (JF_UNLIKELY(depth == P.cap) && grow_stack(&P, max_depth))
            goto nomem;
        top = &P.stack[depth++];
        if (depth > most)
            most = depth;
        top->start = P.used;
        top->is_object = *p++ == '{';
        SKIP_WS(p, end);
        if (p < end && *p == (top->is_object ? '}' : ']')) {
            p++;
            goto close;
        }
        if (!top->is_object)
            goto value;
        if (JF_LIKELY(p < end && *p == '"'))
            goto key;
        set_error_near(&P, p, "string or '}' expected", NEAR_CHAR);
        goto out;
    case 't':
        if (JF_UNLIKELY(end - p < 4 || memcmp(p, "true", 4) != 0))
            goto bad_literal;
        v->type = JF_TRUE;
        p += 4;
        break;
    case 'f':
        if (JF_UNLIKELY(end - p < 5 || memcmp(p, "false", 5) != 0))
            goto bad_literal;
        v->type = JF_FALSE;
        p += 5;
        break;
    case 'n':
        if (JF_UNLIKELY(end - p < 4 || memcmp(p, "null", 4) != 0))
            goto bad_literal;
        v->type = JF_NULL;
        p += 4;
        break;
    case '-':
    case '0':
    case '1':
    case '2':
    case '3':
    case '4':
    case '5':
    case '6':
    case '7':
    case '8':
    case '9':
        if (parse_number(&P, &p, v))
            goto out;
        break;
    default:
        if ((*p | 0x20) >= 'a' && (*p | 0x20) <= 'z')
            goto bad_literal;
        set_error_near(&P, p, "unexpected character", NEAR_CHAR);
        goto out;
    }
    if (depth == 0) /* a scalar at the top */
        goto done;

next: /* after a value inside top */
    SKIP_WS(p, end);
    if (JF_LIKELY(p < end && *p == ',')) {
        p++;
        if (!top->is_object)
            goto value;
        SKIP_WS(p, end);
        if (JF_LIKELY(p < end && *p == '"'))
            goto key;
        set_error_near(&P, p, "string expected", NEAR_CHAR);
        goto out;
    }
    if (JF_LIKELY(p < end && *p == (top->is_object ? '}' : ']'))) {
        p++;
        goto close;
    }
    set_error_near(&P, p, top->is_object ? "',' or '}' expected" : "',' or ']' expected",
                   NEAR_CHAR);
    goto out;

close: /* top has just been closed */
    if (JF_UNLIKELY((closed = close_container(&P, doc, top)) != 0)) {
        if (closed == -1)
            goto nomem;
        set_error(&P, p, "more than %" PRIu32 " members in a container", UINT32_MAX);
        goto out;
    }
    if (--depth == 0)
        goto done;
    top = &P.stack[depth - 1];
    goto next;

key: /* p is at the opening quote of a key */
    if (!(q = scan_string(&P, p, &esc)) || !(key = place_string(&P, p, q, esc, &klen)))
        goto out;
    p = q + 1;
    SKIP_WS(p, end);
    if (JF_LIKELY(p < end && *p == ':')) {
        p++;
        goto value;
    }
    set_error_near(&P, p, "':' expected", NEAR_CHAR);
    goto out;

bad_literal:
    set_error_near(&P, p, "invalid literal", NEAR_WORD);
    goto out;

nomem:
    set_error(&P, p, "out of memory");
    goto out;

done:
    SKIP_WS(p, end);
    if (JF_UNLIKELY(p != end)) {
        set_error(&P, p, "end of file expected after the value");
        goto out;
    }
    struct jf_node *root = jf_doc_nodes(doc, 1);
    if (!root)
        goto nomem;
    *root = P.scratch[0];
    doc->root = root;
    *deepest = most + 1;
    rc = 0;
out:
    if (rc)
        jf_doc_free(doc);
    if (P.stack != P.stack_inline)
        free(P.stack);
    if (P.scratch != P.scratch_inline)
        jf_run_free(P.scratch);
    return rc;
}
