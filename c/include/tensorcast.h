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
 *  - A status the daemon sends that the protocol does not name fails the
 *    call with TC_EPROTO; a per-item code, a completion's code or a task
 *    state it does not name is handed on as TC_EPROTO.
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
 *  maps a client buffer from a memfd (or tmpfs file), so a buffer cannot be
 *  registered from an arbitrary pointer: tc_buffer_create makes memory the
 *  daemon can map (a sealed memfd, mapped here and registered),
 *  tc_buffer_register_fd registers a memfd or tmpfs file of the caller's
 *  own, and tc_locate turns a pointer into pool or buffer memory back into
 *  its (segment, offset).
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
    /* Non-zero: a call that finds the connection broken or hung up (the
     * daemon restarted, was upgraded or crashed) connects again first,
     * says Hello and checks that the daemon's pool is the memfd mapped at
     * connect; the call then goes on over the new connection. A call that
     * was in flight when the connection broke has failed and is not
     * retried (it may have been applied); so is a queue's call (a tc_kv's
     * too), which ends with TC_ECLOSED: open a new one. The pool mapping stays valid: a restart that kept L1 keeps
     * the pool, and every offset into it. A daemon with another pool is
     * refused with TC_ECLOSED, for good (tc_connect again). Everything the
     * old connection held in the daemon is gone: pins, reservations,
     * batches, exports, queues (their calls end with TC_ECLOSED) and
     * buffers (tc_buffer_destroy then only releases their memory). No
     * reconnect follows tc_shutdown. */
    int reconnect;
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
    /* A store put or commit keeps this many copies of each value across the
     * daemons of the cluster (this one's included; 1 .. 8; more is
     * TC_INVALID_ARGUMENT) instead of the daemon's store_replicas: with
     * durable, each code comes once every copy is on its holder's L2. 0:
     * the daemon's. (It sits in what was padding: the struct's size and
     * its other fields' offsets are as before.) */
    uint8_t replicas;
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
 * memfd (fd, open until tc_buffer_destroy) registered as segment id. huge is
 * how many of its bytes are on transparent 2 MiB pages, as the pool's are:
 * its whole 2 MiB spans (data is on a 2 MiB boundary when size is at least
 * that), unless the kernel had none to give (before Linux 6.1, shmem_enabled
 * = deny, or memory too fragmented); the daemon then maps them with 2 MiB
 * entries too, and copies into and out of them cost it less. */
