/*
 * internal.h - the connection and what its calls share.
 */
#ifndef TC_INTERNAL_H
#define TC_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codec.h"
#include "tensorcast.h"

/* A buffer tc_buffer_create made: the public part first, so a tc_buffer *
 * handed out is one of these. */
struct tc_buf {
    tc_buffer pub;
    struct tc_buf *next;
    uint32_t gen; /* the connection's generation it was registered in */
};

struct tc_conn {
    /* Set at connect and never changed after it: read without mu. */
    char *socket;
    tc_hello hello;
    tc_pool pool;
    uint32_t call_timeout_ms;
    size_t max_answer;   /* largest answer frame accepted */
    size_t max_request;  /* largest request frame the daemon takes */
    char *lane;          /* default context */
    uint32_t policy_version;
    char *name;                  /* sent with Hello, again on reconnecting */
    uint32_t connect_timeout_ms; /* bounds a reconnect as it bounded connect */
    int reconnect;               /* tc_options.reconnect */
    /* fd is the socket. It stays open until tc_close: a broken connection
     * is shut down, not closed, so tc_shutdown (which takes no lock) never
     * touches a number the process has reused. A reconnect puts the new
     * socket on the same number (dup3). */
    int fd;
    int shut; /* atomic: tc_shutdown was called; no reconnect after it */

    /* mu serializes calls: it guards every field below and the socket's
     * byte stream, for a call's whole round trip. */
    pthread_mutex_t mu;
    int broken; /* 0, or set once the stream's state is unknown */
    int foreign; /* a reconnect found another pool: no more reconnects */
    /* gen counts reconnects: what the daemon holds for this client
     * (buffers, queues) is of one generation and means nothing to the
     * next. Written under mu, read atomically also without it (queues). */
    uint32_t gen;
    uint64_t next_id;
    tcw_codec *codec;
    tcw_req req;   /* the request being made */
    tcw_resp resp; /* the answer to it; its views point into rbuf */
    uint8_t *rbuf;
    size_t rcap;
    struct tc_buf *buffers; /* made by tc_buffer_create, newest first */

    /* qmu guards queues, the list of open queues (queue.c), and the
     * store's results regions and tc_kvs (qstore.c). It is taken alone
     * (never with mu held across it), briefly, also by tc_shutdown. */
    pthread_mutex_t qmu;
    struct tc_queue *queues;
    struct tc_results *results;
    struct tc_kv *kvs;
};

/* TC__LIST_PUSH puts node at the head of one of c's lists that qmu guards
 * (queues, results, kvs). */
#define TC__LIST_PUSH(c, head, node) \
    do { \
        pthread_mutex_lock(&(c)->qmu); \
        (node)->next = (c)->head; \
        (c)->head = (node); \
        pthread_mutex_unlock(&(c)->qmu); \
    } while (0)

/* The parts of a round trip that vary by call. */
typedef struct tc_trip {
    int send_fd;          /* passed with the request (SCM_RIGHTS), or -1 */
    int *recv_fd;         /* set to an fd passed with the answer, or NULL */
    int *recv_fd2;        /* with recv_fd: set to a second one, or NULL */
    uint32_t extra_ms;    /* added to the call timeout (calls that wait in the daemon) */
    int64_t deadline_ns;  /* absolute CLOCK_MONOTONIC deadline instead of the call timeout; 0: none */
} tc_trip;

/* start locks c and prepares c->req for a call of kind with the context of
 * o over the connection's defaults. Returns TC_OK with c locked, or
 * TC_ECLOSED (unlocked) on a broken connection. With tc_options.reconnect,
 * a broken connection is dialled again first (a new generation, c->gen);
 * TC_ECLOSED then says that failed. */
int tc__start(tc_conn *c, int kind, const tc_call_opts *o);

/* finish unlocks c and returns rc. */
int tc__finish(tc_conn *c, int rc);

/* A call's decoder: it copies what the answer in c->resp says into out
 * (views into the answer do not outlive the call), checking its counts and
 * bounds; a malformed answer fails the call (tc__fail). Called with c
 * locked, once the answer is TC_OK. It may read c->req, the request being
 * answered. */
typedef int (*tc__decode)(tc_conn *c, void *out);

/* call makes one call of req's kind with req's body (its context comes from
 * o over the connection's defaults, as tc__start sets it): it takes c, makes
 * the round trip, has decode (when not NULL) copy the answer into out and
 * releases c. A call that waits in the daemon (req->timeout_ms) is given
 * that much beyond the call timeout. call_fd passes send_fd with the
 * request. */
int tc__call(tc_conn *c, const tcw_req *req, tc__decode decode, void *out, const tc_call_opts *o);
int tc__call_fd(tc_conn *c, const tcw_req *req, int send_fd, tc__decode decode, void *out, const tc_call_opts *o);

