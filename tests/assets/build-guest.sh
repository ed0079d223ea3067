#!/usr/bin/env bash
# Build (and cache) the tiny test guest used by vmwarden's integration tests:
#
#   $ASSETS/vmlinuz         Debian cloud kernel (bzImage), taken out of its .deb
#                           with apt-get download + dpkg-deb -x (nothing goes to /boot)
#   $ASSETS/initramfs.img   gzip'd newc cpio: static busybox, a few .ko files, /init
#   $ASSETS/assets.env      shell-sourceable: KERNEL= INITRD= KVER= GUEST_CMDLINE_*=
#
# ASSETS=${VMWARDEN_TEST_ASSETS:-/var/cache/vmwarden/test-assets}
#
# Cached: the build is skipped when all outputs exist and the recorded sha256 of
# this script (and of lib-guest.sh and guest-cmdline.sh) matches. Outputs are
# written to a temp dir on the same filesystem and renamed into place; the stamp
# is written last, so an interrupted build is never mistaken for a cached one.
# Concurrent callers serialise on a flock. Outputs are 0644 and the directory
# 0755, so QEMU running as an unprivileged uid can read them. The steps it
# shares with build-guest-shares.sh are in lib-guest.sh.
#
# Usage: build-guest.sh [--force]     prints the assets.env path on stdout
# Needs: apt-get, apt-cache, dpkg-deb, busybox (busybox-static), modinfo (kmod),
#        gzip, sha256sum, flock. Run tests/setup-host.sh first.
# The guest's behaviour (markers, vmwarden.mode=) is described in README.md.
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
ASSETS=${VMWARDEN_TEST_ASSETS:-/var/cache/vmwarden/test-assets}
ASSETS_VAR=VMWARDEN_TEST_ASSETS
STAMP="$ASSETS/.build-guest.sha256"
HASHED=()
TOOLS=()
# The steps both test guests share (the cache logic, the kernel, the module
# order, the initramfs, assets.env); see its header.
# shellcheck source=lib-guest.sh
. "$HERE/lib-guest.sh"

guest_begin "$@"
guest_kernel linux-image-cloud-amd64
guest_modules \
  virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci \
  virtio_mmio virtio_blk virtio_net qemu_fw_cfg button evdev
guest_initramfs_base
guest_init </dev/null
guest_pack
guest_assets_env
guest_publish
