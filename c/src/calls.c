/*
 * calls.c - the control protocol's calls: ping, stats, pool blocks,
 * buffers, files, the batch lifecycle, exports, remote segments and
 * notifications.
 *
 * Each call checks its arguments and names its request's body; tc__call
 * takes the connection, makes the round trip and has the call's decoder
 * (tc__decode) check the answer's counts and copy it out before it releases
 * the connection: views into the answer do not outlive the call.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

/* The decoders of the answers that are one value. */

static int get_segment(tc_conn *c, void *out)
{
    *(tc_segment_id *)out = c->resp.segment;
    return TC_OK;
}

static int get_size(tc_conn *c, void *out)
{
    *(uint64_t *)out = c->resp.size;
    return TC_OK;
}

static int get_batch(tc_conn *c, void *out)
{
    *(tc_batch_id *)out = c->resp.batch;
    return TC_OK;
}

static int get_task(tc_conn *c, void *out)
{
    tc_task_info *t = out;
    *t = c->resp.task;
    t->state = tc__state((uint64_t)t->state);
    t->code = tc__code((uint64_t)t->code);
    return TC_OK;
}

static int get_summary(tc_conn *c, void *out)
{
    *(tc_summary *)out = c->resp.summary;
    return TC_OK;
}

/* echoed checks that a ping's answer carries its payload back. */
static int echoed(tc_conn *c, void *unused)
{
    (void)unused;
    size_t len = c->req.payload_len;
    if (c->resp.payload_len != len || (len && memcmp(c->resp.payload, c->req.payload, len) != 0))
        return tc__fail(c, TC_EPROTO);
    return TC_OK;
}

int tc_ping(tc_conn *c, const void *payload, size_t len, const tc_call_opts *o)
{
    if (!c || (len && !payload))
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_PING, .payload = payload, .payload_len = len};
    return tc__call(c, &r, echoed, NULL, o);
}

/* ---- stats --------------------------------------------------------------- */

static size_t group_bytes(const tc_counters *g)
{
    size_t n = g->n * sizeof(tc_counter);
    for (size_t i = 0; i < g->n; i++)
        n += strlen(g->items[i].name) + 1;
    return n;
}

/* copy_group copies g into the block at *items (its counters) and *names
 * (their names), advancing both. */
static tc_counters copy_group(const tc_counters *g, tc_counter **items, char **names)
{
    tc_counters out = {*items, g->n};
    for (size_t i = 0; i < g->n; i++) {
        size_t n = strlen(g->items[i].name) + 1;
        memcpy(*names, g->items[i].name, n);
        (*items)[i].name = *names;
        (*items)[i].value = g->items[i].value;
        *names += n;
    }
    *items += g->n;
    return out;
}

/* copy_stats copies the answer's counters into one block, *(tc_stats **)out. */
static int copy_stats(tc_conn *c, void *out)
{
    const tc_stats *s = &c->resp.stats;
    const tc_counters *g[5] = {&s->pool, &s->engine, &s->connection, &s->transports, &s->store};
    size_t total = g[0]->n + g[1]->n + g[2]->n + g[3]->n + g[4]->n, bytes = sizeof(tc_stats);
    for (int i = 0; i < 5; i++)
        bytes += group_bytes(g[i]);
    tc_stats *st = malloc(bytes);
    if (!st)
        return TC_ENOMEM;
    tc_counter *items = (tc_counter *)(st + 1);
    char *names = (char *)(items + total);
    st->pool = copy_group(g[0], &items, &names);
    st->engine = copy_group(g[1], &items, &names);
    st->connection = copy_group(g[2], &items, &names);
    st->transports = copy_group(g[3], &items, &names);
    st->connections = s->connections;
    st->store = copy_group(g[4], &items, &names);
    *(tc_stats **)out = st;
    return TC_OK;
}

int tc_stats_get(tc_conn *c, tc_stats **out, const tc_call_opts *o)
{
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    const tcw_req r = {.kind = TCW_STATS};
    return tc__call(c, &r, copy_stats, out, o);
}

/* ---- pool blocks --------------------------------------------------------- */

/* get_blocks checks that each block allocated lies inside the pool and
 * copies their offsets into out. */
static int get_blocks(tc_conn *c, void *out)
{
    size_t n = c->req.n;
    uint64_t size = c->req.size;
    int rc = tc__positional(c, c->resp.n_u64s, n);
    for (size_t i = 0; rc == TC_OK && i < n; i++) {
        uint64_t off = c->resp.u64s[i];
        if (off >= c->pool.size || size > c->pool.size - off)
            rc = tc__fail(c, TC_EPROTO); /* a block outside the pool */
    }
    if (rc == TC_OK)
        memcpy(out, c->resp.u64s, n * sizeof(uint64_t));
    return rc;
}

