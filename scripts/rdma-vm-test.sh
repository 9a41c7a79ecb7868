#!/usr/bin/env bash
# rdma-vm-test.sh - what `make test-rdma` runs: tensorcast's real-verbs tests
# and benchmarks, with perftest beside them, in one Soft-RoCE VM run.
#
# It builds the rdma and daemon packages' test binaries (cgo), boots them
# with scripts/rxe-vm.sh, runs perftest (ib_write_bw, ib_read_bw,
# ib_write_lat on rxe0 loopback), then the rdma tests, then the daemon's
# RDMA tests (two daemons choosing rdma over their peer channel), and
# prints a go-test style summary
# plus both sets of figures side by side. It fails when the VM fails, a
# test fails, or a real-verbs test skipped inside the VM.
#
# Environment: RDMA_TEST_RUN (test regexp, default all), RDMA_BENCH (bench
# regexp, default 'Verbs'; '-' for none), RDMA_BENCHTIME (default 1s),
# RDMA_DAEMON_RUN (daemon test regexp, default 'Verbs|RDMA'; '-' for none),
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

echo
status=ok
if [ "$rc" != 0 ] || [ "$fail" != 0 ]; then status=FAIL; fi
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
