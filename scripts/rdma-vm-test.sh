#!/usr/bin/env bash
# rdma-vm-test.sh - what `make test-rdma` runs: tensorcast's real-verbs tests
# and benchmarks, with perftest beside them, in one Soft-RoCE VM run.
#
# It builds the rdma, rdma/link and daemon packages' test binaries,
# tensorcastd (cgo) and tcbench, boots them with scripts/rxe-vm.sh, runs
# perftest (ib_write_bw, ib_read_bw, ib_write_lat on rxe0 loopback), then
# tcbench's rdma engine (two tensorcastd with rdma = on, pool to pool) on
# the same sizes (and the 4 KiB latency job as engine=local, the control
# path alone), then the rdma tests, then the RDMA links' real-verbs tests
# (rdma/link: two peer planes in one process: links, registrations and
# their revocation,
# the owner's device enforcing an export's rights), then the daemon's RDMA
# tests (two daemons choosing rdma over their peer channel; one of them a
# process killed mid-transfer), then deploy's (the dashboard's and the
# rules' RDMA series in two daemons' scrapes), and prints a go-test style summary plus the figures side
# by side: the rdma transport vs perftest, then tcbench vs perftest. It
# fails when the VM fails, a test or tcbench fails, or a real-verbs test
# skipped inside the VM.
#
# Environment: RDMA_TEST_RUN (test regexp, default all), RDMA_BENCH (bench
# regexp, default 'Verbs'; '-' for none, which also skips perftest and
# tcbench), RDMA_BENCHTIME (default 1s),
# RDMA_DAEMON_RUN (rdma/link, daemon and deploy test regexp, default 'Verbs|RDMA';
# '-' for none), RDMA_LINK_RUN (rdma/link's alone, default RDMA_DAEMON_RUN;
# '-' for none), RDMA_DAEMON_BENCH (daemon benchmark regexp, run before
# the daemon tests, default '-': none; StoreRemoteGetRDMA adds a table of
# the store's remote get beside the rdma transport alone),
# RDMA_DAEMON_BENCHTIME (default 5x), RDMA_DAEMON_BENCH_COUNT (runs, one
# process each so that a benchmark's rows alternate; default 3),
# RDMA_BASE_DAEMON_TEST (a daemon test binary, cgo, of the build to
# compare against: each run of RDMA_DAEMON_BENCH then also runs it, the
# two in alternating order, its output marked "base build"),
# RDMA_COUNT (runs of each rdma/link and daemon test, default
# 1: a leak that shows once in several CI runs shows in one VM boot),
# RDMA_TCBENCH (1, or 0 for no tcbench), RDMA_TCBENCH_RUNTIME (each job's
# measured time, default 1s; 0.5 s of ramp before it), RDMA_ROUNDS (rounds
# of perftest, the transport's benchmarks and tcbench, one after the other
# in the same VM, default 1; each figure is the median over the rounds and
# each ratio the median of the rounds' ratios: on a shared 2-core host
# under TCG single samples swing by 2x),
# RDMA_BASE_DAEMON (a tensorcastd binary, cgo, of the build to compare
# against: each round then also runs the tcbench jobs with it, the two
# builds in alternating order, and a third table puts both side by side;
# the same tcbench drives both, unless RDMA_BASE_TCBENCH names that
# build's tcbench (cgo), which then drives its daemon),
# RXE_MEM (MiB, default 1536: the MR registration test takes 512 MiB),
# RXE_REG_MB (default 512), RDMA_TEST_LOG (keep the console log there),
# plus rxe-vm.sh's knobs.
set -euo pipefail
cd "$(dirname "$0")/.."

run=${RDMA_TEST_RUN:-.}
bench=${RDMA_BENCH:-Verbs}
benchtime=${RDMA_BENCHTIME:-1s}
export RXE_MEM=${RXE_MEM:-1536} RXE_TIMEOUT=${RXE_TIMEOUT:-600} RXE_QUIET=${RXE_QUIET:-1}

w=$(mktemp -d "${TMPDIR:-/tmp}/tc-rdma-test.XXXXXX")
trap 'rm -rf "$w"' EXIT
log=$w/console.log

