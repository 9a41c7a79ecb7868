/*
 * conn.c - a connection: connect, Hello, the pool's mapping, and the round
 * trip every call makes (framing, fd passing, deadlines, failure).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define DEFAULT_CONNECT_TIMEOUT_MS 5000u
#define DEFAULT_MAX_FRAME (1u << 20)
/* The largest answer accepted whatever the daemon says its frames are. */
#define MAX_ANSWER_CAP (256u << 20)
/* How long a failed send waits for the refusal the daemon may have sent
 * before closing the connection (a disallowed peer). */
#define REFUSAL_WAIT_NS (100 * 1000000LL)
/* fds one read accepts at most; more are a protocol error. */
#define MAX_FDS 4

int64_t tc__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int tc__fail(tc_conn *c, int rc)
{
    if (!c->broken) {
        int e = errno; /* TC_ESYS's cause survives the shutdown */
        c->broken = 1;
        shutdown(c->fd, SHUT_RDWR);
        errno = e;
    }
    return rc;
}

static int redial(tc_conn *c);

/* hung_up reports whether the daemon's end of the socket is gone (it
 * exited or closed the connection), without waiting. */
static int hung_up(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP, .revents = 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* start locks c and sets c->req to body (its kind and body fields) with
 * the call's context: o over the connection's defaults. With
 * tc_options.reconnect, a connection the daemon hung up on is broken here,
 * before the call is sent (a call made after the daemon restarted does not
 * fail for it), and a broken one is dialled again. */
static int start(tc_conn *c, const tcw_req *body, const tc_call_opts *o)
{
    pthread_mutex_lock(&c->mu);
    if (c->reconnect && !c->broken && hung_up(c->fd))
        tc__fail(c, TC_ECLOSED);
    if (c->broken && (!c->reconnect || redial(c) != TC_OK)) {
        pthread_mutex_unlock(&c->mu);
        return TC_ECLOSED;
    }
    c->req = *body;
    c->req.request_id = ++c->next_id;
    c->req.lane = o && o->lane ? o->lane : c->lane;
    c->req.policy_version = o && o->policy_version ? o->policy_version : c->policy_version;
    c->req.idempotency_key = o ? o->idempotency_key : NULL;
    c->req.qos = o ? o->qos : 0;
    c->req.deadline_ms = o ? o->deadline_ms : 0;
    c->req.replicas = o ? o->replicas : 0;
    return TC_OK;
}

int tc__start(tc_conn *c, int kind, const tc_call_opts *o)
{
    const tcw_req body = {.kind = kind};
    return start(c, &body, o);
}

int tc__finish(tc_conn *c, int rc)
{
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int tc__call_fd(tc_conn *c, const tcw_req *req, int send_fd, tc__decode decode, void *out, const tc_call_opts *o)
{
    int rc = start(c, req, o);
    if (rc)
        return rc;
    tc_trip t = {.send_fd = send_fd, .extra_ms = req->timeout_ms};
    rc = tc__round_trip(c, &t);
    if (rc == TC_OK && decode)
        rc = decode(c, out);
    return tc__finish(c, rc);
}

int tc__call(tc_conn *c, const tcw_req *req, tc__decode decode, void *out, const tc_call_opts *o)
{
    return tc__call_fd(c, req, -1, decode, out, o);
}

int tc__positional(tc_conn *c, size_t got, size_t want)
{
    return got == want ? TC_OK : tc__fail(c, TC_EPROTO);
}

int tc__at_most(tc_conn *c, size_t got, uint32_t max)
{
    return max == 0 || got <= max ? TC_OK : tc__fail(c, TC_EPROTO);
}

int tc__codes(tc_conn *c, int *codes, size_t n)
{
    int rc = tc__positional(c, c->resp.n_codes, n);
    for (size_t i = 0; rc == TC_OK && i < n; i++)
        codes[i] = tc__code(c->resp.codes[i]);
    return rc;
}

/* wait_io waits until the socket is ready for ev or deadline (0: none)
 * passes. Readiness includes hang-up and error: the next I/O says which. */
static int wait_io(tc_conn *c, short ev, int64_t deadline)
{
    for (;;) {
        int ms = -1;
        if (deadline) {
            int64_t left = deadline - tc__now_ns();
            if (left <= 0)
                return TC_ETIMEDOUT;
            int64_t m = (left + 999999) / 1000000;
            ms = m > INT_MAX ? INT_MAX : (int)m;
        }
        struct pollfd p = {.fd = c->fd, .events = ev, .revents = 0};
        int r = poll(&p, 1, ms);
        if (r > 0)
            return TC_OK;
        if (r < 0 && errno != EINTR)
            return TC_ESYS;
    }
}

static int stream_errno(int e)
{
    if (e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ESHUTDOWN)
        return TC_ECLOSED;
    return TC_ESYS;
}

/* send_frame writes the whole frame, passing fd (unless -1) with its first
 * bytes. */
static int send_frame(tc_conn *c, const uint8_t *p, size_t len, int fd, int64_t deadline)
{
    size_t off = 0;
    int pass = fd >= 0;
    while (off < len) {
        struct iovec iov = {.iov_base = (void *)(p + off), .iov_len = len - off};
        struct msghdr m;
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } u;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        if (pass) {
            memset(&u, 0, sizeof u);
            m.msg_control = u.buf;
            m.msg_controllen = sizeof u.buf;
            struct cmsghdr *h = CMSG_FIRSTHDR(&m);
            h->cmsg_level = SOL_SOCKET;
            h->cmsg_type = SCM_RIGHTS;
            h->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(h), &fd, sizeof fd);
        }
        ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_io(c, POLLOUT, deadline);
                if (rc)
                    return rc;
                continue;
            }
            return stream_errno(errno);
        }
        pass = 0;
        off += (size_t)n;
    }
    return TC_OK;
}

