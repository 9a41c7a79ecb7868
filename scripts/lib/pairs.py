"""The paired A/B verdict of the benchmark scripts (bench-compare.sh,
bench-cpu.sh): each round measures both builds, and a round's ratio
after/before is one sample; the verdict is on the median of those ratios."""

from math import comb


def interval(xs):
    """The median's distribution-free interval: order statistics k and
    n-k+1 of the sorted values, with k the largest for which the chance
    that the true median lies outside is at most 5 % (a sign test's
    binomial tail, nothing assumed of the spread). None below 6 values."""
    n = len(xs)
    outside = lambda k: 2 * sum(comb(n, j) for j in range(k)) / 2**n
    k = max((i for i in range(1, n // 2 + 1) if outside(i) <= 0.05), default=0)
    if k == 0:
        return None
    xs = sorted(xs)
    return xs[k - 1], xs[n - k], 1 - outside(k)


def verdict(iv):
    """worse when the whole interval is below 1, better when above."""
    if iv is None:
        return "too few rounds"
    lo, hi, _ = iv
    return "**worse**" if hi < 1 else "better" if lo > 1 else "not separated"


def interval_text(iv):
    return f"{iv[0]:.2f}-{iv[1]:.2f} ({iv[2]:.0%})" if iv else "–"
