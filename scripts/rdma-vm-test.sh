#!/usr/bin/env bash
# rdma-vm-test.sh - what `make test-rdma` runs: tensorcast's real-verbs tests
# and benchmarks, with perftest beside them, in one Soft-RoCE VM run.
#
# It builds the rdma and daemon packages' test binaries, tensorcastd (cgo)
# and tcbench, boots them with scripts/rxe-vm.sh, runs perftest
# (ib_write_bw, ib_read_bw, ib_write_lat on rxe0 loopback), then tcbench's
# rdma engine (two tensorcastd with rdma = on, pool to pool) on the same
# sizes (and the 4 KiB latency job as engine=local, the control path alone),
# then the rdma tests, then the daemon's RDMA tests (two daemons
# choosing rdma over their peer channel; one of them a process killed
# mid-transfer), and prints a go-test style summary plus the figures side
# by side: the rdma transport vs perftest, then tcbench vs perftest. It
# fails when the VM fails, a test or tcbench fails, or a real-verbs test
# skipped inside the VM.
#
# Environment: RDMA_TEST_RUN (test regexp, default all), RDMA_BENCH (bench
# regexp, default 'Verbs'; '-' for none, which also skips perftest and
# tcbench), RDMA_BENCHTIME (default 1s),
# RDMA_DAEMON_RUN (daemon test regexp, default 'Verbs|RDMA'; '-' for none),
# RDMA_TCBENCH (1, or 0 for no tcbench), RDMA_TCBENCH_RUNTIME (each job's
# measured time, default 1s; 0.5 s of ramp before it), RDMA_TCBENCH_REPEAT
# (runs of each job, median reported; default 3),
# RXE_MEM (MiB, default 1536: the MR registration test takes 512 MiB),
# RXE_REG_MB (default 512), RDMA_TEST_LOG (keep the console log there),
# plus rxe-vm.sh's knobs.
set -euo pipefail
cd "$(dirname "$0")/.."

run=${RDMA_TEST_RUN:-.}
bench=${RDMA_BENCH:-Verbs}
benchtime=${RDMA_BENCHTIME:-1s}
export RXE_MEM=${RXE_MEM:-1536} RXE_TIMEOUT=${RXE_TIMEOUT:-330} RXE_QUIET=${RXE_QUIET:-1}

w=$(mktemp -d "${TMPDIR:-/tmp}/tc-rdma-test.XXXXXX")
trap 'rm -rf "$w"' EXIT
log=$w/console.log

t0=$(date +%s)
echo "test-rdma: building the rdma test binary (cgo)" >&2
CGO_ENABLED=1 go test -c -o "$w/rdma.test" ./rdma/
daemon_run=${RDMA_DAEMON_RUN:-Verbs|RDMA}
if [ "$daemon_run" != "-" ]; then
  echo "test-rdma: building the daemon test binary (cgo)" >&2
  CGO_ENABLED=1 go test -c -o "$w/daemon.test" ./daemon/
