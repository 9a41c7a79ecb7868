/*
 * tensorcast.h - the C client of tensorcastd.
 *
 * libtensorcast talks to the tensorcast daemon over its unix-socket control
 * protocol (frames of a u32 little-endian length and a flatbuffer, see
 * fbs/control.fbs) and shares memory with it: the daemon's DRAM pool and
 * the client's own buffers are sealed memfds mapped by both sides. It holds
 * no Go runtime; it needs libc, libpthread and libstdc++ (the codec is
 * flatbuffers' C++ behind this C interface; link the static archive with
 * -lstdc++).
 *
 * Conventions
 *
 *  - Every call returns an int: TC_OK (0), one of the protocol's status codes
 *    (TC_INVALID_ARGUMENT .. TC_INTERNAL, the values of the schema's enum
 *    Code), or a negative library-local code (TC_ECLOSED .. TC_EINTERNAL) for
 *    a failure on this side. tc_strerror names each. A bad argument found
 *    before anything is sent is TC_INVALID_ARGUMENT, as the daemon would say.
 *  - No call aborts, exits or raises a signal: the socket is written with
 *    MSG_NOSIGNAL, EINTR is retried, allocation failures are TC_ENOMEM.
 *  - Batch calls are positional: codes[i] is the code of item i, for exactly
 *    as many items as were passed. An answer with another count fails the
 *    whole call with TC_EPROTO.
 *  - After TC_ECLOSED, TC_ETIMEDOUT or TC_EPROTO the connection is broken:
 *    what the daemon holds for it is unknown, so the library shuts the socket
 *    down and every later call returns TC_ECLOSED. tc_close it and connect
 *    again; the daemon releases everything a closed connection held.
 *  - Calls that take a `const tc_call_opts *` accept NULL for the
 *    connection's defaults.
 *
 * Threads
 *
 *  A connection may be used from several threads: each call takes the
 *  connection's mutex for its whole round trip, so calls on one connection
 *  run one at a time, in the order they take the mutex. A call that waits in
 *  the daemon (tc_batch_wait, tc_transfer, tc_notify_poll) holds the
 *  connection for as long as it waits; threads that must not wait behind it
 *  use a connection of their own. tc_shutdown may be called from any thread
 *  at any time; tc_close must be the last call on a connection, made when no
 *  other thread is inside a call on it. A connection is not usable in the
 *  child of a fork.
 *
 * Memory
 *
 *  Transfers address memory by (segment, offset). Two kinds of memory are
 *  shared with the daemon: blocks of its pool (tc_blocks_alloc; the whole
 *  pool is mapped in this process at connect) and client buffers. The daemon
 *  maps a client buffer from a memfd sealed against shrinking, so a buffer
 *  cannot be registered from an arbitrary pointer: tc_buffer_create makes
 *  memory the daemon can map (a sealed memfd, mapped here and registered),
 *  tc_buffer_register_fd registers a memfd or file of the caller's own, and
 *  tc_locate turns a pointer into pool or buffer memory back into its
 *  (segment, offset).
 */
#ifndef TENSORCAST_H
#define TENSORCAST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TC_API __attribute__((visibility("default")))
#else
#define TC_API
#endif

/* The control protocol version this library speaks (Hello checks it). */
#define TC_PROTOCOL_VERSION 1

/* Where tensorcastd listens unless configured otherwise; $TENSORCAST_SOCKET
 * overrides it for tc_connect. */
#define TC_DEFAULT_SOCKET "/run/tensorcast/tensorcastd.sock"

/* The largest notification a WRITE may carry. */
#define TC_MAX_NOTIFY 4096

/* ---- Codes --------------------------------------------------------------- */

