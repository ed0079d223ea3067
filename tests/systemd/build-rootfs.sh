#!/usr/bin/env bash
# Build (once) and cache the Debian bookworm systemd rootfs that the real-systemd
# suite boots as its L2 guest, plus the kernel and a tiny boot initramfs for it.
#
#   tests/systemd/build-rootfs.sh          # prints the cache directory on stdout
#
# Cache: ${VMWARDEN_TEST_CACHE:-/var/cache/vmwarden}/systemd-rootfs/<key>/ where
# <key> is the sha256 of this script, so editing the script rebuilds and nothing
# else does. Contents:
#   tree/        the rootfs (debootstrap minbase + systemd, udev, kmod, acl,
#                qemu-system-x86 for the nested guests, jq, netcat-openbsd, procps,
#                iproute2, passt (user networking), socat and openssh-client
#                (vsock and ssh from the host side), systemd-container and dbus
#                (systemd-machined, machinectl), and the Debian cloud kernel's
#                modules with depmod run)
#   vmlinuz      the same cloud kernel, for qemu -kernel
#   initrd.img   busybox initramfs: insmod virtio, mount LABEL=vmw-l2root, switch_root
#   vmlinuz-generic, initrd-generic.img   the same for Debian's generic kernel
#                (bookworm-backports, the cloud one's release): USB host support,
#                which the cloud kernel lacks; the passthrough shard boots it
#   info.env     KVER=, KVER_GENERIC=, build timings
#
# Only machine-level things live here. Everything that belongs to one test run
# (vmwarden binaries, units, specs, credentials, the scenario runner) is added by
# run.sh to a hard-linked copy of tree/ (cp -al), so a run never rebuilds this.
# Files in tree/ must therefore never be modified in place by a run: a run
# replaces a file by removing it first (see run.sh put()).
#
# Needs (host, root): debootstrap, busybox (static), e2fsprogs, gzip. Network: the
# Debian mirror only (MIRROR=, default http://deb.debian.org/debian).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
export LC_ALL=C

die() { echo "build-rootfs.sh: ERROR: $*" >&2; exit 1; }
log() { echo "build-rootfs.sh: $*" >&2; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, mknod)"
for c in debootstrap busybox mkfs.ext4 gzip flock sha256sum; do
  command -v "$c" >/dev/null 2>&1 || die "missing $c (run tests/setup-host.sh)"
done