/* take_fds keeps the first fd a read brought in *keep (when keep is set and
 * holds none yet), the next in *keep2 likewise, and closes the others. */
static int take_fds(struct msghdr *m, int *keep, int *keep2)
{
    int rc = TC_OK;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(m); h; h = CMSG_NXTHDR(m, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
            if (keep && *keep < 0)
                *keep = fd;
            else if (keep && keep2 && *keep2 < 0)
                *keep2 = fd;
            else
                close(fd);
        }
    }
    if (m->msg_flags & MSG_CTRUNC)
        rc = TC_EPROTO;
    return rc;
}

/* read_exact reads n bytes into p, collecting passed fds. */
static int read_exact(tc_conn *c, uint8_t *p, size_t n, int *fd, int *fd2, int64_t deadline)
{
    size_t got = 0;
    while (got < n) {
        struct iovec iov = {.iov_base = p + got, .iov_len = n - got};
        union {
            char buf[CMSG_SPACE(MAX_FDS * sizeof(int))];
            struct cmsghdr align;
        } u;
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = u.buf;
        m.msg_controllen = sizeof u.buf;
        ssize_t r = recvmsg(c->fd, &m, MSG_CMSG_CLOEXEC);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_io(c, POLLIN, deadline);
                if (rc)
                    return rc;
                continue;
            }
            return stream_errno(errno);
        }
        if (m.msg_controllen > 0) {
            int rc = take_fds(&m, fd, fd2);
            if (rc)
                return rc;
        }
        if (r == 0)
            return TC_ECLOSED;
        got += (size_t)r;
    }
    return TC_OK;
}

static int grow_rbuf(tc_conn *c, size_t need)
{
    if (need <= c->rcap)
        return TC_OK;
    size_t cap = c->rcap ? c->rcap : 4096;
    while (cap < need)
        cap *= 2;
    uint8_t *b = realloc(c->rbuf, cap);
    if (!b)
        return TC_ENOMEM;
    c->rbuf = b;
    c->rcap = cap;
    return TC_OK;
}

/* recv_frame reads one whole frame into rbuf (length prefix included, so
 * the flatbuffer keeps the alignment it was built with) and decodes it. */
