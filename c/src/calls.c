/*
 * calls.c - the control protocol's calls: ping, stats, pool blocks,
 * buffers, files, the batch lifecycle, exports, remote segments and
 * notifications.
 *
 * Each call checks its arguments, takes the connection (tc__start), fills
 * c->req, makes the round trip, checks the answer's counts and copies it
 * out before releasing the connection (tc__finish): views into the answer
 * do not outlive the call.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

static const tc_trip plain = {.send_fd = -1};

/* trip is a round trip without fds, waiting in the daemon up to wait_ms
 * beyond the call timeout. */
static int trip(tc_conn *c, uint32_t wait_ms)
{
    tc_trip t = plain;
    t.extra_ms = wait_ms;
    return tc__round_trip(c, &t);
}

static void copy_codes(int *dst, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i];
}

int tc_ping(tc_conn *c, const void *payload, size_t len, const tc_call_opts *o)
{
    if (!c || (len && !payload))
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_PING, o);
    if (rc)
        return rc;
    c->req.payload = payload;
    c->req.payload_len = len;
    rc = trip(c, 0);
    if (rc == TC_OK &&
        (c->resp.payload_len != len || (len && memcmp(c->resp.payload, payload, len) != 0)))
        rc = tc__fail(c, TC_EPROTO);
    return tc__finish(c, rc);
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

int tc_stats_get(tc_conn *c, tc_stats **out, const tc_call_opts *o)
{
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    int rc = tc__start(c, TCW_STATS, o);
    if (rc)
        return rc;
    rc = trip(c, 0);
    if (rc)
        return tc__finish(c, rc);
    const tc_stats *s = &c->resp.stats;
    const tc_counters *g[5] = {&s->pool, &s->engine, &s->connection, &s->transports, &s->store};
    size_t total = g[0]->n + g[1]->n + g[2]->n + g[3]->n + g[4]->n, bytes = sizeof(tc_stats);
    for (int i = 0; i < 5; i++)
        bytes += group_bytes(g[i]);
    tc_stats *st = malloc(bytes);
    if (!st)
        return tc__finish(c, TC_ENOMEM);
    tc_counter *items = (tc_counter *)(st + 1);
    char *names = (char *)(items + total);
    st->pool = copy_group(g[0], &items, &names);
    st->engine = copy_group(g[1], &items, &names);
    st->connection = copy_group(g[2], &items, &names);
    st->transports = copy_group(g[3], &items, &names);
    st->connections = s->connections;
    st->store = copy_group(g[4], &items, &names);
    *out = st;
    return tc__finish(c, TC_OK);
}

/* ---- pool blocks --------------------------------------------------------- */

int tc_blocks_alloc(tc_conn *c, uint32_t n, uint64_t size, uint64_t *offsets, const tc_call_opts *o)
{
    if (!c || n == 0 || n > (1u << 31) || size == 0 || !offsets)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_ALLOC_BLOCKS, o);
    if (rc)
        return rc;
    c->req.n = n;
    c->req.size = size;
    rc = trip(c, 0);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_u64s, n);
    for (size_t i = 0; rc == TC_OK && i < n; i++) {
        uint64_t off = c->resp.u64s[i];
        if (off >= c->pool.size || size > c->pool.size - off)
            rc = tc__fail(c, TC_EPROTO); /* a block outside the pool */
    }
    if (rc == TC_OK)
        memcpy(offsets, c->resp.u64s, n * sizeof *offsets);
    return tc__finish(c, rc);
}

int tc_blocks_free(tc_conn *c, const uint64_t *offsets, size_t n, int *codes, const tc_call_opts *o)
{
    if (!c || n == 0 || !offsets || !codes)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_FREE_BLOCKS, o);
    if (rc)
        return rc;
    c->req.offsets = offsets;
    c->req.n_offsets = n;
    rc = trip(c, 0);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_codes, n);
    if (rc == TC_OK)
        copy_codes(codes, c->resp.codes, n);
    return tc__finish(c, rc);
}

/* ---- buffers and files --------------------------------------------------- */

/* register_fd registers fd as a buffer of size bytes; c is locked. */
static int register_fd(tc_conn *c, int fd, uint64_t size, tc_segment_id *id)
{
    c->req.size = size;
    tc_trip t = plain;
    t.send_fd = fd;
    int rc = tc__round_trip(c, &t);
    if (rc == TC_OK)
        *id = c->resp.segment;
    return rc;
}

int tc_buffer_register_fd(tc_conn *c, int fd, uint64_t size, tc_segment_id *id, const tc_call_opts *o)
{
    /* A bad fd would fail sendmsg after the connection's stream is
     * committed to the frame; refuse it here. */
    if (!c || fd < 0 || fcntl(fd, F_GETFD) < 0 || size == 0 || !id)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_REGISTER_BUFFER, o);
    if (rc)
        return rc;
    return tc__finish(c, register_fd(c, fd, size, id));
}

