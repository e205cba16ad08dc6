/*
 * test_lease.c - the pure parts of the Lease elector (webhook/kube/lease.c):
 * MicroTime text, the timing checks and defaults, the jittered retry, the
 * lease duration in seconds; and the metrics the elector and the quota
 * ledger report (webhook/util/metrics.c): the leader gauge and changes, the
 * ledger's series, and the cap on their namespace labels.  The election
 * itself runs against the stand-in API server (tests/integration/test_lease.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kube/lease.h"
#include "util/buf.h"
#include "util/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_microtime(void **state)
{
    (void)state;
    static const struct {
        time_t sec;
        long nsec;
        const char *text;
    } cases[] = {
        {0, 0, "1970-01-01T00:00:00.000000Z"},
        {1767323045, 0, "2026-01-02T03:04:05.000000Z"},
        {1767323045, 123456789, "2026-01-02T03:04:05.123456Z"}, /* truncated, not rounded */
        {1767323045, 999999999, "2026-01-02T03:04:05.999999Z"},
        {1767323045, 1000, "2026-01-02T03:04:05.000001Z"},
        {951782400, 500000000, "2000-02-29T00:00:00.500000Z"},
        {253402300799, 0, "9999-12-31T23:59:59.000000Z"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[LEASE_MICROTIME_LEN];
        memset(out, 'x', sizeof(out));
        struct timespec ts = {.tv_sec = cases[i].sec, .tv_nsec = cases[i].nsec};
        assert_true(lease_microtime(&ts, out));
        assert_string_equal(out, cases[i].text);
        assert_int_equal(strlen(out), LEASE_MICROTIME_LEN - 1);
    }
    char out[LEASE_MICROTIME_LEN];
    struct timespec past_9999 = {.tv_sec = 253402300800, .tv_nsec = 0};
    struct timespec bad_nsec = {.tv_sec = 0, .tv_nsec = 1000000000};
    assert_false(lease_microtime(&past_9999, out));
    assert_false(lease_microtime(&bad_nsec, out));
}

static void test_timing_defaults_and_checks(void **state)
{
    (void)state;
    struct lease_config cfg = {0};
    struct lease_timing t;
    struct gg_err err = {{0}};
    assert_int_equal(lease_timing(&cfg, &t, &err), GG_OK);
    assert_int_equal(t.duration_ms, 15000);
    assert_int_equal(t.renew_deadline_ms, 10000);
    assert_int_equal(t.retry_ms, 2000);
    static const struct {
        int64_t duration, renew, retry;
        enum gg_status want;
        const char *says;
    } cases[] = {
        {3000, 2000, 500, GG_OK, NULL},
        {12000, 10000, 2000, GG_OK, NULL}, /* Kyverno's */
        {3000, 601, 500, GG_OK, NULL},     /* just above 1.2 x retry */
        {3000, 600, 500, GG_ERR_INVALID, "1.2 x the retry period"},
        {2000, 2000, 500, GG_ERR_INVALID, "longer than the renew deadline"},
        {1000, 2000, 500, GG_ERR_INVALID, "longer than the renew deadline"},
        {0, 20000, 0, GG_ERR_INVALID, "longer than the renew deadline"}, /* 15000 default */
        {3000, 2000, -1, GG_ERR_INVALID, "positive"},
        {-5, 2000, 500, GG_ERR_INVALID, "positive"},
        {86400001, 2000, 500, GG_ERR_INVALID, "at most a day"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct lease_config c = {
            .duration_ms = cases[i].duration,
            .renew_deadline_ms = cases[i].renew,
            .retry_ms = cases[i].retry,
        };
        err.msg[0] = '\0';
        if (lease_timing(&c, &t, &err) != cases[i].want)
            fail_msg("case %zu: %s", i, err.msg);
        if (cases[i].says && !strstr(err.msg, cases[i].says))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err.msg, cases[i].says);
    }
}

static void test_jitter_and_duration_seconds(void **state)
{
    (void)state;
    assert_int_equal(lease_jitter_ms(2000, 0), 2000);
    assert_int_equal(lease_jitter_ms(2000, 0.5), 3200);
    assert_true(lease_jitter_ms(2000, 0.999999) <= 4400);
    assert_true(lease_jitter_ms(2000, 0.999999) >= 4399);
    assert_int_equal(lease_jitter_ms(2000, 1.5), 2000); /* out of [0, 1): no jitter */
    assert_int_equal(lease_jitter_ms(2000, -0.1), 2000);
    assert_int_equal(lease_duration_seconds(15000), 15);
    assert_int_equal(lease_duration_seconds(1500), 2); /* rounded up: never shorter */
    assert_int_equal(lease_duration_seconds(1), 1);
    assert_int_equal(lease_duration_seconds(3000), 3);
}

