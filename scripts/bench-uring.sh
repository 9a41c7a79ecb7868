#!/usr/bin/env bash
# bench-uring.sh — tensorcast's io_uring transport side by side with fio
# (ioengine=io_uring, direct=1) on the same file, same bs/iodepth/runtime.
#
# Usage: scripts/bench-uring.sh [DIR] [REPEATS] [RUNTIME_SECONDS]
#   DIR      where the 4 GiB test file is laid out (default /var/tmp/tcbench)
#   REPEATS  A/B rounds per workload, at least 3 (default 3)
#   RUNTIME  seconds per run (default 10)
#   ONLY     (environment) a grep -E pattern: run only the workloads whose
#            name matches, e.g. ONLY=seq
#
# Runs alternate fio (A) and tensorcast (B) so drift on a shared disk hits
# both. Prints per-run figures, then medians, the ratio tensorcast/fio
# (goal >= 0.95) and CPU seconds per GB moved for both (fio: usr_cpu+sys_cpu
# over its job runtime; tensorcast: getrusage user+sys of the driver).
set -euo pipefail

DIR=${1:-/var/tmp/tcbench}
REPEATS=${2:-3}
RUNTIME=${3:-10}
SIZE=4g
FILE=$DIR/tcbench-4g.dat
ROOT=$(cd "$(dirname "$0")/.." && pwd)

command -v fio >/dev/null || { echo "bench-uring: fio not installed (apt-get install fio)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench-uring: python3 needed to read fio's JSON" >&2; exit 1; }
[ "$REPEATS" -ge 3 ] || { echo "bench-uring: REPEATS must be >= 3" >&2; exit 1; }

mkdir -p "$DIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
DRV=$WORK/benchdrv
(cd "$ROOT" && go build -o "$DRV" ./uring/internal/benchdrv)

# Lay the file out with real data: reads of never-written extents would
# not touch the device.
if [ "$(stat -c %s "$FILE" 2>/dev/null || echo 0)" != "4294967296" ]; then
	echo "laying out $FILE ($SIZE)..."
	fio --name=layout --filename="$FILE" --size=$SIZE --rw=write --bs=1m --iodepth=8 \
		--ioengine=io_uring --direct=1 --output-format=terse >/dev/null
fi

RESULTS=$WORK/results.tsv
: >"$RESULTS"

# run_fio NAME RW BS DEPTH [extra fio args...] -> appends "NAME fio rep ops_per_s MBps cpu_s bytes"
run_fio() {
	local name=$1 rw=$2 bs=$3 depth=$4 rep=$5
	shift 5
	fio --name=tc --filename="$FILE" --size=$SIZE --rw="$rw" --bs="$bs" --iodepth="$depth" \
		--ioengine=io_uring --direct=1 --runtime="$RUNTIME" --time_based --group_reporting \
		--output-format=json "$@" >"$WORK/fio.json"
	python3 - "$WORK/fio.json" "$name" "$rep" >>"$RESULTS" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
io = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
secs = j["job_runtime"] / 1000.0
cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * secs
print(f'{sys.argv[2]}\tfio\t{sys.argv[3]}\t{io["iops"]:.0f}\t{io["bw_bytes"]/1e6:.1f}\t{cpu:.3f}\t{io["io_bytes"]}')
EOF
}

run_tc() {
	local name=$1 rw=$2 bs=$3 depth=$4 rep=$5
	shift 5
	local out
	out=$("$DRV" -file "$FILE" -rw "$rw" -bs "$bs" -iodepth "$depth" -runtime "${RUNTIME}s" "$@")
	python3 - "$name" "$rep" "$out" >>"$RESULTS" <<'EOF'
import sys
kv = dict(p.split("=", 1) for p in sys.argv[3].split())
cpu = float(kv["cpu_user"]) + float(kv["cpu_sys"])
print(f'{sys.argv[1]}\ttensorcast\t{sys.argv[2]}\t{float(kv["iops"]):.0f}\t{float(kv["mbps"]):.1f}\t{cpu:.3f}\t{kv["bytes"]}')
EOF
}

# name rw bs depth fio-extra | driver-extra
WORKLOADS=(
	"randread-4k-qd32|randread|4096|32||"
	"randwrite-4k-qd32|randwrite|4096|32||"
	"seqread-1m-qd8|read|1048576|8||"
	"seqwrite-1m-qd8|write|1048576|8||"
	"randread-4k-qd32-fixed|randread|4096|32|--fixedbufs --registerfiles|-fixed"
)

for w in "${WORKLOADS[@]}"; do
	IFS='|' read -r name rw bs depth fio_extra drv_extra <<<"$w"
	if [ -n "${ONLY:-}" ] && ! grep -qE "$ONLY" <<<"$name"; then
		continue
	fi
	for rep in $(seq 1 "$REPEATS"); do
		# shellcheck disable=SC2086
		run_fio "$name" "$rw" "$bs" "$depth" "$rep" $fio_extra
		# shellcheck disable=SC2086
		run_tc "$name" "$rw" "$bs" "$depth" "$rep" $drv_extra
		tail -n 2 "$RESULTS" | awk -F'\t' '{printf "  %-24s %-10s rep %s: %9s IOPS %9s MB/s  cpu %6ss\n", $1, $2, $3, $4, $5, $6}'
	done
done

echo
python3 - "$RESULTS" "$RUNTIME" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
order = []
data = {}
for name, tool, rep, iops, mbps, cpu, nbytes in rows:
    if name not in order:
        order.append(name)
    d = data.setdefault((name, tool), {"iops": [], "mbps": [], "cpu_per_gb": []})
    d["iops"].append(float(iops))
    d["mbps"].append(float(mbps))
    gb = int(nbytes) / 1e9
    d["cpu_per_gb"].append(float(cpu) / gb if gb > 0 else float("nan"))
print(f"medians of {len(rows)//(2*len(order))} A/B runs, {sys.argv[2]} s each")
print(f'{"workload":26} {"fio IOPS":>10} {"tc IOPS":>10} {"fio MB/s":>9} {"tc MB/s":>9} {"ratio":>6} {"fio cpu s/GB":>13} {"tc cpu s/GB":>12}')
for name in order:
    f, t = data[(name, "fio")], data[(name, "tensorcast")]
    fi, ti = statistics.median(f["iops"]), statistics.median(t["iops"])
    fm, tm = statistics.median(f["mbps"]), statistics.median(t["mbps"])
    ratio = ti / fi if fi else float("nan")
    print(f'{name:26} {fi:10.0f} {ti:10.0f} {fm:9.1f} {tm:9.1f} {ratio:6.2f} '
          f'{statistics.median(f["cpu_per_gb"]):13.3f} {statistics.median(t["cpu_per_gb"]):12.3f}')
EOF
