/*
 * harness.h - what the C test program's files share (tc_test.c defines
 * it): the daemons it started, connections, byte patterns, requests, the
 * relay that corrupts answers, and a look at where a thread sleeps.
 */
#ifndef TC_TEST_HARNESS_H
#define TC_TEST_HARNESS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon.h"
#include "tensorcast.h"

extern const char *daemon_bin;

/* start starts a daemon (REQUIRE) and remembers it, so that a failed
 * requirement stops it; forget forgets it; stop stops one that must exit
 * cleanly (CHECK). */
void start(tcd *d, const char *const *extra);
void forget(tcd *d);
void stop(tcd *d);

int64_t now_ms(void);

/* dial connects to socket (REQUIRE). */
tc_conn *dial(const char *socket, uint32_t call_timeout_ms);

/* fill writes seed's xorshift64 pattern; matches checks it. */
void fill(void *p, size_t n, uint64_t seed);
int matches(const void *p, size_t n, uint64_t seed);

tc_request req(uint32_t op, tc_segment_id local, uint64_t loff, tc_segment_id target, uint64_t toff, uint64_t len);

/* provides says whether TENSORCAST_TEST_PROVIDES (comma-separated) names
 * feature: this machine must have it, and a test needing it fails without. */
int provides(const char *feature);

/* counter is the value of name in g, UINT64_MAX when absent. */
uint64_t counter(const tc_counters *g, const char *name);

/* blocked_in reports whether thread tid of this process sleeps in system
 * call nr (/proc/self/task/TID/syscall). */
int blocked_in(pid_t tid, long nr);

/* blocked_in_poll reports whether thread tid sleeps in poll(2) or ppoll(2):
 * the library's wait for an answer. */
int blocked_in_poll(pid_t tid);

/* A relay between one client and a daemon. It forwards frames (and the fds
 * passed with them) both ways; the answer to request number mutate_at
 * (Hello is 1) goes through mutate first, and at request number close_at it
 * closes both sides instead of forwarding. */
typedef struct relay {
    char path[100];
    const char *upstream;
    int lfd;
    int mutate_at, close_at;
    void (*mutate)(uint8_t *frame, size_t *len);
    /* Also at mutate_at, when set: the fds passed with the answer (the
     * relay closes its copies of those in fds after forwarding). */
    void (*mutate_fds)(int *fds, int nfds);
    int mutated; /* set when mutate changed the frame */
    int record;  /* keep a copy of every answer, for fuzz_answers */
    pthread_t th;
} relay;

void relay_start(relay *r, const char *dir, const char *upstream);
void relay_join(relay *r);

/* unsealed_copy is a relay's mutate_fds: it passes, in place of the first
 * fd (a memfd of the daemon's), a copy of it that is not sealed, and keeps
 * a descriptor of the copy in unsealed_fd (-1: none), for the test to
 * shrink it (and close). */
void unsealed_copy(int *fds, int nfds);
extern int unsealed_fd;

/* memfd_copy is unsealed_copy with the u32 at patch_at (unless -1) set to
 * value, and the copy then sealed with seals (F_ADD_SEALS; 0: none). */
void memfd_copy(int *fds, int nfds, long patch_at, uint32_t value, int seals);

/* A minimal flatbuffers reader for the relay's edits: field returns where
 * field slot of the table at t lies in frame f (n bytes), NULL if absent. */
uint8_t *field(uint8_t *f, size_t n, uint8_t *t, int slot);
uint32_t get32(const uint8_t *p);
void put32(uint8_t *p, uint32_t v);

/* Mutations of an answer holding five codes (OK, NOT_FOUND, OK, NOT_FOUND,
 * OK): its vector made one short, or one long. */
void short_codes(uint8_t *f, size_t *n);
void long_codes(uint8_t *f, size_t *n);

/* cluster_key makes a directory from the mkdtemp template dir and writes a
 * cluster key file in it, whose path goes to path (n bytes). */
void cluster_key(char *dir, char *path, size_t n);

/* The store's tests (store.c). */
void test_store(const tcd *d);
void test_store_cluster(void);
void test_store_answers(const tcd *d);
void test_store_daemon_killed(void);
void test_store_room_killed(void);
void test_store_kv_late(void);
void test_store_basic(tc_conn *c);

/* The queue's tests (queue.c). */
void test_queue(const tcd *d);
void test_queue_waits(void);
void test_queue_answers(const tcd *d);
void test_queue_basic(tc_conn *c);
void test_queue_notify(tc_conn *sender, tc_segment_id remote, tc_conn *receiver, const char *segment);
void test_queue_daemon_killed(void);
void test_queue_eventfd(void);

#endif
