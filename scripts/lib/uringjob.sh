# scripts/lib/uringjob.sh - what the bench scripts that count a uring job's
# I/Os at the disk share (bench-window.sh, bench-split.sh). Source it from
# the repository root with NAME (the script's name, for its messages), BIN,
# START and WINDOW set, then:
#   uring_job JOB         checks that BIN has tcbench and tensorcastd built
#                         and that JOB is a uring job naming a file and
#                         running at least START+WINDOW+1 seconds (a
#                         window inside one run); sets file and rt (its
#                         runtime in seconds), and get KEY prints JOB's KEY.
#   job_warm_up DIR TCBIN a 1 s run of JOB through TCBIN's tcbench and
#                         tensorcastd (the file is made on a first run),
#                         not counted, its output in DIR; then sets dev,
#                         the file's device as /proc/diskstats names it,
#                         and defines ios, its reads and writes so far.

uring_job() {
	job=$1
	local b
	for b in tcbench tensorcastd; do
		[ -x "$BIN/$b" ] || { echo "$NAME: $BIN/$b not built (make build)" >&2; exit 1; }
	done
	grep -q '^engine=uring' "$job" || { echo "$NAME: $job is not a uring job (its I/Os are counted at the disk)" >&2; exit 2; }
	file=$(get filename)
	[ -n "$file" ] || { echo "$NAME: $job names no filename" >&2; exit 2; }
	rt=$(get runtime | sed -n 's/^\([0-9]*\)s$/\1/p')
	if [ -z "$rt" ] || [ "$rt" -lt $((START + WINDOW + 1)) ]; then
		echo "$NAME: $job must run at least START+WINDOW+1 ($((START + WINDOW + 1))s), its runtime in seconds" >&2
		exit 2
	fi
	mkdir -p "$(dirname "$file")"
}

get() { sed -n "s/^$1=//p" "$job" | head -1; }

job_warm_up() {
	local dir=$1 tc=$2
	sed -e 's/^runtime=.*/runtime=1s/' -e 's/^ramp_time=.*/ramp_time=0s/' "$job" > "$dir/warm.fio"
	"$tc/tcbench" --spawn --pool-size="${POOL:-256m}" --daemon-bin "$tc/tensorcastd" "$dir/warm.fio" > "$dir/warm.out" 2>&1 ||
		{ echo "$NAME: the warm-up run failed: $(tail -1 "$dir/warm.out")" >&2; exit 1; }
	dev=$(basename "$(df --output=source "$file" | tail -1)")
	grep -q " $dev " /proc/diskstats || { echo "$NAME: $file is on $dev, which /proc/diskstats does not list" >&2; exit 1; }
}

ios() { awk -v d="$dev" '$3 == d { print $4 + $8 }' /proc/diskstats; }