t0=$(date +%s)
echo "test-rdma: building the rdma test binary (cgo)" >&2
CGO_ENABLED=1 go test -c -o "$w/rdma.test" ./rdma/
daemon_run=${RDMA_DAEMON_RUN:-Verbs|RDMA}
link_run=${RDMA_LINK_RUN:-$daemon_run}
count=${RDMA_COUNT:-1}
daemon_bench=${RDMA_DAEMON_BENCH:--}
if [ "$daemon_run" != "-" ] || [ "$daemon_bench" != "-" ]; then
  echo "test-rdma: building the rdma/link and daemon test binaries (cgo)" >&2
  CGO_ENABLED=1 go test -c -o "$w/link.test" ./rdma/link/
  CGO_ENABLED=1 go test -c -o "$w/daemon.test" ./daemon/
  CGO_ENABLED=1 go test -c -o "$w/deploy.test" ./deploy/
fi
tcbench=${RDMA_TCBENCH:-1}
[ "$bench" = "-" ] && tcbench=0
tcb_runtime=${RDMA_TCBENCH_RUNTIME:-1s}
rounds=${RDMA_ROUNDS:-1}
tcb_args=
if [ "$tcbench" = 1 ]; then
  echo "test-rdma: building tensorcastd (cgo) and tcbench" >&2
  CGO_ENABLED=1 go build -o "$w/tensorcastd" ./cmd/tensorcastd
  CGO_ENABLED=1 go build -o "$w/tcbench" ./cmd/tcbench
  if [ -n "${RDMA_BASE_DAEMON:-}" ]; then
    cp "$RDMA_BASE_DAEMON" "$w/tensorcastd-base"
    if [ -n "${RDMA_BASE_TCBENCH:-}" ]; then
      cp "$RDMA_BASE_TCBENCH" "$w/tcbench-base"
    fi
  fi
  # One tcbench run a round, one pair of daemons (64 MiB pools: both fit
  # the VM beside nothing else, as the tests run after it; one queue pair
  # per link, as perftest uses), every job its own group (stonewall). The
  # target is 8 MiB of daemon A's pool; the slots are pool blocks on B.
  tcb_args="--spawn --pool-size=64m --output-format=terse --engine=rdma --size=8m"
  tcb_args="$tcb_args --runtime=$tcb_runtime --time_based --ramp_time=500ms"
  tcb_args="$tcb_args --name=write64k --stonewall --rw=write --bs=64k --iodepth=16 --batch=4"
  tcb_args="$tcb_args --name=write1m --stonewall --rw=write --bs=1m --iodepth=8 --batch=2"
  tcb_args="$tcb_args --name=read64k --stonewall --rw=read --bs=64k --iodepth=16 --batch=4"
  tcb_args="$tcb_args --name=read1m --stonewall --rw=read --bs=1m --iodepth=8 --batch=2"
  tcb_args="$tcb_args --name=lat4k --stonewall --rw=write --bs=4k --iodepth=1 --batch=1"
  # The same latency job through one daemon's memcpy: the control path's
  # own share, with no network in it.
  tcb_args="$tcb_args --name=local4k --stonewall --engine=local --rw=write --bs=4k --iodepth=1 --batch=1"
fi

