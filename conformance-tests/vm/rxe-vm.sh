#!/usr/bin/env bash
# rxe-vm.sh - a QEMU guest running Linux kernel SoftRoCE (rdma_rxe), wired to a
# bridge inside a private network namespace, for rxe-emu's interop tests.
#
# The guest is built from one Debian release's packages (kernel, busybox,
# rdma-core tools) into a small initramfs; nothing else is needed from the
# outside. RXE_EMU_VM_KERNEL picks the release: 6.1 (Debian 12 "bookworm",
# rdma-core 44; the default), 6.12 (Debian 13 "trixie", rdma-core 56.1) or 7.2
# (Debian "sid", rdma-core 65). Each has its own image in the cache; bookworm's
# packages come through the machine's apt sources, the others through a private
# apt state under the cache (the machine's sources are never changed). Network:
# netns $RXE_EMU_VM_NETNS holds bridge rxc-br (10.77.0.1/24, the host side) and
# one tap per guest; guest I is 10.77.0.(10+I). The namespace has no route out,
# so nothing sent to 10.77.0.x leaves this machine. Run host-side programs that
# talk to the guests with `rxe-vm.sh host CMD`.
#
# Usage: rxe-vm.sh SUBCOMMAND ...
#   build                build the guest image into the cache (no-op when cached)
#   up [N]               boot guests 1..N (default 1), wait until rxe0 is ACTIVE
#   exec I [-t S] CMD    run CMD (sh -c) in guest I; its stdout/stderr, exit code
#   bg I NAME CMD        start CMD in the background in guest I
#   bgstat I NAME        print "running" or "exited RC" for that job
#   bgwait I NAME [S]    wait (max S s, default 60) for the job; print its log; its rc
#   bgkill I NAME        kill the job's process group; print its log
#   host CMD             run CMD (sh -c) inside the namespace, where 10.77.0.1 is
#   mtu N                set the link MTU of bridge, taps and every guest's eth0
#   netem I [--data] ARGS|off
#                        netem (e.g. "loss 5%") on guest I's eth0 in both directions:
#                        egress directly, ingress through ifb0. --data: only RoCEv2
#                        datagrams of 128 bytes or more (packets with payload); ACKs,
#                        NAKs and every other packet pass untouched
#   capture start FILE [FILTER] | capture stop   dumpcap on the bridge
#   console I            print guest I's serial console
#   status               what runs
#   versions             the image's kernel and package versions
#   suite                rdma-core's own test suite (python3-pyverbs of the release),
#                        unmodified, on kernel rxe in guest 1: boots it with a root file
#                        system of the release (built with mmdebstrap, cached) shared over
#                        9p, runs test-support/rdma-core-suite.sh there in a chroot,
#                        prints "rdma-core VERSION", the suite's output and "SUITE-EXIT RC"
#   down                 kill guests, captures and every process in the namespace;
#                        delete the namespace (with its bridge and taps)
#
# Environment knobs:
#   RXE_EMU_VM_KERNEL    6.1 | 6.12 | 7.2: the guest's kernel rxe and userland (default 6.1)
#   RXE_EMU_VM_CACHE     image cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/rxe-emu/vm)
#   RXE_EMU_VM_NETNS     namespace (default rxe-emu-conf)
#   RXE_EMU_VM_MTU       link MTU at boot: bridge, taps and guest eth0 (default 1500)
#   RXE_EMU_VM_CPUS      vCPUs per guest (default 2)
#   RXE_EMU_VM_MEM       MiB per guest (default 1024)
#   RXE_EMU_VM_ACCEL     auto | kvm | tcg (default auto: KVM only when it really works)
#   RXE_EMU_VM_BOOT_TIMEOUT  seconds to wait for a guest to be ready (default 180)
#   RXE_EMU_VM_KERNEL_PKG    Debian kernel package (default: what linux-image-amd64 names
#                        in the release)
#   RXE_EMU_VM_APPEND    extra kernel command line
#   RXE_EMU_VM_EXTRA     a directory whose tree is added to the guests' root at boot
#                        (a second cpio archive after the cached initramfs)
#   RXE_EMU_VM_SHARE     a directory the guests get read-only over 9p (mount tag rxc.share;
#                        modules in /etc/rxc.share-modules)
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
CACHE="${RXE_EMU_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/rxe-emu/vm}"
RUN="$CACHE/run"
KREL="${RXE_EMU_VM_KERNEL:-6.1}"
case "$KREL" in
  6.1) SUITE=bookworm ;;
  6.12) SUITE=trixie ;;
  7.2) SUITE=sid ;;
  *) echo "rxe-vm: RXE_EMU_VM_KERNEL=$KREL: not one of 6.1, 6.12, 7.2" >&2; exit 2 ;;
esac
IMG="$CACHE/$SUITE"
NS="${RXE_EMU_VM_NETNS:-rxe-emu-conf}"
BR=rxc-br
NET=10.77.0
HOST_IP=$NET.1
MTU="${RXE_EMU_VM_MTU:-1500}"
CPUS="${RXE_EMU_VM_CPUS:-2}"
MEM="${RXE_EMU_VM_MEM:-1024}"
ACCEL="${RXE_EMU_VM_ACCEL:-auto}"

say() { echo "rxe-vm: $*" >&2; }
die() { say "$*"; exit 1; }
ipn() { ip -n "$NS" "$@"; }
guest_ip() { echo "$NET.$((10 + $1))"; }
tap_name() { echo "rxc-tap$1"; }