static int recv_frame(tc_conn *c, int *fd, int *fd2, int64_t deadline)
{
    int rc = grow_rbuf(c, TCW_FRAME_HEADER);
    if (rc)
        return rc;
    rc = read_exact(c, c->rbuf, TCW_FRAME_HEADER, fd, fd2, deadline);
    if (rc)
        return rc;
    const uint8_t *h = c->rbuf;
    size_t size = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
    if (size > c->max_answer)
        return TC_EPROTO;
    if ((rc = grow_rbuf(c, TCW_FRAME_HEADER + size)))
        return rc;
    if ((rc = read_exact(c, c->rbuf + TCW_FRAME_HEADER, size, fd, fd2, deadline)))
        return rc;
    return tcw_decode(c->codec, c->rbuf, TCW_FRAME_HEADER + size, &c->resp);
}

int tc__sealed(int fd)
{
    int seals = fcntl(fd, F_GET_SEALS);
    return seals >= 0 && (seals & F_SEAL_SHRINK);
}

static void close_fd(int *fd)
{
    if (fd && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

int tc__round_trip(tc_conn *c, const tc_trip *t)
{
    const uint8_t *frame;
    size_t len;
    int rc = tcw_encode(c->codec, &c->req, &frame, &len);
    if (rc)
        return rc; /* nothing sent: the connection is fine */
    if (len - TCW_FRAME_HEADER > c->max_request)
        return TC_RESOURCE_EXHAUSTED; /* the daemon would refuse it and close */
    int64_t deadline = t->deadline_ns;
    if (!deadline && c->call_timeout_ms)
        deadline = tc__now_ns() + ((int64_t)c->call_timeout_ms + t->extra_ms) * 1000000LL;
    rc = send_frame(c, frame, len, t->send_fd, deadline);
    if (rc) {
        /* The daemon may have refused the connection and closed it before
         * this frame went out: its refusal is already waiting, and says
         * more than a broken pipe. */
        if (rc == TC_ECLOSED && recv_frame(c, NULL, NULL, tc__now_ns() + REFUSAL_WAIT_NS) == TC_OK &&
            c->resp.request_id == 0 && c->resp.status != TC_OK)
            rc = tc__code((uint64_t)c->resp.status);
        return tc__fail(c, rc);
    }
    rc = recv_frame(c, t->recv_fd, t->recv_fd2, deadline);
    if (rc) {
        close_fd(t->recv_fd);
        close_fd(t->recv_fd2);
        return tc__fail(c, rc);
    }
    const tcw_resp *r = &c->resp;
    if (r->request_id != 0 && r->request_id != c->req.request_id)
        rc = tc__fail(c, TC_EPROTO);
    else if (r->request_id == 0 && r->status == TC_OK)
        /* Request id 0 answers no request: the daemon sends it only with a
         * refusal (a connection refused, a frame it could not read). */
        rc = tc__fail(c, TC_EPROTO);
    else if (r->status != TC_OK) {
        /* A status not answering this request (request id 0) refuses the
         * connection or a bad frame: the daemon closes the connection. One
         * the protocol does not name is a violation (TC_EPROTO), which
         * breaks the connection too. */
        rc = tc__code((uint64_t)r->status);
        if (r->request_id == 0 || rc == TC_EPROTO)
            rc = tc__fail(c, rc);
    }
    else if (r->kind != c->req.kind)
        rc = tc__fail(c, TC_EPROTO);
    if (rc) {
        close_fd(t->recv_fd);
        close_fd(t->recv_fd2);
    }
    return rc;
}

/* ---- connect ------------------------------------------------------------- */

/* dial connects a new socket to path within deadline: *out is it, or -1
 * on failure (errno says why for TC_ESYS). */
static int dial(const char *path, int64_t deadline, int *out)
{
    *out = -1;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path)
        return TC_INVALID_ARGUMENT;
    memcpy(sa.sun_path, path, strlen(path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return TC_ESYS;
    /* A blocking connect to a unix socket waits only for room in the
     * listener's backlog, bounded by the send timeout. */
    int64_t left = deadline - tc__now_ns();
    if (left <= 0)
        left = 1000;
    struct timeval tv = {.tv_sec = (time_t)(left / 1000000000LL),
                         .tv_usec = (suseconds_t)(left % 1000000000LL / 1000)};
    if (tv.tv_sec == 0 && tv.tv_usec == 0)
        tv.tv_usec = 1;
    int rc = TC_OK;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0)
        rc = TC_ESYS;
    while (rc == TC_OK) {
        if (connect(fd, (const struct sockaddr *)&sa, sizeof sa) == 0)
            break;
        if (errno == EINTR)
            continue;
        if (errno == EISCONN)
            break;
        rc = errno == EAGAIN || errno == EINPROGRESS ? TC_ETIMEDOUT : TC_ESYS;
    }
    struct timeval zero = {0, 0};
    if (rc == TC_OK && setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &zero, sizeof zero) < 0)
        rc = TC_ESYS;
    int fl = rc == TC_OK ? fcntl(fd, F_GETFL) : -1;
    if (rc == TC_OK && (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0))
        rc = TC_ESYS;
    if (rc) {
        int e = errno;
        close(fd);
        errno = e;
        return rc;
    }
    *out = fd;
    return TC_OK;
}

/* prepare sets c->req to a call of kind without a context (the calls a
 * connection makes for itself). c is locked. */
static void prepare(tc_conn *c, int kind)
{
    memset(&c->req, 0, sizeof c->req);
    c->req.kind = kind;
    c->req.request_id = ++c->next_id;
}

/* hello says Hello as name (c locked); the answer is in c->resp. */
static int hello(tc_conn *c, const char *name, int64_t deadline)
{
    prepare(c, TCW_HELLO);
    c->req.protocol_version = TC_PROTOCOL_VERSION;
    c->req.name = name;
    tc_trip t = {.send_fd = -1, .deadline_ns = deadline};
    int rc = tc__round_trip(c, &t);
    if (rc == TC_OK && c->resp.protocol_version != TC_PROTOCOL_VERSION)
        rc = TC_EVERSION;
    return rc;
}

static int say_hello(tc_conn *c, const char *name, int64_t deadline)
{
    int rc = tc__start(c, TCW_HELLO, NULL);
    if (rc)
        return rc;
    rc = hello(c, name, deadline);
    if (rc == TC_OK) {
        const tcw_resp *r = &c->resp;
        c->hello.protocol_version = r->protocol_version;
        c->hello.limits = r->limits;
        char *id = dup_str(r->daemon_id), *v = dup_str(r->version), *pa = dup_str(r->peer_addr);
        c->hello.daemon_id = id;
        c->hello.version = v;
        c->hello.peer_addr = pa;
        if (!id || !v || !pa)
            rc = TC_ENOMEM;
    }
    return tc__finish(c, rc);
}

/* redial replaces c's broken socket with a new connection to the daemon
 * (tc_options.reconnect), says Hello and checks that the daemon's pool is
 * the memfd c mapped, of the same size: a restart that kept the pool. Then
 * c is whole again, of a new generation (c->gen), and keeps its mapping,
 * hello (what the daemon said at connect) and name. A daemon with another
 * pool is refused for good (c->foreign): c's mapping is not its pool. c is
 * locked; the socket keeps its number, so that tc_shutdown, which takes no
 * lock, never shuts down a number reused meanwhile. */
static int redial(tc_conn *c)
{
    if (c->foreign || __atomic_load_n(&c->shut, __ATOMIC_SEQ_CST))
        return TC_ECLOSED;
    int64_t deadline = tc__now_ns() + (int64_t)c->connect_timeout_ms * 1000000LL;
    int fd;
    int rc = dial(c->socket, deadline, &fd);
    if (rc)
        return rc;
    rc = dup3(fd, c->fd, O_CLOEXEC) < 0 ? TC_ESYS : TC_OK;
    close(fd);
    if (rc)
        return rc;
    c->broken = 0;
    if (__atomic_load_n(&c->shut, __ATOMIC_SEQ_CST)) {
        /* tc_shutdown ran before the new socket took the number. */
        return tc__fail(c, TC_ECLOSED);
    }
    if ((rc = hello(c, c->name, deadline)))
        return tc__fail(c, rc);
    prepare(c, TCW_POOL_INFO);
    int pfd = -1;
    tc_trip t = {.send_fd = -1, .recv_fd = &pfd, .deadline_ns = deadline};
    if ((rc = tc__round_trip(c, &t)))
        return tc__fail(c, rc);
    struct stat now, was;
    int same = pfd >= 0 && fstat(pfd, &now) == 0 && fstat(c->pool.fd, &was) == 0 && now.st_dev == was.st_dev &&
               now.st_ino == was.st_ino && c->resp.size == c->pool.size;
    if (pfd >= 0)
        close(pfd);
    if (!same) {
        c->foreign = 1;
        return tc__fail(c, TC_ECLOSED);
    }
    __atomic_store_n(&c->gen, c->gen + 1, __ATOMIC_RELEASE);
    return TC_OK;
}

static int map_pool(tc_conn *c, int64_t deadline)
{
    int rc = tc__start(c, TCW_POOL_INFO, NULL);
    if (rc)
        return rc;
    int fd = -1;
    tc_trip t = {.send_fd = -1, .recv_fd = &fd, .deadline_ns = deadline};
    rc = tc__round_trip(c, &t);
    if (rc)
        return tc__finish(c, rc);
    const tcw_resp *r = &c->resp;
    struct stat st;
    if (fd < 0 || r->size == 0 || r->size > SIZE_MAX || fstat(fd, &st) < 0 || st.st_size < 0 ||
        (uint64_t)st.st_size < r->size || !tc__sealed(fd)) {
        /* No pool, one shorter than it claims, or one that could be made
         * shorter: touching its end would fault. */
        close_fd(&fd);
        return tc__finish(c, tc__fail(c, TC_EPROTO));
    }
    void *base = mmap(NULL, (size_t)r->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        close(fd);
        errno = e;
        return tc__finish(c, TC_ESYS);
    }
    uint64_t *classes = NULL;
    if (r->n_u64s > 0) {
        classes = malloc(r->n_u64s * sizeof *classes);
        if (!classes) {
            munmap(base, (size_t)r->size);
            close(fd);
            return tc__finish(c, TC_ENOMEM);
        }
        memcpy(classes, r->u64s, r->n_u64s * sizeof *classes);
    }
    c->pool.segment = r->segment;
    c->pool.size = r->size;
    c->pool.base = base;
    c->pool.fd = fd;
    c->pool.block_classes = classes;
    c->pool.n_block_classes = r->n_u64s;
    return tc__finish(c, TC_OK);
}

int tc_connect(const tc_options *opts, tc_conn **out)
{
    static const tc_options none;
    if (!out)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    if (!opts)
        opts = &none;
    const char *path = opts->socket;
    if (!path || !*path)
        path = getenv("TENSORCAST_SOCKET");
    if (!path || !*path)
        path = TC_DEFAULT_SOCKET;
    /* The default name is the program's, cut to what any daemon takes. */
    char prog[65];
    snprintf(prog, sizeof prog, "%s", program_invocation_short_name);
    const char *name = opts->name ? opts->name : prog;

    tc_conn *c = calloc(1, sizeof *c);
    if (!c)
        return TC_ENOMEM;
    c->fd = -1;
    c->pool.fd = -1;
    int err = pthread_mutex_init(&c->mu, NULL);
    if (!err && (err = pthread_mutex_init(&c->qmu, NULL)))
        pthread_mutex_destroy(&c->mu);
    if (err) {
        free(c);
        errno = err;
        return TC_ESYS;
    }
    c->call_timeout_ms = opts->call_timeout_ms;
    c->reconnect = opts->reconnect != 0;
    c->policy_version = opts->policy_version;
    c->max_answer = opts->max_frame ? opts->max_frame : DEFAULT_MAX_FRAME;
    c->max_request = DEFAULT_MAX_FRAME;
    c->socket = dup_str(path);
    c->name = dup_str(name);
    c->lane = opts->lane ? dup_str(opts->lane) : NULL;
    c->codec = tcw_new();
    int rc = TC_OK;
    if (!c->socket || !c->name || (opts->lane && !c->lane) || !c->codec)
        rc = TC_ENOMEM;
    uint32_t ms = opts->connect_timeout_ms ? opts->connect_timeout_ms : DEFAULT_CONNECT_TIMEOUT_MS;
    c->connect_timeout_ms = ms;
    int64_t deadline = tc__now_ns() + (int64_t)ms * 1000000LL;
    if (rc == TC_OK)
        rc = dial(c->socket, deadline, &c->fd);
    if (rc == TC_OK)
        rc = say_hello(c, c->name, deadline);
    if (rc == TC_OK) {
        uint32_t mf = c->hello.limits.max_frame;
        if (mf)
            c->max_request = mf;
        if (!opts->max_frame) {
            size_t a = mf > DEFAULT_MAX_FRAME ? mf : DEFAULT_MAX_FRAME;
            c->max_answer = a > MAX_ANSWER_CAP ? MAX_ANSWER_CAP : a;
        }
        rc = map_pool(c, deadline);
    }
    if (rc) {
        int e = errno;
        tc_close(c);
        errno = e;
        return rc;
    }
    *out = c;
    return TC_OK;
}

void tc_close(tc_conn *c)
{
    if (!c)
        return;
    tc__store_release(c);
    tc__queues_release(c);
    while (c->buffers) {
        struct tc_buf *b = c->buffers;
        c->buffers = b->next;
        munmap(b->pub.data, (size_t)b->pub.size);
        close(b->pub.fd);
        free(b);
    }
    if (c->fd >= 0)
        close(c->fd);
    if (c->pool.base)
        munmap(c->pool.base, (size_t)c->pool.size);
    if (c->pool.fd >= 0)
        close(c->pool.fd);
    free((void *)c->pool.block_classes);
    free((void *)c->hello.daemon_id);
    free((void *)c->hello.version);
    free((void *)c->hello.peer_addr);
    free(c->socket);
    free(c->name);
    free(c->lane);
    free(c->rbuf);
    tcw_free(c->codec);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->qmu);
    free(c);
}