typedef struct tc_buffer {
    tc_segment_id id;
    void *data;
    uint64_t size;
    int fd;
    uint64_t huge;
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
    tc_counters store; /* the KV block store's figures (none without a store) */
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

/* tc_reconnects is how many times c connected again after its connection
 * broke (tc_options.reconnect): each time, what c held in the daemon
 * (buffers, queues, pins, reservations, exports) was dropped there. */
TC_API uint32_t tc_reconnects(const tc_conn *c);

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
 * buffer: a memfd, or a file on tmpfs (/dev/shm) or hugetlbfs; anything
 * else (a file on disk, a pipe) is TC_INVALID_ARGUMENT. The daemon maps its
 * own copy of fd; the caller keeps fd and its own mapping. A memfd sealed
 * with F_SEAL_SHRINK is taken as it is; one made with MFD_ALLOW_SEALING is
 * sealed with F_SEAL_SHRINK by the daemon (shrinking it then fails here,
 * for good: a seal is never removed);
 * one that cannot be sealed (made without MFD_ALLOW_SEALING, or a tmpfs
 * file) is taken unsealed: if the caller shrinks it under a request, that
 * request fails with TC_FAILED_PRECONDITION and nothing else does, and
 * transfers to peers over TCP and exports refuse it
 * (TC_FAILED_PRECONDITION). */
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

/* The most tenants one export grants, and the longest tenant name. */
#define TC_MAX_GRANTS 16
#define TC_MAX_TENANT 64

/* tc_segment_export_to is tc_segment_export that also lets the clients of
 * the n_grants tenants grants (at most TC_MAX_GRANTS, each a name of 1 to
 * TC_MAX_TENANT bytes of [A-Za-z0-9._-], none twice, never the exporter's
 * own) on peer daemons open the export, as "daemon/tenant/name" where
 * tenant is the exporter's. Without tenants granted it is tc_segment_export.
 * The grants end with the export: tc_segment_unexport takes the segment
 * from them too, over TCP and over RDMA. */
TC_API int tc_segment_export_to(tc_conn *c, const char *name, const char *const *grants, size_t n_grants,
                                tc_segment_id segment, uint64_t offset, uint64_t length, unsigned rights,
                                uint64_t *size_out, const tc_call_opts *o);

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

/* How a queue's reaps waited (tc_queue_get_waits), apart from tc_queue_info
 * so that the size of that struct, which programs built against an older
 * header pass, does not change. */
typedef struct tc_queue_waits {
    /* Timed sleeps a wait took before asking the daemon to wake it: a wait
     * for part of what is in flight, while the daemon's worker is busy,
     * naps until its completions are due, so the worker makes no wake-up
     * system call for it. */
    uint64_t naps;
    /* Early wake-ups of waits for everything in flight that found the last
     * completion there already (the daemon idled meanwhile). */
    uint64_t late_wakes;
} tc_queue_waits;

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

/* tc_queue_get_waits fills *out with how q's reaps waited (as of the last). */
TC_API void tc_queue_get_waits(const tc_queue *q, tc_queue_waits *out);

/* tc_queue_shutdown stops q without releasing it: a reap waiting in another
 * thread returns TC_ECLOSED, later submits and waits too (a reap still takes
 * what is ready). Safe from any thread at any time before tc_queue_close. */
TC_API void tc_queue_shutdown(tc_queue *q);

/* tc_queue_close closes q: the daemon ends what is in flight on it
 * (completions not yet reaped are lost) and q's memory is released, whatever
 * the code (a broken connection has already dropped the queue: TC_ECLOSED).
 * A reap waiting in another thread returns TC_ECLOSED first. NULL is a no-op. */
TC_API int tc_queue_close(tc_queue *q);

/* ---- The KV block store -------------------------------------------------- */

/*
 * The daemon's KV block store keeps values (KV-cache blocks) by key: in its
 * pool (L1) and on an L2 file or device. Keys are 1 .. TC_MAX_KEY bytes;
 * values 1 byte up to the daemon's store_max_value_size.
 *
 * Every batch call is positional: codes[i] (and offsets[i], lengths[i]) are
 * key i's, for exactly the keys passed. A call that returns TC_OK ran, and
 * each key's code says what happened to it (TC_NOT_FOUND, TC_ALREADY_EXISTS,
 * TC_BUSY, TC_RESOURCE_EXHAUSTED, ...); any other return is about the whole
 * call and leaves codes unspecified. An answer with another number of
 * results, a location or length that does not fit what the call named, or
 * (on a queue) a result the daemon never wrote fails the whole call with
 * TC_EPROTO, and the connection is then broken (what the daemon did for the
 * call is unknown; closing the connection releases it).
 *
 * Three ways in:
 *
 *  - On the control socket (tc_store_put .. tc_store_flush): copying put and
 *    read between the store and memory the daemon can address (a buffer of
 *    the connection or pool blocks it holds, named by tc_extent), remove,
 *    pin with an optional TTL, unpin, reserve, commit and abort, stat, list,
 *    flush.
 *  - On a queue, asynchronously (tc_queue_store_*): the hot calls -- get
 *    (pin each key and say where its value lies in the pool, to be read in
 *    place), reserve (pool blocks to be written in place), commit, exists,
 *    lookup_prefix (with an optional pin of the prefix found) and unpin --
 *    with their keys in the queue's shared memory and their per-key results
 *    in a tc_results region. Each call is one submission entry with one
 *    completion; tc_results_check then validates it and copies the results
 *    out.
 *  - Through a tc_kv, synchronously: the same hot calls made on a queue of
 *    the tc_kv's own, plus tc_kv_put and tc_kv_read, which copy values from
 *    and into any memory of the process (reserve, copy, commit; get, copy,
 *    unpin).
 *
 * Pins (from a get, a pinned lookup_prefix or tc_store_pin) and reservations
 * belong to the connection and are released when it closes. A pinned value
 * is never evicted or moved; an unpin that would go below zero is refused
 * (all or nothing). Exists renews nothing. The values one connection holds
 * pinned are bounded in bytes (the daemon's store_max_session_pinned; a
 * value pinned twice counts once): a pin of one more past it gets
 * TC_RESOURCE_EXHAUSTED, as a pin past a key's pin limit does.
 *
 * The control socket has no Exists or LookupPrefix call: those are queue
 * calls only (tc_kv_exists, tc_kv_lookup_prefix).
 */

/* The longest key the store accepts (a longer or empty key gets
 * TC_INVALID_ARGUMENT as its code). */
#define TC_MAX_KEY 256

/* The most keys one call can carry. The daemon bounds it further
 * (store_max_keys_per_call, 1024 unless configured): a call with more keys
 * fails as a whole with TC_INVALID_ARGUMENT. */
#define TC_MAX_KEYS 65535u

/* One key: len bytes at data. */
typedef struct tc_key {
    const void *data;
    size_t len;
} tc_key;

/* A store call's keys, in one of two forms: n keys in keys[0..n), or (keys
 * NULL) packed, the protocol's key list as it travels: for each of the n
 * keys a u16 little-endian length and then its bytes, nothing between keys
 * and nothing after the last (packed_len bytes in all). The packed form
 * saves the library a copy; it is checked to hold exactly n keys. n is
 * 1 .. TC_MAX_KEYS. */
typedef struct tc_keys {
    size_t n;
    const tc_key *keys;
    const void *packed;
    size_t packed_len;
} tc_keys;

/* tc_keys_packed_len is how many bytes keys take packed (the size of a
 * buffer for tc_keys_pack), 0 when keys is not a valid key list. */
TC_API size_t tc_keys_packed_len(const tc_keys *keys);

/* tc_keys_pack writes keys packed into dst (cap bytes) and returns how many
 * bytes it wrote, 0 when they do not fit or keys is not a valid key list. */
TC_API size_t tc_keys_pack(const tc_keys *keys, void *dst, size_t cap);

/* Where a copying store call's value lies, or where it goes: length bytes
 * at offset in segment, a buffer of this connection (tc_buffer_create,
 * tc_buffer_register_fd) or pool blocks it allocated (tc_blocks_alloc). */
typedef struct tc_extent {
    tc_segment_id segment;
    uint64_t offset;
    uint64_t length;
} tc_extent;

/* A stored key as tc_store_stat and tc_store_list describe it: its value's
 * size, the tiers it is on, its pins over all connections, and whether it
 * is still owed a writeback to L2 (dirty) or its writeback gave up
 * (tombstone). key is set by tc_store_list only. */
typedef struct tc_key_info {
    const uint8_t *key;
    size_t key_len;
    uint64_t size;
    uint32_t pins;
    uint8_t in_l1;
    uint8_t in_l2;
    uint8_t dirty;
    uint8_t tombstone;
} tc_key_info;

/* -- on the control socket -- */

/* tc_store_put stores key i with a copy of the bytes values[i] names; with
 * durable each key's code comes only once its value is on L2. A key already
 * stored gets TC_ALREADY_EXISTS, one being put by another call TC_BUSY; an
 * extent the connection does not hold TC_PERMISSION_DENIED or
 * TC_NOT_FOUND. Durable puts wait for the device: with a call timeout set,
 * it must allow for that. */
TC_API int tc_store_put(tc_conn *c, const tc_keys *keys, const tc_extent *values, int durable, int *codes,
                        const tc_call_opts *o);

/* tc_store_read copies the value of key i into dests[i]; lengths[i] is the
 * value's length (set also when dests[i] is too short, which is
 * TC_INVALID_ARGUMENT, and 0 for a key that is not stored). */
TC_API int tc_store_read(tc_conn *c, const tc_keys *keys, const tc_extent *dests, uint64_t *lengths, int *codes,
                         const tc_call_opts *o);

/* tc_store_remove removes keys; an absent key is TC_OK (remove is
 * idempotent), one a client of this daemon pins TC_FAILED_PRECONDITION
 * (another host's read in flight is no such pin: the key goes, and that
 * read keeps its bytes), one another caller is reading or removing at that
 * moment TC_BUSY (asked again, it goes). With the store across hosts every
 * other copy goes too; a key whose other copies may remain (its home did not
 * answer, or a holder did not drop its copy in time) gets TC_UNAVAILABLE,
 * TC_DEADLINE_EXCEEDED or TC_BUSY (its home busy), never TC_OK, and the
 * same remove sent again answers TC_OK once they are gone. */
TC_API int tc_store_remove(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o);

/* tc_store_pin pins every key for this connection, or none: when a key
 * cannot be pinned (absent: TC_NOT_FOUND, too many pins on the key or this
 * connection's pins at store_max_session_pinned: TC_RESOURCE_EXHAUSTED) the
 * others get TC_FAILED_PRECONDITION and nothing changed. ttl_ms > 0 makes
 * each pin a lease that ends by itself (the daemon bounds it:
 * store_max_lease_ttl). */
TC_API int tc_store_pin(tc_conn *c, const tc_keys *keys, uint32_t ttl_ms, int *codes, const tc_call_opts *o);

/* tc_store_unpin drops one pin of this connection from every key, or from
 * none (as tc_store_pin): a key this connection holds no pin on refuses
 * it with TC_FAILED_PRECONDITION. */
TC_API int tc_store_unpin(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o);

/* tc_store_reserve reserves a pool block of sizes[i] bytes for key i:
 * offsets[i] is where it lies in the pool (tc_pool_info()->base + offset),
 * to be written in place and then committed (0 where the code is not OK).
 * A reservation is invisible to readers and goes with the connection
 * unless committed, or before then with tc_store_abort. */
TC_API int tc_store_reserve(tc_conn *c, const tc_keys *keys, const uint64_t *sizes, uint64_t *offsets, int *codes,
                            const tc_call_opts *o);

/* tc_store_commit makes keys this connection reserved visible; with durable
 * once each value is on L2 (a key whose durable commit failed stays
 * reserved, to be committed again). A key this connection did not reserve
 * gets TC_FAILED_PRECONDITION. */
TC_API int tc_store_commit(tc_conn *c, const tc_keys *keys, int durable, int *codes, const tc_call_opts *o);

/* tc_store_abort gives back reservations of this connection without
 * committing them (a write that failed, a request cancelled): codes[i] is
 * TC_OK when key i's reservation was released (its pool block is freed at
 * once: do not touch the memory at its offset any more), TC_BUSY while its
 * durable commit is in flight, and TC_FAILED_PRECONDITION for a key this
 * connection has not reserved (never, committed or aborted already, or
 * another connection's, which this call never touches). Keys are
 * independent. A batch with an invalid key (empty, over 256 bytes) or too
 * many keys is refused whole: the call returns TC_INVALID_ARGUMENT and
 * nothing changes. */
TC_API int tc_store_abort(tc_conn *c, const tc_keys *keys, int *codes, const tc_call_opts *o);

/* tc_store_stat describes one key (TC_NOT_FOUND when it is not stored); it
 * changes nothing. out->key is NULL. */
TC_API int tc_store_stat(tc_conn *c, const void *key, size_t len, tc_key_info *out, const tc_call_opts *o);

/* tc_store_list lists up to max keys (0: as many as one answer holds) that
 * start with prefix (plen bytes, may be 0) and sort after after (alen
 * bytes, may be 0), in order. *out is one allocation of *n entries with
 * their keys (NULL when none), freed with tc_free; *more says the listing
 * goes on (ask again with after = the last key). */
TC_API int tc_store_list(tc_conn *c, const void *prefix, size_t plen, const void *after, size_t alen, uint32_t max,
                         tc_key_info **out, size_t *n, int *more, const tc_call_opts *o);

/* tc_store_flush waits, at most timeout_ms (0: the daemon's default; pass
 * one when a call timeout is set), until no value is owed a writeback to
 * L2: TC_DEADLINE_EXCEEDED when some still are. */
TC_API int tc_store_flush(tc_conn *c, uint32_t timeout_ms, const tc_call_opts *o);

/* -- retention handles and placement leases -- */

/*
 * Both keep keys of the store from eviction, and both belong to the
 * daemon's store, not to this connection: they outlive it and end when
 * released or at their expiry.
 *
 * A retention handle is a token the daemon signs (its issuer's id and
 * epoch, an id, the expiry, a digest of the keys). Whoever holds the token
 * renews or releases the handle, at the daemon that issued it; a token that
 * is forged, expired, released, or of an issuer that restarted is refused
 * with TC_PERMISSION_DENIED. A placement lease pins keys under an operation
 * id: a create retried with the same id and keys (in the same order) joins
 * the first lease and pins nothing again; the same id with other keys, or
 * of a lease released lately, is TC_FAILED_PRECONDITION.
 */

/* The longest handle token. */
#define TC_MAX_HANDLE_TOKEN 256
/* The longest operation id of a placement lease. */
#define TC_MAX_OP_ID 128

/* A retention handle: its token (token_len bytes), id and expiry. */
typedef struct tc_handle {
    uint8_t token[TC_MAX_HANDLE_TOKEN];
    size_t token_len;
    uint64_t id;
    uint64_t expiry_unix_ms;
} tc_handle;

/* tc_handle_issue pins every key for ttl_ms (the daemon bounds it:
 * store_max_lease_ttl), or none (a key that is not stored: TC_NOT_FOUND;
 * the tenant's handles and leases already pin store_max_grant_pinned:
 * TC_RESOURCE_EXHAUSTED), and fills *out with the handle. */
TC_API int tc_handle_issue(tc_conn *c, const tc_keys *keys, uint32_t ttl_ms, tc_handle *out, const tc_call_opts *o);

/* tc_handle_renew extends the handle of token (len bytes) to ttl_ms from
 * now and writes its new token and expiry into *out (its id is left as it
 * is: out may be the handle whose token it renews). Use the new token from
 * then on. */
TC_API int tc_handle_renew(tc_conn *c, const void *token, size_t len, uint32_t ttl_ms, tc_handle *out,
                           const tc_call_opts *o);

/* tc_handle_release gives back the keys of the handle of token. A handle
 * released or expired already is TC_PERMISSION_DENIED. */
TC_API int tc_handle_release(tc_conn *c, const void *token, size_t len, const tc_call_opts *o);

/* tc_lease_create pins keys for ttl_ms under operation id op (op_len bytes,
 * 1 .. TC_MAX_OP_ID), or joins the lease op already names: *joined (may be
 * NULL) says which, *expiry_unix_ms (may be NULL) when it ends. A new lease
 * past what the tenant's handles and leases may pin (store_max_grant_pinned)
 * is TC_RESOURCE_EXHAUSTED and pins nothing. */
TC_API int tc_lease_create(tc_conn *c, const void *op, size_t op_len, const tc_keys *keys, uint32_t ttl_ms,
                           uint64_t *expiry_unix_ms, int *joined, const tc_call_opts *o);

/* tc_lease_release gives back the keys of the lease of operation id op
 * (TC_OK when it ended already; TC_NOT_FOUND when op names no lease). */
TC_API int tc_lease_release(tc_conn *c, const void *op, size_t op_len, const tc_call_opts *o);

/* -- the store across hosts -- */

/* The longest daemon id, and the most holders one location names. */
#define TC_MAX_DAEMON_ID 64
#define TC_MAX_LOCATE_HOLDERS 16

/* One copy of a key's value as the key's home knows it: the holding
 * daemon, the run (epoch) that announced the copy, its tier (1 DRAM, 2
 * NVMe), size and crc32c. */
typedef struct tc_holder {
    const char *id;
    uint64_t epoch;
    uint8_t tier;
    uint64_t size;
    uint32_t crc32c;
} tc_holder;

/* Where a key lives in the store across hosts: its shard, the shard's home
 * and generation as the daemon knows them, and the holders the home names
 * (n_holders of them at holders). */
typedef struct tc_key_location {
    uint32_t shard;
    const char *home;
    uint64_t generation;
    size_t n_holders;
    const tc_holder *holders;
} tc_key_location;

/* tc_cluster_locate asks the daemon where key (len bytes) lives: it asks
 * the key's home, and keeps nothing of the answer (a later read still asks
 * the home). *out is one allocation, strings included, freed with
 * tc_free. A daemon without the store across hosts is TC_UNAVAILABLE. */
TC_API int tc_cluster_locate(tc_conn *c, const void *key, size_t len, tc_key_location **out, const tc_call_opts *o);

/* -- on a queue, asynchronously -- */

/*
 * A results region is where the daemon writes the per-key results of one
 * store call on a queue: 16 bytes per key in a client buffer. The caller owns
 * it: from the call that stages into it until its completion is reaped and
 * checked with tc_results_check, it must not be staged into again, and the
 * buffer must stay registered. Each tc_queue_store_* call stages one
 * submission entry (its keys copied into the queue's data area) and
 * publishes it; *accepted is 0 when the ring or the data area has no room
 * now (reap, then call again), else 1, and the call then gets exactly one
 * completion with user_data. A key list that can never fit the queue's data
 * area, more keys than the region holds, or a region of another connection
 * is TC_INVALID_ARGUMENT. The same threading rules as tc_queue_submit apply.
 */
typedef struct tc_results tc_results;

/* tc_results_create makes a results region for calls of up to max_keys keys
 * (1 .. TC_MAX_KEYS) in a buffer of its own (tc_buffer_create). */
TC_API int tc_results_create(tc_conn *c, uint32_t max_keys, tc_results **out);

/* tc_results_in makes a results region for up to max_keys keys at offset (a
 * multiple of 8) in buf, a buffer tc_buffer_create made on c, which must
 * outlive it. */
TC_API int tc_results_in(tc_conn *c, const tc_buffer *buf, uint64_t offset, uint32_t max_keys, tc_results **out);

/* tc_results_destroy frees r (and the buffer tc_results_create made for it).
 * tc_close frees the regions still made on its connection. NULL is a
 * no-op. */
TC_API void tc_results_destroy(tc_results *r);

/* tc_queue_store_get pins each key for this connection and writes where its
 * value lies in the pool into r (read it in place, then unpin it). A value
 * only on L2 is read into the pool first; the completion comes once it is
 * there. */
TC_API int tc_queue_store_get(tc_queue *q, const tc_keys *keys, tc_results *r, uint64_t user_data,
                              size_t *accepted);

/* tc_queue_store_reserve reserves a pool block of size bytes for each key
 * (write it in place, then commit). */
TC_API int tc_queue_store_reserve(tc_queue *q, const tc_keys *keys, uint64_t size, tc_results *r,
                                  uint64_t user_data, size_t *accepted);

/* tc_queue_store_commit makes reserved keys visible; with durable the
 * completion comes once each value is on L2. */
TC_API int tc_queue_store_commit(tc_queue *q, const tc_keys *keys, int durable, tc_results *r, uint64_t user_data,
                                 size_t *accepted);

/* tc_queue_store_exists says of each key whether it is stored (TC_OK) or not
 * (TC_NOT_FOUND); it renews nothing. */
TC_API int tc_queue_store_exists(tc_queue *q, const tc_keys *keys, tc_results *r, uint64_t user_data,
                                 size_t *accepted);

/* tc_queue_store_unpin drops one pin of this connection from every key, or
 * from none: the release of a get or of a pinned lookup_prefix. */
TC_API int tc_queue_store_unpin(tc_queue *q, const tc_keys *keys, tc_results *r, uint64_t user_data,
                                size_t *accepted);

/* tc_queue_store_lookup_prefix counts how many leading keys are stored; with
 * pin it also pins them for this connection in the same call, so that a get
 * of them cannot miss (unpin them after). It has no results region: the
 * count is the completion's transferred (read it with tc_prefix_check). */
TC_API int tc_queue_store_lookup_prefix(tc_queue *q, const tc_keys *keys, int pin, uint64_t user_data,
                                        size_t *accepted);

/* tc_results_check checks the completion cqe of the call staged into r last
 * and copies its per-key results out: codes[i] (required), offsets[i] and
 * lengths[i] (may be NULL; for a get the value's offset in the pool and its
 * length, for a reserve the block's offset and the size reserved, else 0).
 * It returns TC_OK when the call ran; the completion's code when the call
 * failed as a whole: TC_FAILED_PRECONDITION for an unpin refused all or
 * nothing (codes say which keys refused it), TC_NOT_FOUND for one refused
 * over a key that is not stored (codes say so too: codes are filled
 * whenever the daemon wrote every record), another code for an entry the
 * daemon refused or a call that failed; TC_EPROTO when the answer
 * is not whole (a record never written or with nonzero reserved bytes, a
 * code that is none, a count of OK keys other than the completion's, a
 * location outside the pool, a reservation of another size), and the
 * connection is then broken. */
TC_API int tc_results_check(tc_results *r, const tc_cqe *cqe, int *codes, uint64_t *offsets, uint64_t *lengths);

/* tc_prefix_check checks the completion of a lookup_prefix of n keys:
 * *found is the length of the prefix (pinned, if asked). TC_EPROTO (and a
 * broken connection) for a count over n. */
TC_API int tc_prefix_check(tc_queue *q, const tc_cqe *cqe, size_t n, size_t *found);

/* -- through a tc_kv, synchronously -- */

/*
 * A tc_kv makes the store's hot calls synchronously on a queue of its own
 * (with a results region of its own): each call stages its entry, submits it
 * and waits for its completion, spinning briefly and then sleeping in the
 * library. Calls on one tc_kv run one at a time (a mutex); threads that
 * must not wait behind each other use a tc_kv each. A call that ran out of
 * the tc_kv's timeout (one deadline for all its waits on the queue; the
 * socket calls it makes, such as a reservation's abort, keep to the
 * connection's call_timeout_ms) returns TC_ETIMEDOUT. Its entry stays with
 * the daemon, and the tc_kv's next call first waits, within its own
 * timeout, for that late answer and gives back what it took (a get's or a
 * pinning lookup's pins, a reserve's blocks) before it makes its own; an
 * answer still not there is TC_ETIMEDOUT again. tc_kv_close waits for a
 * late answer within the timeout (1 s without one) and settles it; pins of
 * one not there by then stay the connection's until it closes. A daemon
 * that went away ends a waiting call with TC_ECLOSED, and the tc_kv takes
 * no more calls.
 */
typedef struct tc_kv tc_kv;

/* Options of tc_kv_open. Zero-initialize; a zero field takes its default. */
typedef struct tc_kv_opts {
    uint32_t max_keys;   /* most keys of one call; 0: 1024, the daemon's default bound. The
                          * tc_kv's data area holds key lists of max_keys keys of TC_MAX_KEY
                          * bytes (at most about 1.4 MB): a longer list is TC_INVALID_ARGUMENT */
    uint32_t timeout_ms; /* bounds each call's wait; 0: none (a dead daemon still ends it) */
    uint32_t spin_us;    /* as tc_queue_opts */
    uint32_t flags;      /* TC_QUEUE_NOSPIN */
} tc_kv_opts;

/* tc_kv_open opens a tc_kv on c: a queue (tc_queue_open) and a results
 * region (tc_results_create) of its own. opts may be NULL. */
TC_API int tc_kv_open(tc_conn *c, const tc_kv_opts *opts, tc_kv **out);

/* tc_kv_close closes kv's queue and frees it. tc_close frees the tc_kvs still
 * open on its connection. NULL is a no-op. */
TC_API void tc_kv_close(tc_kv *kv);

/* tc_kv_get pins each key and says where its value lies in the pool:
 * offsets[i] and lengths[i] (may be NULL; 0 where the code is not OK). Read
 * it in place at tc_pool_info()->base + offsets[i], then tc_kv_unpin it. */
TC_API int tc_kv_get(tc_kv *kv, const tc_keys *keys, uint64_t *offsets, uint64_t *lengths, int *codes);

/* tc_kv_reserve reserves a pool block of size bytes for each key: offsets[i]
 * (may be NULL) is where it lies in the pool. Write it in place, then
 * tc_kv_commit (or tc_store_commit) it. */
TC_API int tc_kv_reserve(tc_kv *kv, const tc_keys *keys, uint64_t size, uint64_t *offsets, int *codes);

/* tc_kv_commit makes reserved keys visible; with durable once each value is
 * on L2. */
TC_API int tc_kv_commit(tc_kv *kv, const tc_keys *keys, int durable, int *codes);

/* tc_kv_exists says of each key whether it is stored: codes[i] TC_OK or
 * TC_NOT_FOUND (TC_INVALID_ARGUMENT for a key the store cannot hold). */
TC_API int tc_kv_exists(tc_kv *kv, const tc_keys *keys, int *codes);

/* tc_kv_lookup_prefix says how many leading keys are stored; with pin they
 * are also pinned for the connection (tc_kv_unpin the first *found keys
 * after). */
TC_API int tc_kv_lookup_prefix(tc_kv *kv, const tc_keys *keys, int pin, size_t *found);

/* tc_kv_unpin drops one pin of the connection from every key, or from none:
 * TC_FAILED_PRECONDITION (a key without a pin) or TC_NOT_FOUND (a key not
 * stored), with codes saying which keys refused. */
TC_API int tc_kv_unpin(tc_kv *kv, const tc_keys *keys, int *codes);

/* tc_kv_put stores key i with a copy of lengths[i] bytes at values[i], any
 * memory of this process: it reserves pool blocks (one call when every
 * length is the same, else on the socket with a size per key), copies each
 * value into its block and commits them, durable as asked. codes[i] is the
 * reserve's code for a key that could not be reserved, else its commit's. A
 * key whose commit failed stays reserved by the connection (a durable commit
 * that failed on L2 can be committed again with tc_store_commit). */
TC_API int tc_kv_put(tc_kv *kv, const tc_keys *keys, const void *const *values, const uint64_t *lengths,
                     int durable, int *codes);

/* tc_kv_read copies the value of key i into outs[i] (capacities[i] bytes of
 * any memory of this process): it gets (pins) the keys, copies each value
 * and unpins them. lengths[i] (may be NULL) is the value's length, also when
 * capacities[i] is too short (TC_INVALID_ARGUMENT, nothing copied). */
TC_API int tc_kv_read(tc_kv *kv, const tc_keys *keys, void *const *outs, const uint64_t *capacities,
                      uint64_t *lengths, int *codes);

#ifdef __cplusplus
}
#endif

#endif /* TENSORCAST_H */
