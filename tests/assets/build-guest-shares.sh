#!/usr/bin/env bash
# Build (and cache) the shares/vsock variant of the test guest (shares, disks, vsock).
# A sibling of build-guest.sh, not a mode of it: its assets have their own
# directory and cache stamp. The steps the two share are in lib-guest.sh.
#
#   $ASSETS/vmlinuz         Debian *generic* kernel (linux-image-<abi>-amd64): the
#                           cloud kernel has virtiofs, fuse and vsock but no 9p
#   $ASSETS/initramfs.img   gzip'd newc cpio: static busybox, the virtio, 9p,
#                           virtiofs, vsock, virtio_balloon, ext4 and crc32c (ext4 metadata_csum,
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
# this script (and of lib-guest.sh, guest-cmdline.sh and vsock-echo.c) matches.
# Outputs are written to a temp dir on the same filesystem and renamed into
# place; the stamp is written last, so an interrupted build is never mistaken
# for a cached one. Concurrent callers serialise on a flock. Outputs are 0644
# and the directory 0755, so QEMU running as an unprivileged uid can read them.
#
# Usage: build-guest-shares.sh [--force]     prints the assets.env path on stdout
# Needs: apt-get, apt-cache, dpkg-deb, busybox (busybox-static), modinfo (kmod), cc,
#        gzip, sha256sum, flock. Run tests/setup-host.sh first.
# The guest's behaviour (markers, vmwarden.mode=) is described in README.md.
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
VSOCK_ECHO_SRC="$HERE/vsock-echo.c"
ASSETS=${VMWARDEN_TEST_SHARES_ASSETS:-/var/cache/vmwarden/test-assets-shares}
ASSETS_VAR=VMWARDEN_TEST_SHARES_ASSETS
STAMP="$ASSETS/.build-guest-shares.sha256"
HASHED=("$VSOCK_ECHO_SRC")
TOOLS=(cc)
# shellcheck source=lib-guest.sh
. "$HERE/lib-guest.sh"

guest_begin "$@"
guest_kernel linux-image-amd64
guest_modules \
  virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci \
  virtio_mmio virtio_blk virtio_net qemu_fw_cfg button evdev \
  9pnet_virtio 9p virtiofs vmw_vsock_virtio_transport ext4 \
  crc32c_generic virtio_balloon
guest_initramfs_base
cc -static -Os -o "$R/bin/vsock-echo" "$VSOCK_ECHO_SRC" || die "cc -static $VSOCK_ECHO_SRC failed (needs gcc and libc6-dev)"
chmod 0755 "$R/bin/vsock-echo"
mkdir -p "$R/mnt" "$R/etc"
echo "root:x:0:0:root:/:/bin/sh" >"$R/etc/passwd"
guest_init <<'EOF'
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

EOF
guest_pack
guest_assets_env
guest_publish
