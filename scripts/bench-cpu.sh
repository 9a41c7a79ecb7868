#!/usr/bin/env bash
# bench-cpu.sh - throughput and CPU time per I/O of uring jobs through the
# daemon, for the build at REV (before) and the working tree's (after),
# beside fio doing the same I/O, in one run. Each round runs a short
# warm-up run (not counted), then before, after and fio one after the other
# (so drift lands on all three), in an order that goes through all six
# permutations over six rounds (so no side keeps one place); each figure
# is the median of REPEAT rounds (a multiple of 6 gives every order equally).
#
# CPU is user + system time of everything a run started (/usr/bin/time over
# `tcbench --spawn`, which reaps its private daemon, so the daemon's CPU is
# counted with the client's; over fio, fio's). A run's start-up (a daemon,
# its pool, the ramp) is not work per I/O, so each round also runs every
# side for 2 s without ramp, and the CPU per I/O is the marginal one:
# (CPU of the long run - CPU of the short) / (I/Os of the long - of the
# short). The whole-run figure is printed beside it.
#
# The daemon's share is taken apart: tcbench starts its daemon through a
# wrapper (in $w) that runs the real binary as its child, forwards SIGTERM
# and, once the daemon is reaped, writes the daemon's user + system time
# (bash's `times`, its io_uring workers included: they are its threads).
# The client's CPU (tcbench alone: the library's submit and its wait,
# spin included) is the run's total less that, and gets its own columns.
#
# Both builds' daemons get the same pool (POOL, default 256m: a uring job
# keeps only its buffers there), so that neither pays for pinning a pool
# sized by an older tcbench for the job's file.
#
# usage: scripts/bench-cpu.sh REV uring-jobfile.fio...
# env:   REPEAT (3), BIN (bin: the "after" build, made by make build), POOL
set -euo pipefail
cd "$(dirname "$0")/.."

rev=${1:?usage: scripts/bench-cpu.sh REV uring-jobfile.fio...}
shift
[ $# -gt 0 ] || { echo "bench-cpu: no job files" >&2; exit 2; }
REPEAT=${REPEAT:-3}
BIN=${BIN:-bin}
for b in tcbench tensorcastd; do
  [ -x "$BIN/$b" ] || { echo "bench-cpu: $BIN/$b not built (make build)" >&2; exit 1; }
done
command -v fio >/dev/null || { echo "bench-cpu: no fio (make deps)" >&2; exit 1; }

w=$(mktemp -d)
trap 'git worktree remove --force "$w/src" >/dev/null 2>&1 || true; rm -rf "$w"' EXIT
git worktree add --detach -q "$w/src" "$rev"
short=$(git rev-parse --short "$rev")
echo "bench-cpu: building tcbench and tensorcastd at $short" >&2
(cd "$w/src" && go build -o "$w/before/" ./cmd/tcbench ./cmd/tensorcastd)

# timed REAL: a daemon binary that runs REAL and writes its CPU time to
# $BENCH_CPU_DAEMON_OUT when it exits (see the header).
timed() {
  cat > "$2" <<WRAP
#!/usr/bin/env bash
"$1" "\$@" &
pid=\$!
trap 'kill -TERM \$pid 2>/dev/null' TERM INT
wait \$pid; rc=\$?
while kill -0 \$pid 2>/dev/null; do wait \$pid; rc=\$?; done
out=\${BENCH_CPU_DAEMON_OUT:-}
if [ -n "\$out" ]; then
  # times in this shell, not a pipeline's subshell, which has no children.
  times > "\$out.times"
  tail -1 "\$out.times" | awk '{ for (i = 1; i <= 2; i++) { split(\$i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] } print t }' > "\$out"
  rm -f "\$out.times"
fi
exit \$rc
WRAP
  chmod +x "$2"
}
timed "$w/before/tensorcastd" "$w/before-daemon"
timed "$(realpath "$BIN/tensorcastd")" "$w/after-daemon"

# fio_args JOBFILE: the fio command line of a uring job file (the same
# options tcbench --baseline gives fio).
fio_args() {
  awk -F= '/^[a-z_]+=/ { o[$1] = $2 } /^[a-z_]+$/ { o[$1] = 1 }
    END {
      printf "--name=ref --ioengine=io_uring --filename=%s --rw=%s --bs=%s --size=%s --iodepth=%s", o["filename"], o["rw"], o["bs"], o["size"], o["iodepth"]
      if (o["direct"] == 1) printf " --direct=1"
      if (o["batch"] != "") printf " --iodepth_batch_submit=%s --iodepth_batch_complete_min=%s", o["batch"], o["batch"]
      if (o["numjobs"] != "") printf " --numjobs=%s --group_reporting", o["numjobs"]
      if (o["runtime"] != "") printf " --runtime=%s", o["runtime"]
      if (o["time_based"] != "") printf " --time_based"
      if (o["ramp_time"] != "") printf " --ramp_time=%s", o["ramp_time"]
    }' "$1"
}

# one NAME SIDE ROUND RUN JOBFILE: one run, its JSON and its CPU in $w.
one() {
  local name=$1 side=$2 r=$3 run=$4 jf=$5 out args
  out="$w/$name-$side-$r-$run"
  args=$(fio_args "$jf")
  echo "bench-cpu: $name round $r ($run): $side" >&2
  case $side in
    before) BENCH_CPU_DAEMON_OUT="$out.dcpu" /usr/bin/time -f "%U %S" -o "$out.cpu" "$w/before/tcbench" --spawn --pool-size="${POOL:-256m}" \
              --daemon-bin "$w/before-daemon" --output-format=json --output "$out.json" "$jf" 2>"$out.err" ;;
    after)  BENCH_CPU_DAEMON_OUT="$out.dcpu" /usr/bin/time -f "%U %S" -o "$out.cpu" "$BIN/tcbench" --spawn --pool-size="${POOL:-256m}" \
              --daemon-bin "$w/after-daemon" --output-format=json --output "$out.json" "$jf" 2>"$out.err" ;;
    warm)   "$BIN/tcbench" --spawn --pool-size="${POOL:-256m}" --daemon-bin "$BIN/tensorcastd" --output-format=json --output "$out.json" "$jf" 2>"$out.err" ;;
    fio)    # shellcheck disable=SC2086
            /usr/bin/time -f "%U %S" -o "$out.cpu" fio --output-format=json --output "$out.json" $args 2>"$out.err" ;;
  esac || echo "bench-cpu: $name $side round $r ($run) failed: $(tail -1 "$out.err")" >&2
}

