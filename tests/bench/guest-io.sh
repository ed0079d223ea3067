#!/usr/bin/env bash
# sudo tests/bench/guest-io.sh: what vmwarden's sandbox costs a guest's I/O.
#
# Boots the same guest (tests/assets/build-guest-shares.sh's kernel and
# initramfs, plus this bench's tool) over and over, interleaved round by
# round (the order of the configurations turns by one each round):
#   vmw   under vmwarden, in its full sandbox: `vmwarden-launch` run by root
#         (the launcher's sandbox is complete without a unit), QEMU and one
#         virtiofsd as the VM's principal;
#   mvn   as microvm.nix's runner starts it (lib/runners/qemu.nix,
#         nixos-modules/microvm/virtiofsd): bare QEMU as root with its flags
#         for the same options (vhost, queues, aio=io_uring, cache), and
#         virtiofsd as root with its flags (--thread-pool-size `nproc`,
#         --inode-file-handles=prefer, --cache=auto, --posix-acl --xattr,
#         --rlimit-nofile 1048576);
# and, for the per-option figures, a few workloads again with one option
# changed: vhost off, one queue (vmwarden when it has the option, else
# microvm.nix's flags), aio=threads instead of io_uring (microvm.nix's flags:
# vmwarden's filter refuses io_uring).
# The guest: 2 vCPUs, 512 MiB, q35 (PCI, as microvm.nix uses with a share),
# one tap (vhost on where the host has /dev/vhost-net, 2 queues), one raw
# disk (direct off: microvm.nix's
# default; discard on), one virtiofs share. In the guest, five workloads,
# each timed by the guest's CLOCK_MONOTONIC (guest-io-tool.c):
#   net        TCP stream to the host over the tap (NET_MIB MiB)
#   blk-read   sequential read of the disk, O_DIRECT (BLK_MIB MiB, 1 MiB blocks)
#   blk-write  sequential write of the disk, O_DIRECT, then fsync
#   fs-read    sequential read of a file on the share (FS_MIB MiB)
#   fs-write   sequential write of a file on the share, then fsync
# The network is the bench's own: a network namespace it makes, a bridge
# with 10.203.0.1/24 in it, the guest at 10.203.0.2; nothing leaves it.
# KVM when a guest boots with it here, TCG otherwise (this prints which).
# Not part of CI. Its last line:
#   guest-io: net R, blk-read R, blk-write R, fs-read R, fs-write R (vmwarden / microvm.nix flags, same run, N rounds)
# each R the median over the rounds of vmw's throughput ÷ mvn's in the
# same round.
#
# Each workload runs VMWARDEN_GUEST_IO_REPEAT (3) times per boot and the
# fastest run counts (the one the machine's other load disturbed least; the
# guest drops its page cache before each fs-read, so both read through
# virtiofs).
#
# Environment: VMWARDEN_GUEST_IO_ROUNDS (7), VMWARDEN_GUEST_IO_ACCEL (auto |
# kvm | tcg), VMWARDEN_GUEST_IO_NET_MIB (256), _BLK_MIB (512), _FS_MIB (128),
# VMWARDEN_BIN_DIR (<repo>/target/release), VMWARDEN_TEST_CARGO_ROOT (where
# tests/setup-host.sh put virtiofsd), VMWARDEN_GUEST_IO_KEEP=1 (keep the work
# directory).
set -euo pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROUNDS=${VMWARDEN_GUEST_IO_ROUNDS:-7}
ACCEL=${VMWARDEN_GUEST_IO_ACCEL:-auto}
NET_MIB=${VMWARDEN_GUEST_IO_NET_MIB:-256}
BLK_MIB=${VMWARDEN_GUEST_IO_BLK_MIB:-512}
FS_MIB=${VMWARDEN_GUEST_IO_FS_MIB:-128}
REPEAT=${VMWARDEN_GUEST_IO_REPEAT:-3}
BIN_DIR=${VMWARDEN_BIN_DIR:-$REPO/target/release}
VIRTIOFSD=${VMWARDEN_TEST_CARGO_ROOT:-/var/cache/vmwarden-test/cargo}/bin/virtiofsd
QEMU=/usr/bin/qemu-system-x86_64
VCPUS=2
MEM=512
UIDN=61990
NAME=gio
NS=vmwgio$$
BR=vmwgiobr0
HOST_IP=10.203.0.1
GUEST_IP=10.203.0.2
MAC=02:00:0a:cb:00:02
TAP_VMW=vmw-gio0
TAP_MVN=vmwgio-m0
TAP_MVN1=vmwgio-s0
PORT=5001
BOOT_TIMEOUT=900