# ------------------------------------------------------------------ image ---
# Debian packages whose files make up the guest userland.
# Libraries renamed in the 64-bit time_t transition (trixie and later) get
# their new names there.
PKGS="busybox-static ibverbs-utils ibverbs-providers libibverbs1 librdmacm1 rdma-core
  perftest rdmacm-utils iproute2 libibumad3 libnl-3-200 libnl-route-3-200 libpci3 libudev1
  libmnl0 libbsd0 libmd0 libelf1 libcap2 libbpf1 zlib1g libc6 libxtables12 libgcc-s1
  libselinux1 libpcre2-8-0 libzstd1"
[ "$SUITE" = bookworm ] || PKGS=$(echo "$PKGS" | sed 's/librdmacm1 /librdmacm1t64 /; s/libelf1 /libelf1t64 /')
# Modules the guest loads (modprobe resolves their dependencies at build time;
# one a kernel does not have, such as crc32_pclmul after 6.13, is left out).
# sch_netem, ifb, sch_ingress, act_mirred and cls_matchall: loss in both directions
# (`rxe-vm.sh netem`; the host's kernel may have no netem); sch_prio and cls_u32:
# loss for RoCEv2 data packets only (`netem I --data`).
MODS="virtio_pci virtio_net virtio_console virtio_rng crc32_pclmul crc32_generic sch_netem
  ifb sch_ingress act_mirred cls_matchall sch_prio cls_u32 rdma_rxe rdma_ucm ib_umad"
# Modules loaded only where a 9p share is mounted (`suite`).
SHARE_MODS="9pnet_virtio 9p"
# Programs copied into the guest, relative to the unpacked packages.
BINS="usr/bin/ibv_devinfo usr/bin/ibv_devices usr/bin/ibv_rc_pingpong usr/bin/ibv_uc_pingpong
  usr/bin/ibv_ud_pingpong usr/bin/ibv_srq_pingpong usr/bin/ib_send_bw usr/bin/ib_send_lat
  usr/bin/ib_write_bw usr/bin/ib_write_lat usr/bin/ib_read_bw usr/bin/ib_read_lat
  usr/bin/ib_atomic_bw usr/bin/rping usr/bin/ucmatose usr/bin/udaddy usr/bin/rstream usr/bin/rdma_server
  usr/bin/rdma_client usr/bin/rdma bin/ip sbin/tc"

apt_get() { # apt-get, waiting for a lock another apt may hold
  DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=120 "$@"
}

# apt-get and apt-cache for the release's packages: the machine's own for
# bookworm; for the others, a sources list and package lists of their own
# under the cache, so the machine's sources and lists are left as they are.
# A mirror may serve a Release file past its one-week validity; the
# signature is still checked (with the machine's Debian keyring).
APT_PRIV="$CACHE/apt-$SUITE"
apt_opts() {
  [ "$SUITE" = bookworm ] && return 0
  printf '%s\n' -o "Dir::Etc::SourceList=$APT_PRIV/sources.list" -o "Dir::Etc::SourceParts=/dev/null" \
    -o "Dir::State=$APT_PRIV/state" -o "Dir::State::status=$APT_PRIV/status" -o "Dir::Cache=$APT_PRIV/cache" \
    -o "Acquire::Check-Valid-Until=false" -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root"
}
apt_rel() { # apt_rel apt-get|apt-cache ARGS...
  local tool=$1 opts=(); shift
  mapfile -t opts < <(apt_opts)
  DEBIAN_FRONTEND=noninteractive "$tool" -q "${opts[@]}" "$@"
}
apt_update() { # refresh the release's package lists (root only for bookworm)
  if [ "$SUITE" = bookworm ]; then
    [ "$(id -u)" = 0 ] && apt_get update >/dev/null
    return 0
  fi
  mkdir -p "$APT_PRIV/state/lists/partial" "$APT_PRIV/cache/archives/partial"
  touch "$APT_PRIV/status"
  echo "deb http://deb.debian.org/debian $SUITE main" >"$APT_PRIV/sources.list"
  apt_rel apt-get update >/dev/null
}

host_tools() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  command -v depmod >/dev/null || need+=(kmod)
  command -v busybox >/dev/null || need+=(busybox)
  command -v xz >/dev/null || need+=(xz-utils)
  command -v zstd >/dev/null || need+=(zstd)
  command -v python3 >/dev/null || need+=(python3)
  command -v ip >/dev/null || need+=(iproute2)
  if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing host packages (need root to install): ${need[*]}"
    say "installing host packages: ${need[*]}"
    apt_get update >/dev/null
    apt_get install -y --no-install-recommends "${need[@]}" >/dev/null
  fi
}

# The image is rebuilt when this script changes (it holds the whole recipe).
recipe_id() { sha256sum "$SELF" | cut -c1-16; }

image_ok() {
  [ -f "$IMG/initrd.img" ] && [ -f "$IMG/vmlinux" ] &&
    [ "$(cat "$IMG/RECIPE" 2>/dev/null)" = "$(recipe_id)" ]
}

kernel_pkg() {
  if [ -n "${RXE_EMU_VM_KERNEL_PKG:-}" ]; then echo "$RXE_EMU_VM_KERNEL_PKG"; return; fi
  apt_rel apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'
}

download() { # download DIR PKG...: apt-get download, once with the lists as they are, once after an update
  local dir=$1; shift
  (cd "$dir" && apt_rel apt-get download "$@" >/dev/null 2>&1) && return 0
  say "apt-get download failed; updating the package lists and retrying"
  apt_update
  (cd "$dir" && apt_rel apt-get download "$@" >/dev/null)
}

