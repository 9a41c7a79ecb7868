//go:build linux && cgo

// The C side of the verbs layer (see verbs_linux.go): libibverbs opened with
// dlopen, and the small helpers Go calls, each setting errno on failure so
// that the cgo call returns it. Declared in verbs_linux.h.

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "verbs_linux.h"

// libibverbs is opened at run time; nothing here links against it. The
// exported entry points are looked up with dlsym; the data-path verbs
// (post_send, poll_cq, req_notify_cq) are inline in verbs.h and go through
// the context's ops table, so they need no symbol at all.

static void *tc_lib;
static struct ibv_device **(*tc_get_device_list_p)(int *);
static void (*tc_free_device_list_p)(struct ibv_device **);
static const char *(*tc_get_device_name_p)(struct ibv_device *);
static struct ibv_context *(*tc_open_device_p)(struct ibv_device *);
static int (*tc_close_device_p)(struct ibv_context *);
static int (*tc_query_device_p)(struct ibv_context *, struct ibv_device_attr *);
static int (*tc_query_port_p)(struct ibv_context *, uint8_t, void *);
static int (*tc_query_gid_p)(struct ibv_context *, uint8_t, int, union ibv_gid *);
static struct ibv_pd *(*tc_alloc_pd_p)(struct ibv_context *);
static int (*tc_dealloc_pd_p)(struct ibv_pd *);
static struct ibv_mr *(*tc_reg_mr_p)(struct ibv_pd *, void *, size_t, int);
static int (*tc_dereg_mr_p)(struct ibv_mr *);
static struct ibv_comp_channel *(*tc_create_comp_channel_p)(struct ibv_context *);
static int (*tc_destroy_comp_channel_p)(struct ibv_comp_channel *);
static struct ibv_cq *(*tc_create_cq_p)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
static int (*tc_destroy_cq_p)(struct ibv_cq *);
static int (*tc_get_cq_event_p)(struct ibv_comp_channel *, struct ibv_cq **, void **);
static void (*tc_ack_cq_events_p)(struct ibv_cq *, unsigned int);
static struct ibv_qp *(*tc_create_qp_p)(struct ibv_pd *, struct ibv_qp_init_attr *);
static int (*tc_modify_qp_p)(struct ibv_qp *, struct ibv_qp_attr *, int);
static int (*tc_destroy_qp_p)(struct ibv_qp *);

#define TC_SYM(var, name) do { *(void **)(&var) = dlsym(tc_lib, name); if (!var) return name; } while (0)

// tc_load opens libibverbs and resolves every symbol. It returns NULL, or
// what failed (the dlerror text, or a missing symbol's name).
const char *tc_load(void) {
	tc_lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!tc_lib) {
		const char *e = dlerror();
		return e ? e : "dlopen libibverbs.so.1 failed";
	}
	TC_SYM(tc_get_device_list_p, "ibv_get_device_list");
	TC_SYM(tc_free_device_list_p, "ibv_free_device_list");
	TC_SYM(tc_get_device_name_p, "ibv_get_device_name");
	TC_SYM(tc_open_device_p, "ibv_open_device");
	TC_SYM(tc_close_device_p, "ibv_close_device");
	TC_SYM(tc_query_device_p, "ibv_query_device");
	TC_SYM(tc_query_port_p, "ibv_query_port");
	TC_SYM(tc_query_gid_p, "ibv_query_gid");
	TC_SYM(tc_alloc_pd_p, "ibv_alloc_pd");
	TC_SYM(tc_dealloc_pd_p, "ibv_dealloc_pd");
	TC_SYM(tc_reg_mr_p, "ibv_reg_mr");
	TC_SYM(tc_dereg_mr_p, "ibv_dereg_mr");
	TC_SYM(tc_create_comp_channel_p, "ibv_create_comp_channel");
	TC_SYM(tc_destroy_comp_channel_p, "ibv_destroy_comp_channel");
	TC_SYM(tc_create_cq_p, "ibv_create_cq");
	TC_SYM(tc_destroy_cq_p, "ibv_destroy_cq");
	TC_SYM(tc_get_cq_event_p, "ibv_get_cq_event");
	TC_SYM(tc_ack_cq_events_p, "ibv_ack_cq_events");
	TC_SYM(tc_create_qp_p, "ibv_create_qp");
	TC_SYM(tc_modify_qp_p, "ibv_modify_qp");
	TC_SYM(tc_destroy_qp_p, "ibv_destroy_qp");
	return NULL;
}