die() { echo "guest-io: ERROR: $*" >&2; exit 1; }
say() { echo "guest-io: $*"; }
[ "$(id -u)" -eq 0 ] || die "must run as root (it makes a network namespace, taps and the VM's sandbox)"
for b in vmwarden-launch vmwarden-cleanup vmwarden; do
  [ -x "$BIN_DIR/$b" ] || die "$BIN_DIR/$b missing: cargo build --release (or set VMWARDEN_BIN_DIR)"
done
[ -x "$QEMU" ] || die "$QEMU missing (tests/setup-host.sh)"
[ -x "$VIRTIOFSD" ] || die "$VIRTIOFSD missing (tests/setup-host.sh)"
for c in ip nsenter gcc busybox gzip; do command -v "$c" >/dev/null || die "missing $c"; done

T_ALL=$SECONDS
W=/var/lib/vmwarden-test/guest-io.$$
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$NS" 2>/dev/null || true
  if [ "${VMWARDEN_GUEST_IO_KEEP:-0}" != 1 ]; then rm -rf "$W"; else say "kept $W"; fi
}
trap cleanup EXIT
mkdir -p /var/lib/vmwarden-test
chmod 0755 /var/lib/vmwarden-test
mkdir -m 0755 "$W"
mkdir -m 0755 "$W/config" "$W/run" "$W/out"

# ------------------------------------------------------------ the guest
ENV=$("$REPO/tests/assets/build-guest-shares.sh" | tail -1) || die "build-guest-shares.sh failed"
KERNEL=$(. "$ENV" && echo "$KERNEL")
BASE_INITRD=$(. "$ENV" && echo "$INITRD")
gcc -O2 -Wall -static -o "$W/guest-io-tool" "$HERE/guest-io-tool.c" || die "gcc -static guest-io-tool.c failed (libc6-dev)"
mkdir -p "$W/extra/bin"
cp "$W/guest-io-tool" "$W/extra/bin/guest-io-tool"
# The kernel unpacks concatenated cpio archives one after the other: the
# shares guest's initramfs, then the tool.
(cd "$W/extra" && find . -mindepth 1 | LC_ALL=C sort | busybox cpio -o -H newc -R 0:0 2>/dev/null) | gzip -9n >"$W/extra.img"
cat "$BASE_INITRD" "$W/extra.img" >"$W/initramfs.img"
chmod 0644 "$W/initramfs.img"

# The disk (filled, so reads come from real blocks) and the share (a file to
# read), the principal's, as the launcher wants them.
dd if=/dev/urandom of="$W/disk.img" bs=1M count=$((BLK_MIB + 16)) status=none
mkdir -m 0700 "$W/share"
dd if=/dev/urandom of="$W/share/big" bs=1M count="$FS_MIB" status=none
chown "$UIDN:$UIDN" "$W/disk.img" "$W/share" "$W/share/big"
chmod 0600 "$W/disk.img" "$W/share/big"

# ------------------------------------------------------------ the network
ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add "$BR" type bridge
ip -n "$NS" addr add "$HOST_IP/24" dev "$BR"
ip -n "$NS" link set "$BR" up
# nsenter itself in the background (it execs the sink), so $! is the sink
nsenter --net="/run/netns/$NS" "$W/guest-io-tool" sink "$HOST_IP" "$PORT" &
PIDS+=($!)