cmd_build() {
  if image_ok && [ "${1:-}" != --force ]; then say "image cached in $IMG"; return 0; fi
  host_tools
  local t0=$SECONDS D="$IMG/debs"
  mkdir -p "$D"
  [ "$SUITE" = bookworm ] || [ -f "$APT_PRIV/sources.list" ] || apt_update || die "apt-get update for $SUITE failed"
  local kpkg; kpkg=$(kernel_pkg)
  if [ -z "$kpkg" ] || ! ls "$D/${kpkg}_"*.deb >/dev/null 2>&1; then
    # Lists may be stale on a fresh machine: the kernel they name may be gone from the archive.
    apt_update
    kpkg=$(kernel_pkg)
  fi
  [ -n "$kpkg" ] || die "cannot tell which kernel package linux-image-amd64 depends on in $SUITE"
  # From Linux 7.x Debian splits the kernel: linux-image-V depends on
  # linux-binary-V (vmlinuz), linux-modules-V and linux-base-V (module lists).
  local kparts
  kparts="$kpkg $(apt_rel apt-cache depends "$kpkg" 2>/dev/null | awk '/Depends: linux-(binary|modules|base)-[0-9]/{print $2}' | tr '\n' ' ')"
  local p todo=()
  # shellcheck disable=SC2086
  for p in $kparts $PKGS; do ls "$D/${p}_"*.deb >/dev/null 2>&1 || todo+=("$p"); done
  if [ ${#todo[@]} -gt 0 ]; then
    say "downloading ${#todo[@]} Debian packages (${todo[*]})"
    download "$D" "${todo[@]}" || die "apt-get download failed"
  fi

  local K="$IMG/stage/kernel" U="$IMG/stage/user" R="$IMG/stage/root"
  rm -rf "$IMG/stage"; mkdir -p "$K" "$U" "$R"
  for p in $kparts; do dpkg-deb -x "$(ls "$D/${p}_"*.deb | head -1)" "$K"; done
  local d
  for d in "$D"/*.deb; do case "${d##*/}" in linux-image-* | linux-binary-* | linux-modules-* | linux-base-[0-9]*) ;; *) dpkg-deb -x "$d" "$U" ;; esac; done
  # Packages of trixie and later put their files under /usr only (merged
  # /usr); older ones under /bin, /lib too. One layout for the steps below:
  # /usr/X, with /X a link to it.
  local x
  for x in "$K" "$U"; do
    for d in bin sbin lib; do
      mkdir -p "$x/usr/$d"
      if [ -d "$x/$d" ] && [ ! -L "$x/$d" ]; then cp -a "$x/$d/." "$x/usr/$d/"; rm -rf "${x:?}/$d"; fi
      ln -sfn "usr/$d" "$x/$d"
    done
  done
  local KV; KV=$(ls "$K/lib/modules" | head -1)
  depmod -b "$K" "$KV"

  mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,lib/x86_64-linux-gnu,usr/lib/x86_64-linux-gnu/libibverbs,lib64}
  mkdir -p "$R"/{etc/libibverbs.d,proc,sys,dev,tmp,run,root,var/log}
  cp "$U/bin/busybox" "$R/bin/busybox"
  local a
  for a in $("$R/bin/busybox" --list-full); do [ -e "$R/$a" ] || ln -s /bin/busybox "$R/$a"; done

  # Real programs replace busybox applets of the same name (ip, tc).
  local b n objs=()
  for b in $BINS; do
    [ -f "$U/$b" ] || die "no $b in the downloaded packages"
    n=${b##*/}
    rm -f "$R/bin/$n" "$R/sbin/$n" "$R/usr/bin/$n" "$R/usr/sbin/$n"
    cp -L "$U/$b" "$R/usr/bin/$n"
    objs+=("$U/$b")
  done
  # The provider's name carries the provider ABI (rdmav34 up to rdma-core 64, rdmav65 in 65).
  local prov
  prov=$(cd "$U" && ls usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)
  [ -n "$prov" ] || die "no rxe provider in the downloaded packages"
  cp -L "$U/$prov" "$R/$prov"; objs+=("$U/$prov")
  cp "$U/etc/libibverbs.d/rxe.driver" "$R/etc/libibverbs.d/"
  # Shared libraries, resolved against the unpacked packages only, by the
  # release's own dynamic loader (the machine's ldd would run its own shell
  # on the release's libc).
  local LP="$U/usr/lib/x86_64-linux-gnu:$U/usr/lib/x86_64-linux-gnu/libibverbs"
  local LDSO="$U/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" lib path
  : >"$IMG/stage/libs"
  for b in "${objs[@]}"; do
    "$LDSO" --library-path "$LP" --list "$b" >"$IMG/stage/ldd" || die "cannot list the libraries of $b"
    awk '$2 == "=>" && $1 !~ /^\// {print $1, $3}' "$IMG/stage/ldd" >>"$IMG/stage/libs"
  done
  while read -r lib path; do
    case "$path" in
      "$U"/*) cp -L "$path" "$R/lib/x86_64-linux-gnu/$lib" ;;
      *) die "library $lib not found in the downloaded packages (ld.so --list: $path)" ;;
    esac
  done < <(sort -u "$IMG/stage/libs")
  cp -L "$U/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$R/lib64/"
  ln -sf /lib64/ld-linux-x86-64.so.2 "$R/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
  cp -L "$U/lib/x86_64-linux-gnu/libgcc_s.so.1" "$R/lib/x86_64-linux-gnu/" # dlopen()ed by pthread_exit
  printf '/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n' >"$R/etc/ld.so.conf"
  ldconfig -r "$R" 2>/dev/null || true

  local m ko mods="" share_mods=""
  for m in $SHARE_MODS; do
    if modprobe -d "$K" -S "$KV" --show-depends "$m" >/dev/null 2>&1; then
      share_mods="$share_mods $m"
    else
      say "kernel $KV has no module $m (built in or gone): left out"
    fi
  done
  for m in $MODS; do
    if modprobe -d "$K" -S "$KV" --show-depends "$m" >/dev/null 2>&1; then
      mods="$mods $m"
    else
      case "$m" in rdma_rxe | rdma_ucm | ib_umad | virtio_*) die "kernel $KV has no module $m" ;; esac
      say "kernel $KV has no module $m (built in or gone): left out"
    fi
  done
  for m in $mods $share_mods; do modprobe -d "$K" -S "$KV" --show-depends "$m" | awk '$1 == "insmod" {print $2}'; done |
    sort -u | while read -r ko; do
      mkdir -p "$R/$(dirname "${ko#"$K"/}")"
      cp "$ko" "$R/${ko#"$K"/}"
    done
  # Newer Debian kernels ship xz-compressed modules; busybox's modprobe loads
  # plain ones.
  find "$R/lib/modules" -name '*.ko.xz' -exec xz -d {} +
  find "$R/lib/modules" -name '*.ko.zst' -exec zstd -q -d --rm {} +
  cp "$K/lib/modules/$KV"/modules.{order,builtin,builtin.modinfo} "$R/lib/modules/$KV/"
  depmod -b "$R" "$KV"

  echo "root:x:0:0:root:/root:/bin/sh" >"$R/etc/passwd"
  echo "root:x:0:" >"$R/etc/group"
  printf '127.0.0.1 localhost\n%s host\n' "$HOST_IP" >"$R/etc/hosts"
  printf 'passwd: files\ngroup: files\nhosts: files\n' >"$R/etc/nsswitch.conf"
  printf '::respawn:/sbin/rxc-agent\n' >"$R/etc/inittab"
  # Debian's busybox sh prefers its own applets to PATH; functions win over applets.
  {
    echo "export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root"
    for b in $BINS; do
      n=${b##*/}
      if "$R/bin/busybox" --list | grep -qx "$n"; then echo "$n() { /usr/bin/$n \"\$@\"; }"; fi
    done
  } >"$R/etc/rxc.rc"
  guest_init >"$R/init"
  guest_agent >"$R/sbin/rxc-agent"
  chmod 755 "$R/init" "$R/sbin/rxc-agent"
  echo "$mods" >"$R/etc/rxc.modules"
  echo "$share_mods" >"$R/etc/rxc.share-modules"

  # The ELF vmlinux boots through QEMU's PVH entry: no real-mode setup and no
  # in-guest decompression, seconds faster under TCG than bzImage.
  local vmlinuz="$K/boot/vmlinuz-$KV"
  [ -f "$vmlinuz" ] || vmlinuz="$K/lib/modules/$KV/vmlinuz" # linux-binary-V (7.x)
  python3 - "$vmlinuz" "$IMG/vmlinux.tmp" <<'PY'