fi
tcbench=${RDMA_TCBENCH:-1}
[ "$bench" = "-" ] && tcbench=0
tcb_runtime=${RDMA_TCBENCH_RUNTIME:-1s}
tcb_repeat=${RDMA_TCBENCH_REPEAT:-3}
tcb_args=
if [ "$tcbench" = 1 ]; then
  echo "test-rdma: building tensorcastd (cgo) and tcbench" >&2
  CGO_ENABLED=1 go build -o "$w/tensorcastd" ./cmd/tensorcastd
  CGO_ENABLED=1 go build -o "$w/tcbench" ./cmd/tcbench
  # One tcbench run, one pair of daemons (64 MiB pools: both fit the VM
  # beside nothing else, as the tests run after it), every job its own
  # group (stonewall), the cases repeated in turn. The target is 8 MiB
  # of daemon A's pool; the slots are pool blocks on B.
  tcb_args="--spawn --pool-size=64m --output-format=terse --engine=rdma --size=8m"
  tcb_args="$tcb_args --runtime=$tcb_runtime --time_based --ramp_time=500ms"
  for r in $(seq 1 "$tcb_repeat"); do
    tcb_args="$tcb_args --name=write64k.$r --stonewall --rw=write --bs=64k --iodepth=16 --batch=4"
    tcb_args="$tcb_args --name=write1m.$r --stonewall --rw=write --bs=1m --iodepth=8 --batch=2"
    tcb_args="$tcb_args --name=read64k.$r --stonewall --rw=read --bs=64k --iodepth=16 --batch=4"
    tcb_args="$tcb_args --name=read1m.$r --stonewall --rw=read --bs=1m --iodepth=8 --batch=2"
    tcb_args="$tcb_args --name=lat4k.$r --stonewall --rw=write --bs=4k --iodepth=1 --batch=1"
    # The same latency job through one daemon's memcpy: the control
    # path's own share, with no network in it.
    tcb_args="$tcb_args --name=local4k.$r --stonewall --engine=local --rw=write --bs=4k --iodepth=1 --batch=1"
  done
fi

# The program the VM runs: perftest pairs (server in the background, client
# to the VM's own address: rxe0 loopback), then the Go tests.
cat > "$w/run-rdma-tests" <<EOF
#!/bin/sh
perf() {
  tool=\$1; shift
  \$tool -d \$RXE_DEV -x \$RXE_GID_INDEX -F "\$@" > /tmp/perf-server.out 2>&1 &
  srv=\$!
  sleep 1
  \$tool -d \$RXE_DEV -x \$RXE_GID_INDEX -F "\$@" \$RXE_IP > /tmp/perf-client.out 2>&1
  rc=\$?
  wait \$srv
  echo "PERFTEST-BEGIN \$tool \$* rc=\$rc"
  cat /tmp/perf-client.out
  echo "PERFTEST-END"
}
if [ "${bench}" != "-" ]; then
  perf ib_write_bw -s 65536 -n 1000 --report_gbits
  perf ib_write_bw -s 1048576 -n 100 --report_gbits
  perf ib_read_bw -s 65536 -n 1000 --report_gbits
  perf ib_read_bw -s 1048576 -n 100 --report_gbits
  perf ib_write_lat -s 4096 -n 1000
fi
if [ -x ./tcbench ]; then
  t0=\$(cut -d. -f1 /proc/uptime)
  ./tcbench --rdma-device \$RXE_DEV --rdma-gid \$RXE_GID_INDEX ${tcb_args} > /tmp/tcbench.out 2> /tmp/tcbench.err
  tcb=\$?
  echo "TCBENCH-RC=\$tcb TOOK=\$((\$(cut -d. -f1 /proc/uptime) - t0))s"
  sed 's/^/TCBENCH /' /tmp/tcbench.out
  tail -n 30 /tmp/tcbench.err | sed 's/^/TCBENCH-ERR /'
fi
export RXE_REG_MB=${RXE_REG_MB:-512}
benchflag="-test.bench=${bench} -test.benchtime=${benchtime}"
[ "${bench}" = "-" ] && benchflag=""
./rdma.test -test.v -test.count=1 -test.timeout=240s -test.run=${run} \$benchflag
rc=\$?
if [ -x ./daemon.test ]; then
  ./daemon.test -test.v -test.count=1 -test.timeout=120s -test.run='${daemon_run}' || rc=1
fi
exit \$rc
EOF
chmod 755 "$w/run-rdma-tests"

set +e
files="$w/rdma.test rdma/testdata"
[ -f "$w/daemon.test" ] && files="$files $w/daemon.test"
[ -f "$w/tcbench" ] && files="$files $w/tcbench $w/tensorcastd"
RXE_FILES="$files" RXE_LOG="$log" scripts/rxe-vm.sh "$w/run-rdma-tests"
rc=$?
set -e
took=$(( $(date +%s) - t0 ))

