// codec.cc - the control protocol's codec: flatbuffers' generated C++ behind
// the C interface of codec.h.
//
// Requests are built with the generated builders into one reused
// FlatBufferBuilder. Answers are checked with the flatbuffers Verifier
// (every offset, vector and string inside the frame, tables nested within
// limits, scalars aligned) before any field is read; only then are they
// read, through the generated accessors.
//
// Nothing here may end the process. Allocation failures (std::bad_alloc)
// and flatbuffers' internal assertions (redirected below to an exception)
// are caught at each entry point and become TC_ENOMEM and TC_EINTERNAL.

#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <vector>

namespace tcw {
// codec_bug is what a failed flatbuffers assertion throws: a bug in this
// library's use of the builder, reported as TC_EINTERNAL.
struct codec_bug : std::exception {
    const char *what() const noexcept override { return "libtensorcast: flatbuffers assertion failed"; }
};
[[noreturn]] static void assert_failed() { throw codec_bug(); }
}  // namespace tcw

#define FLATBUFFERS_ASSERT(x) ((x) ? (void)0 : tcw::assert_failed())
#include "gen/control_generated.h"

#include "codec.h"
#include "keys.h"

#if !FLATBUFFERS_LITTLEENDIAN
#error "libtensorcast reads verified flatbuffer vectors in place and needs a little-endian host"
#endif

namespace fb = flatbuffers;
using tcproto::RequestBody;
using tcproto::ResponseBody;

