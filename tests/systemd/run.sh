#!/usr/bin/env bash
# Real systemd drives microvm@.service: the CI stage.
#
#   tests/systemd/run.sh            the scenarios (needs target/release binaries)
#   tests/systemd/run.sh --smoke    infrastructure self-test without vmwarden:
#                                   L2 boots, a hand-written unit runs a nested
#                                   KVM guest with a credential, host parses
#
# What happens:
#   1. tests/setup-host.sh (idempotent), build-rootfs.sh (cached Debian bookworm
#      systemd tree), tests/assets/build-guest.sh (cached nested-guest kernel +
#      initramfs)
#   2. per-run layer on a hard-linked copy of the cached tree: the vmwarden
#      binaries, the units from `vmwarden render-unit`, specs a/b (and a broken c),
#      credentials with LoadCredential= drop-ins, the nested-guest assets, the
#      scenario runner; packed with mkfs.ext4 -d (plus an empty results disk)
#   3. boots it as the L2 guest under QEMU TCG (-cpu max: nested SVM, so the
#      nested L3 guests run with KVM inside), serial console to serial.log
#   4. reads results.txt from the results disk (falls back to the serial log),
#      prints "systemd: N passed, M failed", exits non-zero on any failed
#      scenario, on a missing final line and on the overall timeout
#
# Environment:
#   VMWARDEN_BIN_DIR               vmwarden binaries (default <repo>/target/release)
#   VMWARDEN_FAULT_LAUNCH          a vmwarden-launch of the fault-injection build
#                                  (default <repo>/target/debug/vmwarden-launch, which
#                                  `cargo test --features fault-injection` builds):
#                                  pci_passthrough kills it after every launch step
#   VMWARDEN_SYSTEMD_OUT           artifacts dir (default <repo>/target/systemd-test)
#   VMWARDEN_SYSTEMD_TIMEOUT       overall guest timeout in s (default 3300; 10500
#                                  when VMWARDEN_SYSTEMD_ONLY names fifty_units)
#   VMWARDEN_SYSTEMD_WEDGE         s of console silence (no heartbeat) after
#                                  which an L2 guest counts as wedged (300)
#   VMWARDEN_SYSTEMD_SCENARIO_LIMIT  s after which a scenario counts as stuck
#                                  and its commands are killed (900)
#   VMWARDEN_SYSTEMD_EXTRA_ENV     "K=V K2=V2": Environment= drop-in for microvm@.service
#                                  in the guest (e.g. VMWARDEN_TEST_SKIP_DELETE=control)
#   VMWARDEN_SYSTEMD_ONLY          run only these scenarios (space separated names), in one
#                                  L2 guest
#   VMWARDEN_SYSTEMD_SHARDS        1: the default run in one L2 guest instead of the
#                                  SHARD_LISTS' guests side by side (see step 3)
#   VMWARDEN_SYSTEMD_SOAK_CYCLES   cycles of the soak scenario (default 50 when
#                                  VMWARDEN_SYSTEMD_ONLY is set, 5 in the default run)
#   VMWARDEN_HV_ATTRIB             1 (or a number of rounds, at least 5): hv_bench also
#                                  attributes start->running to what the unit has and
#                                  the floor lacks (scenarios.sh, bench_attrib)
#   VMWARDEN_SYSTEMD_L3_ACCEL      kvm (default) | tcg: accel of the nested guests
#   VMWARDEN_SYSTEMD_MACHINE       L2 machine type: microvm (default) | q35 | pc
#   VMWARDEN_SYSTEMD_MEM           L2 memory in MiB (default 3072)
#   VMWARDEN_SYSTEMD_CPU, VMWARDEN_SYSTEMD_TCG, VMWARDEN_SYSTEMD_SMP   L2 -cpu,
#                                  -accel and -smp (defaults max,-cx16,
#                                  tcg,thread=multi and 1; see the comments there)
#   VMWARDEN_SYSTEMD_KEEP=1        keep the per-run images in the work dir
#   VMWARDEN_TEST_CACHE, VMWARDEN_TEST_ASSETS   cache locations (see the builders)
#   VMWARDEN_TEST_CARGO_ROOT       where tests/setup-host.sh cargo-installs virtiofsd and
#                                  vhost-device-vsock (default /var/cache/vmwarden-test/cargo)
#   VMWARDEN_TEST_HYPERVISORS      cloud-hypervisor and firecracker for the
#                                  cloud_hypervisor and firecracker scenarios (default
#                                  <repo>/../shared/hypervisors/bin; required in full mode
#                                  when those scenarios run)
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
MODE=full
case "${1:-}" in
  "") ;;
  --smoke) MODE=smoke ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [--smoke]" >&2; exit 2 ;;
esac

BIN_DIR=${VMWARDEN_BIN_DIR:-$REPO/target/release}
FAULT_LAUNCH=${VMWARDEN_FAULT_LAUNCH:-$REPO/target/debug/vmwarden-launch}
HELPER_DIR=${VMWARDEN_TEST_CARGO_ROOT:-/var/cache/vmwarden-test/cargo}/bin
OUTDIR=${VMWARDEN_SYSTEMD_OUT:-$REPO/target/systemd-test}
EXTRA_ENV=${VMWARDEN_SYSTEMD_EXTRA_ENV:-}
ONLY=${VMWARDEN_SYSTEMD_ONLY:-}
# fifty_units (run only when named) may take its own watchdog limit
# (scenarios.sh's LIMIT_fifty_units, 7200 s) on top of what the rest needs
case " $ONLY " in *" fifty_units "*) TIMEOUT_DEFAULT=$((3300 + 7200)) ;; *) TIMEOUT_DEFAULT=3300 ;; esac
TIMEOUT=${VMWARDEN_SYSTEMD_TIMEOUT:-$TIMEOUT_DEFAULT}
L3_ACCEL=${VMWARDEN_SYSTEMD_L3_ACCEL:-kvm}
MACHINE=${VMWARDEN_SYSTEMD_MACHINE:-microvm}
MEM=${VMWARDEN_SYSTEMD_MEM:-3072}
KEEP=${VMWARDEN_SYSTEMD_KEEP:-0}

