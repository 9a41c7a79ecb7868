/*
 * daemon.h - start a real tensorcastd for the C tests: a private socket and
 * data directory under a new temporary directory, readiness taken from its
 * sd_notify READY=1 (no polling of the socket).
 */
#ifndef TC_TEST_DAEMON_H
#define TC_TEST_DAEMON_H

#include <limits.h>
#include <sys/types.h>

typedef struct tcd {
    pid_t pid; /* 0 once it has been reaped */
    char dir[64];
    char socket[80];
    char data[80];
    char log[80];
} tcd;

/* tcd_start runs bin with the test defaults (a 32 MiB pool, no hugepages, no
 * metrics endpoint)
 * and extra (NULL-terminated, may be NULL) and waits up to 20 s for it to
 * be ready. On failure it prints why (with the daemon's log) and returns -1. */
int tcd_start(tcd *d, const char *bin, const char *const *extra);

/* tcd_freeze stops the daemon (SIGSTOP) and returns once it has stopped;
 * tcd_thaw continues it. */
void tcd_freeze(tcd *d);
void tcd_thaw(tcd *d);

/* tcd_kill SIGKILLs the daemon and reaps it. */
void tcd_kill(tcd *d);

/* tcd_stop SIGTERMs the daemon (SIGKILL after 20 s), reaps it and removes
 * its directory. Returns its exit status (0 for a clean exit). */
int tcd_stop(tcd *d);

/* tcd_print_log copies the daemon's log to stderr. */
void tcd_print_log(const tcd *d);

#endif
