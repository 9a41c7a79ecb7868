/*
 * queue.c - the shared-memory queue: the client's side of the rings the
 * daemon makes at OpenQueue (queue/doc.go is the layout's specification).
 *
 * The mapping holds a header, the submission ring (SQEs of 64 bytes), the
 * completion ring (CQEs of 32 bytes) and a data area for notification
 * payloads. Each index is a free-running u32; entry i lives at
 * i & (entries - 1). This side writes sq_tail and cq_head, the daemon
 * sq_head and cq_tail. An index is written with a sequentially consistent
 * atomic store after the entries it covers (release, and the full fence a
 * doorbell needs before it reads the other side's flag), and the other
 * side's index is read with an acquire load before the entries it covers.
 *
 * Wake-ups, both directions: a side that runs out of work reads the futex
 * word it will sleep on, sets its flag with an atomic RMW (a full fence),
 * checks for work once more and only then waits on the word with the value
 * it read. The other side publishes its index (full fence), then reads the
 * flag; if it is set it clears it, bumps the word and wakes it. Either the
 * sleeper sees the new index or the waker sees the flag, and the bumped
 * word makes a wait that had not begun return at once: no wake-up is lost.
 * The daemon sets FLAG_NEED_WAKEUP in sq_flags when it sleeps for entries
 * (a submit rings it) and FLAG_CQ_WAIT when it sleeps for completion slots
 * (a reap rings it); this side sets FLAG_WAITING in cq_flags when a reap
 * sleeps for completions (the daemon's post rings it), with
 * FLAG_WAIT_TARGET and the cq_tail it waits for in cq_target, so that only
 * the post that reaches it (or leaves nothing in flight) rings. While
 * neither flag is set no system call is made. When the header's doorbell
 * word says so (a daemon whose io_uring cannot wait on a futex), the daemon
 * passes an eventfd after the memfd and this side writes it instead of the
 * futex wake on sq_wake, saying so in bell_ack.
 *
 * The daemon is trusted more than a client, but its indices are still
 * bounded: a cq_tail claiming more than the ring holds reads as nothing
 * ready, and an sq_head outside what was published is ignored. The header
 * is checked against the OpenQueue answer once, then never read again: the
 * geometry used is this side's own copy.
 *
 * Threads: the submission side (sq below, under sq.mu) and the completion
 * side (cq, under cq.mu) each live on their own cache line; a submitting
 * and a reaping thread do not share a written line but the shared words.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "keys.h"
#include "tail.h"
#ifdef TC_TEST_HOOKS
#include "testhooks.h"
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the queue's layout is little-endian and is read in place"
#endif

/* The layout (queue/layout.go). */
#define Q_MAGIC 0x31514354u /* "TCQ1" */
#define Q_VERSION 1u
#define Q_HEADER 4096u
#define Q_SQE 64u
#define Q_CQE 32u
#define Q_MAX_CQ (1u << 16)
#define Q_MAX_DATA (64u << 20)

#define OFF_MAGIC 0x000
#define OFF_VERSION 0x004
#define OFF_SQ_ENTRIES 0x008
#define OFF_CQ_ENTRIES 0x00c
#define OFF_SQE_SIZE 0x010
#define OFF_CQE_SIZE 0x014
#define OFF_SQ_OFF 0x018
#define OFF_CQ_OFF 0x01c
#define OFF_DATA_OFF 0x020
#define OFF_DATA_SIZE 0x024
#define OFF_SIZE 0x028
#define OFF_ID 0x030
#define OFF_DOORBELL 0x038 /* written by the daemon: how to ring it */
#define OFF_BELL_ACK 0x03c /* written by this side: it rings the eventfd */
#define OFF_SQ_HEAD 0x040
#define OFF_SQ_TAIL 0x080
#define OFF_SQ_FLAGS 0x0c0
#define OFF_SQ_WAKE 0x0c4
#define OFF_CQ_HEAD 0x100
#define OFF_CQ_TAIL 0x140
#define OFF_CQ_FLAGS 0x180
#define OFF_CQ_WAKE 0x184
#define OFF_CQ_TARGET 0x188
#define OFF_STATE 0x1c0

#define FLAG_NEED_WAKEUP 1u /* sq_flags: the daemon sleeps until a submit */
#define FLAG_CQ_WAIT 2u     /* sq_flags: the daemon sleeps until a reap frees slots */
#define FLAG_WAITING 1u     /* cq_flags: this side sleeps until a completion */
#define FLAG_WAIT_TARGET 2u /* cq_flags, with FLAG_WAITING: ... until cq_tail reaches cq_target */
#define WAIT_BITS (FLAG_WAITING | FLAG_WAIT_TARGET)

#define DOORBELL_FUTEX 0u   /* FUTEX_WAKE on sq_wake */
#define DOORBELL_EVENTFD 1u /* write the eventfd passed after the memfd */
#define BELL_ACK_EVENTFD 1u

#define OP_NOP 3
#define SQE_FLAG_NOTIFY 1

/* A sleeping wait checks the connection for a hang-up this often: a daemon
 * that died cannot wake the futex. */
#define CHECK_NS (200 * 1000000LL)
/* Spin budgets (the Go side's spinner, queue/spin.go). */
#define SPIN_MIN_NS 1000LL
#define SPIN_DEFAULT_US 50u
#define SPIN_MAX_US 1000u

/* One SQE and one CQE as they lie in the rings. */
struct sqe {
    uint8_t op;
    uint8_t flags;
    uint16_t count; /* store ops: the number of keys */
    uint32_t timeout_us;
    uint64_t user_data;
    uint64_t local;
    uint64_t local_off;
    uint64_t target;
    uint64_t target_off;
    uint64_t length;
    uint32_t notify_off;
    uint32_t notify_len;
};
struct cqe {
    uint64_t user_data;
    uint64_t result;
    uint32_t code;
    uint8_t state;
    uint8_t reserved[11];
};
typedef char sqe_is_64_bytes[sizeof(struct sqe) == Q_SQE ? 1 : -1];
typedef char cqe_is_32_bytes[sizeof(struct cqe) == Q_CQE ? 1 : -1];

/* A queue's sizes and where each part lies (queue.NewGeometry). */
struct geom {
    uint32_t sq_entries, cq_entries, data_size;
    uint32_t sq_off, cq_off, data_off;
    uint64_t size;
};

/* The adaptive spin budget of the completion side; spun_ns is how long the
 * last spin that found nothing lasted. */
