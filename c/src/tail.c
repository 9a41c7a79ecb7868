/*
 * tail.c - the learnt rules of a wait for several completions (tail.h);
 * queue/spin.go gives each rule's reason and measurements.
 */
#include "tail.h"

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int mini(int a, int b) { return a < b ? a : b; }
static int maxi(int a, int b) { return a > b ? a : b; }

void tc__backoff_miss(struct tc__backoff *b)
{
    b->back = mini(maxi(1, 2 * b->back), TC__MAX_TAIL_SKIP);
    b->skip = b->back;
}

void tc__backoff_hit(struct tc__backoff *b) { b->back = 0; }

static void backoff_tick(struct tc__backoff *b)
{
    if (b->skip > 0)
        b->skip--;
}

void tc__tail_begin(struct tc__tail *t) { backoff_tick(&t->off); }

int tc__tail_fast(const struct tc__tail *t) { return t->gap > 0 && t->gap <= TC__FAST_GAP_NS && t->off.skip == 0; }

int tc__tail_slow(const struct tc__tail *t) { return t->gap > TC__FAST_GAP_NS && t->gap <= TC__TAIL_SPIN_NS / 2; }

int tc__tail_leads(const struct tc__tail *t) { return maxi(1, t->lead); }

/* max_lead bounds lead: as many completions as come in half a tail spin. */
static int max_lead(const struct tc__tail *t) { return (int)max64(1, TC__TAIL_SPIN_NS / 2 / t->gap); }

int64_t tc__tail_limit(int drained) { return drained ? TC__TAIL_SPIN_NS : TC__BEHIND_SPIN_NS; }

int tc__tail_covers(const struct tc__tail *t, int missing, int drained)
{
    if (tc__tail_fast(t))
        return (int64_t)missing * t->gap <= tc__tail_limit(drained) / 2;
    if (drained && tc__tail_slow(t) && t->off.skip == 0)
        return missing <= tc__tail_leads(t);
    return 0;
}

void tc__tail_woke(struct tc__tail *t, int missing)
{
    int l = tc__tail_leads(t);
    if (missing <= 0)
        t->lead = mini(l + 1, max_lead(t));
    else if (missing >= l && l > 1)
        t->lead = l - 1;
}

int tc__tail_ahead(const struct tc__tail *t, int missing, int drained, int spinning)
{
    if (t->gap <= 0 || t->off.skip > 0)
        return 0;
    if (t->gap <= TC__FAST_GAP_NS)
        return maxi(0, (int)min64(tc__tail_limit(drained) / 2 / t->gap, missing - 1));
    if (tc__tail_slow(t) && drained && spinning && missing > 1)
        return mini(tc__tail_leads(t), missing - 1);
    return 0;
}

void tc__tail_observe(struct tc__tail *t, int64_t d, int n)
{
    if (n < 4 && t->gap != 0)
        return; /* a sleep over few arrivals is mostly the wake-up */
    if (t->gap == 0)
        t->gap = d;
    else
        t->gap += (d - t->gap) / 4;
}

void tc__tail_spun(struct tc__tail *t, int found)
{
    if (found) {
        tc__backoff_hit(&t->off);
        return;
    }
    t->lead = 0;
    tc__backoff_miss(&t->off);
}

int64_t tc__tail_nap_gap(const struct tc__tail *t) { return t->ngap > 0 ? t->ngap : t->gap; }

int64_t tc__tail_nap(struct tc__tail *t, int missing, int64_t slack)
{
    int64_t g = tc__tail_nap_gap(t);
    if (g <= 0 || missing < 2)
        return 0;
    int64_t late = t->late > 0 ? t->late : slack;
    int64_t d = (int64_t)missing * g - late;
    if (d < TC__NAP_MIN_NS) {
        /* No nap: a nap gap below the learnt one and a lateness above
         * the slack creep back, so one outlier does not end naps. */
        if (t->ngap > 0 && t->ngap < t->gap)
            t->ngap += max64(1, (t->gap - t->ngap) / 8);
        if (t->late > slack)
            t->late -= max64(1, (t->late - slack) / 8);
        return 0;
    }
    return min64(d, TC__NAP_MAX_NS);
}

void tc__tail_napped(struct tc__tail *t, int64_t asked, int64_t d, int n, int reached, int emptied)
{
    int64_t late = min64(max64(0, d - asked), TC__MAX_LATE_NS);
    if (t->late <= 0)
        t->late = max64(1, late); /* learnt from now on, even if on time */
    else
        t->late += (late - t->late) / 4;
    if (n <= 0)
        return; /* nothing came: a stall, which the sleep after the nap measures */
    int64_t g = d / n, cur = tc__tail_nap_gap(t);
    if (emptied)
        t->ngap = min64(cur, g) * 3 / 4; /* overslept: the daemon idled */
    else if (reached)
        t->ngap = min64(cur, g); /* g is only a bound */
    else
        t->ngap = cur + (g - cur) / 2;
}

int tc__tail_spins_after_nap(const struct tc__tail *t, int missing)
{
    return t->off.skip == 0 && (int64_t)missing * tc__tail_nap_gap(t) <= TC__BEHIND_SPIN_NS / 2;
}

int tc__napback_busy(struct tc__napback *b, int rang, int asleep)
{
    if (b->napped) {
        if (rang)
            tc__backoff_miss(&b->off);
        else
            tc__backoff_hit(&b->off);
    }
    b->napped = 0;
    if (b->off.skip > 0) {
        backoff_tick(&b->off);
        return 0;
    }
    return !rang && !asleep;
}
