#!/usr/bin/env bash
# rxe-vm.sh - run one program inside a disposable qemu VM whose kernel has
# Soft-RoCE (rdma_rxe) with the device rxe0 up, and exit with its exit code.
#
# usage: scripts/rxe-vm.sh PROGRAM [args...]
#
# The build machines have no RDMA in their kernel, so tensorcast's real-verbs
# tests run here: a stock Debian kernel (downloaded as a .deb, never
# installed), a small busybox initramfs with libibverbs, the rxe provider and
# perftest, booted under qemu TCG. PROGRAM (an ELF, or a #!/bin/sh script)
# and its shared libraries are copied to /work in the VM and run as root with
# cwd /work. Its environment there:
#   RXE_DEV=rxe0  RXE_PORT=1  RXE_GID_INDEX=<index of the IPv4-mapped RoCE v2 GID>
#   RXE_IP=10.0.2.15  RXE_NETDEV=eth0
# The VM network is qemu's user mode with restrict=on and no default route:
# nothing the VM sends leaves it.
#
# Environment knobs:
#   TENSORCAST_CACHE  cache root (default $XDG_CACHE_HOME/tensorcast, else /var/cache/tensorcast)
#   RXE_KPKG          kernel package (default: pinned below; overridable)
#   RXE_TIMEOUT       seconds for the whole VM run (default 300)
#   RXE_MEM, RXE_SMP  VM memory in MiB (default 1024) and CPUs (default 2)
#   RXE_FILES         extra host files or directories copied into /work (space separated)
#   RXE_LOG           keep the serial console log in this file
#   RXE_QUIET=1       do not echo the console while running (printed on failure)
#
# Exit status: PROGRAM's, or 124 on timeout, 125 when the VM itself failed.
set -euo pipefail

# The kernel is pinned so that a run is reproducible and the cache stays
# valid; it is what Debian 12's linux-image-amd64 depended on when this was
# written (`apt-cache depends linux-image-amd64`).
PINNED_KPKG=linux-image-6.1.0-57-amd64

say() { echo "rxe-vm: $*" >&2; }
die() { say "$1"; exit "${2:-125}"; }

[ $# -ge 1 ] || die "usage: $0 PROGRAM [args...]" 2
PROG=$(readlink -f "$1"); shift
[ -f "$PROG" ] || die "no such program: $1" 2

here=$(cd "$(dirname "$0")" && pwd)
if [ -n "${TENSORCAST_CACHE:-}" ]; then cache=$TENSORCAST_CACHE
elif [ -n "${XDG_CACHE_HOME:-}" ]; then cache=$XDG_CACHE_HOME/tensorcast
else cache=/var/cache/tensorcast; fi
cache=$cache/rxe-vm
mkdir -p "$cache"

# Host packages: qemu, busybox, kmod, cpio, libibverbs + rxe provider, perftest.
"$here/deps.sh" rdma >&2 || die "installing the rdma package group failed"

# One builder at a time fills the cache; runs themselves go in parallel.
exec 8>"$cache/lock"
flock 8

# --- kernel: fetched once with apt-get download, unpacked into the cache.
kpkg=${RXE_KPKG:-$PINNED_KPKG}
kver=${kpkg#linux-image-}
kdir=$cache/kernel-$kver
if [ ! -e "$kdir/ready" ]; then
  rm -rf "$kdir" "$cache/download"; mkdir -p "$cache/download"
  say "fetching $kpkg (once; cached in $cache)"
  if ! (cd "$cache/download" && apt-get download -q -o APT::Sandbox::User=root "$kpkg" >&2); then
    apt-get update -qq >&2 || true
    (cd "$cache/download" && apt-get download -q -o APT::Sandbox::User=root "$kpkg" >&2) ||
      die "cannot download $kpkg; set RXE_KPKG to one 'apt-cache depends linux-image-amd64' names"
  fi
  dpkg-deb -x "$cache"/download/"$kpkg"_*.deb "$kdir"
  depmod -b "$kdir" "$kver"     # the package carries no modules.dep
  rm -rf "$cache/download"
  touch "$kdir/ready"
fi
vmlinuz=$kdir/boot/vmlinuz-$kver
[ -f "$vmlinuz" ] || die "kernel image missing: $vmlinuz"

# Copies an ELF and every library ldd names for it into root $1, at the same
# paths (directories under /lib are put under /usr/lib: the image has merged /usr).
put_elf() {
  local root=$1 f=$2 lib dir
  dir=$(dirname "$f"); case $dir in /lib*|/bin|/sbin) dir=/usr$dir ;; esac
  mkdir -p "$root$dir"; cp -L "$f" "$root$dir/"
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
    while read -r lib; do
      dir=$(dirname "$lib"); case $dir in /lib*) dir=/usr$dir ;; esac
      [ -e "$root$dir/$(basename "$lib")" ] || { mkdir -p "$root$dir"; cp -L "$lib" "$root$dir/"; }
    done
}

