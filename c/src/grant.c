/*
 * grant.c - retention handles and placement leases on the control socket:
 * issue, renew and release a handle; create (or join) and release a lease.
 *
 * A token is copied out of the answer's frame into the caller's tc_handle;
 * one longer than TC_MAX_HANDLE_TOKEN, or empty, is a protocol violation
 * (TC_EPROTO, and the connection breaks).
 */
#include <string.h>

#include "internal.h"
#include "keys.h"

/* Where a handle's answer goes. */
struct handle_out {
    tc_handle *h;
    int issue; /* the answer has an id */
};

static int copy_handle(tc_conn *c, void *out)
{
    const struct handle_out *d = out;
    const tcw_resp *r = &c->resp;
    if (r->token_len == 0 || r->token_len > TC_MAX_HANDLE_TOKEN)
        return tc__fail(c, TC_EPROTO);
    memmove(d->h->token, r->token, r->token_len);
    d->h->token_len = r->token_len;
    d->h->expiry_unix_ms = r->expiry_unix_ms;
    if (d->issue)
        d->h->id = r->handle_id;
    return TC_OK;
}

int tc_handle_issue(tc_conn *c, const tc_keys *keys, uint32_t ttl_ms, tc_handle *out, const tc_call_opts *o)
{
    if (!c || !out)
        return TC_INVALID_ARGUMENT;
    tcw_req r = {.kind = TCW_HANDLE_ISSUE, .ttl_ms = ttl_ms};
    r.keys_len = tc__keys_len(keys);
    if (r.keys_len == 0)
        return TC_INVALID_ARGUMENT;
    r.keys = keys;
    struct handle_out d = {out, 1};
    return tc__call(c, &r, copy_handle, &d, o);
}

int tc_handle_renew(tc_conn *c, const void *token, size_t len, uint32_t ttl_ms, tc_handle *out,
                    const tc_call_opts *o)
{
    if (!c || !out || !token || len == 0 || len > TC_MAX_HANDLE_TOKEN)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_HANDLE_RENEW, .blob = token, .blob_len = len, .ttl_ms = ttl_ms};
    struct handle_out d = {out, 0};
    return tc__call(c, &r, copy_handle, &d, o);
}

int tc_handle_release(tc_conn *c, const void *token, size_t len, const tc_call_opts *o)
{
    if (!c || !token || len == 0 || len > TC_MAX_HANDLE_TOKEN)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_HANDLE_RELEASE, .blob = token, .blob_len = len};
    return tc__call(c, &r, NULL, NULL, o);
}

/* Where a lease's answer goes (either may be NULL). */
struct lease_out {
    uint64_t *expiry_unix_ms;
    int *joined;
};

static int copy_lease(tc_conn *c, void *out)
{
    const struct lease_out *d = out;
    if (d->expiry_unix_ms)
        *d->expiry_unix_ms = c->resp.expiry_unix_ms;
    if (d->joined)
        *d->joined = c->resp.joined != 0;
    return TC_OK;
}

int tc_lease_create(tc_conn *c, const void *op, size_t op_len, const tc_keys *keys, uint32_t ttl_ms,
                    uint64_t *expiry_unix_ms, int *joined, const tc_call_opts *o)
{
    if (!c || !op || op_len == 0 || op_len > TC_MAX_OP_ID)
        return TC_INVALID_ARGUMENT;
    tcw_req r = {.kind = TCW_LEASE_CREATE, .blob = op, .blob_len = op_len, .ttl_ms = ttl_ms};
    r.keys_len = tc__keys_len(keys);
    if (r.keys_len == 0)
        return TC_INVALID_ARGUMENT;
    r.keys = keys;
    struct lease_out d = {expiry_unix_ms, joined};
    return tc__call(c, &r, copy_lease, &d, o);
}

int tc_lease_release(tc_conn *c, const void *op, size_t op_len, const tc_call_opts *o)
{
    if (!c || !op || op_len == 0 || op_len > TC_MAX_OP_ID)
        return TC_INVALID_ARGUMENT;
    const tcw_req r = {.kind = TCW_LEASE_RELEASE, .blob = op, .blob_len = op_len};
    return tc__call(c, &r, NULL, NULL, o);
}