struct spinner {
    int64_t budget_ns, max_ns, spun_ns;
};

struct tc_queue {
    /* Set at open and never changed after it. */
    tc_conn *c;
    uint64_t id;
    uint8_t *mem;
    struct geom g;
    uint32_t sq_mask, cq_mask;
    uint32_t timeout_us;
    uint32_t *sq_head, *sq_tail, *sq_flags, *sq_wake;
    uint32_t *cq_head, *cq_tail, *cq_flags, *cq_wake, *cq_target;
    uint32_t *state;
    int bell_fd;           /* the daemon's eventfd doorbell, rung instead of the futex; -1: none */
    uint32_t gen;          /* the connection's generation it was opened in */
    struct tc_queue *next; /* guarded by c->qmu */
    int down;              /* atomic: tc_queue_shutdown was called */

    /* The submission side: mu guards the fields after it. */
    struct {
        pthread_mutex_t mu;
        uint32_t tail; /* next slot to fill; published up to pub */
        uint32_t pub;  /* the sq_tail last published */
        uint32_t head; /* the daemon's sq_head, last read */
        /* The data area is a byte ring: payloads are placed at data_tail
         * and freed, in submission order, as the daemon takes their
         * entries; slot_data[i & sq_mask] is data_tail just after entry i
         * was staged. */
        uint64_t data_head, data_tail;
        uint64_t *slot_data;
        uint64_t submitted, doorbells; /* written atomically (relaxed) for get_info */
    } sq __attribute__((aligned(64)));

    /* The completion side: mu guards the fields after it. */
    struct {
        pthread_mutex_t mu;
        uint32_t head; /* next CQE to reap */
        struct spinner spin;
        struct tc__tail tail;     /* when to be woken early, and to nap (tail.h) */
        struct tc__napback naps;  /* naps back off when a doorbell follows them */
        uint64_t rang_seen;       /* sq.doorbells at the last wait: a doorbell since says the worker slept */
        int64_t slack_ns;         /* the opening thread's timer slack, which a nap takes off */
        uint64_t reaped, doorbells, sleeps, missed, napped, late; /* relaxed atomics, for get_info and get_waits */
    } cq __attribute__((aligned(64)));
};

/* ---- primitives ------------------------------------------------------------ */

static uint32_t *word(uint8_t *mem, size_t off) { return (uint32_t *)(void *)(mem + off); }

static void bump(uint64_t *counter) { __atomic_store_n(counter, *counter + 1, __ATOMIC_RELAXED); }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* race_window widens, in the test build (TC_QUEUE_WIDEN_RACES), the moment
 * where a wake-up would be lost if the protocol were wrong: a post landing
 * between reading the futex word and setting the flag. A correct sleeper
 * sees it in its re-check; one that skipped the re-check would sleep
 * through its whole slice, which the tests count (missed_wakeups). */
static inline void race_window(void)
{
#ifdef TC_QUEUE_WIDEN_RACES
    for (int i = 0; i < 256; i++)
        cpu_relax();
#endif
}

/* The futex words are in a mapping shared with another process: the shared
 * (not FUTEX_PRIVATE_FLAG) operations. */
static int futex_wait(uint32_t *w, uint32_t val, int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000LL), .tv_nsec = (long)(ns % 1000000000LL)};
    if (syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0) == 0)
        return 0;
    return errno;
}