die() { echo "systemd: ERROR: $*" >&2; echo "systemd: 0 passed, 1 failed (setup error)"; exit 1; }
log() { echo "systemd: $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b - a}'; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
T_ALL=$(now)
mkdir -p "$OUTDIR"
rm -rf "$OUTDIR"/{serial.log,results.txt,scenarios.log,journal.txt,timings.txt,qemu.out,shard-*}
TIMINGS=$OUTDIR/timings.txt
timing() { echo "$1=$2" >>"$TIMINGS"; log "time $1: $2 s"; }

# ---------------------------------------------------------------- 1. inputs
if [ -x "$REPO/tests/setup-host.sh" ]; then
  "$REPO/tests/setup-host.sh" >/dev/null || die "tests/setup-host.sh failed"
fi
for c in qemu-system-x86_64 mkfs.ext4 debugfs cp; do
  command -v "$c" >/dev/null 2>&1 || die "missing $c"
done

t=$(now)
CACHE=$("$HERE/build-rootfs.sh") || die "build-rootfs.sh failed"
timing rootfs_cache "$(since "$t")"
# shellcheck source=/dev/null
. "$CACHE/info.env"
log "rootfs cache $CACHE (kernel $KVER; its debootstrap took ${DEBOOTSTRAP_S}s when built)"

t=$(now)
[ -x "$REPO/tests/assets/build-guest.sh" ] || die "tests/assets/build-guest.sh missing"
ASSETS_ENV=$("$REPO/tests/assets/build-guest.sh" | tail -1) || die "build-guest.sh failed"
# shellcheck source=/dev/null
. "$ASSETS_ENV"
[ -r "$KERNEL" ] && [ -r "$INITRD" ] || die "nested-guest assets missing ($KERNEL, $INITRD)"
# The shares guest (Debian's generic kernel: 9p, ext4, the vsock transport;
# /init runs `vmwarden.run=<base64 script>`) for the vol and vsk scenarios.
SHARES_ENV=$("$REPO/tests/assets/build-guest-shares.sh" | tail -1) || die "build-guest-shares.sh failed"
SH_KERNEL=$(. "$SHARES_ENV" && echo "$KERNEL")
SH_INITRD=$(. "$SHARES_ENV" && echo "$INITRD")
[ -r "$SH_KERNEL" ] && [ -r "$SH_INITRD" ] || die "shares-guest assets missing ($SH_KERNEL, $SH_INITRD)"
timing guest_assets "$(since "$t")"

# cloud-hypervisor and firecracker boot the shares guest's kernel as an ELF
# vmlinux (firecracker takes nothing else; cloud-hypervisor through its PVH
# entry); Debian ships the bzImage only.
want_scenario() { [ -z "$ONLY" ] || printf ' %s ' "$ONLY" | grep -q " $1 "; }
HV_SCENARIOS=0
if [ "$MODE" = full ] && { want_scenario cloud_hypervisor || want_scenario firecracker || want_scenario hv_bench \
                            || want_scenario guest_reboot || want_scenario hibernate_cloud_hypervisor \
                            || want_scenario hibernate_firecracker; }; then
  HV_SCENARIOS=1
  HV_BIN_DIR=${VMWARDEN_TEST_HYPERVISORS:-$REPO/../shared/hypervisors/bin}
  for b in cloud-hypervisor firecracker; do
    [ -x "$HV_BIN_DIR/$b" ] || die "$HV_BIN_DIR/$b missing (set VMWARDEN_TEST_HYPERVISORS, or select scenarios without it by VMWARDEN_SYSTEMD_ONLY)"
  done
fi

if [ "$MODE" = full ]; then
  for b in vmwarden vmwarden-launch vmwarden-cleanup vmwarden-machined; do
    [ -x "$BIN_DIR/$b" ] || die "$BIN_DIR/$b missing: run cargo build --release first (or set VMWARDEN_BIN_DIR)"
  done
  # The helper daemons of the vfs scenario (virtiofs shares, user vsock),
  # built by tests/setup-host.sh. They run in L2 against L2's own libraries:
  # each one they link must be in the cached tree (libseccomp2 and
  # libcap-ng0 come with systemd there).
  for b in virtiofsd vhost-device-vsock; do
    [ -x "$HELPER_DIR/$b" ] || die "$HELPER_DIR/$b missing: run tests/setup-host.sh (or set VMWARDEN_TEST_CARGO_ROOT)"
    for lib in $(ldd "$HELPER_DIR/$b" | awk '$2 == "=>" {print $1}'); do
      [ -n "$(find "$CACHE/tree/usr/lib" -name "$lib" -print -quit)" ] \
        || die "$b needs $lib, which the L2 rootfs lacks: add its package in build-rootfs.sh"
    done
  done
fi

# ---------------------------------------------------------------- 2. per-run image
QPID=""
WORK=$(mktemp -d "${TMPDIR:-/var/tmp}/vmwarden-systemd.XXXXXX")
finish() {
  if [ -n "$QPID" ]; then
    # shellcheck disable=SC2086
    kill $QPID 2>/dev/null && { sleep 2; kill -9 $QPID 2>/dev/null || true; }
  fi
  if [ "$KEEP" = 1 ]; then log "kept work dir $WORK"; else rm -rf --one-file-system "$WORK"; fi
}
trap finish EXIT
# each guest's QMP socket is WORK/qmp-I-T.sock: a unix socket's path has 107 bytes
[ "$(printf %s "$WORK" | wc -c)" -le 90 ] || die "work dir $WORK is too long for a QMP socket path in it (set TMPDIR shorter)"
t=$(now)
ROOT=$WORK/root
# Hard links: fast, and the cache stays untouched as long as no existing file is
# written in place. put() and unshare() replace files instead.
cp -al "$CACHE/tree" "$ROOT"

put() { # SRC DEST MODE
  mkdir -p "$(dirname "$ROOT$2")"; rm -f "$ROOT$2"; install -m "$3" "$1" "$ROOT$2"
}
putc() { # DEST MODE < content
  local tmp; tmp=$(mktemp "$WORK/put.XXXXXX"); cat >"$tmp"; put "$tmp" "$1" "$2"; rm -f "$tmp"
}
unshare() { # DEST...: break the hard link to the cache before a tool edits the file
  local f; for f in "$@"; do [ -e "$ROOT$f" ] || continue; cp -p "$ROOT$f" "$ROOT$f.unshare"; mv -f "$ROOT$f.unshare" "$ROOT$f"; done
}

# VM principals (an operator does this once per VM on a non-Nix host)
unshare /etc/passwd /etc/group /etc/shadow /etc/gshadow
systemd-sysusers --root="$ROOT" "$HERE/guest/sysusers.conf" >/dev/null 2>&1 \
  || chroot "$ROOT" /bin/sh -c 'groupadd --system nixbld; for v in a b c vol vsk vfs ch fc chb fcb chh fch cx ops rbq rbc rbf rbv st own vnq mvt pci pc2 usb us2 hub mtr res hbq; do useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin vm-$v; done
      useradd --system --gid kvm --no-create-home --home-dir /var/lib/microvms --shell /usr/sbin/nologin microvm' \
  || die "cannot create the VM principals"
grep -q '^vm-c:' "$ROOT/etc/passwd" && grep -q '^microvm:' "$ROOT/etc/passwd" || die "VM principals missing after sysusers"
# /dev/kvm: Debian's udev rule gives it to group kvm, 0660; the kvm module must load
printf 'kvm_amd\n' | putc /etc/modules-load.d/vmwarden-test-kvm.conf 0644
# pci_passthrough: VFIO (its L2 machine has an emulated IOMMU; elsewhere
# vfio-pci loads and binds nothing)
printf 'vfio_iommu_type1\nvfio-pci\n' | putc /etc/modules-load.d/vmwarden-test-vfio.conf 0644

# nested-guest assets (world-readable: QEMU runs as the VM's principal)
put "$KERNEL" /opt/vmwarden-test/assets/vmlinuz 0644
put "$INITRD" /opt/vmwarden-test/assets/initramfs.img 0644
put "$SH_KERNEL" /opt/vmwarden-test/assets-shares/vmlinuz 0644
put "$SH_INITRD" /opt/vmwarden-test/assets-shares/initramfs.img 0644
# busybox for L2's bridge and ping (cloud_hypervisor, firecracker, vhost_net)
put "$(command -v busybox)" /opt/vmwarden-test/bin/busybox 0755
# fifty_units' lock table (strace of one launch, as tests/bench/scale.sh's)
if [ -n "$ONLY" ] && want_scenario fifty_units; then
  put "$(command -v strace)" /opt/vmwarden-test/bin/strace 0755 || die "fifty_units needs strace on the host (tests/setup-host.sh)"
  put "$REPO/tests/bench/lock-table.awk" /opt/vmwarden-test/lock-table.awk 0644
fi
if [ "$HV_SCENARIOS" = 1 ]; then
  "$REPO/tests/assets/extract-vmlinux.sh" "$SH_KERNEL" "$WORK/vmlinux" || die "extract-vmlinux.sh $SH_KERNEL failed"
  put "$WORK/vmlinux" /opt/vmwarden-test/assets-shares/vmlinux 0644
  rm -f "$WORK/vmlinux"
  # the bench's start-to-running timer (L2 has no compiler)
  cc -static -Os -o "$WORK/api-running" "$HERE/guest/api-running.c" || die "cc -static guest/api-running.c failed"
  put "$WORK/api-running" /opt/vmwarden-test/bin/api-running 0755
fi
# vol's read-only 9p share: root's, readable by the principal
echo "from the L2 host" | putc /opt/vmwarden-test/share/hello 0644
chmod 0755 "$ROOT/opt/vmwarden-test" "$ROOT/opt/vmwarden-test/assets" \
  "$ROOT/opt/vmwarden-test/assets-shares" "$ROOT/opt/vmwarden-test/share"
# vfs's writable virtiofs share: the principal's own directory (the launcher
# refuses a writable share of anybody else), below a root-owned parent
VFS_UID=$(awk -F: '$1 == "vm-vfs" {print $3 ":" $4}' "$ROOT/etc/passwd")
[ -n "$VFS_UID" ] || die "principal vm-vfs missing after sysusers"
install -d -m 0755 "$ROOT/var/lib/vmwarden-test"
install -d -m 0700 -o "${VFS_UID%:*}" -g "${VFS_UID#*:}" "$ROOT/var/lib/vmwarden-test/vfs-rw"

# per-run secrets (text, so the "not on the command line" check can grep them).
# "systemd" credentials live where `render-unit --dropin` points LoadCredential=
# (/etc/vmwarden/credentials/<vm>/<name>, root 0400); "path" credentials anywhere.
CREDDIR=/etc/vmwarden/credentials
SECRETS=/etc/vmwarden-test/secrets
secret() { head -c 36 /dev/urandom | base64 | tr -d '\n=' | putc "$1" 0400; }
secret $CREDDIR/a/db-password
secret $SECRETS/a-token
secret $CREDDIR/b/token
secret $CREDDIR/cx/token
chmod 0700 "$ROOT/etc/vmwarden-test" "$ROOT$SECRETS" "$ROOT$CREDDIR" "$ROOT$CREDDIR/a" "$ROOT$CREDDIR/b" "$ROOT$CREDDIR/cx"
if [ "$MODE" = smoke ]; then
  # the smoke unit's LoadCredential= reads $SECRETS/a-<name>
  cp -p "$ROOT$CREDDIR/a/db-password" "$ROOT$SECRETS/a-db-password"
  CREDS_a="db-password:$SECRETS/a-db-password token:$SECRETS/a-token"
else
  CREDS_a="db-password:$CREDDIR/a/db-password token:$SECRETS/a-token"
fi
CREDS_b="token:$CREDDIR/b/token"
CREDS_cx="token:$CREDDIR/cx/token"

# specs: a has a LoadCredential= credential and a path credential, b one of each kind
if [ "$L3_ACCEL" = kvm ]; then L3_MACHINE=microvm; else L3_MACHINE=pc; fi
spec() { # NAME MEMORY CREDENTIALS_JSON
  cat <<EOF
{
  "version": 1,
  "name": "$1",
  "principal": { "user": "vm-$1", "group": "vm-$1" },
  "hypervisor": { "kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64",
                  "accel": "$L3_ACCEL", "machine": "$L3_MACHINE" },
  "vcpus": 1,
  "memory_mib": $2,
  "kernel": "/opt/vmwarden-test/assets/vmlinuz",
  "initrd": "/opt/vmwarden-test/assets/initramfs.img",
  "cmdline": "console=ttyS0 quiet panic=-1",
  "credentials": $3,
  "disks": [],
  "interfaces": [],
  "landlock": { "mode": "required", "read": [], "write": [] },
  "keep_on_purge": [ "identity" ]
}
EOF
}
spec a 256 '[ { "name": "db-password", "source": { "systemd": "db-password" } },
                  { "name": "token", "source": { "path": "'$SECRETS'/a-token" } } ]' \
  | putc /etc/vmwarden/vms/a.json 0644
spec b 256 '[ { "name": "token", "source": { "systemd": "token" } } ]' \
  | putc /etc/vmwarden/vms/b.json 0644
# cx: vmwarden's VM of the coexist scenario, under vmwarden@cx.service
spec cx 256 '[ { "name": "token", "source": { "systemd": "token" } } ]' \
  | putc /etc/vmwarden/vms/cx.json 0644
