#!/usr/bin/env bash
# Build (and cache) the shares/vsock variant of the test guest (issue 12).
# A sibling of build-guest.sh, not a mode of it: build-guest.sh's own hash is
# the cache key of the assets every other suite uses, so it stays untouched.
#
#   $ASSETS/vmlinuz         Debian *generic* kernel (linux-image-<abi>-amd64): the
#                           cloud kernel has virtiofs, fuse and vsock but no 9p
#   $ASSETS/initramfs.img   gzip'd newc cpio: static busybox, the virtio, 9p,
#                           virtiofs, vsock, ext4 and crc32c (ext4 metadata_csum,
#                           mke2fs's default) .ko files, /init, and
#                           /bin/vsock-echo (vsock-echo.c, built static: busybox
#                           has no vsock applet)
#   $ASSETS/assets.env      shell-sourceable: KERNEL= INITRD= KVER= GUEST_CMDLINE_*=
#
# ASSETS=${VMWARDEN_TEST_SHARES_ASSETS:-/var/cache/vmwarden/test-assets-shares}
#
# /init is build-guest.sh's, plus: `vmwarden.run=<base64 of a sh script>` on the
# kernel command line runs that script after the markers and before READY
# (a test says what the guest does: mount its shares, write, probe vsock);
# the script's lines go to the console between VMWARDEN-RUN-BEGIN and
# VMWARDEN-RUN-END rc=<n>. Also printed:
#   VMWARDEN-DISK name=<vdX> bytes=<n> serial=<serial or ->
#   VMWARDEN-VSOCK dev=<present|absent>
#
# Cached: the build is skipped when all outputs exist and the recorded sha256 of
# this script (and of guest-cmdline.sh) matches. Outputs are written to a temp
# dir on the same filesystem and renamed into place; the stamp is written last,
# so an interrupted build is never mistaken for a cached one. Concurrent callers
# serialise on a flock. Outputs are 0644 and the directory 0755, so QEMU running
# as an unprivileged uid can read them.
#
# Usage: build-guest.sh [--force]     prints the assets.env path on stdout
# Needs: apt-get, apt-cache, dpkg-deb, busybox (busybox-static), modinfo (kmod), cc,
#        gzip, sha256sum, flock. Run tests/setup-host.sh first.
# The guest's behaviour (markers, vmwarden.mode=) is described in README.md.
set -euo pipefail
umask 022

die() { echo "build-guest-shares.sh: ERROR: $*" >&2; exit 1; }
log() { echo "build-guest-shares.sh: $*" >&2; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
CMDLINE_HELPER="$HERE/guest-cmdline.sh"
VSOCK_ECHO_SRC="$HERE/vsock-echo.c"
ASSETS=${VMWARDEN_TEST_SHARES_ASSETS:-/var/cache/vmwarden/test-assets-shares}
STAMP="$ASSETS/.build-guest-shares.sha256"
OUTPUTS=(vmlinuz initramfs.img assets.env)
FORCE=0
case "${1:-}" in
  "") ;;
  --force) FORCE=1 ;;
  *) die "usage: $0 [--force]" ;;
esac

[ -r "$CMDLINE_HELPER" ] || die "missing $CMDLINE_HELPER"

want_hash() { cat "$SELF" "$CMDLINE_HELPER" "$VSOCK_ECHO_SRC" | sha256sum | cut -d' ' -f1; }

is_cached() {
  local f
  [ "$FORCE" -eq 0 ] || return 1
  [ -r "$STAMP" ] || return 1
  for f in "${OUTPUTS[@]}"; do [ -s "$ASSETS/$f" ] || return 1; done
  [ "$(cat "$STAMP")" = "$WANT" ]
}

WANT=$(want_hash)
# Fast path (no lock, no apt): a cache hit costs two sha256sums.
if is_cached; then
  echo "$ASSETS/assets.env"
  exit 0
fi

for c in apt-get apt-cache dpkg-deb busybox modinfo gzip sha256sum flock cc; do
  command -v "$c" >/dev/null 2>&1 || die "'$c' not found (run tests/setup-host.sh as root)"
