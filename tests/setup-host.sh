#!/usr/bin/env bash
# Install the host packages that vmwarden's tests need (Debian 12, run as root).
#
# Idempotent: when everything is present it only runs one dpkg-query and exits
# (well under a second). apt-get update runs only when something is missing.
#
#   qemu-system-x86  qemu-system-x86_64 (TCG guests, microvm/pc)
#   qemu-utils       qemu-img. Installing qemu-system-x86 (7.2, bookworm) removes a
#                    preinstalled backports qemu-utils, so it is (re)installed after.
#   busybox-static   /bin/busybox for the test initramfs (also provides cpio)
#   acl              setfacl/getfacl (grant /dev/kvm to test uids; no udev here)
#   e2fsprogs        mkfs.ext4 -d (rootfs images)
#   debootstrap      systemd rootfs for slow tests
#   kmod             modinfo (module load order when building the initramfs)
#   python3          QMP snippets in the smoke tests
#   zsh, fish        the generated shell completions are loaded and run in
#                    each shell (launcher/tests/cli.rs); bash is always there
#   groff-base       the generated man pages must render without a warning
set -euo pipefail

die() { echo "setup-host.sh: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (uses apt-get)"
command -v dpkg-query >/dev/null 2>&1 || die "not a Debian-based system (no dpkg-query)"

# package -> a command it must provide (checked as well, so a half-removed
# package is repaired)
PKGS=(qemu-system-x86 busybox-static acl e2fsprogs debootstrap kmod python3 zsh fish groff-base)
declare -A CMD_OF=(
  [qemu-system-x86]=qemu-system-x86_64
  [busybox-static]=busybox
  [acl]=setfacl
  [e2fsprogs]=mkfs.ext4
  [debootstrap]=debootstrap
  [kmod]=modinfo
  [python3]=python3
  [zsh]=zsh
  [fish]=fish
  [groff-base]=groff
  [qemu-utils]=qemu-img
)
export PATH="$PATH:/usr/sbin:/sbin"

installed() { # pkg -> 0 if dpkg says "install ok installed"
  [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

missing_of() { # list the packages (args) that are not installed or lack their command
  local p
  for p in "$@"; do
    if ! installed "$p" || ! command -v "${CMD_OF[$p]}" >/dev/null 2>&1; then
      printf '%s\n' "$p"
    fi
  done
}

export DEBIAN_FRONTEND=noninteractive
APT=(apt-get -y -q -o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef
     -o Dpkg::Options::=--force-confold)

mapfile -t missing < <(missing_of "${PKGS[@]}")
updated=0
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup-host.sh: installing: ${missing[*]}"
  "${APT[@]}" update || die "apt-get update failed"
  updated=1
  # --no-install-recommends: skips qemu-system-gui, ovmf, qemu-block-extra etc.
  "${APT[@]}" install --no-install-recommends "${missing[@]}" \
    || die "apt-get install ${missing[*]} failed"
fi

# qemu-utils last: qemu-system-x86 may have removed the backports qemu-utils.
if [ -n "$(missing_of qemu-utils)" ]; then
  echo "setup-host.sh: installing: qemu-utils (qemu-img)"
  [ "$updated" -eq 1 ] || "${APT[@]}" update || die "apt-get update failed"
  "${APT[@]}" install --no-install-recommends qemu-utils || die "apt-get install qemu-utils failed"
fi

mapfile -t still < <(missing_of "${PKGS[@]}" qemu-utils)
[ "${#still[@]}" -eq 0 ] || die "still missing after install: ${still[*]}"

# qemu-system-x86_64 and qemu-img must actually run (catches library mismatches)
qemu-system-x86_64 --version >/dev/null 2>&1 || die "qemu-system-x86_64 --version fails"
qemu-img --version >/dev/null 2>&1 || die "qemu-img --version fails"
busybox cpio --help >/dev/null 2>&1 || die "busybox has no cpio applet"

echo "setup-host.sh: ok ($(qemu-system-x86_64 --version | head -1))"
