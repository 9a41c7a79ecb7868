/*
 * tail.h - how a wait for several completions spends its time: when to be
 * woken before the last (and spin for the rest), and when to nap on the
 * clock instead of asking the daemon for a wake-up at all. The same rules
 * as the Go client's (queue/spin.go: tail, backoff, napBack), which say
 * why each one is there and what it was measured against; this file keeps
 * their names so that the two read side by side. All times are in
 * nanoseconds. Nothing here reads a clock or the rings: queue.c feeds it.
 */
#ifndef TC_TAIL_H
#define TC_TAIL_H

#include <stdint.h>

/* The spin ceiling of the completion side (queue/spin.go spinCeiling). */
#define TC__SPIN_CEILING_NS 50000LL
/* fastGap: the slowest completion rate an early wake-up is used for. */
#define TC__FAST_GAP_NS (TC__SPIN_CEILING_NS / 8)
/* tailSpin bounds a tail spin; maxTailSkip a back-off, in waits. */
#define TC__TAIL_SPIN_NS (4 * TC__SPIN_CEILING_NS)
#define TC__MAX_TAIL_SKIP 256
/* behindSpin bounds a spin in a wait that is not drained (a tail spin, the
 * spin after a nap): the daemon keeps working through it, and a spin saves
 * only a wake-up. */
#define TC__BEHIND_SPIN_NS TC__SPIN_CEILING_NS
/* napMin is the shortest nap worth a system call; napMax bounds what a
 * wrong gap can cost; maxLate bounds one nap's lateness as learnt. */
#define TC__NAP_MIN_NS 10000LL
#define TC__NAP_MAX_NS 1000000LL
#define TC__MAX_LATE_NS (TC__NAP_MAX_NS / 4)

/* A doubling back-off counted in waits: a miss skips the next back waits,
 * back doubling at each miss up to TC__MAX_TAIL_SKIP; a hit starts it over. */
struct tc__backoff {
    int skip; /* waits left to skip */
    int back; /* the next back-off, in waits */
};

/* The learnt state of a queue's waits (queue/spin.go tail). */
struct tc__tail {
    int64_t gap;  /* the learnt time between two completions of one wait (0: none yet) */
    struct tc__backoff off; /* of the early wake-ups */
    int lead;     /* a drained slow wait's early wake-up, in completions (0: one) */
    int64_t ngap; /* the gap naps are planned on, learnt from naps (0: gap) */
    int64_t late; /* how late a nap ends, learnt (0: none yet: the timer slack) */
};

/* Naps back off when they let the worker run dry (queue/spin.go napBack). */
struct tc__napback {
    int napped; /* the last wait napped */
    struct tc__backoff off;
};

void tc__backoff_miss(struct tc__backoff *b);
void tc__backoff_hit(struct tc__backoff *b);

/* begin starts a wait. */
void tc__tail_begin(struct tc__tail *t);
/* fast: early wake-ups are in use now. */
int tc__tail_fast(const struct tc__tail *t);
/* slow: the gap is one a drained wait's early wake-up is for. */
int tc__tail_slow(const struct tc__tail *t);
/* leads is a drained slow wait's early wake-up, in completions. */
int tc__tail_leads(const struct tc__tail *t);
/* covers: the missing completions are expected within half the wait's
 * tail spin (tail_limit). */
int tc__tail_covers(const struct tc__tail *t, int missing, int drained);
/* tail_limit bounds a tail spin: a tail spin for a drained wait, a behind
 * spin for one that is not. */
int64_t tc__tail_limit(int drained);
/* woke records where a drained slow wait's early wake-up landed. */
void tc__tail_woke(struct tc__tail *t, int missing);
/* ahead is how many completions before the last of missing the client
 * asks to be woken (0: at the last). */
int tc__tail_ahead(const struct tc__tail *t, int missing, int drained, int spinning);
/* observe learns the gap: d a wait's time per completion over n arrivals. */
void tc__tail_observe(struct tc__tail *t, int64_t d, int n);
/* spun records a tail spin: found, or it ran out. */
void tc__tail_spun(struct tc__tail *t, int found);
/* nap_gap is the gap a nap is planned on. */
int64_t tc__tail_nap_gap(const struct tc__tail *t);
/* nap is how long a wait with missing completions, not drained, sleeps
 * before it looks again (0: no nap), given the thread's timer slack. */
int64_t tc__tail_nap(struct tc__tail *t, int missing, int64_t slack);
/* napped learns from a nap asked to last asked that lasted d, over which n
 * completions came; reached: the wait's last had come; emptied: everything
 * in flight had. */
void tc__tail_napped(struct tc__tail *t, int64_t asked, int64_t d, int n, int reached, int emptied);
/* spins_after_nap: the completions left after a nap are due within half a
 * behind spin (a nap's wait is never drained), and tail spins are not
 * backed off (a spin after a nap is learnt as one: tail_spun). */
int tc__tail_spins_after_nap(const struct tc__tail *t, int missing);

/* napback_busy starts a wait: whether it may nap, given whether a submit
 * rang the doorbell since the last wait and whether the worker sleeps now. */
int tc__napback_busy(struct tc__napback *b, int rang, int asleep);

#endif