enum {
    TC_OK = 0,
    /* The protocol's codes (fbs/control.fbs, enum Code). */
    TC_INVALID_ARGUMENT = 1,
    TC_NOT_FOUND = 2,
    TC_ALREADY_EXISTS = 3,
    TC_BUSY = 4,
    TC_RESOURCE_EXHAUSTED = 5,
    TC_FAILED_PRECONDITION = 6,
    TC_PERMISSION_DENIED = 7,
    TC_DEADLINE_EXCEEDED = 8,
    TC_UNAVAILABLE = 9,
    TC_INTERNAL = 10,
    /* Library-local codes. */
    TC_ECLOSED = -1,   /* the connection is closed, or broke (the daemon went away) */
    TC_ETIMEDOUT = -2, /* the connect or call timeout ran out; the connection is broken */
    TC_EPROTO = -3,    /* the daemon's answer is malformed or does not match the request */
    TC_ESYS = -4,      /* a system call failed; errno says which error */
    TC_ENOMEM = -5,    /* out of memory in this process */
    TC_EVERSION = -6,  /* the daemon speaks another protocol version */
    TC_EINTERNAL = -7  /* a bug in libtensorcast (its encoder refused its own message) */
};

/* tc_strerror returns a static, human-readable name for any code. */
TC_API const char *tc_strerror(int code);

/* ---- Types --------------------------------------------------------------- */

typedef uint64_t tc_segment_id;
typedef uint64_t tc_batch_id;
typedef struct tc_conn tc_conn;

/* Options of tc_connect. Zero-initialize; a zero field takes its default. */
typedef struct tc_options {
    const char *socket;          /* NULL: $TENSORCAST_SOCKET, then TC_DEFAULT_SOCKET */
    const char *name;            /* client name sent with Hello; NULL: the program's name */
    uint32_t connect_timeout_ms; /* bounds connect, Hello and mapping the pool; 0: 5000 */
    /* Bounds each call's socket I/O; 0: none. Calls that wait in the daemon
     * add their own timeout to it (pass one explicitly when this is set:
     * a timeout of 0 means the daemon's default, which this cannot know). */
    uint32_t call_timeout_ms;
    uint32_t max_frame;      /* largest answer accepted; 0: the daemon's max_frame (at least 1 MiB) */
    const char *lane;        /* default lane of every call; NULL: none */
    uint32_t policy_version; /* default policy version of every call */
} tc_options;

/* One call's context (Context in the schema). Zero-initialize; NULL and 0
 * fields take the connection's defaults. */
typedef struct tc_call_opts {
    /* A mutating call with a key is idempotent on its connection: a retry
     * with the same key returns the first answer; the same key with other
     * arguments is refused with TC_FAILED_PRECONDITION. */
    const char *idempotency_key;
    const char *lane;
    uint32_t policy_version;
    uint8_t qos;
    uint32_t deadline_ms; /* relative; bounds the call's work in the daemon */
} tc_call_opts;

/* The daemon's limits, from Hello. */
typedef struct tc_limits {
    uint32_t max_frame;
    uint32_t max_buffers;
    uint32_t max_blocks;
    uint32_t max_batches;
    uint32_t max_batch_capacity;
    uint32_t max_requests;
    uint32_t max_idempotency_keys;
} tc_limits;

/* What the daemon said at connect. The strings live until tc_close. */
typedef struct tc_hello {
    uint32_t protocol_version;
    const char *daemon_id;
    const char *version;
    const char *peer_addr; /* where its peer plane listens; "" without one */
    tc_limits limits;
} tc_hello;

/* The daemon's DRAM pool as mapped in this process (valid until tc_close).
 * Pool blocks from tc_blocks_alloc are base[offset .. offset+size). fd is the
 * pool's memfd, open until tc_close: map it again (MAP_SHARED) for a
 * mapping that outlives the connection; do not close it. */
typedef struct tc_pool {
    tc_segment_id segment;
    uint64_t size;
    void *base;
    int fd;
    const uint64_t *block_classes; /* block sizes, smallest first */
    size_t n_block_classes;
} tc_pool;

/* A client buffer made by tc_buffer_create: size bytes at data, a sealed
 * memfd (fd, open until tc_buffer_destroy) registered as segment id. */
typedef struct tc_buffer {
    tc_segment_id id;
    void *data;
    uint64_t size;
    int fd;
} tc_buffer;

/* Direction of a transfer: READ moves target -> local, WRITE local -> target. */
enum { TC_OP_READ = 1, TC_OP_WRITE = 2 };

/* One transfer of length bytes between (local, local_offset) and
 * (target, target_offset). */