# The test binary's own output, as go test -v prints it.
sed -n '/^=== RUN\|^ *--- \|^    \|^PASS$\|^FAIL$\|^ok \|^Benchmark\|^REGISTER\|^panic\|^goroutine /p' "$log"

[ -n "${RDMA_TEST_LOG:-}" ] && cp "$log" "$RDMA_TEST_LOG"
# perftest's own result rows.
awk '$1 == "PERFTEST-BEGIN" { on = 1; hdr = $0; next } $1 == "PERFTEST-END" { on = 0 }
     on && $1 ~ /^[0-9]+$/ && NF >= 4 { print substr(hdr, 16) "  =>  " $0 }' "$log"

pass=$(grep -c '^ *--- PASS' "$log" || true)
fail=$(grep -c '^ *--- FAIL' "$log" || true)
skip=$(grep -c '^ *--- SKIP' "$log" || true)
verbs_skipped=$(grep -E '^ *--- SKIP: (TestVerbs|TestABI)' "$log" || true)

# Figures: perftest's and ours, side by side.
perf_bw() { # tool size -> Gbit/s (BW average column)
  awk -v t="$1" -v s="$2" '
    $1 == "PERFTEST-BEGIN" && $2 == t && $4 == s { on = 1; next }
    $1 == "PERFTEST-END" { on = 0 }
    on && $1 == s && NF >= 4 { print $4; exit }' "$log"
}
perf_lat() { # 4096-byte ib_write_lat typical latency (usec)
  awk '
    $1 == "PERFTEST-BEGIN" && $2 == "ib_write_lat" { on = 1; next }
    $1 == "PERFTEST-END" { on = 0 }
    on && $1 == "4096" && NF >= 5 { print $5; exit }' "$log"
}
ours() { # benchmark name, metric unit -> value
  awk -v b="$1" -v u="$2" '$1 ~ "^"b"(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == u) { print $i; exit } }' "$log"
}
num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]] && echo "$1"; true; }
ratio() { awk -v a="$(num "$1")" -v b="$(num "$2")" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }

if [ "$bench" != "-" ]; then
  echo
  echo "rdma vs perftest on rxe0 loopback, same VM run (Soft-RoCE under qemu TCG: compare ratios only)"
  printf '%-22s %14s %14s %8s\n' "case" "tensorcast" "perftest" "ratio"
  for c in "write 64KiB:BenchmarkVerbsWriteBW/64KiB:ib_write_bw:65536" \
           "write 1MiB:BenchmarkVerbsWriteBW/1024KiB:ib_write_bw:1048576" \
           "read 64KiB:BenchmarkVerbsReadBW/64KiB:ib_read_bw:65536" \
           "read 1MiB:BenchmarkVerbsReadBW/1024KiB:ib_read_bw:1048576"; do
    IFS=: read -r name b tool size <<<"$c"
    o=$(ours "$b" Gbit/s); p=$(perf_bw "$tool" "$size")
    printf '%-22s %9s Gb/s %9s Gb/s %8s\n' "$name" "${o:--}" "${p:--}" "$(ratio "$o" "$p")"
  done
  o=$(ours BenchmarkVerbsWriteLat/4KiB us/op); p=$(perf_lat)
  rt=$(awk -v p="$(num "$p")" 'BEGIN { if (p != "") printf "%.2f", 2 * p }')
  printf '%-22s %11s us %11s us %8s\n' "write RTT 4KiB" "${o:--}" "${rt:--}" "$(ratio "$o" "$rt")"
  echo "(tensorcast: Submit to Done of one WRITE in flight, a full round trip; perftest: 2 x ib_write_lat's"
  echo " typical latency, which it reports as half its ping-pong round trip: ${p:--} us)"
fi