# c: memory_mib below the minimum; the scenario copies it into /etc/vmwarden/vms
spec c 4 '[]' | putc /opt/vmwarden-test/specs/c.json 0644
# vol: a read-only 9p share and a volume the launcher creates (ext4); its
# guest mounts both, reads the share, writes a mark on the volume; and a
# writable 9p share whose source the launcher makes (share_created), where
# the guest counts its boots.
# vsk: the kernel's vhost-vsock backend; its guest lists its virtio devices.
VOL_SCRIPT='mount -t 9p -o trans=virtio,version=9p2000.L,ro ro /mnt && echo "T-SHARE $(cat /mnt/hello)" || echo T-SHARE-FAILED
mkdir -p /vol && if mount -t ext4 /dev/vda /vol; then echo T-FS-EXT4; else echo T-VOL-MOUNT-FAILED; fi
echo "T-BEFORE $(cat /vol/mark 2>/dev/null || echo none)"
echo persisted >/vol/mark && echo T-WROTE
sync; umount /vol; umount /mnt
mkdir -p /made && if mount -t 9p -o trans=virtio,version=9p2000.L made /made; then echo boot >>/made/boots; echo "T-MADE boots=$(wc -l </made/boots) root=$(stat -c %u:%a /made)"; sync; umount /made; else echo T-MADE-MOUNT-FAILED; fi'
VSK_SCRIPT='for d in /sys/bus/virtio/devices/*; do echo "T-VIRTIO $(cat "$d/device")"; done'
# ssh over vsock (the vsock_ssh and guest_reboot scenarios): a per-run client
# key; the guest's lines (its boot id, then dropbear behind vsock port 22 with
# that key authorized; build-guest-shares.sh); L2's ssh configuration for
# vsock/<cid> and vsock-mux/<socket>, which systemd >= 256 ships as
# systemd-ssh-proxy and its ssh_config snippet (L2's systemd 252 has neither:
# guest/vsock-ssh-proxy does the same with socat), with the guest's host key
# pinned (known_hosts, StrictHostKeyChecking).
ssh-keygen -q -t ed25519 -N '' -C vmwarden-systemd-suite -f "$WORK/ssh-id" || die "ssh-keygen failed"
SSH_SCRIPT="mkdir -p /root/.ssh && echo '$(cat "$WORK/ssh-id.pub")' >/root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys
echo \"T-BOOTID \$(cat /proc/sys/kernel/random/boot_id)\"
/bin/vsock-serve 22 /usr/sbin/dropbear -i -s -r /etc/dropbear/dropbear_ed25519_host_key &"
SSH_HOST_KEY=$(. "$SHARES_ENV" && echo "${SSH_HOST_KEY:-}")
[ -n "$SSH_HOST_KEY" ] || die "$SHARES_ENV has no SSH_HOST_KEY (tests/assets/build-guest-shares.sh too old?)"
put "$WORK/ssh-id" /root/.ssh/vmwarden-test-id 0600
echo "vsock/*,vsock-mux/* $SSH_HOST_KEY" | putc /root/.ssh/vmwarden-test-known_hosts 0644
putc /root/.ssh/config 0644 <<'SSHEOF'
# run.sh: what systemd >= 256's /etc/ssh/ssh_config.d/20-systemd-ssh-proxy.conf
# does (ProxyCommand systemd-ssh-proxy), for L2's systemd 252
Host vsock/* vsock-mux/*
    ProxyCommand /opt/vmwarden-test/bin/vsock-ssh-proxy %h %p
    CheckHostIP no
    User root
    IdentityFile /root/.ssh/vmwarden-test-id
    IdentitiesOnly yes
    StrictHostKeyChecking yes
    UserKnownHostsFile /root/.ssh/vmwarden-test-known_hosts
    BatchMode yes
    ConnectTimeout 30
SSHEOF
chmod 0700 "$ROOT/root/.ssh"
put "$HERE/guest/vsock-ssh-proxy" /opt/vmwarden-test/bin/vsock-ssh-proxy 0755
VSK_SCRIPT="$VSK_SCRIPT
$SSH_SCRIPT"
# vnq: a tap on L2's bridge with the kernel's vhost-net and two queues, on
# a PCI machine with two vCPUs (so the guest runs both queue pairs).
VNQ_SCRIPT='ip addr add 10.77.0.7/24 dev eth0 && ip link set eth0 up && echo T-NET-UP
echo "T-QUEUES $(ls /sys/class/net/eth0/queues | tr "\n" " ")"'
# mvt: a macvtap in bridge mode on a veth whose other end is in a peer
# network namespace of L2 (10.78.0.1); the guest pings it.
MVT_SCRIPT='ip addr add 10.78.0.2/24 dev eth0 && ip link set eth0 up && echo T-NET-UP
for i in $(seq 1 30); do ping -c 1 -W 1 10.78.0.1 >/dev/null 2>&1 && echo T-PEER-OK && break; done'
# vfs: two virtiofs shares (the 9p share's directory read-only, a writable
# one of the principal's) and the user vsock backend: every helper daemon.
# The guest reads and writes, then leaves a vsock echo listening on port 1234.
VFS_SCRIPT='mkdir -p /vro /vrw
if mount -t virtiofs vro /vro; then echo "T-VREAD $(cat /vro/hello)"; else echo T-MOUNT-VRO-FAILED; fi
mount -t virtiofs vrw /vrw || echo T-MOUNT-VRW-FAILED
echo guest-wrote >/vrw/out && echo T-VWROTE
if echo x >/vro/evil 2>/dev/null; then echo T-RO-WRITE-SUCCEEDED; else echo T-RO-WRITE-REFUSED; fi
sync
/bin/vsock-echo 1234 &'
shares_spec() { # NAME SCRIPT EXTRA_JSON_FIELDS
  cat <<EOF
{
  "version": 1,
  "name": "$1",
  "principal": { "user": "vm-$1", "group": "vm-$1" },
  "hypervisor": { "kind": "qemu", "binary": "/usr/bin/qemu-system-x86_64",
                  "accel": "$L3_ACCEL", "machine": "$L3_MACHINE" },
  "vcpus": 1,
  "memory_mib": 256,
  "kernel": "/opt/vmwarden-test/assets-shares/vmlinuz",
  "initrd": "/opt/vmwarden-test/assets-shares/initramfs.img",
  "cmdline": "console=ttyS0 quiet panic=-1 vmwarden.run=$(printf '%s' "$2" | base64 -w0)",
  "credentials": [],
  $3,
  "landlock": { "mode": "required", "read": [], "write": [] }
}
EOF
}
shares_spec vol "$VOL_SCRIPT" '"disks": [ { "path": "/var/lib/vmwarden/vol/data.img", "serial": "vol-1",
              "create": { "size_mib": 32, "fs_type": "ext4" } } ],
  "shares": [ { "tag": "ro", "source": "/opt/vmwarden-test/share", "proto": "9p", "read_only": true },
              { "tag": "made", "source": "/var/lib/vmwarden-test/vol-made", "proto": "9p" } ],
  "keep_on_purge": [ "identity", "data.img" ]' | putc /etc/vmwarden/vms/vol.json 0644
# mtr: the metrics scenario's guest: it spins its CPU and, a few seconds
# after READY, writes 8 MiB to its volume, synced (block bytes must grow).
MTR_SCRIPT='( sleep 5; dd if=/dev/urandom of=/dev/vda bs=64k count=128 conv=fsync 2>/dev/null && echo T-WROTE ) &'
shares_spec mtr "$MTR_SCRIPT" '"disks": [ { "path": "/var/lib/vmwarden/mtr/data.img",
              "create": { "size_mib": 16, "fs_type": "ext4" } } ]' | putc /etc/vmwarden/vms/mtr.json 0644
# res: the resources scenario's guest, with every limit on its unit; some
# 20 s after READY it fills a 300 MiB tmpfs, past its MemoryMax=256M, and
# the kernel's OOM killer ends the VM.
RES_SCRIPT='( sleep 20; mkdir -p /big && mount -t tmpfs -o size=300m tmpfs /big && echo T-ALLOCATING && dd if=/dev/zero of=/big/f bs=1M count=300 2>/dev/null; echo T-ALLOCATED ) &'
shares_spec res "$RES_SCRIPT" '"resources": { "cpu_quota_percent": 150, "cpu_weight": 50, "memory_max_mib": 256,
                 "io_weight": 20, "tasks_max": 256, "cpus": "0" }' \
  | jq '.memory_mib = 384' | putc /etc/vmwarden/vms/res.json 0644
shares_spec vsk "$VSK_SCRIPT" '"vsock": { "cid": 5, "backend": "vhost" }' \
  | putc /etc/vmwarden/vms/vsk.json 0644
# pci and pc2: the L2 machine's own emulated PCI device ($PCI_ADDR, behind
# its emulated IOMMU) handed to pci; pc2 asks for the same device. The
# guest prints every PCI device it sees (vendor, device).
PCI_ADDR=0000:00:09.0
PCI_SCRIPT='for d in /sys/bus/pci/devices/*; do echo "T-PCI $(cat $d/vendor) $(cat $d/device)"; done'
for v in pci pc2; do
  shares_spec $v "$PCI_SCRIPT" '"devices": [ { "bus": "pci", "path": "'$PCI_ADDR'" } ]' \
    | jq '.hypervisor.machine = "q35"' | putc /etc/vmwarden/vms/$v.json 0644
done
# usb, us2 and hub: the L2 machine's own emulated USB keyboard (QEMU's
# usb-kbd, 0627:0001, the first device on its xHCI's USB 2 bus: bus 1,
# address 2) asked for by ids (usb) and by bus and address (us2); hub asks
# for that bus's root hub. The guest waits for the device and prints every
# USB device it sees (vendor, product).
USB_IDS=0627:0001 USB_BUS=1 USB_ADDR=2
USB_SCRIPT='for i in $(seq 1 60); do grep -qx '${USB_IDS%:*}' /sys/bus/usb/devices/*/idVendor 2>/dev/null && break; sleep 0.5; done
for d in /sys/bus/usb/devices/*; do [ -r $d/idVendor ] && echo "T-USB $(cat $d/idVendor) $(cat $d/idProduct)"; done'
for v in usb:"vendorid=0x${USB_IDS%:*},productid=0x${USB_IDS#*:}" us2:"hostbus=$USB_BUS,hostaddr=$USB_ADDR" \
         hub:"hostbus=$USB_BUS,hostaddr=1"; do
  shares_spec "${v%%:*}" "$USB_SCRIPT" '"devices": [ { "bus": "usb", "path": "'"${v#*:}"'" } ]' \
    | jq '.hypervisor.machine = "q35"' | putc "/etc/vmwarden/vms/${v%%:*}.json" 0644
done
# -- The host's own tools (the machined, console and balloon scenarios): the
# shares guest (virtio_balloon) with a shell on its serial port a moment
# after READY, registered with systemd-machined, with a console to attach
# to and a balloon without deflate-on-OOM (so the guest's MemTotal shows it).
OPS_SCRIPT="(sleep 1; setsid sh -c 'exec sh </dev/ttyS0 >/dev/ttyS0 2>&1') >/dev/null 2>&1 &"
shares_spec ops "$OPS_SCRIPT" '"balloon": { "initial_mib": 0, "deflate_on_oom": false },
  "console": true,
  "register_with_machined": true' | putc /etc/vmwarden/vms/ops.json 0644
# rbq: the guest_reboot scenario's QEMU VM: a credential, a read-only virtiofs
# share and the user vsock backend (both helper daemons, which must serve the
# guest's second boot as they served the first), reached over ssh
RBQ_SCRIPT='mkdir -p /vro; if mount -t virtiofs vro /vro; then echo "T-VREAD $(cat /vro/hello)"; umount /vro; else echo T-MOUNT-VRO-FAILED; fi'
RBQ_SCRIPT="$RBQ_SCRIPT
$SSH_SCRIPT"
secret $CREDDIR/rbq/token
chmod 0700 "$ROOT$CREDDIR/rbq"
shares_spec rbq "$RBQ_SCRIPT" '"shares": [
    { "tag": "vro", "source": "/opt/vmwarden-test/share", "proto": "virtiofs", "read_only": true } ],
  "virtiofsd": { "binary": "/usr/local/bin/virtiofsd" },
  "vsock": { "cid": 9, "backend": "user", "binary": "/usr/local/bin/vhost-device-vsock" }' \
  | jq '.credentials = [ { "name": "token", "source": { "systemd": "token" } } ]' \
  | putc /etc/vmwarden/vms/rbq.json 0644
# hbq: the hibernate_qemu and host_shutdown_restore scenarios' VM: before
# READY its guest keeps a random marker in its memory (the initramfs is
# RAM) and prints it with its uptime every second; a restore must go on
# with the same marker and a later uptime, without a second READY.
HIB_SCRIPT='cat /proc/sys/kernel/random/uuid >/marker
(while :; do read -r up _ </proc/uptime; echo "VMWARDEN-TICK up=$up marker=$(cat /marker)"; sleep 1; done) </dev/null >/dev/ttyS0 2>&1 &'
shares_spec hbq "$HIB_SCRIPT" '"hibernate": { "allowed": true }' | putc /etc/vmwarden/vms/hbq.json 0644
shares_spec vnq "$VNQ_SCRIPT" '"interfaces": [ { "tap": "vmw-vnq0", "bridge": "vmwbr0", "vhost": true, "queues": 2 } ]' \
  | jq '.vcpus = 2 | .hypervisor.machine = "pc"' | putc /etc/vmwarden/vms/vnq.json 0644
shares_spec mvt "$MVT_SCRIPT" '"interfaces": [ { "tap": "vmw-mvt0", "type": "macvtap", "mac": "02:00:00:00:78:02",
    "macvtap": { "link": "mvt-up", "mode": "bridge" } } ]' | putc /etc/vmwarden/vms/mvt.json 0644
shares_spec vfs "$VFS_SCRIPT" '"shares": [
    { "tag": "vro", "source": "/opt/vmwarden-test/share", "proto": "virtiofs", "read_only": true },
    { "tag": "vrw", "source": "/var/lib/vmwarden-test/vfs-rw", "proto": "virtiofs", "read_only": false } ],
  "virtiofsd": { "binary": "/usr/local/bin/virtiofsd" },
  "vsock": { "cid": 6, "backend": "user", "binary": "/usr/local/bin/vhost-device-vsock" }' \
  | putc /etc/vmwarden/vms/vfs.json 0644

# un: user networking through passt (the user_net scenario). The guest takes
# its address by DHCP from passt, fetches from a server on L2's loopback
# through the gateway 10.0.2.2, then serves port 22, which passt forwards from
# L2's port 2222 (every IPv4 address of L2, microvm.nix's default; the
# scenario connects on 127.0.0.1). L2 has no network interface but loopback
# (and the cloud_hypervisor scenario's bridge): nothing leaves it.
UN_SCRIPT='ip link set lo up; ip link set eth0 up
cat >/tmp/dhcp.sh <<EOS
#!/bin/sh
[ "\$1" = bound ] || exit 0
ip addr add "\$ip/\$mask" dev "\$interface"
ip route add default via "\$router"
echo "T-DHCP ip=\$ip mask=\$mask router=\$router dns=\$dns"
EOS
chmod +x /tmp/dhcp.sh
udhcpc -i eth0 -s /tmp/dhcp.sh -q -n -t 10 -T 2 2>/dev/null || echo T-DHCP-FAILED
echo "T-FETCH $(timeout 30 nc 10.0.2.2 8080 </dev/null 2>&1)"
(while :; do echo T-GUEST-SERVED | nc -l -p 22; done) >/dev/null 2>&1 &
echo T-LISTENING'
grep -q '^vm-un:' "$ROOT/etc/passwd" \
  || chroot "$ROOT" useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin vm-un \
  || die "cannot create the principal vm-un"
shares_spec un "$UN_SCRIPT" '"user_network": { "binary": "/usr/bin/passt", "id": "qemu", "mac": "02:00:00:01:01:01",
    "forward_ports": [ { "host": { "port": 2222 }, "guest": { "port": 22 } } ] }' \
  | putc /etc/vmwarden/vms/un.json 0644
# st, own: the guests microvm.nix users run (the store_share and owned_share
# scenarios). st is microvm.nix's flake template: the host's /nix/store,
# made here exactly as Nix makes it (root:nixbld 1775, a file in it), over
# 9p and read-only (writable in the template; the module makes it so), a
# created var.img volume, and the store over virtiofs too. own has a
# writable virtiofs share that its guest owns, used as journald uses
# /var/log/journal: chown, chgrp, a setgid directory.
NIXBLD_GID=$(awk -F: '$1 == "nixbld" {print $3}' "$ROOT/etc/group")
[ -n "$NIXBLD_GID" ] || die "group nixbld missing after sysusers"
install -d -m 0755 "$ROOT/nix"
install -d -m 1775 -o 0 -g "$NIXBLD_GID" "$ROOT/nix/store"
STORE_FILE=/nix/store/0vmwarden0test0store0file0000000-hello
echo "from the L2 store" | putc "$STORE_FILE" 0444
ST_SCRIPT="mkdir -p /p9 /vfs /var2
mount -t 9p -o trans=virtio,version=9p2000.L,ro ro-store /p9 || echo T-MOUNT-P9-FAILED
mount -t virtiofs -o ro vstore /vfs || echo T-MOUNT-VFS-FAILED
for m in p9 vfs; do
  echo \"T-READ-\$m \$(cat /\$m/${STORE_FILE##*/})\"
  echo \"T-STAT-\$m \$(stat -c '%u %g %a' /\$m)\"
  if touch /\$m/evil 2>/dev/null; then echo T-WRITE-\$m-SUCCEEDED; else echo T-WRITE-\$m-REFUSED; fi
