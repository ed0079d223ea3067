#!/usr/bin/env bash
# End-to-end smoke test of the test guest with plain QEMU (no launcher), TCG.
#
# Each case boots the guest in hold mode with two fw_cfg credentials read from
# files and a QMP socket, checks the two VMWARDEN-CRED lines (sha256 of the
# files), VMWARDEN-GUEST-READY, then sends QMP qmp_capabilities +
# system_powerdown and expects VMWARDEN-GUEST-POWERBUTTON, a SHUTDOWN event and
# QEMU exiting with status 0.
#
# Cases (default: all three):
#   microvm-root      microvm, QEMU as root
#   microvm-user      microvm, QEMU as uid/gid $SMOKE_UID (61001) via setpriv,
#                     -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny
#   pc-user           same on -machine pc
#
# Usage: smoke.sh [CASE...]        (root; run tests/setup-host.sh first)
# Env:   SMOKE_UID (61001), SMOKE_TIMEOUT (seconds to READY, 60), KEEP=1 keeps the work dir
# Prints one "SMOKE-RESULT case=... ready_s=... exit_s=..." line per case.
set -euo pipefail

die() { echo "smoke.sh: ERROR: $*" >&2; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ "$(id -u)" -eq 0 ] || die "run as root (creates files for, and switches to, uid ${SMOKE_UID:-61001})"
for c in qemu-system-x86_64 python3 setpriv sha256sum; do
  command -v "$c" >/dev/null 2>&1 || die "'$c' not found (run tests/setup-host.sh)"
done

ENV_FILE=$("$HERE/build-guest.sh") || die "build-guest.sh failed"
# shellcheck source=/dev/null
. "$ENV_FILE"
[ -r "$KERNEL" ] && [ -r "$INITRD" ] || die "assets missing: $KERNEL $INITRD"

SMOKE_UID=${SMOKE_UID:-61001}
TIMEOUT=${SMOKE_TIMEOUT:-60}
CASES=("$@")
[ "${#CASES[@]}" -gt 0 ] || CASES=(microvm-root microvm-user pc-user)

TOP=$(mktemp -d /tmp/vmwarden-smoke.XXXXXX)
chmod 0755 "$TOP"
if [ "${KEEP:-0}" = 1 ]; then
  echo "smoke.sh: keeping $TOP" >&2
else
  trap 'rm -rf "$TOP"' EXIT
fi

run_case() {
  local name=$1 machine user dir
  case "$name" in
    microvm-root) machine=microvm user=root ;;
    microvm-user) machine=microvm user=unpriv ;;
    pc-user) machine=pc user=unpriv ;;
    *) die "unknown case $name (microvm-root, microvm-user, pc-user)" ;;
  esac
  dir="$TOP/$name"
  mkdir -m 0700 "$dir"
  printf 'vmwarden smoke secret one\n' >"$dir/cred-a"
  head -c 4099 /dev/urandom >"$dir/cred-b"   # binary, not a multiple of 4 KiB
  chmod 0600 "$dir/cred-a" "$dir/cred-b"

  local -a prefix=() extra=()
  local want_uid=0 want_seccomp=0
  if [ "$user" = unpriv ]; then
    want_uid=$SMOKE_UID want_seccomp=2
    chown -R "$SMOKE_UID:$SMOKE_UID" "$dir"
    prefix=(setpriv --reuid="$SMOKE_UID" --regid="$SMOKE_UID" --clear-groups
            --inh-caps=-all --bounding-set=-all --)
    extra=(-sandbox "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
  fi

  local -a qemu=(
    qemu-system-x86_64 -accel tcg -cpu max
    -machine "$("$HERE/guest-cmdline.sh" --machine "$machine")"
    -m 256 -smp 1
    -nodefaults -no-user-config -display none -serial stdio -no-reboot
    -kernel "$KERNEL" -initrd "$INITRD"
    -append "$("$HERE/guest-cmdline.sh" "$machine" hold tcg)"
    -fw_cfg "name=opt/io.systemd.credentials/smoke.a,file=$dir/cred-a"
    -fw_cfg "name=opt/io.systemd.credentials/smoke_b,file=$dir/cred-b"
    -qmp "unix:$dir/qmp.sock,server=on,wait=off"
    "${extra[@]}"
  )
  local sum_a sum_b
  sum_a=$(sha256sum <"$dir/cred-a"); sum_a=${sum_a%% *}
  sum_b=$(sha256sum <"$dir/cred-b"); sum_b=${sum_b%% *}

  echo "smoke.sh: [$name] ${prefix[*]} ${qemu[*]}" >&2
  python3 - "$name" "$dir" "$TIMEOUT" "$sum_a" "$sum_b" "$want_uid" "$want_seccomp" \
    "${prefix[@]}" "${qemu[@]}" <<'PY'
import json, os, socket, subprocess, sys, threading, time

name, d, timeout, sum_a, sum_b, want_uid, want_seccomp = sys.argv[1:8]
cmd = sys.argv[8:]
timeout = float(timeout)
expect_creds = {
    f"VMWARDEN-CRED name=smoke.a sha256={sum_a}",
    f"VMWARDEN-CRED name=smoke_b sha256={sum_b}",
}
lines, cond = [], threading.Condition()

def fail(msg):
    print(f"smoke.sh: [{name}] FAIL: {msg}", file=sys.stderr)
    print("---- console ----", file=sys.stderr)
    with cond:
        for l in lines:
            print("  " + l, file=sys.stderr)
    if proc.poll() is None:
        proc.kill()
    sys.exit(1)

def reader():
    for raw in proc.stdout:
        with cond:
            lines.append(raw.decode(errors="replace").rstrip("\r\n"))
            cond.notify_all()
    with cond:
        cond.notify_all()

def wait_line(pred, deadline):
    with cond:
        while True:
            for l in lines:
                if pred(l):
                    return l
            if proc.poll() is not None and not reader_t.is_alive():
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            cond.wait(min(left, 0.05))

t0 = time.monotonic()
proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT)
reader_t = threading.Thread(target=reader, daemon=True)
reader_t.start()