static void futex_wake(uint32_t *w)
{
    /* A wake of a valid, mapped word cannot fail; a sleeper's own slice
     * bounds what a failure could cost. */
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ring clears bit in sq_flags and, if it was set, bumps sq_wake and wakes
 * the daemon: through its eventfd doorbell when the queue has one (a worker
 * whose io_uring cannot wait on a futex reads it), else the futex. It
 * reports whether it did. It is called right after this side's
 * sequentially consistent index store, so the flag is read after the index
 * is visible. */
static int ring(tc_queue *q, uint32_t bit)
{
    if (!(__atomic_load_n(q->sq_flags, __ATOMIC_SEQ_CST) & bit))
        return 0;
    if (!(__atomic_fetch_and(q->sq_flags, ~bit, __ATOMIC_SEQ_CST) & bit))
        return 0; /* another waker cleared it first */
    __atomic_fetch_add(q->sq_wake, 1, __ATOMIC_SEQ_CST);
    if (q->bell_fd >= 0) {
        uint64_t one = 1;
        /* A failure (a counter at its maximum) means the daemon has a
         * count to read already. */
        ssize_t n = write(q->bell_fd, &one, sizeof one);
        (void)n;
    } else {
        futex_wake(q->sq_wake);
    }
    return 1;
}

/* wake_waiter wakes a reap sleeping on q's completion word (used by
 * shutdown, which this side may write too). */
static void wake_waiter(tc_queue *q)
{
    __atomic_fetch_add(q->cq_wake, 1, __ATOMIC_SEQ_CST);
    futex_wake(q->cq_wake);
}

/* queue_err is TC_ECLOSED once q takes nothing more. */
static int queue_err(const tc_queue *q)
{
    if (__atomic_load_n(&q->down, __ATOMIC_ACQUIRE))
        return TC_ECLOSED;
    if (__atomic_load_n(q->state, __ATOMIC_ACQUIRE) & (TC_QUEUE_CLOSED | TC_QUEUE_BROKEN))
        return TC_ECLOSED;
    if (tc__gen(q->c) != q->gen)
        return TC_ECLOSED; /* the connection was made again: the daemon has no such queue */
    return TC_OK;
}

/* peer_gone reports whether the connection's socket has hung up (the
 * daemon died or closed it, or it was shut down here). */
static int peer_gone(const tc_queue *q)
{
    const tc_conn *c = q->c;
    if (tc__gen(c) != q->gen)
        return 1; /* a reconnect replaced the socket the queue belonged to */
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP, .revents = 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ---- geometry ---------------------------------------------------------------- */

static int pow2(uint32_t n) { return n && !(n & (n - 1)); }

/* geometry lays out a queue of the given sizes as the daemon does, or
 * reports -1 for sizes it never makes (an answer must give them rounded). */
static int geometry(uint32_t sq, uint32_t cq, uint32_t data, struct geom *g)
{
    if (!pow2(sq) || sq < 2 || sq > TC_QUEUE_MAX_ENTRIES || !pow2(cq) || cq < 2 * sq || cq > Q_MAX_CQ ||
        data == 0 || data % 4096 || data > Q_MAX_DATA)
        return -1;
    g->sq_entries = sq;
    g->cq_entries = cq;
    g->data_size = data;
    g->sq_off = Q_HEADER;
    g->cq_off = g->sq_off + sq * Q_SQE;
    g->data_off = (g->cq_off + cq * Q_CQE + 4095) & ~4095u;
    g->size = (uint64_t)g->data_off + data;
    return 0;
}

/* header_matches checks the mapping's header against the layout g and the
 * queue id the answer gave, and that both rings are empty, as a new queue's
 * are: this side starts from the indices it finds, and a head apart from
 * its tail would have it count entries that were never published (a
 * submission ring fuller than it holds, a completion ring never ready). */
static int header_matches(const uint8_t *m, const struct geom *g, uint64_t id)
{
    return tc__get32(m + OFF_MAGIC) == Q_MAGIC && tc__get32(m + OFF_VERSION) == Q_VERSION &&
           tc__get32(m + OFF_SQ_ENTRIES) == g->sq_entries && tc__get32(m + OFF_CQ_ENTRIES) == g->cq_entries &&
           tc__get32(m + OFF_SQE_SIZE) == Q_SQE && tc__get32(m + OFF_CQE_SIZE) == Q_CQE &&
           tc__get32(m + OFF_SQ_OFF) == g->sq_off && tc__get32(m + OFF_CQ_OFF) == g->cq_off &&
           tc__get32(m + OFF_DATA_OFF) == g->data_off && tc__get32(m + OFF_DATA_SIZE) == g->data_size &&
           tc__get64(m + OFF_SIZE) == g->size && tc__get64(m + OFF_ID) == id &&
           tc__get32(m + OFF_SQ_HEAD) == tc__get32(m + OFF_SQ_TAIL) &&
           tc__get32(m + OFF_CQ_HEAD) == tc__get32(m + OFF_CQ_TAIL);
}

/* ---- open and close ----------------------------------------------------------- */

/* close_call tells the daemon to close queue id. */
static int close_call(tc_conn *c, uint64_t id, uint32_t gen)
{
    int rc = tc__start(c, TCW_CLOSE_QUEUE, NULL);
    if (rc)
        return rc;
    if (c->gen != gen)
        return tc__finish(c, TC_OK); /* the daemon it was opened on forgot it */
    c->req.queue = id;
    tc_trip t = {.send_fd = -1};
    return tc__finish(c, tc__round_trip(c, &t));
}

/* release frees q (unlinked, with no thread inside a call on it). */
static void release(tc_queue *q)
{
    if (q->bell_fd >= 0)
        close(q->bell_fd);
    munmap(q->mem, (size_t)q->g.size);
    pthread_mutex_destroy(&q->sq.mu);
    pthread_mutex_destroy(&q->cq.mu);
    free(q->sq.slot_data);
    free(q);
}

/* map_queue maps fd (size bytes, as the answer said) and checks the
 * header against g and id. */
static int map_queue(int fd, const struct geom *g, uint64_t id, uint8_t **mem)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return TC_ESYS;
    if (st.st_size < 0 || (uint64_t)st.st_size < g->size || !tc__sealed(fd))
        return TC_EPROTO; /* touching its end would fault, now or once it shrank */
    void *m = mmap(NULL, (size_t)g->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return TC_ESYS;
    if (!header_matches(m, g, id)) {
        munmap(m, (size_t)g->size);
        return TC_EPROTO;
    }
    *mem = m;
    return TC_OK;
}

static tc_queue *new_queue(tc_conn *c, uint64_t id, const struct geom *g, uint8_t *mem, const tc_queue_opts *o)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, sizeof(tc_queue)))
        return NULL;
    tc_queue *q = p;
    memset(q, 0, sizeof *q);
    q->sq.slot_data = calloc(g->sq_entries, sizeof *q->sq.slot_data);
    if (!q->sq.slot_data) {
        free(q);
        return NULL;
    }
    if (pthread_mutex_init(&q->sq.mu, NULL)) {
        free(q->sq.slot_data);
        free(q);
        return NULL;
    }
    if (pthread_mutex_init(&q->cq.mu, NULL)) {
        pthread_mutex_destroy(&q->sq.mu);
        free(q->sq.slot_data);
        free(q);
        return NULL;
    }
    q->c = c;
    q->id = id;
    q->mem = mem;
    q->g = *g;
    q->sq_mask = g->sq_entries - 1;
    q->cq_mask = g->cq_entries - 1;
    q->timeout_us = o->request_timeout_us;
    q->sq_head = word(mem, OFF_SQ_HEAD);
    q->sq_tail = word(mem, OFF_SQ_TAIL);
    q->sq_flags = word(mem, OFF_SQ_FLAGS);
    q->sq_wake = word(mem, OFF_SQ_WAKE);
    q->cq_head = word(mem, OFF_CQ_HEAD);
    q->cq_tail = word(mem, OFF_CQ_TAIL);
    q->cq_flags = word(mem, OFF_CQ_FLAGS);
    q->cq_wake = word(mem, OFF_CQ_WAKE);
    q->cq_target = word(mem, OFF_CQ_TARGET);
    q->state = word(mem, OFF_STATE);
    q->bell_fd = -1;
    q->sq.head = __atomic_load_n(q->sq_head, __ATOMIC_ACQUIRE);
    q->sq.tail = q->sq.pub = __atomic_load_n(q->sq_tail, __ATOMIC_ACQUIRE);
    q->cq.head = __atomic_load_n(q->cq_head, __ATOMIC_ACQUIRE);
    uint32_t spin = o->spin_us ? o->spin_us : SPIN_DEFAULT_US;
    if (spin > SPIN_MAX_US)
        spin = SPIN_MAX_US;
    q->cq.spin.max_ns = (o->flags & TC_QUEUE_NOSPIN) ? 0 : (int64_t)spin * 1000;
    q->cq.spin.budget_ns = q->cq.spin.max_ns / 2;
    /* A timed sleep ends this much late at least; a nap is that much
     * shorter until naps have taught how late they end. */
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    q->cq.slack_ns = slack > 0 ? slack : 0;
    return q;
}

/* bell_safe reports whether the doorbell fd the daemon passed can be
 * written without raising SIGPIPE, which would end the process: a pipe or
 * a socket whose other end is closed raises it, an eventfd never does. */
static int bell_safe(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && !S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode);
}

