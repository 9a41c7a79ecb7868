#!/usr/bin/env bash
# bench-split.sh - where the CPU per I/O of a uring job goes, through the
# daemon and in fio doing the same I/O, apart: the kernel's io_uring
# submission and completion (time under io_uring_enter(2), which is the
# block layer and the disk driver), the rest of each side's kernel time
# (sleeps, wake-ups, interrupts), and each process's own code; beside them
# the context switches, futex calls and io_uring enters per I/O.
#
# bench-cpu.sh says how much CPU per I/O each side spends; this one says
# which part of it differs. Every figure is the steady state's: perf
# samples every CPU (`perf record -a -g`) over a window of WINDOW seconds
# from START seconds into each run, and `perf stat --per-thread` counts the
# events over the same kind of window in a second run of the same side; the
# window's I/Os are counted from /proc/diskstats of the job file's device.
# Sides alternate, tensorcast first in odd rounds and fio first in even
# ones; each figure is the median of ROUNDS rounds.
#
# usage: scripts/bench-split.sh uring-jobfile.fio
# env:   ROUNDS (3), BIN (bin), POOL (256m), START (4), WINDOW (3)
set -euo pipefail
cd "$(dirname "$0")/.."

job=${1:?usage: scripts/bench-split.sh uring-jobfile.fio}
ROUNDS=${ROUNDS:-3}
BIN=${BIN:-bin}
START=${START:-4}
WINDOW=${WINDOW:-3}
NAME=bench-split
. scripts/lib/uringjob.sh
uring_job "$job"
command -v fio >/dev/null || { echo "bench-split: no fio (make deps)" >&2; exit 1; }
command -v perf >/dev/null || { echo "bench-split: no perf (make deps)" >&2; exit 1; }
# fio's side: the options tcbench --baseline gives it (bench/baseline.go).
fargs=(--name=ref --ioengine=io_uring "--filename=$file" "--rw=$(get rw)" "--bs=$(get bs)" "--size=$(get size)"
  "--iodepth=$(get iodepth)" "--runtime=${rt}s" --time_based)
[ "$(get direct)" = 1 ] && fargs+=(--direct=1)
b=$(get batch)
[ -n "$b" ] && fargs+=("--iodepth_batch_submit=$b" "--iodepth_batch_complete_min=$b")
[ -n "$(get numjobs)" ] && { echo "bench-split: numjobs is not split (one process per side)" >&2; exit 2; }

w=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$w"
}
trap cleanup EXIT

job_warm_up "$w" "$BIN"

# start SIDE: starts one run of SIDE; sets $run (the pid to wait for) and
# $procs (the pids to watch, comma-separated) once they are up.
start() {
  procs=""
  if [ "$1" = tc ]; then
    "$BIN/tcbench" --spawn --pool-size="${POOL:-256m}" --daemon-bin "$BIN/tensorcastd" "$job" > "$w/run.out" 2>&1 &
    run=$!
    local d=""
    for _ in $(seq 100); do
      d=$(pgrep -P "$run" -f tensorcastd | head -1 || true)
      [ -n "$d" ] && break
      sleep 0.1
    done
    [ -n "$d" ] || { echo "bench-split: no daemon started under tcbench $run" >&2; return 1; }
    procs="$d,$run"
  else
    fio "${fargs[@]}" > "$w/run.out" 2>&1 &
    run=$!
    # fio runs its job in a process of its own, a child of this one.
    local j=""
    for _ in $(seq 100); do
      j=$(pgrep -P "$run" | head -1 || true)
      [ -n "$j" ] && break
      sleep 0.1
    done
    [ -n "$j" ] || { echo "bench-split: fio $run started no job process" >&2; return 1; }
    procs="$run,$j"
  fi
  pids+=("$run")
}

