// Declarations of verbs_linux.c, included by the cgo preamble of
// verbs_linux.go (the only Go file that calls C): the structs Go shares with C (struct tc_wr and struct
// tc_wc mirror WorkRequest and WorkCompletion; abiCheck compares them) and
// the helpers Go calls.

#ifndef TC_VERBS_LINUX_H
#define TC_VERBS_LINUX_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

struct tc_caps { int max_qp_wr, max_cqe, max_qp_rd_atom, max_qp_init_rd_atom; uint64_t max_mr_size; };

// struct tc_wc mirrors Go's completion.
struct tc_wc { uint64_t id; uint32_t status, vendor, byte_len, pad; };

// struct tc_wr mirrors Go's WorkRequest.
struct tc_wr { uint64_t id, laddr, raddr; uint32_t length, lkey, rkey; uint8_t op, signaled, pad[2]; };

// A completion queue with its channel, and a queue pair with its posting
// buffers; only C touches their fields.
struct tc_cq;
struct tc_qp;

const char *tc_load(void);
struct ibv_context *tc_open(const char *name, char *found, size_t foundlen);
int tc_close_device(struct ibv_context *c);
int tc_query_caps(struct ibv_context *c, struct tc_caps *out);
int tc_query_port(struct ibv_context *c, uint8_t port, int *state, int *mtu, uint16_t *lid);
int tc_query_gid(struct ibv_context *c, uint8_t port, int index, uint8_t *out);
struct ibv_pd *tc_alloc_pd(struct ibv_context *c);
int tc_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *tc_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int remote_read, int remote_write, uint32_t *lkey, uint32_t *rkey);
int tc_dereg_mr(struct ibv_mr *mr);
struct tc_cq *tc_create_cq(struct ibv_context *c, int cqe, int batch);
int tc_cq_fd(struct tc_cq *q);
int tc_destroy_cq(struct tc_cq *q);
int tc_poll(struct tc_cq *q, struct tc_wc *out, int n);
int tc_arm(struct tc_cq *q);
int tc_take_event(struct tc_cq *q);
struct tc_qp *tc_create_qp(struct ibv_pd *pd, struct tc_cq *cq, int depth);
int tc_destroy_qp(struct tc_qp *q);
uint32_t tc_qpn(struct tc_qp *q);
struct tc_wr *tc_wrs(struct tc_qp *q);
int tc_post(struct tc_qp *q, int n, int *posted);
size_t tc_wr_off(int f);
size_t tc_wc_off(int f);
int tc_modify_state(struct tc_qp *q, int state);
int tc_to_init(struct tc_qp *q, int port);
int tc_to_rtr(struct tc_qp *q, int port, int mtu, uint32_t dqpn, uint32_t rq_psn, const uint8_t *dgid, int sgid_index, uint16_t dlid, int rd_atom);
int tc_to_rts(struct tc_qp *q, uint32_t sq_psn, int timeout, int retry, int rd_atom);

#endif