static void test_start_refuses_bad_names(void **state)
{
    (void)state;
    static const struct lease_config bad[] = {
        {.namespace = "Kube_System", .name = "gpuguard"},
        {.namespace = "default", .name = "a/b"},
        {.namespace = "default", .name = "-x"},
        {.namespace = "default", .name = ""},
        {.namespace = NULL, .name = "gpuguard"},
        {.namespace = "default", .name = "gpuguard", .identity = ""},
        {.namespace = "default", .name = "gpuguard", .identity = "\xff\xfe"},
        {.namespace = "default", .name = "gpuguard", .duration_ms = 1000},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct lease *l = NULL;
        struct gg_err err = {{0}};
        /* Refused before the client is looked at. */
        assert_int_equal(lease_start(NULL, &bad[i], &l, &err), GG_ERR_INVALID);
        assert_null(l);
        assert_true(err.msg[0] != '\0');
    }
}

/* ---- metrics ------------------------------------------------------------ */

static char *render(void)
{
    static struct buf out;
    buf_clear(&out);
    buf_init(&out, 8 << 20);
    assert_int_equal(metrics_render(&out), GG_OK);
    return out.data;
}

static void has(const char *text, const char *line)
{
    char want[512];
    snprintf(want, sizeof(want), "\n%s\n", line);
    if (!strstr(text, want))
        fail_msg("no line \"%s\" in the metrics", line);
}

static void has_all(const char *text, const char *const *lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        has(text, lines[i]);
}

/* Runs first: a process without an elector or a ledger exports none of their series. */
static void test_metrics_absent_until_used(void **state)
{
    (void)state;
    const char *text = render();
    assert_null(strstr(text, "gpuguard_leader"));
    assert_null(strstr(text, "gpuguard_quota_ledger"));
    /* The other histograms keep their labels and bounds. */
    has(text, "gpuguard_admission_request_duration_seconds_bucket{endpoint=\"mutate\","
              "verdict=\"allowed\",le=\"5e-05\"} 0");
    has(text, "gpuguard_admission_request_duration_seconds_count{endpoint=\"mutate\","
              "verdict=\"allowed\"} 0");
}

static void test_metrics_leader(void **state)
{
    (void)state;
    metrics_leader(false);
    const char *text = render();
    has(text, "# TYPE gpuguard_leader gauge");
    has(text, "gpuguard_leader 0");
    has(text, "# TYPE gpuguard_leader_changes_total counter");
    has(text, "gpuguard_leader_changes_total 0");
    metrics_leader(true);
    metrics_leader(true); /* still leading: no change */
    text = render();
    has(text, "gpuguard_leader 1");
    has(text, "gpuguard_leader_changes_total 1");
    metrics_leader(false);
    metrics_leader(true);
    text = render();
    has(text, "gpuguard_leader 1");
    has(text, "gpuguard_leader_changes_total 2");
    metrics_leader(false);
    has(render(), "gpuguard_leader 0");
}

static void test_metrics_ledger(void **state)
{
    (void)state;
    metrics_ledger_enable();
    const char *text = render();
    /* On, with no traffic: the histogram at zero, the families without series. */
    has(text, "# TYPE gpuguard_quota_ledger_writes_total counter");
    has(text, "gpuguard_quota_ledger_seconds_bucket{le=\"0.001\"} 0");
    has(text, "gpuguard_quota_ledger_seconds_count 0");
    assert_null(strstr(text, "gpuguard_quota_ledger_writes_total{"));

    metrics_ledger_write("team-a", MET_LEDGER_OK);
    metrics_ledger_write("team-a", MET_LEDGER_OK);
    metrics_ledger_write("team-a", MET_LEDGER_CONFLICT);
    metrics_ledger_write("team-b", MET_LEDGER_ERROR);
    metrics_ledger_correction("team-c", 3);
    metrics_ledger_correction("team-c", 2);
    metrics_ledger_denial("team-a", "over");
    metrics_ledger_denial("team-b", "unavailable");
    metrics_ledger_denial("team-b", "bogus"); /* not a reason: not counted */
    metrics_ledger_seconds(0.003);
    metrics_ledger_seconds(0.0005);
    metrics_ledger_seconds(7);
    text = render();
    static const char *const want[] = {
        "gpuguard_quota_ledger_writes_total{namespace=\"team-a\",result=\"ok\"} 2",
        "gpuguard_quota_ledger_writes_total{namespace=\"team-a\",result=\"conflict\"} 1",
        "gpuguard_quota_ledger_writes_total{namespace=\"team-a\",result=\"error\"} 0",
        "gpuguard_quota_ledger_writes_total{namespace=\"team-b\",result=\"error\"} 1",
        "gpuguard_quota_ledger_corrections_total{namespace=\"team-c\"} 5",
        "gpuguard_quota_ledger_denials_total{namespace=\"team-a\",reason=\"over\"} 1",
        "gpuguard_quota_ledger_denials_total{namespace=\"team-a\",reason=\"unavailable\"} 0",
        "gpuguard_quota_ledger_denials_total{namespace=\"team-b\",reason=\"unavailable\"} 1",
        "gpuguard_quota_ledger_denials_total{namespace=\"team-b\",reason=\"over\"} 0",
        "gpuguard_quota_ledger_seconds_bucket{le=\"0.001\"} 1",
        "gpuguard_quota_ledger_seconds_bucket{le=\"0.0025\"} 1",
        "gpuguard_quota_ledger_seconds_bucket{le=\"0.005\"} 2",
        "gpuguard_quota_ledger_seconds_bucket{le=\"5\"} 2",
        "gpuguard_quota_ledger_seconds_bucket{le=\"+Inf\"} 3",
        "gpuguard_quota_ledger_seconds_count 3",
    };
    has_all(text, want, sizeof(want) / sizeof(want[0]));
    /* A family shows only the namespaces that counted in it. */
    assert_null(strstr(text, "gpuguard_quota_ledger_writes_total{namespace=\"team-c\""));
    assert_null(strstr(text, "gpuguard_quota_ledger_corrections_total{namespace=\"team-a\""));
    assert_non_null(strstr(text, "\ngpuguard_quota_ledger_seconds_sum 7.003"));
    assert_non_null(strstr(text, "# HELP gpuguard_quota_ledger_writes_total "));
    assert_non_null(strstr(text, "the rest are counted under namespace=\"_other\".\n# TYPE "
                                 "gpuguard_quota_ledger_writes_total counter"));
    assert_null(strstr(text, "_other\","));
}