# one SIDE ROUND: a sampled run and a counted run of SIDE; appends one line
# of figures per I/O to $w/lines.
one() {
  local side=$1 r=$2 i1 i2 n1 n2
  start "$side"
  sleep "$START"
  i1=$(ios)
  perf record -a -g -F 1999 -o "$w/$side.data" -- sleep "$WINDOW" > /dev/null 2>&1
  i2=$(ios)
  wait "$run" || { echo "bench-split: $side run failed: $(tail -1 "$w/run.out")" >&2; return 1; }
  start "$side"
  sleep "$START"
  n1=$(ios)
  perf stat --per-thread -x, -o "$w/$side.stat" -p "$procs" \
    -e syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_futex,context-switches,task-clock -- sleep "$WINDOW" 2> /dev/null
  n2=$(ios)
  wait "$run" || { echo "bench-split: $side run failed: $(tail -1 "$w/run.out")" >&2; return 1; }
  local comms=fio
  [ "$side" = tc ] && comms=tensorcastd,tcbench
  # Sample counts of the window (each stands for 1/1999 s of a CPU): of
  # every process (all), of this side's, of its time under io_uring_enter
  # (the syscall's children: its share of all samples), and in each
  # process's own code (its own binary and libraries; not the kernel,
  # the vDSO or eBPF programs).
  local all mine uring own
  all=$(perf report -i "$w/$side.data" --no-children -n --sort comm -g none --stdio 2> /dev/null |
    awk '!/^#/ && NF { s += $2 } END { print s + 0 }')
  mine=$(perf report -i "$w/$side.data" --no-children -n --comms "$comms" --sort comm -g none --stdio 2> /dev/null |
    awk '!/^#/ && NF { s += $2 } END { print s + 0 }')
  uring=$(perf report -i "$w/$side.data" --children --comms "$comms" --sort sym -g none --stdio 2> /dev/null |
    awk '$NF == "__do_sys_io_uring_enter" && !seen { gsub("%", "", $1); print $1; seen = 1 }')
  own=""
  local c
  for c in ${comms//,/ }; do
    own+="$c=$(perf report -i "$w/$side.data" --no-children -n --comms "$c" --sort dso -g none --stdio 2> /dev/null |
      awk '!/^#/ && NF && $3 !~ /^\[/ && $3 !~ /^bpf_prog_/ { s += $2 } END { print s + 0 }') "
  done
  awk -v side="$side" -v r="$r" -v io=$((i2 - i1)) -v cio=$((n2 - n1)) -v all="$all" -v mine="$mine" -v uring="${uring:-0}" \
    -v own="$own" -v win="$WINDOW" -v stat="$w/$side.stat" 'BEGIN {
      us = 1e6 / 1999 / io # µs per I/O of one sample
      split(own, o, " "); o1 = 0; o2 = 0
      for (k in o) { split(o[k], kv, "="); if (kv[1] == "tcbench") o2 = kv[2]; else o1 += kv[2] }
      ur = uring / 100 * all
      while ((getline line < stat) > 0) {
        if (line ~ /^#/ || line == "") continue
        split(line, f, ","); ev = f[4]; v = f[2] + 0
        if (ev ~ /context-switches/) cs += v; else if (ev ~ /futex/) fx += v; else if (ev ~ /io_uring_enter/) en += v
      }
      printf "%s %d %.2f %.2f %.2f %.2f %.2f %.4f %.4f %.4f %.1f\n", side, r, mine * us, ur * us,
        (mine - ur - o1 - o2) * us, o1 * us, o2 * us, cs / cio, fx / cio, en / cio, io / win / 1000
    }' >> "$w/lines"
}

: > "$w/lines"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then
    one tc "$r"; one fio "$r"
  else
    one fio "$r"; one tc "$r"
  fi
  echo "bench-split: round $r done" >&2
done

echo "bench-split: $job, $ROUNDS rounds, medians; µs of CPU per I/O; tensorcast = daemon + tcbench" >&2
echo
echo "| side | total | under io_uring_enter | rest of the kernel | own code | own code, client | context switches/IO | futex calls/IO | io_uring enters/IO | kIOPS (sampled run) |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for side in tc fio; do
  awk -v s="$side" '$1 == s' "$w/lines" | awk -v s="$side" '
    function med(c,   n, i, j, x, a) { n = 0; for (i = 1; i <= NR; i++) a[++n] = v[i, c]
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    { for (c = 3; c <= NF; c++) v[NR, c] = $c }
    END { name = s == "tc" ? "tensorcast" : "fio"; client = s == "tc" ? sprintf("%.2f", med(7)) : "-"
      printf "| %s | %.2f | %.2f | %.2f | %.2f | %s | %.3f | %.3f | %.3f | %.1f |\n", name, med(3), med(4), med(5), med(6), client, med(8), med(9), med(10), med(11) }'
done
echo
echo "Rounds (side round total uring rest-of-kernel own own-client cs/IO futex/IO enters/IO kIOPS):"
echo '```'
cat "$w/lines"
echo '```'