static struct tc_buf *find_buf(tc_conn *c, tc_segment_id id, const tc_buffer *pub)
{
    for (struct tc_buf *b = c->buffers; b; b = b->next)
        if ((pub && &b->pub == pub) || (!pub && b->pub.id == id))
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

/* new_memfd makes what the daemon requires of a client buffer: a memfd of
 * size bytes sealed against shrinking (and growing), mapped shared. */
static int new_memfd(struct tc_buf *b, uint64_t size)
{
    b->pub.fd = memfd_create("tensorcast-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (b->pub.fd < 0)
        return errno == ENOMEM ? TC_ENOMEM : TC_ESYS;
    if (ftruncate(b->pub.fd, (off_t)size) < 0 ||
        fcntl(b->pub.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
        return TC_ESYS;
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, b->pub.fd, 0);
    if (p == MAP_FAILED)
        return errno == ENOMEM ? TC_ENOMEM : TC_ESYS;
    b->pub.data = p;
    b->pub.size = size;
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
    if (rc) {
        drop_buf(b);
        return rc;
    }
    if ((rc = tc__start(c, TCW_REGISTER_BUFFER, o))) {
        drop_buf(b);
        return rc;
    }
    rc = register_fd(c, b->pub.fd, size, &b->pub.id);
    if (rc == TC_OK) {
        b->next = c->buffers;
        c->buffers = b;
        *out = &b->pub;
    }
    tc__finish(c, rc);
    if (rc)
        drop_buf(b);
    return rc;
}

/* unregister unregisters segment id; c is locked. */
static int unregister(tc_conn *c, tc_segment_id id)
{
    c->req.segment = id;
    return trip(c, 0);
}

int tc_buffer_destroy(tc_conn *c, tc_buffer *buf, const tc_call_opts *o)
{
    if (!c || !buf)
        return TC_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    struct tc_buf *b = find_buf(c, 0, buf);
    if (b)
        unlink_buf(c, b);
    pthread_mutex_unlock(&c->mu);
    if (!b)
        return TC_INVALID_ARGUMENT; /* not a buffer of this connection */
    int rc = tc__start(c, TCW_UNREGISTER_BUFFER, o);
    if (rc == TC_OK)
        rc = tc__finish(c, unregister(c, b->pub.id));
    drop_buf(b);
    return rc;
}

int tc_segment_unregister(tc_conn *c, tc_segment_id id, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_UNREGISTER_BUFFER, o);
    if (rc)
        return rc;
    if (find_buf(c, id, NULL))
        return tc__finish(c, TC_INVALID_ARGUMENT); /* tc_buffer_destroy's */
    return tc__finish(c, unregister(c, id));
}

int tc_file_register(tc_conn *c, const char *path, int direct, uint64_t size, tc_segment_id *id,
                     uint64_t *size_out, const tc_call_opts *o)
{
    if (!c || !path || !*path || !id)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_REGISTER_FILE, o);
    if (rc)
        return rc;
    c->req.name = path;
    c->req.direct = direct;
    c->req.size = size;
    rc = trip(c, 0);
    if (rc == TC_OK) {
        *id = c->resp.segment;
        if (size_out)
            *size_out = c->resp.size;
    }
    return tc__finish(c, rc);
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
    int rc = tc__start(c, TCW_ALLOC_BATCH, o);
    if (rc)
        return rc;
    c->req.capacity = capacity;
    rc = trip(c, 0);
    if (rc == TC_OK)
        *out = c->resp.batch;
    return tc__finish(c, rc);
}

int tc_batch_submit(tc_conn *c, tc_batch_id batch, const tc_request *reqs, size_t n, const tc_notify *notify,
                    int *codes, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    int rc = check_requests(reqs, n, notify, codes);
    if (rc)
        return rc;
    if ((rc = tc__start(c, TCW_SUBMIT, o)))
        return rc;
    c->req.batch = batch;
    c->req.requests = reqs;
    c->req.n_requests = n;
    c->req.notify = notify;
    rc = trip(c, 0);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_codes, n);
    if (rc == TC_OK)
        copy_codes(codes, c->resp.codes, n);
    return tc__finish(c, rc);
}

int tc_task_status(tc_conn *c, tc_batch_id batch, uint32_t index, tc_task_info *out, const tc_call_opts *o)
{
    if (!c || !out || index > (1u << 31))
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_TASK_STATUS, o);
    if (rc)
        return rc;
    c->req.batch = batch;
    c->req.index = index;
    rc = trip(c, 0);
    if (rc == TC_OK)
        *out = c->resp.task;
    return tc__finish(c, rc);
}

int tc_batch_status(tc_conn *c, tc_batch_id batch, tc_summary *out, const tc_call_opts *o)
{
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_BATCH_STATUS, o);
    if (rc)
        return rc;
    c->req.batch = batch;
    rc = trip(c, 0);
    if (rc == TC_OK)
        *out = c->resp.summary;
    return tc__finish(c, rc);
}

