#!/usr/bin/env bash
# deps.sh - install the Debian packages tensorcast builds, tests and benchmarks
# with, but only those that are missing (a no-op on a prepared machine).
#
# usage: scripts/deps.sh [group...]   groups: build test bench rdma (default: all)
#   build: what `make build` and `make run` need; test, bench, rdma: the rest
#   of `make test` and `make bench`.
set -euo pipefail

declare -A groups=(
  [build]="flatbuffers-compiler libflatbuffers-dev gcc g++ make pkg-config libibverbs-dev"
  # prometheus: promtool (check metrics); systemd: systemd-analyze (verify,
  # security); tmux: tcctl top in a real terminal; python3 with numpy and
  # torch: the Python package's tests, with venv, pip, setuptools and wheel
  # for its offline `pip install ./python` test; etcd-server: the
  # directory's tests.
  [test]="iproute2 e2fsprogs util-linux prometheus systemd tmux python3 python3-numpy python3-torch python3-venv python3-pip python3-setuptools python3-wheel etcd-server"
  # perf (linux-perf): scripts/bench-split.sh's samples and counts.
  [bench]="fio iperf3 linux-perf"
  [rdma]="qemu-system-x86 busybox-static cpio kmod gzip libibverbs1 ibverbs-providers ibverbs-utils perftest rdma-core"
)
want=("$@"); [ ${#want[@]} -gt 0 ] || want=(build test bench rdma)

# Go tools of the test group, pinned, from the Go module proxy into
# bin/tools (where the tests look first): helm, for the chart's tests
# (deploy/helm). Each is installed only when missing or built from another
# version of its module (go version -m).
declare -A gotools=(
  [helm]="helm.sh/helm/v3/cmd/helm@v3.22.0"
)
if [[ " ${want[*]} " == *" test "* ]]; then
  tools="$(cd "$(dirname "$0")/.." && pwd)/bin/tools"
  for name in "${!gotools[@]}"; do
    pkg=${gotools[$name]}
    have=$(go version -m "$tools/$name" 2>/dev/null | awk '$1 == "mod" {print $3}' || true)
    [ "$have" = "${pkg##*@}" ] && continue
    echo "deps: go install $pkg into $tools" >&2
    GOBIN="$tools" go install "$pkg" >&2
  done
fi

missing=()
for g in "${want[@]}"; do
  [ -n "${groups[$g]+x}" ] || { echo "deps: unknown group '$g' (build test bench rdma)" >&2; exit 2; }
  for p in ${groups[$g]}; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
if [ "$(id -u)" != 0 ]; then
  echo "deps: not root; install these yourself: ${missing[*]}" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists; an old list may lack a package.
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