// The C side names bodies by their union tags; these keep them in step with
// the schema.
#define TCW_TAG(c, name)                                                                       \
    static_assert((c) == static_cast<int>(RequestBody::name##Request), #name " request tag"); \
    static_assert((c) == static_cast<int>(ResponseBody::name##Response), #name " response tag");
TCW_TAG(TCW_HELLO, Hello)
TCW_TAG(TCW_PING, Ping)
TCW_TAG(TCW_REGISTER_BUFFER, RegisterBuffer)
TCW_TAG(TCW_UNREGISTER_BUFFER, UnregisterBuffer)
TCW_TAG(TCW_POOL_INFO, PoolInfo)
TCW_TAG(TCW_ALLOC_BLOCKS, AllocBlocks)
TCW_TAG(TCW_FREE_BLOCKS, FreeBlocks)
TCW_TAG(TCW_ALLOC_BATCH, AllocBatch)
TCW_TAG(TCW_SUBMIT, Submit)
TCW_TAG(TCW_TASK_STATUS, TaskStatus)
TCW_TAG(TCW_BATCH_STATUS, BatchStatus)
TCW_TAG(TCW_WAIT, Wait)
TCW_TAG(TCW_FREE_BATCH, FreeBatch)
static_assert(TCW_TRANSFER == static_cast<int>(RequestBody::TransferRequestBody), "Transfer request tag");
static_assert(TCW_TRANSFER == static_cast<int>(ResponseBody::TransferResponse), "Transfer response tag");
TCW_TAG(TCW_STATS, Stats)
TCW_TAG(TCW_REGISTER_FILE, RegisterFile)
TCW_TAG(TCW_EXPORT_SEGMENT, ExportSegment)
TCW_TAG(TCW_UNEXPORT_SEGMENT, UnexportSegment)
TCW_TAG(TCW_OPEN_REMOTE, OpenRemote)
TCW_TAG(TCW_CLOSE_REMOTE, CloseRemote)
TCW_TAG(TCW_SUBSCRIBE, Subscribe)
TCW_TAG(TCW_POLL_NOTIFICATIONS, PollNotifications)
TCW_TAG(TCW_OPEN_QUEUE, OpenQueue)
TCW_TAG(TCW_CLOSE_QUEUE, CloseQueue)
TCW_TAG(TCW_STORE_PUT, StorePut)
TCW_TAG(TCW_STORE_READ, StoreRead)
TCW_TAG(TCW_STORE_REMOVE, StoreRemove)
TCW_TAG(TCW_STORE_PIN, StorePin)
TCW_TAG(TCW_STORE_UNPIN, StoreUnpin)
TCW_TAG(TCW_STORE_RESERVE, StoreReserve)
TCW_TAG(TCW_STORE_COMMIT, StoreCommit)
TCW_TAG(TCW_STORE_STAT, StoreStat)
TCW_TAG(TCW_STORE_LIST, StoreList)
TCW_TAG(TCW_STORE_FLUSH, StoreFlush)
TCW_TAG(TCW_STORE_ABORT, StoreAbort)
TCW_TAG(TCW_HANDLE_ISSUE, HandleIssue)
TCW_TAG(TCW_HANDLE_RENEW, HandleRenew)
TCW_TAG(TCW_HANDLE_RELEASE, HandleRelease)
TCW_TAG(TCW_LEASE_CREATE, LeaseCreate)
TCW_TAG(TCW_LEASE_RELEASE, LeaseRelease)
TCW_TAG(TCW_CLUSTER_LOCATE, ClusterLocate)
#undef TCW_TAG

static_assert(static_cast<int>(tcproto::Code::OK) == TC_OK, "code OK");
static_assert(static_cast<int>(tcproto::Code::INVALID_ARGUMENT) == TC_INVALID_ARGUMENT, "code");
static_assert(static_cast<int>(tcproto::Code::NOT_FOUND) == TC_NOT_FOUND, "code");
static_assert(static_cast<int>(tcproto::Code::ALREADY_EXISTS) == TC_ALREADY_EXISTS, "code");
static_assert(static_cast<int>(tcproto::Code::BUSY) == TC_BUSY, "code");
static_assert(static_cast<int>(tcproto::Code::RESOURCE_EXHAUSTED) == TC_RESOURCE_EXHAUSTED, "code");
static_assert(static_cast<int>(tcproto::Code::FAILED_PRECONDITION) == TC_FAILED_PRECONDITION, "code");
static_assert(static_cast<int>(tcproto::Code::PERMISSION_DENIED) == TC_PERMISSION_DENIED, "code");
static_assert(static_cast<int>(tcproto::Code::DEADLINE_EXCEEDED) == TC_DEADLINE_EXCEEDED, "code");
static_assert(static_cast<int>(tcproto::Code::UNAVAILABLE) == TC_UNAVAILABLE, "code");
static_assert(static_cast<int>(tcproto::Code::INTERNAL) == TC_INTERNAL, "code");
static_assert(static_cast<int>(tcproto::Code::MAX) == TC_INTERNAL, "a code this library does not name");
static_assert(static_cast<int>(tcproto::TaskState::CANCELED) == TC_TASK_CANCELED, "task states");
static_assert(static_cast<int>(tcproto::TaskState::MAX) == TC_TASK_CANCELED, "a task state this library does not name");
static_assert(static_cast<int>(tcproto::Op::READ) == TC_OP_READ && static_cast<int>(tcproto::Op::WRITE) == TC_OP_WRITE,
              "ops");
static_assert(static_cast<int>(tcproto::Transport::RDMA) == TC_TRANSPORT_RDMA, "transports");
static_assert(sizeof(tcproto::TransferRequest) == 48, "TransferRequest wire size");
static_assert(sizeof(tcproto::StoreExtent) == 24, "StoreExtent wire size");

// Verifier limits: answers nest at most a few tables deep.
static constexpr fb::uoffset_t max_depth = 16;
static constexpr fb::uoffset_t max_tables = 1u << 20;
// Counts beyond this cannot be encoded in one frame anyway.
static constexpr size_t max_items = 1u << 28;

struct tcw_codec {
    fb::FlatBufferBuilder b{1024};
    std::vector<fb::Offset<tcproto::Notify>> notify;
    std::vector<fb::Offset<fb::String>> grants;
    std::vector<tc_counter> counters;
    std::vector<tc_notification> notes;
    std::vector<tc_key_info> infos;
    std::vector<tc_holder> holders;
};

extern "C" tcw_codec *tcw_new(void) { return new (std::nothrow) tcw_codec(); }

extern "C" void tcw_free(tcw_codec *w) { delete w; }

namespace {

fb::Offset<fb::String> str(fb::FlatBufferBuilder &b, const char *s) {
    return s ? b.CreateString(s, std::strlen(s)) : 0;
}

fb::Offset<fb::Vector<const tcproto::TransferRequest *>> transfers(fb::FlatBufferBuilder &b, const tcw_req *r) {
    tcproto::TransferRequest *out = nullptr;
    auto v = b.CreateUninitializedVectorOfStructs<tcproto::TransferRequest>(r->n_requests, &out);
    for (size_t i = 0; i < r->n_requests; i++) {
        const tc_request &q = r->requests[i];
        // An op the schema cannot carry goes as INVALID: the daemon refuses
        // that request in its position.
        uint8_t op = q.op <= 0xff ? static_cast<uint8_t>(q.op) : 0;
        out[i] = tcproto::TransferRequest(q.local, q.local_offset, q.target, q.target_offset, q.length,
                                          static_cast<tcproto::Op>(op));
    }
    return v;
}

fb::Offset<fb::Vector<fb::Offset<tcproto::Notify>>> notifies(tcw_codec *w, const tcw_req *r) {
    if (!r->notify) return 0;
    auto &b = w->b;
    w->notify.clear();
    w->notify.reserve(r->n_requests);
    for (size_t i = 0; i < r->n_requests; i++) {
        const tc_notify &n = r->notify[i];
        fb::Offset<fb::Vector<uint8_t>> p = 0;
        if (n.len > 0) p = b.CreateVector(static_cast<const uint8_t *>(n.payload), n.len);
        w->notify.push_back(tcproto::CreateNotify(b, p));
    }
    return b.CreateVector(w->notify);
}

// grants builds an export's granted tenants (none: absent).
fb::Offset<fb::Vector<fb::Offset<fb::String>>> grants(tcw_codec *w, const tcw_req *r) {
    if (r->n_grants == 0) return 0;
    auto &b = w->b;
    w->grants.clear();
    w->grants.reserve(r->n_grants);
    for (size_t i = 0; i < r->n_grants; i++) w->grants.push_back(str(b, r->grants[i]));
    return b.CreateVector(w->grants);
}

// keys builds a store call's packed key list (checked by the caller: its
// packed length is r->keys_len).
fb::Offset<fb::Vector<uint8_t>> keys(fb::FlatBufferBuilder &b, const tcw_req *r) {
    uint8_t *dst = nullptr;
    auto v = b.CreateUninitializedVector(r->keys_len, 1, &dst);
    if (r->keys_len) tc__keys_put(r->keys, dst, r->keys_len);
    return v;
}

fb::Offset<fb::Vector<const tcproto::StoreExtent *>> extents(fb::FlatBufferBuilder &b, const tcw_req *r) {
    tcproto::StoreExtent *out = nullptr;
    size_t n = r->keys->n;
    auto v = b.CreateUninitializedVectorOfStructs<tcproto::StoreExtent>(n, &out);
    for (size_t i = 0; i < n; i++) {
        const tc_extent &e = r->extents[i];
        out[i] = tcproto::StoreExtent(e.segment, e.offset, e.length);
    }
    return v;
}

fb::Offset<fb::Vector<uint8_t>> blob(fb::FlatBufferBuilder &b, const void *p, size_t n) {
    return b.CreateVector(static_cast<const uint8_t *>(p), n);
}

// body builds kind's body; type is its union tag. False for a kind this
// codec does not encode.
bool body(tcw_codec *w, const tcw_req *r, RequestBody &type, fb::Offset<void> &out) {
    auto &b = w->b;
    type = static_cast<RequestBody>(r->kind);
    switch (r->kind) {
    case TCW_HELLO:
        out = tcproto::CreateHelloRequest(b, r->protocol_version, str(b, r->name)).Union();
        return true;
    case TCW_PING: {
        auto p = b.CreateVector(static_cast<const uint8_t *>(r->payload), r->payload_len);
        out = tcproto::CreatePingRequest(b, p).Union();
        return true;
    }
    case TCW_REGISTER_BUFFER:
        out = tcproto::CreateRegisterBufferRequest(b, r->size).Union();
        return true;
    case TCW_UNREGISTER_BUFFER:
        out = tcproto::CreateUnregisterBufferRequest(b, r->segment).Union();
        return true;
    case TCW_POOL_INFO:
        out = tcproto::CreatePoolInfoRequest(b).Union();
        return true;
    case TCW_ALLOC_BLOCKS:
        out = tcproto::CreateAllocBlocksRequest(b, r->n, r->size).Union();
        return true;
    case TCW_FREE_BLOCKS: {
        auto v = b.CreateVector(r->offsets, r->n_offsets);
        out = tcproto::CreateFreeBlocksRequest(b, v).Union();
        return true;
    }
    case TCW_ALLOC_BATCH:
        out = tcproto::CreateAllocBatchRequest(b, r->capacity).Union();
        return true;
    case TCW_SUBMIT: {
        auto reqs = transfers(b, r);
        auto n = notifies(w, r);
        out = tcproto::CreateSubmitRequest(b, r->batch, reqs, n).Union();
        return true;
    }
    case TCW_TASK_STATUS:
        out = tcproto::CreateTaskStatusRequest(b, r->batch, r->index).Union();
        return true;
    case TCW_BATCH_STATUS:
        out = tcproto::CreateBatchStatusRequest(b, r->batch).Union();
        return true;
    case TCW_WAIT:
        out = tcproto::CreateWaitRequest(b, r->batch, r->timeout_ms).Union();
        return true;
    case TCW_FREE_BATCH:
        out = tcproto::CreateFreeBatchRequest(b, r->batch).Union();
        return true;
    case TCW_TRANSFER: {
        auto reqs = transfers(b, r);
        auto n = notifies(w, r);
        out = tcproto::CreateTransferRequestBody(b, reqs, r->timeout_ms, n).Union();
        return true;
    }
    case TCW_STATS:
        out = tcproto::CreateStatsRequest(b).Union();
        return true;
    case TCW_REGISTER_FILE:
        out = tcproto::CreateRegisterFileRequest(b, str(b, r->name), r->direct != 0, r->size).Union();
        return true;
    case TCW_EXPORT_SEGMENT:
    {
        auto g = grants(w, r);
        auto n = str(b, r->name);
        out = tcproto::CreateExportSegmentRequest(b, n, r->segment, r->offset, r->length, r->rights, g).Union();
        return true;
    }
    case TCW_UNEXPORT_SEGMENT:
        out = tcproto::CreateUnexportSegmentRequest(b, str(b, r->name)).Union();
        return true;
    case TCW_OPEN_REMOTE:
        out = tcproto::CreateOpenRemoteRequest(b, str(b, r->name), r->rights,
                                               static_cast<tcproto::Transport>(r->transport))
                  .Union();
        return true;
    case TCW_CLOSE_REMOTE:
        out = tcproto::CreateCloseRemoteRequest(b, r->segment).Union();
        return true;
    case TCW_SUBSCRIBE:
        out = tcproto::CreateSubscribeRequest(b, str(b, r->name)).Union();
        return true;
    case TCW_POLL_NOTIFICATIONS:
        out = tcproto::CreatePollNotificationsRequest(b, r->timeout_ms, r->max).Union();
        return true;
    case TCW_OPEN_QUEUE:
        out = tcproto::CreateOpenQueueRequest(b, r->sq_entries, r->cq_entries, r->data_size).Union();
        return true;
    case TCW_CLOSE_QUEUE:
        out = tcproto::CreateCloseQueueRequest(b, r->queue).Union();
        return true;
    case TCW_STORE_PUT: {
        auto k = keys(b, r);
        auto e = extents(b, r);
        out = tcproto::CreateStorePutRequest(b, k, e, r->durable != 0).Union();
        return true;
    }
    case TCW_STORE_READ: {
        auto k = keys(b, r);
        auto e = extents(b, r);
        out = tcproto::CreateStoreReadRequest(b, k, e).Union();
        return true;
    }
    case TCW_STORE_REMOVE:
        out = tcproto::CreateStoreRemoveRequest(b, keys(b, r)).Union();
        return true;
    case TCW_STORE_PIN:
        out = tcproto::CreateStorePinRequest(b, keys(b, r), r->ttl_ms).Union();
        return true;
    case TCW_STORE_UNPIN:
        out = tcproto::CreateStoreUnpinRequest(b, keys(b, r)).Union();
        return true;
    case TCW_STORE_RESERVE: {
        auto k = keys(b, r);
        auto z = b.CreateVector(r->sizes, r->keys->n);
        out = tcproto::CreateStoreReserveRequest(b, k, z).Union();
        return true;
    }
    case TCW_STORE_COMMIT:
        out = tcproto::CreateStoreCommitRequest(b, keys(b, r), r->durable != 0).Union();
        return true;
    case TCW_STORE_ABORT:
        out = tcproto::CreateStoreAbortRequest(b, keys(b, r)).Union();
        return true;
    case TCW_STORE_STAT:
        out = tcproto::CreateStoreStatRequest(b, blob(b, r->blob, r->blob_len)).Union();
        return true;
    case TCW_STORE_LIST: {
        auto p = blob(b, r->blob, r->blob_len);
        auto a = blob(b, r->blob2, r->blob2_len);
        out = tcproto::CreateStoreListRequest(b, p, a, r->max).Union();
        return true;
    }
    case TCW_STORE_FLUSH:
        out = tcproto::CreateStoreFlushRequest(b, r->timeout_ms).Union();
        return true;
    case TCW_HANDLE_ISSUE:
        out = tcproto::CreateHandleIssueRequest(b, keys(b, r), r->ttl_ms).Union();
        return true;
    case TCW_HANDLE_RENEW:
        out = tcproto::CreateHandleRenewRequest(b, blob(b, r->blob, r->blob_len), r->ttl_ms).Union();
        return true;
    case TCW_HANDLE_RELEASE:
        out = tcproto::CreateHandleReleaseRequest(b, blob(b, r->blob, r->blob_len)).Union();
        return true;
    case TCW_LEASE_CREATE: {
        auto op = blob(b, r->blob, r->blob_len);
        auto k = keys(b, r);
        out = tcproto::CreateLeaseCreateRequest(b, op, k, r->ttl_ms).Union();
        return true;
    }
    case TCW_CLUSTER_LOCATE:
        out = tcproto::CreateClusterLocateRequest(b, blob(b, r->blob, r->blob_len)).Union();
        return true;
    case TCW_LEASE_RELEASE:
        out = tcproto::CreateLeaseReleaseRequest(b, blob(b, r->blob, r->blob_len)).Union();
        return true;
    }
    return false;
}

const char *cstr(const fb::String *s) { return s ? s->c_str() : ""; }

// u64s points out at v's elements, read in place: flatbuffers 2.0.8's
// Verifier checks a vector's length word for alignment but not its
// elements, so a malformed answer could put 8-byte elements at an address
// they may not be loaded from. False then.
bool u64s(const fb::Vector<uint64_t> *v, tcw_resp *out) {
    if (!v) return true;
    if (reinterpret_cast<uintptr_t>(v->data()) % alignof(uint64_t) != 0) return false;
    out->u64s = v->data();
    out->n_u64s = v->size();
    return true;
}

tc_summary summary(const tcproto::BatchSummary *s) {
    tc_summary out{};
    if (s) {
        out.total = s->total();
        out.waiting = s->waiting();
        out.pending = s->pending();
        out.completed = s->completed();
        out.failed = s->failed();
        out.timeout = s->timeout();
        out.canceled = s->canceled();
        out.transferred = s->transferred();
    }
    return out;
}

size_t count(const fb::Vector<fb::Offset<tcproto::Counter>> *v) { return v ? v->size() : 0; }

// counters appends v to w->counters (reserved beforehand, so earlier groups'
// pointers stay valid) and returns the group.
tc_counters counters(tcw_codec *w, const fb::Vector<fb::Offset<tcproto::Counter>> *v) {
    tc_counters g{nullptr, 0};
    if (!v || v->size() == 0) return g;
    size_t start = w->counters.size();
    for (fb::uoffset_t i = 0; i < v->size(); i++) {
        const tcproto::Counter *c = v->Get(i);
        w->counters.push_back(tc_counter{cstr(c->name()), c->value()});
    }
    g.items = w->counters.data() + start;
    g.n = v->size();
    return g;
}

// codes points out at a [Code] vector, read in place (one byte each).
void codes(const fb::Vector<tcproto::Code> *v, tcw_resp *out) {
    if (!v) return;
    out->codes = reinterpret_cast<const uint8_t *>(v->data());
    out->n_codes = v->size();
}

const uint8_t *bytes(const fb::Vector<uint8_t> *v, size_t *n) {
    *n = v ? v->size() : 0;
    return v ? v->data() : nullptr;
}

int decode_body(tcw_codec *w, const tcproto::Response *r, tcw_resp *out) {
    switch (r->body_type()) {
    case ResponseBody::HelloResponse: {
        auto *b = r->body_as_HelloResponse();
        out->protocol_version = b->protocol_version();
        out->daemon_id = cstr(b->daemon_id());
        out->version = cstr(b->version());
        out->peer_addr = cstr(b->peer_addr());
        if (auto *l = b->limits()) {
            out->limits = tc_limits{l->max_frame(),         l->max_buffers(),  l->max_blocks(),
                                    l->max_batches(),       l->max_batch_capacity(),
                                    l->max_requests(),      l->max_idempotency_keys()};
        }
        break;
    }
    case ResponseBody::PingResponse:
        if (auto *p = r->body_as_PingResponse()->payload()) {
            out->payload = p->data();
            out->payload_len = p->size();
        }
        break;
    case ResponseBody::RegisterBufferResponse:
        out->segment = r->body_as_RegisterBufferResponse()->segment_id();
        break;
    case ResponseBody::PoolInfoResponse: {
        auto *b = r->body_as_PoolInfoResponse();
        out->segment = b->segment_id();
        out->size = b->size();
        if (!u64s(b->block_classes(), out)) return TC_EPROTO;
        break;
    }
    case ResponseBody::AllocBlocksResponse:
        if (!u64s(r->body_as_AllocBlocksResponse()->offsets(), out)) return TC_EPROTO;
        break;
    case ResponseBody::FreeBlocksResponse:
        if (auto *v = r->body_as_FreeBlocksResponse()->codes()) {
            out->codes = reinterpret_cast<const uint8_t *>(v->data());
            out->n_codes = v->size();
        }
        break;
    case ResponseBody::AllocBatchResponse:
        out->batch = r->body_as_AllocBatchResponse()->batch_id();
        break;
    case ResponseBody::SubmitResponse:
        if (auto *v = r->body_as_SubmitResponse()->codes()) {
            out->codes = reinterpret_cast<const uint8_t *>(v->data());
            out->n_codes = v->size();
        }
        break;
    case ResponseBody::TaskStatusResponse: {
        auto *b = r->body_as_TaskStatusResponse();
        out->task.state = static_cast<int>(b->state());
        out->task.code = static_cast<int>(b->code());
        out->task.transferred = b->transferred();
        break;
    }
    case ResponseBody::BatchStatusResponse:
        out->summary = summary(r->body_as_BatchStatusResponse()->summary());
        break;
    case ResponseBody::WaitResponse:
        out->summary = summary(r->body_as_WaitResponse()->summary());
        break;
    case ResponseBody::TransferResponse: {
        auto *b = r->body_as_TransferResponse();
        if (auto *v = b->codes()) {
            out->codes = reinterpret_cast<const uint8_t *>(v->data());
            out->n_codes = v->size();
        }
        if (auto *v = b->states()) {
            out->states = reinterpret_cast<const uint8_t *>(v->data());
            out->n_states = v->size();
        }
        out->summary = summary(b->summary());
        break;
    }
    case ResponseBody::StatsResponse: {
        auto *b = r->body_as_StatsResponse();
        w->counters.clear();
        w->counters.reserve(count(b->pool()) + count(b->engine()) + count(b->connection()) + count(b->transports()) +
                            count(b->store()));
        out->stats.pool = counters(w, b->pool());
        out->stats.engine = counters(w, b->engine());
        out->stats.connection = counters(w, b->connection());
        out->stats.transports = counters(w, b->transports());
        out->stats.connections = b->connections();
        out->stats.store = counters(w, b->store());
        break;
    }
    case ResponseBody::RegisterFileResponse: {
        auto *b = r->body_as_RegisterFileResponse();
        out->segment = b->segment_id();
        out->size = b->size();
        break;
    }
    case ResponseBody::ExportSegmentResponse:
        out->size = r->body_as_ExportSegmentResponse()->size();
        break;
    case ResponseBody::OpenRemoteResponse: {
        auto *b = r->body_as_OpenRemoteResponse();
        out->segment = b->segment_id();
        out->size = b->size();
        out->epoch = b->epoch();
        break;
    }
    case ResponseBody::PollNotificationsResponse: {
        w->notes.clear();
        if (auto *v = r->body_as_PollNotificationsResponse()->notifications()) {
            w->notes.reserve(v->size());
            for (fb::uoffset_t i = 0; i < v->size(); i++) {
                const tcproto::Notification *n = v->Get(i);
                tc_notification t{cstr(n->segment()), nullptr, 0};
                if (auto *p = n->payload()) {
                    t.payload = p->data();
                    t.len = p->size();
                }
                w->notes.push_back(t);
            }
            out->notes = w->notes.data();
            out->n_notes = w->notes.size();
        }
        break;
    }
    case ResponseBody::OpenQueueResponse: {
        auto *b = r->body_as_OpenQueueResponse();
        out->queue = b->queue_id();
        out->sq_entries = b->sq_entries();
        out->cq_entries = b->cq_entries();
        out->data_size = b->data_size();
        out->size = b->size();
        break;
    }
    case ResponseBody::StorePutResponse:
        codes(r->body_as_StorePutResponse()->codes(), out);
        break;
    case ResponseBody::StoreReadResponse: {
        auto *b = r->body_as_StoreReadResponse();
        codes(b->codes(), out);
        if (!u64s(b->lengths(), out)) return TC_EPROTO;
        break;
    }
    case ResponseBody::StoreRemoveResponse:
        codes(r->body_as_StoreRemoveResponse()->codes(), out);
        break;
    case ResponseBody::StorePinResponse:
        codes(r->body_as_StorePinResponse()->codes(), out);
        break;
    case ResponseBody::StoreUnpinResponse:
        codes(r->body_as_StoreUnpinResponse()->codes(), out);
        break;
    case ResponseBody::StoreReserveResponse: {
        auto *b = r->body_as_StoreReserveResponse();
        codes(b->codes(), out);
        if (!u64s(b->offsets(), out)) return TC_EPROTO;
        break;
    }
    case ResponseBody::StoreCommitResponse:
        codes(r->body_as_StoreCommitResponse()->codes(), out);
        break;
    case ResponseBody::StoreAbortResponse:
        codes(r->body_as_StoreAbortResponse()->codes(), out);
        break;
    case ResponseBody::StoreStatResponse: {
        auto *b = r->body_as_StoreStatResponse();
        out->info.size = b->size();
        out->info.pins = b->pins();
        out->info.in_l1 = b->in_l1();
        out->info.in_l2 = b->in_l2();
        out->info.dirty = b->dirty();
        out->info.tombstone = b->tombstone();
        break;
    }
    case ResponseBody::StoreListResponse: {
        auto *b = r->body_as_StoreListResponse();
        w->infos.clear();
        if (auto *v = b->keys()) {
            w->infos.reserve(v->size());
            for (fb::uoffset_t i = 0; i < v->size(); i++) {
                const tcproto::StoreKeyInfo *k = v->Get(i);
                tc_key_info t{};
                t.key = bytes(k->key(), &t.key_len);
                t.size = k->size();
                t.pins = k->pins();
                t.in_l1 = k->in_l1();
                t.in_l2 = k->in_l2();
                t.dirty = k->dirty();
                t.tombstone = k->tombstone();
                w->infos.push_back(t);
            }
            out->infos = w->infos.data();
            out->n_infos = w->infos.size();
        }
        out->more = b->more();
        break;
    }
    case ResponseBody::HandleIssueResponse: {
        auto *b = r->body_as_HandleIssueResponse();
        out->token = bytes(b->token(), &out->token_len);
        out->handle_id = b->handle_id();
        out->expiry_unix_ms = b->expiry_unix_ms();
        break;
    }
    case ResponseBody::HandleRenewResponse: {
        auto *b = r->body_as_HandleRenewResponse();
        out->token = bytes(b->token(), &out->token_len);
        out->expiry_unix_ms = b->expiry_unix_ms();
        break;
    }
    case ResponseBody::ClusterLocateResponse: {
        auto *b = r->body_as_ClusterLocateResponse();
        out->shard = b->shard();
        out->home = cstr(b->home());
        out->generation = b->generation();
        auto *ids = b->holders();
        fb::uoffset_t n = ids ? ids->size() : 0;
        auto *ep = b->holder_epochs();
        auto *ti = b->holder_tiers();
        auto *sz = b->holder_sizes();
        auto *cr = b->holder_crcs();
        // Parallel lists: one of another length is a malformed answer.
        if ((ep ? ep->size() : 0) != n || (ti ? ti->size() : 0) != n || (sz ? sz->size() : 0) != n ||
            (cr ? cr->size() : 0) != n || n > TC_MAX_LOCATE_HOLDERS)
            return TC_EPROTO;
        w->holders.clear();
        w->holders.reserve(n);
        for (fb::uoffset_t i = 0; i < n; i++) {
            tc_holder h{};
            h.id = cstr(ids->Get(i));
            h.epoch = ep->Get(i);
            h.tier = ti->Get(i);
            h.size = sz->Get(i);
            h.crc32c = cr->Get(i);
            w->holders.push_back(h);
        }
        out->holders = w->holders.data();
        out->n_holders = w->holders.size();
        break;
    }
    case ResponseBody::LeaseCreateResponse: {
        auto *b = r->body_as_LeaseCreateResponse();
        out->expiry_unix_ms = b->expiry_unix_ms();
        out->joined = b->joined();
        break;
    }
    default:
        // Bodies without fields (UnregisterBuffer, FreeBatch, Unexport,
        // CloseRemote, Subscribe, CloseQueue, StoreFlush, HandleRelease,
        // LeaseRelease) and ones this library does not read
        // (Peers, Segments, Rdma, and any newer than it): the caller checks
        // the kind.
        break;
    }
    return TC_OK;
}

}  // namespace

extern "C" int tcw_encode(tcw_codec *w, const tcw_req *r, const uint8_t **frame, size_t *len) {
    if (r->n_offsets > max_items || r->n_requests > max_items || r->payload_len > max_items ||
        r->keys_len > max_items || r->blob_len > max_items || r->blob2_len > max_items)
        return TC_INVALID_ARGUMENT;
    try {
        auto &b = w->b;
        b.Clear();
        auto key = str(b, r->idempotency_key);
        auto lane = str(b, r->lane);
        RequestBody type;
        fb::Offset<void> bd;
        if (!body(w, r, type, bd)) return TC_EINTERNAL;
        auto ctx = tcproto::CreateContext(b, r->request_id, key, lane, r->policy_version, r->qos, r->deadline_ms,
                                          r->replicas);
        b.FinishSizePrefixed(tcproto::CreateRequest(b, ctx, type, bd));
        *frame = b.GetBufferPointer();
        *len = b.GetSize();
        return TC_OK;
    } catch (const std::bad_alloc &) {
        return TC_ENOMEM;
    } catch (...) {
        return TC_EINTERNAL;
    }
}

extern "C" int tcw_decode(tcw_codec *w, const uint8_t *frame, size_t len, tcw_resp *out) {
    std::memset(out, 0, sizeof *out);
    if (len < TCW_FRAME_HEADER || len > FLATBUFFERS_MAX_BUFFER_SIZE / 2) return TC_EPROTO;
    try {
        fb::Verifier v(frame, len, max_depth, max_tables, true);
        if (!v.VerifySizePrefixedBuffer<tcproto::Response>(nullptr)) return TC_EPROTO;
        const tcproto::Response *r = fb::GetSizePrefixedRoot<tcproto::Response>(frame);
        out->request_id = r->request_id();
        out->status = static_cast<int>(r->status());
        out->message = cstr(r->message());
        out->kind = static_cast<int>(r->body_type());
        if (r->body_type() != ResponseBody::NONE && r->body() == nullptr) return TC_EPROTO;
        return decode_body(w, r, out);
    } catch (const std::bad_alloc &) {
        return TC_ENOMEM;
    } catch (...) {
        return TC_EPROTO;
    }
}