typedef struct tc_request {
    tc_segment_id local;
    uint64_t local_offset;
    tc_segment_id target;
    uint64_t target_offset;
    uint64_t length;
    uint32_t op; /* TC_OP_READ or TC_OP_WRITE */
} tc_request;

/* A notification riding on a WRITE to a remote segment: delivered to the
 * target daemon's subscribed client once the bytes have landed. len 0 means
 * none; at most TC_MAX_NOTIFY bytes. */
typedef struct tc_notify {
    const void *payload;
    size_t len;
} tc_notify;

/* Task states (the schema's enum TaskState). */
enum {
    TC_TASK_INVALID = 0, /* refused at submit, or never a task */
    TC_TASK_WAITING = 1,
    TC_TASK_PENDING = 2,
    TC_TASK_COMPLETED = 3,
    TC_TASK_FAILED = 4,
    TC_TASK_TIMEOUT = 5,
    TC_TASK_CANCELED = 6
};

typedef struct tc_task_info {
    int state;            /* TC_TASK_* */
    int code;             /* TC_OK, or why a task that ended did not complete */
    uint64_t transferred; /* bytes moved */
} tc_task_info;

/* A batch's tasks counted by state, and the bytes they moved. */
typedef struct tc_summary {
    uint32_t total;
    uint32_t waiting;
    uint32_t pending;
    uint32_t completed;
    uint32_t failed;
    uint32_t timeout;
    uint32_t canceled;
    uint64_t transferred;
} tc_summary;

/* Rights on an exported segment or an opened remote one. */
enum { TC_RIGHT_READ = 1, TC_RIGHT_WRITE = 2 };

/* How requests to a remote segment travel. AUTO: RDMA when both daemons have
 * a usable device, else tcp. TCP: always tcp. RDMA: RDMA or a failed
 * request, never tcp. */
enum { TC_TRANSPORT_AUTO = 0, TC_TRANSPORT_TCP = 1, TC_TRANSPORT_RDMA = 2 };

/* A peer's segment opened with tc_remote_open; id is usable as a request
 * target until tc_remote_close or the connection closes. */
typedef struct tc_remote {
    tc_segment_id id;
    uint64_t size;
    uint64_t epoch;
} tc_remote;

/* A notification a peer attached to a WRITE into a segment this client
 * subscribed to. */
typedef struct tc_notification {
    const char *segment; /* the exported name it was written to */
    const uint8_t *payload;
    size_t len;
} tc_notification;

typedef struct tc_counter {
    const char *name;
    uint64_t value;
} tc_counter;

typedef struct tc_counters {
    const tc_counter *items;
    size_t n;
} tc_counters;

/* The daemon's counters (tc_stats). */
typedef struct tc_stats {
    tc_counters pool;
    tc_counters engine;
    tc_counters connection; /* this connection's holdings */
    tc_counters transports; /* transports' features and counters */
    uint32_t connections;
} tc_stats;

/* ---- Connection ---------------------------------------------------------- */

/* tc_connect connects to the daemon, says Hello (checking the protocol
 * version: TC_EVERSION) and maps the pool. opts may be NULL. On success *out
 * is the connection; on failure *out is NULL and nothing is left open. */
TC_API int tc_connect(const tc_options *opts, tc_conn **out);

/* tc_close closes the connection (the daemon then releases everything it
 * held: blocks, batches, buffers, exports, queues), unmaps the pool, destroys
 * the buffers tc_buffer_create made on it and releases its open queues.
 * NULL is a no-op. */
TC_API void tc_close(tc_conn *c);

/* tc_shutdown shuts the connection's socket down without closing it: calls
 * blocked in other threads return TC_ECLOSED, later calls too, and so do the
 * connection's queues (tc_queue_shutdown). Safe from any thread at any time
 * before tc_close. */
TC_API void tc_shutdown(tc_conn *c);

/* tc_hello_info returns what the daemon said at connect (valid until
 * tc_close). */
TC_API const tc_hello *tc_hello_info(const tc_conn *c);

/* tc_ping makes one round trip carrying payload and checks that it comes
 * back unchanged (TC_EPROTO otherwise). */
TC_API int tc_ping(tc_conn *c, const void *payload, size_t len, const tc_call_opts *o);