int tc_blocks_alloc(tc_conn *c, uint32_t n, uint64_t size, uint64_t *offsets, const tc_call_opts *o)
{
    if (!c || n == 0 || n > (1u << 31) || size == 0 || !offsets)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_ALLOC_BLOCKS, .n = n, .size = size};
    return tc__call(c, &r, get_blocks, offsets, o);
}

/* block_codes decodes a code per block freed. */
static int block_codes(tc_conn *c, void *codes)
{
    return tc__codes(c, codes, c->req.n_offsets);
}

int tc_blocks_free(tc_conn *c, const uint64_t *offsets, size_t n, int *codes, const tc_call_opts *o)
{
    if (!c || n == 0 || !offsets || !codes)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_FREE_BLOCKS, .offsets = offsets, .n_offsets = n};
    return tc__call(c, &r, block_codes, codes, o);
}

/* ---- buffers and files --------------------------------------------------- */

int tc_buffer_register_fd(tc_conn *c, int fd, uint64_t size, tc_segment_id *id, const tc_call_opts *o)
{
    /* A bad fd would fail sendmsg after the connection's stream is
     * committed to the frame; refuse it here. */
    if (!c || fd < 0 || fcntl(fd, F_GETFD) < 0 || size == 0 || !id)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_REGISTER_BUFFER, .size = size};
    return tc__call_fd(c, &r, fd, get_segment, id, o);
}

static struct tc_buf *find_buf(tc_conn *c, tc_segment_id id, const tc_buffer *pub)
{
    for (struct tc_buf *b = c->buffers; b; b = b->next)
        if ((pub && &b->pub == pub) || (!pub && b->pub.id == id && b->gen == c->gen))
            return b;
    return NULL;
}

