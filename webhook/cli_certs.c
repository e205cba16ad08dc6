/*
 * cli_certs.c - `gpuguard certs`: create a CA and a serving certificate for
 * the webhook Service and print the caBundle.  Parses flags and prints; all
 * the certificate work is certs.c.  Exit codes: 0 done, 1 failed (including
 * a refusal to overwrite), 2 usage error.
 */
#include "certs.h"
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "gpuguard certs"

static const char help_text[] =
    "usage: gpuguard certs --service NAME --namespace NS --out DIR [flags]\n"
    "\n"
    "Create a private CA and a serving certificate signed by it for the webhook\n"
    "Service, valid for NAME, NAME.NS, NAME.NS.svc and NAME.NS.svc.cluster.local.\n"
    "Writes DIR/ca.crt, DIR/tls.crt and DIR/tls.key (mode 0600) and prints the\n"
    "caBundle line for the webhook configuration.  The CA private key is not\n"
    "kept: to rotate, run again with --force and update caBundle.\n"
    "\n"
    "flags:\n"
    "  --service NAME    name of the webhook Service (required)\n"
    "  --namespace NS    namespace of the Service (required)\n"
    "  --out DIR         output directory, created with mode 0755 if missing (required)\n"
    "  --days N          validity in days, 1..3650 (default 365)\n"
    "  --key-type TYPE   ecdsa (P-256) or rsa (3072 bits) (default ecdsa)\n"
    "  --dev             also valid for DNS localhost and IP 127.0.0.1 (default off)\n"
    "  --force           replace existing files (default off: refuse and write nothing)\n"
    "  -h, --help        show this help and exit\n"
    "\n"
    "exit status: 0 done, 1 failed or refused to overwrite, 2 usage error\n";

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;

    fputs(PROG ": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n(see '" PROG " --help')\n", stderr);
    return 2;
}

enum flag_id { F_SERVICE, F_NAMESPACE, F_OUT, F_DAYS, F_KEY_TYPE, F_DEV, F_FORCE };

static const struct flag {
    const char *name;
    bool has_value;
} flags[] = {
    [F_SERVICE] = {"--service", true},   [F_NAMESPACE] = {"--namespace", true},
    [F_OUT] = {"--out", true},           [F_DAYS] = {"--days", true},
    [F_KEY_TYPE] = {"--key-type", true}, [F_DEV] = {"--dev", false},
    [F_FORCE] = {"--force", false},
};

#define N_FLAGS ((int)(sizeof(flags) / sizeof(flags[0])))

/*
 * Match argv[*i] (--name or --name=value) against the table: returns the
 * flag's index or -1.  A flag with a value takes the next argument when
 * there is no '='; *value is NULL when none was given.
 */
static int match_flag(int argc, char **argv, int *i, const char **value)
{
    const char *arg = argv[*i];
    size_t n = strcspn(arg, "=");

    for (int f = 0; f < N_FLAGS; f++) {
        if (strlen(flags[f].name) != n || strncmp(arg, flags[f].name, n) != 0)
            continue;
        *value = NULL;
        if (arg[n] == '=')
            *value = arg + n + 1;
        else if (flags[f].has_value && *i + 1 < argc)
            *value = argv[++*i];
        return f;
    }
    return -1;
}

static bool parse_days(const char *s, int *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 1 || v > CERTS_MAX_DAYS)
        return false;
    *out = (int)v;
    return true;
}

int cli_certs(int argc, char **argv)
{
    struct certs_opts opts;
    struct certs_bundle bundle = {0};
    struct gg_err err = {{0}};
    const char *out_dir = NULL, *value;
    char *ca_b64 = NULL, until[CERTS_TIME_LEN];
    bool force = false;
    enum gg_status st;
    int rc = 2;

    certs_opts_init(&opts);
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(help_text, stdout);
            rc = 0;
            goto out;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int f = match_flag(argc, argv, &i, &value);
        int type;

        if (f < 0) {
            rc = usage_error(arg[0] == '-' ? "unknown flag '%s'" : "unexpected argument '%s'", arg);
            goto out;
        }
        if (flags[f].has_value && (!value || !*value)) {
            rc = usage_error("%s needs a value", flags[f].name);
            goto out;
        }
        if (!flags[f].has_value && value) {
            rc = usage_error("%s takes no value", flags[f].name);
            goto out;
        }
        switch ((enum flag_id)f) {
        case F_SERVICE:
            opts.service = value;
            break;
        case F_NAMESPACE:
            opts.ns = value;
            break;
        case F_OUT:
            out_dir = value;
            break;
        case F_DAYS:
            if (!parse_days(value, &opts.days)) {
                rc = usage_error("--days: expected a whole number from 1 to %d, got '%s'",
                                 CERTS_MAX_DAYS, value);
                goto out;
            }
            break;
        case F_KEY_TYPE:
            type = certs_key_type_parse(value);
            if (type < 0) {
                rc = usage_error("--key-type: expected ecdsa or rsa, got '%s'", value);
                goto out;
            }
            opts.key_type = (enum certs_key_type)type;
            break;
        case F_DEV:
            opts.dev = true;
            break;
        case F_FORCE:
            force = true;
            break;
        }
    }
    if (!opts.service || !opts.ns || !out_dir) {
        rc = usage_error("missing required flag %s", !opts.service ? "--service"
                                                     : !opts.ns    ? "--namespace"
                                                                   : "--out");
        goto out;
    }
    if (certs_check_service(opts.service, &err) != GG_OK) {
        rc = usage_error("--service: %s", err.msg);
        goto out;
    }
    if (certs_check_namespace(opts.ns, &err) != GG_OK) {
        rc = usage_error("--namespace: %s", err.msg);
        goto out;
    }

    rc = 1;
    st = certs_generate(&opts, &bundle, &err);
    if (st == GG_OK)
        st = certs_write(&bundle, out_dir, force, &err);
    if (st == GG_OK)
        st = certs_ca_bundle(&bundle, &ca_b64, &err);
    if (st != GG_OK) {
        fprintf(stderr, PROG ": %s%s\n", err.msg,
                st == GG_ERR_EXISTS ? " (use --force to replace; nothing was written)" : "");
        goto out;
    }
    certs_format_time(bundle.not_after, until);
    printf("wrote %s/%s (CA certificate, %s, valid until %s)\n", out_dir, CERTS_CA_FILE,
           certs_key_type_name(opts.key_type), until);
    printf("wrote %s/%s (serving certificate for %s.%s.svc%s, valid until %s)\n", out_dir,
           CERTS_CERT_FILE, opts.service, opts.ns, opts.dev ? ", localhost, 127.0.0.1" : "", until);
    printf("wrote %s/%s (private key, mode 0600)\n", out_dir, CERTS_KEY_FILE);
    printf("CA private key not kept: to rotate, run again with --force and update caBundle\n");
    printf("caBundle: %s\n", ca_b64);
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    free(ca_b64);
    certs_bundle_clear(&bundle);
    return rc;
}