done
if mount -t ext4 /dev/vda /var2; then echo T-VAR-EXT4; echo mark >/var2/mark && echo T-VAR-WROTE; umount /var2; else echo T-VAR-MOUNT-FAILED; fi
umount /p9; umount /vfs"
shares_spec st "$ST_SCRIPT" '"disks": [ { "path": "/var/lib/vmwarden/st/var.img",
              "create": { "size_mib": 32, "fs_type": "ext4" } } ],
  "shares": [ { "tag": "ro-store", "source": "/nix/store", "proto": "9p", "read_only": true },
              { "tag": "vstore", "source": "/nix/store", "proto": "virtiofs", "read_only": true } ],
  "virtiofsd": { "binary": "/usr/local/bin/virtiofsd" },
  "keep_on_purge": [ "identity", "var.img" ]' | putc /etc/vmwarden/vms/st.json 0644
OWN_UID=$(awk -F: '$1 == "vm-own" {print $3 ":" $4}' "$ROOT/etc/passwd")
[ -n "$OWN_UID" ] || die "principal vm-own missing after sysusers"
install -d -m 0700 -o "${OWN_UID%:*}" -g "${OWN_UID#*:}" "$ROOT/var/lib/vmwarden-test/own-rw"
OWN_SCRIPT='mkdir -p /j && mount -t virtiofs journal /j || echo T-MOUNT-FAILED
cd /j
mkdir log && chown 0:190 log && chmod 2755 log && echo T-SETGID-DIR-OK
mkdir log/m && echo x >log/m/system.journal && echo T-MADE-IN-IT
echo data >f && chown 1000:100 f && chgrp 190 f && chmod 640 f && echo T-OWN-OK
if chmod 2755 f 2>/dev/null; then echo T-SGID-FILE-SET; else echo T-SGID-FILE-REFUSED; fi
if chmod 4755 f 2>/dev/null; then echo T-SUID-FILE-SET; else echo T-SUID-FILE-REFUSED; fi
if chown 70000 f 2>/dev/null; then echo T-BEYOND-SET; else echo T-BEYOND-REFUSED; fi
echo "T-SEE f=$(stat -c %u:%g:%a f) log=$(stat -c %u:%g:%a log) m=$(stat -c %g:%a log/m) journal=$(stat -c %g log/m/system.journal)"
cd /; sync; umount /j'
shares_spec own "$OWN_SCRIPT" '"shares": [ { "tag": "journal", "source": "/var/lib/vmwarden-test/own-rw", "proto": "virtiofs" } ],
  "virtiofsd": { "binary": "/usr/local/bin/virtiofsd" }' | putc /etc/vmwarden/vms/own.json 0644

