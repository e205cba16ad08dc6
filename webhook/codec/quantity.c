/*
 * quantity.c - Kubernetes resource.Quantity strings <-> integers.
 *
 * A parsed quantity is held exactly as a decimal digit string times a power
 * of ten (struct dec), the C stand-in for apimachinery's inf.Dec: parse the
 * syntax, apply the suffix, round up to nano, cap binarySI, then either
 * convert to an int64 at some scale or print the canonical form.
 *
 * Pure: no allocation, no globals, no I/O.  Must not grow dependencies.
 */
#include "codec/quantity.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Room for QTY_MAX_DIGITS input digits times 2^60 (19 more digits), the
 * carry of rounding up and the zeros that pad a value out to nano. */
#define DEC_CAP (QTY_MAX_DIGITS + 32)

/*
 * Input digits below 10^DEC_CUT are not kept, only remembered as "sticky"
 * (a non-zero remainder).  That keeps rounding to nano exact: the kept part
 * times 2^k (k <= 60, the binary suffix) is a multiple of 2^k * 10^-70, and
 * so is its distance to the next multiple of 10^-9 (2^60 divides 10^61);
 * the dropped remainder times 2^k is smaller than that, so it can never
 * carry past the next nano step.  A sticky value rounds to exactly the step
 * the full value would.
 */
#define DEC_CUT (-70)

/* Longest input echoed in an error message, before "..." */
#define QUOTE_MAX 64

/* value = (-1)^neg * d[0..n) * 10^exp, d most significant first, d[0] != 0. */
struct dec {
    bool neg;
    bool sticky; /* a non-zero remainder below the last digit was dropped */
    int n;
    int64_t exp;
    unsigned char d[DEC_CAP];
};

struct suffix {
    const char *text;
    int exp10; /* decimal exponent, for decimalSI */
    int bin;   /* binary exponent, for binarySI */
    enum qty_format format;
};

static const struct suffix suffixes[] = {
    {"", 0, 0, QTY_DECIMAL_SI},   {"n", -9, 0, QTY_DECIMAL_SI}, {"u", -6, 0, QTY_DECIMAL_SI},
    {"m", -3, 0, QTY_DECIMAL_SI}, {"k", 3, 0, QTY_DECIMAL_SI},  {"M", 6, 0, QTY_DECIMAL_SI},
    {"G", 9, 0, QTY_DECIMAL_SI},  {"T", 12, 0, QTY_DECIMAL_SI}, {"P", 15, 0, QTY_DECIMAL_SI},
    {"E", 18, 0, QTY_DECIMAL_SI}, {"Ki", 0, 10, QTY_BINARY_SI}, {"Mi", 0, 20, QTY_BINARY_SI},
    {"Gi", 0, 30, QTY_BINARY_SI}, {"Ti", 0, 40, QTY_BINARY_SI}, {"Pi", 0, 50, QTY_BINARY_SI},
    {"Ei", 0, 60, QTY_BINARY_SI},
};

/* Canonical decimalSI suffixes for 10^-9, 10^-6, ..., 10^18. */
static const char *const decimal_suffixes[] = {"n", "u", "m", "", "k", "M", "G", "T", "P", "E"};
/* Canonical binarySI suffixes for 1024^0 .. 1024^6. */
static const char *const binary_suffixes[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};

const char *qty_format_name(enum qty_format format)
{
    switch (format) {
    case QTY_DECIMAL_SI:
        return "DecimalSI";
    case QTY_BINARY_SI:
        return "BinarySI";
    case QTY_DECIMAL_EXPONENT:
        return "DecimalExponent";
    }
    return "unknown";
}