int tc__owns_buffer(tc_conn *c, const tc_buffer *buf)
{
    pthread_mutex_lock(&c->mu);
    int ok = find_buf(c, 0, buf) != NULL;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

static void unlink_buf(tc_conn *c, struct tc_buf *b)
{
    for (struct tc_buf **p = &c->buffers; *p; p = &(*p)->next)
        if (*p == b) {
            *p = b->next;
            return;
        }
}

static void drop_buf(struct tc_buf *b)
{
    int e = errno;
    if (b->pub.data)
        munmap(b->pub.data, (size_t)b->pub.size);
    if (b->pub.fd >= 0)
        close(b->pub.fd);
    free(b);
    errno = e;
}

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1 */
#endif

/* HUGE_SPAN is the 2 MiB page of x86-64 and arm64 with 4 KiB base pages. */
#define HUGE_SPAN ((uint64_t)2 << 20)

/* map_aligned maps size bytes of fd shared, on a HUGE_SPAN boundary when
 * size is at least that: address space one span longer is reserved, fd is
 * mapped over its first boundary, and the rest is given back. */
static void *map_aligned(int fd, uint64_t size)
{
    const int prot = PROT_READ | PROT_WRITE;
    if (size < HUGE_SPAN)
        return mmap(NULL, (size_t)size, prot, MAP_SHARED, fd, 0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = ((size_t)size + page - 1) & ~(page - 1);
    size_t total = len + (size_t)HUGE_SPAN;
    char *r = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
        return MAP_FAILED;
    size_t head = (size_t)(-(uintptr_t)r & (HUGE_SPAN - 1));
    void *p = mmap(r + head, len, prot, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        munmap(r, total);
        errno = e;
        return MAP_FAILED;
    }
    if (head)
        munmap(r, head);
    if (total - head - len)
        munmap(r + head + len, total - head - len);
    return p;
}

/* collapse places the whole HUGE_SPAN spans of a fresh buffer (all zero) on
 * transparent huge pages, as the daemon does its pool: each span's first
 * byte is written (MADV_COLLAPSE wants a page present; it was zero and stays
 * so) and the span collapsed. It returns the bytes so placed, and stops at
 * the first EINVAL (every span would get it: the kernel cannot, or is told
 * not to); a span refused otherwise stays on normal pages. */
static uint64_t collapse(char *p, uint64_t size)
{
    uint64_t done = 0;
    for (uint64_t at = 0; at + HUGE_SPAN <= size; at += HUGE_SPAN) {
        p[at] = 0;
        if (madvise(p + at, (size_t)HUGE_SPAN, MADV_COLLAPSE) == 0)
            done += HUGE_SPAN;
        else if (errno == EINVAL)
            break;
    }
    return done;
}

/* new_memfd makes what the daemon requires of a client buffer: a memfd of
 * size bytes sealed against shrinking (and growing), mapped shared, with its
 * whole 2 MiB spans on transparent huge pages where the kernel gives them. */
static int new_memfd(struct tc_buf *b, uint64_t size)
{
    b->pub.fd = memfd_create("tensorcast-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (b->pub.fd < 0)
        return errno == ENOMEM ? TC_ENOMEM : TC_ESYS;
    if (ftruncate(b->pub.fd, (off_t)size) < 0 ||
        fcntl(b->pub.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
        return TC_ESYS;
    void *p = map_aligned(b->pub.fd, size);
    if (p == MAP_FAILED)
        return errno == ENOMEM ? TC_ENOMEM : TC_ESYS;
    b->pub.data = p;
    b->pub.size = size;
    int e = errno; /* collapse's refusals are not the call's errno */
    b->pub.huge = collapse(p, size);
    errno = e;
    return TC_OK;
}

/* keep_buffer takes the buffer out (a struct tc_buf) as registered: its
 * segment, and into the connection's list. */
static int keep_buffer(tc_conn *c, void *out)
{
    struct tc_buf *b = out;
    b->pub.id = c->resp.segment;
    b->gen = c->gen;
    b->next = c->buffers;
    c->buffers = b;
    return TC_OK;
}

int tc_buffer_create(tc_conn *c, uint64_t size, tc_buffer **out, const tc_call_opts *o)
{
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    if (size == 0 || size > (uint64_t)INT64_MAX || size > (uint64_t)SIZE_MAX)
        return TC_INVALID_ARGUMENT;
    struct tc_buf *b = calloc(1, sizeof *b);
    if (!b)
        return TC_ENOMEM;
    b->pub.fd = -1;
    int rc = new_memfd(b, size);
    if (rc == TC_OK) {
        const tcw_req r = {.kind = TCW_REGISTER_BUFFER, .size = size};
        rc = tc__call_fd(c, &r, b->pub.fd, keep_buffer, b, o);
    }
    if (rc) {
        drop_buf(b);
        return rc;
    }
    *out = &b->pub;
    return TC_OK;
}

int tc_buffer_destroy(tc_conn *c, tc_buffer *buf, const tc_call_opts *o)
{
    if (!c || !buf)
        return TC_INVALID_ARGUMENT;
    /* Not tc__call: whether the daemon still has the buffer (it is of
     * this generation, see tc_conn.gen) is decided under the same hold of
     * c as the call, so no reconnect slips between them. */
    int rc = tc__start(c, TCW_UNREGISTER_BUFFER, o);
    if (rc)
        pthread_mutex_lock(&c->mu); /* only to unlink it */
    struct tc_buf *b = find_buf(c, 0, buf);
    if (b)
        unlink_buf(c, b);
    if (!b) {
        pthread_mutex_unlock(&c->mu);
        return TC_INVALID_ARGUMENT; /* not a buffer of this connection */
    }
    if (rc == TC_OK && b->gen == c->gen) {
        c->req.segment = b->pub.id;
        const tc_trip t = {.send_fd = -1};
        rc = tc__round_trip(c, &t);
    }
    pthread_mutex_unlock(&c->mu);
    drop_buf(b);
    return rc;
}

int tc_segment_unregister(tc_conn *c, tc_segment_id id, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    /* Not tc__call: the check is made under the same hold of c as the
     * call, so no buffer tc_buffer_create makes between them slips by. */
    int rc = tc__start(c, TCW_UNREGISTER_BUFFER, o);
    if (rc)
        return rc;
    if (find_buf(c, id, NULL))
        return tc__finish(c, TC_INVALID_ARGUMENT); /* tc_buffer_destroy's */
    c->req.segment = id;
    const tc_trip t = {.send_fd = -1};
    return tc__finish(c, tc__round_trip(c, &t));
}

/* Where a file's registration goes: its segment, and its size (or NULL). */
struct file_out {
    tc_segment_id *id;
    uint64_t *size;
};

static int registered(tc_conn *c, void *out)
{
    const struct file_out *f = out;
    *f->id = c->resp.segment;
    if (f->size)
        *f->size = c->resp.size;
    return TC_OK;
}

int tc_file_register(tc_conn *c, const char *path, int direct, uint64_t size, tc_segment_id *id,
                     uint64_t *size_out, const tc_call_opts *o)
{
    if (!c || !path || !*path || !id)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_REGISTER_FILE, .name = path, .direct = direct, .size = size};
    struct file_out f = {id, size_out};
    return tc__call(c, &r, registered, &f, o);
}

/* within reports whether [p, p+len) lies inside [base, base+size). */
static int within(const void *p, uint64_t len, const void *base, uint64_t size, uint64_t *off)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    if (!base || a < b || a - b > size || len > size - (a - b))
        return 0;
    *off = a - b;
    return 1;
}

int tc_locate(tc_conn *c, const void *ptr, uint64_t len, tc_segment_id *segment, uint64_t *offset)
{
    if (!c || !ptr || !segment || !offset)
        return TC_INVALID_ARGUMENT;
    if (within(ptr, len, c->pool.base, c->pool.size, offset)) {
        *segment = c->pool.segment;
        return TC_OK;
    }
    int rc = TC_NOT_FOUND;
    pthread_mutex_lock(&c->mu);
    for (struct tc_buf *b = c->buffers; b; b = b->next)
        if (within(ptr, len, b->pub.data, b->pub.size, offset)) {
            *segment = b->pub.id;
            rc = TC_OK;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* ---- batches ------------------------------------------------------------- */

/* check_requests checks what a submit or transfer sends besides the
 * requests themselves (which the daemon checks, positionally). */
static int check_requests(const tc_request *reqs, size_t n, const tc_notify *notify, const int *codes)
{
    if (!reqs || n == 0 || n > (1u << 31) || !codes)
        return TC_INVALID_ARGUMENT;
    for (size_t i = 0; notify && i < n; i++)
        if (notify[i].len > TC_MAX_NOTIFY || (notify[i].len && !notify[i].payload))
            return TC_INVALID_ARGUMENT;
    return TC_OK;
}

int tc_batch_alloc(tc_conn *c, uint32_t capacity, tc_batch_id *out, const tc_call_opts *o)
{
    if (!c || capacity == 0 || capacity > (1u << 31) || !out)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_ALLOC_BATCH, .capacity = capacity};
    return tc__call(c, &r, get_batch, out, o);
}

/* request_codes decodes a code per request submitted. */
static int request_codes(tc_conn *c, void *codes)
{
    return tc__codes(c, codes, c->req.n_requests);
}

int tc_batch_submit(tc_conn *c, tc_batch_id batch, const tc_request *reqs, size_t n, const tc_notify *notify,
                    int *codes, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    int rc = check_requests(reqs, n, notify, codes);
    if (rc)
        return rc;
    const tcw_req r = {.kind = TCW_SUBMIT, .batch = batch, .requests = reqs, .n_requests = n, .notify = notify};
    return tc__call(c, &r, request_codes, codes, o);
}

int tc_task_status(tc_conn *c, tc_batch_id batch, uint32_t index, tc_task_info *out, const tc_call_opts *o)
{
    if (!c || !out || index > (1u << 31))
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_TASK_STATUS, .batch = batch, .index = index};
    return tc__call(c, &r, get_task, out, o);
}

int tc_batch_status(tc_conn *c, tc_batch_id batch, tc_summary *out, const tc_call_opts *o)
{
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_BATCH_STATUS, .batch = batch};
    return tc__call(c, &r, get_summary, out, o);
}

int tc_batch_wait(tc_conn *c, tc_batch_id batch, uint32_t timeout_ms, tc_summary *out, const tc_call_opts *o)
{
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_WAIT, .batch = batch, .timeout_ms = timeout_ms};
    return tc__call(c, &r, get_summary, out, o);
}

int tc_batch_free(tc_conn *c, tc_batch_id batch, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_FREE_BATCH, .batch = batch};
    return tc__call(c, &r, NULL, NULL, o);
}