ready = wait_line(lambda l: l.startswith("VMWARDEN-GUEST-READY uptime="), t0 + timeout)
if ready is None:
    fail(f"no VMWARDEN-GUEST-READY within {timeout:.0f}s (qemu rc={proc.poll()})")
t_ready = time.monotonic() - t0
with cond:
    creds = [l for l in lines if l.startswith("VMWARDEN-CRED")]
if set(creds) != expect_creds or len(creds) != 2:
    fail(f"credential lines {creds!r}, expected {sorted(expect_creds)!r}")

# QEMU really runs as the expected uid, seccomp-filtered when -sandbox on
# (setpriv execs QEMU, so proc.pid is QEMU's pid)
status = {}
with open(f"/proc/{proc.pid}/status") as st:
    for l in st:
        k, _, v = l.partition(":")
        status[k] = v.split()
if status.get("Uid", [None])[0:2] != [want_uid, want_uid] or status["Gid"][0:2] != [want_uid, want_uid]:
    fail(f"QEMU Uid={status.get('Uid')} Gid={status.get('Gid')}, want {want_uid}")
if status.get("Seccomp", ["0"])[0] != want_seccomp:
    fail(f"QEMU Seccomp={status.get('Seccomp')}, want {want_seccomp}")

# QMP: greeting, qmp_capabilities, system_powerdown
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(os.path.join(d, "qmp.sock"))
except OSError as e:
    fail(f"QMP connect: {e}")
f = s.makefile("rwb", buffering=0)

def recv():
    raw = f.readline()
    if not raw:
        return None
    return json.loads(raw)

def command(execute):
    f.write(json.dumps({"execute": execute}).encode() + b"\n")
    while True:
        msg = recv()
        if msg is None:
            fail(f"QMP closed while waiting for the reply to {execute}")
        if "event" in msg:
            events.append(msg)
            continue
        if "return" not in msg:
            fail(f"QMP {execute}: {msg}")
        return msg

events = []
greeting = recv()
if not greeting or "QMP" not in greeting:
    fail(f"bad QMP greeting {greeting!r}")
command("qmp_capabilities")
t_pd = time.monotonic()
command("system_powerdown")

pb = wait_line(lambda l: l.startswith("VMWARDEN-GUEST-POWERBUTTON"), time.monotonic() + 30)
if pb is None:
    fail("no VMWARDEN-GUEST-POWERBUTTON after system_powerdown")
try:
    rc = proc.wait(timeout=30)
except subprocess.TimeoutExpired:
    fail("QEMU did not exit within 30s of system_powerdown")
t_exit = time.monotonic()
s.settimeout(2)
try:
    while True:
        msg = recv()
        if msg is None:
            break
        if "event" in msg:
            events.append(msg)
except (OSError, ValueError):
    pass
reader_t.join(5)
if rc != 0:
    fail(f"QEMU exit status {rc}")
shutdown = [e for e in events if e.get("event") == "SHUTDOWN"]
if not shutdown or not shutdown[0].get("data", {}).get("guest"):
    fail(f"no guest SHUTDOWN event (events: {[e.get('event') for e in events]})")
print(f"SMOKE-RESULT case={name} ready_s={t_ready:.2f} guest_{ready.split()[1]} "
      f"powerdown_to_exit_s={t_exit - t_pd:.2f} exit_s={t_exit - t0:.2f} qemu_rc={rc}")
PY
}

for c in "${CASES[@]}"; do
  run_case "$c"   # set -e: a failing case ends the script with its status
done
echo "smoke.sh: all ${#CASES[@]} case(s) passed" >&2
