/*
 * codec.h - the control protocol's codec, behind a C interface.
 *
 * codec.cc builds request frames with flatbuffers' generated C++ builders
 * and checks every answer with the flatbuffers Verifier before reading a
 * field of it. This header is the only thing the C side sees of it: one
 * request struct to encode and one response struct to decode into, like
 * the Go side's control.Request and control.Response.
 */
#ifndef TC_CODEC_H
#define TC_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "tensorcast.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The size of a frame's length prefix (u32 little-endian). */
#define TCW_FRAME_HEADER 4

/* Request bodies: the schema's RequestBody union tags (codec.cc checks each
 * against the generated enum at compile time). */
enum {
    TCW_HELLO = 1,
    TCW_PING = 2,
    TCW_REGISTER_BUFFER = 3,
    TCW_UNREGISTER_BUFFER = 4,
    TCW_POOL_INFO = 5,
    TCW_ALLOC_BLOCKS = 6,
    TCW_FREE_BLOCKS = 7,
    TCW_ALLOC_BATCH = 8,
    TCW_SUBMIT = 9,
    TCW_TASK_STATUS = 10,
    TCW_BATCH_STATUS = 11,
    TCW_WAIT = 12,
    TCW_FREE_BATCH = 13,
    TCW_TRANSFER = 14,
    TCW_STATS = 15,
    TCW_REGISTER_FILE = 16,
    TCW_EXPORT_SEGMENT = 17,
    TCW_UNEXPORT_SEGMENT = 18,
    TCW_OPEN_REMOTE = 19,
    TCW_CLOSE_REMOTE = 20,
    TCW_SUBSCRIBE = 21,
    TCW_POLL_NOTIFICATIONS = 22,
    /* 23..25 (Peers, Segments, Rdma) are operators' calls this library
     * does not make. */
    TCW_OPEN_QUEUE = 26,
    TCW_CLOSE_QUEUE = 27,
    /* 28 (Directory) is an operators' call. */
    TCW_STORE_PUT = 29,
    TCW_STORE_READ = 30,
    TCW_STORE_REMOVE = 31,
    TCW_STORE_PIN = 32,
    TCW_STORE_UNPIN = 33,
    TCW_STORE_RESERVE = 34,
    TCW_STORE_COMMIT = 35,
    TCW_STORE_STAT = 36,
    TCW_STORE_LIST = 37,
    TCW_STORE_FLUSH = 38,
    TCW_STORE_ABORT = 39,
    TCW_HANDLE_ISSUE = 40,
    TCW_HANDLE_RENEW = 41,
    TCW_HANDLE_RELEASE = 42,
    TCW_LEASE_CREATE = 43,
    TCW_LEASE_RELEASE = 44,
    /* 45 (Mode) is an operators' call. */
    TCW_CLUSTER_LOCATE = 46
};
/* Each response body has the tag of its request (the unions are parallel). */

/* A request to encode. Only the fields of kind's body are read. */
typedef struct tcw_req {
    int kind;
    /* Context */
    uint64_t request_id;
    const char *idempotency_key; /* NULL: none */
    const char *lane;            /* NULL: none */
    uint32_t policy_version;
    uint8_t qos;
    uint32_t deadline_ms;
    uint8_t replicas;
    /* Bodies */
    uint32_t protocol_version; /* Hello */
    const char *name;          /* Hello, RegisterFile (path), exports, remotes */
    const void *payload;       /* Ping */
    size_t payload_len;
    uint64_t size;    /* RegisterBuffer, AllocBlocks, RegisterFile */
    uint64_t segment; /* UnregisterBuffer, ExportSegment, CloseRemote */
    uint64_t offset;  /* ExportSegment */
    uint64_t length;  /* ExportSegment */
    uint64_t batch;   /* Submit, TaskStatus, BatchStatus, Wait, FreeBatch */
    uint32_t n;       /* AllocBlocks */
    uint32_t capacity; /* AllocBatch */
    uint32_t index;    /* TaskStatus */
    uint32_t timeout_ms; /* Wait, Transfer, PollNotifications */
    uint32_t max;        /* PollNotifications */
    const uint64_t *offsets; /* FreeBlocks */
    size_t n_offsets;
    const tc_request *requests; /* Submit, Transfer */
    size_t n_requests;
    const tc_notify *notify; /* Submit, Transfer: NULL or n_requests entries */
    int direct;              /* RegisterFile */
    uint8_t rights;          /* ExportSegment, OpenRemote */
    const char *const *grants; /* ExportSegment: tenants granted */
    size_t n_grants;
    uint8_t transport;       /* OpenRemote */
    uint32_t sq_entries;     /* OpenQueue */
    uint32_t cq_entries;
    uint32_t data_size;
    uint64_t queue;          /* CloseQueue */
    /* The store's calls. keys is checked (keys.h), keys_len its packed
     * length; extents and sizes have keys->n entries. */
    const tc_keys *keys;
    size_t keys_len;
    const tc_extent *extents; /* StorePut, StoreRead */
    const uint64_t *sizes;    /* StoreReserve */
    int durable;              /* StorePut, StoreCommit */
    uint32_t ttl_ms;          /* StorePin, HandleIssue, HandleRenew, LeaseCreate */
    const void *blob;         /* StoreStat, ClusterLocate: the key; StoreList: the prefix; handles: the token;
                               * leases: the op id */
    size_t blob_len;
    const void *blob2;        /* StoreList: after */
    size_t blob2_len;
    /* StoreList: max; StoreFlush: timeout_ms (the fields above). */
} tcw_req;

