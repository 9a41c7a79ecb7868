//go:build linux && cgo

package rdma

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

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
static const char *tc_load(void) {
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
static struct ibv_context *tc_open(const char *name, char *found, size_t foundlen) {
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

static int tc_close_device(struct ibv_context *c) { return tc_rc(tc_close_device_p(c)); }

struct tc_caps { int max_qp_wr, max_cqe, max_qp_rd_atom, max_qp_init_rd_atom; uint64_t max_mr_size; };

static int tc_query_caps(struct ibv_context *c, struct tc_caps *out) {
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
static int tc_query_port(struct ibv_context *c, uint8_t port, int *state, int *mtu, uint16_t *lid) {
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

static int tc_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t *out) {
	union ibv_gid g;
	int r = tc_query_gid_p(c, port, index, &g);
	if (r) return tc_rc(r);
	memcpy(out, g.raw, 16);
	return 0;
}

static struct ibv_pd *tc_alloc_pd(struct ibv_context *c) { return tc_alloc_pd_p(c); }
static int tc_dealloc_pd(struct ibv_pd *pd) { return tc_rc(tc_dealloc_pd_p(pd)); }

// tc_reg_mr registers [addr, addr+len) for local use plus, by remote_read
// and remote_write, the peer's one-sided operations.
static struct ibv_mr *tc_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int remote_read, int remote_write,
		uint32_t *lkey, uint32_t *rkey) {
	int access = IBV_ACCESS_LOCAL_WRITE;
	if (remote_read) access |= IBV_ACCESS_REMOTE_READ;
	if (remote_write) access |= IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *mr = tc_reg_mr_p(pd, (void *)addr, len, access);
	if (mr) { *lkey = mr->lkey; *rkey = mr->rkey; }
	return mr;
}
static int tc_dereg_mr(struct ibv_mr *mr) { return tc_rc(tc_dereg_mr_p(mr)); }

// tc_cq is a completion queue with its channel (non-blocking) and the
// scratch array ibv_poll_cq fills.
struct tc_cq {
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_wc *wcs;
	int nwcs;
	unsigned unacked;
};

static struct tc_cq *tc_create_cq(struct ibv_context *c, int cqe, int batch) {
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

static int tc_cq_fd(struct tc_cq *q) { return q->ch->fd; }

static int tc_destroy_cq(struct tc_cq *q) {
	if (q->unacked) tc_ack_cq_events_p(q->cq, q->unacked);
	int r = tc_destroy_cq_p(q->cq);
	if (r) return tc_rc(r);
	r = tc_destroy_comp_channel_p(q->ch);
	free(q->wcs);
	free(q);
	return tc_rc(r);
}

// struct tc_wc mirrors Go's completion.
struct tc_wc { uint64_t id; uint32_t status, vendor, byte_len, pad; };

// tc_poll takes up to n completions into out.
static int tc_poll(struct tc_cq *q, struct tc_wc *out, int n) {
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

static int tc_arm(struct tc_cq *q) { return tc_rc(ibv_req_notify_cq(q->cq, 0)); }

// tc_take_event reads one event from the (non-blocking) channel: 1 taken,
// 0 none pending. Events are acknowledged in batches.
static int tc_take_event(struct tc_cq *q) {
	struct ibv_cq *cq;
	void *ctx;
	if (tc_get_cq_event_p(q->ch, &cq, &ctx) != 0) {
		if (errno == EAGAIN) return 0;
		return -1;
	}
	if (++q->unacked >= 64) { tc_ack_cq_events_p(q->cq, q->unacked); q->unacked = 0; }
	return 1;
}

// struct tc_wr mirrors Go's WorkRequest.
struct tc_wr { uint64_t id, laddr, raddr; uint32_t length, lkey, rkey; uint8_t op, signaled, pad[2]; };

// tc_qp is a queue pair with its posting buffers.
struct tc_qp {
	struct ibv_qp *qp;
	struct tc_wr *wrs;
	struct ibv_send_wr *swr;
	struct ibv_sge *sge;
	int depth;
};

static struct tc_qp *tc_create_qp(struct ibv_pd *pd, struct tc_cq *cq, int depth) {
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

static int tc_destroy_qp(struct tc_qp *q) {
	int r = tc_destroy_qp_p(q->qp);
	if (r) return tc_rc(r);
	free(q->wrs); free(q->swr); free(q->sge); free(q);
	return 0;
}

static uint32_t tc_qpn(struct tc_qp *q) { return q->qp->qp_num; }
static struct tc_wr *tc_wrs(struct tc_qp *q) { return q->wrs; }

// tc_post links wrs[0..n) into one list and posts it; *posted is how many
// the provider took.
static int tc_post(struct tc_qp *q, int n, int *posted) {
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
static size_t tc_wr_off(int f) {
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

static size_t tc_wc_off(int f) {
	switch (f) {
	case 0: return offsetof(struct tc_wc, id);
	case 1: return offsetof(struct tc_wc, status);
	case 2: return offsetof(struct tc_wc, vendor);
	case 3: return offsetof(struct tc_wc, byte_len);
	case 4: return sizeof(struct tc_wc);
	}
	return 0;
}

static int tc_modify_state(struct tc_qp *q, int state) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	return tc_rc(tc_modify_qp_p(q->qp, &a, IBV_QP_STATE));
}

static int tc_to_init(struct tc_qp *q, int port) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	return tc_rc(tc_modify_qp_p(q->qp, &a,
		IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
}

static int tc_to_rtr(struct tc_qp *q, int port, int mtu, uint32_t dqpn, uint32_t rq_psn,
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

static int tc_to_rts(struct tc_qp *q, uint32_t sq_psn, int timeout, int retry, int rd_atom) {
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
*/
import "C"

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorcast/tensorcast/xfer"
)

// The status table of wcstatus.go follows the C enum.
var _ = [1]struct{}{}[WCTMRndvIncomplete-C.IBV_WC_TM_RNDV_INCOMPLETE]
var _ = [1]struct{}{}[C.IBV_WC_TM_RNDV_INCOMPLETE-WCTMRndvIncomplete]
var _ = [1]struct{}{}[WCWRFlushErr-C.IBV_WC_WR_FLUSH_ERR]
var _ = [1]struct{}{}[WCRetryExcErr-C.IBV_WC_RETRY_EXC_ERR]

// abiCheck compares the Go mirrors of struct tc_wr and struct tc_wc with
// the C layout.
func abiCheck() error {
	var w WorkRequest
	wr := []uintptr{unsafe.Offsetof(w.id), unsafe.Offsetof(w.laddr), unsafe.Offsetof(w.raddr),
		unsafe.Offsetof(w.length), unsafe.Offsetof(w.lkey), unsafe.Offsetof(w.rkey),
		unsafe.Offsetof(w.op), unsafe.Offsetof(w.signaled), unsafe.Sizeof(w)}
	for i, off := range wr {
		if c := uintptr(C.tc_wr_off(C.int(i))); c != off {
			return fmt.Errorf("rdma: struct tc_wr field %d at %d in C, %d in Go", i, c, off)
		}
	}
	var c WorkCompletion
	wc := []uintptr{unsafe.Offsetof(c.id), unsafe.Offsetof(c.status), unsafe.Offsetof(c.vendor),
		unsafe.Offsetof(c.byteLen), unsafe.Sizeof(c)}
	for i, off := range wc {
		if cc := uintptr(C.tc_wc_off(C.int(i))); cc != off {
			return fmt.Errorf("rdma: struct tc_wc field %d at %d in C, %d in Go", i, cc, off)
		}
	}
	return nil
}

// library is the process-wide libibverbs handle, loaded once.
var library struct {
	once sync.Once
	err  error
}

// loadLibrary opens libibverbs once; later calls return the first result.
func loadLibrary() error {
	library.once.Do(func() {
		if err := abiCheck(); err != nil {
			library.err = err
			return
		}
		if msg := C.tc_load(); msg != nil {
			library.err = fmt.Errorf("%w (%s)", ErrNoLibrary, C.GoString(msg))
		}
	})
	return library.err
}

// noLibraryLogged makes "libibverbs not found" appear once per process.
var noLibraryLogged sync.Once

// Device is an opened RDMA device port with its protection domain. Regions
// and transports made from it belong to it and must be released before
// Close.
type Device struct {
	ctx  *C.struct_ibv_context
	pd   *C.struct_ibv_pd
	name string
	cfg  Config
	addr Addr
	caps C.struct_tc_caps
	log  *slog.Logger

	mu         sync.Mutex // guards the fields below
	regions    int
	transports int
	closed     bool
}

// Open opens the configured device (or the first one), queries its port
// and picks the RoCE v2 GID (Config.GIDIndex overrides). On a host without
// libibverbs it fails with ErrNoLibrary, and logs that once.
func Open(cfg Config, log *slog.Logger) (*Device, error) {
	portSet := cfg.Port != 0
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := loadLibrary(); err != nil {
		noLibraryLogged.Do(func() { log.Warn("rdma: libibverbs not found; RDMA is off, tcp only", "err", err) })
		return nil, err
	}
	if cfg.Device == "" {
		// The first device with an active port, as the kernel lists them.
		if name, port, ok := FirstActive(ListDevices()); ok {
			cfg.Device = name
			if !portSet {
				cfg.Port = port
			}
		}
	}
	cname := C.CString(cfg.Device)
	defer C.free(unsafe.Pointer(cname))
	var found [64]C.char
	ctx, errno := C.tc_open(cname, &found[0], C.size_t(len(found)))
	if ctx == nil {
		if cfg.Device == "" {
			return nil, fmt.Errorf("%w: libibverbs lists none (%v)", ErrNoDevice, errno)
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrNoDevice, cfg.Device, os.NewSyscallError("ibv_open_device", errno))
	}
	d := &Device{ctx: ctx, name: C.GoString(&found[0]), cfg: cfg, log: log}
	if err := d.setup(); err != nil {
		if d.pd != nil {
			C.tc_dealloc_pd(d.pd)
		}
		C.tc_close_device(ctx)
		return nil, err
	}
	log.Info("rdma: device open", "device", d.name, "port", cfg.Port, "gid", d.addr.GID.String(),
		"gid_index", d.addr.GIDIndex, "mtu", d.addr.MTU.Bytes(), "max_qp_wr", int(d.caps.max_qp_wr))
	return d, nil
}

func (d *Device) setup() error {
	if r, err := C.tc_query_caps(d.ctx, &d.caps); r != 0 {
		return os.NewSyscallError("ibv_query_device", err)
	}
	var state, mtu C.int
	var lid C.uint16_t
	if r, err := C.tc_query_port(d.ctx, C.uint8_t(d.cfg.Port), &state, &mtu, &lid); r != 0 {
		return fmt.Errorf("%w: %s port %d: %v", ErrNoDevice, d.name, d.cfg.Port, os.NewSyscallError("ibv_query_port", err))
	}
	if state != C.IBV_PORT_ACTIVE {
		return fmt.Errorf("%w: %s port %d is not active (state %d)", ErrNoDevice, d.name, d.cfg.Port, int(state))
	}
	g, err := ChooseGID(d.name, d.cfg.Port, d.cfg.Netdev, d.cfg.GID)
	if err != nil {
		return err
	}
	// What the device itself says for that index must agree with sysfs.
	var raw GID
	if r, err := C.tc_query_gid(d.ctx, C.uint8_t(d.cfg.Port), C.int(g.Index), (*C.uint8_t)(unsafe.Pointer(&raw[0]))); r != 0 {
		return os.NewSyscallError("ibv_query_gid", err)
	}
	if raw != g.GID {
		return fmt.Errorf("%w: gid %d is %s on the device, %s in sysfs", ErrNoGID, g.Index, raw, g.GID)
	}
	d.addr = Addr{GID: g.GID, GIDIndex: g.Index, LID: uint16(lid), MTU: MTU(mtu)}
	pd, errno := C.tc_alloc_pd(d.ctx)
	if pd == nil {
		return os.NewSyscallError("ibv_alloc_pd", errno)
	}
	d.pd = pd
	return nil
}

// Name is the device name (rxe0, mlx5_0).
func (d *Device) Name() string { return d.name }

// Addr is the port's address: the chosen GID and its index, LID, MTU.
func (d *Device) Addr() Addr { return d.addr }

// Register registers mem (which must not be Go-heap memory: an mmap'd
// segment) as one MR per Config.ChunkSize, RegisterWorkers at a time, open
// to the peer's READ and WRITE (RegisterAccess with AccessRemote).
func (d *Device) Register(mem []byte) (*Region, error) { return d.RegisterAccess(mem, AccessRemote) }

// RegisterAccess is Register with the remote access the MRs grant: a
// region registered with AccessLocal can only be the local side of
// requests, and the hardware refuses a peer's READ of a region without
// AccessRemoteRead and its WRITE without AccessRemoteWrite.
func (d *Device) RegisterAccess(mem []byte, access Access) (*Region, error) {
	if access&^AccessRemote != 0 {
		return nil, fmt.Errorf("%w: access %#x", xfer.ErrInvalid, uint8(access))
	}
	if len(mem) == 0 {
		return nil, fmt.Errorf("%w: empty memory", ErrNotRegistered)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, ErrNoDevice
	}
	d.regions++
	d.mu.Unlock()
	base := uintptr(unsafe.Pointer(&mem[0]))
	reg := func(off, n uint64) (uint32, uint32, any, error) {
		var lkey, rkey C.uint32_t
		mr, err := C.tc_reg_mr(d.pd, C.uintptr_t(base+uintptr(off)), C.size_t(n),
			C.int(access&AccessRemoteRead), C.int(access&AccessRemoteWrite), &lkey, &rkey)
		if mr == nil {
			return 0, 0, 0, os.NewSyscallError("ibv_reg_mr", err)
		}
		return uint32(lkey), uint32(rkey), mr, nil
	}
	r, err := NewRegion(uint64(base), uint64(len(mem)), d.cfg.ChunkSize, access, d.cfg.RegisterWorkers, reg, deregMR)
	if err != nil {
		d.mu.Lock()
		d.regions--
		d.mu.Unlock()
		return nil, err
	}
	return r, nil
}

func deregMR(h any) error {
	mr, ok := h.(*C.struct_ibv_mr)
	if !ok {
		return fmt.Errorf("rdma: not a memory registration: %T", h)
	}
	if r, err := C.tc_dereg_mr(mr); r != 0 {
		return os.NewSyscallError("ibv_dereg_mr", err)
	}
	return nil
}

// Deregister releases a region's MRs. No transport may still use it.
func (d *Device) Deregister(r *Region) error {
	err := r.Release()
	d.mu.Lock()
	d.regions--
	d.mu.Unlock()
	return err
}

// NewTransport creates Config.QPs RC queue pairs on one completion queue.
// Connect (or the peer's Accept) then brings them up.
func (d *Device) NewTransport() (*Transport, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, ErrNoDevice
	}
	d.transports++
	d.mu.Unlock()
	fail := func(err error) (*Transport, error) {
		d.mu.Lock()
		d.transports--
		d.mu.Unlock()
		return nil, err
	}
	cfg := d.cfg
	depth := min(cfg.SendDepth, int(d.caps.max_qp_wr))
	for depth&(depth-1) != 0 {
		depth &= depth - 1
	}
	cfg.SendDepth = depth
	cqe := min(cfg.QPs*depth+cfg.QPs, int(d.caps.max_cqe))
	ccq, errno := C.tc_create_cq(d.ctx, C.int(cqe), C.int(cfg.PollBatch))
	if ccq == nil {
		return fail(os.NewSyscallError("ibv_create_cq", errno))
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		C.tc_destroy_cq(ccq)
		return fail(os.NewSyscallError("eventfd", err))
	}
	cq := &verbsCQ{q: ccq, efd: efd}
	cq.fds = []unix.PollFd{{Fd: int32(C.tc_cq_fd(ccq)), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
	rd := min(16, int(d.caps.max_qp_rd_atom), int(d.caps.max_qp_init_rd_atom))
	var qps []QueuePair
	for range cfg.QPs {
		cqp, errno := C.tc_create_qp(d.pd, ccq, C.int(depth))
		if cqp == nil {
			for _, q := range qps {
				_ = q.Destroy()
			}
			_ = cq.Destroy()
			return fail(os.NewSyscallError("ibv_create_qp", errno))
		}
		q := &verbsQP{q: cqp, port: d.cfg.Port, gidIndex: d.addr.GIDIndex, cfg: cfg, rdAtom: max(rd, 1)}
		q.buf = unsafe.Slice((*WorkRequest)(unsafe.Pointer(C.tc_wrs(cqp))), depth)
		qps = append(qps, q)
	}
	release := func() {
		d.mu.Lock()
		d.transports--
		d.mu.Unlock()
	}
	return newTransport("rdma", cfg, d.log, d.addr, cq, qps, release), nil
}

// Close releases the protection domain and the device. It fails while
// regions or transports made from it are live.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	if d.regions > 0 || d.transports > 0 {
		return fmt.Errorf("rdma: device %s busy: %d regions, %d transports", d.name, d.regions, d.transports)
	}
	d.closed = true
	var errs []error
	if r, err := C.tc_dealloc_pd(d.pd); r != 0 {
		errs = append(errs, os.NewSyscallError("ibv_dealloc_pd", err))
	}
	if r, err := C.tc_close_device(d.ctx); r != 0 {
		errs = append(errs, os.NewSyscallError("ibv_close_device", err))
	}
	return errors.Join(errs...)
}

// verbsQP implements QueuePair over a libibverbs queue pair.
type verbsQP struct {
	q        *C.struct_tc_qp
	buf      []WorkRequest // over the C posting buffer
	port     int
	gidIndex int
	rdAtom   int
	cfg      Config
	posted   C.int // tc_post's out parameter; used under the queue pair's lock
}

func (q *verbsQP) WorkRequests() []WorkRequest { return q.buf }

func (q *verbsQP) Post(n int) (int, error) {
	// posted lives in q: a pointer to a local would escape per call.
	if r, err := C.tc_post(q.q, C.int(n), &q.posted); r != 0 {
		return int(q.posted), os.NewSyscallError("ibv_post_send", err)
	}
	return n, nil
}

func (q *verbsQP) Connect(local, remote *ConnInfo) error {
	if r, err := C.tc_modify_state(q.q, C.IBV_QPS_RESET); r != 0 {
		return os.NewSyscallError("ibv_modify_qp RESET", err)
	}
	if r, err := C.tc_to_init(q.q, C.int(q.port)); r != 0 {
		return os.NewSyscallError("ibv_modify_qp INIT", err)
	}
	mtu := min(local.MTU, remote.MTU)
	if r, err := C.tc_to_rtr(q.q, C.int(q.port), C.int(mtu), C.uint32_t(remote.QPN), C.uint32_t(remote.PSN),
		(*C.uint8_t)(unsafe.Pointer(&remote.GID[0])), C.int(q.gidIndex), C.uint16_t(remote.LID), C.int(q.rdAtom)); r != 0 {
		return os.NewSyscallError("ibv_modify_qp RTR", err)
	}
	if r, err := C.tc_to_rts(q.q, C.uint32_t(local.PSN), C.int(q.cfg.Timeout), C.int(q.cfg.RetryCount), C.int(q.rdAtom)); r != 0 {
		return os.NewSyscallError("ibv_modify_qp RTS", err)
	}
	return nil
}

func (q *verbsQP) Fail() error {
	if r, err := C.tc_modify_state(q.q, C.IBV_QPS_ERR); r != 0 {
		return os.NewSyscallError("ibv_modify_qp ERR", err)
	}
	return nil
}

func (q *verbsQP) Reset() error {
	if r, err := C.tc_modify_state(q.q, C.IBV_QPS_RESET); r != 0 {
		return os.NewSyscallError("ibv_modify_qp RESET", err)
	}
	return nil
}

func (q *verbsQP) QPN() uint32 { return uint32(C.tc_qpn(q.q)) }

func (q *verbsQP) Destroy() error {
	if r, err := C.tc_destroy_qp(q.q); r != 0 {
		return os.NewSyscallError("ibv_destroy_qp", err)
	}
	q.buf = nil
	return nil
}

// verbsCQ implements CompletionQueue: a completion queue whose channel fd is
// non-blocking, waited on with poll(2) together with an eventfd that wake
// writes (and nobody reads: once woken, every later wait returns false).
type verbsCQ struct {
	q   *C.struct_tc_cq
	efd int
	fds []unix.PollFd // preallocated for wait
}

func (c *verbsCQ) Poll(wcs []WorkCompletion) (int, error) {
	n, err := C.tc_poll(c.q, (*C.struct_tc_wc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs)))
	if n < 0 {
		return 0, os.NewSyscallError("ibv_poll_cq", err)
	}
	return int(n), nil
}

func (c *verbsCQ) Arm() error {
	if r, err := C.tc_arm(c.q); r != 0 {
		return os.NewSyscallError("ibv_req_notify_cq", err)
	}
	return nil
}

func (c *verbsCQ) Wait() (bool, error) {
	for {
		c.fds[0].Revents, c.fds[1].Revents = 0, 0
		_, err := unix.Poll(c.fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, os.NewSyscallError("poll", err)
		}
		if c.fds[1].Revents != 0 {
			return false, nil
		}
		if c.fds[0].Revents != 0 {
			if r, err := C.tc_take_event(c.q); r < 0 {
				return false, os.NewSyscallError("ibv_get_cq_event", err)
			}
			return true, nil
		}
	}
}

func (c *verbsCQ) Wake() {
	var one = [8]byte{1}
	_, _ = unix.Write(c.efd, one[:])
}

func (c *verbsCQ) Destroy() error {
	var errs []error
	if r, err := C.tc_destroy_cq(c.q); r != 0 {
		errs = append(errs, os.NewSyscallError("ibv_destroy_cq", err))
	}
	errs = append(errs, unix.Close(c.efd))
	return errors.Join(errs...)
}
