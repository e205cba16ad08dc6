/*
 * quantity.h - Kubernetes resource.Quantity strings <-> integers.
 *
 * Parses the full grammar of apimachinery's ParseQuantity (quantity.go,
 * suffix.go) and prints the canonical form its String() produces, so a
 * policy sees the same numbers the API server does:
 *
 *   <quantity>        ::= <signedNumber><suffix>
 *   <signedNumber>    ::= <number> | "+"<number> | "-"<number>
 *   <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
 *   <suffix>          ::= <binarySI> | <decimalSI> | <decimalExponent>
 *   <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei           (2^10 .. 2^60)
 *   <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E  (10^-9 .. 10^18)
 *   <decimalExponent> ::= e<signed int> | E<signed int>       ("1E" alone is exa)
 *
 * Like apimachinery, and unlike the grammar above, the number may be empty:
 * ".", "-.", "-", "+", and a bare suffix such as "k", "Ki" or "e3" all parse
 * as zero.  Leading and trailing whitespace is an error (JSON decoding trims
 * it before calling the parser; that is the admission module's business).
 *
 * Values follow apimachinery exactly: a parsed value is exact down to nano
 * (1e-9) and a finer non-zero remainder rounds away from zero ("0.9n" is 1n,
 * "3.001n" is 4n); a binarySI magnitude above 2^63-1 is capped there ("9Ei");
 * a binarySI value strictly between -1 and 1 reports QTY_DECIMAL_SI.
 *
 * Limits (apimachinery has none): a number with more than QTY_MAX_DIGITS
 * significant digits (also after rounding to nano), or a decimal exponent
 * outside int32 (apimachinery truncates it to int32), or a value whose last
 * non-zero digit is above 10^INT32_MAX ("1000e2147483647"), is refused with
 * GG_ERR_TOOBIG, so every canonical string parses back.  Digits far below
 * nano are not stored, but rounding stays exact (see DEC_CUT in the .c).
 * Canonical strings are exact, never rounded further.
 *
 * Pure: libc only, no allocation, no globals, no I/O; every function is
 * thread-safe.  Out-params are written only on success.
 */
#ifndef GG_QUANTITY_H
#define GG_QUANTITY_H

#include <stddef.h>
#include <stdint.h>

#include "util/gpuguard.h"

/* The suffix family of a quantity; it survives canonicalisation. */
enum qty_format {
    QTY_DECIMAL_SI,       /* "1500m", "1k", "1G": powers of 1000 */
    QTY_BINARY_SI,        /* "1Ki", "1536Mi": powers of 1024 */
    QTY_DECIMAL_EXPONENT, /* "1e3", "80e-3" */
};

/* Most significant decimal digits a value may have (see the limits above). */
#define QTY_MAX_DIGITS 128

/* A buffer of this size always holds the output of qty_format_*() and
 * qty_canonical(), terminating NUL included. */
#define QTY_STR_MAX 192

/* apimachinery's name of a format: "DecimalSI", "BinarySI",
 * "DecimalExponent"; "unknown" for a value outside the enum. */
const char *qty_format_name(enum qty_format format);

/*
 * Parse s into milli-units, rounded up: *milli = ceil(value * 1000), as
 * Quantity.MilliValue() ("1" -> 1000, "1.5m" -> 2, "1n" -> 1, "-1.5m" -> -1).
 * format (may be NULL) receives the suffix family.
 *
 * GG_ERR_PARSE: s is not a quantity; err says which input and what is wrong,
 *               e.g. `invalid quantity "1.1.M": unexpected '.' at offset 3`.
 * GG_ERR_TOOBIG: the milli value does not fit in int64 ("12E", "8Ei"), or a
 *               limit above was hit.
 * GG_ERR_INVALID: s or milli is NULL.
 */
enum gg_status qty_parse(const char *s, int64_t *milli, enum qty_format *format,
                         struct gg_err *err);

/*
 * qty_parse() at any decimal scale: *value = ceil(value / 10^scale), as
 * Quantity.ScaledValue(scale).  scale -9 gives nano-units (exact, since
 * parsing rounds to nano), -3 milli-units, 0 whole units (bytes, GPUs).
 * Same errors as qty_parse().
 */
enum gg_status qty_parse_scaled(const char *s, int scale, int64_t *value, enum qty_format *format,
                                struct gg_err *err);

/*
 * Write the canonical string of milli / 1000 in the given family into out,
 * exactly as Quantity.String() does for NewMilliQuantity(milli, format):
 *   1500 DecimalSI -> "1500m", 1000000 -> "1k", 0 -> "0",
 *   1536 * 2^20 * 1000 BinarySI -> "1536Mi",
 *   1500 DecimalExponent -> "1500e-3", 1000000 -> "1e3".
 * A BinarySI value below 1024 in magnitude or with a fraction is printed as
 * DecimalSI (1024 milli -> "1024m").
 *
 * GG_ERR_TOOBIG: out (size bytes) is too small; QTY_STR_MAX always fits.
 * GG_ERR_INVALID: out is NULL or format is not an enum qty_format value.
 */
enum gg_status qty_format_milli(int64_t milli, enum qty_format format, char *out, size_t size);

/*
 * qty_format_milli() for value * 10^scale, as NewScaledQuantity(value, scale)
 * with the given format: (1, -9) -> "1n", (1, 21) DecimalSI -> "1e21" (there
 * is no decimal suffix above E), (1, 30) BinarySI -> "931322574615478515625Gi".
 * Same errors as qty_format_milli(); the GG_ERR_TOOBIG for a short buffer
 * cannot happen with QTY_STR_MAX unless a BinarySI scale is in the hundreds.
 */
enum gg_status qty_format_scaled(int64_t value, int scale, enum qty_format format, char *out,
                                 size_t size);

/*
 * Parse in and write its canonical form, with full precision, into out:
 * "1024Mi" -> "1Gi", "1.5Gi" -> "1536Mi", ".001Ki" -> "1024m", "1000M" ->
 * "1G", "1.5" -> "1500m", "0.9n" -> "1n", "9Ei" -> "9223372036854775807",
 * "1000E" -> "1e21", "-0" -> "0".
 *
 * apimachinery's String() echoes a few non-canonical spellings verbatim
 * because its parser caches the input ("+1", "01", "1.500", "1E3"); this
 * function always returns the canonical form ("1", "1", "1500m", "1e3").
 *
 * Errors as qty_parse() (without the int64 range limit), plus GG_ERR_TOOBIG
 * when out (size bytes) is too small.
 */
enum gg_status qty_canonical(const char *in, char *out, size_t size, struct gg_err *err);

#endif