import lzma, subprocess, sys, zlib
d = open(sys.argv[1], "rb").read()
out = None
i = d.find(b"\xfd7zXZ\x00")
if i >= 0:
    out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(d[i:])
else:
    i = d.find(b"\x1f\x8b\x08\x00")
    if i >= 0:
        out = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(d[i:])
    else:
        i = d.find(b"\x28\xb5\x2f\xfd")
        if i >= 0:
            # zstd stops at the end of the frame; the rest of bzImage is ignored
            r = subprocess.run(["zstd", "-q", "-d", "-c"], input=d[i:], capture_output=True)
            out = r.stdout
if not out or out[:4] != b"\x7fELF":
    sys.exit("rxe-vm: cannot extract an ELF vmlinux from " + sys.argv[1])
open(sys.argv[2], "wb").write(out)
PY
  (cd "$R" && find . | sort | busybox cpio -o -H newc -R 0:0 2>/dev/null | gzip -6) >"$IMG/initrd.img.tmp"
  mv "$IMG/vmlinux.tmp" "$IMG/vmlinux"
  mv "$IMG/initrd.img.tmp" "$IMG/initrd.img"
  {
    echo "kernel_pkg=$kpkg"
    echo "kernel_release=$KV"
    for d in "$D"/*.deb; do dpkg-deb --showformat='${Package}=${Version}\n' -W "$d"; done
  } >"$IMG/VERSIONS"
  recipe_id >"$IMG/RECIPE"
  rm -rf "$IMG/stage"
  say "built guest image in $IMG ($((SECONDS - t0)) s): kernel $KV, initrd $(du -h "$IMG/initrd.img" | cut -f1)"
}

guest_init() {
  cat <<'EOF'
#!/bin/sh
# PID 1: modules, eth0, rxe0; then busybox init, which keeps the agent running.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /tmp/bg
mount -t devpts devpts /dev/pts
IP= NAME=guest MTU=
for a in $(cat /proc/cmdline); do
  case "$a" in
    rxc.ip=*) IP="${a#*=}" ;;
    rxc.name=*) NAME="${a#*=}" ;;
    rxc.mtu=*) MTU="${a#*=}" ;;
  esac
done
hostname "$NAME"
for m in $(cat /etc/rxc.modules); do modprobe "$m" || echo "RXC-WARN modprobe $m failed"; done
ip link set lo up
i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
[ -n "$MTU" ] && ip link set eth0 mtu "$MTU"
ip addr add "$IP" dev eth0
ip link set eth0 up
if rdma link add rxe0 type rxe netdev eth0; then
  i=0; while ! grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
  i=0; while ! grep -q "0000:0000:0000:0000:0000:ffff" /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
  if grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state; then
    echo "RXC-READY $NAME $(uname -r) uptime=$(cut -d' ' -f1 /proc/uptime)"
  else
    echo "RXC-FAIL $NAME: rxe0 port is not ACTIVE"
  fi
else
  echo "RXC-FAIL $NAME: rdma link add failed"
fi
exec /bin/busybox init
EOF
}

guest_agent() {
  cat <<'EOF'
#!/bin/sh
# Command agent on the virtio-serial port "rxc.agent".
# Request, one line: "ID TIMEOUT BASE64(script)".
# Reply: "@@BEGIN ID", "@@OUT", base64(stdout), "@@ERR", base64(stderr), "@@END ID RC".
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
ulimit -l unlimited 2>/dev/null
cd /root
P=
for d in /sys/class/virtio-ports/*; do [ "$(cat "$d/name" 2>/dev/null)" = rxc.agent ] && P="/dev/${d##*/}"; done
[ -n "$P" ] || { echo "rxc-agent: no port" >/dev/console; sleep 5; exit 1; }
W=/tmp/.agent; mkdir -p $W
exec 3<>"$P"
while :; do
  read -r id tmo b64 <&3 || { sleep 0.1; continue; }
  [ -n "$id" ] && [ -n "$tmo" ] || continue
  printf '%s' "$b64" | base64 -d >$W/cmd.sh 2>/dev/null
  # A session of its own: on timeout, and when it returns, its whole group is killed.
  setsid sh -c '. /etc/rxc.rc; . "$0"' $W/cmd.sh </dev/null >$W/out 2>$W/err 3>&- &
  pid=$!
  # The watchdog sleeps once, for the whole timeout, in a session of its
  # own (killed whole when the command returns). It used to poll every
  # 100 ms, and each poll forked a sleep: 2-5 ms of a vCPU under TCG, every
  # 100 ms, that preempted what the command ran (latency benchmarks took
  # those stalls for their 99.9th percentiles, on either device).
  setsid sh -c 'sleep "$1"; echo "rxc-agent: timed out after $1s" >>"$2"; kill -KILL -"$3"' \
    watchdog "$tmo" $W/err $pid </dev/null >/dev/null 2>&1 3>&- &
  watch=$!
  wait $pid
  rc=$?
  kill -KILL -$pid 2>/dev/null
  kill -KILL -$watch $watch 2>/dev/null
  { echo "@@BEGIN $id"; echo "@@OUT"; base64 $W/out; echo "@@ERR"; base64 $W/err; echo "@@END $id $rc"; } >&3