# ch, fc: the shares guest booted by cloud-hypervisor and firecracker (the
# cloud_hypervisor and firecracker scenarios). Each feature the scenario can
# show (a created ext4 volume, a tap on a bridge, hybrid vsock, a virtiofs
# share, a credential) goes into the spec only when the launcher's own spec
# checks (`render-unit --dropin`, Spec::validate) accept it for that
# hypervisor; a refusal is recorded with its message and the scenario reports
# it as not supported instead of checking it. What the launcher accepts, the
# scenario must then show working.
HV_BRIDGE=vmwbr0
hv_guest_script() { # IP FEATURES: what the guest does before READY
  local ip=$1 f=" $2 "
  # credentials left by the hypervisor in the initrd (systemd imports
  # /.extra/credentials/ in the initrd); fw_cfg ones are printed by /init
  echo 'for f in /.extra/credentials/*; do [ -f "$f" ] || continue; s=$(sha256sum <"$f"); echo "VMWARDEN-CRED name=${f##*/} sha256=${s%% *}"; done'
  case "$f" in *" net "*) echo "ip addr add $ip/24 dev eth0 && ip link set eth0 up && echo T-NET-UP $ip" ;; esac
  case "$f" in *" virtiofs "*) echo 'mkdir -p /vro; if mount -t virtiofs vro /vro; then echo "T-VREAD $(cat /vro/hello)"; umount /vro; else echo T-MOUNT-VRO-FAILED; fi' ;; esac
  case "$f" in *" volume "*) echo 'mkdir -p /vol; if mount -t ext4 /dev/vda /vol; then echo T-FS-EXT4; echo boot >>/vol/boots; echo "T-BOOTS $(wc -l </vol/boots)"; sync; umount /vol; else echo T-VOL-MOUNT-FAILED; fi' ;; esac
  case "$f" in *" vsock "*) echo '/bin/vsock-echo 1234 &' ;; esac
  case "$f" in *" ssh "*) printf '%s\n' "$SSH_SCRIPT" ;; esac
  echo 'sync'
}
hv_spec() { # NAME KIND CMDLINE FEATURES IP -> the spec without the features' fields
  local name=$1 kind=$2 cmdline=$3 features=$4 bin run
  case "$kind" in cloud-hypervisor) bin=/usr/local/bin/cloud-hypervisor ;; firecracker) bin=/usr/local/bin/firecracker ;; esac
  run=$(hv_guest_script "$5" "$features" | base64 -w0)
  jq -n --arg name "$name" --arg kind "$kind" --arg bin "$bin" --arg cmdline "$cmdline vmwarden.run=$run" '{
    version: 1, name: $name,
    principal: { user: ("vm-" + $name), group: ("vm-" + $name) },
    hypervisor: { kind: $kind, binary: $bin },
    vcpus: 1, memory_mib: 256,
    kernel: "/opt/vmwarden-test/assets-shares/vmlinux",
    initrd: "/opt/vmwarden-test/assets-shares/initramfs.img",
    cmdline: $cmdline,
    credentials: [], disks: [], interfaces: [],
    landlock: { mode: "required", read: [], write: [] },
    keep_on_purge: [ "identity", "data.img" ] }'
}
hv_feature() { # NAME FEATURE CID -> the JSON fragment of that feature
  case "$2" in
    volume) printf '{"disks":[{"path":"/var/lib/vmwarden/%s/data.img","create":{"size_mib":32,"fs_type":"ext4"}}]}' "$1" ;;
    net) printf '{"interfaces":[{"tap":"vmw-%s0","bridge":"%s"}]}' "$1" "$HV_BRIDGE" ;;
    vsock) printf '{"vsock":{"cid":%s,"backend":"user"}}' "$3" ;;
    virtiofs) printf '{"shares":[{"tag":"vro","source":"/opt/vmwarden-test/share","proto":"virtiofs","read_only":true}],"virtiofsd":{"binary":"/usr/local/bin/virtiofsd"}}' ;;
    creds) printf '{"credentials":[{"name":"token","source":{"systemd":"token"}}]}' ;;
    # the host's own tools: a console to attach to (refused for firecracker)
    console) printf '{"console":true}' ;;
  esac
}
hv_spec_with() { # NAME KIND CMDLINE FEATURES IP CID -> the whole spec
  local f
  hv_spec "$1" "$2" "$3" "$4" "$5" >"$WORK/hv-base.json"
  for f in $4; do hv_feature "$1" "$f" "$6"; echo; done \
    | jq -s --slurpfile base "$WORK/hv-base.json" 'reduce .[] as $x ($base[0]; . * $x)'
}
HV_ENV=""
if [ "$HV_SCENARIOS" = 1 ]; then
  secret $CREDDIR/ch/token
  secret $CREDDIR/fc/token
  secret $CREDDIR/rbc/token
  chmod 0700 "$ROOT$CREDDIR/ch" "$ROOT$CREDDIR/fc" "$ROOT$CREDDIR/rbc"
  # NAME KIND GUEST-IP VSOCK-CID CMDLINE(commas for spaces) FEATURES-TO-TRY...
  while read -r name kind ip cid cmdline tries; do
    cmdline=${cmdline//,/ }
    ok="" refused=""
    for f in $tries; do
      hv_spec_with "$name" "$kind" "$cmdline" "$ok $f" "$ip" "$cid" >"$WORK/hv-try.json"
      if out=$("$BIN_DIR/vmwarden" render-unit --dropin "$name" --spec "$WORK/hv-try.json" \
                 --credentials-dir "$CREDDIR" 2>&1 >/dev/null </dev/null); then
        ok="$ok $f"
      else
        out=$(printf '%s' "$out" | tr '\n' ' ' | head -c 300)
        refused="$refused $f: $out;"
        log "$name: the launcher refuses $f for $kind: $out"
      fi
    done
    ok=${ok# }
    hv_spec_with "$name" "$kind" "$cmdline" "$ok" "$ip" "$cid" | putc /etc/vmwarden/vms/$name.json 0644
    log "$name ($kind): features the launcher accepts: ${ok:-none}"
    HV_ENV="$HV_ENV$(printf 'HV_FEATURES_%s=%q\nHV_REFUSED_%s=%q\nHV_IP_%s=%q' "$name" "$ok" "$name" "${refused# }" "$name" "$ip")"$'\n'
    case " $ok " in
      *" creds "*) HV_ENV="$HV_ENV$(printf 'CREDS_%s=%q' "$name" "token:$CREDDIR/$name/token")"$'\n' ;;
      *) HV_ENV="${HV_ENV}CREDS_$name="$'\n' ;;
    esac
  done <<HVEOF
ch cloud-hypervisor 10.77.0.2 7 console=ttyS0,quiet,panic=-1 volume net vsock virtiofs creds console
fc firecracker 10.77.0.3 8 console=ttyS0,quiet,panic=-1,reboot=k,pci=off,i8042.noaux,i8042.nomux,i8042.dumbkbd volume net vsock creds console
rbc cloud-hypervisor 10.77.0.4 10 console=ttyS0,quiet,reboot=t,panic=-1 net vsock creds ssh
rbv cloud-hypervisor 10.77.0.6 12 console=ttyS0,quiet,reboot=t,panic=-1 vsock virtiofs ssh
rbf firecracker 10.77.0.5 11 console=ttyS0,quiet,reboot=k,panic=1,pci=off,i8042.noaux,i8042.nomux,i8042.dumbkbd net vsock ssh
HVEOF
  # chh, fch: hibernate_cloud_hypervisor, hibernate_firecracker: the same
  # guest keeping a random marker in its memory and printing it with its
  # uptime every tenth of a second (its first tick is "ready", cold or
  # restored: the tick's period bounds what a restore's figure holds of it)
  hib_run=$(printf '%s\n' 'cat /proc/sys/kernel/random/uuid >/marker' \
    '(while :; do read -r up _ </proc/uptime; echo "VMWARDEN-TICK up=$up marker=$(cat /marker)"; sleep 0.1; done) </dev/null &' | base64 -w0)
  for name in chh:cloud-hypervisor fch:firecracker; do
    case "${name#*:}" in
      firecracker) hib_cl="console=ttyS0 quiet panic=-1 reboot=k pci=off i8042.noaux i8042.nomux i8042.dumbkbd" ;;
      *) hib_cl="console=ttyS0 quiet panic=-1" ;;
    esac
    hv_spec "${name%%:*}" "${name#*:}" "$hib_cl" "" "" \
      | jq --arg c "$hib_cl vmwarden.run=$hib_run" '.cmdline = $c | .hibernate = { allowed: true }' \
      | putc "/etc/vmwarden/vms/${name%%:*}.json" 0644
    HV_ENV="${HV_ENV}CREDS_${name%%:*}="$'\n'
  done
  # the bench's VMs: the same guest, no devices
  for name in chb:cloud-hypervisor fcb:firecracker; do
    hv_spec_with "${name%%:*}" "${name#*:}" "console=ttyS0 quiet panic=-1" "" "" "" \
      | putc "/etc/vmwarden/vms/${name%%:*}.json" 0644
  done
fi

