/*
 * failmalloc.c - an LD_PRELOAD shim that makes allocations fail, for the
 * sampled allocation-failure sweep against the running server.
 *
 *   GG_FAILMALLOC_EVERY=N   while armed, every N-th malloc, calloc or
 *                           growing realloc fails (with ENOMEM)
 *   GG_FAILMALLOC_REPORT=F  where the number of failed allocations is
 *                           written when the shim is disarmed
 *
 * SIGUSR2 arms the shim, SIGUSR1 disarms it: the server starts with every
 * allocation served, and the test decides which requests run under failures.
 * Only allocations called from the program itself (gpuguard, with jansson
 * and Lua linked in), libyaml and libc (strdup, asprintf ...) fail: the HTTP and TLS stack is left
 * alone (GMP aborts on a failed allocation by design, libtasn1 crashes), as the sweep is about what
 * gpuguard does with a request it has received.  Built as a shared object: see the Makefile.
 */
#include <errno.h>
#include <link.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);

static atomic_bool armed;
static atomic_long count, failed;
static long every;
static const char *report;
static char report_tmp[4096]; /* report with ".tmp": written there first */

/* Where the code of the targets lies, found once at start-up. */
#define MAX_TARGETS 16
static struct {
    uintptr_t start, end;
} targets[MAX_TARGETS];
static int n_targets;

static int find_targets(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    (void)arg;
    static const char *const names[] = {"libyaml", "libc.so"};
    bool target = !info->dlpi_name[0]; /* the program itself */
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        target = target || strstr(info->dlpi_name, names[i]);
    for (int h = 0; target && h < info->dlpi_phnum && n_targets < MAX_TARGETS; h++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[h];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            targets[n_targets].start = info->dlpi_addr + ph->p_vaddr;
            targets[n_targets].end = targets[n_targets].start + ph->p_memsz;
            n_targets++;
        }
    }
    return 0;
}

static bool is_target(const void *caller)
{
    uintptr_t a = (uintptr_t)caller;
    for (int i = 0; i < n_targets; i++)
        if (a >= targets[i].start && a < targets[i].end)
            return true;
    return false;
}

static bool inject_for(const void *caller)
{
    if (!atomic_load_explicit(&armed, memory_order_relaxed) || every <= 0 || !is_target(caller) ||
        atomic_fetch_add(&count, 1) % every != every - 1)
        return false;
    atomic_fetch_add(&failed, 1);
    errno = ENOMEM;
    return true;
}

#define inject() inject_for(__builtin_return_address(0))

void *malloc(size_t size)
{
    return inject() ? NULL : __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
    return inject() ? NULL : __libc_calloc(n, size);
}

void *realloc(void *p, size_t size)
{
    if (p && size <= malloc_usable_size(p))
        return __libc_realloc(p, size);
    return inject() ? NULL : __libc_realloc(p, size);
}

/* Signal handlers: only async-signal-safe calls. */
static void on_arm(int sig)
{
    (void)sig;
    atomic_store(&armed, true);
}

static void on_disarm(int sig)
{
    (void)sig;
    atomic_store(&armed, false);
    if (!report)
        return;
    int saved = errno; /* a signal handler must leave errno as it found it */
    char text[24];
    size_t n = sizeof(text);
    long v = atomic_load(&failed);
    text[--n] = '\n';
    do {
        text[--n] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n);
    /* Written beside it and renamed: the test reads the report as soon as it exists. */
    int fd = open(report_tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        ssize_t w = write(fd, text + n, sizeof(text) - n);
        (void)w;
        close(fd);
        rename(report_tmp, report);
    }
    errno = saved;
}

__attribute__((constructor)) static void failmalloc_init(void)
{
    const char *e = getenv("GG_FAILMALLOC_EVERY");
    every = e ? strtol(e, NULL, 10) : 0;
    report = getenv("GG_FAILMALLOC_REPORT");
    if (report && strlen(report) + sizeof(".tmp") > sizeof(report_tmp))
        report = NULL;
    if (report)
        strcat(strcpy(report_tmp, report), ".tmp");
    dl_iterate_phdr(find_targets, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_arm;
    sigaction(SIGUSR2, &sa, NULL);
    sa.sa_handler = on_disarm;
    sigaction(SIGUSR1, &sa, NULL);
}