done
EOF
}

# ---------------------------------------------------------------- network ---
ns_exists() { ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$NS"; }

net_up() {
  if ! ns_exists; then
    ip netns add "$NS"
    ipn link set lo up
  fi
  if ! ipn link show "$BR" >/dev/null 2>&1; then
    ipn link add "$BR" type bridge stp_state 0 forward_delay 0
    ipn link set "$BR" mtu "$MTU"
    ipn addr add "$HOST_IP/24" dev "$BR"
    ipn link set "$BR" up
  fi
}

cmd_mtu() { # set bridge, taps and guest eth0 MTU at run time (rxe follows NETDEV_CHANGEMTU)
  local m=${1:?MTU} t f i
  for t in $(ipn -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^rxc-tap'); do ipn link set "$t" mtu "$m"; done
  ipn link set "$BR" mtu "$m"
  for f in "$RUN"/vm*.pid; do
    [ -f "$f" ] || continue
    i=${f##*/vm}; i=${i%.pid}
    agent "$i" 20 "ip link set eth0 mtu $m && cat /sys/class/infiniband/rxe0/ports/1/state >/dev/null" >/dev/null
  done
  say "link MTU $m"
}

cmd_netem() { # netem in the guest, both ways: the host side of the bridge may have no sch_netem
  local i=${1:?guest}
  shift
  local data=
  if [ "${1:-}" = --data ]; then data=1; shift; fi
  # Clear what an earlier call set up, so calls do not pile up filters.
  agent "$i" 20 "tc qdisc del dev eth0 root 2>/dev/null; tc qdisc del dev eth0 ingress 2>/dev/null
    tc qdisc del dev ifb0 root 2>/dev/null; true" >/dev/null
  [ "${1:-}" = off ] && return 0
  local root
  if [ -n "$data" ]; then
    # prio band 1:1 (no netem): UDP/4791 with IP total length < 128 (ACKs, NAKs,
    # atomic ACKs); band 1:3 (netem): the other UDP/4791 datagrams; everything
    # else takes the default band 1:2 (no netem).
    root='tc qdisc add dev $d root handle 1: prio
      tc qdisc add dev $d parent 1:3 handle 30: netem '"$*"'
      tc filter add dev $d parent 1: protocol ip prio 1 u32 match ip protocol 17 0xff match ip dport 4791 0xffff match u16 0 0xff80 at 2 flowid 1:1
      tc filter add dev $d parent 1: protocol ip prio 2 u32 match ip protocol 17 0xff match ip dport 4791 0xffff flowid 1:3'
  else
    root='tc qdisc add dev $d root netem '"$*"
  fi
  agent "$i" 20 "set -e
    ip link show ifb0 >/dev/null 2>&1 || ip link add ifb0 type ifb
    ip link set ifb0 up
    d=eth0; $root
    tc qdisc add dev eth0 handle ffff: ingress
    tc filter add dev eth0 parent ffff: protocol all prio 1 matchall action mirred egress redirect dev ifb0
    d=ifb0; $root"
}

# ----------------------------------------------------------------- guests ---
kvm_usable() {
  [ -c /dev/kvm ] || return 1
  # kvm_pvm exposes /dev/kvm but runs only PVM-aware guests: a stock kernel hangs.
  [ -d /sys/module/kvm_pvm ] && return 1
  python3 -c 'import os, fcntl
fd = os.open("/dev/kvm", os.O_RDWR)
assert fcntl.ioctl(fd, 0xAE00, 0) == 12
os.close(fcntl.ioctl(fd, 0xAE01, 0))' 2>/dev/null
}

alive() { [ -f "$RUN/vm$1.pid" ] && kill -0 "$(cat "$RUN/vm$1.pid")" 2>/dev/null; }

boot() { # boot I
  local i=$1 accel opt cpu tap
  alive "$i" && { say "vm$i already runs"; return 0; }
  case "$ACCEL" in
    kvm | tcg) accel=$ACCEL ;;
    *) if kvm_usable; then accel=kvm; else accel=tcg; fi ;;
  esac
  if [ "$accel" = kvm ]; then opt=kvm cpu=host; else opt="tcg,thread=multi,tb-size=256" cpu=max; fi
  tap=$(tap_name "$i")
  ipn link show "$tap" >/dev/null 2>&1 || ipn tuntap add dev "$tap" mode tap
  ipn link set "$tap" mtu "$MTU"
  ipn link set "$tap" master "$BR"
  ipn link set "$tap" up
  mkdir -p "$RUN"
  rm -f "$RUN/vm$i".agent.{in,out,lock} "$RUN/vm$i.console"
  mkfifo "$RUN/vm$i.agent.in" "$RUN/vm$i.agent.out"
  image_ok || die "no guest image for kernel $KREL in $IMG (run: rxe-vm.sh build)"
  local initrd="$IMG/initrd.img"
  if [ -n "${RXE_EMU_VM_EXTRA:-}" ]; then
    [ -d "$RXE_EMU_VM_EXTRA" ] || die "RXE_EMU_VM_EXTRA=$RXE_EMU_VM_EXTRA is not a directory"
    # Linux unpacks concatenated cpio archives in order: the extra files
    # land on top of the image's.
    initrd="$RUN/initrd-extra.img"
    { cat "$IMG/initrd.img"
      (cd "$RXE_EMU_VM_EXTRA" && find . | sort | busybox cpio -o -H newc -R 0:0 2>/dev/null | gzip -1)
    } >"$initrd" || die "cannot add $RXE_EMU_VM_EXTRA to the guest image"
  fi
  local share=()
  if [ -n "${RXE_EMU_VM_SHARE:-}" ]; then
    [ -d "$RXE_EMU_VM_SHARE" ] || die "RXE_EMU_VM_SHARE=$RXE_EMU_VM_SHARE is not a directory"
    share=(-fsdev "local,id=rxcshare,path=$RXE_EMU_VM_SHARE,security_model=none,readonly=on"
      -device "virtio-9p-pci,fsdev=rxcshare,mount_tag=rxc.share")
  fi
  local append="console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off tsc=reliable no_timer_check"
  append="$append rxc.ip=$(guest_ip "$i")/24 rxc.name=vm$i rxc.mtu=$MTU ${RXE_EMU_VM_APPEND:-}"
  ip netns exec "$NS" qemu-system-x86_64 -name "rxc-vm$i" \
    -machine pc -accel "$opt" -cpu "$cpu" -smp "$CPUS" -m "$MEM" \
    -nodefaults -no-user-config -display none -vga none -no-reboot \
    -kernel "$IMG/vmlinux" -initrd "$initrd" -append "$append" \
    -serial "file:$RUN/vm$i.console" \
    -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=n0,mac=$(printf '52:54:00:77:00:%02x' $((10 + i)))" \
    -device virtio-serial-pci \
    -chardev "pipe,id=agent,path=$RUN/vm$i.agent" \
    -device "virtserialport,chardev=agent,name=rxc.agent" \
    -device virtio-rng-pci "${share[@]}" \
    -daemonize -pidfile "$RUN/vm$i.pid"
  echo "$accel" >"$RUN/vm$i.accel"
}

wait_ready() { # wait_ready I SECONDS
  local i=$1 limit=$2 t0=$SECONDS
  while :; do
    if grep -q RXC-FAIL "$RUN/vm$i.console" 2>/dev/null; then
      grep RXC-FAIL "$RUN/vm$i.console" >&2
      return 1
    fi
    if grep -q RXC-READY "$RUN/vm$i.console" 2>/dev/null && agent "$i" 10 true >/dev/null 2>&1; then return 0; fi
    alive "$i" || { say "vm$i died; console:"; tail -20 "$RUN/vm$i.console" >&2; return 1; }
    [ $((SECONDS - t0)) -lt "$limit" ] || { say "vm$i not ready after ${limit}s; console:"; tail -20 "$RUN/vm$i.console" >&2; return 1; }
    sleep 0.2
  done
}

# Wait until guest I is ready; a guest that died while it booted is booted
# once more (a TCG guest's kernel has crashed in early boot, with no part
# of ours running yet: Linux 7.2 once in set_next_task_fair, 2026-11-28).
ready_or_reboot() { # ready_or_reboot I
  local i=$1
  wait_ready "$i" "${RXE_EMU_VM_BOOT_TIMEOUT:-180}" && return 0
  alive "$i" && return 1
  say "vm$i died while it booted; booting it once more"
  boot "$i"
  wait_ready "$i" "${RXE_EMU_VM_BOOT_TIMEOUT:-180}"
}

agent() { # agent I TIMEOUT SCRIPT: run SCRIPT in guest I; its stdout, stderr and exit code
  local i=$1 tmo=$2
  shift 2
  [ -p "$RUN/vm$i.agent.in" ] || die "vm$i is not running"
  python3 - "$RUN/vm$i" "$tmo" "$*" <<'PY'
import base64, fcntl, os, secrets, select, sys, time
base, tmo, script = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lock = open(base + ".agent.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)  # one request at a time per guest
try:
    wfd = os.open(base + ".agent.in", os.O_WRONLY | os.O_NONBLOCK)
except OSError as e:
    sys.exit(f"rxe-vm: QEMU does not hold the agent pipe open ({e})")
rfd = os.open(base + ".agent.out", os.O_RDONLY | os.O_NONBLOCK)
rid = secrets.token_hex(6)
os.set_blocking(wfd, True)
os.write(wfd, f"{rid} {tmo} {base64.b64encode(script.encode()).decode()}\n".encode())
deadline = time.monotonic() + tmo + 15
buf, out, err, cur, mine, rc = b"", [], [], None, False, None
while rc is None:
    left = deadline - time.monotonic()
    if left <= 0:
        sys.exit("rxe-vm: no answer from the guest agent")
    if not select.select([rfd], [], [], min(left, 1.0))[0]:
        continue
    chunk = os.read(rfd, 65536)
    if not chunk:
        time.sleep(0.02)
        continue
    buf += chunk
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        line = line.decode(errors="replace")
        if line == f"@@BEGIN {rid}":
            mine, cur = True, None
        elif not mine:
            continue  # the tail of a reply to an abandoned request
        elif line == "@@OUT":
            cur = out
        elif line == "@@ERR":
            cur = err
        elif line.startswith(f"@@END {rid} "):
            rc = int(line.split()[-1])
            break
        elif cur is not None:
            cur.append(line)
sys.stdout.buffer.write(base64.b64decode("".join(out)))
sys.stdout.flush()
sys.stderr.buffer.write(base64.b64decode("".join(err)))
sys.exit(rc)
PY
}

cmd_up() {
  local n=${1:-1} i t0=$SECONDS
  image_ok || cmd_build
  command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
  net_up
  for i in $(seq 1 "$n"); do boot "$i"; done
  for i in $(seq 1 "$n"); do ready_or_reboot "$i" || die "vm$i did not come up"; done
  say "vm1..vm$n ready in $((SECONDS - t0)) s ($(cat "$RUN/vm1.accel"), $CPUS vCPU, $MEM MiB, MTU $MTU); host side $HOST_IP in netns $NS"
}

cmd_exec() {
  local tmo=600 i
  i=${1:?guest number}
  shift
  if [ "${1:-}" = -t ]; then tmo=$2; shift 2; fi
  agent "$i" "$tmo" "$*"
}

cmd_bg() {
  local i=${1:?guest} name=${2:?name}
  shift 2
  local q; q=$(printf '%s' "$*" | base64 -w0)
  # The job records its pid after setsid, out of the agent call's process group.
  agent "$i" 30 "J=/tmp/bg/$name; mkdir -p /tmp/bg; cd /tmp/bg; rm -f \$J.rc \$J.log \$J.pid
    { echo '. /etc/rxc.rc'; echo '$q' | base64 -d; } > \$J.sh
    setsid sh -c 'echo \$\$ > $name.pid.tmp && mv $name.pid.tmp $name.pid; sh $name.sh > $name.log 2>&1 < /dev/null; echo \$? > $name.rc.tmp && mv $name.rc.tmp $name.rc' >/dev/null 2>&1 </dev/null &
    n=0; while [ ! -s \$J.pid ] && [ \$n -lt 100 ]; do sleep 0.05; n=\$((n+1)); done
    cat \$J.pid" | sed 's/^/started pid /' >&2
}

cmd_bgstat() {
  local i=${1:?guest} name=${2:?name}
  agent "$i" 10 "if [ -s /tmp/bg/$name.rc ]; then echo exited \$(cat /tmp/bg/$name.rc); elif [ -s /tmp/bg/$name.pid ]; then echo running; else echo unknown; fi"
}

cmd_bgwait() {
  local i=${1:?guest} name=${2:?name} t=${3:-60}
  agent "$i" $((t + 10)) "end=\$((\$(date +%s) + $t)); while [ ! -s /tmp/bg/$name.rc ] && [ \$(date +%s) -lt \$end ]; do sleep 0.1; done
    cat /tmp/bg/$name.log
    [ -s /tmp/bg/$name.rc ] || { echo 'rxe-vm: job $name still runs' >&2; exit 124; }
    exit \$(cat /tmp/bg/$name.rc)"
}

cmd_bgkill() {
  local i=${1:?guest} name=${2:?name}
  agent "$i" 10 "[ -s /tmp/bg/$name.pid ] && kill -KILL -\$(cat /tmp/bg/$name.pid) 2>/dev/null; cat /tmp/bg/$name.log 2>/dev/null; true"
}

# A root file system of the release with its python3-pyverbs (rdma-core's
# suite), built with mmdebstrap and cached beside the image; its path.
suite_root() {
  local root="$CACHE/$SUITE-suite-root" pkgs="python3-pyverbs,ibverbs-providers,iproute2"
  if [ "$(cat "$root/.rxe-vm-root" 2>/dev/null)" = "$pkgs" ]; then echo "$root"; return 0; fi
  if ! command -v mmdebstrap >/dev/null; then
    [ "$(id -u)" = 0 ] || die "mmdebstrap is missing (apt-get install mmdebstrap)"
    apt_get install -y --no-install-recommends mmdebstrap >/dev/null || die "cannot install mmdebstrap"
  fi
  say "building a $SUITE root with $pkgs (mmdebstrap)"
  rm -rf "$root" "$root.tmp"
  mmdebstrap --variant=apt --aptopt='Acquire::Check-Valid-Until "false"' --include "$pkgs" \
    "$SUITE" "$root.tmp" http://deb.debian.org/debian >&2 || die "mmdebstrap $SUITE failed"
  echo "$pkgs" >"$root.tmp/.rxe-vm-root"
  mv "$root.tmp" "$root"
  echo "$root"
}

cmd_suite() {
  local script="$(dirname "$SELF")/../../test-support/rdma-core-suite.sh" root
  [ -f "$script" ] || die "$script is missing"
  image_ok || cmd_build
  root=$(suite_root) || exit 1
  echo "rdma-core $(dpkg-query --admindir="$root/var/lib/dpkg" -W -f '${Version}' python3-pyverbs)"
  net_up
  RXE_EMU_VM_SHARE="$root" MEM="${RXE_EMU_VM_MEM:-2048}" boot 1
  RXE_EMU_VM_SHARE="$root" MEM="${RXE_EMU_VM_MEM:-2048}" ready_or_reboot 1 || die "vm1 did not come up"
  # The guest's kernel rxe, its uverbs devices and its netlink, seen from the
  # release's userland in a chroot on the 9p share (read-only; /tmp is tmpfs).
  agent 1 1500 "set -e
    for m in \$(cat /etc/rxc.share-modules); do modprobe \$m; done
    R=/mnt/root; mkdir -p \$R
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose rxc.share \$R
    mount -t proc proc \$R/proc; mount -t sysfs sysfs \$R/sys; mount -o bind /dev \$R/dev
    mkdir -p \$R/dev/shm; mount -t tmpfs tmpfs \$R/dev/shm # multiprocessing's shared memory
    mount -t tmpfs tmpfs \$R/tmp; mount -t tmpfs tmpfs \$R/run
    cat >\$R/tmp/rdma-core-suite.sh <<'RXE_SUITE_EOF'
$(cat "$script")
RXE_SUITE_EOF
    set +e
    chroot \$R /bin/sh /tmp/rdma-core-suite.sh rxe0 env PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root"
}

cmd_host() { ip netns exec "$NS" sh -c "$*"; }

cmd_capture() {
  case "${1:-}" in
    start)
      local f=${2:?file} filter=${3:-udp port 4791}
      command -v dumpcap >/dev/null || die "dumpcap not found (apt-get install tshark)"
      ns_exists || die "namespace $NS does not exist (run up first)"
      mkdir -p "$RUN" "$(dirname "$f")"
      if [ -f "$RUN/capture.pid" ] && kill -0 "$(cat "$RUN/capture.pid")" 2>/dev/null; then die "a capture already runs"; fi
      # `ip netns exec` execs dumpcap, so $! is dumpcap itself.
      ip netns exec "$NS" dumpcap -q -P -i "$BR" -f "$filter" -w "$f" </dev/null >"$RUN/capture.log" 2>&1 &
      echo $! >"$RUN/capture.pid"
      local n=0
      while ! grep -q "Capturing on" "$RUN/capture.log" 2>/dev/null && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
      grep -q "Capturing on" "$RUN/capture.log" || die "dumpcap did not start: $(cat "$RUN/capture.log")"
      ;;
    stop)
      [ -f "$RUN/capture.pid" ] || return 0
      local p; p=$(cat "$RUN/capture.pid")
      if grep -q dumpcap "/proc/$p/cmdline" 2>/dev/null; then
        kill -TERM "$p" 2>/dev/null || true
        local n=0
        while kill -0 "$p" 2>/dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
        kill -KILL "$p" 2>/dev/null || true
      fi
      rm -f "$RUN/capture.pid"
      ;;
    *) die "capture start FILE [FILTER] | capture stop" ;;
  esac
}