UNITDIR=/etc/systemd/system
if [ "$MODE" = full ]; then
  for b in vmwarden vmwarden-launch vmwarden-cleanup vmwarden-machined; do put "$BIN_DIR/$b" /usr/local/bin/$b 0755; done
  # pci_passthrough's kill after every launch step: the fault-injection
  # build's launcher (debug info stripped), when it is one (killed by its
  # own SIGKILL after `sanitized`); the scenario fails loudly without it
  rc=0; [ -x "$FAULT_LAUNCH" ] && { { VMWARDEN_FAULT_AFTER=sanitized "$FAULT_LAUNCH" x >/dev/null 2>&1; } 2>/dev/null || rc=$?; }
  if [ "$rc" = 137 ]; then
    strip -o "$WORK/vmwarden-launch-faults" "$FAULT_LAUNCH" \
      && put "$WORK/vmwarden-launch-faults" /usr/local/libexec/vmwarden-launch-faults 0755
  fi
  # root-owned, not writable by others, like every parent: the launcher
  # refuses helper binaries a non-root user could replace
  for b in virtiofsd vhost-device-vsock; do put "$HELPER_DIR/$b" /usr/local/bin/$b 0755; done
  if [ "$HV_SCENARIOS" = 1 ]; then
    for b in cloud-hypervisor firecracker; do put "$HV_BIN_DIR/$b" /usr/local/bin/$b 0755; done
  fi
  VMW=$BIN_DIR/vmwarden
  "$VMW" render-unit --bin-dir /usr/local/bin >"$WORK/microvm@.service" \
    || die "vmwarden render-unit --bin-dir /usr/local/bin failed"
  "$VMW" render-unit --target >"$WORK/microvms.target" || die "vmwarden render-unit --target failed"
  put "$WORK/microvm@.service" "$UNITDIR/microvm@.service" 0644
  # The metrics timer and its service, into node-exporter's textfile
  # directory as Debian's prometheus-node-exporter has it (not enabled: the
  # metrics scenario starts the service itself).
  "$VMW" render-unit --metrics-service --bin-dir /usr/local/bin >"$WORK/vmwarden-metrics.service" \
    && "$VMW" render-unit --metrics-timer >"$WORK/vmwarden-metrics.timer" || die "vmwarden render-unit --metrics-* failed"
  put "$WORK/vmwarden-metrics.service" "$UNITDIR/vmwarden-metrics.service" 0644
  put "$WORK/vmwarden-metrics.timer" "$UNITDIR/vmwarden-metrics.timer" 0644
  cp "$WORK/vmwarden-metrics.service" "$WORK/vmwarden-metrics.timer" "$OUTDIR/"
  mkdir -p "$ROOT/var/lib/prometheus/node-exporter"
  # The shutdown's hibernation (host_shutdown_restore): installed, not
  # enabled; the scenario starts and stops it as boot and shutdown do.
  "$VMW" render-unit --hibernate-on-shutdown --hibernate-timeout 240 --bin-dir /usr/local/bin \
    >"$WORK/vmwarden-hibernate-on-shutdown.service" || die "vmwarden render-unit --hibernate-on-shutdown failed"
  put "$WORK/vmwarden-hibernate-on-shutdown.service" "$UNITDIR/vmwarden-hibernate-on-shutdown.service" 0644
  cp "$WORK/vmwarden-hibernate-on-shutdown.service" "$OUTDIR/"
  put "$WORK/microvms.target" "$UNITDIR/microvms.target" 0644
  cp "$WORK/microvm@.service" "$WORK/microvms.target" "$OUTDIR/"
  # per-VM credential drop-ins (what an operator installs per VM)
  HV_VMS=""; [ "$HV_SCENARIOS" = 1 ] && HV_VMS="ch fc chb fcb rbc rbf rbv chh fch"
  for v in a b vol vsk vfs ops rbq st own vnq mvt pci pc2 usb us2 hub mtr res hbq $HV_VMS; do
    "$VMW" render-unit --dropin "$v" --spec "$ROOT/etc/vmwarden/vms/$v.json" \
      --credentials-dir "$CREDDIR" >"$WORK/dropin-$v.conf" \
      || die "vmwarden render-unit --dropin $v failed"
    put "$WORK/dropin-$v.conf" "$UNITDIR/microvm@$v.service.d/vmwarden.conf" 0644
    cp "$WORK/dropin-$v.conf" "$OUTDIR/microvm@$v.vmwarden.conf"
    case "$v" in a|b) ;; *) continue ;; esac
    # autostart: what `systemctl add-wants microvms.target microvm@$v.service` does
    mkdir -p "$ROOT$UNITDIR/microvms.target.wants"
    ln -sfn "$UNITDIR/microvm@.service" "$ROOT$UNITDIR/microvms.target.wants/microvm@$v.service"
  done
  # un's drop-in: what user networking adds to the unit (IP sockets, passt's
  # namespaces), as render-unit gives it; not in microvms.target.
  "$VMW" render-unit --dropin un --spec "$ROOT/etc/vmwarden/vms/un.json" \
    --credentials-dir "$CREDDIR" >"$WORK/dropin-un.conf" || die "vmwarden render-unit --dropin un failed"
  put "$WORK/dropin-un.conf" "$UNITDIR/microvm@un.service.d/vmwarden.conf" 0644
  cp "$WORK/dropin-un.conf" "$OUTDIR/microvm@un.vmwarden.conf"
  # The coexist scenario: vmwarden's units with the prefix `vmwarden`
  # (vmwarden@.service, vmwarden-vms.target), as a host that also runs
  # microvm.nix's host module installs them, and VM cx's drop-in under that
  # name. microvm.nix's template (a stand-in, guest/microvm-nix/) waits in
  # /opt/vmwarden-test/microvm-nix: the scenario puts it in place of
  # vmwarden's microvm@.service while it runs, as microvm.nix's host module
  # would own that name, and its VM mnix's runner in /var/lib/microvms/mnix.
  "$VMW" render-unit --prefix vmwarden --bin-dir /usr/local/bin >"$WORK/vmwarden@.service" \
    || die "vmwarden render-unit --prefix vmwarden failed"
  "$VMW" render-unit --prefix vmwarden --target >"$WORK/vmwarden-vms.target" \
    || die "vmwarden render-unit --prefix vmwarden --target failed"
  "$VMW" render-unit --prefix vmwarden --dropin cx --spec "$ROOT/etc/vmwarden/vms/cx.json" \
    --credentials-dir "$CREDDIR" >"$WORK/dropin-cx.conf" || die "vmwarden render-unit --prefix vmwarden --dropin cx failed"
  put "$WORK/vmwarden@.service" "$UNITDIR/vmwarden@.service" 0644
  put "$WORK/vmwarden-vms.target" "$UNITDIR/vmwarden-vms.target" 0644
  put "$WORK/dropin-cx.conf" "$UNITDIR/vmwarden@cx.service.d/vmwarden.conf" 0644
  cp "$WORK/vmwarden@.service" "$WORK/vmwarden-vms.target" "$OUTDIR/"
  cp "$WORK/dropin-cx.conf" "$OUTDIR/vmwarden@cx.vmwarden.conf"
  put "$HERE/guest/microvm-nix/microvm@.service" /opt/vmwarden-test/microvm-nix/microvm@.service 0644
  MVN_UID=$(awk -F: '$1 == "microvm" {print $3}' "$ROOT/etc/passwd")
  KVM_GID=$(awk -F: '$1 == "kvm" {print $3}' "$ROOT/etc/group")
  [ -n "$MVN_UID" ] && [ -n "$KVM_GID" ] || die "user microvm or group kvm missing in the L2 tree"
  for f in microvm-run microvm-shutdown; do
    put "$HERE/guest/microvm-nix/$f" /var/lib/microvms/mnix/current/bin/$f 0755
  done
  ln -sfn current "$ROOT/var/lib/microvms/mnix/booted"
  # microvm.nix's state dirs are its service user's (QEMU makes mnix.sock
  # there); the runner itself is root's, as in the Nix store
  chown "$MVN_UID:$KVM_GID" "$ROOT/var/lib/microvms" "$ROOT/var/lib/microvms/mnix"
  chown -h "$MVN_UID:$KVM_GID" "$ROOT/var/lib/microvms/mnix/booted"
else
  put "$HERE/guest/vmwarden-smoke@.service" "$UNITDIR/vmwarden-smoke@.service" 0644
  put "$HERE/guest/qmp-powerdown.sh" /opt/vmwarden-test/qmp-powerdown.sh 0755
fi
if [ -n "$EXTRA_ENV" ]; then
  { echo "# from VMWARDEN_SYSTEMD_EXTRA_ENV (run.sh)"; echo "[Service]"
    for kv in $EXTRA_ENV; do
      case "$kv" in *=*) printf 'Environment="%s"\n' "$kv" ;; *) die "VMWARDEN_SYSTEMD_EXTRA_ENV: '$kv' is not K=V" ;; esac
    done; } >"$WORK/90-test-env.conf"
  put "$WORK/90-test-env.conf" "$UNITDIR/microvm@.service.d/90-test-env.conf" 0644
  put "$WORK/90-test-env.conf" "$UNITDIR/vmwarden@.service.d/90-test-env.conf" 0644
  log "extra environment for microvm@.service and vmwarden@.service: $EXTRA_ENV"
fi

# scenario runner
put "$HERE/scenarios.sh" /opt/vmwarden-test/scenarios.sh 0755
put "$HERE/guest/vmwarden-scenarios.service" "$UNITDIR/vmwarden-scenarios.service" 0644
mkdir -p "$ROOT$UNITDIR/multi-user.target.wants"
ln -sfn ../vmwarden-scenarios.service "$ROOT$UNITDIR/multi-user.target.wants/vmwarden-scenarios.service"
# the soak: 50 cycles when named in VMWARDEN_SYSTEMD_ONLY, a short one in the default run
if [ -n "$ONLY" ]; then SOAK_DEFAULT=50; else SOAK_DEFAULT=5; fi
{ printf 'MODE=%q\nREADY_TIMEOUT=%q\nPOWEROFF=1\nONLY=%q\nL3_ACCEL=%q\nSOAK_CYCLES=%q\nSCENARIO_LIMIT=%q\n' \
    "$MODE" "${VMWARDEN_SYSTEMD_READY_TIMEOUT:-300}" "$ONLY" "$L3_ACCEL" "${VMWARDEN_SYSTEMD_SOAK_CYCLES:-$SOAK_DEFAULT}" \
    "${VMWARDEN_SYSTEMD_SCENARIO_LIMIT:-900}"
  printf 'CREDS_a=%q\nCREDS_b=%q\nCREDS_cx=%q\nCREDS_vol=\nCREDS_vsk=\nCREDS_vfs=\nCREDS_ops=\n' "$CREDS_a" "$CREDS_b" "$CREDS_cx"
  printf 'CREDS_rbq=%q\n' "token:$CREDDIR/rbq/token"
  printf 'CREDS_un=\n'
  printf 'CREDS_st=\nCREDS_own=\nSTORE_FILE=%q\n' "$STORE_FILE"
  printf 'CREDS_vnq=\nCREDS_mvt=\nCREDS_mtr=\nCREDS_res=\nCREDS_pci=\nCREDS_pc2=\nPCI_ADDR=%q\n' "$PCI_ADDR"
  printf 'CREDS_hbq=\n'
  printf 'HV_ATTRIB=%q\n' "${VMWARDEN_HV_ATTRIB:-0}"
  printf 'CREDS_usb=\nCREDS_us2=\nCREDS_hub=\nUSB_IDS=%q\nUSB_BUS=%q\nUSB_ADDR=%q\n' "$USB_IDS" "$USB_BUS" "$USB_ADDR"
  printf 'HV_BRIDGE=%q\n%s' "$HV_BRIDGE" "$HV_ENV"; } | putc /opt/vmwarden-test/run.env 0644

ROOT_IMG=$WORK/root.ext4 RES_IMG=$WORK/results.ext4
SZ=$(( $(du -sm "$ROOT" | cut -f1) + 768 ))
mkfs.ext4 -q -F -L vmw-l2root -d "$ROOT" "$ROOT_IMG" "${SZ}M" || die "mkfs.ext4 -d (root) failed"
rm -rf --one-file-system "$ROOT"
truncate -s 64M "$RES_IMG"
mkfs.ext4 -q -F -L vmw-results "$RES_IMG" || die "mkfs.ext4 (results) failed"
timing image_build "$(since "$t")"

# ---------------------------------------------------------------- 3. boot L2
# The default run boots SHARDS copies of the image side by side, each running
# its own list of scenarios (the kernel command line's vmwarden.only=, read by
# scenarios.sh): each L2 guest has one TCG vCPU, so on a machine with two
# cores two guests take about half the time of one. Every scenario of
# scenarios.sh is in exactly one list (all_clean in each: it audits what its
# own guest ran); run.sh refuses to start otherwise. With
# VMWARDEN_SYSTEMD_ONLY (or VMWARDEN_SYSTEMD_SHARDS=1) one guest runs the
# scenarios in scenarios.sh's order. The lists are balanced by the
# scenarios' times in timings.txt; keep scenarios that share VMs (a, b: from
# start_ab to target_stop) in one list.
SHARD_LISTS=(
  "unit_verify start_ab stop_a kill_b restart_b target_stop broken_spec share_volume share_created vhost_vsock vsock_ssh virtiofs_vsock guest_reboot macvtap resources all_clean"
  "user_net store_share owned_share vhost_net cloud_hypervisor firecracker hibernate_cloud_hypervisor hibernate_firecracker hv_bench console balloon guest_bytes machined coexist metrics soak all_clean"
  "pci_passthrough usb_passthrough hibernate_qemu host_shutdown_restore all_clean"
)
# The scenarios below scenarios.sh's "# a measurement only, when named"
# comment run only when VMWARDEN_SYSTEMD_ONLY names them: they are in no list.
ALL_SCENARIOS=$(sed -n '/^  run_scenario unit_verify /,/^  # a measurement only, when named/s/^  run_scenario \([a-z0-9_]*\) .*/\1/p' "$HERE/scenarios.sh")
[ -n "$ALL_SCENARIOS" ] || die "no scenario list found in scenarios.sh"
if [ "$MODE" = smoke ] || [ -n "$ONLY" ] || [ "${VMWARDEN_SYSTEMD_SHARDS:-2}" = 1 ]; then
  SHARD_LISTS=("$ONLY")