// Verbs that return an errno value (not -1) report it through errno too,
// so that Go sees it as the call's error.
static int tc_rc(int r) {
	if (r > 0) { errno = r; return -1; }
	return r;
}

// tc_open opens the device called name (any, when name is "").
struct ibv_context *tc_open(const char *name, char *found, size_t foundlen) {
	int n = 0;
	struct ibv_device **l = tc_get_device_list_p(&n);
	if (!l) return NULL;
	struct ibv_context *ctx = NULL;
	errno = ENODEV;
	for (int i = 0; i < n; i++) {
		const char *dn = tc_get_device_name_p(l[i]);
		if (name[0] && strcmp(name, dn) != 0) continue;
		ctx = tc_open_device_p(l[i]);
		if (ctx) { strncpy(found, dn, foundlen - 1); found[foundlen - 1] = 0; }
		break;
	}
	tc_free_device_list_p(l);
	return ctx;
}

int tc_close_device(struct ibv_context *c) { return tc_rc(tc_close_device_p(c)); }

int tc_query_caps(struct ibv_context *c, struct tc_caps *out) {
	struct ibv_device_attr a;
	int r = tc_query_device_p(c, &a);
	if (r) return tc_rc(r);
	out->max_qp_wr = a.max_qp_wr;
	out->max_cqe = a.max_cqe;
	out->max_qp_rd_atom = a.max_qp_rd_atom;
	out->max_qp_init_rd_atom = a.max_qp_init_rd_atom;
	out->max_mr_size = a.max_mr_size;
	return 0;
}

// tc_query_port: through the extended context op when the provider has it
// (as verbs.h's own inline does), else the exported compat entry point.
int tc_query_port(struct ibv_context *c, uint8_t port, int *state, int *mtu, uint16_t *lid) {
	struct ibv_port_attr a;
	memset(&a, 0, sizeof(a));
	struct verbs_context *vctx = verbs_get_ctx_op(c, query_port);
	int r = vctx ? vctx->query_port(c, port, &a, sizeof(a)) : tc_query_port_p(c, port, &a);
	if (r) return tc_rc(r);
	*state = a.state;
	*mtu = a.active_mtu;
	*lid = a.lid;
	return 0;
}

int tc_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t *out) {
	union ibv_gid g;
	int r = tc_query_gid_p(c, port, index, &g);
	if (r) return tc_rc(r);
	memcpy(out, g.raw, 16);
	return 0;
}

struct ibv_pd *tc_alloc_pd(struct ibv_context *c) { return tc_alloc_pd_p(c); }
int tc_dealloc_pd(struct ibv_pd *pd) { return tc_rc(tc_dealloc_pd_p(pd)); }

// tc_reg_mr registers [addr, addr+len) for local use plus, by remote_read
// and remote_write, the peer's one-sided operations.
struct ibv_mr *tc_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int remote_read, int remote_write,
		uint32_t *lkey, uint32_t *rkey) {
	int access = IBV_ACCESS_LOCAL_WRITE;
	if (remote_read) access |= IBV_ACCESS_REMOTE_READ;
	if (remote_write) access |= IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *mr = tc_reg_mr_p(pd, (void *)addr, len, access);
	if (mr) { *lkey = mr->lkey; *rkey = mr->rkey; }
	return mr;
}
int tc_dereg_mr(struct ibv_mr *mr) { return tc_rc(tc_dereg_mr_p(mr)); }