cmd_status() {
  local f i
  for f in "$RUN"/vm*.pid; do
    [ -f "$f" ] || continue
    i=${f##*/vm}; i=${i%.pid}
    if alive "$i"; then echo "vm$i runs, pid $(cat "$f"), $(guest_ip "$i"), $(cat "$RUN/vm$i.accel")"; else echo "vm$i dead"; fi
  done
  [ -f "$RUN/capture.pid" ] && echo "capture pid $(cat "$RUN/capture.pid")"
  ns_exists && { echo "netns $NS"; ipn -br link; }
  return 0
}

cmd_down() {
  local f p n
  cmd_capture stop
  for f in "$RUN"/vm*.pid; do
    [ -f "$f" ] || continue
    p=$(cat "$f")
    if grep -q qemu "/proc/$p/cmdline" 2>/dev/null; then
      kill "$p" 2>/dev/null || true
      n=0; while kill -0 "$p" 2>/dev/null && [ $n -lt 30 ]; do sleep 0.1; n=$((n + 1)); done
      kill -KILL "$p" 2>/dev/null || true
    fi
    rm -f "$f"
  done
  rm -f "$RUN"/vm*.agent.in "$RUN"/vm*.agent.out
  if ns_exists; then
    # whatever still runs in the namespace was started through this script
    for p in $(ip netns pids "$NS" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$NS"
  fi
  say "down"
}

usage() { sed -n '2,/^set -euo/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'; }

case "${1:-help}" in
  build) shift; cmd_build "$@" ;;
  up) shift; cmd_up "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  bg) shift; cmd_bg "$@" ;;
  bgstat) shift; cmd_bgstat "$@" ;;
  bgwait) shift; cmd_bgwait "$@" ;;
  bgkill) shift; cmd_bgkill "$@" ;;
  host) shift; cmd_host "$@" ;;
  mtu) shift; cmd_mtu "$@" ;;
  netem) shift; cmd_netem "$@" ;;
  capture) shift; cmd_capture "$@" ;;
  console) cat "$RUN/vm${2:?guest}.console" ;;
  versions) cat "$IMG/VERSIONS" ;;
  suite) cmd_suite ;;
  status) cmd_status ;;
  down) cmd_down ;;
  help | -h | --help) usage ;;
  *) usage; exit 2 ;;
esac
