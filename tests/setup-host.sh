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
#   e2fsprogs        mkfs.ext4 -d (rootfs images); mkfs.ext4 for disks[].create; debugfs
#   debootstrap      systemd rootfs for slow tests
#   kmod             modinfo (module load order when building the initramfs)
#   python3          QMP snippets in the smoke tests
#   zsh, fish        the generated shell completions are loaded and run in
#                    each shell (launcher/tests/cli.rs); bash is always there
#   groff-base       the generated man pages must render without a warning
#   libseccomp-dev, libcap-ng-dev, pkg-config
#                    build dependencies of virtiofsd (below)
#   gcc, libc6-dev   cc -static of the shares guest's vsock endpoint
#                    (tests/assets/vsock-echo.c)
#   xfsprogs         mkfs.xfs: adopt's reflinks are tested on a loop-mounted
#                    XFS (launcher/tests/adopt.rs)
#   dropbear-bin     the shares guest's SSH server (dropbear -i behind a vsock
#                    listener; binaries only, no service on this host) and its
#                    host key (dropbearkey), for `ssh vsock/<cid>`
#   openssh-client   ssh-keygen: the systemd suite's per-run client key
#   passt            user networking for QEMU guests (interfaces of type "user"),
#                    one per VM, run as its principal
#   iproute2         ip: the user-networking tests make a network namespace with a
#                    template interface (a bridge) of their own
#   supervisor       supervisord: what microvm.nix's runner starts its virtiofsds
#                    under; tests/bench/scale.sh counts its memory beside them
#   strace           the lock tables of tests/bench/scale.sh and of the systemd
#                    suite's fifty_units (run.sh puts it in L2 when named)
#
# Then the two vhost-user daemons of shares and vsock, which Debian 12 does not
# package, built with `cargo install --locked` at pinned versions into
# $VMWARDEN_TEST_CARGO_ROOT (default /var/cache/vmwarden-test/cargo, bin/ under
# it). Skipped when bin/NAME exists and cargo's own record
# (.crates2.json) says that version is installed: a cached run costs one
# python3 read of that file.
#   virtiofsd           one per virtiofs share (run as the VM's principal)
#   vhost-device-vsock  the vsock "user" backend (hybrid vsock over a unix socket)
#
# Usage: setup-host.sh [--demo]
#   --demo   only what tests/demo.sh needs: qemu-system-x86, busybox-static and
#            kmod (the guest's initramfs and QEMU). No daemons, no qemu-utils.
set -euo pipefail

MODE=all
case "${1:-}" in
  "") ;;
  --demo) MODE=demo ;;
  *) echo "setup-host.sh: unknown argument '$1' (usage: setup-host.sh [--demo])" >&2; exit 2 ;;
esac

die() { echo "setup-host.sh: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (uses apt-get)"
command -v dpkg-query >/dev/null 2>&1 || die "not a Debian-based system (no dpkg-query)"

# package -> a command it must provide (checked as well, so a half-removed
# package is repaired)
PKGS=(qemu-system-x86 busybox-static acl e2fsprogs debootstrap kmod python3 zsh fish groff-base
      libseccomp-dev libcap-ng-dev pkg-config gcc libc6-dev xfsprogs dropbear-bin openssh-client passt iproute2
      libnss-extrausers supervisor strace)
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
  [libseccomp-dev]=true
  [libcap-ng-dev]=true
  [pkg-config]=pkg-config
  [gcc]=cc
  [libc6-dev]=true
  [xfsprogs]=mkfs.xfs
  [dropbear-bin]=dropbearkey
  [openssh-client]=ssh-keygen
  [passt]=passt
  [iproute2]=ip
  # an NSS source the id-range tests install accounts through (id_ranges.rs)
  [libnss-extrausers]=true
  [qemu-utils]=qemu-img
  [supervisor]=supervisord
  [strace]=strace
)
export PATH="$PATH:/usr/sbin:/sbin"
[ "$MODE" = demo ] && PKGS=(qemu-system-x86 busybox-static kmod)

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

if [ "$MODE" = demo ]; then
  qemu-system-x86_64 --version >/dev/null 2>&1 || die "qemu-system-x86_64 --version fails"
  echo "setup-host.sh: ok for the demo ($(qemu-system-x86_64 --version | head -1))"
  exit 0
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

