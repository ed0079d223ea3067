#!/usr/bin/env bash
# The vmwarden demo: a real microVM launched through vmwarden-launch with a
# demo principal and credential, inspected from the host, stopped through
# QMP, and the host proven clean. Runs as root; touches nothing outside a
# temporary directory (under /var/lib) except a demo system user it removes
# again.
#
#   sudo tests/demo.sh
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "demo.sh: needs root (it builds namespaces and mounts): sudo $0" >&2; exit 1; }

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '   %s\n' "$@"; }

T0=$SECONDS
say "setup: QEMU and busybox, guest kernel + initramfs, release build (side by side)"
# Only what the demo needs: the test run's helper daemons (virtiofsd,
# vhost-device-vsock), Nix tools and the rest come with tests/run-tests.sh.
# The release build does not need the packages, so it runs beside them.
SETUP_LOG=$(mktemp /tmp/vmwarden-demo-setup.XXXXXX)
(cd "$REPO" && cargo build --release --quiet --bin vmwarden-launch --bin vmwarden-cleanup --bin vmwarden) \
  >"$SETUP_LOG.build" 2>&1 &
BUILD_PID=$!
if ! { bash "$REPO/tests/setup-host.sh" --demo && bash "$REPO/tests/assets/build-guest.sh" >"$SETUP_LOG.assets"; } >"$SETUP_LOG" 2>&1; then
  cat "$SETUP_LOG"; kill "$BUILD_PID" 2>/dev/null; wait "$BUILD_PID" 2>/dev/null
  echo "demo.sh: setup failed (above)" >&2; exit 1
fi
show "$(tail -1 "$SETUP_LOG") ($((SECONDS - T0)) s)"
if ! wait "$BUILD_PID"; then
  cat "$SETUP_LOG.build"; echo "demo.sh: cargo build --release failed (above)" >&2; exit 1
fi
show "release build done ($((SECONDS - T0)) s)"
ASSETS_ENV=$(cat "$SETUP_LOG.assets")
rm -f "$SETUP_LOG" "$SETUP_LOG.build" "$SETUP_LOG.assets"
# shellcheck disable=SC1090
. "$ASSETS_ENV"
BIN="$REPO/target/release"

# Not /tmp: the launcher refuses credential files (and kernels, binaries)
# in a directory anyone but root can write, sticky or not.
DEMO=$(mktemp -d /var/lib/vmwarden-demo.XXXXXX)
chmod 0755 "$DEMO"
USER_NAME=vm-demo
created_user=0
QEMU_PID=
cleanup_demo() {
  [ -n "$QEMU_PID" ] && kill -9 "$QEMU_PID" 2>/dev/null || true
  [ "$created_user" = 1 ] && userdel "$USER_NAME" 2>/dev/null || true
  rm -rf "$DEMO"
}
trap cleanup_demo EXIT
if ! id "$USER_NAME" >/dev/null 2>&1; then
  useradd --system --no-create-home --user-group --shell /usr/sbin/nologin "$USER_NAME"
  created_user=1
fi
export VMWARDEN_CONFIG_DIR=$DEMO/etc VMWARDEN_RUNTIME_ROOT=$DEMO/run VMWARDEN_STATE_ROOT=$DEMO/state
mkdir -p "$VMWARDEN_CONFIG_DIR" "$DEMO/secrets"
printf 'hunter2-%s' "$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')" > "$DEMO/secrets/db-password"
chmod 0600 "$DEMO/secrets/db-password"
CMDLINE=$(bash "$REPO/tests/assets/guest-cmdline.sh" microvm hold tcg)
cat > "$VMWARDEN_CONFIG_DIR/web.json" <<EOF
{
  "version": 1,
  "name": "web",
  "principal": { "user": "$USER_NAME", "group": "$USER_NAME" },
  "hypervisor": { "kind": "qemu", "binary": "$(command -v qemu-system-x86_64)", "accel": "tcg", "machine": "microvm" },
  "vcpus": 1, "memory_mib": 256,
  "kernel": "$KERNEL", "initrd": "$INITRD", "cmdline": "$CMDLINE",
  "credentials": [ { "name": "db-password", "source": { "path": "$DEMO/secrets/db-password" } } ],
  "landlock": { "mode": "required", "read": [], "write": [] }
}
EOF
say "the launch spec ($VMWARDEN_CONFIG_DIR/web.json)"
sed 's/^/   /' "$VMWARDEN_CONFIG_DIR/web.json"