/* tc_stats_get returns the daemon's counters in *out, one allocation that the
 * caller frees with tc_free. */
TC_API int tc_stats_get(tc_conn *c, tc_stats **out, const tc_call_opts *o);

/* tc_free frees what tc_stats_get and tc_notify_poll returned. NULL is a no-op. */
TC_API void tc_free(void *p);

/* ---- Pool ---------------------------------------------------------------- */

/* tc_pool_info returns the pool as mapped at connect (valid until tc_close). */
TC_API const tc_pool *tc_pool_info(const tc_conn *c);

/* tc_blocks_alloc allocates n pool blocks of size bytes, all or nothing,
 * and stores their offsets in offsets[0..n). Each is checked to lie inside
 * the pool. */
TC_API int tc_blocks_alloc(tc_conn *c, uint32_t n, uint64_t size, uint64_t *offsets,
                           const tc_call_opts *o);

/* tc_blocks_free frees n pool blocks; codes[i] is TC_OK or why offsets[i]
 * was not freed (TC_NOT_FOUND: not held; TC_BUSY: a transfer still moves
 * bytes in it; TC_FAILED_PRECONDITION: exported). */
TC_API int tc_blocks_free(tc_conn *c, const uint64_t *offsets, size_t n, int *codes,
                          const tc_call_opts *o);

/* ---- Buffers and files --------------------------------------------------- */

/* tc_buffer_create creates a memfd of size bytes sealed against shrinking
 * and growing, maps it here, registers it with the daemon and returns it in
 * *out. It lives until tc_buffer_destroy or tc_close. */
TC_API int tc_buffer_create(tc_conn *c, uint64_t size, tc_buffer **out, const tc_call_opts *o);

/* tc_buffer_destroy unregisters buf, unmaps it and closes its memfd. The
 * memory is released even when unregistering fails (the code says why; a
 * broken connection has already dropped it in the daemon). */
TC_API int tc_buffer_destroy(tc_conn *c, tc_buffer *buf, const tc_call_opts *o);

/* tc_buffer_register_fd registers the first size bytes of fd as a client
 * buffer: a memfd sealed with F_SEAL_SHRINK (the daemon refuses an unsealed
 * one, TC_INVALID_ARGUMENT), or a regular file. The daemon maps its own
 * copy of fd; the caller keeps fd and its own mapping. */
TC_API int tc_buffer_register_fd(tc_conn *c, int fd, uint64_t size, tc_segment_id *id,
                                 const tc_call_opts *o);

/* tc_file_register asks the daemon to open path (O_DIRECT when direct) as a
 * file segment of size bytes (0: the file's size), under its data_dir or
 * allowed_files. *id is the segment, *size_out (may be NULL) its size. */
TC_API int tc_file_register(tc_conn *c, const char *path, int direct, uint64_t size,
                            tc_segment_id *id, uint64_t *size_out, const tc_call_opts *o);

/* tc_segment_unregister unregisters a buffer registered by fd or a file
 * segment. A buffer made by tc_buffer_create is refused
 * (TC_INVALID_ARGUMENT): destroy it with tc_buffer_destroy. */
TC_API int tc_segment_unregister(tc_conn *c, tc_segment_id id, const tc_call_opts *o);

/* tc_locate finds the segment and offset of [ptr, ptr+len): inside the
 * pool, or inside a buffer tc_buffer_create made on c. TC_NOT_FOUND
 * otherwise (memory the daemon cannot address). */
TC_API int tc_locate(tc_conn *c, const void *ptr, uint64_t len, tc_segment_id *segment,
                     uint64_t *offset);

/* ---- Batches ------------------------------------------------------------- */

/* tc_batch_alloc allocates a batch of up to capacity tasks. */
TC_API int tc_batch_alloc(tc_conn *c, uint32_t capacity, tc_batch_id *out, const tc_call_opts *o);

/* tc_batch_submit adds n requests to batch in one message. codes[i] is
 * TC_OK when reqs[i] was accepted, else why it was refused; a refused
 * request still takes its task index. notify is NULL or n entries,
 * positional with reqs. */