int tc_queue_open(tc_conn *c, uint32_t entries, const tc_queue_opts *opts, tc_queue **out)
{
    static const tc_queue_opts none;
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    if (!opts)
        opts = &none;
    if (entries == 0 || entries > TC_QUEUE_MAX_ENTRIES || (opts->flags & ~(uint32_t)TC_QUEUE_NOSPIN))
        return TC_INVALID_ARGUMENT;
    if (entries < 2)
        entries = 2;
    int rc = tc__start(c, TCW_OPEN_QUEUE, NULL);
    if (rc)
        return rc;
    c->req.sq_entries = entries;
    c->req.cq_entries = opts->cq_entries;
    c->req.data_size = opts->data_size;
    int fd = -1, bell = -1;
    tc_trip t = {.send_fd = -1, .recv_fd = &fd, .recv_fd2 = &bell};
    rc = tc__round_trip(c, &t);
    if (rc)
        return tc__finish(c, rc);
    const tcw_resp *r = &c->resp;
    uint64_t id = r->queue;
    uint32_t gen = c->gen;
    struct geom g;
    uint8_t *mem = NULL;
    if (fd < 0 || geometry(r->sq_entries, r->cq_entries, r->data_size, &g) < 0 || g.size != r->size ||
        r->sq_entries < entries || r->cq_entries < opts->cq_entries)
        rc = TC_EPROTO;
    else
        rc = map_queue(fd, &g, id, &mem);
    if (rc == TC_OK) {
        /* The header says whether the daemon sleeps on an eventfd doorbell,
         * passed after the memfd: one must come exactly then. */
        uint32_t bell_kind = __atomic_load_n(word(mem, OFF_DOORBELL), __ATOMIC_ACQUIRE);
        if ((bell_kind == DOORBELL_EVENTFD) != (bell >= 0) || bell_kind > DOORBELL_EVENTFD ||
            (bell >= 0 && !bell_safe(bell))) {
            munmap(mem, (size_t)g.size);
            mem = NULL;
            rc = TC_EPROTO;
        }
    }
    if (fd >= 0) {
        int e = errno;
        close(fd);
        errno = e;
    }
    if (rc && bell >= 0) {
        int e = errno;
        close(bell);
        bell = -1;
        errno = e;
    }
    if (rc == TC_EPROTO)
        rc = tc__fail(c, rc); /* the daemon drops the queue with the connection */
    if (rc == TC_ESYS) {
        /* Nothing wrong with the stream: tell the daemon. */
        int e = errno;
        tc__finish(c, rc);
        close_call(c, id, gen);
        errno = e;
        return rc;
    }
    if (rc)
        return tc__finish(c, rc);
    tc__finish(c, TC_OK);

    tc_queue *q = new_queue(c, id, &g, mem, opts);
    if (!q) {
        munmap(mem, (size_t)g.size);
        if (bell >= 0)
            close(bell);
        close_call(c, id, gen);
        return TC_ENOMEM;
    }
    q->gen = gen;
    if (bell >= 0) {
        q->bell_fd = bell;
        __atomic_store_n(word(mem, OFF_BELL_ACK), BELL_ACK_EVENTFD, __ATOMIC_SEQ_CST);
    }
    TC__LIST_PUSH(c, queues, q);
    *out = q;
    return TC_OK;
}

void tc_queue_shutdown(tc_queue *q)
{
    if (!q)
        return;
    __atomic_store_n(&q->down, 1, __ATOMIC_RELEASE);
    wake_waiter(q);
}

/* unlink takes q off its connection's list. */
static void unlink_queue(tc_queue *q)
{
    tc_conn *c = q->c;
    pthread_mutex_lock(&c->qmu);
    for (tc_queue **p = &c->queues; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            break;
        }
    pthread_mutex_unlock(&c->qmu);
}

int tc_queue_close(tc_queue *q)
{
    if (!q)
        return TC_OK;
    /* Stop this side first: a reap waiting in another thread leaves at
     * once, even while the round trip below waits for the connection. */
    tc_queue_shutdown(q);
    int rc = close_call(q->c, q->id, q->gen);
    unlink_queue(q);
    /* Wait for calls still inside either side to leave. */
    pthread_mutex_lock(&q->sq.mu);
    pthread_mutex_unlock(&q->sq.mu);
    pthread_mutex_lock(&q->cq.mu);
    pthread_mutex_unlock(&q->cq.mu);
    release(q);
    return rc;
}

void tc__queues_shutdown(tc_conn *c)
{
    pthread_mutex_lock(&c->qmu);
    for (tc_queue *q = c->queues; q; q = q->next)
        tc_queue_shutdown(q);
    pthread_mutex_unlock(&c->qmu);
}

void tc__queues_release(tc_conn *c)
{
    pthread_mutex_lock(&c->qmu);
    tc_queue *q = c->queues;
    c->queues = NULL;
    pthread_mutex_unlock(&c->qmu);
    while (q) {
        tc_queue *next = q->next;
        release(q);
        q = next;
    }
}

void tc_queue_get_info(const tc_queue *q, tc_queue_info *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!q)
        return;
    out->id = q->id;
    out->sq_entries = q->g.sq_entries;
    out->cq_entries = q->g.cq_entries;
    out->data_size = q->g.data_size;
    out->state = __atomic_load_n(q->state, __ATOMIC_ACQUIRE) & (TC_QUEUE_CLOSED | TC_QUEUE_BROKEN);
    out->submitted = __atomic_load_n(&q->sq.submitted, __ATOMIC_RELAXED);
    out->submit_doorbells = __atomic_load_n(&q->sq.doorbells, __ATOMIC_RELAXED);
    out->reaped = __atomic_load_n(&q->cq.reaped, __ATOMIC_RELAXED);
    out->reap_doorbells = __atomic_load_n(&q->cq.doorbells, __ATOMIC_RELAXED);
    out->sleeps = __atomic_load_n(&q->cq.sleeps, __ATOMIC_RELAXED);
    out->missed_wakeups = __atomic_load_n(&q->cq.missed, __ATOMIC_RELAXED);
}

void tc_queue_get_waits(const tc_queue *q, tc_queue_waits *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!q)
        return;
    out->naps = __atomic_load_n(&q->cq.napped, __ATOMIC_RELAXED);
    out->late_wakes = __atomic_load_n(&q->cq.late, __ATOMIC_RELAXED);
}

/* ---- the submission side (q->sq.mu held) ---------------------------------------- */