# The program the VM runs: perftest pairs (server in the background, client
# to the VM's own address: rxe0 loopback), then the Go tests, told that the
# machine provides RDMA (a test that finds no device fails rather than
# skips).
cat > "$w/run-rdma-tests" <<EOF
#!/bin/sh
export TENSORCAST_TEST_PROVIDES=rdma
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
rc=0
if [ "${bench}" != "-" ]; then
  # Rounds: perftest, then the transport's benchmarks, then tcbench, so
  # that each round's figures share the VM's state of the moment.
  for round in \$(seq 1 ${rounds}); do
    echo "ROUND \$round"
    perf ib_write_bw -s 65536 -n 1000 --report_gbits
    perf ib_write_bw -s 1048576 -n 100 --report_gbits
    perf ib_read_bw -s 65536 -n 1000 --report_gbits
    perf ib_read_bw -s 1048576 -n 100 --report_gbits
    perf ib_write_lat -s 4096 -n 1000
    ./rdma.test -test.run='^\$' -test.bench='${bench}' -test.benchtime=${benchtime} || rc=1
    tcbrun() { # tag daemon-binary [tcbench-binary]
      t0=\$(cut -d. -f1 /proc/uptime)
      TENSORCAST_RDMA_QPS=1 \${3:-./tcbench} --daemon-bin \$2 --rdma-device \$RXE_DEV --rdma-gid \$RXE_GID_INDEX ${tcb_args} > /tmp/tcbench.out 2> /tmp/tcbench.err
      tcb=\$?
      echo "\$1-RC=\$tcb TOOK=\$((\$(cut -d. -f1 /proc/uptime) - t0))s"
      sed "s/^/\$1 /" /tmp/tcbench.out
      tail -n 30 /tmp/tcbench.err | sed "s/^/\$1-ERR /"
    }
    if [ -x ./tcbench ]; then
      base_tcb=./tcbench
      [ -x ./tcbench-base ] && base_tcb=./tcbench-base
      if [ -x ./tensorcastd-base ] && [ \$((round % 2)) = 1 ]; then tcbrun TCBASE ./tensorcastd-base \$base_tcb; fi
      tcbrun TCBENCH ./tensorcastd
      if [ -x ./tensorcastd-base ] && [ \$((round % 2)) = 0 ]; then tcbrun TCBASE ./tensorcastd-base \$base_tcb; fi
    fi
  done
fi
export RXE_REG_MB=${RXE_REG_MB:-512}
./rdma.test -test.v -test.count=1 -test.timeout=240s -test.run='${run}' || rc=1
if [ -x ./link.test ] && [ "${link_run}" != "-" ]; then
  ./link.test -test.v -test.count=${count} -test.timeout=300s -test.run='${link_run}' || rc=1
fi
if [ -x ./daemon.test ] && [ "${daemon_bench}" != "-" ]; then
  # One process a run, so that the rows of a benchmark alternate; with a
  # base build, the two builds' runs alternate too.
  builds=./daemon.test
  [ -x ./daemon-base.test ] && builds="./daemon.test ./daemon-base.test"
  for i in \$(seq 1 ${RDMA_DAEMON_BENCH_COUNT:-3}); do
    order=\$builds
    [ \$((i % 2)) -eq 0 ] && [ -x ./daemon-base.test ] && order="./daemon-base.test ./daemon.test"
    for t in \$order; do
      [ "\$t" = ./daemon-base.test ] && echo "=== base build, run \$i"
      [ "\$t" = ./daemon.test ] && [ -x ./daemon-base.test ] && echo "=== this build, run \$i"
      \$t -test.run='^\$' -test.bench='${daemon_bench}' -test.benchtime=${RDMA_DAEMON_BENCHTIME:-5x} \\
        -test.timeout=300s || rc=1
    done
  done
fi
if [ -x ./daemon.test ] && [ "${daemon_run}" != "-" ]; then
  ./daemon.test -test.v -test.count=${count} -test.timeout=$((300 * count))s -test.run='${daemon_run}' || rc=1
fi
if [ -x ./deploy.test ]; then # reads the dashboard and rules from deploy/
  (cd deploy && ../deploy.test -test.v -test.count=${count} -test.timeout=$((300 * count))s -test.run='${daemon_run}') || rc=1
fi
exit \$rc
EOF
chmod 755 "$w/run-rdma-tests"

set +e
files="$w/rdma.test rdma/testdata"
[ -f "$w/link.test" ] && files="$files $w/link.test"
[ -f "$w/daemon.test" ] && files="$files $w/daemon.test"
if [ -n "${RDMA_BASE_DAEMON_TEST:-}" ]; then
  cp "$RDMA_BASE_DAEMON_TEST" "$w/daemon-base.test"
  files="$files $w/daemon-base.test"