TC_API int tc_batch_submit(tc_conn *c, tc_batch_id batch, const tc_request *reqs, size_t n,
                           const tc_notify *notify, int *codes, const tc_call_opts *o);

/* tc_task_status returns task index of batch. */
TC_API int tc_task_status(tc_conn *c, tc_batch_id batch, uint32_t index, tc_task_info *out,
                          const tc_call_opts *o);

/* tc_batch_status returns batch's summary. */
TC_API int tc_batch_status(tc_conn *c, tc_batch_id batch, tc_summary *out, const tc_call_opts *o);

/* tc_batch_wait waits up to timeout_ms (0: the daemon's default) for
 * batch's tasks to end and returns its summary; waiting + pending > 0 in it
 * means the time ran out. */
TC_API int tc_batch_wait(tc_conn *c, tc_batch_id batch, uint32_t timeout_ms, tc_summary *out,
                         const tc_call_opts *o);

/* tc_batch_free frees batch; TC_BUSY while tasks are waiting or pending
 * (nothing changes then). */
TC_API int tc_batch_free(tc_conn *c, tc_batch_id batch, const tc_call_opts *o);

/* tc_transfer runs n requests in one message: the daemon allocates a batch,
 * submits, waits up to timeout_ms (0: the call's deadline or the daemon's
 * default) and frees it. codes[i] is TC_OK when reqs[i] completed, else
 * why not; states (may be NULL) gets each task's final TC_TASK_* state;
 * summary (may be NULL) the batch's. notify as tc_batch_submit. */
TC_API int tc_transfer(tc_conn *c, const tc_request *reqs, size_t n, const tc_notify *notify,
                       uint32_t timeout_ms, int *codes, int *states, tc_summary *summary,
                       const tc_call_opts *o);

/* ---- Peers --------------------------------------------------------------- */

/* tc_segment_export makes [offset, offset+length) of segment (a buffer this
 * connection registered, length 0 = to its end; or the pool, within blocks
 * it holds) reachable by peer daemons as name, with rights
 * (TC_RIGHT_READ | TC_RIGHT_WRITE). *size_out (may be NULL) is the
 * exported size. The export ends with tc_segment_unexport or when the
 * connection closes. */
TC_API int tc_segment_export(tc_conn *c, const char *name, tc_segment_id segment, uint64_t offset,
                             uint64_t length, unsigned rights, uint64_t *size_out,
                             const tc_call_opts *o);

/* tc_segment_unexport ends an export of this connection. */
TC_API int tc_segment_unexport(tc_conn *c, const char *name, const tc_call_opts *o);

/* tc_remote_open opens "peer/segment" on another daemon with rights, its
 * requests travelling by transport (TC_TRANSPORT_*). */
TC_API int tc_remote_open(tc_conn *c, const char *name, unsigned rights, int transport,
                          tc_remote *out, const tc_call_opts *o);

/* tc_remote_close closes a remote segment this connection opened. */
TC_API int tc_remote_close(tc_conn *c, tc_segment_id id, const tc_call_opts *o);

/* tc_notify_subscribe makes this connection receive the notifications peers
 * attach to WRITEs into the segment this daemon exports as name. */
TC_API int tc_notify_subscribe(tc_conn *c, const char *name, const tc_call_opts *o);

/* tc_notify_poll takes up to max queued notifications (0: as many as fit
 * one answer), waiting up to timeout_ms for the first (0: do not wait).
 * *out is one allocation of *n notifications (NULL when none), freed with
 * tc_free. */
TC_API int tc_notify_poll(tc_conn *c, uint32_t max, uint32_t timeout_ms, tc_notification **out,
                          size_t *n, const tc_call_opts *o);

/* ---- Queues -------------------------------------------------------------- */