else
  for n in $ALL_SCENARIOS; do
    c=0; for l in "${SHARD_LISTS[@]}"; do printf ' %s ' "$l" | grep -q " $n " && c=$((c + 1)); done
    want=1; [ "$n" = all_clean ] && want=${#SHARD_LISTS[@]}
    [ "$c" = "$want" ] || die "scenario $n is in $c of run.sh's SHARD_LISTS (want $want): add it to one list"
  done
  for l in "${SHARD_LISTS[@]}"; do for n in $l; do
    printf ' %s ' $ALL_SCENARIOS | grep -q " $n " || die "SHARD_LISTS names $n, which scenarios.sh does not run"
  done; done
fi
NSHARDS=${#SHARD_LISTS[@]}
# nokaslr: a wedged guest's RIP can be compared across runs (vcpu_state)
APPEND="console=ttyS0 panic=-1 quiet mitigations=off nokaslr"
case "$MACHINE" in
  microvm) BLK=virtio-blk-device
           # microvm + TCG hangs in TSC calibration without it (ENVIRONMENT.md)
           APPEND="$APPEND tsc_early_khz=$(awk '/cpu MHz/{printf "%d", $4*1000; exit}' /proc/cpuinfo)" ;;
  q35|pc)  BLK=virtio-blk-pci ;;
  *) die "VMWARDEN_SYSTEMD_MACHINE=$MACHINE: microvm, q35 or pc" ;;
esac
# -cx16: QEMU 7.2's TCG corrupts EFLAGS around cmpxchg16b, and Linux 6.12's SLUB
# fast path (this_cpu_try_cmpxchg128) then oopses within seconds of boot, 9 boots
# in 10. Without CX16 the kernel takes the locked slow path; 4 of 4 boots clean.
# -cpu max keeps SVM, so KVM works inside for the nested guests.
L2_CPU=${VMWARDEN_SYSTEMD_CPU:-max,-cx16}
# One vCPU: with two, the L2 kernel sometimes oopses on an int3 left over from
# its own text patching (static keys flipped when KVM creates or destroys a
# VM): multi-threaded TCG let the other vCPU run the stale int3 after the patch
# had completed. thread=single with two vCPUs avoids that too, but then the
# nested guests do not reach READY within 300 s.
L2_TCG=${VMWARDEN_SYSTEMD_TCG:-tcg,thread=multi}
L2_SMP=${VMWARDEN_SYSTEMD_SMP:-1}
# Shard i's files: serial.log etc. directly in OUTDIR with one shard,
# OUTDIR/shard-i/ with several (OUTDIR's results.txt, scenarios.log and
# journal.txt are then the shards' put together).
shard_dir() { if [ "$NSHARDS" = 1 ]; then echo "$OUTDIR"; else echo "$OUTDIR/shard-$1"; fi; }
# A guest is a shard's run in one L2 VM: G_DIR, G_LIST (its scenarios),
# G_PID (QEMU), G_RES (its results disk), G_LABEL and G_OF (the shard it
# runs; a rerun has the shard's number), G_TRY (0 for the shard's first
# guest, then 1, 2 for its reruns). Every guest boots a copy of ROOT_IMG,
# which stays as mkfs made it: a rerun boots the same image.
G_DIR=() G_LIST=() G_PID=() G_RES=() G_LABEL=() G_OF=() G_SUPERSEDED=() G_TRY=()
QPIDS=()
for i in $(seq 1 "$NSHARDS"); do
  cp --sparse=always "$ROOT_IMG" "$WORK/root-$i.ext4" && cp --sparse=always "$RES_IMG" "$WORK/results-$i.ext4" \
    || die "cannot copy the image for shard $i"