static void *bump(void *arg)
{
    (void)arg;
    for (int i = 0; i < 2000; i++) {
        char ns[32];
        snprintf(ns, sizeof(ns), "race-%d", i % 97);
        metrics_ledger_correction(ns, 1);
    }
    return NULL;
}

/* Sum and count of a family's series whose line starts with prefix. */
static uint64_t sum_of(const char *text, const char *prefix, size_t *series)
{
    uint64_t sum = 0;
    *series = 0;
    size_t n = strlen(prefix);
    for (const char *p = text; (p = strstr(p, "\n")); p++)
        if (strncmp(p + 1, prefix, n) == 0) {
            const char *value = strchr(p + 1, ' ');
            sum += strtoull(value + 1, NULL, 10);
            (*series)++;
        }
    return sum;
}

/* Threads that register the same namespaces at once make one series each and lose no count. */
static void test_metrics_ledger_threads(void **state)
{
    (void)state;
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, bump, NULL), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    size_t series;
    uint64_t sum =
        sum_of(render(), "gpuguard_quota_ledger_corrections_total{namespace=\"race-", &series);
    assert_int_equal(sum, 8000);
    assert_int_equal(series, 97);
}

/* Namespaces past the cap, and names that are not namespaces, share "_other". */
static void test_metrics_ledger_namespace_cap(void **state)
{
    (void)state;
    /* team-a, team-b, team-c and race-0 to race-96 hold 100 of the 256 slots: ns-0 to ns-155
     * take the rest. */
    for (int i = 0; i < 300; i++) {
        char ns[32];
        snprintf(ns, sizeof(ns), "ns-%d", i);
        metrics_ledger_write(ns, MET_LEDGER_OK);
    }
    metrics_ledger_write("Not_A_Namespace", MET_LEDGER_CONFLICT);
    metrics_ledger_write(NULL, MET_LEDGER_CONFLICT);
    metrics_ledger_denial("ns-299", "over");
    metrics_ledger_write("team-a", MET_LEDGER_OK); /* known namespaces keep their series */
    const char *text = render();
    static const char *const want[] = {
        "gpuguard_quota_ledger_writes_total{namespace=\"ns-155\",result=\"ok\"} 1",
        "gpuguard_quota_ledger_writes_total{namespace=\"_other\",result=\"ok\"} 144",
        "gpuguard_quota_ledger_writes_total{namespace=\"_other\",result=\"conflict\"} 2",
        "gpuguard_quota_ledger_writes_total{namespace=\"team-a\",result=\"ok\"} 3",
        "gpuguard_quota_ledger_denials_total{namespace=\"_other\",reason=\"over\"} 1",
    };
    has_all(text, want, sizeof(want) / sizeof(want[0]));
    assert_null(strstr(text, "namespace=\"ns-156\""));
    assert_null(strstr(text, "Not_A_Namespace"));
    size_t series;
    sum_of(text, "gpuguard_quota_ledger_writes_total{", &series);
    assert_int_equal(series, (2 + 156 + 1) * 3); /* team-a, team-b, ns-0 to ns-155, _other */
    sum_of(text, "gpuguard_quota_ledger_", &series);
    assert_true(series < 1200); /* bounded, whatever the namespaces */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_microtime),
        cmocka_unit_test(test_timing_defaults_and_checks),
        cmocka_unit_test(test_jitter_and_duration_seconds),
        cmocka_unit_test(test_start_refuses_bad_names),
        cmocka_unit_test(test_metrics_absent_until_used),
        cmocka_unit_test(test_metrics_leader),
        cmocka_unit_test(test_metrics_ledger),
        cmocka_unit_test(test_metrics_ledger_threads),
        cmocka_unit_test(test_metrics_ledger_namespace_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