int tc_batch_wait(tc_conn *c, tc_batch_id batch, uint32_t timeout_ms, tc_summary *out, const tc_call_opts *o)
{
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_WAIT, o);
    if (rc)
        return rc;
    c->req.batch = batch;
    c->req.timeout_ms = timeout_ms;
    rc = trip(c, timeout_ms);
    if (rc == TC_OK)
        *out = c->resp.summary;
    return tc__finish(c, rc);
}

int tc_batch_free(tc_conn *c, tc_batch_id batch, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_FREE_BATCH, o);
    if (rc)
        return rc;
    c->req.batch = batch;
    return tc__finish(c, trip(c, 0));
}

int tc_transfer(tc_conn *c, const tc_request *reqs, size_t n, const tc_notify *notify, uint32_t timeout_ms,
                int *codes, int *states, tc_summary *summary, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    int rc = check_requests(reqs, n, notify, codes);
    if (rc)
        return rc;
    if ((rc = tc__start(c, TCW_TRANSFER, o)))
        return rc;
    c->req.requests = reqs;
    c->req.n_requests = n;
    c->req.notify = notify;
    c->req.timeout_ms = timeout_ms;
    rc = trip(c, timeout_ms);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_codes, n);
    if (rc == TC_OK)
        rc = tc__positional(c, c->resp.n_states, n);
    if (rc == TC_OK) {
        copy_codes(codes, c->resp.codes, n);
        if (states)
            copy_codes(states, c->resp.states, n);
        if (summary)
            *summary = c->resp.summary;
    }
    return tc__finish(c, rc);
}

/* ---- peers --------------------------------------------------------------- */

int tc_segment_export(tc_conn *c, const char *name, tc_segment_id segment, uint64_t offset, uint64_t length,
                      unsigned rights, uint64_t *size_out, const tc_call_opts *o)
{
    if (!c || !name || !*name || rights > 0xff)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_EXPORT_SEGMENT, o);
    if (rc)
        return rc;
    c->req.name = name;
    c->req.segment = segment;
    c->req.offset = offset;
    c->req.length = length;
    c->req.rights = (uint8_t)rights;
    rc = trip(c, 0);
    if (rc == TC_OK && size_out)
        *size_out = c->resp.size;
    return tc__finish(c, rc);
}

/* named makes a call whose body is one name. */
static int named(tc_conn *c, int kind, const char *name, const tc_call_opts *o)
{
    if (!c || !name || !*name)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, kind, o);
    if (rc)
        return rc;
    c->req.name = name;
    return tc__finish(c, trip(c, 0));
}

int tc_segment_unexport(tc_conn *c, const char *name, const tc_call_opts *o)
{
    return named(c, TCW_UNEXPORT_SEGMENT, name, o);
}

int tc_notify_subscribe(tc_conn *c, const char *name, const tc_call_opts *o)
{
    return named(c, TCW_SUBSCRIBE, name, o);
}

int tc_remote_open(tc_conn *c, const char *name, unsigned rights, int transport, tc_remote *out,
                   const tc_call_opts *o)
{
    if (!c || !name || !*name || rights > 0xff || transport < 0 || transport > 0xff || !out)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_OPEN_REMOTE, o);
    if (rc)
        return rc;
    c->req.name = name;
    c->req.rights = (uint8_t)rights;
    c->req.transport = (uint8_t)transport;
    rc = trip(c, 0);
    if (rc == TC_OK) {
        out->id = c->resp.segment;
        out->size = c->resp.size;
        out->epoch = c->resp.epoch;
    }
    return tc__finish(c, rc);
}

int tc_remote_close(tc_conn *c, tc_segment_id id, const tc_call_opts *o)
{
    if (!c)
        return TC_INVALID_ARGUMENT;
    int rc = tc__start(c, TCW_CLOSE_REMOTE, o);
    if (rc)
        return rc;
    c->req.segment = id;
    return tc__finish(c, trip(c, 0));
}

int tc_notify_poll(tc_conn *c, uint32_t max, uint32_t timeout_ms, tc_notification **out, size_t *n,
                   const tc_call_opts *o)
{
    if (!c || !out || !n)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    *n = 0;
    int rc = tc__start(c, TCW_POLL_NOTIFICATIONS, o);
    if (rc)
        return rc;
    c->req.max = max;
    c->req.timeout_ms = timeout_ms;
    rc = trip(c, timeout_ms);
    if (rc == TC_OK && max > 0 && c->resp.n_notes > max)
        rc = tc__fail(c, TC_EPROTO);
    size_t k = c->resp.n_notes;
    if (rc || k == 0)
        return tc__finish(c, rc);
    const tc_notification *src = c->resp.notes;
    size_t bytes = k * sizeof(tc_notification);
    for (size_t i = 0; i < k; i++)
        bytes += strlen(src[i].segment) + 1 + src[i].len;
    tc_notification *dst = malloc(bytes);
    if (!dst)
        return tc__finish(c, TC_ENOMEM);
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
    *out = dst;
    *n = k;
    return tc__finish(c, TC_OK);
}
