/*
 * cli_certs.c - `gpuguard certs`: the command around certs.c that makes the webhook's CA and
 * serving certificate.
 *
 * Parses the flags, prints the caBundle and optionally writes it as a
 * kustomize patch for deploy/overlays/provided-certs; all the certificate work
 * is certs.c.  Exit codes: 0 done, 1 failed (including a refusal to
 * overwrite), 2 usage error.
 */
#include "http/certs.h"
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    "With --kustomize-patch FILE it also writes FILE, a kustomize strategic merge\n"
    "patch that sets caBundle on the MutatingWebhookConfiguration and the\n"
    "ValidatingWebhookConfiguration named gpuguard (webhooks mutate.gpuguard.io,\n"
    "workloads.mutate.gpuguard.io, validate.gpuguard.io and\n"
    "workloads.validate.gpuguard.io), for deploy/overlays/provided-certs/webhook-cabundle.yaml.\n"
    "\n"
    "flags:\n"
    "  --service NAME    name of the webhook Service (required)\n"
    "  --namespace NS    namespace of the Service (required)\n"
    "  --out DIR         output directory, created with mode 0755 if missing (required)\n"
    "  --days N          validity in days, 1..3650 (default 365)\n"
    "  --key-type TYPE   ecdsa (P-256) or rsa (3072 bits) (default ecdsa)\n"
    "  --dev             also valid for DNS localhost and IP 127.0.0.1 (default off)\n"
    "  --kustomize-patch FILE\n"
    "                    also write the caBundle patch to FILE, mode 0644, in a directory\n"
    "                    that exists (default off)\n"
    "  --print-ca-bundle print only the caBundle (base64 of ca.crt) on stdout, for\n"
    "                    scripts (default off: a line per file written, then the caBundle)\n"
    "  --force           replace existing files, FILE too (default off: refuse and write\n"
    "                    nothing)\n"
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

enum flag_id {
    F_SERVICE,
    F_NAMESPACE,
    F_OUT,
    F_DAYS,
    F_KEY_TYPE,
    F_DEV,
    F_FORCE,
    F_KUSTOMIZE_PATCH,
    F_PRINT_CA_BUNDLE
};