# ------------------------------------------------------------ accelerator
# The guest's script (vmwarden.run=): its network, the share, the workloads
# named in WL, each printed as `GIO w=<name> bytes=<n> ns=<elapsed>`.
guest_script() { # WORKLOADS
  cat <<EOF
ip link set lo up; ip addr add $GUEST_IP/24 dev eth0; ip link set eth0 up
mkdir -p /mnt; mount -t virtiofs data /mnt || echo GIO-ERROR virtiofs
for w in $1; do
  for k in \$(seq 1 $REPEAT); do
    case \$w in
      net) r=\$(guest-io-tool send $HOST_IP $PORT $NET_MIB) ;;
      blk-read) r=\$(guest-io-tool read /dev/vda $BLK_MIB direct) ;;
      blk-write) r=\$(guest-io-tool write /dev/vda $BLK_MIB direct) ;;
      fs-read) echo 3 >/proc/sys/vm/drop_caches; r=\$(guest-io-tool read /mnt/big $FS_MIB) ;;
      fs-write) r=\$(guest-io-tool write /mnt/out $FS_MIB) && rm -f /mnt/out ;;
    esac && echo "GIO w=\$w \$r" || echo "GIO-ERROR \$w"
  done
done
umount /mnt
EOF
}
cmdline_for() { # WORKLOADS
  echo "console=ttyS0 quiet panic=-1 vmwarden.mode=oneshot vmwarden.run=$(guest_script "$1" | base64 -w0)"
}

if [ "$ACCEL" = auto ]; then
  ACCEL=tcg
  if [ -c /dev/kvm ]; then
    # A guest that boots with KVM says READY; here (a paravirtual KVM) a
    # stock kernel stops with an emulation failure instead.
    if timeout 60 "$QEMU" -nodefaults -no-user-config -display none -machine q35 -accel kvm -cpu host,-arch-capabilities \
         -m 256M -kernel "$KERNEL" -initrd "$W/initramfs.img" -append "console=ttyS0 quiet panic=-1 vmwarden.mode=oneshot" \
         -serial stdio -no-reboot 2>&1 | grep -q VMWARDEN-GUEST-READY; then
      ACCEL=kvm
    fi
  fi
fi
case "$ACCEL" in
  kvm) CPU=host,-arch-capabilities ;;
  tcg) CPU=max ;;
  *) die "VMWARDEN_GUEST_IO_ACCEL=$ACCEL: kvm, tcg or auto" ;;
esac
say "accelerator: $ACCEL ($( [ "$ACCEL" = tcg ] && echo 'KVM does not boot a guest on this machine' || echo 'KVM boots the guest'))"

# ------------------------------------------------------------ vmwarden's side
# Whether this vmwarden takes an interface's vhost and queues (the launch
# spec's own check, as the systemd suite asks it).
spec_json() { # VHOST QUEUES WITH_NET_OPTS
  local net='"tap": "'$TAP_VMW'", "bridge": "'$BR'", "mac": "'$MAC'"'
  [ "$3" = 1 ] && net="$net, \"vhost\": $1, \"queues\": $2"
  cat <<EOF
{ "version": 1, "name": "$NAME",
  "principal": { "uid": $UIDN, "gid": $UIDN },
  "hypervisor": { "kind": "qemu", "binary": "$QEMU", "accel": "$ACCEL", "machine": "q35" },
  "vcpus": $VCPUS, "memory_mib": $MEM,
  "kernel": "$KERNEL", "initrd": "$W/initramfs.img", "cmdline": "CMDLINE",
  "disks": [ { "path": "$W/disk.img", "direct": false, "discard": true } ],
  "interfaces": [ { $net } ],
  "shares": [ { "tag": "data", "source": "$W/share", "proto": "virtiofs" } ],
  "virtiofsd": { "binary": "$VIRTIOFSD", "thread_pool_size": "nproc" },
  "landlock": { "mode": "required", "read": [], "write": [] } }
EOF
}
VMW_NET_OPTS=0
spec_json true 2 1 | sed 's/CMDLINE/x/' >"$W/probe.json"
if "$BIN_DIR/vmwarden" render-unit --dropin "$NAME" --spec "$W/probe.json" >/dev/null 2>&1; then
  VMW_NET_OPTS=1
