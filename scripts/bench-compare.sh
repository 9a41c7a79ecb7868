#!/usr/bin/env bash
# bench-compare.sh - "no regression" figures for a change that should not move
# performance (issue 14's restructuring): the same tcbench jobs through the
# daemon built at REV (before) and at the working tree (after), in one run,
# each beside its reference tool. The two builds alternate job by job, so the
# machine's drift lands on both; each figure is the median of REPEAT
# alternating tensorcast/reference runs, and the before/after comparison is
# made on the ratios to the reference, which cancel most of the noise.
#
# usage: scripts/bench-compare.sh REV [jobfile.fio...]
# env:   REPEAT (3), BIN (bin: the "after" build, made by make build)
set -euo pipefail
cd "$(dirname "$0")/.."

rev=${1:?usage: scripts/bench-compare.sh REV [jobfile.fio...]}
shift
REPEAT=${REPEAT:-3}
BIN=${BIN:-bin}
if [ $# -gt 0 ]; then jobs=("$@"); else
  jobs=(examples/jobs/local-64k.fio examples/jobs/local-4k-qd1.fio examples/jobs/tcp-1m-write.fio
        examples/jobs/tcp-4k-randread-qd1.fio examples/jobs/uring-4k-randread.fio)
fi
for b in tcbench tensorcastd; do
  [ -x "$BIN/$b" ] || { echo "bench-compare: $BIN/$b not built (make build)" >&2; exit 1; }
done

w=$(mktemp -d)
trap 'git worktree remove --force "$w/src" >/dev/null 2>&1 || true; rm -rf "$w"' EXIT
git worktree add --detach -q "$w/src" "$rev"
short=$(git rev-parse --short "$rev")
echo "bench-compare: building tcbench and tensorcastd at $short" >&2
(cd "$w/src" && go build -o "$w/before/" ./cmd/tcbench ./cmd/tensorcastd)

run() { # run DIR LABEL JOB
  local dir=$1 label=$2 job=$3 name
  name=$(basename "$job" .fio)
  "$dir/tcbench" --spawn --daemon-bin "$dir/tensorcastd" --baseline --repeat "$REPEAT" \
    --output-format=json --output "$w/$label-$name.json" "$job" 2>"$w/$label-$name.err" ||
    echo "bench-compare: $label $name failed: $(grep -m1 tcbench: "$w/$label-$name.err")" >&2
}
for job in "${jobs[@]}"; do
  echo "bench-compare: $job" >&2
  run "$w/before" before "$job"
  run "$BIN" after "$job"
done

python3 - "$w" "$short" "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +)" "${jobs[@]}" <<'EOF'
import json, os, sys
w, before, after, jobs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def load(label, name):
    try:
        with open(os.path.join(w, f"{label}-{name}.json")) as f:
            return {b["job"]: b for b in json.load(f).get("tensorcast_baselines", [])}
    except (OSError, ValueError):
        return {}
def fmt(b):
    if not b or b.get("error"):
        return "–", "–"
    v, m = b["tensorcast_median"], b["metric"]
    s = {"bw_bytes": f"{v/2**30:.2f} GiB/s", "iops": f"{v/1e3:.1f}k IOPS", "lat_p50": f"{v/1e3:.1f} µs p50"}.get(m, f"{v:g}")
    return s, f"{b['ratio']:.3f}"
print(f"| job | before ({before}) | ratio | after ({after}) | ratio | after/before (ratios) |")
print("|---|---|---|---|---|---|")
for job in jobs:
    name = os.path.basename(job)[:-4]
    b, a = load("before", name), load("after", name)
    for j in sorted(set(b) | set(a)):
        bv, br = fmt(b.get(j)); av, ar = fmt(a.get(j))
        rel = "–"
        if br != "–" and ar != "–" and float(br) > 0:
            x = float(ar) / float(br)
            if a[j]["metric"] == "lat_p50":
                x = 1 / x  # lower is better: above 1 still means after is better
            rel = f"{x:.2f}"
        print(f"| {j} | {bv} | {br} | {av} | {ar} | {rel} |")
EOF
echo
echo "Each row: median of $REPEAT alternating runs, tensorcast beside its reference tool, the before and after"
echo "builds alternating job by job; after/before above 1 means after is better."