static bool format_valid(enum qty_format format)
{
    return format == QTY_DECIMAL_SI || format == QTY_BINARY_SI || format == QTY_DECIMAL_EXPONENT;
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* ---- exact decimal arithmetic ------------------------------------------ */

static bool dec_push(struct dec *v, unsigned digit)
{
    if (v->n >= DEC_CAP)
        return false;
    v->d[v->n++] = (unsigned char)digit;
    return true;
}

/* v = v * m + add, for m <= 1024; false when the digits do not fit. */
static bool dec_mul_add(struct dec *v, unsigned m, unsigned add)
{
    unsigned carry = add;
    for (int i = v->n - 1; i >= 0; i--) {
        unsigned x = v->d[i] * m + carry;
        v->d[i] = (unsigned char)(x % 10);
        carry = x / 10;
    }
    for (; carry; carry /= 10) {
        if (v->n >= DEC_CAP)
            return false;
        memmove(v->d + 1, v->d, (size_t)v->n);
        v->d[0] = (unsigned char)(carry % 10);
        v->n++;
    }
    return true;
}

/* v = v / m if m divides the integer v exactly; otherwise v is unchanged. */
static bool dec_div_exact(struct dec *v, unsigned m)
{
    unsigned char q[DEC_CAP] = {0};
    unsigned rem = 0;
    int qn = 0;
    for (int i = 0; i < v->n; i++) {
        unsigned x = rem * 10 + v->d[i];
        if (qn > 0 || x / m)
            q[qn++] = (unsigned char)(x / m);
        rem = x % m;
    }
    if (rem)
        return false;
    memcpy(v->d, q, (size_t)qn);
    v->n = qn;
    return true;
}

/* Move trailing zero digits into the exponent; zero becomes +0 * 10^0. */
static void dec_normalize(struct dec *v)
{
    while (v->n > 0 && v->d[v->n - 1] == 0) {
        v->n--;
        v->exp++;
    }
    if (v->n == 0) {
        v->exp = 0;
        v->neg = false;
    }
}

static void dec_from_u64(struct dec *v, uint64_t mag, bool neg, int64_t exp)
{
    char tmp[24];
    int len = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)mag);
    memset(v, 0, sizeof(*v));
    v->neg = neg;
    v->exp = exp;
    for (int i = 0; i < len && mag; i++)
        v->d[v->n++] = (unsigned char)(tmp[i] - '0');
    dec_normalize(v);
}

/* Compare |a| and |b|; both normalized. */
static int dec_cmp_abs(const struct dec *a, const struct dec *b)
{
    if (a->n == 0 || b->n == 0)
        return (a->n != 0) - (b->n != 0);
    int64_t ma = a->n + a->exp, mb = b->n + b->exp; /* digits before the point */
    if (ma != mb)
        return ma < mb ? -1 : 1;
    for (int i = 0; i < a->n || i < b->n; i++) {
        int da = i < a->n ? a->d[i] : 0, db = i < b->n ? b->d[i] : 0;
        if (da != db)
            return da < db ? -1 : 1;
    }
    return 0;
}

/*
 * Round the magnitude up to a multiple of 10^-9, folding in the sticky
 * remainder: apimachinery's amount.Round(Nano, inf.RoundUp), which rounds
 * away from zero so that a tiny request still gets some resource.
 */
static bool dec_round_nano(struct dec *v)
{
    if (v->exp < -9) {
        int64_t drop = -9 - v->exp;
        int keep = drop >= v->n ? 0 : v->n - (int)drop;
        for (int i = keep; i < v->n; i++)
            if (v->d[i])
                v->sticky = true;
        v->n = keep;
        v->exp = -9;
    }
    if (v->sticky) {
        if (v->n == 0)
            v->exp = -9;
        for (; v->exp > -9; v->exp--)
            if (!dec_push(v, 0))
                return false;
        if (!dec_mul_add(v, 1, 1))
            return false;
        v->sticky = false;
    }
    dec_normalize(v);
    return true;
}