# tcbench's figures: the medians of its repeated jobs, beside the same
# perftest runs.
tcb_rc=$(sed -n 's/^TCBENCH-RC=\([0-9]*\) .*/\1/p' "$log" | tail -n 1)
tcb_took=$(sed -n 's/^TCBENCH-RC=[0-9]* TOOK=\([0-9]*s\)$/\1/p' "$log" | tail -n 1)
tcb() { # job case (name before the dot), bw|lat -> one value per run
  awk -F';' -v c="$1" -v k="$2" '
    $1 == "TCBENCH tc1" {
      split($3, nm, "."); if (nm[1] != c || $5 != 0) next
      L = (NF - 5) / 2; s = (c ~ /^read/) ? 5 : 5 + L
      if (k == "bw") { printf "%.4f\n", $(s + 2) * 1024 * 8 / 1e9; next }
      for (i = s + 1; i <= s + L; i++) if ($i ~ /^50%=/) { sub(/^50%=/, "", $i); print $i }
    }' "$log"
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
if [ "$tcbench" = 1 ]; then
  echo
  echo "tcbench engine=rdma vs perftest, same VM run (two tensorcastd, pool to pool over rxe0; median of ${tcb_repeat} x ${tcb_runtime}; ${tcb_took:-?} in all)"
  printf '%-22s %14s %14s %8s\n' "case" "tcbench" "perftest" "ratio"
  for c in "write 64KiB:write64k:ib_write_bw:65536:16/4" \
           "write 1MiB:write1m:ib_write_bw:1048576:8/2" \
           "read 64KiB:read64k:ib_read_bw:65536:16/4" \
           "read 1MiB:read1m:ib_read_bw:1048576:8/2"; do
    IFS=: read -r name job tool size qd <<<"$c"
    o=$(tcb "$job" bw | median); p=$(perf_bw "$tool" "$size")
    printf '%-22s %9s Gb/s %9s Gb/s %8s\n' "$name (qd $qd)" "${o:--}" "${p:--}" "$(ratio "$o" "$p")"
  done
  o=$(tcb lat4k lat | median); p=$(perf_lat)
  rt=$(awk -v p="$(num "$p")" 'BEGIN { if (p != "") printf "%.2f", 2 * p }')
  printf '%-22s %11s us %11s us %8s\n' "write 4KiB (qd 1)" "${o:--}" "${rt:--}" "$(ratio "$o" "$rt")"
  o=$(tcb local4k lat | median)
  printf '%-22s %11s us %14s %8s\n' "  engine=local (qd 1)" "${o:--}" "-" "-"
  echo "(bandwidth: iodepth/batch, one Transfer per batch through tensorcastd's control socket; latency: tcbench's"
  echo " median completion latency of one 4 KiB WRITE, Transfer call to answer, vs 2 x ib_write_lat typical as above;"
  echo " a latency ratio above 1 is tcbench slower; engine=local is the same job as a memcpy inside one daemon:"
  echo " the control path's share, no network)"
  if [ "${tcb_rc:-x}" != 0 ]; then
    echo "test-rdma: tcbench failed in the VM (status ${tcb_rc:-none}):" >&2
    sed -n 's/^TCBENCH-ERR //p' "$log" >&2
  fi
fi

echo
status=ok
if [ "$rc" != 0 ] || [ "$fail" != 0 ]; then status=FAIL; fi
if [ "$tcbench" = 1 ] && [ "${tcb_rc:-x}" != 0 ]; then status=FAIL; fi
if [ -n "$verbs_skipped" ]; then
  echo "test-rdma: real-verbs tests skipped inside the VM:" >&2
  echo "$verbs_skipped" >&2
  status=FAIL
fi
if [ "$status" = FAIL ] && [ "$rc" -ge 124 ]; then
  echo "test-rdma: the VM run failed (status $rc); console:" >&2
  tail -n 60 "$log" >&2
fi
echo "rdma (Soft-RoCE VM): $pass passed, $fail failed, $skip skipped"
printf '%s\tgithub.com/tensorcast/tensorcast/rdma + daemon (rxe VM)\t%ss\n' "$status" "$took"
[ "$status" = ok ]