static const struct flag {
    const char *name;
    bool has_value;
} flags[] = {
    [F_SERVICE] = {"--service", true},
    [F_NAMESPACE] = {"--namespace", true},
    [F_OUT] = {"--out", true},
    [F_DAYS] = {"--days", true},
    [F_KEY_TYPE] = {"--key-type", true},
    [F_DEV] = {"--dev", false},
    [F_FORCE] = {"--force", false},
    [F_KUSTOMIZE_PATCH] = {"--kustomize-patch", true},
    [F_PRINT_CA_BUNDLE] = {"--print-ca-bundle", false},
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

/*
 * The webhook configurations of charts/gpuguard/templates/webhooks.yaml: a strategic merge
 * patch finds each by kind and name, and its webhook by name (the merge key),
 * so these must match the manifests (tests/integration/test_deploy.py checks).
 */
#define WEBHOOK_CONFIG_NAME "gpuguard"
#define MUTATING_WEBHOOK_NAME "mutate.gpuguard.io"
#define VALIDATING_WEBHOOK_NAME "validate.gpuguard.io"
#define WORKLOADS_PREFIX "workloads."

static const char patch_format[] =
    "# Written by `gpuguard certs --kustomize-patch`: a kustomize strategic merge patch that\n"
    "# sets caBundle (the base64 of ca.crt) on both webhook configurations of gpuguard.\n"
    "# The serving certificate is for %2$s.%3$s.svc; the CA is valid until %4$s.\n"
    "# Write it again with the certificates: the CA private key is not kept.\n"
    "apiVersion: admissionregistration.k8s.io/v1\n"
    "kind: MutatingWebhookConfiguration\n"
    "metadata:\n"
    "  name: " WEBHOOK_CONFIG_NAME "\n"
    "webhooks:\n"
    "  - name: " MUTATING_WEBHOOK_NAME "\n"
    "    clientConfig:\n"
    "      caBundle: %1$s\n"
    "  - name: " WORKLOADS_PREFIX MUTATING_WEBHOOK_NAME "\n"
    "    clientConfig:\n"
    "      caBundle: %1$s\n"
    "---\n"
    "apiVersion: admissionregistration.k8s.io/v1\n"
    "kind: ValidatingWebhookConfiguration\n"
    "metadata:\n"
    "  name: " WEBHOOK_CONFIG_NAME "\n"
    "webhooks:\n"
    "  - name: " VALIDATING_WEBHOOK_NAME "\n"
    "    clientConfig:\n"
    "      caBundle: %1$s\n"
    "  - name: " WORKLOADS_PREFIX VALIDATING_WEBHOOK_NAME "\n"
    "    clientConfig:\n"
    "      caBundle: %1$s\n";

/* Without force, refuse an existing path; never accept a directory. */
static enum gg_status patch_check_target(const char *path, bool force, struct gg_err *err)
{
    struct stat sb;

    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? GG_OK : gg_fail(err, GG_ERR_IO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return gg_fail(err, GG_ERR_INVALID, "%s is a directory", path);
    if (!force)
        return gg_fail(err, GG_ERR_EXISTS, "%s already exists", path);
    return GG_OK;
}

/*
 * Write text to a new temporary file (mode 0644) in the directory of path,
 * as certs_write does for the certificates, so that a refusal or a failure
 * later leaves nothing and the final name never shows a partial file.
 */
static enum gg_status patch_write_temp(const char *path, const char *text, char tmp[PATH_MAX],
                                       struct gg_err *err)
{
    const char *slash = strrchr(path, '/');
    size_t len = strlen(text), done = 0;
    int fd, n;

    if (slash)
        n = snprintf(tmp, PATH_MAX, "%.*s/.%s.XXXXXX", (int)(slash - path), path, slash + 1);
    else
        n = snprintf(tmp, PATH_MAX, ".%s.XXXXXX", path);
    if (n < 0 || n >= PATH_MAX) {
        tmp[0] = '\0';
        return gg_fail(err, GG_ERR_INVALID, "%s: path too long", path);
    }
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        tmp[0] = '\0';
        return gg_fail(err, GG_ERR_IO, "cannot create %s: %s", path, strerror(e));
    }
    errno = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += (size_t)w;
    }
    if (done < len || fchmod(fd, 0644) != 0 || fsync(fd) != 0) {
        int e = done < len && errno == 0 ? EIO : errno;
        close(fd);
        unlink(tmp);
        tmp[0] = '\0';
        return gg_fail(err, GG_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        tmp[0] = '\0';
        return gg_fail(err, GG_ERR_IO, "%s: close: %s", path, strerror(e));
    }
    return GG_OK;
}

/*
 * Move the temporary file to path: rename with force, link (no replace)
 * without.  A failure here comes after the certificates were written (a
 * file created meanwhile, say), so it is not reported as a clean refusal.
 */
static enum gg_status patch_install(const char *tmp, const char *path, bool force,
                                    struct gg_err *err)
{
    if (force ? rename(tmp, path) : link(tmp, path))
        return gg_fail(err, GG_ERR_IO, "%s: %s", path, strerror(errno));
    if (!force)
        unlink(tmp);
    return GG_OK;
}

int cli_certs(int argc, char **argv)
{
    struct certs_opts opts;
    struct certs_bundle bundle = {0};
    struct gg_err err = {{0}};
    const char *out_dir = NULL, *patch_path = NULL, *value;
    char *ca_b64 = NULL, *patch = NULL, until[CERTS_TIME_LEN], patch_tmp[PATH_MAX] = "";
    bool force = false, print_ca_bundle = false;
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
        case F_KUSTOMIZE_PATCH:
            patch_path = value;
            break;
        case F_PRINT_CA_BUNDLE:
            print_ca_bundle = true;
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

    /*
     * The patch goes to a temporary file before the certificates are
     * written and to its name after: a refusal writes nothing at all.
     */
    rc = 1;
    st = patch_path ? patch_check_target(patch_path, force, &err) : GG_OK;
    if (st == GG_OK)
        st = certs_generate(&opts, &bundle, &err);
    if (st == GG_OK)
        st = certs_ca_bundle(&bundle, &ca_b64, &err);
    if (st == GG_OK)
        certs_format_time(bundle.not_after, until);
    if (st == GG_OK && patch_path) {
        if (asprintf(&patch, patch_format, ca_b64, opts.service, opts.ns, until) < 0) {
            patch = NULL;
            st = gg_fail(&err, GG_ERR_NOMEM, "out of memory");
        } else {
            st = patch_write_temp(patch_path, patch, patch_tmp, &err);
        }
    }
    if (st == GG_OK)
        st = certs_write(&bundle, out_dir, force, &err);
    if (st == GG_OK && patch_path) {
        st = patch_install(patch_tmp, patch_path, force, &err);
        if (st == GG_OK)
            patch_tmp[0] = '\0';
    }
    if (st != GG_OK) {
        fprintf(stderr, PROG ": %s%s\n", err.msg,
                st == GG_ERR_EXISTS ? " (use --force to replace; nothing was written)" : "");
        goto out;
    }
    if (print_ca_bundle) {
        printf("%s\n", ca_b64);
        rc = fflush(stdout) == 0 ? 0 : 1;
        goto out;
    }
    printf("wrote %s/%s (CA certificate, %s, valid until %s)\n", out_dir, CERTS_CA_FILE,
           certs_key_type_name(opts.key_type), until);
    printf("wrote %s/%s (serving certificate for %s.%s.svc%s, valid until %s)\n", out_dir,
           CERTS_CERT_FILE, opts.service, opts.ns, opts.dev ? ", localhost, 127.0.0.1" : "", until);
    printf("wrote %s/%s (private key, mode 0600)\n", out_dir, CERTS_KEY_FILE);
    if (patch_path)
        printf("wrote %s (caBundle patch for the webhook configurations " WEBHOOK_CONFIG_NAME ")\n",
               patch_path);
    printf("CA private key not kept: to rotate, run again with --force and update caBundle\n");
    printf("caBundle: %s\n", ca_b64);
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    if (patch_tmp[0])
        unlink(patch_tmp);
    free(patch);
    free(ca_b64);
    certs_bundle_clear(&bundle);
    return rc;
}