/* *out = ceil(v / 10^scale); false when that does not fit in int64. */
static bool dec_to_scaled(const struct dec *v, int scale, int64_t *out)
{
    if (v->n == 0) {
        *out = 0;
        return true;
    }
    int64_t whole = v->n + (v->exp - scale); /* digits before the point */
    if (whole > 19)
        return false;
    uint64_t mag = 0; /* at most 19 digits, plus one: below 2^64 */
    bool frac = false;
    for (int64_t i = 0; i < whole; i++)
        mag = mag * 10 + (i < v->n ? v->d[i] : 0);
    for (int64_t i = whole > 0 ? whole : 0; i < v->n; i++)
        frac = frac || v->d[i] != 0;
    if (frac && !v->neg)
        mag++; /* ceiling; truncation already is the ceiling when negative */
    if (mag > (v->neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
        return false;
    if (!v->neg)
        *out = (int64_t)mag;
    else if (mag == (uint64_t)INT64_MAX + 1)
        *out = INT64_MIN;
    else
        *out = -(int64_t)mag;
    return true;
}

/* ---- canonical output --------------------------------------------------- */

/* Bounded output; `full` records that something did not fit. */
struct sink {
    char buf[QTY_STR_MAX];
    size_t len;
    bool full;
};

static void put(struct sink *o, const char *s, size_t n)
{
    if (o->full || n >= sizeof(o->buf) - o->len) {
        o->full = true;
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void put_str(struct sink *o, const char *s)
{
    put(o, s, strlen(s));
}

static void put_digits(struct sink *o, const struct dec *v)
{
    if (v->neg)
        put(o, "-", 1);
    for (int i = 0; i < v->n; i++) {
        char c = (char)('0' + v->d[i]);
        put(o, &c, 1);
    }
}

/*
 * Decimal canonical form (CanonicalizeBytes): no fractional digits, the
 * exponent the largest multiple of 3 that allows that, then its suffix.
 * decimalSI has no suffix past 10^18 (or below 10^-9, reachable only from
 * qty_format_scaled) and falls back to "e<exp>" like apimachinery.
 */
static void format_decimal(struct sink *o, const struct dec *v, bool exponent)
{
    int64_t zeros = v->exp % 3;
    if (zeros < 0)
        zeros += 3;
    int64_t e3 = v->exp - zeros;

    put_digits(o, v);
    put(o, "00", (size_t)zeros);
    if (!exponent && e3 >= -9 && e3 <= 18) {
        put_str(o, decimal_suffixes[(e3 + 9) / 3]);
    } else if (e3 != 0) {
        char tmp[24];
        snprintf(tmp, sizeof(tmp), "e%lld", (long long)e3);
        put_str(o, tmp);
    }
}

/*
 * Binary canonical form: the integer with as many factors of 1024 moved into
 * the suffix as divide it.  Stops at Ei: apimachinery has no suffix past it
 * and prints such a value without one, which changes the value.
 */
static enum gg_status format_binary(struct sink *o, const struct dec *v)
{
    struct dec w = *v;
    for (; w.exp > 0; w.exp--)
        if (!dec_push(&w, 0))
            return GG_ERR_TOOBIG;
    int power = 0;
    while (power < 6 && dec_div_exact(&w, 1024))
        power++;
    put_digits(o, &w);
    put_str(o, binary_suffixes[power]);
    return GG_OK;
}

/* Canonical string of v in the format's family into out (size bytes). */
static enum gg_status dec_format(const struct dec *v, enum qty_format format, char *out,
                                 size_t size)
{
    struct sink o = {.len = 0};
    struct dec k1024;
    dec_from_u64(&k1024, 1024, false, 0);

    if (v->n == 0) {
        put_str(&o, "0");
    } else if (format == QTY_BINARY_SI && v->exp >= 0 && dec_cmp_abs(v, &k1024) >= 0) {
        enum gg_status st = format_binary(&o, v);
        if (st != GG_OK)
            return st;
    } else {
        /* A binarySI value below 1024 or with a fraction prints as decimalSI,
         * which shows it without rounding. */
        format_decimal(&o, v, format == QTY_DECIMAL_EXPONENT);
    }
    if (o.full || o.len >= size)
        return GG_ERR_TOOBIG;
    memcpy(out, o.buf, o.len);
    out[o.len] = '\0';
    return GG_OK;
}

/* ---- parsing ------------------------------------------------------------- */

/* s for an error message: bounded, quotes and non-printable bytes escaped. */
static const char *quote(const char *s, char *buf, size_t size)
{
    size_t len = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char piece[8];
        if (c == '"' || c == '\\')
            snprintf(piece, sizeof(piece), "\\%c", c);
        else if (c >= 0x20 && c < 0x7f)
            snprintf(piece, sizeof(piece), "%c", c);
        else
            snprintf(piece, sizeof(piece), "\\x%02x", c);
        size_t n = strlen(piece);
        if (len + n + 4 > size) { /* keep room for "..." and the NUL */
            memcpy(buf + len, "...", 3);
            len += 3;
            break;
        }
        memcpy(buf + len, piece, n);
        len += n;
    }
    buf[len] = '\0';
    return buf;
}

static enum gg_status syntax_error(struct gg_err *err, const char *s, const char *what)
{
    char q[QUOTE_MAX + 4];
    return gg_fail(err, GG_ERR_PARSE, "invalid quantity \"%s\": %s", quote(s, q, sizeof(q)), what);
}

static enum gg_status unexpected_char(struct gg_err *err, const char *s, size_t pos)
{
    char what[96];
    unsigned char c = (unsigned char)s[pos];
    if (c == ' ' || (c >= '\t' && c <= '\r'))
        snprintf(what, sizeof(what),
                 "unexpected whitespace at offset %zu (leading or trailing whitespace is not "
                 "allowed)",
                 pos);
    else if (c > 0x20 && c < 0x7f)
        snprintf(what, sizeof(what), "unexpected '%c' at offset %zu", c, pos);
    else
        snprintf(what, sizeof(what), "unexpected byte 0x%02x at offset %zu", c, pos);
    return syntax_error(err, s, what);
}

static enum gg_status too_many_digits(struct gg_err *err, const char *s)
{
    char q[QUOTE_MAX + 4];
    return gg_fail(err, GG_ERR_TOOBIG, "quantity \"%s\" has more than %d significant digits",
                   quote(s, q, sizeof(q)), QTY_MAX_DIGITS);
}

/*
 * The suffix: a table entry, or e/E and an integer that Go's
 * strconv.ParseInt(s, 10, 64) accepts ("1E" alone is the exa entry).
 */
static enum gg_status interpret_suffix(const char *s, const char *suffix, struct suffix *out,
                                       struct gg_err *err)
{
    char what[160], q[QUOTE_MAX + 4];

    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        if (strcmp(suffix, suffixes[i].text) == 0) {
            *out = suffixes[i];
            return GG_OK;
        }
    }
    if ((suffix[0] != 'e' && suffix[0] != 'E') || suffix[1] == '\0') {
        snprintf(what, sizeof(what),
                 "unknown suffix \"%s\" (want one of n u m k M G T P E Ki Mi Gi Ti Pi Ei, or "
                 "e<exponent>)",
                 quote(suffix, q, sizeof(q)));
        return syntax_error(err, s, what);
    }

    const char *p = suffix + 1;
    bool neg = *p == '-';
    if (*p == '-' || *p == '+')
        p++;
    uint64_t mag = 0;
    bool ok = is_digit(*p);
    for (; ok && *p; p++) {
        unsigned digit = (unsigned)(*p - '0');
        ok = is_digit(*p) && mag <= ((uint64_t)INT64_MAX + 1 - digit) / 10;
        mag = mag * 10 + digit;
    }
    if (!ok || (!neg && mag > (uint64_t)INT64_MAX)) {
        snprintf(what, sizeof(what), "invalid exponent \"%s\"", quote(suffix, q, sizeof(q)));
        return syntax_error(err, s, what);
    }
    /* apimachinery truncates the int64 to int32 here; refuse instead. */
    if (mag > (neg ? (uint64_t)INT32_MAX + 1 : (uint64_t)INT32_MAX))
        return gg_fail(err, GG_ERR_TOOBIG, "quantity \"%s\": exponent out of range",
                       quote(s, q, sizeof(q)));
    out->text = suffix;
    out->exp10 = neg ? (int)(0 - (int64_t)mag) : (int)mag;
    out->bin = 0;
    out->format = QTY_DECIMAL_EXPONENT;
    return GG_OK;
}

/*
 * Parse s into an exact value and its format, following apimachinery's
 * parseQuantityString and ParseQuantity.  The scanner is as permissive as
 * theirs: the number part may be empty, so "-", "." and "Ki" are zero.
 */
static enum gg_status parse(const char *s, struct dec *v, enum qty_format *format,
                            struct gg_err *err)
{
    if (!s)
        return gg_fail(err, GG_ERR_INVALID, "quantity: NULL string");
    size_t len = strlen(s);
    if (len == 0)
        return syntax_error(err, s, "empty string");

    /* sign, integer digits, optional '.' and fraction digits */
    size_t pos = 0;
    bool neg = false;
    if (s[0] == '-' || s[0] == '+') {
        neg = s[0] == '-';
        pos++;
    }
    size_t num = pos;
    while (is_digit(s[pos]))
        pos++;
    size_t num_len = pos - num, den = pos, den_len = 0;
    if (s[pos] == '.') {
        den = ++pos;
        while (is_digit(s[pos]))
            pos++;
        den_len = pos - den;
    }
    /* suffix: letters, then an optional sign and digits for the exponent */
    size_t suf = pos;
    while (s[pos] && strchr("eEinumkKMGTP", s[pos]))
        pos++;
    if (s[pos] == '-' || s[pos] == '+')
        pos++;
    while (is_digit(s[pos]))
        pos++;
    if (pos != len)
        return unexpected_char(err, s, pos);

    struct suffix sx = {.text = ""};
    enum gg_status st = interpret_suffix(s, s + suf, &sx, err);
    if (st != GG_OK)
        return st;

    /* The digits of num and den in order; the last has weight 10^low. */
    struct dec w;
    memset(&w, 0, sizeof(w));
    w.neg = neg;
    int64_t total = (int64_t)(num_len + den_len);
    int64_t low = sx.exp10 - (int64_t)den_len, last = 0, zeros = 0;
    for (int64_t i = 0; i < total; i++) {
        char c = i < (int64_t)num_len ? s[num + i] : s[den + (i - (int64_t)num_len)];
        unsigned digit = (unsigned)(c - '0');
        int64_t weight = low + (total - 1 - i);
        if (weight < DEC_CUT) {
            w.sticky = w.sticky || digit != 0;
            continue;
        }
        if (digit == 0) {
            zeros += w.n > 0; /* leading zeros vanish, inner ones wait */
            continue;
        }
        for (; zeros > 0; zeros--)
            if (w.n >= QTY_MAX_DIGITS || !dec_push(&w, 0))
                return too_many_digits(err, s);
        if (w.n >= QTY_MAX_DIGITS || !dec_push(&w, digit))
            return too_many_digits(err, s);
        last = weight;
    }
    w.exp = w.n ? last : 0;

    for (int b = 0; b < sx.bin; b += 10)
        if (!dec_mul_add(&w, 1024, 0))
            return too_many_digits(err, s);
    if (!dec_round_nano(&w))
        return too_many_digits(err, s);

    enum qty_format f = sx.format;
    if (f == QTY_BINARY_SI) {
        /* binarySI is capped at 2^63-1 in magnitude, silently (apimachinery's
         * maxAllowed), and a value strictly inside (-1, 1) turns decimalSI. */
        struct dec max;
        dec_from_u64(&max, (uint64_t)INT64_MAX, false, 0);
        if (dec_cmp_abs(&w, &max) > 0) {
            max.neg = w.neg;
            w = max;
        }
        if (w.n > 0 && w.n + w.exp <= 0)
            f = QTY_DECIMAL_SI;
    }
    /* The limits hold for the value too, or its canonical form would not
     * parse back: rounding up to nano can add digits, and the exponent of
     * the last digit can pass int32 ("1000e2147483647" is "10e2147483649"). */
    if (w.n > QTY_MAX_DIGITS)
        return too_many_digits(err, s);
    if (w.n > 0 && w.exp > INT32_MAX) {
        char q[QUOTE_MAX + 4];
        return gg_fail(err, GG_ERR_TOOBIG, "quantity \"%s\": exponent out of range",
                       quote(s, q, sizeof(q)));
    }
    *v = w;
    *format = f;
    return GG_OK;
}

static const char *unit_name(int scale, char *buf, size_t size)
{
    switch (scale) {
    case -9:
        return "nano-units";
    case -6:
        return "micro-units";
    case -3:
        return "milli-units";
    case 0:
        return "units";
    }
    snprintf(buf, size, "units of 1e%d", scale);
    return buf;
}

enum gg_status qty_parse_scaled(const char *s, int scale, int64_t *value, enum qty_format *format,
                                struct gg_err *err)
{
    if (!value)
        return gg_fail(err, GG_ERR_INVALID, "qty_parse: NULL value pointer");
    struct dec v;
    enum qty_format f;
    enum gg_status st = parse(s, &v, &f, err);
    if (st != GG_OK)
        return st;
    int64_t x;
    if (!dec_to_scaled(&v, scale, &x)) {
        char q[QUOTE_MAX + 4], unit[32];
        return gg_fail(err, GG_ERR_TOOBIG,
                       "quantity \"%s\" is out of range: its value in %s does not fit in int64",
                       quote(s, q, sizeof(q)), unit_name(scale, unit, sizeof(unit)));
    }
    *value = x;
    if (format)
        *format = f;
    return GG_OK;
}

enum gg_status qty_parse(const char *s, int64_t *milli, enum qty_format *format, struct gg_err *err)
{
    return qty_parse_scaled(s, -3, milli, format, err);
}

enum gg_status qty_format_scaled(int64_t value, int scale, enum qty_format format, char *out,
                                 size_t size)
{
    if (!out || !format_valid(format))
        return GG_ERR_INVALID;
    struct dec v;
    uint64_t mag = value < 0 ? 0 - (uint64_t)value : (uint64_t)value;
    dec_from_u64(&v, mag, value < 0, scale);
    return dec_format(&v, format, out, size);
}

enum gg_status qty_format_milli(int64_t milli, enum qty_format format, char *out, size_t size)
{
    return qty_format_scaled(milli, -3, format, out, size);
}

enum gg_status qty_canonical(const char *in, char *out, size_t size, struct gg_err *err)
{
    if (!out)
        return gg_fail(err, GG_ERR_INVALID, "qty_canonical: NULL output buffer");
    struct dec v;
    enum qty_format f;
    enum gg_status st = parse(in, &v, &f, err);
    if (st != GG_OK)
        return st;
    st = dec_format(&v, f, out, size);
    if (st != GG_OK) {
        char q[QUOTE_MAX + 4];
        return gg_fail(err, st, "canonical form of quantity \"%s\" does not fit in %zu bytes",
                       quote(in, q, sizeof(q)), size);
    }
    return GG_OK;
}