else
  say "this vmwarden has no interfaces[].vhost / .queues: its side runs vhost off, one queue"
fi
R=(--config-dir "$W/config" --runtime-root "$W/run" --state-root "$W/state")
run_vmw() { # OUT VHOST QUEUES WORKLOADS
  local out=$1 rep
  spec_json "$2" "$3" "$VMW_NET_OPTS" | sed "s|CMDLINE|$(cmdline_for "$4")|" >"$W/config/$NAME.json"
  timeout "$BOOT_TIMEOUT" nsenter --net="/run/netns/$NS" "$BIN_DIR/vmwarden-launch" "${R[@]}" "$NAME" >"$out" 2>"$out.err" \
    || say "vmwarden-launch exited $? (see $out.err)"
  rep=$(nsenter --net="/run/netns/$NS" "$BIN_DIR/vmwarden-cleanup" "${R[@]}" "$NAME" 2>>"$out.err") \
    || die "vmwarden-cleanup failed after a run: $rep $(tail -3 "$out.err")"
}

# ------------------------------------------------------------ microvm.nix's side
# microvm.nix's tap-up makes the tap multi-queue only when the VM has more
# than one vCPU: one of each, on the bridge.
ip -n "$NS" tuntap add name "$TAP_MVN" mode tap vnet_hdr multi_queue
ip -n "$NS" tuntap add name "$TAP_MVN1" mode tap vnet_hdr
for t in "$TAP_MVN" "$TAP_MVN1"; do ip -n "$NS" link set "$t" master "$BR" up; done
# microvm.nix passes --rlimit-nofile 1048576 as root; a root without
# CAP_SYS_RESOURCE (a container) cannot raise its hard limit, and virtiofsd
# then refuses to start: the hard limit it has, when lower.
NOFILE=$(ulimit -Hn)
[ "$NOFILE" = unlimited ] || [ "$NOFILE" -gt 1048576 ] && NOFILE=1048576
run_mvn() { # OUT VHOST QUEUES AIO WORKLOADS
  local out=$1 vhost=$2 queues=$3 aio=$4 sock=$W/mvn-virtiofs.sock vpid netdev device
  rm -f "$sock"
  "$VIRTIOFSD" --socket-path="$sock" --shared-dir="$W/share" --rlimit-nofile "$NOFILE" \
    --thread-pool-size "$(nproc)" --posix-acl --xattr --cache=auto --inode-file-handles=prefer \
    >"$out.virtiofsd" 2>&1 &
  vpid=$!
  PIDS+=("$vpid")
  # ready once it listens (it says so after listen(2); the socket file
  # exists from bind(2) on)
  for _ in $(seq 1 400); do grep -q 'Waiting for vhost-user socket connection' "$out.virtiofsd" 2>/dev/null && break; sleep 0.05; done
  local tap=$TAP_MVN1
  [ "$queues" -gt 1 ] && tap=$TAP_MVN
  netdev="tap,id=$tap,ifname=$tap,script=no,downscript=no"
  device="virtio-net-pci,netdev=$tap,mac=$MAC,romfile="
  [ "$vhost" = true ] && netdev="$netdev,vhost=on"
  if [ "$queues" -gt 1 ]; then
    netdev="$netdev,queues=$queues"
    device="$device,mq=on,vectors=$((2 * queues + 2))"
  fi
  timeout "$BOOT_TIMEOUT" nsenter --net="/run/netns/$NS" "$QEMU" -name "$NAME" \
    -M "q35,accel=$ACCEL,acpi=on,mem-merge=on" -m "${MEM}M" -smp "$VCPUS" -nodefaults -no-user-config -no-reboot \
    -kernel "$KERNEL" -initrd "$W/initramfs.img" \
    -chardev stdio,id=stdio,signal=off -device virtio-rng-pci -serial chardev:stdio \
    -cpu "$CPU" -device i8042 -append "$(cmdline_for "$5")" \
    -nographic -sandbox on \
    -drive "id=vda,format=raw,file=$W/disk.img,if=none,aio=$aio,discard=unmap,read-only=off" \
    -device virtio-blk-pci,drive=vda \
    -numa node,memdev=mem -object "memory-backend-memfd,id=mem,size=${MEM}M,share=on" \
    -chardev "socket,id=fs0,path=$sock" -device vhost-user-fs-pci,chardev=fs0,tag=data \
    -netdev "$netdev" -device "$device" </dev/null >"$out" 2>"$out.err" \
    || say "qemu exited $? (see $out.err)"
  kill "$vpid" 2>/dev/null || true
  wait "$vpid" 2>/dev/null || true
}