SELF=$(readlink -f "${BASH_SOURCE[0]}")
MIRROR=${MIRROR:-http://deb.debian.org/debian}
BASE=${VMWARDEN_TEST_CACHE:-/var/cache/vmwarden}/systemd-rootfs
KEY=$(sha256sum "$SELF" | cut -c1-16)
OUT=$BASE/$KEY

mkdir -p "$BASE"
exec 9>"$BASE/.lock"
flock 9   # one builder at a time; a second caller waits and then finds the cache

if [ -f "$OUT/ok" ]; then
  touch "$OUT/used"
  log "cache hit $OUT"
  echo "$OUT"
  exit 0
fi

# An older key's tree is ~600 MiB: drop those not used for a day rather than
# let them pile up (branches of the script checked out side by side each keep
# theirs while they are in use; run.sh's cache hit marks a tree used).
for old in "$BASE"/*/; do
  [ -d "$old" ] || continue
  [ "${old%/}" = "$OUT" ] && continue
  [ -n "$(find "${old%/}" -maxdepth 1 -name used -mmin -1440 2>/dev/null)" ] && continue
  log "removing stale cache ${old%/}"
  rm -rf --one-file-system "${old%/}"
done

WORK=$OUT.tmp
rm -rf --one-file-system "$WORK"
mkdir -p "$WORK"
R=$WORK/tree

cleanup_mounts() {
  for m in "$R/proc" "$R/sys" "$R/dev/pts" "$R/dev"; do
    mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true
  done
}
trap cleanup_mounts EXIT

t0=$(date +%s)
log "debootstrap bookworm minbase -> $R (about 40-90 s)"
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,udev,kmod,acl,procps,ca-certificates \
  bookworm "$R" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
  || { tail -30 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
t1=$(date +%s)

mount -t proc proc "$R/proc"
mount -t sysfs sysfs "$R/sys"
mount --bind /dev "$R/dev"
cp /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true
# no daemons may start inside the chroot
printf '#!/bin/sh\nexit 101\n' > "$R/usr/sbin/policy-rc.d"; chmod 755 "$R/usr/sbin/policy-rc.d"

log "chroot apt: qemu-system-x86 jq netcat-openbsd iproute2 passt socat openssh-client systemd-container dbus + cloud kernel from bookworm-backports"
# The L2 kernel comes from bookworm-backports (6.12+): vmwarden mounts the credential
# tmpfs with `noswap` (Linux 6.4+) and fails closed without it; bookworm's 6.1 lacks it.
echo "deb $MIRROR bookworm-backports main" > "$R/etc/apt/sources.list.d/backports.list"
chroot "$R" /bin/sh -ec '
  export DEBIAN_FRONTEND=noninteractive
  apt-get -q update
  apt-get -y -q install --no-install-recommends qemu-system-x86 jq netcat-openbsd iproute2 passt \
    socat openssh-client systemd-container dbus
  mkdir -p /tmp/kdeb && cd /tmp/kdeb
  apt-get -q download linux-image-cloud-amd64/bookworm-backports
  KPKG=$(dpkg-deb -f linux-image-cloud-amd64_*.deb Depends | tr "," "\n" | sed -n "s/^ *\(linux-image-[0-9][^ ]*-cloud-amd64\).*/\1/p" | head -1)
  [ -n "$KPKG" ]
  rm -f linux-image-cloud-amd64_*.deb
  apt-get -q download "$KPKG/bookworm-backports"
  # the generic kernel of the same release line: the cloud one has no USB
  # (CONFIG_USB_SUPPORT unset); the passthrough shard boots this one
  mkdir -p /tmp/kdeb-generic && cd /tmp/kdeb-generic
  apt-get -q download linux-image-amd64/bookworm-backports
  GPKG=$(dpkg-deb -f linux-image-amd64_*.deb Depends | tr "," "\n" | sed -n "s/^ *\(linux-image-[0-9][^ ]*-amd64\).*/\1/p" | head -1)
  [ -n "$GPKG" ]
  rm -f linux-image-amd64_*.deb
  apt-get -q download "$GPKG/bookworm-backports"
  apt-get clean
  rm -rf /var/lib/apt/lists/*
' >"$WORK/chroot-apt.log" 2>&1 \
  || { tail -30 "$WORK/chroot-apt.log" >&2; die "chroot apt failed (log: $WORK/chroot-apt.log)"; }
# Unpack beside the tree, not over it: the .deb has a real ./lib, and tar would
# replace the merged-/usr symlink /lib -> usr/lib with it.
mkdir -p "$R/usr/lib/modules" "$R/boot"
for k in kdeb kdeb-generic; do
  dpkg-deb -x "$R"/tmp/$k/linux-image-*.deb "$WORK/kernel"
  # the generic kernel's drivers no L2 machine has (graphics, media, sound,
  # wireless, InfiniBand, staging): some 200 MiB the image would carry
  [ "$k" = kdeb ] || rm -rf "$WORK"/kernel/lib/modules/*/kernel/{drivers/gpu,drivers/media,sound,drivers/net/wireless,net/wireless,net/mac80211,drivers/infiniband,drivers/staging,drivers/bluetooth,net/bluetooth}
  cp -a "$WORK/kernel/lib/modules/." "$R/usr/lib/modules/"
  cp -a "$WORK/kernel/boot/." "$R/boot/"
  rm -rf "$WORK/kernel"
done
rm -rf "$R/tmp/kdeb" "$R/tmp/kdeb-generic"
KVER=$(ls "$R/lib/modules" | grep -- '-cloud-amd64$' | head -1)
KVER_GENERIC=$(ls "$R/lib/modules" | grep -v -- '-cloud-amd64$' | head -1)
[ -n "$KVER" ] && [ -f "$R/boot/vmlinuz-$KVER" ] || die "cloud kernel not unpacked"
[ -n "$KVER_GENERIC" ] && [ -f "$R/boot/vmlinuz-$KVER_GENERIC" ] || die "generic kernel not unpacked"
chroot "$R" depmod -a "$KVER"
chroot "$R" depmod -a "$KVER_GENERIC"
rm -f "$R/usr/sbin/policy-rc.d" "$R/etc/resolv.conf"
cleanup_mounts
t2=$(date +%s)

# --- machine-level configuration (test-run specifics are run.sh's layer) ---
echo vmwarden-l2 > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 vmwarden-l2\n' > "$R/etc/hosts"
printf 'LABEL=vmw-l2root / ext4 rw,relatime 0 1\n' > "$R/etc/fstab"
: > "$R/etc/machine-id"          # systemd makes a transient one at boot
rm -f "$R/var/lib/dbus/machine-id"
# a fast, quiet boot: no login prompts, no periodic jobs
for u in serial-getty@ttyS0.service getty@tty1.service apt-daily.timer \
         apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
         systemd-timesyncd.service; do
  ln -sf /dev/null "$R/etc/systemd/system/$u"
done
chroot "$R" systemctl set-default multi-user.target >/dev/null 2>&1
# the journal is what the scenarios read; keep it in memory, unthrottled
mkdir -p "$R/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRateLimitBurst=0\nForwardToConsole=no\n' \
  > "$R/etc/systemd/journald.conf.d/vmwarden-test.conf"
# trim what a test guest never reads
rm -rf "$R"/usr/share/{doc,man,info,locale}/* "$R/var/cache/debconf"/*-old \
       "$R/var/log"/*.log "$R/var/log/apt"/*

# --- kernel + boot initramfs for L2 ---
boot_files() { # KVER SUFFIX: $WORK/vmlinuz$SUFFIX and $WORK/initrd$SUFFIX.img
cp "$R/boot/vmlinuz-$1" "$WORK/vmlinuz$2"
STAGE=$WORK/initramfs
rm -rf "$STAGE"
mkdir -p "$STAGE"/{bin,dev,proc,sys,newroot,lib/modules}
cp "$(command -v busybox)" "$STAGE/bin/busybox"
busybox --list | grep -qx switch_root || die "host busybox lacks switch_root"
mknod -m 600 "$STAGE/dev/console" c 5 1
mknod -m 666 "$STAGE/dev/null" c 1 3
# load order from modules.dep (modprobe --show-depends prints insmod lines in order)
: > "$STAGE/lib/modules/order"
for m in virtio_pci virtio_mmio virtio_blk ext4; do
  chroot "$R" modprobe -S "$1" --show-depends "$m" 2>/dev/null | awk '$1=="insmod"{print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  cp "$R$ko" "$STAGE/lib/modules/"
  basename "$ko" >> "$STAGE/lib/modules/order"
done
grep -q '^virtio_blk' "$STAGE/lib/modules/order" || die "virtio_blk not found in $1"
cat > "$STAGE/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /lib/modules/order); do
  case "$m" in *.ko.xz) xz -dc /lib/modules/$m > /tmp.ko 2>/dev/null && insmod /tmp.ko; rm -f /tmp.ko ;;
               *) insmod /lib/modules/$m 2>/dev/null ;; esac
done
i=0; root=""
while [ $i -lt 200 ]; do
  root=$(findfs LABEL=vmw-l2root 2>/dev/null) && [ -b "$root" ] && break
  sleep 0.05; i=$((i+1))
done
echo "VMWARDEN-L2-INITRAMFS root=$root uptime=$(cut -d' ' -f1 /proc/uptime)"
mount -t ext4 -o ro "$root" /newroot || { echo "VMWARDEN-L2-INITRAMFS mount failed"; poweroff -f; }
umount /proc /sys
mount --move /dev /newroot/dev 2>/dev/null || umount /dev
exec switch_root /newroot /sbin/init
EOF
chmod 755 "$STAGE/init"
(cd "$STAGE" && find . | busybox cpio -o -H newc -R 0:0 2>/dev/null | gzip -6) > "$WORK/initrd$2.img"
rm -rf "$STAGE"
}
boot_files "$KVER" ""
boot_files "$KVER_GENERIC" -generic
t3=$(date +%s)

cat > "$WORK/info.env" <<EOF
KVER=$KVER
KVER_GENERIC=$KVER_GENERIC
DEBOOTSTRAP_S=$((t1 - t0))
CHROOT_APT_S=$((t2 - t1))
CONFIG_S=$((t3 - t2))
TREE_MIB=$(du -sm "$R" | cut -f1)
EOF
touch "$WORK/ok" "$WORK/used"
mv "$WORK" "$OUT"
log "built $OUT in $((t3 - t0)) s (debootstrap $((t1 - t0)) s, chroot apt $((t2 - t1)) s)"
echo "$OUT"