/* A decoded answer. Strings and vectors point into the frame it was
 * decoded from (valid while that is) or into the codec's scratch (valid
 * until its next decode). A missing string is "", a missing vector empty. */
typedef struct tcw_resp {
    uint64_t request_id;
    int status;
    const char *message;
    int kind; /* the body's tag; 0 for none */

    uint32_t protocol_version; /* Hello */
    const char *daemon_id;
    const char *version;
    const char *peer_addr;
    tc_limits limits;
    const uint8_t *payload; /* Ping */
    size_t payload_len;
    uint64_t segment; /* RegisterBuffer, PoolInfo, RegisterFile, OpenRemote */
    uint64_t size;    /* PoolInfo, RegisterFile, ExportSegment, OpenRemote, OpenQueue */
    uint64_t epoch;   /* OpenRemote */
    uint64_t batch;   /* AllocBatch */
    const uint64_t *u64s; /* PoolInfo: block classes; AllocBlocks, StoreReserve: offsets;
                           * StoreRead: lengths */
    size_t n_u64s;
    const uint8_t *codes; /* FreeBlocks, Submit, Transfer, the store's batch calls */
    size_t n_codes;
    const uint8_t *states; /* Transfer */
    size_t n_states;
    tc_task_info task; /* TaskStatus */
    tc_summary summary;  /* BatchStatus, Wait, Transfer */
    tc_stats stats;      /* Stats: items in the codec's scratch */
    const tc_notification *notes; /* PollNotifications: in the codec's scratch */
    size_t n_notes;
    uint64_t queue; /* OpenQueue; size is the mapping's */
    uint32_t sq_entries;
    uint32_t cq_entries;
    uint32_t data_size;
    tc_key_info info;          /* StoreStat */
    const tc_key_info *infos;  /* StoreList: in the codec's scratch, keys in the frame */
    size_t n_infos;
    int more;                  /* StoreList */
    const uint8_t *token;      /* HandleIssue, HandleRenew: in the frame */
    size_t token_len;
    uint64_t handle_id;        /* HandleIssue */
    uint64_t expiry_unix_ms;   /* HandleIssue, HandleRenew, LeaseCreate */
    int joined;                /* LeaseCreate */
    uint32_t shard;            /* ClusterLocate */
    const char *home;
    uint64_t generation;
    const tc_holder *holders;  /* ClusterLocate: in the codec's scratch, ids in the frame */
    size_t n_holders;
} tcw_resp;

typedef struct tcw_codec tcw_codec;

/* tcw_new returns a codec (its builder and decode scratch), NULL when out of
 * memory. */
tcw_codec *tcw_new(void);
void tcw_free(tcw_codec *w);

/* tcw_encode builds req's whole frame (u32 length + flatbuffer) in w;
 * *frame stays valid until w's next encode. Returns TC_OK, TC_ENOMEM,
 * TC_INVALID_ARGUMENT (a field the schema cannot carry, such as a count
 * beyond 2^31) or TC_EINTERNAL. */
int tcw_encode(tcw_codec *w, const tcw_req *req, const uint8_t **frame, size_t *len);

/* tcw_decode verifies frame (the whole frame, length prefix included, at
 * an address aligned to 8) as a Response and fills *resp. Returns TC_OK,
 * TC_EPROTO (it does not verify) or TC_ENOMEM. */
int tcw_decode(tcw_codec *w, const uint8_t *frame, size_t len, tcw_resp *resp);

#ifdef __cplusplus
}
#endif

#endif /* TC_CODEC_H */