/* round_trip encodes c->req, sends it, reads the answer into c->resp and
 * checks that it answers this request with body kind (request id 0 only
 * with a refusal, a non-OK status). A non-OK status is returned as its
 * code. Any failure of the stream breaks the connection.
 * Called with c locked. */
int tc__round_trip(tc_conn *c, const tc_trip *t);

/* broken marks c broken (shutting its socket down) and returns rc. */
int tc__fail(tc_conn *c, int rc);

/* positional checks that an answer has one result per item: TC_EPROTO
 * (and a broken connection) otherwise. */
int tc__positional(tc_conn *c, size_t got, size_t want);

/* at_most checks that an answer has no more items than the call asked for
 * (max; 0: no limit): TC_EPROTO (and a broken connection) otherwise. */
int tc__at_most(tc_conn *c, size_t got, uint32_t max);

/* codes checks that an answer has n codes (tc__positional) and copies them
 * into codes. */
int tc__codes(tc_conn *c, int *codes, size_t n);

/* sealed reports whether fd is sealed against shrinking: memory the
 * daemon passes (the pool, a queue) must be, or a truncation of it would
 * fault every later access of this process's mapping (SIGBUS). */
int tc__sealed(int fd);

/* code and state are a code or a task state the daemon sent, as the
 * library hands it to its caller: the value when the protocol names it,
 * else TC_EPROTO. The header promises the protocol's values only; one past
 * them comes from a daemon speaking a protocol this library does not. */
static inline int tc__code(uint64_t v) { return v <= TC_INTERNAL ? (int)v : TC_EPROTO; }
static inline int tc__state(uint64_t v) { return v <= TC_TASK_CANCELED ? (int)v : TC_EPROTO; }

/* gen is c's generation now (see tc_conn.gen). */
static inline uint32_t tc__gen(const tc_conn *c) { return __atomic_load_n(&c->gen, __ATOMIC_ACQUIRE); }

/* now_ns is CLOCK_MONOTONIC in nanoseconds. */
int64_t tc__now_ns(void);

/* queues_shutdown stops every open queue of c (tc_queue_shutdown);
 * queues_release releases them all without telling the daemon (tc_close:
 * the connection's end releases them there). */
void tc__queues_shutdown(tc_conn *c);
void tc__queues_release(tc_conn *c);

/* One store entry for a queue (queue/doc.go, "Store calls"). */
typedef struct tc__store_entry {
    uint8_t op, flags;
    uint64_t local, local_off; /* the results region */
    uint64_t length;
    uint64_t user_data;
} tc__store_entry;

/* queue_store stages se with keys (checked, len bytes packed) in the
 * queue's data area and publishes it; *accepted is 0 when the ring or the
 * data area has no room now. TC_INVALID_ARGUMENT when len exceeds the
 * data area, TC_ECLOSED once the queue takes nothing more. */
int tc__queue_store(tc_queue *q, const tc__store_entry *se, const tc_keys *keys, size_t len, size_t *accepted);
/* queue_wait_room waits, after tc__queue_store found no room, until the
 * daemon publishes an sq_head past the one this side last read (which may
 * free room), and returns TC_OK; or TC_DEADLINE_EXCEEDED at deadline
 * (absolute CLOCK_MONOTONIC; 0: none), TC_ECLOSED once the queue takes
 * nothing more or its connection hung up (the daemon went away). */
int tc__queue_wait_room(tc_queue *q, int64_t deadline);
tc_conn *tc__queue_conn(const tc_queue *q);
uint32_t tc__queue_data_size(const tc_queue *q);

/* store_release frees the results regions and tc_kvs still made on c,
 * without their queues and buffers (tc_close releases those). */
void tc__store_release(tc_conn *c);

/* owns_buffer reports whether buf is a buffer tc_buffer_create made on c. */
int tc__owns_buffer(tc_conn *c, const tc_buffer *buf);

/* get32 and get64 read a little-endian (the host's) word at any
 * alignment: shared memory's, which the other side may have laid out. */
static inline uint32_t tc__get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t tc__get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* copy_values copies a batch of values out of the pool into the caller's
 * memory (copy.c): with memcpy when the batch is under TC__STREAM_MIN
 * bytes in all, else with non-temporal stores for each value of at least
 * TC__STREAM_VALUE_MIN bytes, fenced before it returns. */
typedef struct {
    void *dst;
    const void *src;
    size_t len;
} tc__span;
#define TC__STREAM_MIN ((uint64_t)4 << 20)
#define TC__STREAM_VALUE_MIN ((size_t)4096)
void tc__copy_values(const tc__span *spans, size_t n, uint64_t total);

#endif /* TC_INTERNAL_H */