# ---------------------------------------------------------------- promtool
# `promtool check metrics` checks `vmwarden metrics`' output. It is in
# Debian's `prometheus` package, whose install would also start a Prometheus
# server (a daemon and a port) on a host with systemd: only the promtool
# binary is taken out of the package, into /usr/local/bin.
PROMTOOL=/usr/local/bin/promtool
if ! "$PROMTOOL" --version >/dev/null 2>&1; then
  echo "setup-host.sh: extracting promtool from Debian's prometheus package"
  prom_tmp=$(mktemp -d)
  [ "$updated" -eq 1 ] || "${APT[@]}" update || die "apt-get update failed"
  updated=1
  (cd "$prom_tmp" && apt-get download prometheus) || die "apt-get download prometheus failed"
  dpkg-deb --fsys-tarfile "$prom_tmp"/prometheus_*.deb \
    | tar -x -C "$prom_tmp" ./usr/bin/promtool || die "promtool not found in the prometheus package"
  install -m 0755 -o root -g root "$prom_tmp/usr/bin/promtool" "$PROMTOOL"
  rm -rf "$prom_tmp"
  "$PROMTOOL" --version >/dev/null 2>&1 || die "$PROMTOOL --version fails"
fi

# ---------------------------------------------------------------- vhost-user daemons
CARGO_ROOT=${VMWARDEN_TEST_CARGO_ROOT:-/var/cache/vmwarden-test/cargo}
# name -> version; bump here (and only here) to rebuild.
declare -A CRATE_VERSION=(
  [virtiofsd]=1.14.0
  [vhost-device-vsock]=0.3.0
)
crate_installed() { # crate version -> 0 if cargo recorded exactly that version in CARGO_ROOT
  [ -x "$CARGO_ROOT/bin/$1" ] || return 1
  [ -r "$CARGO_ROOT/.crates2.json" ] || return 1
  python3 - "$CARGO_ROOT/.crates2.json" "$1" "$2" <<'PY'
import json, sys
path, name, version = sys.argv[1:]
installs = json.load(open(path)).get("installs", {})
sys.exit(0 if any(k.startswith(f"{name} {version} ") for k in installs) else 1)
PY
}
for crate in virtiofsd vhost-device-vsock; do
  v=${CRATE_VERSION[$crate]}
  crate_installed "$crate" "$v" && continue
  command -v cargo >/dev/null 2>&1 || die "cargo not found: needed to build $crate $v"
  echo "setup-host.sh: building $crate $v into $CARGO_ROOT (a few minutes, once)"
  mkdir -p "$CARGO_ROOT"
  # Its own target dir under the root, so an interrupted build resumes.
  CARGO_TARGET_DIR="$CARGO_ROOT/target" \
    cargo install --quiet --locked --root "$CARGO_ROOT" --version "=$v" "$crate" \
    || die "cargo install $crate $v failed"
  crate_installed "$crate" "$v" || die "$crate $v not recorded in $CARGO_ROOT after cargo install"
done
# Trust: the daemons run as VM principals and the launcher refuses binaries a
# non-root user can write (the same rule as for hypervisors): root-owned,
# not group/world-writable, every parent too.
chown -R root:root "$CARGO_ROOT/bin"
chmod 0755 "$CARGO_ROOT" "$CARGO_ROOT/bin"
chmod go-w "$CARGO_ROOT"/bin/*
d=$CARGO_ROOT
while [ "$d" != / ]; do chmod go-w "$d"; d=$(dirname "$d"); done
"$CARGO_ROOT/bin/virtiofsd" --version >/dev/null 2>&1 || die "$CARGO_ROOT/bin/virtiofsd --version fails"
"$CARGO_ROOT/bin/vhost-device-vsock" --help >/dev/null 2>&1 || die "$CARGO_ROOT/bin/vhost-device-vsock --help fails"

echo "setup-host.sh: ok ($(qemu-system-x86_64 --version | head -1); $("$CARGO_ROOT/bin/virtiofsd" --version | head -1); vhost-device-vsock ${CRATE_VERSION[vhost-device-vsock]} in $CARGO_ROOT/bin)"
