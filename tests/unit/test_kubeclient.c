/*
 * test_kubeclient.c - API server configuration: kubeconfig contexts,
 * relative paths, credentials, the in-cluster service account; base64 and
 * query escaping.  Requests themselves are tested against the stand-in API
 * server (tests/integration/test_inventory_sync.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kube/kubeclient.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static int make_dir(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/gg-kc-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static enum gg_status load(const char *text, struct kc_client **c, struct gg_err *err)
{
    char path[256];
    write_file("config", text);
    snprintf(path, sizeof(path), "%s/config", dir);
    return kc_new_kubeconfig(path, c, err);
}

#define HEAD                                                                                       \
    "apiVersion: v1\nkind: Config\ncurrent-context: b\ncontexts:\n"                                \
    "- {name: a, context: {cluster: one, user: u1}}\n"                                             \
    "- {name: b, context: {cluster: two, user: u2}}\n"                                             \
    "clusters:\n- {name: one, cluster: {server: 'https://one:6443'}}\n"

static void test_kubeconfig_current_context(void **state)
{
    (void)state;
    struct kc_client *c = NULL;
    struct gg_err err = {{0}};
    write_file("tok", "  abc.def\n");
    assert_int_equal(load(HEAD "- {name: two, cluster: {server: 'https://10.0.0.1:443/', "
                               "certificate-authority: ca.pem, insecure-skip-tls-verify: true}}\n"
                               "users:\n- {name: u2, user: {tokenFile: tok}}\n",
                          &c, &err),
                     GG_OK);
    assert_string_equal(kc_server(c), "https://10.0.0.1:443");
    assert_string_equal(kc_auth_kind(c), "token file");
    kc_free(c);
    assert_int_equal(load(HEAD "- {name: two, cluster: {server: 'http://x', "
                               "certificate-authority-data: aGVsbG8=}}\n"
                               "users:\n- {name: u2, user: {token: t0k3n}}\n",
                          &c, &err),
                     GG_OK);
    assert_string_equal(kc_auth_kind(c), "token");
    kc_free(c);
    assert_int_equal(load(HEAD "- {name: two, cluster: {server: 'http://x'}}\n"
                               "users:\n- {name: u2, user: {client-certificate: c.pem, "
                               "client-key-data: aGVsbG8=}}\n",
                          &c, &err),
                     GG_OK);
    assert_string_equal(kc_auth_kind(c), "client certificate");
    kc_free(c);
    /* No user entry: anonymous. */
    assert_int_equal(load(HEAD "- {name: two, cluster: {server: 'http://x'}}\n", &c, &err), GG_OK);
    assert_string_equal(kc_auth_kind(c), "none");
    kc_free(c);
}

static void test_kubeconfig_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text, *message;
    } cases[] = {
        {"kind: Config\n", "no current-context"},
        {"current-context: nope\n", "context \"nope\" not found"},
        {HEAD, "cluster \"two\" not found"},
        {HEAD "- {name: two, cluster: {server: 'x'}}\n", "must be an https://"},
        {HEAD "- {name: two, cluster: {server: 'http://x', certificate-authority-data: '@@'}}\n",
         "not base64"},
        {HEAD "- {name: two, cluster: {server: 'http://x'}}\nusers:\n"
              "- {name: u2, user: {exec: {command: x}}}\n",
         "exec plugins"},
        {HEAD "- {name: two, cluster: {server: 'http://x'}}\nusers:\n"
              "- {name: u2, user: {client-certificate: c.pem}}\n",
         "needs its key"},
        {HEAD "- {name: two, cluster: {server: 'http://x'}}\nusers:\n"
              "- {name: u2, user: {tokenFile: nothere}}\n",
         "nothere"},
        {HEAD "- {name: two, cluster: {server: 'http://x'}}\nusers:\n"
              "- {name: u2, user: {tokenFile: empty}}\n",
         "empty"},
        {"a: [", "config"},
    };
    write_file("empty", "\n");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct kc_client *c = NULL;
        struct gg_err err = {{0}};
        if (load(cases[i].text, &c, &err) == GG_OK)
            fail_msg("case %zu accepted", i);
        if (!strstr(err.msg, cases[i].message))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err.msg, cases[i].message);
        assert_null(c);
    }
}

static void test_in_cluster(void **state)
{
    (void)state;
    struct kc_client *c = NULL;
    struct gg_err err = {{0}};
    unsetenv("KUBERNETES_SERVICE_HOST");
    assert_false(kc_in_cluster(dir));
    assert_int_equal(kc_new_in_cluster(dir, &c, &err), GG_ERR_INVALID);
    setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    char token[256];
    snprintf(token, sizeof(token), "%s/token", dir);
    unlink(token);
    assert_false(kc_in_cluster(dir));
    write_file("token", "sa-token\n");
    assert_true(kc_in_cluster(dir));
    assert_int_equal(kc_new_in_cluster(dir, &c, &err), GG_OK);
    assert_string_equal(kc_server(c), "https://[fd00::1]:443");
    assert_string_equal(kc_auth_kind(c), "service account");
    kc_free(c);
    unsetenv("KUBERNETES_SERVICE_HOST");
    unsetenv("KUBERNETES_SERVICE_PORT");
}

static void test_base64_and_escaping(void **state)
{
    (void)state;
    size_t n;
    unsigned char *d = kc_base64_decode("aGVs\nbG8gd29y bGQ=", &n);
    assert_non_null(d);
    assert_int_equal(n, 11);
    assert_memory_equal(d, "hello world", 11);
    free(d);
    d = kc_base64_decode("aGk", &n); /* padding optional */
    assert_int_equal(n, 2);
    free(d);
    assert_null(kc_base64_decode("a=b", &n));
    assert_null(kc_base64_decode("a", &n));
    assert_null(kc_base64_decode("a$bc", &n));
    char out[64];
    assert_true(kc_query_escape("eyJ2Ijo=+/ a", out, sizeof(out)));
    assert_string_equal(out, "eyJ2Ijo%3D%2B%2F%20a");
    assert_false(kc_query_escape("abc", out, 3));
    assert_true(kc_query_escape("abc", out, 4));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kubeconfig_current_context),
        cmocka_unit_test(test_kubeconfig_errors),
        cmocka_unit_test(test_in_cluster),
        cmocka_unit_test(test_base64_and_escaping),
    };
    return cmocka_run_group_tests_name("kubeclient", tests, make_dir, remove_dir);
}
