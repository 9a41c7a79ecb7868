#!/usr/bin/env bash
# bench-compare.sh - "no regression" figures for a change that should not move
# performance: the same tcbench jobs through the daemon built at REV (before)
# and at the working tree (after), in one run, each beside its reference tool.
#
# On a small shared host one build's figure moves by 2x from one run to the
# next, and whichever build runs first after a quiet spell gains, so the runs
# are paired: ROUNDS rounds, and in each round every job runs once through
# each build (tcbench --baseline --repeat 1: tensorcast, then the reference),
# the before build first in even rounds and second in odd ones. A round's
# after/before is the ratio of the two builds' ratios to the reference; the
# table gives each build's median ratio, the median of the rounds'
# after/before, and in how many rounds after was the better one.
#
# usage: scripts/bench-compare.sh REV [jobfile.fio...]
# env:   ROUNDS (5; REPEAT is its old name), BIN (bin: the "after" build, made
#        by make build), RUNTIME and RAMP (override every job's runtime and
#        ramp_time, e.g. RUNTIME=2s RAMP=500ms for many short rounds), KEEP
#        (a directory that receives every round's tcbench JSON, to
#        recompute the table later; default: none kept)
set -euo pipefail
cd "$(dirname "$0")/.."

rev=${1:?usage: scripts/bench-compare.sh REV [jobfile.fio...]}
shift
ROUNDS=${ROUNDS:-${REPEAT:-5}}
BIN=${BIN:-bin}
if [ $# -gt 0 ]; then jobs=("$@"); else
  jobs=(examples/jobs/local-64k.fio examples/jobs/local-4k-qd1.fio examples/jobs/tcp-1m-write.fio
        examples/jobs/tcp-4k-randread-qd1.fio examples/jobs/uring-4k-randread.fio)
fi
for b in tcbench tensorcastd; do
  [ -x "$BIN/$b" ] || { echo "bench-compare: $BIN/$b not built (make build)" >&2; exit 1; }
done

w=$(mktemp -d)
keep() { [ -z "${KEEP:-}" ] || { mkdir -p "$KEEP" && cp "$w"/*.json "$KEEP"/ 2>/dev/null; } || true; }
trap 'keep; git worktree remove --force "$w/src" >/dev/null 2>&1 || true; rm -rf "$w"' EXIT
git worktree add --detach -q "$w/src" "$rev"
short=$(git rev-parse --short "$rev")
echo "bench-compare: building tcbench and tensorcastd at $short" >&2
(cd "$w/src" && go build -o "$w/before/" ./cmd/tcbench ./cmd/tensorcastd)

# The job files as run: RUNTIME and RAMP replace every runtime= and ramp_time=.
mkdir -p "$w/jobs"
for job in "${jobs[@]}"; do
  sed ${RUNTIME:+-e "s/^runtime=.*/runtime=$RUNTIME/"} ${RAMP:+-e "s/^ramp_time=.*/ramp_time=$RAMP/"} \
    "$job" >"$w/jobs/$(basename "$job")"
done

# A uring job keeps only its buffers in the pool: both builds get the same
# one (URING_POOL), whatever size their tcbench would pick.
run() { # run DIR LABEL JOB ROUND
  local dir=$1 label=$2 job=$3 r=$4 name pool=()
  name=$(basename "$job" .fio)
  grep -q '^engine=uring' "$job" && pool=(--pool-size="${URING_POOL:-256m}")
  "$dir/tcbench" --spawn "${pool[@]}" --daemon-bin "$dir/tensorcastd" --baseline --repeat 1 \
    --output-format=json --output "$w/$label-$name-$r.json" "$w/jobs/$name.fio" 2>"$w/$label-$name-$r.err" ||
    echo "bench-compare: $label $name round $r failed: $(grep -m1 tcbench: "$w/$label-$name-$r.err")" >&2
}
for ((r = 0; r < ROUNDS; r++)); do
  echo "bench-compare: round $((r + 1)) of $ROUNDS" >&2
  for job in "${jobs[@]}"; do
    if ((r % 2 == 0)); then
      run "$w/before" before "$job" "$r"; run "$BIN" after "$job" "$r"
    else
      run "$BIN" after "$job" "$r"; run "$w/before" before "$job" "$r"
    fi
  done
done

python3 - "$w" "$short" "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +)" "$ROUNDS" "$PWD" "${jobs[@]}" <<'PY'
import json, os, statistics, sys
w, before, after, rounds, root, jobs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6:]
def load(label, name, r):
    try:
        with open(os.path.join(w, f"{label}-{name}-{r}.json")) as f:
            return {b["job"]: b for b in json.load(f).get("tensorcast_baselines", []) if not b.get("error")}
    except (OSError, ValueError):
        return {}
def fmt(v, m):
    return {"bw_bytes": f"{v/2**30:.2f} GiB/s", "iops": f"{v/1e3:.1f}k IOPS", "lat_p50": f"{v/1e3:.1f} µs p50"}.get(m, f"{v:g}")
sys.path.insert(0, os.path.join(root, "scripts", "lib"))
from pairs import interval, interval_text, verdict
print(f"| job | before ({before}) | ratio | after ({after}) | ratio | after/before, median of rounds | interval | after better | verdict |")
print("|---|---|---|---|---|---|---|---|---|")
rounds_of = []
for job in jobs:
    name = os.path.basename(job)[:-4]
    per = [(load("before", name, r), load("after", name, r)) for r in range(rounds)]
    for j in sorted({j for b, a in per for j in list(b) + list(a)}):
        bs = [b[j] for b, _ in per if j in b]
        as_ = [a[j] for _, a in per if j in a]
        if not bs or not as_:
            print(f"| {j} | – | – | – | – | – | – | – | – |")
            continue
        m = bs[0]["metric"]
        rel = []
        for b, a in per:
            if j in b and j in a and b[j]["ratio"] > 0 and a[j]["ratio"] > 0:
                x = a[j]["ratio"] / b[j]["ratio"]
                rel.append(1 / x if m == "lat_p50" else x)  # above 1: after is better
        med = lambda xs, k: statistics.median(x[k] for x in xs)
        rel_s = f"{statistics.median(rel):.2f}" if rel else "–"
        iv = interval(rel)
        iv_s = interval_text(iv)
        print(f"| {j} | {fmt(med(bs, 'tensorcast_median'), m)} | {med(bs, 'ratio'):.3f} | "
              f"{fmt(med(as_, 'tensorcast_median'), m)} | {med(as_, 'ratio'):.3f} | {rel_s} | {iv_s} | "
              f"{sum(x > 1 for x in rel)} of {len(rel)} | {verdict(iv)} |")
        rounds_of.append(f"{j}: {' '.join(f'{x:.3f}' for x in rel)}")
print("\nafter/before by round:")
print("\n".join(rounds_of))
PY
echo
echo "Each row: $ROUNDS paired rounds, each build once per round beside its reference tool (the order of the"
echo "builds alternating round by round); the figures and ratios are the medians over the rounds; after/before"
echo "is the median of the rounds' ratio of ratios (above 1: after is better), and "after better" counts the"
echo "rounds in which after was better. The interval holds the true median of after/before with at least the"
echo "chance given (order statistics of the rounds: a sign test, nothing assumed of the spread); a row is"
echo "worse only when the whole interval is below 1, better when it is above, else not separated by this run."
