/*
 * tc_test.c - libtensorcast against real tensorcastd daemons, built under
 * AddressSanitizer (with its leak checker) and UBSan.
 *
 * usage: tc_test PATH-TO-TENSORCASTD
 *
 * It starts a daemon on a private socket and data directory, then two
 * daemons with a peer plane between them, and makes every call of the
 * library: the successful paths (checking the bytes moved), bad arguments
 * refused locally, the daemon's refusals (unknown batch, segment, block),
 * positional codes, malformed and mis-counted answers (through a relay
 * that corrupts them), timeouts, a shut-down connection, and daemons
 * killed while a call waits in them.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../src/codec.h" /* fuzz_answers drives the decoder directly */
#include "check.h"
#include "daemon.h"
#include "harness.h"
#include "tensorcast.h"

int check_failures;

const char *daemon_bin;
static tcd *live[4];

void fail_now(void)
{
    for (int i = 0; i < 4; i++)
        if (live[i]) {
            tcd_print_log(live[i]);
            tcd_stop(live[i]);
        }
    fprintf(stderr, "tc_test: FAILED\n");
    exit(1);
}

void start(tcd *d, const char *const *extra)
{
    REQUIRE(tcd_start(d, daemon_bin, extra) == 0);
    for (int i = 0; i < 4; i++)
        if (!live[i]) {
            live[i] = d;
            break;
        }
}

void forget(tcd *d)
{
    for (int i = 0; i < 4; i++)
        if (live[i] == d)
            live[i] = NULL;
}

/* stop stops a daemon that must exit cleanly. */
void stop(tcd *d)
{
    forget(d);
    int st = tcd_stop(d);
    CHECK(st == 0);
}

int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

tc_conn *dial(const char *socket, uint32_t call_timeout_ms)
{
    tc_options o;
    memset(&o, 0, sizeof o);
    o.socket = socket;
    o.name = "tc_test";
    o.call_timeout_ms = call_timeout_ms;
    tc_conn *c = NULL;
    int rc = tc_connect(&o, &c);
    if (rc) {
        fprintf(stderr, "connect %s: %s\n", socket, tc_strerror(rc));
        fail_now();
    }
    return c;
}

/* fill writes seed's xorshift64 pattern, the one every client of the
 * compatibility test writes. */
void fill(void *p, size_t n, uint64_t seed)
{
    uint8_t *b = p;
    uint64_t x = seed ? seed : 1;
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for (size_t j = 0; j < 8 && i + j < n; j++)
            b[i + j] = (uint8_t)(x >> (8 * j));
    }
}

int matches(const void *p, size_t n, uint64_t seed)
{
    uint8_t *want = malloc(n);
    REQUIRE(want);
    fill(want, n, seed);
    int ok = memcmp(p, want, n) == 0;
    free(want);
    return ok;
}

tc_request req(uint32_t op, tc_segment_id local, uint64_t loff, tc_segment_id target, uint64_t toff,
                      uint64_t len)
{
    tc_request r;
    memset(&r, 0, sizeof r);
    r.op = op;
    r.local = local;
    r.local_offset = loff;
    r.target = target;
    r.target_offset = toff;
    r.length = len;
    return r;
}

uint64_t counter(const tc_counters *g, const char *name)
{
    for (size_t i = 0; i < g->n; i++)
        if (strcmp(g->items[i].name, name) == 0)
            return g->items[i].value;
    return UINT64_MAX;
}

/* ---- blocked calls ------------------------------------------------------- */

/* A call made on its own thread, so the main thread can act while it waits
 * in the daemon. */
typedef struct waiter {
    pthread_t th;
    tc_conn *c;
    int kind; /* 0: tc_batch_wait, 1: tc_notify_poll */
    tc_batch_id batch;
    volatile pid_t tid;
    int rc;
    int64_t returned_ms;
} waiter;