orders=("before after fio" "after before fio" "fio before after" "fio after before" "before fio after" "after fio before")
for job in "$@"; do
  name=$(basename "$job" .fio)
  sed -e 's/^runtime=.*/runtime=2s/' -e 's/^ramp_time=.*/ramp_time=0s/' "$job" > "$w/$name-short.fio"
  for r in $(seq "$REPEAT"); do
    # The first tcbench run of a round measured 2-3x the CPU per I/O of
    # the second, whichever build it was (the same build on both sides:
    # 27.6 against 8.9 µs, and swapped, 21.6 against 7.6): a short run,
    # not counted, goes first, and the builds' order alternates.
    one "$name" warm "$r" short "$w/$name-short.fio"
    # The three sides' order goes through its six permutations round by
    # round, fio's place included: the disk under a uring job drifts
    # within a round (a 1 MiB read job's rounds spanned 1.8k-4.1k IOPS),
    # and with fio always last its ratio took whatever the third place
    # gets. Every sixth round the order repeats.
    sides=${orders[$(((r - 1) % 6))]}
    for side in $sides; do
      one "$name" "$side" "$r" long "$job"
      one "$name" "$side" "$r" short "$w/$name-short.fio"
    done
  done
done

python3 - "$w" "$short" "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +)" "$REPEAT" "$PWD" "$@" <<'EOF'
import json, os, statistics, sys
w, before, after, repeat, root, jobs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6:]
sys.path.insert(0, os.path.join(root, "scripts", "lib"))
from pairs import interval, interval_text, verdict
def run(path):
    with open(path + ".json") as f:
        text = f.read()
    d = json.loads(text[text.index("{"):])
    ios = sum(j[k]["total_ios"] for j in d["jobs"] for k in ("read", "write"))
    rt = max(max(j["read"]["runtime"], j["write"]["runtime"]) for j in d["jobs"])
    with open(path + ".cpu") as f:
        u, s = map(float, f.read().split()[-2:])
    try:
        with open(path + ".dcpu") as f:
            dcpu = float(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        dcpu = None  # fio, or a daemon whose wrapper wrote nothing
    return ios, rt / 1000.0, u + s, dcpu
def one(path):
    """IOPS, marginal µs CPU per I/O, whole-run µs CPU per I/O, marginal
    client and daemon µs per I/O (None for fio) of a round."""
    try:
        lios, lrt, lcpu, ld = run(path + "-long")
        sios, _, scpu, sd = run(path + "-short")
        dio = lios - sios
        cl = dm = None
        if ld is not None and sd is not None:
            dm = (ld - sd) / dio * 1e6
            cl = ((lcpu - ld) - (scpu - sd)) / dio * 1e6
        return lios / lrt, (lcpu - scpu) / dio * 1e6, lcpu / lios * 1e6, cl, dm
    except (OSError, ValueError, KeyError, ZeroDivisionError):
        return None
def median(rs, k):
    v = [x[k] for x in rs if x[k] is not None]
    return statistics.median(v) if v else None
def kiops(iops):
    """IOPS in thousands, with three significant digits: 1 MiB jobs run
    at 1-3k, where one decimal hides the rounds' differences."""
    return f"{iops/1e3:.2f}k" if iops < 1e4 else f"{iops/1e3:.1f}k"
meds = {}
paired = {}
for job in jobs:
    name = os.path.basename(job)[:-4]
    med = {}
    by = {side: [one(os.path.join(w, f"{name}-{side}-{r}")) for r in range(1, repeat + 1)]
          for side in ("before", "after", "fio")}
    # Each round's after/before (throughput, CPU per I/O) and after/fio
    # throughput: the rounds in which both sides ran.
    paired[name] = (
        [a[0] / b[0] for a, b in zip(by["after"], by["before"]) if a and b and b[0] > 0],
        [a[1] / b[1] for a, b in zip(by["after"], by["before"]) if a and b and b[1] > 0],
        [a[0] / f[0] for a, f in zip(by["after"], by["fio"]) if a and f and f[0] > 0])
    for side in ("before", "after", "fio"):
        rs = [x for x in by[side] if x]
        med[side] = tuple(median(rs, k) for k in range(5)) if rs else None
        # Every round's figures, so that a round another process disturbed
        # shows beside the medians.
        print(f"bench-cpu: {name} {side} rounds: " + ", ".join(f"{kiops(x[0])} IOPS {x[1]:.1f} µs/IO" for x in rs), file=sys.stderr)
    meds[name] = med
print(f"| job | before ({before}) IOPS | ratio to fio | µs CPU/IO | after ({after}) IOPS | ratio to fio | µs CPU/IO | fio IOPS | fio µs CPU/IO |")
print("|---|---|---|---|---|---|---|---|---|")
# µs CPU/IO cells: marginal (whole run)
for name, med in meds.items():
    f = med["fio"]
    def cell(m):
        if not m:
            return "–", "–", "–"
        return kiops(m[0]), f"{m[0]/f[0]:.2f}" if f else "–", f"{m[1]:.1f} ({m[2]:.1f})"
    b, a = cell(med["before"]), cell(med["after"])
    fc = (kiops(f[0]), f"{f[1]:.1f} ({f[2]:.1f})") if f else ("–", "–")
    print(f"| {name} | {b[0]} | {b[1]} | {b[2]} | {a[0]} | {a[1]} | {a[2]} | {fc[0]} | {fc[1]} |")
print()
print("| job | before: client µs/IO | daemon µs/IO | after: client µs/IO | daemon µs/IO | fio µs/IO |")
print("|---|---|---|---|---|---|")
def us(v):
    return "–" if v is None else f"{v:.1f}"
for name, med in meds.items():
    b, a, f = med["before"] or (None,) * 5, med["after"] or (None,) * 5, med["fio"] or (None,) * 5
    print(f"| {name} | {us(b[3])} | {us(b[4])} | {us(a[3])} | {us(a[4])} | {us(f[1])} |")
print()
print("| job | after/before IOPS | interval | verdict | after/before CPU per I/O | interval | verdict | after/fio IOPS | interval |")
print("|---|---|---|---|---|---|---|---|---|")
def med_text(xs):
    return f"{statistics.median(xs):.2f}" if xs else "–"
for name, (tput, cpu, fio) in paired.items():
    ti, ci, fi = interval(tput), interval(cpu), interval(fio)
    # CPU: less is better, so the verdict is on before/after.
    cv = verdict(None if ci is None else (1 / ci[1], 1 / ci[0], ci[2]))
    print(f"| {name} | {med_text(tput)} | {interval_text(ti)} | {verdict(ti)} | {med_text(cpu)} | {interval_text(ci)} | {cv} | {med_text(fio)} | {interval_text(fi)} |")
    print(f"bench-cpu: {name} after/before by round: IOPS {' '.join(f'{x:.3f}' for x in tput)}; CPU per I/O {' '.join(f'{x:.3f}' for x in cpu)}", file=sys.stderr)
EOF
echo
echo "Medians of $REPEAT rounds (a warm-up run, then before, after and fio, in an order that runs through the six permutations round by round). CPU: user+system per I/O, marginal over a 2 s run (whole run in brackets);"
echo "client: tcbench's process alone, daemon: tensorcastd's alone (each marginal, median of its own rounds)."
echo "Last table: each round's after/before and after/fio, their medians and the distribution-free interval of the"
echo "median (scripts/lib/pairs.py); a verdict needs 6 rounds. CPU per I/O: below 1 is after cheaper."