void tc_shutdown(tc_conn *c)
{
    if (c)
        __atomic_store_n(&c->shut, 1, __ATOMIC_SEQ_CST);
    if (c && c->fd >= 0)
        shutdown(c->fd, SHUT_RDWR);
    if (c)
        tc__queues_shutdown(c);
}

uint32_t tc_reconnects(const tc_conn *c) { return c ? tc__gen(c) : 0; }

const tc_hello *tc_hello_info(const tc_conn *c) { return c ? &c->hello : NULL; }

const tc_pool *tc_pool_info(const tc_conn *c) { return c ? &c->pool : NULL; }

void tc_free(void *p) { free(p); }

const char *tc_strerror(int code)
{
    switch (code) {
    case TC_OK:
        return "OK";
    case TC_INVALID_ARGUMENT:
        return "invalid argument";
    case TC_NOT_FOUND:
        return "not found";
    case TC_ALREADY_EXISTS:
        return "already exists";
    case TC_BUSY:
        return "busy";
    case TC_RESOURCE_EXHAUSTED:
        return "resource exhausted";
    case TC_FAILED_PRECONDITION:
        return "failed precondition";
    case TC_PERMISSION_DENIED:
        return "permission denied";
    case TC_DEADLINE_EXCEEDED:
        return "deadline exceeded";
    case TC_UNAVAILABLE:
        return "unavailable";
    case TC_INTERNAL:
        return "daemon internal error";
    case TC_ECLOSED:
        return "connection closed";
    case TC_ETIMEDOUT:
        return "timed out";
    case TC_EPROTO:
        return "protocol violation by the daemon";
    case TC_ESYS:
        return "system call failed (see errno)";
    case TC_ENOMEM:
        return "out of memory";
    case TC_EVERSION:
        return "the daemon speaks another protocol version";
    case TC_EINTERNAL:
        return "libtensorcast internal error";
    }
    return "unknown tensorcast code";
}
