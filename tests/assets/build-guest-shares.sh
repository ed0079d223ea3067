#!/usr/bin/env bash
# Build (and cache) the shares/vsock variant of the test guest (shares, disks, vsock).
# A sibling of build-guest.sh, not a mode of it: its assets have their own
# directory and cache stamp. The steps the two share are in lib-guest.sh.
#
#   $ASSETS/vmlinuz         Debian *generic* kernel (linux-image-<abi>-amd64): the
#                           cloud kernel has virtiofs, fuse and vsock but no 9p
#   $ASSETS/initramfs.img   gzip'd newc cpio: static busybox, the virtio, 9p,
#                           virtiofs, vsock, virtio_balloon, ext4 and crc32c (ext4 metadata_csum,
#                           mke2fs's default), usbcore and xhci_pci (a usb-host
#                           device in /sys/bus/usb/devices) .ko files, /init,
#                           /bin/vsock-echo (vsock-echo.c, built static: busybox
#                           has no vsock applet), /bin/vsock-serve (vsock-serve.c,
#                           an inetd for one vsock port), /bin/vmm-notify
#                           (vmm-notify.c: what systemd-shutdown tells its VMM)
#                           and dropbear with the libraries it links and a host
#                           key made at build time
#   $ASSETS/assets.env      shell-sourceable: KERNEL= INITRD= KVER= GUEST_CMDLINE_*=
#                           SSH_HOST_KEY= (the public half of dropbear's host key,
#                           as an ssh known_hosts line's key part)
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
# PID 1 ends the guest the way an init does, from PID 1 itself: SIGUSR1 makes
# it `exec poweroff -f`, SIGUSR2 `exec reboot -f` (a script's `kill -USR2 1`
# is a reboot from inside, as systemd's `reboot` is). Before either it tells
# its VMM, as systemd-shutdown does: `vmm-notify poweroff|reboot` sends
# `X_SYSTEMD_SHUTDOWN=` to the vsock port of the vmm.notify_socket credential
# on its command line (a firecracker VM with vsock has one), and prints
# `VMM-NOTIFY sent=<verb> port=<port>` (or `VMM-NOTIFY none`). An SSH server for a
# script to start: `vsock-serve 22 /usr/sbin/dropbear -i -s -r
# /etc/dropbear/dropbear_ed25519_host_key` with the client's public key in
# /root/.ssh/authorized_keys.
#
# Cached: the build is skipped when all outputs exist and the recorded sha256 of
# this script (and of lib-guest.sh, guest-cmdline.sh and the C files) matches.
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
VSOCK_SERVE_SRC="$HERE/vsock-serve.c"
VMM_NOTIFY_SRC="$HERE/vmm-notify.c"
ASSETS=${VMWARDEN_TEST_SHARES_ASSETS:-/var/cache/vmwarden/test-assets-shares}
ASSETS_VAR=VMWARDEN_TEST_SHARES_ASSETS
STAMP="$ASSETS/.build-guest-shares.sha256"
HASHED=("$VSOCK_ECHO_SRC" "$VSOCK_SERVE_SRC" "$VMM_NOTIFY_SRC")
TOOLS=(cc ldd dropbearkey)
# shellcheck source=lib-guest.sh
. "$HERE/lib-guest.sh"

guest_begin "$@"
guest_kernel linux-image-amd64
guest_modules \
  virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci \
  virtio_mmio virtio_blk virtio_net qemu_fw_cfg button evdev \
  9pnet_virtio 9p virtiofs vmw_vsock_virtio_transport ext4 \
  crc32c_generic virtio_balloon usbcore xhci_pci
guest_initramfs_base
cc -static -Os -o "$R/bin/vsock-echo" "$VSOCK_ECHO_SRC" || die "cc -static $VSOCK_ECHO_SRC failed (needs gcc and libc6-dev)"
cc -static -Os -o "$R/bin/vsock-serve" "$VSOCK_SERVE_SRC" || die "cc -static $VSOCK_SERVE_SRC failed (needs gcc and libc6-dev)"
chmod 0755 "$R/bin/vsock-echo" "$R/bin/vsock-serve"
# -- the guest's notify socket (guest_reboot): systemd-shutdown's message --
cc -static -Os -o "$R/bin/vmm-notify" "$VMM_NOTIFY_SRC" || die "cc -static $VMM_NOTIFY_SRC failed (needs gcc and libc6-dev)"
chmod 0755 "$R/bin/vmm-notify"
mkdir -p "$R/mnt" "$R/etc" "$R/root"
chmod 0700 "$R/root"
# root's home is /root, not /: dropbear refuses keys under a home that
# others can write, and the initramfs' / is a tmpfs of mode 1777
echo "root:x:0:0:root:/root:/bin/sh" >"$R/etc/passwd"
# dropbear (tests/setup-host.sh installs dropbear-bin) and every library it
# links, at the paths the dynamic loader looks in; a host key of its own,
# whose public half goes into assets.env for the tests' known_hosts
DROPBEAR=/usr/sbin/dropbear
[ -x "$DROPBEAR" ] || die "$DROPBEAR missing (run tests/setup-host.sh: dropbear-bin)"
mkdir -p "$R/usr/sbin" "$R/etc/dropbear"
cp "$DROPBEAR" "$R/usr/sbin/dropbear"
for lib in $(ldd "$DROPBEAR" | awk '$2 == "=>" {print $3} $1 ~ /^\// {print $1}'); do
  mkdir -p "$R$(dirname "$lib")"
  cp -L "$lib" "$R$lib" || die "cannot copy $lib (dropbear's library)"
done
dropbearkey -t ed25519 -f "$R/etc/dropbear/dropbear_ed25519_host_key" >/dev/null 2>&1 \
  || die "dropbearkey -t ed25519 failed"
chmod 0600 "$R/etc/dropbear/dropbear_ed25519_host_key"
SSH_HOST_KEY=$(dropbearkey -y -f "$R/etc/dropbear/dropbear_ed25519_host_key" | awk '$1 == "ssh-ed25519" {print $1 " " $2}')
[ -n "$SSH_HOST_KEY" ] || die "no ssh-ed25519 public key from dropbearkey -y"
guest_init <<'EOF'
# an init's own ending, from PID 1, told to the VMM first (see the header)
trap '/bin/vmm-notify poweroff; exec /bin/busybox poweroff -f' USR1
trap '/bin/vmm-notify reboot; exec /bin/busybox reboot -f' USR2
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
echo "SSH_HOST_KEY='$SSH_HOST_KEY'" >>"$WORK/assets.env"
guest_publish