/*
 * A queue is a submission ring and a completion ring shared with the daemon
 * (a sealed memfd the daemon makes and passes at tc_queue_open): the data
 * path for many requests in flight on one connection. tc_queue_submit writes
 * entries into the submission ring and publishes them; the daemon takes each
 * one, checks it as it checks a batch's request, runs it and posts exactly one
 * completion for it, in no particular order (user_data says which);
 * tc_queue_reap takes completions.
 *
 * While both sides are busy neither makes a system call. A submit rings the
 * daemon (a futex wake) only when the daemon sleeps for want of entries; a
 * reap rings it only when it sleeps for want of completion-ring space; a reap
 * with too little ready spins briefly (an adaptive budget of at most spin_us),
 * then sleeps on a futex word in the mapping until the daemon posts.
 *
 * Backpressure: the daemon takes an entry only when a completion slot is free
 * for it, counting those in flight. A client that stops reaping sees submit
 * accept fewer entries (0 once the submission ring is full), never a lost
 * completion.
 *
 * Threads: one thread at a time submits (tc_queue_submit,
 * tc_queue_submit_notify, tc_queue_nop) and one at a time reaps
 * (tc_queue_reap, tc_queue_wait); a submitting and a reaping thread may run at
 * once. Each side has a mutex that serializes its calls from several threads
 * (a reap that waits holds its side while it waits). A queue does not take
 * its connection's mutex, except tc_queue_open and tc_queue_close, which make
 * a round trip on the connection. tc_queue_shutdown may be called from any
 * thread at any time before tc_queue_close; tc_queue_close must be the last
 * call on a queue, and tc_close of its connection releases every queue still
 * open on it (their tc_queue * are then invalid).
 *
 * Failure: TC_ECLOSED from a submit or a reap means the queue takes nothing
 * more: tc_queue_shutdown or tc_shutdown was called, the daemon closed the
 * queue (tc_queue_get_info's state says TC_QUEUE_CLOSED), the daemon refused
 * an index this process wrote into the ring (TC_QUEUE_BROKEN), or the daemon
 * went away. A reap that sleeps checks its connection for a hang-up at least
 * every 200 ms, so a dead daemon ends a wait promptly. Submit makes no system
 * call to find out: it accepts entries until the ring is full.
 */

typedef struct tc_queue tc_queue;

/* The most submission entries a queue may have (the daemon may allow fewer:
 * TC_RESOURCE_EXHAUSTED). */
#define TC_QUEUE_MAX_ENTRIES 32768u

/* tc_queue_opts.flags: TC_QUEUE_NOSPIN makes a reap sleep at once when too
 * little is ready, without spinning first. */
enum { TC_QUEUE_NOSPIN = 1 };

/* Options of tc_queue_open. Zero-initialize; a zero field takes its default. */
typedef struct tc_queue_opts {
    uint32_t cq_entries;         /* completion ring; 0: twice the submission ring (its minimum) */
    uint32_t data_size;          /* bytes for notification payloads in flight; 0: the daemon's default */
    uint32_t request_timeout_us; /* each request's deadline, counted from when the daemon takes it;
                                  * 0: the daemon's default */
    uint32_t spin_us;            /* ceiling of a reap's adaptive spin; 0: 50, at most 1000 */
    uint32_t flags;              /* TC_QUEUE_NOSPIN */
} tc_queue_opts;

/* One completion: the end of one submitted request. */
typedef struct tc_cqe {
    uint64_t user_data;   /* as submitted */
    uint64_t transferred; /* bytes moved */
    int code;             /* TC_OK, or why the request did not complete (the protocol's codes) */
    int state;            /* its final TC_TASK_* state (TC_TASK_FAILED when refused before it ran) */
} tc_cqe;

/* tc_queue_info.state bits, written by the daemon. */
enum { TC_QUEUE_CLOSED = 1, TC_QUEUE_BROKEN = 2 };

/* A queue's geometry, as the daemon made it, and its counters. */
typedef struct tc_queue_info {
    uint64_t id;
    uint32_t sq_entries; /* requests submitted and not yet taken by the daemon, at most */
    uint32_t cq_entries; /* requests in flight, at most */
    uint32_t data_size;
    uint32_t state;            /* TC_QUEUE_CLOSED, TC_QUEUE_BROKEN */
    uint64_t submitted;        /* entries published */
    uint64_t reaped;           /* completions taken */
    uint64_t submit_doorbells; /* futex wakes by submits (the daemon slept for entries) */
    uint64_t reap_doorbells;   /* futex wakes by reaps (the daemon slept for completion slots) */
    uint64_t sleeps;           /* futex waits by reaps and waits */
    /* Sleeps that ran out their time slice (200 ms) and then found the
     * completions they waited for: a wake-up that never came. 0 unless the
     * daemon stalled for a whole slice just as it posted. */
    uint64_t missed_wakeups;
} tc_queue_info;