/* Where a transfer's answer goes: codes and states (or NULL) a code per
 * request, and its summary (or NULL). */
struct transfer_out {
    int *codes, *states;
    tc_summary *summary;
};

static int transferred(tc_conn *c, void *out)
{
    const struct transfer_out *t = out;
    size_t n = c->req.n_requests;
    int rc = tc__positional(c, c->resp.n_states, n);
    if (rc == TC_OK)
        rc = tc__codes(c, t->codes, n);
    for (size_t i = 0; rc == TC_OK && t->states && i < n; i++)
        t->states[i] = tc__state(c->resp.states[i]);
    if (rc == TC_OK && t->summary)
        *t->summary = c->resp.summary;
    return rc;
}

int tc_transfer(tc_conn *c, const tc_request *reqs, size_t n, const tc_notify *notify, uint32_t timeout_ms,
                int *codes, int *states, tc_summary *summary, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    int rc = check_requests(reqs, n, notify, codes);
    if (rc)
        return rc;
    const tcw_req r = {
        .kind = TCW_TRANSFER, .requests = reqs, .n_requests = n, .notify = notify, .timeout_ms = timeout_ms};
    struct transfer_out t = {codes, states, summary};
    return tc__call(c, &r, transferred, &t, o);
}

/* ---- peers --------------------------------------------------------------- */