# ------------------------------------------------------------ the rounds
ALL="net blk-read blk-write fs-read fs-write"
# vhost where the host has the kernel's vhost-net; both sides alike.
VHOST=false
if [ -c /dev/vhost-net ]; then VHOST=true; else
  say "no /dev/vhost-net on this host (its kernel has no vhost_net): both sides run vhost off, and vhost on/off is not measured"
fi
# NAME SIDE VHOST QUEUES AIO WORKLOADS (SIDE: vmw | mvn)
CONFIGS=(
  "vmw vmw $VHOST 2 threads $ALL"
  "mvn mvn $VHOST 2 io_uring $ALL"
  "mvn-threads mvn $VHOST 2 threads blk-read blk-write"
)
if [ "$VMW_NET_OPTS" = 1 ]; then
  [ "$VHOST" = false ] || CONFIGS+=("vmw-novhost vmw false 2 threads net")
  CONFIGS+=("vmw-1q vmw $VHOST 1 threads net")
else
  [ "$VHOST" = false ] || CONFIGS+=("mvn-novhost mvn false 2 io_uring net")
  CONFIGS+=("mvn-1q mvn $VHOST 1 io_uring net")
fi
RES=$W/results.txt
: >"$RES"
say "$ROUNDS rounds of ${#CONFIGS[@]} boots; net $NET_MIB MiB, blk $BLK_MIB MiB, fs $FS_MIB MiB; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
  n=${#CONFIGS[@]}
  for k in $(seq 0 $((n - 1))); do
    c=${CONFIGS[$(((k + r - 1) % n))]}
    read -r cname side vhost queues aio wl <<<"$c"
    out=$W/out/$cname.$r
    t=$SECONDS
    case "$side" in
      vmw) run_vmw "$out" "$vhost" "$queues" "$wl" ;;
      mvn) run_mvn "$out" "$vhost" "$queues" "$aio" "$wl" ;;
    esac
    got=$(grep -a '^GIO w=' "$out" | tr -d '\r' || true)
    [ -n "$got" ] || die "$cname round $r: no results (guest console: $(tr -d '\r' <"$out" | tail -5 | tr '\n' ' '); $(tail -3 "$out.err" | tr '\n' ' '))"
    if grep -aq 'GIO-ERROR' "$out"; then die "$cname round $r: $(grep -a GIO-ERROR "$out" | tr -d '\r' | tr '\n' ' ')"; fi
    printf '%s\n' "$got" | sed "s/^GIO /$r $cname /" >>"$RES"
    say "round $r $cname ($((SECONDS - t)) s): $(printf '%s\n' "$got" | awk '{split($3,b,"=");split($4,n,"="); printf "%s %.1f; ", substr($2,3), b[2]*1e3/n[2]}') MB/s"
  done
done