#ifdef TC_TEST_HOOKS
int tc__test_hold_sq_head;
#endif

/* daemon_head is the daemon's sq_head; last is the value this side read
 * before, which the test build returns while a test holds the head back
 * (tc__test_hold_sq_head: the daemon took entries and has not published
 * it yet). */
static uint32_t daemon_head(const tc_queue *q, uint32_t last)
{
#ifdef TC_TEST_HOOKS
    if (__atomic_load_n(&tc__test_hold_sq_head, __ATOMIC_ACQUIRE))
        return last;
#else
    (void)last;
#endif
    return __atomic_load_n(q->sq_head, __ATOMIC_ACQUIRE); /* acquire: its copies are done */
}

/* refresh_head reads the daemon's sq_head and frees the data the newly
 * taken entries referenced. */
static void refresh_head(tc_queue *q)
{
    uint32_t h = daemon_head(q, q->sq.head);
    if (h == q->sq.head || h - q->sq.head > q->sq.tail - q->sq.head)
        return; /* nothing new, or a value that cannot be: keep the last */
    q->sq.data_head = q->sq.slot_data[(h - 1) & q->sq_mask];
    q->sq.head = h;
}

/* space is how many entries can be staged now. */
static uint32_t space(tc_queue *q)
{
    if (q->sq.tail - q->sq.head == q->g.sq_entries)
        refresh_head(q);
    return q->g.sq_entries - (q->sq.tail - q->sq.head);
}

/* place reserves n contiguous bytes of the data area at data_tail, skipping
 * to its start when they would not fit before its end; -1 when there is no
 * room until the daemon takes earlier entries. */
static int64_t place(tc_queue *q, size_t n)
{
    uint64_t size = q->g.data_size, pos = q->sq.data_tail, off = pos % size;
    if (n > size)
        return -1;
    if (off + n > size)
        pos += size - off;
    if (pos + n - q->sq.data_head > size)
        return -1;
    q->sq.data_tail = pos + n;
    return (int64_t)(pos % size);
}

/* stage writes one entry into the next free slot without publishing it:
 * 1 staged, 0 the ring is full, -1 the data area has no room for payload. */
static int stage(tc_queue *q, uint8_t op, const tc_request *r, uint64_t ud, const tc_notify *n)
{
    if (space(q) == 0)
        return 0;
    struct sqe e;
    memset(&e, 0, sizeof e);
    if (n && n->len) {
        int64_t off = place(q, n->len);
        if (off < 0) {
            refresh_head(q);
            if ((off = place(q, n->len)) < 0)
                return -1;
        }
        memcpy(q->mem + q->g.data_off + (uint64_t)off, n->payload, n->len);
        e.flags = SQE_FLAG_NOTIFY;
        e.notify_off = (uint32_t)off;
        e.notify_len = (uint32_t)n->len;
    }
    e.op = op;
    e.timeout_us = q->timeout_us;
    e.user_data = ud;
    if (r) {
        e.local = r->local;
        e.local_off = r->local_offset;
        e.target = r->target;
        e.target_off = r->target_offset;
        e.length = r->length;
    }
    /* Plain stores: the daemon reads the slot only after the tail's store
     * below publishes it. */
    memcpy(q->mem + q->g.sq_off + (size_t)(q->sq.tail & q->sq_mask) * Q_SQE, &e, sizeof e);
    q->sq.slot_data[q->sq.tail & q->sq_mask] = q->sq.data_tail;
    q->sq.tail++;
    return 1;
}

/* stage_store writes one store entry with its key list (len bytes, packed
 * into the data area) into the next free slot without publishing it: 1
 * staged, 0 the ring or the data area has no room now. */
static int stage_store(tc_queue *q, const tc__store_entry *se, const tc_keys *keys, size_t len)
{
    if (space(q) == 0)
        return 0;
    int64_t off = place(q, len);
    if (off < 0) {
        refresh_head(q);
        if ((off = place(q, len)) < 0)
            return 0;
    }
    tc__keys_put(keys, q->mem + q->g.data_off + (uint64_t)off, len);
    struct sqe e;
    memset(&e, 0, sizeof e);
    e.op = se->op;
    e.flags = se->flags;
    e.count = (uint16_t)keys->n;
    e.user_data = se->user_data;
    e.local = se->local;
    e.local_off = se->local_off;
    e.length = se->length;
    e.notify_off = (uint32_t)off;
    e.notify_len = (uint32_t)len;
    memcpy(q->mem + q->g.sq_off + (size_t)(q->sq.tail & q->sq_mask) * Q_SQE, &e, sizeof e);
    q->sq.slot_data[q->sq.tail & q->sq_mask] = q->sq.data_tail;
    q->sq.tail++;
    return 1;
}

/* publish publishes the staged entries and rings the daemon if it sleeps
 * waiting for them. */
static void publish(tc_queue *q)
{
    uint32_t n = q->sq.tail - q->sq.pub;
    if (n == 0)
        return;
    /* Release: the entries above are visible before the tail; sequentially
     * consistent: the flag's load below comes after it (the full fence a
     * lost wake-up would need). */
    __atomic_store_n(q->sq_tail, q->sq.tail, __ATOMIC_SEQ_CST);
    q->sq.pub = q->sq.tail;
    __atomic_store_n(&q->sq.submitted, q->sq.submitted + n, __ATOMIC_RELAXED);
    if (ring(q, FLAG_NEED_WAKEUP))
        bump(&q->sq.doorbells);
}

int tc_queue_submit_notify(tc_queue *q, const tc_request *reqs, const tc_notify *notify, const uint64_t *user_data,
                           size_t n, size_t *accepted)
{
    if (accepted)
        *accepted = 0;
    if (!q || !accepted || (n && (!reqs || !user_data)))
        return TC_INVALID_ARGUMENT;
    pthread_mutex_lock(&q->sq.mu);
    int rc = queue_err(q);
    size_t k = 0;
    for (; rc == TC_OK && k < n; k++) {
        const tc_request *r = &reqs[k];
        const tc_notify *nt = notify && notify[k].len ? &notify[k] : NULL;
        if (nt && (nt->len > TC_MAX_NOTIFY || !nt->payload)) {
            rc = TC_INVALID_ARGUMENT;
            break;
        }
        /* An op the entry cannot carry goes as 0: the daemon refuses that
         * request in its completion. */
        uint8_t op = r->op <= 0xff ? (uint8_t)r->op : 0;
        if (stage(q, op, r, user_data[k], nt) <= 0)
            break; /* the ring or the data area frees as the daemon takes entries */
    }
    publish(q);
    pthread_mutex_unlock(&q->sq.mu);
    *accepted = k;
    return rc;
}