int tc_segment_export(tc_conn *c, const char *name, tc_segment_id segment, uint64_t offset, uint64_t length,
                      unsigned rights, uint64_t *size_out, const tc_call_opts *o)
{
    return tc_segment_export_to(c, name, NULL, 0, segment, offset, length, rights, size_out, o);
}

int tc_segment_export_to(tc_conn *c, const char *name, const char *const *grants, size_t n_grants,
                         tc_segment_id segment, uint64_t offset, uint64_t length, unsigned rights,
                         uint64_t *size_out, const tc_call_opts *o)
{
    if (!c || !name || !*name || rights > 0xff || n_grants > TC_MAX_GRANTS || (n_grants && !grants))
        return TC_INVALID_ARGUMENT;
    /* The daemon checks the names; these bounds keep the frame small. */
    for (size_t i = 0; i < n_grants; i++)
        if (!grants[i] || !*grants[i] || strlen(grants[i]) > TC_MAX_TENANT)
            return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_EXPORT_SEGMENT,
                       .name = name,
                       .segment = segment,
                       .offset = offset,
                       .length = length,
                       .rights = (uint8_t)rights,
                       .grants = grants,
                       .n_grants = n_grants};
    return tc__call(c, &r, size_out ? get_size : NULL, size_out, o);
}

/* named makes a call whose body is one name. */
static int named(tc_conn *c, int kind, const char *name, const tc_call_opts *o)
{
    if (!c || !name || !*name)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = kind, .name = name};
    return tc__call(c, &r, NULL, NULL, o);
}

int tc_segment_unexport(tc_conn *c, const char *name, const tc_call_opts *o)
{
    return named(c, TCW_UNEXPORT_SEGMENT, name, o);
}

int tc_notify_subscribe(tc_conn *c, const char *name, const tc_call_opts *o)
{
    return named(c, TCW_SUBSCRIBE, name, o);
}

static int get_remote(tc_conn *c, void *out)
{
    tc_remote *rem = out;
    rem->id = c->resp.segment;
    rem->size = c->resp.size;
    rem->epoch = c->resp.epoch;
    return TC_OK;
}

int tc_remote_open(tc_conn *c, const char *name, unsigned rights, int transport, tc_remote *out,
                   const tc_call_opts *o)
{
    if (!c || !name || !*name || rights > 0xff || transport < 0 || transport > 0xff || !out)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {
        .kind = TCW_OPEN_REMOTE, .name = name, .rights = (uint8_t)rights, .transport = (uint8_t)transport};
    return tc__call(c, &r, get_remote, out, o);
}

int tc_remote_close(tc_conn *c, tc_segment_id id, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_CLOSE_REMOTE, .segment = id};
    return tc__call(c, &r, NULL, NULL, o);
}

/* Where a poll's notifications go: one block at *out, *n of them. */
struct notes_out {
    tc_notification **out;
    size_t *n;
};

static int copy_notes(tc_conn *c, void *out)
{
    const struct notes_out *d = out;
    size_t k = c->resp.n_notes;
    int rc = tc__at_most(c, k, c->req.max);
    if (rc || k == 0)
        return rc;
    const tc_notification *src = c->resp.notes;
    size_t bytes = k * sizeof(tc_notification);
    for (size_t i = 0; i < k; i++)
        bytes += strlen(src[i].segment) + 1 + src[i].len;
    tc_notification *dst = malloc(bytes);
    if (!dst)
        return TC_ENOMEM;
    char *p = (char *)(dst + k);
    for (size_t i = 0; i < k; i++) {
        size_t sl = strlen(src[i].segment) + 1;
        memcpy(p, src[i].segment, sl);
        dst[i].segment = p;
        p += sl;
        if (src[i].len)
            memcpy(p, src[i].payload, src[i].len);
        dst[i].payload = (const uint8_t *)p;
        dst[i].len = src[i].len;
        p += src[i].len;
    }
    *d->out = dst;
    *d->n = k;
    return TC_OK;
}

int tc_notify_poll(tc_conn *c, uint32_t max, uint32_t timeout_ms, tc_notification **out, size_t *n,
                   const tc_call_opts *o)
{
    if (!c || !out || !n)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    *n = 0;
    const tcw_req r = {.kind = TCW_POLL_NOTIFICATIONS, .max = max, .timeout_ms = timeout_ms};
    struct notes_out d = {out, n};
    return tc__call(c, &r, copy_notes, &d, o);
}