# ------------------------------------------------------------ figures
# MB/s per (round, config, workload); each ratio the median over rounds of
# A ÷ B in the same round; medians of the throughputs beside it.
awk -v rounds="$ROUNDS" -v accel="$ACCEL" -v opts="$VMW_NET_OPTS" -v vhost="$VHOST" '
  function med(arr, n,   i, j, t) {
    for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
    return n % 2 ? arr[(n + 1) / 2] : (arr[n / 2] + arr[n / 2 + 1]) / 2
  }
  function ratio(a, b, w,   r, n, v) {
    n = 0
    for (r = 1; r <= rounds; r++) if ((r, a, w) in mbs && (r, b, w) in mbs) v[++n] = mbs[r, a, w] / mbs[r, b, w]
    return n ? med(v, n) : -1
  }
  function m(c, w,   r, n, v) {
    n = 0
    for (r = 1; r <= rounds; r++) if ((r, c, w) in mbs) v[++n] = mbs[r, c, w]
    return n ? med(v, n) : -1
  }
  {
    split($3, w, "="); split($4, b, "="); split($5, t, "=")
    v = b[2] * 1e3 / t[2]
    if (!(($1, $2, w[2]) in mbs) || v > mbs[$1, $2, w[2]]) mbs[$1, $2, w[2]] = v
  }
  END {
    printf "\n== guest I/O, %s, %d rounds interleaved (median MB/s; ratio = median of the per-round ratios)\n", accel, rounds
    printf "  %-10s %12s %12s %8s\n", "workload", "vmwarden", "microvm.nix", "ratio"
    split("net blk-read blk-write fs-read fs-write", W, " ")
    for (i = 1; i <= 5; i++) printf "  %-10s %12.1f %12.1f %8.3f\n", W[i], m("vmw", W[i]), m("mvn", W[i]), ratio("vmw", "mvn", W[i])
    printf "\n== per option (same run)\n"
    side = opts == 1 ? "vmw" : "mvn"; who = opts == 1 ? "vmwarden" : "microvm.nix flags"
    if (vhost == "true")
      printf "  vhost on / off, net (%s)%*s %.3f  (%.1f / %.1f MB/s)\n", who, 20 - length(who), "", ratio(side, side "-novhost", "net"), m(side, "net"), m(side "-novhost", "net")
    else
      printf "  vhost on / off, net: not measured (no /dev/vhost-net on this host)\n"
    printf "  2 queues / 1, net (%s)%*s %.3f  (%.1f / %.1f MB/s)\n", who, 22 - length(who), "", ratio(side, side "-1q", "net"), m(side, "net"), m(side "-1q", "net")
    printf "  io_uring / threads, blk-read (microvm.nix)  %.3f  (%.1f / %.1f MB/s)\n", ratio("mvn", "mvn-threads", "blk-read"), m("mvn", "blk-read"), m("mvn-threads", "blk-read")
    printf "  io_uring / threads, blk-write (microvm.nix) %.3f  (%.1f / %.1f MB/s)\n", ratio("mvn", "mvn-threads", "blk-write"), m("mvn", "blk-write"), m("mvn-threads", "blk-write")
    printf "  the sandbox alone, both aio=threads: blk-read %.3f, blk-write %.3f (vmwarden / microvm.nix flags with threads)\n", ratio("vmw", "mvn-threads", "blk-read"), ratio("vmw", "mvn-threads", "blk-write")
    printf "\nguest-io: net %.2f, blk-read %.2f, blk-write %.2f, fs-read %.2f, fs-write %.2f (vmwarden / microvm.nix flags, same run, %d rounds)\n",
      ratio("vmw", "mvn", "net"), ratio("vmw", "mvn", "blk-read"), ratio("vmw", "mvn", "blk-write"),
      ratio("vmw", "mvn", "fs-read"), ratio("vmw", "mvn", "fs-write"), rounds
  }' "$RES" >"$W/summary.txt"
say "took $((SECONDS - T_ALL)) s; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$W/summary.txt"