// tc_cq is a completion queue with its channel (non-blocking) and the
// scratch array ibv_poll_cq fills.
struct tc_cq {
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_wc *wcs;
	int nwcs;
	unsigned unacked;
};

struct tc_cq *tc_create_cq(struct ibv_context *c, int cqe, int batch) {
	struct tc_cq *q = calloc(1, sizeof(*q));
	if (!q) { errno = ENOMEM; return NULL; }
	q->wcs = calloc(batch, sizeof(struct ibv_wc));
	q->nwcs = batch;
	if (!q->wcs) { free(q); errno = ENOMEM; return NULL; }
	q->ch = tc_create_comp_channel_p(c);
	if (!q->ch) goto fail;
	int fl = fcntl(q->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(q->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) goto fail;
	q->cq = tc_create_cq_p(c, cqe, NULL, q->ch, 0);
	if (!q->cq) goto fail;
	return q;
fail:;
	int e = errno;
	if (q->ch) tc_destroy_comp_channel_p(q->ch);
	free(q->wcs);
	free(q);
	errno = e;
	return NULL;
}

int tc_cq_fd(struct tc_cq *q) { return q->ch->fd; }

int tc_destroy_cq(struct tc_cq *q) {
	if (q->unacked) tc_ack_cq_events_p(q->cq, q->unacked);
	int r = tc_destroy_cq_p(q->cq);
	if (r) return tc_rc(r);
	r = tc_destroy_comp_channel_p(q->ch);
	free(q->wcs);
	free(q);
	return tc_rc(r);
}

// tc_poll takes up to n completions into out.
int tc_poll(struct tc_cq *q, struct tc_wc *out, int n) {
	if (n > q->nwcs) n = q->nwcs;
	int k = ibv_poll_cq(q->cq, n, q->wcs);
	if (k < 0) { errno = EIO; return -1; }
	for (int i = 0; i < k; i++) {
		out[i].id = q->wcs[i].wr_id;
		out[i].status = q->wcs[i].status;
		out[i].vendor = q->wcs[i].vendor_err;
		out[i].byte_len = q->wcs[i].byte_len;
	}
	return k;
}

int tc_arm(struct tc_cq *q) { return tc_rc(ibv_req_notify_cq(q->cq, 0)); }

// tc_take_event reads one event from the (non-blocking) channel: 1 taken,
// 0 none pending. Events are acknowledged in batches.
int tc_take_event(struct tc_cq *q) {
	struct ibv_cq *cq;
	void *ctx;
	if (tc_get_cq_event_p(q->ch, &cq, &ctx) != 0) {
		if (errno == EAGAIN) return 0;
		return -1;
	}
	// The queue pair's goroutine and a reactor worker may both take
	// events while the queue pair changes hands: the count is atomic.
	unsigned n = __atomic_add_fetch(&q->unacked, 1, __ATOMIC_RELAXED);
	if (n >= 64) {
		unsigned k = __atomic_exchange_n(&q->unacked, 0, __ATOMIC_RELAXED);
		if (k) tc_ack_cq_events_p(q->cq, k);
	}
	return 1;
}

// tc_qp is a queue pair with its posting buffers.
struct tc_qp {
	struct ibv_qp *qp;
	struct tc_wr *wrs;
	struct ibv_send_wr *swr;
	struct ibv_sge *sge;
	int depth;
};

struct tc_qp *tc_create_qp(struct ibv_pd *pd, struct tc_cq *cq, int depth) {
	struct tc_qp *q = calloc(1, sizeof(*q));
	if (!q) { errno = ENOMEM; return NULL; }
	q->depth = depth;
	q->wrs = calloc(depth, sizeof(*q->wrs));
	q->swr = calloc(depth, sizeof(*q->swr));
	q->sge = calloc(depth, sizeof(*q->sge));
	if (!q->wrs || !q->swr || !q->sge) { errno = ENOMEM; goto fail; }
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq->cq;
	a.recv_cq = cq->cq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = depth;
	a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	q->qp = tc_create_qp_p(pd, &a);
	if (!q->qp) goto fail;
	return q;
fail:;
	int e = errno;
	free(q->wrs); free(q->swr); free(q->sge); free(q);
	errno = e;
	return NULL;
}

int tc_destroy_qp(struct tc_qp *q) {
	int r = tc_destroy_qp_p(q->qp);
	if (r) return tc_rc(r);
	free(q->wrs); free(q->swr); free(q->sge); free(q);
	return 0;
}

uint32_t tc_qpn(struct tc_qp *q) { return q->qp->qp_num; }
struct tc_wr *tc_wrs(struct tc_qp *q) { return q->wrs; }

// tc_post links wrs[0..n) into one list and posts it; *posted is how many
// the provider took.
int tc_post(struct tc_qp *q, int n, int *posted) {
	for (int i = 0; i < n; i++) {
		struct tc_wr *w = &q->wrs[i];
		struct ibv_send_wr *s = &q->swr[i];
		struct ibv_sge *g = &q->sge[i];
		g->addr = w->laddr;
		g->length = w->length;
		g->lkey = w->lkey;
		memset(s, 0, sizeof(*s));
		s->wr_id = w->id;
		s->sg_list = w->length ? g : NULL;
		s->num_sge = w->length ? 1 : 0;
		s->opcode = w->op == 2 ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
		s->send_flags = w->signaled ? IBV_SEND_SIGNALED : 0;
		s->wr.rdma.remote_addr = w->raddr;
		s->wr.rdma.rkey = w->rkey;
		s->next = i + 1 < n ? &q->swr[i + 1] : NULL;
	}
	struct ibv_send_wr *bad = NULL;
	int r = ibv_post_send(q->qp, q->swr, &bad);
	*posted = r ? (bad ? (int)(bad - q->swr) : 0) : n;
	return tc_rc(r);
}

// Layout of the structs shared with Go, checked by abiCheck.
size_t tc_wr_off(int f) {
	switch (f) {
	case 0: return offsetof(struct tc_wr, id);
	case 1: return offsetof(struct tc_wr, laddr);
	case 2: return offsetof(struct tc_wr, raddr);
	case 3: return offsetof(struct tc_wr, length);
	case 4: return offsetof(struct tc_wr, lkey);
	case 5: return offsetof(struct tc_wr, rkey);
	case 6: return offsetof(struct tc_wr, op);
	case 7: return offsetof(struct tc_wr, signaled);
	case 8: return sizeof(struct tc_wr);
	}
	return 0;
}

size_t tc_wc_off(int f) {
	switch (f) {
	case 0: return offsetof(struct tc_wc, id);
	case 1: return offsetof(struct tc_wc, status);
	case 2: return offsetof(struct tc_wc, vendor);
	case 3: return offsetof(struct tc_wc, byte_len);
	case 4: return sizeof(struct tc_wc);
	}
	return 0;
}

int tc_modify_state(struct tc_qp *q, int state) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	return tc_rc(tc_modify_qp_p(q->qp, &a, IBV_QP_STATE));
}

int tc_to_init(struct tc_qp *q, int port) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	return tc_rc(tc_modify_qp_p(q->qp, &a,
		IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

int tc_to_rtr(struct tc_qp *q, int port, int mtu, uint32_t dqpn, uint32_t rq_psn,
		const uint8_t *dgid, int sgid_index, uint16_t dlid, int rd_atom) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = rd_atom;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
	a.ah_attr.grh.sgid_index = sgid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.dlid = dlid;
	a.ah_attr.sl = 0;
	a.ah_attr.port_num = port;
	return tc_rc(tc_modify_qp_p(q->qp, &a,
		IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
}

int tc_to_rts(struct tc_qp *q, uint32_t sq_psn, int timeout, int retry, int rd_atom) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = sq_psn;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = 7;
	a.max_rd_atomic = rd_atom;
	return tc_rc(tc_modify_qp_p(q->qp, &a,
		IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		IBV_QP_MAX_QP_RD_ATOMIC));
}
