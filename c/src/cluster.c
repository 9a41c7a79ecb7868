/*
 * cluster.c - the store across hosts on the control socket: where a key
 * lives (its shard, the shard's home and generation, the holders the home
 * names).
 *
 * The answer is copied out of the frame into one allocation the caller
 * frees with tc_free: the tc_key_location, its holders, then every string.
 * A daemon id longer than TC_MAX_DAEMON_ID or more than
 * TC_MAX_LOCATE_HOLDERS holders is a protocol violation (TC_EPROTO, and
 * the connection breaks).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int copy_location(tc_conn *c, void *out)
{
    tc_key_location **dst = out;
    const tcw_resp *r = &c->resp;
    size_t n = r->n_holders;
    if (n > TC_MAX_LOCATE_HOLDERS)
        return tc__fail(c, TC_EPROTO);
    size_t home_len = strlen(r->home);
    if (home_len > TC_MAX_DAEMON_ID)
        return tc__fail(c, TC_EPROTO);
    size_t bytes = sizeof(tc_key_location) + n * sizeof(tc_holder) + home_len + 1;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(r->holders[i].id);
        if (l == 0 || l > TC_MAX_DAEMON_ID)
            return tc__fail(c, TC_EPROTO);
        bytes += l + 1;
    }
    tc_key_location *loc = malloc(bytes);
    if (!loc)
        return TC_ENOMEM;
    tc_holder *hs = (tc_holder *)(loc + 1);
    char *p = (char *)(hs + n);
    memcpy(p, r->home, home_len + 1);
    loc->shard = r->shard;
    loc->home = p;
    loc->generation = r->generation;
    loc->n_holders = n;
    loc->holders = n ? hs : NULL;
    p += home_len + 1;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(r->holders[i].id);
        hs[i] = r->holders[i];
        memcpy(p, r->holders[i].id, l + 1);
        hs[i].id = p;
        p += l + 1;
    }
    *dst = loc;
    return TC_OK;
}

int tc_cluster_locate(tc_conn *c, const void *key, size_t len, tc_key_location **out, const tc_call_opts *o)
{
    if (!c || !out || !key || len == 0 || len > TC_MAX_KEY)
        return TC_INVALID_ARGUMENT;
    *out = NULL;
    const tcw_req r = {.kind = TCW_CLUSTER_LOCATE, .blob = key, .blob_len = len};
    return tc__call(c, &r, copy_location, out, o);
}