done
boot_guest() { # SHARD DIR IMAGE RESULTS_IMAGE LIST LABEL
  local i=$1 d=$2 img=$3 res=$4 only=$5 label=$6 try=${7:-0} g
  mkdir -p "$d"; rm -f "$d"/{serial.log,results.txt,scenarios.log,journal.txt,qemu.out} "$WORK/qmp-$i-$try.sock"
  shard_append=$APPEND shard_machine=(-machine "$MACHINE") shard_blk=$BLK
  [ -n "$only" ] && shard_append="$shard_append vmwarden.only=$(printf '%s' "$only" | tr ' ' ',')"
  # pci_passthrough and usb_passthrough (either alone, or both): q35 with
  # QEMU's emulated IOMMU (interrupt remapping needs the split irqchip), a
  # PCI device of L2's own, at $PCI_ADDR, whose DMA goes through that IOMMU
  # (iommu_platform), and an xHCI with a USB keyboard ($USB_IDS)
  shard_kernel=$CACHE/vmlinuz shard_initrd=$CACHE/initrd.img
  if printf ' %s ' "$only" | grep -qE ' (pci|usb)_passthrough '; then
    shard_machine=(-machine q35,kernel-irqchip=split -device intel-iommu,caching-mode=on,intremap=on
                   -device virtio-rng-pci,disable-legacy=on,iommu_platform=on,addr=0x9
                   -device qemu-xhci,id=l2xhci -device usb-kbd,bus=l2xhci.0)
    # usb_passthrough: Debian's generic kernel (the cloud one has no USB)
    shard_kernel=$CACHE/vmlinuz-generic shard_initrd=$CACHE/initrd-generic.img
    # no_timer_check: under TCG on a loaded host the kernel's check of the
    # timer through the remapped IO-APIC can time out and panic ("timer
    # doesn't work through Interrupt-remapped IO-APIC", seen once in two boots)
    shard_blk=virtio-blk-pci shard_append="$shard_append intel_iommu=on no_timer_check"
  fi
  : >"$d/serial.log"
  QEMU=(qemu-system-x86_64 -accel "$L2_TCG" -cpu "$L2_CPU" "${shard_machine[@]}" -smp "$L2_SMP" -m "$MEM"
        -display none -monitor none -qmp "unix:$WORK/qmp-$i-$try.sock,server=on,wait=off" -serial "file:$d/serial.log" -no-reboot
        -kernel "$shard_kernel" -initrd "$shard_initrd" -append "$shard_append"
        -drive "file=$img,format=raw,if=none,id=root,cache=unsafe" -device "$shard_blk,drive=root"
        -drive "file=$res,format=raw,if=none,id=res" -device "$shard_blk,drive=res")
  echo "+ ${QEMU[*]}" >"$d/qemu.out"
  "${QEMU[@]}" >>"$d/qemu.out" 2>&1 &
  g=${#G_PID[@]}
  G_PID+=("$!") G_DIR+=("$d") G_LIST+=("$only") G_RES+=("$res") G_LABEL+=("$label") G_OF+=("$i") G_SUPERSEDED+=("") G_TRY+=("$try")
  G_SEEN[$g]=0 G_LAST[$g]=$(date +%s) G_T0[$g]=$(now)
  QPIDS+=("$!"); QPID="${QPIDS[*]}"
  log "L2 guest ${label:+[$label] }booting (pid $!, timeout ${TIMEOUT}s, serial $d/serial.log${only:+, scenarios: $only})"
  # progress lines as they come (not the heartbeat)
  tail -n +1 -F --pid="$!" "$d/serial.log" 2>/dev/null \
    | grep --line-buffered -aoE '(SCENARIO|SOAK|VMWARDEN-L2-(INITRAMFS|UP|WARN|STUCK)).*' \
    | sed -u "s/\r\$//; s/^/systemd: guest: ${label:+[$label] }/" &
}
# What a guest's console says, its kernel's own lines included, when it
# stopped early: the cause is usually there (an oops, a hung task).
serial_tail() { # GUEST
  log "${G_LABEL[$1]:+[${G_LABEL[$1]}] }the last 40 lines of its console (${G_DIR[$1]}/serial.log):"
  tr -d '\r' <"${G_DIR[$1]}/serial.log" | grep -av '^VMWARDEN-L2-ALIVE' | tail -40 | cut -c1-400 | sed 's/^/systemd:   | /' || true
}
# Where a silent guest's one vCPU is, asked of its QEMU (QMP) three times,
# 2 s apart, before it is stopped: running or paused, halted (HLT=1: L2's
# kernel idles, waiting for an interrupt that does not come) or not, in the
# kernel (CPL=0) or user space, and RIP: the guest boots nokaslr, so one
# wedge's RIP can be compared with another's, and read against the
# kernel's symbols (Debian's System.map is a stub: linux-image-*-dbg has
# them). What the wedges are, for the record; nothing is decided by it.
vcpu_state() { # GUEST
  timeout 20 python3 - "$WORK/qmp-${G_OF[$1]}-${G_TRY[$1]}.sock" <<'PY' 2>&1 | sed "s/^/systemd:   ${G_LABEL[$1]:+[${G_LABEL[$1]}] }vCPU: /" || true
import json, re, socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.readline()
def ask(cmd, **args):
    f.write(json.dumps({"execute": cmd, "arguments": args}) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r:
            return r.get("return", r.get("error"))
ask("qmp_capabilities")
print("status", ask("query-status").get("status"))
for _ in range(3):
    regs = ask("human-monitor-command", **{"command-line": "info registers"})
    print(" ".join(k + "=" + (m.group(1) if m else "?")
                   for k in ("RIP", "HLT", "CPL") for m in [re.search(k + r"=(\S+)", regs)]))
    time.sleep(2)
PY
}
# A guest's scenario lines: its results disk, and from its console what
# the disk lacks (its last lines may not have reached the disk when a guest
# stopped; a console line can have a kernel message inside it, so the disk's
# copy of a scenario wins)
guest_results() { # GUEST OUT
  local d=${G_DIR[$1]} f
  for f in results.txt scenarios.log journal.txt status-a.json status-b.json; do
    debugfs -R "dump /$f $d/$f" "${G_RES[$1]}" >/dev/null 2>&1 || true
    [ -s "$d/$f" ] || rm -f "$d/$f"
  done
  # a line's key: a scenario's name; the first word of the runner's first and
  # last lines; any other line (SOAK) itself
  tr -d '\r' <"$d/serial.log" | grep -aoE '(VMWARDEN-L2-UP|SCENARIO |SOAK |SCENARIOS ).*' \
    | awk 'function key(l, w) { split(l, w, " ")
                                if (w[1] == "SCENARIO") return w[2]
                                if (w[1] == "SCENARIOS" || w[1] == "VMWARDEN-L2-UP") return w[1]
                                return l }
           FILENAME != "-" { print; seen[key($0)] = 1; next }
           !(key($0) in seen) { print; seen[key($0)] = 1 }' $([ -e "$d/results.txt" ] && echo "$d/results.txt") - >"$2" || true
}
declare -A G_SEEN=() G_LAST=() G_T0=()
T_BOOT=$(now)
for i in $(seq 1 "$NSHARDS"); do
  label=""; [ "$NSHARDS" = 1 ] || label=$i
  boot_guest "$i" "$(shard_dir "$i")" "$WORK/root-$i.ext4" "$WORK/results-$i.ext4" "${SHARD_LISTS[$((i - 1))]}" "$label"
done
# A guest is wedged when its console has been silent for WEDGE_S: the
# scenario runner prints a heartbeat every 60 s and, past a scenario's own
# limit, a STUCK line, so silence means L2's kernel or userspace no longer
# runs (the scenarios' own hangs fail them inside the guest). A wedged
# guest, or one whose QEMU ended without the final line (an L2 kernel
# panic, with -no-reboot), is stopped (where its vCPU was printed first:
# vcpu_state), its console printed, and the scenarios it had not reported
# run in a fresh guest from the same image, if the overall deadline leaves
# room for them; a rerun that stops early likewise, up to MAX_RERUNS times
# a shard. The results count what each guest reported; a shard whose last
# rerun stops early fails the run. Every wedge seen so far came in a
# scenario that starts nested KVM guests under TCG (three in about thirty
# shard runs, two of them in one shard of one run, the second in its
# rerun); 300 s is five missed heartbeats.
WEDGE_S=${VMWARDEN_SYSTEMD_WEDGE:-300}
# before the runner's first line (L2's boot, which prints none of it): the
# slowest boot seen took 176 s (q35, the emulated IOMMU, the generic kernel)
BOOT_WEDGE_S=$(( WEDGE_S > 600 ? WEDGE_S : 600 ))
MAX_RERUNS=2
DEADLINE=$(( $(date +%s) + TIMEOUT )); TIMED_OUT=0
declare -A L2_UP=() G_DONE=()
# a guest is done once its QEMU ended (and was looked at) or it was stopped
pending() { local g; for g in "${!G_PID[@]}"; do [ -n "${G_DONE[$g]:-}" ] || return 0; done; return 1; }
rerun() { # GUEST WHY
  local g=$1 why=$2 d=${G_DIR[$1]} i=${G_OF[$1]} try=$((G_TRY[$1] + 1)) r left n again label
  log "L2 FAILURE: ${G_LABEL[$g]:+[${G_LABEL[$g]}] }the L2 guest $why"
  # (a guest whose QEMU ended is already gone)
  kill -0 "${G_PID[$g]}" 2>/dev/null && vcpu_state "$g"
  kill "${G_PID[$g]}" 2>/dev/null && { sleep 2; kill -9 "${G_PID[$g]}" 2>/dev/null || true; }
  wait "${G_PID[$g]}" 2>/dev/null || true
  serial_tail "$g"
  # a shard runs again at most MAX_RERUNS times, and only with time for it
  [ "$try" -le "$MAX_RERUNS" ] || { log "FAIL: it was the shard's rerun $((try - 1)) of at most $MAX_RERUNS: no more"; return 0; }
  r=$d/results.early.txt; guest_results "$g" "$r"
  left=""
  for n in ${G_LIST[$g]}; do
    grep -q "^SCENARIO name=$n " "$r" || left="$left $n"
  done
  left=${left# }
  [ -n "$left" ] || return 0
  if [ $(( DEADLINE - $(date +%s) )) -lt 900 ]; then
    log "FAIL: ${G_LABEL[$g]:+[${G_LABEL[$g]}] }no time left to run again: $left"; return 0
  fi
  again=again$([ "$try" = 1 ] || echo "$try")
  cp --sparse=always "$ROOT_IMG" "$WORK/root-$i-$again.ext4" && cp --sparse=always "$RES_IMG" "$WORK/results-$i-$again.ext4" \
    || { log "cannot copy the image to run shard $i again"; return 0; }
  G_SUPERSEDED[$g]=1
  log "${G_LABEL[$g]:+[${G_LABEL[$g]}] }running what it had not reported in a fresh guest: $left"
  label=""; [ "$NSHARDS" = 1 ] || label=$i
  boot_guest "$i" "$(shard_dir "$i")/$again" "$WORK/root-$i-$again.ext4" "$WORK/results-$i-$again.ext4" "$left" "$label$again" "$try"
}
while pending; do
  for g in "${!G_PID[@]}"; do
    d=${G_DIR[$g]} label=${G_LABEL[$g]}
    [ -n "${G_DONE[$g]:-}" ] && continue
    if [ -z "${L2_UP[$g]:-}" ] && grep -aq 'VMWARDEN-L2-UP' "$d/serial.log"; then
      L2_UP[$g]=$(since "${G_T0[$g]}"); timing "l2_boot_to_scenarios${label:+_$label}" "${L2_UP[$g]}"
    fi
    n=$(grep -acE '(VMWARDEN-L2|SCENARIO|SOAK)' "$d/serial.log" 2>/dev/null || true)
    limit=$WEDGE_S; [ -n "${L2_UP[$g]:-}" ] || limit=$BOOT_WEDGE_S
    if [ "${n:-0}" != "${G_SEEN[$g]}" ]; then G_SEEN[$g]=$n; G_LAST[$g]=$(date +%s); fi
    if ! kill -0 "${G_PID[$g]}" 2>/dev/null; then
      G_DONE[$g]=1
      grep -aq '^SCENARIOS ' <(tr -d '\r' <"$d/serial.log") \
        || rerun "$g" "ended (its QEMU exited) before the final line"
    elif [ $(( $(date +%s) - G_LAST[$g] )) -ge "$limit" ]; then
      G_DONE[$g]=1
      rerun "$g" "printed nothing for ${limit} s, not even its heartbeat (last: $(tr -d '\r' <"$d/serial.log" | grep -aoE '(VMWARDEN-L2-ALIVE|SCENARIO name=[^ ]*).*' | tail -1 | cut -c1-120)): wedged"
    fi
  done
  if [ "$(date +%s)" -ge "$DEADLINE" ]; then
    TIMED_OUT=1; log "TIMEOUT after ${TIMEOUT}s: stopping the L2 guests"
    kill "${G_PID[@]}" 2>/dev/null; sleep 3; kill -9 "${G_PID[@]}" 2>/dev/null || true
    for g in "${!G_PID[@]}"; do [ -n "${G_DONE[$g]:-}" ] || { G_DONE[$g]=1; serial_tail "$g"; }; done
    break
  fi
  sleep 1
done
for p in "${G_PID[@]}"; do wait "$p" 2>/dev/null || true; done
QPID=""
timing l2_total "$(since "$T_BOOT")"

# ---------------------------------------------------------------- 4. results
RESULTS=$OUTDIR/results.txt
rc=0 passed=0 failed=0
rm -f "$RESULTS.merged" "$OUTDIR/scenarios.log.merged" "$OUTDIR/journal.txt.merged"
for g in "${!G_PID[@]}"; do
  d=${G_DIR[$g]} i=${G_OF[$g]} label=""; [ -z "${G_LABEL[$g]}" ] || label="[${G_LABEL[$g]}] "
  r=$d/results.txt; guest_results "$g" "$r.all"; mv "$r.all" "$r"
  # a guest run again: what it reported counts, the rerun reports the rest
  [ -z "${G_SUPERSEDED[$g]}" ] || sed -i '/^SCENARIOS /d' "$r"
  p=$(grep -c '^SCENARIO name=.* result=pass' "$r" 2>/dev/null || true)
  f=$(grep -c '^SCENARIO name=.* result=fail' "$r" 2>/dev/null || true)
  final=$(grep '^SCENARIOS ' "$r" 2>/dev/null | tail -1 || true)
  if [ -n "${G_SUPERSEDED[$g]}" ]; then
    log "${label}the guest reported $p passed, $f failed before it stopped (L2 FAILURE above); the rest ran again"
  elif ! grep -aq 'VMWARDEN-L2-UP' "$d/serial.log" 2>/dev/null; then
    log "FAIL: ${label}the L2 guest never reached the scenario runner (see $d/serial.log)"; rc=1; [ "$f" -gt 0 ] || f=1
  elif [ -z "$final" ]; then
    log "FAIL: ${label}no final 'SCENARIOS passed=N failed=M' line"; rc=1; [ "$f" -gt 0 ] || f=1
  elif [ "$final" != "SCENARIOS passed=$p failed=$f" ]; then
    log "FAIL: ${label}final line '$final' does not match the scenario lines"; rc=1
  fi
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$NSHARDS" != 1 ] || [ "${#G_PID[@]}" -gt 1 ]; then
    grep -v '^SCENARIOS ' "$r" >>"$RESULTS.merged" 2>/dev/null || true
    for f in scenarios.log journal.txt; do
      [ -s "$d/$f" ] && { echo "===== shard ${G_LABEL[$g]:-1}"; cat "$d/$f"; } >>"$OUTDIR/$f.merged"
    done
  fi
done
if [ -e "$RESULTS.merged" ]; then
  mv "$RESULTS.merged" "$RESULTS"
  for f in scenarios.log journal.txt; do [ -e "$OUTDIR/$f.merged" ] && mv "$OUTDIR/$f.merged" "$OUTDIR/$f"; done
  echo "SCENARIOS passed=$passed failed=$failed" >>"$RESULTS"
fi
echo "--- results ($RESULTS)"; cat "$RESULTS" 2>/dev/null || true; echo "---"
while read -r name secs; do timing "scenario_$name" "$secs"; done < <(
  sed -n 's/^SCENARIO name=\([^ ]*\) result=[a-z]* time_s=\([0-9.]*\).*/\1 \2/p' "$RESULTS" 2>/dev/null)
timing total "$(since "$T_ALL")"

if [ "$TIMED_OUT" = 1 ]; then log "FAIL: overall timeout (${TIMEOUT}s)"; failed=$((failed + 1)); rc=1; fi
[ "$failed" -eq 0 ] || rc=1
[ "$passed" -gt 0 ] || rc=1
grep '^SCENARIO name=.* result=fail' "$RESULTS" 2>/dev/null | sed 's/^/systemd: FAILED: /' || true
log "artifacts in $OUTDIR (serial.log, results.txt, scenarios.log, journal.txt, timings.txt$([ "$NSHARDS" = 1 ] || echo '; each guest'"'"'s in shard-N/'))"
echo "systemd: $passed passed, $failed failed"
exit $rc