say "launch: vmwarden-launch web (the process becomes QEMU: execve, same pid)"
"$BIN/vmwarden-launch" web > "$DEMO/serial.log" 2>&1 &
QEMU_PID=$!
"$BIN/vmwarden" wait-ready web --timeout 60 | sed 's/^/   /'
for _ in $(seq 1 900); do grep -q '^VMWARDEN-GUEST-READY' "$DEMO/serial.log" && break; sleep 0.1; done
grep -q '^VMWARDEN-GUEST-READY' "$DEMO/serial.log" || { echo "guest never became ready:"; cat "$DEMO/serial.log"; exit 1; }
show "guest console: $(grep '^VMWARDEN-GUEST-READY' "$DEMO/serial.log")"

say "what the hypervisor process is (from the host)"
show "$(ps -o pid=,user=,group=,comm= -p "$QEMU_PID")"
grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' "/proc/$QEMU_PID/status" | sed 's/^/   /'
show "mount namespace: VM $(readlink "/proc/$QEMU_PID/ns/mnt")   host $(readlink /proc/self/ns/mnt)"
show "credential tmpfs inside the VM's namespace:"
grep 'vmwarden-creds:web' "/proc/$QEMU_PID/mountinfo" | sed 's/^/     /'
show "credential tmpfs in the host's namespace: $(grep -c 'vmwarden-creds' /proc/self/mountinfo || true) mounts"
HOST_SHA=$(sha256sum < "$DEMO/secrets/db-password" | cut -d' ' -f1)
show "secret on the host   sha256=$HOST_SHA"
show "secret in the guest  $(grep '^VMWARDEN-CRED name=db-password' "$DEMO/serial.log")"
if tr '\0' '\n' < "/proc/$QEMU_PID/cmdline" | grep -qF "$(cat "$DEMO/secrets/db-password")"; then
  echo "   SECRET FOUND IN ARGV"; exit 1
fi
show "argv carries only the tmpfs path: $(tr '\0' ' ' < "/proc/$QEMU_PID/cmdline" | grep -o -- '-fw_cfg [^ ]*')"
show "environment: $(tr '\0' ' ' < "/proc/$QEMU_PID/environ")"

say "vmwarden status (QMP over control/qmp.sock answers in CONTROL), and a second launch"
"$BIN/vmwarden" status | sed 's/^/   /'
if "$BIN/vmwarden-launch" web 2> "$DEMO/second.err"; then echo "   second launch was not refused"; exit 1; fi
sed 's/^/   /' "$DEMO/second.err"

say "the spec changes while the VM runs (a rebuild with restartIfChanged = false): outdated"
sed -i 's/"memory_mib": 256/"memory_mib": 384/' "$VMWARDEN_CONFIG_DIR/web.json"
"$BIN/vmwarden" status | sed 's/^/   /'
show "the running instance keeps the spec it was launched from: $VMWARDEN_RUNTIME_ROOT/web/launched-spec.json"

say "stop: vmwarden stop web (ACPI power button through QMP)"
"$BIN/vmwarden" stop web --timeout 30 | sed 's/^/   /'
wait "$QEMU_PID" || true
QEMU_PID=
show "guest console: $(grep '^VMWARDEN-GUEST-POWERBUTTON' "$DEMO/serial.log")"

say "teardown with proof: vmwarden-cleanup web (what ExecStopPost runs)"
"$BIN/vmwarden-cleanup" web | python3 -m json.tool | sed 's/^/   /'

say "status after the stop"
"$BIN/vmwarden" status | sed 's/^/   /'

say "verify-clean and a reap dry run"
"$BIN/vmwarden" verify-clean web | sed 's/^/   /'
"$BIN/vmwarden" reap | sed 's/^/   /'
show "processes of $USER_NAME: $(pgrep -u "$USER_NAME" -c || true)   vmwarden mounts anywhere: $(cat /proc/[0-9]*/mountinfo 2>/dev/null | grep -c 'vmwarden-creds' || true)"
say "demo done: launched, inspected, stopped, proven clean in $((SECONDS - T0)) s (setup and release build included)"