int tc_queue_submit(tc_queue *q, const tc_request *reqs, const uint64_t *user_data, size_t n, size_t *accepted)
{
    return tc_queue_submit_notify(q, reqs, NULL, user_data, n, accepted);
}

int tc_queue_nop(tc_queue *q, uint64_t user_data, size_t *accepted)
{
    if (accepted)
        *accepted = 0;
    if (!q || !accepted)
        return TC_INVALID_ARGUMENT;
    pthread_mutex_lock(&q->sq.mu);
    int rc = queue_err(q);
    if (rc == TC_OK && stage(q, OP_NOP, NULL, user_data, NULL) > 0) {
        publish(q);
        *accepted = 1;
    }
    pthread_mutex_unlock(&q->sq.mu);
    return rc;
}

int tc__queue_store(tc_queue *q, const tc__store_entry *se, const tc_keys *keys, size_t len, size_t *accepted)
{
    *accepted = 0;
    if (len > q->g.data_size)
        return TC_INVALID_ARGUMENT; /* can never fit the data area */
    pthread_mutex_lock(&q->sq.mu);
    int rc = queue_err(q);
    if (rc == TC_OK && stage_store(q, se, keys, len) > 0) {
        publish(q);
        *accepted = 1;
    }
    pthread_mutex_unlock(&q->sq.mu);
    return rc;
}

tc_conn *tc__queue_conn(const tc_queue *q) { return q->c; }

uint32_t tc__queue_data_size(const tc_queue *q) { return q->g.data_size; }

/* ---- the completion side (q->cq.mu held) ---------------------------------------- */

/* ready is how many CQEs can be reaped now. */
static uint32_t ready(const tc_queue *q)
{
    uint32_t n = __atomic_load_n(q->cq_tail, __ATOMIC_ACQUIRE) - q->cq.head; /* acquire: the entries before it */
    return n > q->g.cq_entries ? 0 : n; /* a daemon cannot post that many: none */
}

/* take moves up to max ready CQEs into out. Reaping frees completion slots,
 * so it rings the daemon if it sleeps waiting for them. */
static size_t take(tc_queue *q, tc_cqe *out, size_t max)
{
    uint32_t n = ready(q);
    if (n > max)
        n = (uint32_t)max;
    if (n == 0)
        return 0;
    for (uint32_t i = 0; i < n; i++) {
        struct cqe e;
        memcpy(&e, q->mem + q->g.cq_off + (size_t)((q->cq.head + i) & q->cq_mask) * Q_CQE, sizeof e);
        out[i].user_data = e.user_data;
        out[i].transferred = e.result;
        out[i].code = tc__code(e.code);
        out[i].state = tc__state(e.state);
    }
    q->cq.head += n;
    /* Release: the entries are read before the daemon may reuse their
     * slots; sequentially consistent: the flag's load comes after it. */
    __atomic_store_n(q->cq_head, q->cq.head, __ATOMIC_SEQ_CST);
    __atomic_store_n(&q->cq.reaped, q->cq.reaped + n, __ATOMIC_RELAXED);
    if (ring(q, FLAG_CQ_WAIT))
        bump(&q->cq.doorbells);
    return n;
}

/* The spins' clock and the nap's sleep. The test build (TC_TEST_HOOKS)
 * makes both replaceable, so that a test can post completions during a
 * nap and hold a spin's clock still (test/naps.c). */
static void nap_sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000LL), .tv_nsec = (long)(ns % 1000000000LL)};
    /* An interrupted nap is a shorter one: the wait looks again. */
    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
}
#ifdef TC_TEST_HOOKS
int64_t (*tc__test_spin_clock)(void) = tc__now_ns;
void (*tc__test_nap)(int64_t ns) = nap_sleep_ns;
#define spin_clock() tc__test_spin_clock()
#define nap_sleep(ns) tc__test_nap(ns)
#else
#define spin_clock() tc__now_ns()
#define nap_sleep(ns) nap_sleep_ns(ns)
#endif

/* ---- waiting for room ---------------------------------------------------------- */

/* The naps of a wait for room, from the first to the longest. */
#define ROOM_NAP_MIN_NS (16 * 1000LL)
#define ROOM_NAP_MAX_NS (1000 * 1000LL)

int tc__queue_wait_room(tc_queue *q, int64_t deadline)
{
    pthread_mutex_lock(&q->sq.mu);
    uint32_t last = q->sq.head;
    pthread_mutex_unlock(&q->sq.mu);
    /* The daemon rings nothing when it publishes its head: this side
     * spins for the queue's spin ceiling, as a reap does for its last
     * completion, then naps, each nap twice the last up to
     * ROOM_NAP_MAX_NS. A dead daemon publishes nothing, so the connection
     * is checked for a hang-up every CHECK_NS, as a sleeping reap does. */
    int64_t start = tc__now_ns(), checked = start, nap = ROOM_NAP_MIN_NS;
    for (;;) {
        if (daemon_head(q, last) != last)
            return TC_OK;
        int rc = queue_err(q);
        if (rc)
            return rc;
        int64_t now = tc__now_ns();
        if (now - start < q->cq.spin.max_ns) {
            cpu_relax();
            continue;
        }
        if (deadline && now >= deadline)
            return TC_DEADLINE_EXCEEDED;
        if (now - checked >= CHECK_NS) {
            checked = now;
            if (peer_gone(q)) {
                /* Nothing will be taken any more: submits and reaps say so too. */
                __atomic_store_n(&q->down, 1, __ATOMIC_RELEASE);
                return TC_ECLOSED;
            }
        }
        int64_t d = nap;
        if (deadline && d > deadline - now)
            d = deadline - now;
        nap_sleep(d);
        if (nap < ROOM_NAP_MAX_NS)
            nap *= 2;
    }
}

/* in_flight is how many requests were published and not reaped: each has
 * its CQE to come or ready. It reads the published sq_tail, this side's
 * own word. */
static uint32_t in_flight(const tc_queue *q) { return __atomic_load_n(q->sq_tail, __ATOMIC_ACQUIRE) - q->cq.head; }