fi
[ -f "$w/deploy.test" ] && files="$files $w/deploy.test deploy"
[ -f "$w/tcbench" ] && files="$files $w/tcbench $w/tensorcastd"
[ -f "$w/tensorcastd-base" ] && files="$files $w/tensorcastd-base"
[ -f "$w/tcbench-base" ] && files="$files $w/tcbench-base"
RXE_FILES="$files" RXE_LOG="$log" scripts/rxe-vm.sh "$w/run-rdma-tests"
rc=$?
set -e
took=$(( $(date +%s) - t0 ))

# The test binary's own output, as go test -v prints it.
sed -n '/^=== RUN\|^=== this build\|^=== base build\|^ *--- \|^    \|^PASS$\|^FAIL$\|^ok \|^Benchmark\|^REGISTER\|^panic\|^goroutine \|^descriptor leak\|^  \|^testutil.Main/p' "$log"

[ -n "${RDMA_TEST_LOG:-}" ] && cp "$log" "$RDMA_TEST_LOG"
# perftest's own result rows.
awk '$1 == "PERFTEST-BEGIN" { on = 1; hdr = $0; next } $1 == "PERFTEST-END" { on = 0 }
     on && $1 ~ /^[0-9]+$/ && NF >= 4 { print substr(hdr, 16) "  =>  " $0 }' "$log"

pass=$(grep -c '^ *--- PASS' "$log" || true)
fail=$(grep -c '^ *--- FAIL' "$log" || true)
skip=$(grep -c '^ *--- SKIP' "$log" || true)
verbs_skipped=$(grep -E '^ *--- SKIP: (TestVerbs|TestABI)' "$log" || true)