static void *waiter_run(void *arg)
{
    waiter *w = arg;
    __atomic_store_n(&w->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    if (w->kind == 0) {
        tc_summary s;
        w->rc = tc_batch_wait(w->c, w->batch, 30000, &s, NULL);
    } else {
        tc_notification *n = NULL;
        size_t k = 0;
        w->rc = tc_notify_poll(w->c, 0, 30000, &n, &k, NULL);
        tc_free(n);
    }
    w->returned_ms = now_ms();
    return NULL;
}

int blocked_in(pid_t tid, long nr)
{
    char path[64], buf[128];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    if (buf[0] < '0' || buf[0] > '9')
        return 0; /* "running" */
    return strtol(buf, NULL, 10) == nr;
}

/* blocked_in_poll reports whether thread tid sleeps in poll(2) or ppoll(2):
 * the library's wait for an answer that has been sent. */
int blocked_in_poll(pid_t tid)
{
#ifdef SYS_poll
    if (blocked_in(tid, SYS_poll))
        return 1;
#endif
    return blocked_in(tid, SYS_ppoll);
}

/* start_waiter starts w and returns once its call is blocked waiting for
 * the daemon's answer (checked in /proc every millisecond, for up to 10 s). */
static void start_waiter(waiter *w)
{
    REQUIRE(pthread_create(&w->th, NULL, waiter_run, w) == 0);
    struct timespec ms = {0, 1000000};
    int64_t deadline = now_ms() + 10000;
    pid_t tid;
    while (!(tid = __atomic_load_n(&w->tid, __ATOMIC_ACQUIRE)) || !blocked_in_poll(tid)) {
        REQUIRE(now_ms() < deadline);
        nanosleep(&ms, NULL);
    }
}

/* ---- a relay that corrupts answers ---------------------------------------- */


/* Answers the daemons gave, recorded by relays: the seeds fuzz_answers
 * mutates. */
#define MAX_RECORDED 2048
static struct {
    uint8_t *frame;
    size_t len;
} recorded[MAX_RECORDED];
static int n_recorded;
static pthread_mutex_t recorded_mu = PTHREAD_MUTEX_INITIALIZER;

static void record(const uint8_t *f, size_t n)
{
    pthread_mutex_lock(&recorded_mu);
    if (n_recorded < MAX_RECORDED) {
        uint8_t *copy = malloc(n);
        if (copy) {
            memcpy(copy, f, n);
            recorded[n_recorded].frame = copy;
            recorded[n_recorded++].len = n;
        }
    }
    pthread_mutex_unlock(&recorded_mu);
}

static int relay_read(int fd, uint8_t **buf, size_t *len, int *fds, int *nfds)
{
    uint8_t hdr[4];
    size_t want = 4, got = 0;
    uint8_t *dst = hdr;
    *nfds = 0;
    for (int part = 0; part < 2; part++) {
        while (got < want) {
            struct iovec iov = {.iov_base = dst + got, .iov_len = want - got};
            union {
                char b[CMSG_SPACE(4 * sizeof(int))];
                struct cmsghdr a;
            } u;
            struct msghdr m;
            memset(&m, 0, sizeof m);
            m.msg_iov = &iov;
            m.msg_iovlen = 1;
            m.msg_control = u.b;
            m.msg_controllen = sizeof u.b;
            ssize_t r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
            if (r <= 0)
                return -1;
            for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
                if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
                    for (size_t i = 0; i < (h->cmsg_len - CMSG_LEN(0)) / sizeof(int) && *nfds < 4; i++)
                        memcpy(&fds[(*nfds)++], CMSG_DATA(h) + i * sizeof(int), sizeof(int));
            got += (size_t)r;
        }
        if (part == 0) {
            size_t body = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 | (size_t)hdr[3] << 24;
            *buf = malloc(4 + body + 16);
            if (!*buf)
                return -1;
            memcpy(*buf, hdr, 4);
            dst = *buf;
            want = 4 + body;
        }
    }
    *len = want;
    return 0;
}

static int relay_write(int fd, const uint8_t *buf, size_t len, const int *fds, int nfds)
{
    size_t off = 0;
    while (off < len) {
        struct iovec iov = {.iov_base = (void *)(buf + off), .iov_len = len - off};
        union {
            char b[CMSG_SPACE(4 * sizeof(int))];
            struct cmsghdr a;
        } u;
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        if (nfds > 0 && off == 0) {
            memset(&u, 0, sizeof u);
            m.msg_control = u.b;
            m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
            struct cmsghdr *h = CMSG_FIRSTHDR(&m);
            h->cmsg_level = SOL_SOCKET;
            h->cmsg_type = SCM_RIGHTS;
            h->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
            memcpy(CMSG_DATA(h), fds, (size_t)nfds * sizeof(int));
        }
        ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (r <= 0)
            return -1;
        off += (size_t)r;
    }
    return 0;
}

int unsealed_fd = -1;

void memfd_copy(int *fds, int nfds, long patch_at, uint32_t value, int seals)
{
    struct stat st;
    if (nfds < 1 || fstat(fds[0], &st) < 0)
        return;
    int fd = memfd_create("tc-test-copy", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, st.st_size) < 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    static uint8_t buf[1 << 16];
    for (off_t off = 0; off < st.st_size;) {
        ssize_t n = pread(fds[0], buf, sizeof buf, off);
        if (n <= 0 || pwrite(fd, buf, (size_t)n, off) != n)
            break;
        off += n;
    }
    if (patch_at >= 0 && pwrite(fd, &value, sizeof value, patch_at) != (ssize_t)sizeof value) {
        close(fd);
        return;
    }
    if (seals && fcntl(fd, F_ADD_SEALS, seals) < 0) {
        close(fd);
        return;
    }
    unsealed_fd = dup(fd);
    close(fds[0]);
    fds[0] = fd;
}

void unsealed_copy(int *fds, int nfds) { memfd_copy(fds, nfds, -1, 0, 0); }

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

static void *relay_run(void *arg)
{
    relay *r = arg;
    int cfd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0)
        return NULL;
    int ufd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", r->upstream);
    if (connect(ufd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(cfd);
        close(ufd);
        return NULL;
    }
    for (int k = 1;; k++) {
        uint8_t *f = NULL;
        size_t n;
        int fds[4], nfds = 0;
        if (relay_read(cfd, &f, &n, fds, &nfds) < 0)
            break;
        if (k == r->close_at) {
            close_fds(fds, nfds);
            free(f);
            break;
        }
        int bad = relay_write(ufd, f, n, fds, nfds);
        close_fds(fds, nfds);
        free(f);
        f = NULL;
        if (bad || relay_read(ufd, &f, &n, fds, &nfds) < 0) {
            free(f);
            break;
        }
        if (r->record)
            record(f, n);
        if (k == r->mutate_at && r->mutate) {
            size_t before = n;
            uint8_t *copy = malloc(n);
            if (copy)
                memcpy(copy, f, n);
            r->mutate(f, &n);
            r->mutated = copy && (n != before || memcmp(copy, f, n) != 0);
            free(copy);
        }
        if (k == r->mutate_at && r->mutate_fds)
            r->mutate_fds(fds, nfds);
        bad = relay_write(cfd, f, n, fds, nfds);
        close_fds(fds, nfds);
        free(f);
        if (bad)
            break;
    }
    close(cfd);
    close(ufd);
    return NULL;
}

void relay_start(relay *r, const char *dir, const char *upstream)
{
    snprintf(r->path, sizeof r->path, "%s/relay.sock", dir);
    unlink(r->path);
    r->upstream = upstream;
    r->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", r->path);
    REQUIRE(r->lfd >= 0 && bind(r->lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(r->lfd, 4) == 0);
    REQUIRE(pthread_create(&r->th, NULL, relay_run, r) == 0);
}

void relay_join(relay *r)
{
    pthread_join(r->th, NULL);
    close(r->lfd);
    unlink(r->path);
}

/* find finds the bytes pat in f. */
static uint8_t *find(uint8_t *f, size_t n, const uint8_t *pat, size_t pn)
{
    for (size_t i = 0; i + pn <= n; i++)
        if (memcmp(f + i, pat, pn) == 0)
            return f + i;
    return NULL;
}

/* The Submit answer the relay tests provoke: codes OK, NOT_FOUND, OK,
 * NOT_FOUND, OK, a vector of 5. */
static const uint8_t five_codes[] = {5, 0, 0, 0, 0, 2, 0, 2, 0};

void short_codes(uint8_t *f, size_t *n)
{
    uint8_t *p = find(f, *n, five_codes, sizeof five_codes);
    if (p)
        p[0] = 4;
}

void long_codes(uint8_t *f, size_t *n)
{
    uint8_t *p = find(f, *n, five_codes, sizeof five_codes);
    if (p)
        p[0] = 6;
}

static void bad_root(uint8_t *f, size_t *n)
{
    (void)n;
    f[4] = 0xf0, f[5] = 0xff, f[6] = 0xff, f[7] = 0x7f;
}

static void huge_frame(uint8_t *f, size_t *n)
{
    f[0] = 0xff, f[1] = 0xff, f[2] = 0xff, f[3] = 0x7f;
    *n = 4;
}

uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* field returns where field slot of the table at t lies in f (n bytes), or
 * NULL when absent: a minimal flatbuffers reader for the relay's edits. */
uint8_t *field(uint8_t *f, size_t n, uint8_t *t, int slot)
{
    int32_t so = (int32_t)get32(t);
    uint8_t *vt = t - so;
    if (vt < f + 4 || vt + 4 > f + n)
        return NULL;
    uint16_t vsize = (uint16_t)(vt[0] | vt[1] << 8);
    if (4 + 2 * slot + 2 > vsize)
        return NULL;
    uint16_t off = (uint16_t)(vt[4 + 2 * slot] | vt[5 + 2 * slot] << 8);
    return off ? t + off : NULL;
}

/* newer_version makes Hello's answer speak protocol version 2. */
static void newer_version(uint8_t *f, size_t *n)
{
    uint8_t *root = f + 4 + get32(f + 4);
    uint8_t *body = field(f, *n, root, 3); /* Response.body */
    if (!body)
        return;
    uint8_t *hello = body + get32(body);
    uint8_t *pv = field(f, *n, hello, 0); /* HelloResponse.protocol_version */
    if (pv && get32(pv) == TC_PROTOCOL_VERSION)
        put32(pv, TC_PROTOCOL_VERSION + 1);
}

static void truncated(uint8_t *f, size_t *n)
{
    /* A shorter frame that says so: the verifier sees offsets past it. */
    size_t body = *n / 2 - 4;
    f[0] = (uint8_t)body, f[1] = (uint8_t)(body >> 8), f[2] = (uint8_t)(body >> 16), f[3] = (uint8_t)(body >> 24);
    *n = 4 + body;
}

/* ---- tests --------------------------------------------------------------- */

static void test_connect_errors(const tcd *d)
{
    tc_conn *c = (tc_conn *)1;
    CHECK_RC(tc_connect(NULL, NULL), TC_INVALID_ARGUMENT);

    tc_options o;
    memset(&o, 0, sizeof o);
    char path[100];
    snprintf(path, sizeof path, "%s/absent.sock", d->dir);
    o.socket = path;
    errno = 0;
    CHECK_RC(tc_connect(&o, &c), TC_ESYS);
    CHECK(errno == ENOENT);
    CHECK(c == NULL);

    char longp[200];
    memset(longp, 'x', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    o.socket = longp;
    CHECK_RC(tc_connect(&o, &c), TC_INVALID_ARGUMENT);

    /* A listener that never answers: the connect timeout bounds Hello. */
    snprintf(path, sizeof path, "%s/mute.sock", d->dir);
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    REQUIRE(l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(l, 4) == 0);
    o.socket = path;
    o.connect_timeout_ms = 200;
    int64_t t0 = now_ms();
    CHECK_RC(tc_connect(&o, &c), TC_ETIMEDOUT);
    int64_t took = now_ms() - t0;
    CHECK(took >= 190 && took < 5000);
    CHECK(c == NULL);
    close(l);
    unlink(path);

    /* $TENSORCAST_SOCKET is the default socket. */
    setenv("TENSORCAST_SOCKET", d->socket, 1);
    CHECK_RC(tc_connect(NULL, &c), TC_OK);
    unsetenv("TENSORCAST_SOCKET");
    CHECK(c != NULL && strcmp(tc_hello_info(c)->version, "") != 0);
    tc_close(c);
    tc_close(NULL);

    CHECK(strcmp(tc_strerror(TC_OK), "OK") == 0);
    CHECK(strcmp(tc_strerror(TC_NOT_FOUND), "not found") == 0);
    CHECK(strcmp(tc_strerror(TC_ECLOSED), "connection closed") == 0);
    CHECK(strcmp(tc_strerror(12345), "unknown tensorcast code") == 0);
}

static void test_hello_pool(tc_conn *c)
{
    const tc_hello *h = tc_hello_info(c);
    CHECK(h->protocol_version == TC_PROTOCOL_VERSION);
    CHECK(h->daemon_id && *h->daemon_id);
    CHECK(h->peer_addr && *h->peer_addr == 0);
    CHECK(h->limits.max_frame == 1u << 20);
    CHECK(h->limits.max_batch_capacity > 0 && h->limits.max_requests > 0 && h->limits.max_blocks > 0);

    const tc_pool *p = tc_pool_info(c);
    CHECK(p->segment != 0);
    CHECK(p->size == 32u << 20);
    CHECK(p->base != NULL);
    REQUIRE(p->n_block_classes > 0);
    for (size_t i = 1; i < p->n_block_classes; i++)
        CHECK(p->block_classes[i] > p->block_classes[i - 1]);
    struct stat st;
    CHECK(fstat(p->fd, &st) == 0 && (uint64_t)st.st_size >= p->size);
}

static void test_ping(tc_conn *c)
{
    CHECK_RC(tc_ping(c, NULL, 0, NULL), TC_OK);
    CHECK_RC(tc_ping(c, "x", 1, NULL), TC_OK);
    static uint8_t big[60000];
    fill(big, sizeof big, 7);
    CHECK_RC(tc_ping(c, big, sizeof big, NULL), TC_OK);
    CHECK_RC(tc_ping(c, NULL, 3, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_ping(NULL, "x", 1, NULL), TC_INVALID_ARGUMENT);
    /* Past the daemon's max_frame: refused here, the connection still good. */
    size_t huge = (2u << 20);
    void *hp = calloc(1, huge);
    REQUIRE(hp);
    CHECK_RC(tc_ping(c, hp, huge, NULL), TC_RESOURCE_EXHAUSTED);
    free(hp);
    CHECK_RC(tc_ping(c, "y", 1, NULL), TC_OK);
    tc_call_opts o;
    memset(&o, 0, sizeof o);
    o.lane = "stream-first";
    o.policy_version = 3;
    o.qos = 1;
    o.deadline_ms = 1000;
    CHECK_RC(tc_ping(c, "z", 1, &o), TC_OK);
}

static void test_blocks(tc_conn *c)
{
    const tc_pool *p = tc_pool_info(c);
    uint64_t offs[4];
    CHECK_RC(tc_blocks_alloc(c, 4, 64 << 10, offs, NULL), TC_OK);
    for (int i = 0; i < 4; i++) {
        CHECK(offs[i] + (64 << 10) <= p->size);
        for (int j = 0; j < i; j++)
            CHECK(offs[i] != offs[j]);
        memset((uint8_t *)p->base + offs[i], i + 1, 64 << 10);
    }
    CHECK_RC(tc_blocks_alloc(c, 0, 4096, offs, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_blocks_alloc(c, 1, 0, offs, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_blocks_alloc(c, 1, 4096, NULL, NULL), TC_INVALID_ARGUMENT);
    /* More than the pool holds: all or nothing. */
    uint64_t one;
    CHECK_RC(tc_blocks_alloc(c, 1, 1ull << 40, &one, NULL), TC_RESOURCE_EXHAUSTED);

    uint64_t fr[3] = {offs[0], 12345, offs[1]};
    int codes[3] = {-9, -9, -9};
    CHECK_RC(tc_blocks_free(c, fr, 3, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_NOT_FOUND && codes[2] == TC_OK);
    CHECK_RC(tc_blocks_free(c, fr, 1, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_NOT_FOUND);
    CHECK_RC(tc_blocks_free(c, fr, 0, codes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_blocks_free(c, NULL, 1, codes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_blocks_free(c, fr, 1, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_blocks_free(c, offs + 2, 2, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_OK);

    /* Idempotency: a retry with the key gets the first answer; other
     * arguments with it are refused. */
    tc_call_opts o;
    memset(&o, 0, sizeof o);
    o.idempotency_key = "alloc-1";
    uint64_t a[2], b[2];
    CHECK_RC(tc_blocks_alloc(c, 2, 4096, a, &o), TC_OK);
    CHECK_RC(tc_blocks_alloc(c, 2, 4096, b, &o), TC_OK);
    CHECK(a[0] == b[0] && a[1] == b[1]);
    CHECK_RC(tc_blocks_alloc(c, 3, 4096, b, &o), TC_FAILED_PRECONDITION);
    CHECK_RC(tc_blocks_free(c, a, 2, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_OK);
}

int provides(const char *feature)
{
    const char *p = getenv("TENSORCAST_TEST_PROVIDES");
    size_t n = strlen(feature);
    while (p && *p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, feature, n) == 0)
            return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

static void test_buffers(tc_conn *c, const tcd *d)
{
    tc_buffer *b = NULL;
    CHECK_RC(tc_buffer_create(c, 0, &b, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_buffer_create(c, 4096, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_buffer_create(c, 1 << 20, &b, NULL), TC_OK);
    REQUIRE(b != NULL);
    CHECK(b->id != 0 && b->size == 1 << 20 && b->fd >= 0);
    CHECK(fcntl(b->fd, F_GET_SEALS) == (F_SEAL_SHRINK | F_SEAL_GROW));
    fill(b->data, b->size, 11);

    tc_segment_id seg = 0;
    uint64_t off = 0;
    CHECK_RC(tc_locate(c, (uint8_t *)b->data + 100, 10, &seg, &off), TC_OK);
    CHECK(seg == b->id && off == 100);
    CHECK_RC(tc_locate(c, (uint8_t *)b->data + b->size - 10, 11, &seg, &off), TC_NOT_FOUND);
    CHECK_RC(tc_locate(c, (uint8_t *)b->data + b->size, 0, &seg, &off), TC_OK);
    CHECK(seg == b->id && off == b->size);
    const tc_pool *p = tc_pool_info(c);
    CHECK_RC(tc_locate(c, (uint8_t *)p->base + 4096, 4096, &seg, &off), TC_OK);
    CHECK(seg == p->segment && off == 4096);
    int local;
    CHECK_RC(tc_locate(c, &local, sizeof local, &seg, &off), TC_NOT_FOUND);
    CHECK_RC(tc_locate(c, NULL, 1, &seg, &off), TC_INVALID_ARGUMENT);

    /* A buffer of 2 MiB or more starts on a 2 MiB boundary, its whole 2
     * MiB spans on transparent huge pages (as the pool's are), and zero. */
    tc_buffer *h = NULL;
    const uint64_t hsize = (5 << 20) + 4096;
    CHECK_RC(tc_buffer_create(c, hsize, &h, NULL), TC_OK);
    REQUIRE(h != NULL);
    CHECK((uintptr_t)h->data % (2 << 20) == 0);
    if (h->huge == 0 && !provides("thp"))
        fprintf(stderr, "tc_test: skipped the 2 MiB pages of a buffer: needs thp (MADV_COLLAPSE on a memfd, "
                        "Linux 6.1; TENSORCAST_TEST_PROVIDES does not list it)\n");
    else
        CHECK(h->huge == 4 << 20);
    int zero = 1;
    for (uint64_t i = 0; i < hsize; i++)
        zero &= ((const uint8_t *)h->data)[i] == 0;
    CHECK(zero);
    fill(h->data, h->size, 12);
    CHECK_RC(tc_buffer_destroy(c, h, NULL), TC_OK);

    /* A memfd of the caller's own: sealable, the daemon seals it against
     * shrinking as it registers it (the owner's shrink then fails); one
     * that cannot be sealed registers unsealed; a file on disk is not
     * memory. */
    int fd = memfd_create("tc-test-own", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    REQUIRE(fd >= 0 && ftruncate(fd, 65536) == 0);
    tc_segment_id own = 0;
    CHECK_RC(tc_buffer_register_fd(c, fd, 65536, &own, NULL), TC_OK);
    CHECK(own != 0 && own != b->id);
    CHECK((fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK) != 0);
    CHECK(ftruncate(fd, 4096) < 0 && errno == EPERM);
    int raw = memfd_create("tc-test-raw", MFD_CLOEXEC);
    REQUIRE(raw >= 0 && ftruncate(raw, 65536) == 0);
    tc_segment_id raw_id = 0;
    CHECK_RC(tc_buffer_register_fd(c, raw, 65536, &raw_id, NULL), TC_OK);
    CHECK_RC(tc_segment_unregister(c, raw_id, NULL), TC_OK);
    close(raw);
    char disk[100];
    snprintf(disk, sizeof disk, "%s/not-memory.bin", d->data);
    int df = open(disk, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(df >= 0 && ftruncate(df, 65536) == 0);
    tc_segment_id disk_id;
    struct statfs dfs;
    REQUIRE(fstatfs(df, &dfs) == 0);
    if (dfs.f_type != TMPFS_MAGIC) /* a /tmp in memory holds no file on disk */
        CHECK_RC(tc_buffer_register_fd(c, df, 65536, &disk_id, NULL), TC_INVALID_ARGUMENT);
    close(df);
    unlink(disk);
    CHECK_RC(tc_buffer_register_fd(c, fd, 1 << 20, &own, NULL), TC_INVALID_ARGUMENT); /* past its end */
    CHECK_RC(tc_buffer_register_fd(c, -1, 4096, &own, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_buffer_register_fd(c, fd, 0, &own, NULL), TC_INVALID_ARGUMENT);
    int pfd[2];
    REQUIRE(pipe2(pfd, O_CLOEXEC) == 0);
    tc_segment_id pipe_id;
    CHECK_RC(tc_buffer_register_fd(c, pfd[0], 4096, &pipe_id, NULL), TC_INVALID_ARGUMENT);
    close(pfd[0]);
    close(pfd[1]);
    CHECK_RC(tc_buffer_register_fd(c, pfd[0], 4096, &pipe_id, NULL), TC_INVALID_ARGUMENT); /* closed fd */
    close(fd);
    CHECK_RC(tc_ping(c, NULL, 0, NULL), TC_OK);

    CHECK_RC(tc_segment_unregister(c, own, NULL), TC_OK);
    CHECK_RC(tc_segment_unregister(c, own, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_segment_unregister(c, b->id, NULL), TC_INVALID_ARGUMENT);

    /* A file under the daemon's data_dir. */
    char path[100];
    snprintf(path, sizeof path, "%s/file.bin", d->data);
    int ff = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(ff >= 0 && ftruncate(ff, 1 << 20) == 0);
    close(ff);
    tc_segment_id file = 0;
    uint64_t fsize = 0;
    CHECK_RC(tc_file_register(c, path, 0, 0, &file, &fsize, NULL), TC_OK);
    CHECK(file != 0 && fsize == 1 << 20);
    /* buffer -> file -> pool block, then the block's bytes */
    uint64_t blk;
    CHECK_RC(tc_blocks_alloc(c, 1, 256 << 10, &blk, NULL), TC_OK);
    tc_request rq[1] = {req(TC_OP_WRITE, b->id, 4096, file, 8192, 256 << 10)};
    int codes[2];
    CHECK_RC(tc_transfer(c, rq, 1, NULL, 5000, codes, NULL, NULL, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    rq[0] = req(TC_OP_READ, p->segment, blk, file, 8192, 256 << 10);
    CHECK_RC(tc_transfer(c, rq, 1, NULL, 5000, codes, NULL, NULL, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    CHECK(memcmp((uint8_t *)p->base + blk, (uint8_t *)b->data + 4096, 256 << 10) == 0);
    CHECK_RC(tc_blocks_free(c, &blk, 1, codes, NULL), TC_OK);

    /* An absent file is created at the size asked; with none, it has none. */
    snprintf(path, sizeof path, "%s/absent.bin", d->data);
    unlink(path);
    CHECK_RC(tc_file_register(c, path, 0, 0, &file, NULL, NULL), TC_INVALID_ARGUMENT);
    tc_segment_id made;
    CHECK_RC(tc_file_register(c, path, 0, 65536, &made, &fsize, NULL), TC_OK);
    CHECK(fsize == 65536);
    CHECK_RC(tc_segment_unregister(c, made, NULL), TC_OK);
    snprintf(path, sizeof path, "%s/no-dir/x.bin", d->data);
    CHECK_RC(tc_file_register(c, path, 0, 65536, &made, NULL, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_file_register(c, "/etc/hostname", 0, 0, &file, NULL, NULL), TC_PERMISSION_DENIED);
    CHECK_RC(tc_file_register(c, "", 0, 0, &file, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_segment_unregister(c, file, NULL), TC_OK);

    tc_buffer fake = *b;
    CHECK_RC(tc_buffer_destroy(c, &fake, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);
}

static void test_batches(tc_conn *c)
{
    const tc_pool *p = tc_pool_info(c);
    const tc_hello *h = tc_hello_info(c);
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 1 << 20, &b, NULL) == TC_OK);
    fill(b->data, b->size, 21);
    uint64_t blk[2];
    REQUIRE(tc_blocks_alloc(c, 2, 128 << 10, blk, NULL) == TC_OK);
    /* A page of the pool this connection does not hold. */
    uint64_t foreign = p->size - 4096;
    while (foreign >= 4096 && ((foreign >= blk[0] && foreign < blk[0] + (128 << 10)) ||
                               (foreign >= blk[1] && foreign < blk[1] + (128 << 10))))
        foreign -= 4096;

    tc_batch_id batch = 0;
    CHECK_RC(tc_batch_alloc(c, 0, &batch, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_batch_alloc(c, 4, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_batch_alloc(c, h->limits.max_batch_capacity + 1, &batch, NULL), TC_RESOURCE_EXHAUSTED);
    CHECK_RC(tc_batch_alloc(c, 8, &batch, NULL), TC_OK);

    tc_request rq[6] = {
        req(TC_OP_WRITE, b->id, 0, p->segment, blk[0], 128 << 10),      /* OK */
        req(TC_OP_WRITE, 999999, 0, p->segment, blk[1], 4096),          /* unknown segment */
        req(TC_OP_WRITE, b->id, 0, p->segment, blk[1], 0),              /* zero length */
        req(9, b->id, 0, p->segment, blk[1], 4096),                     /* no such op */
        req(TC_OP_WRITE, b->id, 0, p->segment, foreign, 4096),          /* a block it does not hold */
        req(TC_OP_READ, b->id, 512 << 10, p->segment, blk[0], 64 << 10) /* OK */
    };
    int codes[6];
    for (int i = 0; i < 6; i++)
        codes[i] = -99;
    CHECK_RC(tc_batch_submit(c, batch, rq, 5, NULL, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    CHECK(codes[1] == TC_NOT_FOUND);
    CHECK(codes[2] == TC_INVALID_ARGUMENT);
    CHECK(codes[3] == TC_INVALID_ARGUMENT);
    CHECK(codes[4] == TC_PERMISSION_DENIED);
    CHECK(codes[5] == -99);

    tc_summary s;
    memset(&s, 0, sizeof s);
    CHECK_RC(tc_batch_wait(c, batch, 5000, &s, NULL), TC_OK);
    CHECK(s.waiting + s.pending == 0);
    CHECK(s.completed == 1);
    CHECK(s.transferred == 128 << 10);
    CHECK(memcmp((uint8_t *)p->base + blk[0], b->data, 128 << 10) == 0);

    tc_task_info t;
    CHECK_RC(tc_task_status(c, batch, 0, &t, NULL), TC_OK);
    CHECK(t.state == TC_TASK_COMPLETED && t.code == TC_OK && t.transferred == 128 << 10);
    /* A refused request took its task index, ended Failed. (The daemon's
     * task status does not keep the code Submit gave it.) */
    CHECK_RC(tc_task_status(c, batch, 1, &t, NULL), TC_OK);
    CHECK(t.state == TC_TASK_FAILED && t.code != TC_OK && t.transferred == 0);
    CHECK_RC(tc_task_status(c, batch, 4, &t, NULL), TC_OK);
    CHECK(t.state == TC_TASK_FAILED && t.code != TC_OK && t.transferred == 0);
    CHECK(tc_task_status(c, batch, 77, &t, NULL) > 0); /* no such task: the daemon refuses */
    CHECK_RC(tc_task_status(c, batch, 0, NULL, NULL), TC_INVALID_ARGUMENT);

    /* a second submit to the same batch: the READ back */
    CHECK_RC(tc_batch_submit(c, batch, rq + 5, 1, NULL, codes, NULL), TC_OK);
    CHECK(codes[0] == TC_OK);
    CHECK_RC(tc_batch_wait(c, batch, 5000, &s, NULL), TC_OK);
    CHECK(s.total == 6 && s.completed == 2 && s.waiting + s.pending == 0);
    CHECK(memcmp((uint8_t *)b->data + (512 << 10), b->data, 64 << 10) == 0);
    tc_summary s2;
    CHECK_RC(tc_batch_status(c, batch, &s2, NULL), TC_OK);
    CHECK(memcmp(&s, &s2, sizeof s) == 0);

    CHECK_RC(tc_batch_submit(c, batch, NULL, 1, NULL, codes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_batch_submit(c, batch, rq, 0, NULL, codes, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_batch_submit(c, batch, rq, 1, NULL, NULL, NULL), TC_INVALID_ARGUMENT);
    tc_notify big = {"x", TC_MAX_NOTIFY + 1};
    CHECK_RC(tc_batch_submit(c, batch, rq, 1, &big, codes, NULL), TC_INVALID_ARGUMENT);
    tc_notify nul = {NULL, 3};
    CHECK_RC(tc_batch_submit(c, batch, rq, 1, &nul, codes, NULL), TC_INVALID_ARGUMENT);

    CHECK_RC(tc_batch_free(c, batch, NULL), TC_OK);
    /* the batch is gone */
    CHECK_RC(tc_batch_free(c, batch, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_batch_status(c, batch, &s, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_batch_wait(c, batch, 100, &s, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_task_status(c, batch, 0, &t, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_batch_submit(c, batch, rq, 1, NULL, codes, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_batch_status(c, 424242, &s, NULL), TC_NOT_FOUND);

    /* One shot: positional codes and states. */
    memset(b->data, 0, 64 << 10);
    tc_request one[3] = {
        req(TC_OP_READ, b->id, 0, p->segment, blk[0], 64 << 10),
        req(TC_OP_READ, 999999, 0, p->segment, blk[0], 64 << 10),
        req(TC_OP_WRITE, b->id, 256 << 10, p->segment, blk[1], 32 << 10),
    };
    int states[3];
    memset(&s, 0, sizeof s);
    CHECK_RC(tc_transfer(c, one, 3, NULL, 5000, codes, states, &s, NULL), TC_OK);
    CHECK(codes[0] == TC_OK && codes[1] == TC_NOT_FOUND && codes[2] == TC_OK);
    CHECK(states[0] == TC_TASK_COMPLETED && states[1] == TC_TASK_INVALID && states[2] == TC_TASK_COMPLETED);
    CHECK(s.completed == 2 && s.transferred == (64 << 10) + (32 << 10));
    CHECK(matches(b->data, 64 << 10, 21));
    CHECK(memcmp((uint8_t *)p->base + blk[1], (uint8_t *)b->data + (256 << 10), 32 << 10) == 0);
    CHECK_RC(tc_transfer(c, one, 0, NULL, 5000, codes, NULL, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_transfer(c, one, 1, &big, 5000, codes, NULL, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_transfer(c, one, 1, NULL, 5000, NULL, NULL, NULL, NULL), TC_INVALID_ARGUMENT);
    /* A notification without a peer plane: the daemon refuses it in place. */
    tc_notify nt[2] = {{"note", 4}, {NULL, 0}};
    CHECK_RC(tc_transfer(c, one, 2, nt, 5000, codes, states, NULL, NULL), TC_OK);
    CHECK(codes[0] == TC_UNAVAILABLE && codes[1] == TC_NOT_FOUND);

    int fc[2];
    CHECK_RC(tc_blocks_free(c, blk, 2, fc, NULL), TC_OK);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);
}

static void test_stats(tc_conn *c)
{
    uint64_t blk[3];
    REQUIRE(tc_blocks_alloc(c, 3, 4096, blk, NULL) == TC_OK);
    tc_batch_id batch;
    REQUIRE(tc_batch_alloc(c, 2, &batch, NULL) == TC_OK);
    tc_stats *s = NULL;
    CHECK_RC(tc_stats_get(c, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_stats_get(c, &s, NULL), TC_OK);
    REQUIRE(s);
    CHECK(counter(&s->connection, "blocks") == 3);
    CHECK(counter(&s->connection, "batches") == 1);
    CHECK(counter(&s->pool, "size") == 32u << 20);
    CHECK(s->engine.n > 0);
    CHECK(s->connections >= 1);
    tc_free(s);
    int codes[3];
    CHECK_RC(tc_blocks_free(c, blk, 3, codes, NULL), TC_OK);
    CHECK_RC(tc_batch_free(c, batch, NULL), TC_OK);
    tc_free(NULL);
}

/* Threads sharing one connection: every call gets its own answer. */
typedef struct sharer {
    tc_conn *c;
    int failures;
    pthread_t th;
} sharer;

static void *share_run(void *arg)
{
    sharer *s = arg;
    char payload[32];
    for (int i = 0; i < 200; i++) {
        snprintf(payload, sizeof payload, "%p-%d", (void *)s, i);
        if (tc_ping(s->c, payload, strlen(payload), NULL) != TC_OK)
            s->failures++;
        uint64_t off;
        int code;
        if (tc_blocks_alloc(s->c, 1, 4096, &off, NULL) != TC_OK ||
            tc_blocks_free(s->c, &off, 1, &code, NULL) != TC_OK || code != TC_OK)
            s->failures++;
    }
    return NULL;
}

static void test_threads(tc_conn *c)
{
    sharer s[4];
    for (int i = 0; i < 4; i++) {
        s[i].c = c;
        s[i].failures = 0;
        REQUIRE(pthread_create(&s[i].th, NULL, share_run, &s[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(s[i].th, NULL);
        CHECK(s[i].failures == 0);
    }
    tc_stats *st;
    CHECK_RC(tc_stats_get(c, &st, NULL), TC_OK);
    if (st)
        CHECK(counter(&st->connection, "blocks") == 0);
    tc_free(st);
}

/* An answer that fails its checks breaks the connection; later calls say
 * so. */
static void relay_case(const tcd *d, int at, void (*mutate)(uint8_t *, size_t *), int close_at, int want)
{
    relay r;
    memset(&r, 0, sizeof r);
    r.mutate_at = at;
    r.mutate = mutate;
    r.close_at = close_at;
    relay_start(&r, d->dir, d->socket);
    tc_conn *c = dial(r.path, 5000);
    int rc;
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 65536, &b, NULL) == TC_OK); /* request 3 */
    if (at == 4 && (mutate == short_codes || mutate == long_codes)) {
        tc_request rq[5];
        for (int i = 0; i < 5; i++)
            rq[i] = req(TC_OP_WRITE, i % 2 ? 999999 : b->id, 0, b->id, 4096, 128);
        int codes[5];
        rc = tc_transfer(c, rq, 5, NULL, 5000, codes, NULL, NULL, NULL); /* request 4 */
    } else {
        rc = tc_ping(c, "ping", 4, NULL); /* request 4 */
    }
    CHECK_RC(rc, want);
    if (mutate)
        CHECK(r.mutated);
    CHECK_RC(tc_ping(c, "again", 5, NULL), TC_ECLOSED);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_ECLOSED); /* released all the same */
    tc_close(c);
    relay_join(&r);
}

/* unknown_status makes a refusal's status one past TC_INTERNAL. */
static void unknown_status(uint8_t *f, size_t *n)
{
    uint8_t *root = f + 4 + get32(f + 4);
    uint8_t *st = field(f, *n, root, 0); /* Response.status, absent when OK */
    if (st && *st != TC_OK)
        *st = TC_INTERNAL + 1;
}

/* unknown_item_code makes the five-code answer's second code 200. */
static void unknown_item_code(uint8_t *f, size_t *n)
{
    uint8_t *p = find(f, *n, five_codes, sizeof five_codes);
    if (p)
        p[5] = 200;
}

/* Codes the protocol does not name: a status fails the call with
 * TC_EPROTO and breaks the connection; a per-item code is TC_EPROTO. */
static void test_unknown_codes(const tcd *d)
{
    relay r;
    memset(&r, 0, sizeof r);
    r.mutate_at = 3;
    r.mutate = unknown_status;
    relay_start(&r, d->dir, d->socket);
    tc_conn *c = dial(r.path, 5000);
    tc_summary sum;
    CHECK_RC(tc_batch_status(c, 999999, &sum, NULL), TC_EPROTO); /* request 3: NOT_FOUND */
    CHECK(r.mutated);
    CHECK_RC(tc_ping(c, "again", 5, NULL), TC_ECLOSED);
    tc_close(c);
    relay_join(&r);

    memset(&r, 0, sizeof r);
    r.mutate_at = 4;
    r.mutate = unknown_item_code;
    relay_start(&r, d->dir, d->socket);
    c = dial(r.path, 5000);
    tc_buffer *b;
    REQUIRE(tc_buffer_create(c, 65536, &b, NULL) == TC_OK); /* request 3 */
    tc_request rq[5];
    for (int i = 0; i < 5; i++)
        rq[i] = req(TC_OP_WRITE, i % 2 ? 999999 : b->id, 0, b->id, 4096, 128);
    int codes[5];
    CHECK_RC(tc_transfer(c, rq, 5, NULL, 5000, codes, NULL, NULL, NULL), TC_OK); /* request 4 */
    CHECK(r.mutated);
    CHECK(codes[0] == TC_OK && codes[1] == TC_EPROTO && codes[2] == TC_OK && codes[3] == TC_NOT_FOUND);
    CHECK_RC(tc_buffer_destroy(c, b, NULL), TC_OK);
    tc_close(c);
    relay_join(&r);
}

/* zero_request_id makes an answer's request id 0: an OK answer that
 * says it answers no request. */
static void zero_request_id(uint8_t *f, size_t *n)
{
    uint8_t *root = f + 4 + get32(f + 4);
    uint8_t *id = field(f, *n, root, 4); /* Response.request_id, a u64 */
    if (id)
        memset(id, 0, 8);
}

static void test_bad_answers(const tcd *d)
{
    test_unknown_codes(d);
    /* Request id 0 is for refusals only: an OK answer with it is none. */
    relay_case(d, 4, zero_request_id, 0, TC_EPROTO);
    /* The five-code answer, one short and one long: the whole call fails. */
    relay_case(d, 4, short_codes, 0, TC_EPROTO);
    relay_case(d, 4, long_codes, 0, TC_EPROTO);
    relay_case(d, 4, bad_root, 0, TC_EPROTO);
    relay_case(d, 4, huge_frame, 0, TC_EPROTO);
    relay_case(d, 4, truncated, 0, TC_EPROTO);
    /* The daemon going away before answering. */
    relay_case(d, 0, NULL, 4, TC_ECLOSED);

    /* A corrupt answer during connect: nothing left open. */
    relay r;
    memset(&r, 0, sizeof r);
    r.mutate_at = 2; /* PoolInfo's answer, with the pool's fd */
    r.mutate = bad_root;
    relay_start(&r, d->dir, d->socket);
    tc_options o;
    memset(&o, 0, sizeof o);
    o.socket = r.path;
    tc_conn *c = (tc_conn *)1;
    CHECK_RC(tc_connect(&o, &c), TC_EPROTO);
    CHECK(c == NULL);
    relay_join(&r);

    /* A pool not sealed against shrinking: refused, since a truncation of
     * it would fault every later touch of the mapping. */
    memset(&r, 0, sizeof r);
    r.mutate_at = 2;
    r.mutate_fds = unsealed_copy;
    relay_start(&r, d->dir, d->socket);
    o.socket = r.path;
    c = (tc_conn *)1;
    int rc = tc_connect(&o, &c);
    if (rc == TC_OK) {
        /* Taken: the copy shrinks, and the next touch of the pool faults. */
        REQUIRE(unsealed_fd >= 0 && ftruncate(unsealed_fd, 0) == 0);
        volatile uint8_t *base = tc_pool_info(c)->base;
        (void)base[0];
        tc_close(c);
    }
    CHECK_RC(rc, TC_EPROTO);
    CHECK(c == NULL);
    relay_join(&r);
    CHECK(unsealed_fd >= 0);
    close(unsealed_fd);
    unsealed_fd = -1;

    /* A daemon of another protocol version. */
    memset(&r, 0, sizeof r);
    r.mutate_at = 1;
    r.mutate = newer_version;
    relay_start(&r, d->dir, d->socket);
    o.socket = r.path;
    c = (tc_conn *)1;
    CHECK_RC(tc_connect(&o, &c), TC_EVERSION);
    CHECK(r.mutated);
    CHECK(c == NULL);
    relay_join(&r);
}

/* A daemon that denies this process's uid refuses the connection (an
 * answer to no request); connect says so. (allowed_uids alone would not:
 * root and the daemon's own uid always get in unless denied_uids names
 * them.) */
static void test_refused(void)
{
    char dir[] = "/tmp/tc-ctest-cfg-XXXXXX";
    REQUIRE(mkdtemp(dir));
    char cfg[64];
    snprintf(cfg, sizeof cfg, "%s/tc.toml", dir);
    FILE *f = fopen(cfg, "w");
    REQUIRE(f);
    fprintf(f, "denied_uids = [%u]\nmetrics_address = \"off\"\n", (unsigned)getuid());
    fclose(f);
    const char *args[] = {"--config", cfg, NULL};
    tcd d;
    start(&d, args);
    tc_options o;
    memset(&o, 0, sizeof o);
    o.socket = d.socket;
    tc_conn *c = (tc_conn *)1;
    CHECK_RC(tc_connect(&o, &c), TC_PERMISSION_DENIED);
    CHECK(c == NULL);
    stop(&d);
    unlink(cfg);
    rmdir(dir);
}

static volatile sig_atomic_t interrupts;

static void on_usr1(int sig)
{
    (void)sig;
    interrupts++;
}

typedef struct poller {
    tc_conn *c;
    int rc;
    size_t n;
    volatile int done;
} poller;

static void *poll_300ms(void *arg)
{
    poller *p = arg;
    tc_notification *ns = NULL;
    p->rc = tc_notify_poll(p->c, 0, 300, &ns, &p->n, NULL);
    tc_free(ns);
    __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Signals without SA_RESTART land on a thread waiting in the library: its
 * system calls see EINTR, and the call still ends as the daemon answers,
 * at its own timeout. */
static void test_eintr(const tcd *d)
{
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1; /* no SA_RESTART */
    sigemptyset(&sa.sa_mask);
    REQUIRE(sigaction(SIGUSR1, &sa, &old) == 0);
    tc_conn *c = dial(d->socket, 0);
    poller p = {c, -99, 0, 0};
    pthread_t th;
    int64_t t0 = now_ms();
    REQUIRE(pthread_create(&th, NULL, poll_300ms, &p) == 0);
    struct timespec gap = {0, 2000000};
    while (!__atomic_load_n(&p.done, __ATOMIC_ACQUIRE)) {
        pthread_kill(th, SIGUSR1); /* the signal source: every 2 ms until the call returns */
        nanosleep(&gap, NULL);
    }
    pthread_join(th, NULL);
    int64_t took = now_ms() - t0;
    CHECK_RC(p.rc, TC_OK);
    CHECK(p.n == 0);
    CHECK(took >= 290 && took < 5000);
    CHECK(interrupts > 10);
    CHECK_RC(tc_ping(c, "after", 5, NULL), TC_OK);
    tc_close(c);
    sigaction(SIGUSR1, &old, NULL);
}

static void test_shutdown(const tcd *d)
{
    tc_conn *c = dial(d->socket, 0);
    waiter w;
    memset(&w, 0, sizeof w);
    w.c = c;
    w.kind = 1;
    start_waiter(&w);
    int64_t t0 = now_ms();
    tc_shutdown(c);
    pthread_join(w.th, NULL);
    CHECK_RC(w.rc, TC_ECLOSED);
    CHECK(w.returned_ms - t0 < 5000);
    CHECK_RC(tc_ping(c, NULL, 0, NULL), TC_ECLOSED);
    tc_close(c);
}

/* Two daemons with a peer plane: exports, remote segments, notified
 * WRITEs; then a frozen peer, a call timeout, and daemons killed while
 * calls wait in them. */
void cluster_key(char *dir, char *path, size_t n)
{
    REQUIRE(mkdtemp(dir));
    snprintf(path, n, "%s/cluster.key", dir);
    int kf = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    uint8_t raw[32];
    fill(raw, sizeof raw, (uint64_t)getpid() * 2654435761u);
    char hex[66];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", raw[i]);
    hex[64] = '\n';
    REQUIRE(kf >= 0 && write(kf, hex, 65) == 65);
    close(kf);
}

static void test_peers(void)
{
    tcd A, B;
    char keydir[] = "/tmp/tc-ctest-key-XXXXXX";
    char key[PATH_MAX];
    cluster_key(keydir, key, sizeof key);

    /* A accepts host-b when it dials in (a peer A does not list is refused). */
    const char *a_args[] = {"--daemon-id", "host-a", "--peer-listen", "127.0.0.1:0", "--cluster-key-file", key,
                            "--rdma", "off", "--peer", "host-b=", NULL};
    start(&A, a_args);
    tc_conn *a = dial(A.socket, 0);
    const char *addr = tc_hello_info(a)->peer_addr;
    REQUIRE(addr && *addr);
    char peer[128];
    snprintf(peer, sizeof peer, "host-a=%s", addr);
    const char *b_args[] = {"--daemon-id", "host-b", "--peer-listen", "127.0.0.1:0", "--cluster-key-file", key,
                            "--rdma", "off", "--peer", peer, NULL};
    start(&B, b_args);
    tc_conn *b = dial(B.socket, 0);

    /* A exports a buffer and subscribes to its notifications. */
    tc_buffer *ab;
    REQUIRE(tc_buffer_create(a, 1 << 20, &ab, NULL) == TC_OK);
    uint64_t size = 0;
    CHECK_RC(tc_segment_export(a, "kv", ab->id, 0, 0, TC_RIGHT_READ | TC_RIGHT_WRITE, &size, NULL), TC_OK);
    CHECK(size == 1 << 20);
    CHECK_RC(tc_segment_export(a, "kv", ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_ALREADY_EXISTS);
    CHECK_RC(tc_segment_export(a, "other", 999999, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_segment_export(a, "bad/name", ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_segment_export(a, "", ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_segment_export(a, "r", ab->id, 0, 0, 7, NULL, NULL), TC_INVALID_ARGUMENT);
    /* Grants: checked here for bounds, by the daemon for names (the
     * exporter's own tenant, one named twice); a granted export is
     * exported like any other. */
    {
        const char *g2[] = {"team-b", "team-c"}, *dup[] = {"team-b", "team-b"}, *own[] = {"default"};
        const char *bad[] = {"bad name"}, *null[] = {NULL}, *many[TC_MAX_GRANTS + 1];
        for (size_t i = 0; i <= TC_MAX_GRANTS; i++)
            many[i] = "t";
        CHECK_RC(tc_segment_export_to(a, "g", many, TC_MAX_GRANTS + 1, ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL),
                 TC_INVALID_ARGUMENT);
        CHECK_RC(tc_segment_export_to(a, "g", null, 1, ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_INVALID_ARGUMENT);
        CHECK_RC(tc_segment_export_to(a, "g", NULL, 1, ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_INVALID_ARGUMENT);
        CHECK_RC(tc_segment_export_to(a, "g", dup, 2, ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_INVALID_ARGUMENT);
        CHECK_RC(tc_segment_export_to(a, "g", own, 1, ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_INVALID_ARGUMENT);
        CHECK_RC(tc_segment_export_to(a, "g", bad, 1, ab->id, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_INVALID_ARGUMENT);
        uint64_t gsize = 0;
        CHECK_RC(tc_segment_export_to(a, "g", g2, 2, ab->id, 0, 4096, TC_RIGHT_READ, &gsize, NULL), TC_OK);
        CHECK(gsize == 4096);
        CHECK_RC(tc_segment_unexport(a, "g", NULL), TC_OK);
    }
    CHECK_RC(tc_notify_subscribe(a, "kv", NULL), TC_OK);
    CHECK_RC(tc_notify_subscribe(a, "nothing", NULL), TC_NOT_FOUND);
    /* A second subscriber, through a relay recording its answers. */
    relay ra;
    memset(&ra, 0, sizeof ra);
    ra.record = 1;
    relay_start(&ra, A.dir, A.socket);
    tc_conn *ar = dial(ra.path, 10000);
    CHECK_RC(tc_notify_subscribe(ar, "kv", NULL), TC_OK);
    CHECK_RC(tc_notify_subscribe(a, NULL, NULL), TC_INVALID_ARGUMENT);

    /* B opens it and writes into it with a notification. */
    tc_remote rs;
    memset(&rs, 0, sizeof rs);
    CHECK_RC(tc_remote_open(b, "host-a/kv", TC_RIGHT_READ | TC_RIGHT_WRITE, TC_TRANSPORT_TCP, &rs, NULL), TC_OK);
    CHECK(rs.id != 0 && rs.size == 1 << 20 && rs.epoch != 0);
    tc_remote none;
    CHECK_RC(tc_remote_open(b, "host-a/missing", TC_RIGHT_READ, TC_TRANSPORT_TCP, &none, NULL), TC_NOT_FOUND);
    CHECK_RC(tc_remote_open(b, "no-slash", TC_RIGHT_READ, TC_TRANSPORT_AUTO, &none, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_remote_open(b, "host-a/kv", TC_RIGHT_READ, 9, &none, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_remote_open(b, "host-a/kv", TC_RIGHT_READ, -1, &none, NULL), TC_INVALID_ARGUMENT);
    tc_buffer *bb;
    REQUIRE(tc_buffer_create(b, 1 << 20, &bb, NULL) == TC_OK);
    fill(bb->data, 256 << 10, 31);
    tc_request w1 = req(TC_OP_WRITE, bb->id, 0, rs.id, 4096, 256 << 10);
    tc_notify note = {"layer-7 ready", 13};
    int code = -99, state = -99;
    tc_summary s;
    CHECK_RC(tc_transfer(b, &w1, 1, &note, 10000, &code, &state, &s, NULL), TC_OK);
    CHECK(code == TC_OK && state == TC_TASK_COMPLETED && s.transferred == 256 << 10);
    CHECK(matches((uint8_t *)ab->data + 4096, 256 << 10, 31));
    tc_notification *ns = NULL;
    size_t n = 0;
    CHECK_RC(tc_notify_poll(a, 4, 5000, &ns, &n, NULL), TC_OK);
    CHECK(n == 1);
    if (n == 1) {
        CHECK(strcmp(ns[0].segment, "kv") == 0);
        CHECK(ns[0].len == 13 && memcmp(ns[0].payload, "layer-7 ready", 13) == 0);
    }
    tc_free(ns);
    CHECK_RC(tc_notify_poll(ar, 0, 5000, &ns, &n, NULL), TC_OK);
    CHECK(n == 1 && ns && ns[0].len == 13);
    tc_free(ns);
    CHECK_RC(tc_segment_export(ar, "kv2", 999999, 0, 0, TC_RIGHT_READ, NULL, NULL), TC_NOT_FOUND);
    tc_close(ar);
    relay_join(&ra);
    CHECK_RC(tc_notify_poll(a, 0, 0, &ns, &n, NULL), TC_OK);
    CHECK(n == 0 && ns == NULL);
    test_queue_notify(b, rs.id, a, "kv");
    CHECK_RC(tc_notify_poll(a, 0, 0, NULL, &n, NULL), TC_INVALID_ARGUMENT);

    /* And reads it back through the batch calls. */
    tc_batch_id batch;
    REQUIRE(tc_batch_alloc(b, 4, &batch, NULL) == TC_OK);
    tc_request r1 = req(TC_OP_READ, bb->id, 512 << 10, rs.id, 4096, 256 << 10);
    CHECK_RC(tc_batch_submit(b, batch, &r1, 1, NULL, &code, NULL), TC_OK);
    CHECK(code == TC_OK);
    CHECK_RC(tc_batch_wait(b, batch, 10000, &s, NULL), TC_OK);
    CHECK(s.completed == 1 && s.transferred == 256 << 10);
    CHECK(matches((uint8_t *)bb->data + (512 << 10), 256 << 10, 31));
    CHECK_RC(tc_batch_free(b, batch, NULL), TC_OK);

    /* B's remote calls, through a relay recording their answers. */
    relay rb;
    memset(&rb, 0, sizeof rb);
    rb.record = 1;
    relay_start(&rb, B.dir, B.socket);
    tc_conn *br = dial(rb.path, 10000);
    tc_remote rr;
    CHECK_RC(tc_remote_open(br, "host-a/kv", TC_RIGHT_READ, TC_TRANSPORT_AUTO, &rr, NULL), TC_OK);
    tc_buffer *brb;
    REQUIRE(tc_buffer_create(br, 65536, &brb, NULL) == TC_OK);
    tc_request rd = req(TC_OP_READ, brb->id, 0, rr.id, 4096, 65536);
    CHECK_RC(tc_transfer(br, &rd, 1, NULL, 10000, &code, &state, NULL, NULL), TC_OK);
    CHECK(code == TC_OK && matches(brb->data, 65536, 31));
    CHECK_RC(tc_remote_close(br, rr.id, NULL), TC_OK);
    tc_close(br);
    relay_join(&rb);

    /* A frozen peer: B's WRITE stays pending, its batch cannot be freed,
     * and a call to the frozen daemon runs into its call timeout. */
    tc_conn *a2 = dial(A.socket, 300);
    tcd_freeze(&A);
    CHECK_RC(tc_ping(a2, "z", 1, NULL), TC_ETIMEDOUT);
    CHECK_RC(tc_ping(a2, "z", 1, NULL), TC_ECLOSED);
    tc_close(a2);
    REQUIRE(tc_batch_alloc(b, 4, &batch, NULL) == TC_OK);
    CHECK_RC(tc_batch_submit(b, batch, &w1, 1, NULL, &code, NULL), TC_OK);
    CHECK(code == TC_OK);
    tc_task_info t;
    CHECK_RC(tc_task_status(b, batch, 0, &t, NULL), TC_OK);
    CHECK(t.state == TC_TASK_PENDING || t.state == TC_TASK_WAITING);
    CHECK_RC(tc_batch_free(b, batch, NULL), TC_BUSY);

    /* B is killed while a wait is blocked in it. */
    waiter w;
    memset(&w, 0, sizeof w);
    w.c = b;
    w.kind = 0;
    w.batch = batch;
    start_waiter(&w);
    int64_t t0 = now_ms();
    forget(&B);
    tcd_kill(&B);
    pthread_join(w.th, NULL);
    CHECK_RC(w.rc, TC_ECLOSED);
    CHECK(w.returned_ms - t0 < 5000);
    CHECK_RC(tc_batch_status(b, batch, &s, NULL), TC_ECLOSED);
    CHECK_RC(tc_remote_close(b, rs.id, NULL), TC_ECLOSED);
    tc_close(b);
    tcd_stop(&B);

    /* A resumes; its client closes what it opened, then A is killed while
     * a poll for notifications waits in it. */
    tcd_thaw(&A);
    CHECK_RC(tc_segment_unexport(a, "kv", NULL), TC_OK);
    CHECK_RC(tc_segment_unexport(a, "kv", NULL), TC_NOT_FOUND);
    CHECK_RC(tc_segment_unexport(a, "", NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_remote_close(a, 999999, NULL), TC_NOT_FOUND);
    memset(&w, 0, sizeof w);
    w.c = a;
    w.kind = 1;
    start_waiter(&w);
    t0 = now_ms();
    forget(&A);
    tcd_kill(&A);
    pthread_join(w.th, NULL);
    CHECK_RC(w.rc, TC_ECLOSED);
    CHECK(w.returned_ms - t0 < 5000);
    tc_close(a);
    tcd_stop(&A);

    unlink(key);
    rmdir(keydir);
}

/* Remote segments on a daemon without a peer plane. */
static void test_remote_close(void)
{
    tcd A;
    start(&A, NULL);
    tc_conn *c = dial(A.socket, 0);
    tc_remote r;
    CHECK_RC(tc_remote_open(c, "host-x/kv", TC_RIGHT_READ, TC_TRANSPORT_AUTO, &r, NULL), TC_UNAVAILABLE);
    CHECK_RC(tc_remote_open(c, "", TC_RIGHT_READ, TC_TRANSPORT_AUTO, &r, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_remote_open(c, "host-x/kv", TC_RIGHT_READ, TC_TRANSPORT_AUTO, NULL, NULL), TC_INVALID_ARGUMENT);
    CHECK_RC(tc_remote_close(c, 12345, NULL), TC_NOT_FOUND);
    tc_close(c);
    stop(&A);
}

/* ---- fuzzing the decoder -------------------------------------------------- */

static uint64_t rnd_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    uint64_t x = rnd_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rnd_state = x;
}

void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

/* mutate changes f (n bytes, room for cap) in one of the ways a hostile or
 * broken peer would, and returns its new length. */
static size_t mutate(uint8_t *f, size_t n, size_t cap)
{
    switch (rnd() % 7) {
    case 0: /* flip bits */
        for (int k = 1 + (int)(rnd() % 4); k > 0; k--)
            f[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8));
        break;
    case 1: /* a byte set to an edge value */
        f[rnd() % n] = (uint8_t[]){0, 1, 0x7f, 0x80, 0xff}[rnd() % 5];
        break;
    case 2: { /* an aligned word set to an offset-like value */
        size_t at = (rnd() % (n / 4)) * 4;
        uint32_t v[] = {0, 1, 4, (uint32_t)n, (uint32_t)n - 4, (uint32_t)n + 4, 0x7fffffff, 0xffffffff,
                        (uint32_t)(rnd() % (2 * n))};
        put32(f + at, v[rnd() % (sizeof v / sizeof v[0])]);
        break;
    }
    case 3: /* cut short, the prefix saying so */
        n = 4 + rnd() % (n - 4);
        put32(f, (uint32_t)(n - 4));
        break;
    case 4: /* cut short, the prefix not saying so */
        n = 4 + rnd() % (n - 4);
        break;
    case 5: /* grown with garbage, the prefix saying so */
        while (n < cap && rnd() % 8)
            f[n++] = (uint8_t)rnd();
        put32(f, (uint32_t)(n - 4));
        break;
    default: { /* a span copied over another */
        size_t len = 1 + rnd() % 16, from = rnd() % n, to = rnd() % n;
        if (from + len <= n && to + len <= n)
            memmove(f + to, f + from, len);
        break;
    }
    }
    return n;
}

/* touch reads everything a decoded answer points at, so the sanitizers
 * see any view that reaches past the frame. */
static uint64_t touch(const tcw_resp *r)
{
    uint64_t sum = strlen(r->message) + strlen(r->daemon_id ? r->daemon_id : "") +
                   strlen(r->version ? r->version : "") + strlen(r->peer_addr ? r->peer_addr : "");
    for (size_t i = 0; i < r->payload_len; i++)
        sum += r->payload[i];
    for (size_t i = 0; i < r->n_u64s; i++)
        sum += r->u64s[i];
    for (size_t i = 0; i < r->n_codes; i++)
        sum += r->codes[i];
    for (size_t i = 0; i < r->n_states; i++)
        sum += r->states[i];
    const tc_counters *g[5] = {&r->stats.pool, &r->stats.engine, &r->stats.connection, &r->stats.transports,
                               &r->stats.store};
    for (int k = 0; k < 5; k++)
        for (size_t i = 0; i < g[k]->n; i++)
            sum += strlen(g[k]->items[i].name) + g[k]->items[i].value;
    for (size_t i = 0; i < r->n_infos; i++) {
        sum += r->infos[i].size + r->infos[i].pins;
        for (size_t j = 0; j < r->infos[i].key_len; j++)
            sum += r->infos[i].key[j];
    }
    sum += r->info.size + r->info.pins + (uint64_t)r->more;
    for (size_t i = 0; i < r->n_notes; i++) {
        sum += strlen(r->notes[i].segment);
        for (size_t j = 0; j < r->notes[i].len; j++)
            sum += r->notes[i].payload[j];
    }
    return sum;
}

/* fuzz_answers decodes every recorded answer as it came (each must
 * decode), then many mutations of each (each must decode or be refused
 * with TC_EPROTO; never crash or read outside the frame). */
static void fuzz_answers(int rounds)
{
    tcw_codec *w = tcw_new();
    REQUIRE(w);
    REQUIRE(n_recorded > 50);
    int kinds[64] = {0}, ok = 0, refused = 0;
    volatile uint64_t sink = 0;
    for (int i = 0; i < n_recorded; i++) {
        size_t n = recorded[i].len, cap = n + 64;
        uint8_t *f = malloc(cap);
        REQUIRE(f);
        memcpy(f, recorded[i].frame, n);
        tcw_resp r;
        CHECK_RC(tcw_decode(w, f, n, &r), TC_OK);
        if (r.kind >= 0 && r.kind < 64)
            kinds[r.kind] = 1;
        sink += touch(&r);
        free(f);
        for (int k = 0; k < rounds; k++) {
            uint8_t *m = malloc(cap);
            REQUIRE(m);
            memcpy(m, recorded[i].frame, n);
            size_t mn = mutate(m, n, cap);
            /* exactly mn bytes, so ASan sees a read past them */
            uint8_t *exact = malloc(mn);
            REQUIRE(exact);
            memcpy(exact, m, mn);
            free(m);
            int rc = tcw_decode(w, exact, mn, &r);
            CHECK(rc == TC_OK || rc == TC_EPROTO);
            if (rc == TC_OK) {
                sink += touch(&r);
                ok++;
            } else {
                refused++;
            }
            free(exact);
        }
    }
    int distinct = 0;
    for (int k = 0; k < 64; k++)
        distinct += kinds[k];
    /* the seeds cover most bodies: Hello through PollNotifications */
    CHECK(distinct >= 18);
    CHECK(refused > 0 && ok > 0);
    printf("tc_test: decoded %d recorded answers (%d bodies) and %d mutations: %d decoded, %d refused\n",
           n_recorded, distinct, ok + refused, ok, refused);
    (void)sink;
    tcw_free(w);
    for (int i = 0; i < n_recorded; i++)
        free(recorded[i].frame);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH-TO-TENSORCASTD\n", argv[0]);
        return 2;
    }
    daemon_bin = argv[1];
    signal(SIGPIPE, SIG_DFL); /* the library must never raise it */
    setvbuf(stdout, NULL, _IOLBF, 0);
    int64_t t0 = now_ms();

    test_queue_waits();
    tcd d;
    start(&d, NULL);
    test_connect_errors(&d);
    tc_conn *c = dial(d.socket, 10000);
    test_hello_pool(c);
    test_ping(c);
    test_blocks(c);
    test_buffers(c, &d);
    test_batches(c);
    test_stats(c);
    test_threads(c);
    tc_close(c);
    test_queue(&d);
    test_store(&d);

    /* The same calls through a relay that records every answer. */
    relay rec;
    memset(&rec, 0, sizeof rec);
    rec.record = 1;
    relay_start(&rec, d.dir, d.socket);
    c = dial(rec.path, 10000);
    test_hello_pool(c);
    test_ping(c);
    test_blocks(c);
    test_buffers(c, &d);
    test_batches(c);
    test_stats(c);
    test_queue_basic(c);
    test_store_basic(c);
    tc_close(c);
    relay_join(&rec);

    test_bad_answers(&d);
    test_queue_answers(&d);
    test_store_answers(&d);
    test_shutdown(&d);
    test_eintr(&d);
    stop(&d);

    test_refused();
    test_remote_close();
    test_queue_daemon_killed();
    test_queue_eventfd();
    test_store_daemon_killed();
    test_store_room_killed();
    test_store_kv_late();
    test_peers();
    test_store_cluster();
    fuzz_answers(500);

    if (check_failures) {
        fprintf(stderr, "tc_test: %d checks FAILED\n", check_failures);
        return 1;
    }
    printf("tc_test: ok (%.1f s)\n", (double)(now_ms() - t0) / 1000);
    return 0;
}