done
busybox cpio --help >/dev/null 2>&1 || die "busybox has no cpio applet (need busybox-static)"
BUSYBOX=$(command -v busybox)
file -L "$BUSYBOX" 2>/dev/null | grep -q 'dynamically linked' \
  && die "$BUSYBOX is dynamically linked; install busybox-static"

mkdir -p "$ASSETS" || die "cannot create $ASSETS"
chmod 0755 "$ASSETS" || die "cannot chmod $ASSETS"
[ -w "$ASSETS" ] || die "$ASSETS is not writable (run as root or set VMWARDEN_TEST_ASSETS)"

exec 9>"$ASSETS/.lock" || die "cannot open $ASSETS/.lock"
flock 9
# Somebody else may have finished the build while we waited for the lock.
if is_cached; then
  echo "$ASSETS/assets.env"
  exit 0
fi

# We hold the lock: leftovers of killed builds can go.
rm -rf "$ASSETS"/.build.*
rm -f "$STAMP"
WORK=$(mktemp -d "$ASSETS/.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
t0=$(date +%s%N)

# ---------------------------------------------------------------- kernel
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
[ -n "$KPKG" ] || die "cannot resolve the kernel package from 'apt-cache depends linux-image-amd64' (apt-get update needed?)"
log "kernel package: $KPKG"
mkdir "$WORK/deb"
# -o APT::Sandbox::User=root: the temp dir is not readable by _apt; without this
# apt downloads as root anyway, with a warning.
(cd "$WORK/deb" && apt-get download -q -o APT::Sandbox::User=root "$KPKG" >&2) \
  || die "apt-get download $KPKG failed"
DEB=$(find "$WORK/deb" -maxdepth 1 -name '*.deb' | head -n1)
[ -n "$DEB" ] || die "apt-get download produced no .deb"
dpkg-deb -x "$DEB" "$WORK/root" || die "dpkg-deb -x $DEB failed"
rm -f "$DEB"

KVER=$(find "$WORK/root/lib/modules" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | head -n1)
[ -n "$KVER" ] || die "no lib/modules/<version> in $KPKG"
[ -f "$WORK/root/boot/vmlinuz-$KVER" ] || die "no boot/vmlinuz-$KVER in $KPKG"
MODDIR="$WORK/root/lib/modules/$KVER"

# ---------------------------------------------------------------- modules
# Wanted modules; the load order (dependencies first) comes from each .ko's
# modinfo depends= (the package ships no modules.dep).
WANT_MODS=(
  virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci
  virtio_mmio virtio_blk virtio_net qemu_fw_cfg button evdev
  9pnet_virtio 9p virtiofs vmw_vsock_virtio_transport ext4
  crc32c_generic
)
declare -A KO_PATH=() STATE=()
while IFS= read -r -d '' ko; do
  b=${ko##*/}; b=${b%.ko}
  KO_PATH[$b]=$ko
  KO_PATH[${b//-/_}]=$ko
done < <(find "$MODDIR/kernel" -name '*.ko' -print0)

ORDER=()
visit() { # depth-first, dependencies before dependents
  local m=${1//-/_} dep deps
  case "${STATE[$m]:-}" in
    done) return 0 ;;
    active) die "module dependency cycle at $m" ;;
  esac
  [ -n "${KO_PATH[$m]:-}" ] || die "module $m not found in $KPKG (built in? compressed?)"
  STATE[$m]="active"
  deps=$(modinfo -F depends "${KO_PATH[$m]}") || die "modinfo ${KO_PATH[$m]} failed"
  for dep in ${deps//,/ }; do visit "$dep"; done
  STATE[$m]="done"
  ORDER+=("$m")
}
for m in "${WANT_MODS[@]}"; do visit "$m"; done
log "module load order: ${ORDER[*]}"

# ---------------------------------------------------------------- initramfs
R="$WORK/initramfs"
mkdir -p "$R"/{bin,sbin,dev,proc,sys,tmp,run,lib/modules,etc/acpi/PWRF}
cp "$BUSYBOX" "$R/bin/busybox"
cc -static -Os -o "$R/bin/vsock-echo" "$VSOCK_ECHO_SRC" || die "cc -static $VSOCK_ECHO_SRC failed (needs gcc and libc6-dev)"
for m in "${ORDER[@]}"; do
  cp "${KO_PATH[$m]}" "$R/lib/modules/$m.ko"
  echo "$m" >>"$R/lib/modules/order"
done
mkdir -p "$R/mnt" "$R/etc"
echo "root:x:0:0:root:/:/bin/sh" >"$R/etc/passwd"
# /dev/console lets the kernel give /init a console before devtmpfs is mounted.
# Without root we cannot mknod; /init then reopens /dev/console itself.
if [ "$(id -u)" -eq 0 ]; then
  mknod -m 600 "$R/dev/console" c 5 1
  mknod -m 666 "$R/dev/null" c 1 3
fi

# busybox acpid runs PWRF/00000080 on the ACPI power button (QMP system_powerdown)
cat >"$R/etc/acpi/PWRF/00000080" <<'EOF'
#!/bin/busybox sh
echo "VMWARDEN-GUEST-POWERBUTTON" >/dev/console
/bin/busybox poweroff -f
EOF

cat >"$R/init" <<'EOF'
#!/bin/busybox sh
# vmwarden test guest. Markers (one line each, on the console = ttyS0):
#   VMWARDEN-CRED name=<NAME> sha256=<hex>   per fw_cfg opt/io.systemd.credentials/<NAME>
#   VMWARDEN-CRED-NONE                       no qemu_fw_cfg or no credentials
#   VMWARDEN-NIC name=<if> mac=<mac>         per network interface (not lo)
#   VMWARDEN-GUEST-READY uptime=<s>
#   VMWARDEN-GUEST-POWERBUTTON               (hold mode) ACPI power button, then poweroff -f
# vmwarden.mode=hold (default) | oneshot (poweroff -f right after READY)
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys

MODE=hold
read -r cmdline </proc/cmdline
for a in $cmdline; do
  case "$a" in vmwarden.mode=*) MODE=${a#vmwarden.mode=} ;; esac
done

while read -r m; do
  insmod "/lib/modules/$m.ko" || echo "VMWARDEN-GUEST-WARN insmod $m failed"
done </lib/modules/order

CREDS=/sys/firmware/qemu_fw_cfg/by_name/opt/io.systemd.credentials
n=0
for d in "$CREDS"/*; do
  [ -f "$d/raw" ] || continue
  sum=$(sha256sum <"$d/raw") || continue
  echo "VMWARDEN-CRED name=${d##*/} sha256=${sum%% *}"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || echo "VMWARDEN-CRED-NONE"

for d in /sys/class/net/*; do
  nic=${d##*/}
  [ "$nic" = lo ] && continue
  [ -r "$d/address" ] || continue
  read -r mac <"$d/address"
  echo "VMWARDEN-NIC name=$nic mac=$mac"
done

for d in /sys/block/vd*; do
  [ -r "$d/size" ] || continue
  read -r sectors <"$d/size"
  serial=-
  [ -r "$d/serial" ] && read -r serial <"$d/serial"
  echo "VMWARDEN-DISK name=${d##*/} bytes=$((sectors * 512)) serial=${serial:--}"
done
if [ -c /dev/vsock ]; then echo "VMWARDEN-VSOCK dev=present"; else echo "VMWARDEN-VSOCK dev=absent"; fi

RUN=
for a in $cmdline; do
  case "$a" in vmwarden.run=*) RUN=${a#vmwarden.run=} ;; esac
done
if [ -n "$RUN" ]; then
  echo "VMWARDEN-RUN-BEGIN"
  echo "$RUN" | base64 -d >/tmp/run.sh 2>/dev/null || echo "VMWARDEN-GUEST-ERROR vmwarden.run is not base64"
  sh /tmp/run.sh </dev/null
  echo "VMWARDEN-RUN-END rc=$?"
fi

if [ "$MODE" = hold ]; then
  # Start acpid before READY and wait until it holds the input device open:
  # a power button press (QMP system_powerdown) with no reader is lost.
  acpid -f -c /etc/acpi -l /dev/null &
  apid=$!
  acpid_has_input() {
    for fd in /proc/"$apid"/fd/*; do
      case "$(readlink "$fd")" in /dev/input/event*) return 0 ;; esac
    done
    return 1
  }
  if [ -e /dev/input/event0 ]; then
    i=0
    until acpid_has_input; do
      i=$((i + 1))
      if [ "$i" -ge 500 ] || ! kill -0 "$apid" 2>/dev/null; then
        echo "VMWARDEN-GUEST-WARN acpid did not open /dev/input/event*"
        break
      fi
      sleep 0.01
    done
  else
    echo "VMWARDEN-GUEST-WARN no /dev/input/event* (no ACPI power button)"
  fi
fi

read -r up _ </proc/uptime
echo "VMWARDEN-GUEST-READY uptime=$up"

case "$MODE" in
  oneshot)
    poweroff -f ;;
  hold)
    while :; do sleep 3600; done ;;
  *)
    echo "VMWARDEN-GUEST-ERROR unknown vmwarden.mode=$MODE"
    poweroff -f ;;
esac
EOF
chmod 0755 "$R/init" "$R/etc/acpi/PWRF/00000080" "$R/bin/busybox" "$R/bin/vsock-echo"

(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | busybox cpio -o -H newc -R 0:0 2>/dev/null) \
  | gzip -9n >"$WORK/initramfs.img" || die "packing the initramfs failed"
[ -s "$WORK/initramfs.img" ] || die "empty initramfs"

mv "$WORK/root/boot/vmlinuz-$KVER" "$WORK/vmlinuz"

# ---------------------------------------------------------------- assets.env
# single-quoted values: valid for sh/bash `.` and trivial to parse (KEY='value')
q() {
  case "$1" in *"'"*) die "value with a single quote: $1" ;; esac
  printf "'%s'" "$1"
}
{
  echo "# generated by tests/assets/build-guest-shares.sh; source it from a shell"
  echo "KERNEL=$(q "$ASSETS/vmlinuz")"
  echo "INITRD=$(q "$ASSETS/initramfs.img")"
  echo "KVER=$(q "$KVER")"
  echo "KERNEL_PACKAGE=$(q "$KPKG")"
  echo "MODULES=$(q "${ORDER[*]}")"
  echo "# base kernel cmdline; append vmwarden.mode=oneshot|hold (default hold)"
  echo "GUEST_CMDLINE_BASE=$(q "$("$CMDLINE_HELPER" --base)")"
  echo "# full cmdlines for TCG on this host (microvm adds tsc_early_khz, host-specific:"
  echo "# prefer running tests/assets/guest-cmdline.sh MACHINE MODE [ACCEL] at test time)"
  echo "GUEST_CMDLINE_MICROVM=$(q "$("$CMDLINE_HELPER" microvm hold tcg)")"
  echo "GUEST_CMDLINE_PC=$(q "$("$CMDLINE_HELPER" pc hold tcg)")"
  echo "GUEST_MACHINE_MICROVM=$(q "$("$CMDLINE_HELPER" --machine microvm)")"
  echo "GUEST_MACHINE_PC=$(q "$("$CMDLINE_HELPER" --machine pc)")"
} >"$WORK/assets.env"

# ---------------------------------------------------------------- publish
for f in "${OUTPUTS[@]}"; do
  chmod 0644 "$WORK/$f"
  mv -f "$WORK/$f" "$ASSETS/$f"
done
echo "$WANT" >"$WORK/stamp"
chmod 0644 "$WORK/stamp"
mv -f "$WORK/stamp" "$STAMP"

# QEMU as another uid must be able to traverse every parent directory.
d=$ASSETS
while [ "$d" != / ] && [ -n "$d" ]; do
  perm=$(stat -c %A "$d")
  [ "${perm:9:1}" = x ] || [ "${perm:9:1}" = t ] \
    || log "WARNING: $d is not world-searchable ($perm); an unprivileged QEMU cannot read the assets"
  d=$(dirname "$d")
done

log "built $KVER in $(( ($(date +%s%N) - t0) / 1000000 )) ms: $(stat -c %s "$ASSETS/vmlinuz") B kernel, $(stat -c %s "$ASSETS/initramfs.img") B initramfs"
echo "$ASSETS/assets.env"
