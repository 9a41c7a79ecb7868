# scripts/lib/daemon.sh - one bin/tensorcastd for a bench script that
# drives it from another client (bench-clib.sh, bench-python.sh). Source it
# from the repository root, then:
#   bench_workdir              makes $work, a temporary directory removed on
#                              exit, with the daemon stopped first;
#   daemon_serve SOCK ARGS...  starts bin/tensorcastd on SOCK (its data in
#                              $work/data, its log in $work/daemon.log,
#                              no hugepages, no metrics) with ARGS, and
#                              returns once it answers a ping, or exits
#                              with its log.

bench_workdir() {
	work=$(mktemp -d)
	daemon_pid=""
	trap bench_cleanup EXIT
}

bench_cleanup() {
	if [ -n "$daemon_pid" ]; then
		kill "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}

daemon_serve() {
	local sock=$1
	shift
	bin/tensorcastd --socket "$sock" --data-dir "$work/data" --hugepages off --metrics-address off "$@" \
		>"$work/daemon.log" 2>&1 &
	daemon_pid=$!
	for _ in $(seq 100); do
		bin/tcctl --socket "$sock" ping -n 1 >/dev/null 2>&1 && break
		sleep 0.1
	done
	bin/tcctl --socket "$sock" ping -n 1 >/dev/null || { cat "$work/daemon.log" >&2; exit 1; }
}