# --- base initramfs: busybox, the rxe modules, libibverbs + provider, tools.
base=$cache/base-$kver-v1.cpio.gz
if [ ! -f "$base" ]; then
  say "building the base initramfs"
  r=$(mktemp -d "$cache/root.XXXXXX"); chmod 755 "$r"
  trap 'rm -rf "$r"' EXIT
  mkdir -p "$r"/usr/{bin,sbin,lib/x86_64-linux-gnu,lib64} "$r"/{proc,sys,dev,tmp,run,etc,work,root}
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$r/$d"; done
  cp /bin/busybox "$r/usr/bin/busybox"
  for a in $("$r/usr/bin/busybox" --list-full); do
    [ -e "$r/$a" ] || [ -L "$r/$a" ] || ln -s /usr/bin/busybox "$r/$a"
  done
  for t in rdma ibv_devices ibv_devinfo ib_write_bw ib_read_bw ib_write_lat ib_read_lat; do
    put_elf "$r" "$(command -v "$t")"
  done
  # The provider is dlopen'ed by libibverbs, so no ldd lists it.
  for p in /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so; do put_elf "$r" "$p"; done
  mkdir -p "$r/etc/libibverbs.d"; cp /etc/libibverbs.d/rxe.driver "$r/etc/libibverbs.d/"
  # Modules in load order. rdma_rxe needs crc32 from the crypto API, which
  # nothing in the VM would load on demand, so crc32_generic goes first.
  : > "$r/etc/rxe-modules"
  for m in crc32_generic virtio_pci virtio_net rdma_rxe; do
    modprobe -d "$kdir" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}' |
      while read -r ko; do
        rel=${ko#"$kdir/lib/modules/$kver/"}
        grep -qxF "$rel" "$r/etc/rxe-modules" && continue
        mkdir -p "$r/lib/modules/$kver/$(dirname "$rel")"
        cp "$ko" "$r/lib/modules/$kver/$rel"
        echo "$rel" >> "$r/etc/rxe-modules"
      done
  done
  cat > "$r/init" <<'INIT'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin HOME=/root
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/shm /dev/pts; mount -t tmpfs tmp /tmp; mount -t tmpfs shm /dev/shm; mount -t devpts pts /dev/pts
echo 1 > /proc/sys/kernel/printk
kv=$(uname -r)
while read -r m; do insmod "/lib/modules/$kv/$m" 2>/dev/null || echo "TC-VM: insmod $m failed"; done < /etc/rxe-modules
ip link set lo up
n=0; while [ ! -e /sys/class/net/eth0 ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n+1)); done
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "TC-VM: rdma link add failed"
gidx=; n=0
while [ -z "$gidx" ] && [ $n -lt 100 ]; do
  for g in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    case $(cat "$g" 2>/dev/null) in 0000:0000:0000:0000:0000:ffff:*) gidx=${g##*/}; break ;; esac
  done
  [ -n "$gidx" ] || sleep 0.05; n=$((n+1))
done
export RXE_DEV=rxe0 RXE_PORT=1 RXE_GID_INDEX=${gidx:-1} RXE_IP=10.0.2.15 RXE_NETDEV=eth0
echo "TC-VM: rxe0 up, gid index $RXE_GID_INDEX, at $(cut -d' ' -f1 /proc/uptime)s"
ulimit -l unlimited
cd /work
set -- $(cat /work/.args)
"./$(cat /work/.prog)" "$@"
echo "TC-VM-EXIT=$?"
sync
poweroff -f
INIT
  chmod 755 "$r/init"
  (cd "$r" && find . | cpio -o -H newc --quiet | gzip -1) > "$base.part"
  mv "$base.part" "$base"
  rm -rf "$r"; trap - EXIT
fi
flock -u 8

# --- this run: PROGRAM, its libraries and RXE_FILES as a second archive
# (the kernel unpacks concatenated cpio archives in order).
w=$(mktemp -d "${TMPDIR:-/tmp}/tc-rxe.XXXXXX")
trap 'rm -rf "$w"' EXIT
o=$w/overlay; mkdir -p "$o/work"
name=$(basename "$PROG")
cp -L "$PROG" "$o/work/$name"; chmod 755 "$o/work/$name"
if ldd "$PROG" >/dev/null 2>&1; then
  ldd "$PROG" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    dir=$(dirname "$lib"); case $dir in /lib*) dir=/usr$dir ;; esac
    mkdir -p "$o$dir"; cp -L "$lib" "$o$dir/"
  done
fi
for f in ${RXE_FILES:-}; do cp -rL "$f" "$o/work/"; done
echo "$name" > "$o/work/.prog"
printf '%s ' "$@" > "$o/work/.args"   # split on blanks in the VM: no blanks inside an argument
(cd "$o" && find . -mindepth 1 | cpio -o -H newc --quiet | gzip -1) > "$w/run.cpio.gz"
cat "$base" "$w/run.cpio.gz" > "$w/initrd.gz"

# /dev/kvm on these hosts may be a paravirtual shim that cannot boot a stock
# kernel; TCG with -cpu max always works.
log=${RXE_LOG:-$w/console.log}
say "booting $kver (tcg, ${RXE_MEM:-1024} MiB) with $name $*"
t0=$(date +%s)
set +e
timeout -k 5 "${RXE_TIMEOUT:-300}" qemu-system-x86_64 -accel tcg -cpu max \
  -m "${RXE_MEM:-1024}" -smp "${RXE_SMP:-2}" \
  -nodefaults -no-user-config -display none -serial stdio -no-reboot \
  -netdev user,id=n0,restrict=on -device virtio-net-pci,netdev=n0,romfile= \
  -kernel "$vmlinuz" -initrd "$w/initrd.gz" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init" </dev/null 2>&1 |
  tr -d '\r' | if [ "${RXE_QUIET:-0}" = 1 ]; then cat > "$log"; else tee "$log" >&2; fi
qrc=${PIPESTATUS[0]}
set -e
say "VM done in $(( $(date +%s) - t0 ))s (qemu status $qrc)"
rc=$(sed -n 's/^TC-VM-EXIT=\([0-9][0-9]*\)$/\1/p' "$log" | tail -n 1)
if [ -z "$rc" ]; then
  [ "${RXE_QUIET:-0}" = 1 ] && cat "$log" >&2
  case $qrc in 124|137) die "timed out after ${RXE_TIMEOUT:-300}s" 124 ;; esac
  die "the VM ended without the program's exit status" 125
fi
exit "$rc"