/* spin polls for min ready CQEs for the spinner's budget (and not past
 * deadline, 0: none) and adapts it as queue/spin.go does: it grows when a
 * spin finds work and halves when it does not, until slept says how long
 * the wait really was. It reads the clock (vDSO, no system call) once
 * every 32 polls. */
static int spin(tc_queue *q, uint32_t min, int64_t deadline)
{
    struct spinner *s = &q->cq.spin;
    s->spun_ns = 0;
    if (s->budget_ns < SPIN_MIN_NS)
        return 0;
    int64_t start = 0;
    int found = 0;
    uint32_t last = ready(q);
    for (unsigned i = 1;; i++) {
        uint32_t r = ready(q);
        if (r >= min) {
            found = 1;
            break;
        }
        if (r != last) {
            /* Completions are coming: the budget is for the gap between
             * them, so the window restarts (the deadline still holds). */
            last = r;
            start = 0;
        }
        cpu_relax();
        if (i % 32 == 0) {
            /* One reading for the budget and the deadline (spin_clock is
             * tc__now_ns outside the test build). */
            int64_t now = spin_clock();
            if (!start)
                start = now;
            else if (now - start >= s->budget_ns)
                break;
            if (deadline && now >= deadline)
                return 0; /* the caller's time ran out, not the budget: kept */
        }
    }
    if (found) {
        s->budget_ns += s->budget_ns / 2 + SPIN_MIN_NS;
        if (s->budget_ns > s->max_ns)
            s->budget_ns = s->max_ns;
    } else {
        if (start)
            s->spun_ns = spin_clock() - start;
        s->budget_ns /= 2;
    }
    return found;
}

/* spin_until polls until min CQEs are ready or limit_ns has passed, and
 * reports whether they came; *spun (if not NULL) is how long it polled.
 * It reads the clock once every 64 polls. */
static int spin_until(tc_queue *q, uint32_t min, int64_t limit_ns, int64_t *spun)
{
    int64_t start = spin_clock(), d = 0;
    int found = 0;
    for (unsigned i = 1;; i++) {
        if (ready(q) >= min) {
            found = 1;
            d = spin_clock() - start;
            break;
        }
        cpu_relax();
        if (i % 64 == 0 && (d = spin_clock() - start) >= limit_ns)
            break;
    }
    if (spun)
        *spun = d;
    return found;
}

/* spin_tail spins until min CQEs are ready, for up to a tail spin in a
 * drained wait and a behind spin in one that is not: the spin for a wait's
 * last completions when they come fast (tail.h). */
static int spin_tail(tc_queue *q, uint32_t min, int drained)
{
    uint32_t before = ready(q);
    int64_t d;
    int found = spin_until(q, min, tc__tail_limit(drained), &d);
    uint32_t r = ready(q);
    if (found && r > before)
        tc__tail_observe(&q->cq.tail, d / (int64_t)(r - before), (int)(r - before));
    tc__tail_spun(&q->cq.tail, found);
    return found;
}

/* slept tells the spinner how long a sleep lasted before work came. With
 * the spin before it, that is the wait: one within the spin ceiling sets
 * the budget a quarter above it, so that a spin catches the next like it
 * (growing and halving alone never settle on waits a little longer than
 * the budget). */
static void slept(struct spinner *s, int64_t ns)
{
    int64_t w = s->spun_ns + ns; /* spin() zeroes spun_ns at each wait */
    if (w <= s->max_ns) {
        int64_t b = w + w / 4 + SPIN_MIN_NS;
        s->budget_ns = b < s->max_ns ? b : s->max_ns;
    }
}

/* wait_ready waits until min CQEs are ready (see tc_queue_reap), as the Go
 * client's Wait does (queue/client.go), in this order:
 *   - a last missing completion is spun for (the spinner's budget); so are
 *     a wait's last ones when they come at memory speed (tail.h);
 *   - a wait for part of what is in flight, while the daemon's worker is
 *     busy, first naps on the clock with no flag set, so the worker makes
 *     no system call for it (a futex wake of a sleeper costs its waker
 *     about 10 µs on a small virtual host); what is missing after the nap
 *     is spun for if it is due soon (a spin that runs out backs these
 *     spins off, as the tail spins);
 *   - then it sleeps on cq_wake in slices, checking the connection between
 *     them, asking to be woken by the completion the tail chooses (the
 *     min-th, or a few before it when they come fast or the wait drains
 *     the queue). */