# Figures: perftest's and ours, side by side. Every extractor prints
# "round value" lines; a figure is the median over the rounds and a ratio
# the median of the rounds' own ratios.
rounds_of() { # awk program body run on lines of the log -> "round value"
  awk "\$1 == \"ROUND\" { r = \$2; next } $1" "$log"
}
perf_bw() { # tool size -> Gbit/s (BW average column)
  rounds_of '$1 == "PERFTEST-BEGIN" { on = ($2 == "'"$1"'" && $4 == "'"$2"'"); next }
    $1 == "PERFTEST-END" { on = 0 }
    on && $1 == "'"$2"'" && NF >= 4 { print r, $4; on = 0 }'
}
perf_rtt() { # 2 x ib_write_lat typical latency of 4096 bytes (usec): a round trip
  rounds_of '$1 == "PERFTEST-BEGIN" { on = ($2 == "ib_write_lat"); next }
    $1 == "PERFTEST-END" { on = 0 }
    on && $1 == "4096" && NF >= 5 { print r, 2 * $5; on = 0 }'
}
ours() { # benchmark name, metric unit -> value
  rounds_of '$1 ~ "^'"$1"'(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == "'"$2"'") { print r, $i; break } }'
}
tcb() { # tcbench job, bw|lat [, tag] -> Gbit/s or median completion latency (usec)
  rounds_of '/^'"${3:-TCBENCH}"' tc1;/ {
      n = split($0, f, ";"); if (f[3] != "'"$1"'" || f[5] != 0) next
      L = (n - 5) / 2; s = ("'"$1"'" ~ /^read/) ? 5 : 5 + L
      if ("'"$2"'" == "bw") { printf "%d %.4f\n", r, f[s + 2] * 1024 * 8 / 1e9; next }
      for (i = s + 1; i <= s + L; i++) if (f[i] ~ /^50%=/) { sub(/^50%=/, "", f[i]); print r, f[i] }
    }'
}
median() { awk '{ print $NF }' | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratios() { # two "round value" files -> per-round ratio lines
  awk 'NR == FNR { a[$1] = $2; next } ($1 in a) && $2 + 0 > 0 { printf "%s %.4f\n", $1, a[$1] / $2 }' "$1" "$2"
}
row() { # label, ours file, perftest file, unit
  local o p q
  o=$(median < "$2"); p=$(median < "$3"); q=$(ratios "$2" "$3" | median)
  [ -n "$q" ] && q=$(printf '%.2f' "$q")
  printf '%-24s %10s %-5s %10s %-5s %7s  (%s rounds)\n' "$1" "${o:--}" "$4" "${p:--}" "$4" "${q:--}" "$(ratios "$2" "$3" | wc -l)"
}
fig=$w/fig; mkdir -p "$fig"

if [ "$bench" != "-" ]; then
  echo
  echo "rdma vs perftest on rxe0 loopback, same VM run, ${rounds} round(s) alternating (Soft-RoCE under qemu TCG: compare ratios only)"
  printf '%-24s %16s %16s %7s\n' "case" "tensorcast" "perftest" "ratio"
  for c in "write 64KiB:BenchmarkVerbsWriteBW/64KiB:ib_write_bw:65536" \
           "write 1MiB:BenchmarkVerbsWriteBW/1024KiB:ib_write_bw:1048576" \
           "read 64KiB:BenchmarkVerbsReadBW/64KiB:ib_read_bw:65536" \
           "read 1MiB:BenchmarkVerbsReadBW/1024KiB:ib_read_bw:1048576"; do
    IFS=: read -r name b tool size <<<"$c"
    ours "$b" Gbit/s > "$fig/o"; perf_bw "$tool" "$size" > "$fig/p"
    row "$name" "$fig/o" "$fig/p" Gb/s
  done
  ours BenchmarkVerbsWriteLat/4KiB us/op > "$fig/o"; perf_rtt > "$fig/rtt"
  row "write RTT 4KiB" "$fig/o" "$fig/rtt" us
  echo "(tensorcast: Submit to Done of one WRITE in flight, a full round trip; perftest: 2 x ib_write_lat's"
  echo " typical latency, which it reports as half its ping-pong round trip)"
fi

# The store's remote get over rdma beside the rdma transport alone: the
# k-th run of each side paired.
if grep -q '^BenchmarkStoreRemoteGetRDMA/' "$log"; then
  dbench() { # sub-benchmark, unit -> "run value"
    awk '$1 ~ "^BenchmarkStoreRemoteGetRDMA/'"$1"'(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == "'"$2"'") { print ++k, $i; break } }' "$log"
  }
  for alone in rdma-alone rdma-alone-x4; do
    echo
    echo "store remote get of 128 x 256 KiB, d2 <- d1 over rdma, beside $alone (pool to pool), same VM run"
    printf '%-24s %16s %16s %7s\n' "figure" "remote get" "$alone" "ratio"
    for c in "MB/s:MB/s" "cpu-s/GB:cpu-s/GB" "machine-cpu-s/GB:machine" "untimed-cpu-s/GB:cpu-s" "crc-cpu-s/GB:cpu-s" "tcp-B/op:tcp-B/op"; do
      IFS=: read -r unit short <<<"$c"
      dbench cluster "$unit" > "$fig/o"; dbench "$alone" "$unit" > "$fig/p"
      row "$unit" "$fig/o" "$fig/p" "$short"
    done
  done
  echo "(ratio: remote get / transport alone, per run; above 1 is faster for MB/s, costlier for CPU per GB;"
  echo " machine-cpu-s/GB is the VM's busy CPU time per GB, the Soft-RoCE driver's kernel work included;"
  echo " untimed-cpu-s/GB, the unpins and removals between rounds, and crc-cpu-s/GB, a crc32c pass over the bytes"
  echo " on its own, are parts of the remote get's cpu-s/GB)"
fi

# tcbench's figures beside the same rounds' perftest runs.
tcb_rc=0
for x in $(sed -n 's/^TCBENCH-RC=\([0-9]*\) .*/\1/p' "$log"); do [ "$x" = 0 ] || tcb_rc=$x; done
grep -q '^TCBENCH-RC=' "$log" || tcb_rc=none
tcb_took=$(sed -n 's/^TCBENCH-RC=[0-9]* TOOK=\([0-9]*\)s$/\1/p' "$log" | awk '{ t += $1 } END { print t "s" }')
if [ "$tcbench" = 1 ]; then
  echo
  echo "tcbench engine=rdma vs perftest, same VM run (two tensorcastd, pool to pool over rxe0, rdma_qps = 1 like perftest's one queue pair;"
  echo " ${rounds} round(s) of ${tcb_runtime} a job; ${tcb_took:-?} in all)"
  printf '%-24s %16s %16s %7s\n' "case" "tcbench" "perftest" "ratio"
  for c in "write 64KiB:write64k:ib_write_bw:65536:16/4" \
           "write 1MiB:write1m:ib_write_bw:1048576:8/2" \
           "read 64KiB:read64k:ib_read_bw:65536:16/4" \
           "read 1MiB:read1m:ib_read_bw:1048576:8/2"; do
    IFS=: read -r name job tool size qd <<<"$c"
    tcb "$job" bw > "$fig/o"; perf_bw "$tool" "$size" > "$fig/p"
    row "$name (qd $qd)" "$fig/o" "$fig/p" Gb/s
  done
  tcb lat4k lat > "$fig/o"
  row "write 4KiB (qd 1)" "$fig/o" "$fig/rtt" us
  tcb local4k lat > "$fig/l"
  row "  engine=local (qd 1)" "$fig/l" "$fig/rtt" us
  echo "(bandwidth: iodepth/batch, one client connection and its shared-memory queue per job; latency: tcbench's"
  echo " median completion latency of one 4 KiB WRITE, submit to completion, vs 2 x ib_write_lat typical as above;"
  echo " a latency ratio above 1 is tcbench slower; engine=local is the same job as a memcpy inside one daemon:"
  echo " the control path's share, no network)"
  if grep -q '^TCBASE-RC=' "$log"; then
    for x in $(sed -n 's/^TCBASE-RC=\([0-9]*\) .*/\1/p' "$log"); do [ "$x" = 0 ] || tcb_rc=$x; done
    echo
    echo "the same tcbench jobs, this build vs RDMA_BASE_DAEMON ($(basename "$RDMA_BASE_DAEMON")), same VM run, alternating"
    printf '%-24s %16s %16s %7s\n' "case" "this build" "base build" "ratio"
    for c in "write 64KiB:write64k:16/4" "write 1MiB:write1m:8/2" "read 64KiB:read64k:16/4" "read 1MiB:read1m:8/2"; do
      IFS=: read -r name job qd <<<"$c"
      tcb "$job" bw > "$fig/o"; tcb "$job" bw TCBASE > "$fig/b"
      row "$name (qd $qd)" "$fig/o" "$fig/b" Gb/s
    done
    tcb lat4k lat > "$fig/o"; tcb lat4k lat TCBASE > "$fig/b"
    row "write 4KiB (qd 1)" "$fig/o" "$fig/b" us
    echo "(ratio: this build / base build, per round; above 1 is better for bandwidth, worse for latency)"
    echo
    echo "base build vs perftest, same rounds"
    printf '%-24s %16s %16s %7s\n' "case" "base build" "perftest" "ratio"
    for c in "write 64KiB:write64k:ib_write_bw:65536:16/4" \
             "write 1MiB:write1m:ib_write_bw:1048576:8/2" \
             "read 64KiB:read64k:ib_read_bw:65536:16/4" \
             "read 1MiB:read1m:ib_read_bw:1048576:8/2"; do
      IFS=: read -r name job tool size qd <<<"$c"
      tcb "$job" bw TCBASE > "$fig/o"; perf_bw "$tool" "$size" > "$fig/p"
      row "$name (qd $qd)" "$fig/o" "$fig/p" Gb/s
    done
    tcb lat4k lat TCBASE > "$fig/o"
    row "write 4KiB (qd 1)" "$fig/o" "$fig/rtt" us
  fi
  if [ "$tcb_rc" != 0 ]; then
    echo "test-rdma: tcbench failed in the VM (status $tcb_rc):" >&2
    sed -n 's/^TCBENCH-ERR //p' "$log" >&2
  fi
fi

echo
status=ok
if [ "$rc" != 0 ] || [ "$fail" != 0 ]; then status=FAIL; fi
if [ "$tcbench" = 1 ] && [ "$tcb_rc" != 0 ]; then status=FAIL; fi
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
printf '%s\tgithub.com/tensorcast/tensorcast/rdma + rdma/link + daemon (rxe VM)\t%ss\n' "$status" "$took"
[ "$status" = ok ]
