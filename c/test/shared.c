/*
 * shared.c - a plain C program linked against libtensorcast.so alone (no
 * -lstdc++ of its own): the shared library carries what it needs. It makes
 * the calls that need no daemon.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tensorcast.h"

int main(void)
{
    int bad = 0;
    tc_options o;
    memset(&o, 0, sizeof o);
    o.socket = "/nonexistent/tensorcast.sock";
    tc_conn *c = (tc_conn *)&o;
    errno = 0;
    int rc = tc_connect(&o, &c);
    if (rc != TC_ESYS || errno != ENOENT || c != NULL) {
        fprintf(stderr, "tc_connect to a missing socket: %d (%s), errno %d\n", rc, tc_strerror(rc), errno);
        bad = 1;
    }
    if (strcmp(tc_strerror(TC_EPROTO), "protocol violation by the daemon") != 0) {
        fprintf(stderr, "tc_strerror(TC_EPROTO) = %s\n", tc_strerror(TC_EPROTO));
        bad = 1;
    }
    tc_close(NULL);
    tc_free(NULL);
    printf("tc_shared: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