static int wait_ready(tc_queue *q, uint32_t min, int64_t timeout_ns)
{
    if (ready(q) >= min)
        return TC_OK;
    if (timeout_ns == 0)
        return TC_DEADLINE_EXCEEDED;
    int64_t deadline = 0;
    if (timeout_ns > 0) {
        int64_t now = tc__now_ns();
        deadline = timeout_ns > INT64_MAX - now ? INT64_MAX : now + timeout_ns;
    }
    struct tc__tail *t = &q->cq.tail;
    tc__tail_begin(t);
    int early = 0; /* the last sleep was woken early for a drained wait's last completions */
    /* The worker is busy when no submit since the last wait found it
     * asleep, and it is not asleep now. A doorbell after a wait that
     * napped says the nap let the worker run dry: naps back off. */
    uint64_t rang = __atomic_load_n(&q->sq.doorbells, __ATOMIC_RELAXED);
    int busy = tc__napback_busy(&q->cq.naps, rang != q->cq.rang_seen,
                                (__atomic_load_n(q->sq_flags, __ATOMIC_ACQUIRE) & FLAG_NEED_WAKEUP) != 0);
    q->cq.rang_seen = rang;
    int napped = 0;
    for (;;) {
        int rc = queue_err(q);
        if (rc)
            return rc;
        int missing = (int)(min - ready(q));
        int drained = min >= in_flight(q);
        if ((missing > 1 || early) && tc__tail_covers(t, missing, drained) && spin_tail(q, min, drained))
            return TC_OK;
        if (missing <= 1 && !early && spin(q, min, deadline))
            return TC_OK;
        early = 0;
        if (!napped && !drained && busy) {
            int64_t d = tc__tail_nap(t, (int)(min - ready(q)), q->cq.slack_ns);
            if (d > 0 && (!deadline || d < deadline - tc__now_ns())) {
                napped = 1;
                q->cq.naps.napped = 1;
                uint32_t before = ready(q);
                int64_t start = spin_clock();
                nap_sleep(d);
                bump(&q->cq.napped);
                uint32_t r = ready(q);
                tc__tail_napped(t, d, spin_clock() - start, (int)(r - before), r >= min, r >= in_flight(q));
                if (r >= min)
                    return TC_OK;
                if (tc__tail_spins_after_nap(t, (int)(min - r))) {
                    /* Learnt as a tail spin: one that runs out (the rest
                     * came in a later burst, not at the gap) backs these
                     * spins off. */
                    int found = spin_until(q, min, TC__BEHIND_SPIN_NS, NULL);
                    tc__tail_spun(t, found);
                    if (found)
                        return TC_OK;
                }
                continue;
            }
        }
        uint32_t v = __atomic_load_n(q->cq_wake, __ATOMIC_SEQ_CST);
        race_window();
        /* Woken once, by the min-th completion, or a few before it when
         * they come fast or the wait drains the queue (the spin above
         * catches those). The target is written before the flags' fence,
         * so a daemon that sees the flag sees the target. */
        uint32_t target =
            min - (uint32_t)tc__tail_ahead(t, (int)(min - ready(q)), drained, q->cq.spin.budget_ns >= SPIN_MIN_NS);
        __atomic_store_n(q->cq_target, q->cq.head + target, __ATOMIC_SEQ_CST);
        /* An atomic RMW, a full fence: the re-check below sees any post the
         * daemon made before it read the flag. */
        __atomic_fetch_or(q->cq_flags, WAIT_BITS, __ATOMIC_SEQ_CST);
        if (ready(q) >= min)
            break;
        if ((rc = queue_err(q)))
            goto out;
        int64_t start = tc__now_ns(), slice = CHECK_NS;
        uint32_t before = ready(q);
        if (deadline) {
            int64_t left = deadline - start;
            if (left <= 0) {
                rc = TC_DEADLINE_EXCEEDED;
                goto out;
            }
            if (left < slice)
                slice = left;
        }
        bump(&q->cq.sleeps);
        int err = futex_wait(q->cq_wake, v, slice);
        __atomic_fetch_and(q->cq_flags, ~WAIT_BITS, __ATOMIC_SEQ_CST);
        uint32_t r = ready(q);
        if (r > before) {
            /* The sleep covered r-before arrivals: the spin and the tail
             * learn the gap between them, not the whole sleep (a wait for
             * many would stop the spin for good). */
            int64_t d = (tc__now_ns() - start) / (int64_t)(r - before);
            if (target < min && drained && tc__tail_slow(t)) {
                /* Woken early for a drained wait's last completions: the
                 * tail spin is for them, whatever the spin budget. */
                tc__tail_woke(t, (int)(min - r));
                if (r >= min)
                    bump(&q->cq.late);
                early = 1;
            }
            slept(&q->cq.spin, d);
            tc__tail_observe(t, d, (int)(r - before));
        }
        if (r >= min) {
            if (err == ETIMEDOUT)
                bump(&q->cq.missed); /* posted while this slept, and not woken */
            break;
        }
        if (err == ETIMEDOUT && peer_gone(q)) {
            /* Nothing will be posted any more: submits say so too. */
            __atomic_store_n(&q->down, 1, __ATOMIC_RELEASE);
            rc = TC_ECLOSED;
            goto out;
        }
        if (err && err != ETIMEDOUT && err != EAGAIN && err != EINTR) {
            errno = err;
            rc = TC_ESYS;
            goto out;
        }
        continue;
    out:
        __atomic_fetch_and(q->cq_flags, ~WAIT_BITS, __ATOMIC_SEQ_CST);
        return rc;
    }
    __atomic_fetch_and(q->cq_flags, ~WAIT_BITS, __ATOMIC_SEQ_CST);
    return TC_OK;
}

int tc_queue_reap(tc_queue *q, tc_cqe *cqes, size_t max, size_t min, int64_t timeout_ns, size_t *n)
{
    if (n)
        *n = 0;
    if (!q || !n || (max && !cqes) || min > max || min > q->g.cq_entries)
        return TC_INVALID_ARGUMENT;
    pthread_mutex_lock(&q->cq.mu);
    int rc = min ? wait_ready(q, (uint32_t)min, timeout_ns) : TC_OK;
    size_t k = take(q, cqes, max);
    pthread_mutex_unlock(&q->cq.mu);
    *n = k;
    if (rc == TC_OK && k < min)
        rc = TC_DEADLINE_EXCEEDED; /* cannot be: ready only grows while this side holds mu */
    return rc;
}

int tc_queue_wait(tc_queue *q, size_t min, int64_t timeout_ns)
{
    if (!q || min > q->g.cq_entries)
        return TC_INVALID_ARGUMENT;
    pthread_mutex_lock(&q->cq.mu);
    int rc = min ? wait_ready(q, (uint32_t)min, timeout_ns) : TC_OK;
    pthread_mutex_unlock(&q->cq.mu);
    return rc;
}

#ifdef TC_TEST_HOOKS
/* ---- the test build's hooks (test/naps.c) ------------------------------------------ */

/* tc__test_queue makes a queue of entries submission slots over an
 * anonymous shared mapping, with no daemon behind it and a connection
 * that is never closed: the test plays the daemon in *mem. */
int tc__test_queue(uint32_t entries, tc_queue **out, uint8_t **mem)
{
    struct geom g;
    if (geometry(entries, 2 * entries, 4096, &g))
        return TC_INVALID_ARGUMENT;
    tc_conn *c = calloc(1, sizeof *c);
    if (!c)
        return TC_ENOMEM;
    c->fd = -1;
    void *m = mmap(NULL, (size_t)g.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        free(c);
        return TC_ESYS;
    }
    static const tc_queue_opts none;
    tc_queue *q = new_queue(c, 1, &g, m, &none);
    if (!q) {
        munmap(m, (size_t)g.size);
        free(c);
        return TC_ENOMEM;
    }
    *out = q;
    *mem = m;
    return TC_OK;
}

void tc__test_queue_free(tc_queue *q)
{
    tc_conn *c = q->c;
    release(q);
    free(c);
}

struct tc__tail *tc__test_tail(tc_queue *q) { return &q->cq.tail; }

/* tc__test_tune sets the spin budget for a last completion, its ceiling
 * and the timer slack a nap takes off. */
void tc__test_tune(tc_queue *q, int64_t spin_budget_ns, int64_t spin_max_ns, int64_t slack_ns)
{
    q->cq.spin.budget_ns = spin_budget_ns;
    q->cq.spin.max_ns = spin_max_ns;
    q->cq.slack_ns = slack_ns;
}
#endif