/* tc_queue_open opens a queue of entries submission slots (1 ..
 * TC_QUEUE_MAX_ENTRIES, rounded up to a power of two, at least 2) on c and
 * maps it. The mapping's header is checked against the daemon's answer
 * (TC_EPROTO, and a broken connection, when they differ). opts may be NULL. */
TC_API int tc_queue_open(tc_conn *c, uint32_t entries, const tc_queue_opts *opts, tc_queue **out);

/* tc_queue_submit queues reqs[i] with user_data[i], in order, and publishes
 * them: *accepted is how many went in, fewer than n when the submission ring
 * is full (reap, then submit the rest). Each accepted request gets exactly one
 * completion. Nothing is checked here but the pointers: the daemon answers a
 * request it refuses with a completion carrying the code. It never waits and,
 * while the daemon is busy, makes no system call. */
TC_API int tc_queue_submit(tc_queue *q, const tc_request *reqs, const uint64_t *user_data, size_t n,
                           size_t *accepted);

/* tc_queue_submit_notify is tc_queue_submit with notify[i] (len 0: none)
 * carried by the WRITE reqs[i] to a peer's subscribed client; its completion
 * comes only once the peer has acknowledged it. The payloads are copied into
 * the queue's data area; a submission stops early (*accepted < n, TC_OK) when
 * the area has no room until the daemon takes earlier entries. A payload over
 * TC_MAX_NOTIFY is TC_INVALID_ARGUMENT, with the requests before it accepted. */
TC_API int tc_queue_submit_notify(tc_queue *q, const tc_request *reqs, const tc_notify *notify,
                                  const uint64_t *user_data, size_t n, size_t *accepted);

/* tc_queue_nop queues a request that moves nothing and completes at once with
 * TC_OK: a round trip through the queue itself. *accepted is 0 or 1. */
TC_API int tc_queue_nop(tc_queue *q, uint64_t user_data, size_t *accepted);

/* tc_queue_reap takes up to max completions into cqes and sets *n to how
 * many. It waits until at least min are ready (min 0: it does not wait), at
 * most timeout_ns (negative: no limit; 0: no wait). TC_OK: *n >= min.
 * TC_DEADLINE_EXCEEDED: the time ran out first (*n < min; the queue is fine).
 * TC_ECLOSED: the queue takes nothing more (see above); *n completions were
 * still taken. min may not exceed max or the completion ring. */
TC_API int tc_queue_reap(tc_queue *q, tc_cqe *cqes, size_t max, size_t min, int64_t timeout_ns,
                         size_t *n);

/* tc_queue_wait waits as tc_queue_reap does until at least min completions
 * are ready, without taking them. */
TC_API int tc_queue_wait(tc_queue *q, size_t min, int64_t timeout_ns);

/* tc_queue_get_info fills *out with q's geometry, its state and its counters
 * (each side's counters as of its last call). */
TC_API void tc_queue_get_info(const tc_queue *q, tc_queue_info *out);

/* tc_queue_shutdown stops q without releasing it: a reap waiting in another
 * thread returns TC_ECLOSED, later submits and waits too (a reap still takes
 * what is ready). Safe from any thread at any time before tc_queue_close. */
TC_API void tc_queue_shutdown(tc_queue *q);

/* tc_queue_close closes q: the daemon ends what is in flight on it
 * (completions not yet reaped are lost) and q's memory is released, whatever
 * the code (a broken connection has already dropped the queue: TC_ECLOSED).
 * A reap waiting in another thread returns TC_ECLOSED first. NULL is a no-op. */
TC_API int tc_queue_close(tc_queue *q);

/*
 * Not yet in this header, and added beside the calls above when the daemon
 * serves them: the KV store calls (issue 11): put, get, exists,
 * lookup-prefix, remove, pin and unpin, with positional per-key codes.
 */

#ifdef __cplusplus
}
#endif

#endif /* TENSORCAST_H */
