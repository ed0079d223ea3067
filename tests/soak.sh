#!/usr/bin/env bash
# The soak: start and stop 2 VMs through the real binaries, cycle after
# cycle, and prove nothing is left or grows (docs/soak.md).
#
#   sudo tests/soak.sh --cycles N [--no-boot-wait] [--load-rate R] [--until TIME] [--wide W]
#
# --until TIME (anything `date -d` reads): start no cycle after TIME; the
# report then covers the cycles run (and says so).
#
# Each cycle launches both VMs (vmwarden-launch, QEMU TCG, the busybox test
# guest in hold mode, a file credential on the noswap tmpfs, a tap each),
# waits until `vmwarden wait-ready` answers and the guest prints its ready
# line, then stops them together: `vmwarden stop` (ACPI power button, then
# quit, then SIGKILL) and, in every fifth cycle, SIGKILL of the hypervisor
# instead. Then vmwarden-cleanup
# (what ExecStopPost runs) and `vmwarden verify-clean` for both; every
# finding of verify-clean or cleanup counts as residue. A host load
# generator (tests/soak-load.c: R short-lived processes a second and a
# niced CPU burner, default 2000/s) runs beside it and stops by itself.
#
# --wide W: in the first cycle, after its two VMs, W more VMs (numeric
# principals VMWARDEN_TEST_UID_BASE+901.., default base 61000; a credential
# each, QEMU held at -S by extra_args so that no guest runs and the round
# costs seconds, not W TCG boots) are launched at once and are all up
# together (wait-ready), then stop at once (half by `vmwarden stop`, half
# by SIGKILL), each is cleaned up and verify-clean'd like the others: their
# findings are residue, and the fds/mounts/taps/run-bytes comparisons
# cover them. Its line: `wide: W VMs up at once in X ms, stop+cleanup+verify Y ms`.
#
# --no-boot-wait: stop as soon as wait-ready answers, without waiting for
# the guest's ready line; `stop` then waits 2 s (not 30) for the power
# button, which usually finds no acpid yet, and goes on to quit: cycles
# not bound by the guest's TCG boot.
#
# Measured before the first cycle and after the last:
#   fds       open fds anywhere on the host that point into the soak's
#             config/runtime/state dirs, at /dev/net/tun or /dev/kvm, plus
#             the soak's own (other processes on a shared machine do not
#             count; what a leak would hold does)
#   mounts    mounts in the host's namespace, plus vmwarden credential
#             tmpfs mounts in every namespace
#   taps      tun/tap interfaces on the host
#   run-bytes bytes of the files under /run (the runtime root is there), after
#             cycle 1 (each VM's runtime dir and lease stay by design) -> end,
#             each VM's last-cleanup.json left out (its counters grow a digit)
# cycle-ms is the root tools' time in a cycle: launch until wait-ready
# answers, plus cleanup, for both VMs (the guest's boot and the stop's
# wait for the guest are not included); first10/last10 are the averages of
# the first and last 10 cycles.
# Last line:
#   soak: N cycles, R residue, fds A->B, mounts A->B, taps A->B, run-bytes A->B, cycle-ms first10 X last10 Y
# Exits non-zero on residue, on fds/mounts/taps that differ, on /run usage
# after the last cycle other than after the first (the first leaves each
# VM's runtime dir with its instance.lock, by design) or grown by more than
# 64 KiB in all (the --wide VMs' runtime dirs left out), or on last10 over
# twice first10.
# Root integration: run it under the root-tests lock (flock).
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin:$HOME/.cargo/bin"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

cycles=; boot_wait=1; load_rate=2000; until=0; wide=0
while [ $# -gt 0 ]; do
  case $1 in
    --cycles) cycles=${2:?--cycles N}; shift 2 ;;
    --no-boot-wait) boot_wait=0; shift ;;
    --load-rate) load_rate=${2:?--load-rate R}; shift 2 ;;
    --until) until=$(date -d "${2:?--until TIME}" +%s) || exit 2; shift 2 ;;
    --wide) wide=${2:?--wide W}; shift 2 ;;
    -h | --help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ ${cycles:-} =~ ^[1-9][0-9]*$ ]] || { echo "soak.sh: give --cycles N (N >= 1)" >&2; exit 2; }
[[ $load_rate =~ ^[0-9]+$ ]] || { echo "soak.sh: --load-rate takes a number" >&2; exit 2; }
[[ $wide =~ ^[0-9]+$ ]] || { echo "soak.sh: --wide takes a number" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "soak.sh: needs root (namespaces, mounts, taps, other uids): sudo $0" >&2; exit 1; }

fail() { echo "soak.sh: $*" >&2; echo "soak: 0 cycles, 1 residue, fds 0->0, mounts 0->0, taps 0->0, run-bytes 0->0, cycle-ms first10 0 last10 0"; exit 1; }
ms() { date +%s%3N; }

# ------------------------------------------------------------------ setup
bash "$REPO/tests/setup-host.sh" --demo >/dev/null 2>&1 || fail "tests/setup-host.sh --demo failed"
ASSETS_ENV=$(bash "$REPO/tests/assets/build-guest.sh") || fail "tests/assets/build-guest.sh failed"
# shellcheck disable=SC1090
. "$ASSETS_ENV"
if [ -n "${VMWARDEN_BIN:-}" ]; then
  BIN=$VMWARDEN_BIN
else
  (cd "$REPO" && cargo build --release --quiet --bin vmwarden-launch --bin vmwarden-cleanup --bin vmwarden) \
    || fail "cargo build --release failed"
  BIN=$REPO/target/release
fi
for b in vmwarden-launch vmwarden-cleanup vmwarden; do [ -x "$BIN/$b" ] || fail "no $BIN/$b"; done
QEMU=$(command -v qemu-system-x86_64) || fail "no qemu-system-x86_64"

# Not /tmp: the launcher refuses files in a directory others can write.
DIR=$(mktemp -d /var/lib/vmwarden-soak.XXXXXX)
chmod 0755 "$DIR"
RUNROOT=$(mktemp -d /run/vmwarden-soak.XXXXXX)
chmod 0755 "$RUNROOT"
cc -O2 -o "$DIR/soak-load" "$REPO/tests/soak-load.c" || fail "cc tests/soak-load.c failed"
VMS=(soak1 soak2)
WIDE=(); for i in $(seq 1 "$wide"); do WIDE+=("$(printf 'soakw%02d' "$i")"); done
declare -A PID=() USERS_MADE=()
LOAD_PID=
finish() {
  [ -n "$LOAD_PID" ] && kill "$LOAD_PID" 2>/dev/null
  for vm in "${VMS[@]}" "${WIDE[@]}"; do
    if [ -n "${PID[$vm]:-}" ]; then kill -9 "${PID[$vm]}" 2>/dev/null; wait "${PID[$vm]}" 2>/dev/null; fi
    "$BIN/vmwarden-cleanup" "$vm" >/dev/null 2>&1
  done
  for u in "${!USERS_MADE[@]}"; do userdel "$u" 2>/dev/null; done
  rm -rf "$DIR" "$RUNROOT"
}
trap finish EXIT
export VMWARDEN_CONFIG_DIR=$DIR/etc VMWARDEN_RUNTIME_ROOT=$RUNROOT VMWARDEN_STATE_ROOT=$DIR/state
mkdir -p "$VMWARDEN_CONFIG_DIR" "$DIR/secrets" "$DIR/logs"
CMDLINE=$(bash "$REPO/tests/assets/guest-cmdline.sh" microvm hold tcg)
for vm in "${VMS[@]}"; do
  u=vm-$vm
  if ! id "$u" >/dev/null 2>&1; then
    useradd --system --no-create-home --user-group --shell /usr/sbin/nologin "$u" || fail "useradd $u"
    USERS_MADE[$u]=1
  fi
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/secrets/$vm"
  chmod 0600 "$DIR/secrets/$vm"
  cat >"$VMWARDEN_CONFIG_DIR/$vm.json" <<EOF
{
  "version": 1,
  "name": "$vm",
  "principal": { "user": "$u", "group": "$u" },
  "hypervisor": { "kind": "qemu", "binary": "$QEMU", "accel": "tcg", "machine": "microvm" },
  "vcpus": 1, "memory_mib": 128,
  "kernel": "$KERNEL", "initrd": "$INITRD", "cmdline": "$CMDLINE",
  "credentials": [ { "name": "token", "source": { "path": "$DIR/secrets/$vm" } } ],
  "interfaces": [ { "tap": "vmw-$vm" } ],
  "landlock": { "mode": "required", "read": [], "write": [] }
}
EOF
done

wuid=$(( ${VMWARDEN_TEST_UID_BASE:-61000} + 900 ))
for vm in "${WIDE[@]}"; do
  wuid=$((wuid + 1))
  cp "$DIR/secrets/${VMS[0]}" "$DIR/secrets/$vm"
  cat >"$VMWARDEN_CONFIG_DIR/$vm.json" <<EOF
{
  "version": 1,
  "name": "$vm",
  "principal": { "uid": $wuid, "gid": $wuid },
  "hypervisor": { "kind": "qemu", "binary": "$QEMU", "accel": "tcg", "machine": "microvm", "extra_args": ["-S"] },
  "vcpus": 1, "memory_mib": 128,
  "kernel": "$KERNEL", "initrd": "$INITRD", "cmdline": "$CMDLINE",
  "credentials": [ { "name": "token", "source": { "path": "$DIR/secrets/$vm" } } ],
  "landlock": { "mode": "required", "read": [], "write": [] }
}
EOF
done

# ------------------------------------------------------------ measurements
count_fds() {
  local n=0 l
  for l in /proc/[0-9]*/fd/*; do
    l=$(readlink "$l" 2>/dev/null) || continue
    case $l in "$DIR"/* | "$RUNROOT"/* | /dev/net/tun | /dev/kvm) n=$((n + 1)) ;; esac
  done
  echo $((n + $(find /proc/$$/fd -mindepth 1 -maxdepth 1 | wc -l)))
}
count_mounts() {
  local host creds
  host=$(wc -l </proc/1/mountinfo)
  creds=$(cat /proc/[0-9]*/mountinfo 2>/dev/null | grep -c 'vmwarden-creds')
  echo $((host + creds))
}
count_taps() { find /sys/class/net -mindepth 1 -maxdepth 1 -exec test -e '{}/tun_flags' \; -print | wc -l; }
# /run is a tmpfs on most hosts, part of / on some: count the bytes of the
# files under it either way, not the file system's usage.
# Each VM's last cleanup's record (last-cleanup.json, kept by design like
# the lease, bounded at 4 KiB) is left out: its counters gain a digit as
# the cycles go (9 -> 10 instances), which is no leak.
run_bytes() { du -sxb --exclude=last-cleanup.json /run 2>/dev/null | tail -1 | cut -f1; }

# ------------------------------------------------------------------ cycles
launch() { # VM CYCLE
  "$BIN/vmwarden-launch" "$1" >"$DIR/logs/$1.serial" 2>&1 &
  PID[$1]=$!
}
ready_line() { # VM: wait for the guest's ready line (at most 120 s)
  local i
  for i in $(seq 1 1200); do
    grep -q '^VMWARDEN-GUEST-READY' "$DIR/logs/$1.serial" && return 0
    kill -0 "${PID[$1]}" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
note() { echo "  $*" >>"$DIR/logs/findings"; }
# The wide round (--wide): every VM of WIDE launched at once, all up
# together, stopped at once, cleaned up and verified.
wide_round() {
  local vm t0 t1 t2 i=0 n
  declare -A WSTOP=()
  t0=$(ms)
  for vm in "${WIDE[@]}"; do launch "$vm" 1; done
  for vm in "${WIDE[@]}"; do
    "$BIN/vmwarden" wait-ready "$vm" --timeout 120 >"$DIR/logs/$vm.ready" 2>&1 \
      || { note "wide: $vm: wait-ready failed: $(tail -3 "$DIR/logs/$vm.ready" | tr '\n' ' ')"; residue=$((residue + 1)); }
  done
  t1=$(ms)
  for vm in "${WIDE[@]}"; do
    kill -0 "${PID[$vm]}" 2>/dev/null || { note "wide: $vm: not running when all should be up"; residue=$((residue + 1)); }
  done
  for vm in "${WIDE[@]}"; do
    i=$((i + 1))
    if [ $((i % 2)) = 0 ]; then
      kill -9 "${PID[$vm]}" 2>/dev/null
    else
      "$BIN/vmwarden" stop "$vm" --timeout 1 >"$DIR/logs/$vm.stop" 2>&1 &
      WSTOP[$vm]=$!
    fi
  done
  for vm in "${!WSTOP[@]}"; do
    wait "${WSTOP[$vm]}" || { note "wide: $vm: stop failed: $(tail -3 "$DIR/logs/$vm.stop" | tr '\n' ' ')"; residue=$((residue + 1)); }
  done
  for vm in "${WIDE[@]}"; do wait "${PID[$vm]}" 2>/dev/null; PID[$vm]=; done
  for vm in "${WIDE[@]}"; do
    "$BIN/vmwarden-cleanup" "$vm" >"$DIR/logs/$vm.cleanup" 2>&1 \
      || { note "wide: $vm: cleanup not clean: $(tr '\n' ' ' <"$DIR/logs/$vm.cleanup" | cut -c1-400)"; residue=$((residue + 1)); }
  done
  for vm in "${WIDE[@]}"; do
    if ! "$BIN/vmwarden" verify-clean "$vm" >"$DIR/logs/$vm.verify" 2>&1; then
      n=$(grep -c 'check=FAIL' "$DIR/logs/$vm.verify")
      note "wide: $vm: verify-clean: $(grep -v 'check=ok' "$DIR/logs/$vm.verify" | tr '\n' ' ' | cut -c1-400)"
      residue=$((residue + (n > 0 ? n : 1)))
    fi
  done
  t2=$(ms)
  # Their runtime dirs stay by design, as the first two's do: left out of
  # the growth /run may show (they are in run-bytes after cycle 1, which
  # must still be the figure at the end).
  wide_bytes=$(for vm in "${WIDE[@]}"; do du -sxb --exclude=last-cleanup.json "$RUNROOT/$vm"; done | awk '{ s += $1 } END { print s + 0 }')
  echo "wide: ${#WIDE[@]} VMs up at once in $((t1 - t0)) ms, stop+cleanup+verify $((t2 - t1)) ms, residue $residue"
}

fds0=$(count_fds); mounts0=$(count_mounts); taps0=$(count_taps); run0=$(run_bytes)
"$DIR/soak-load" "$load_rate" $((cycles * 120 + 60)) $$ >"$DIR/logs/load" 2>&1 &
LOAD_PID=$!
# Without the ready line the power button may find no acpid: wait less
# for it before stop goes on to quit.
stop_timeout=30; [ "$boot_wait" = 1 ] || stop_timeout=2
residue=0; times=(); run_c1=0; wide_bytes=0
: >"$DIR/logs/findings"
ran=0
for c in $(seq 1 "$cycles"); do
  if [ "$until" != 0 ] && [ "$(date +%s)" -ge "$until" ]; then
    echo "soak.sh: --until reached: $ran of $cycles cycles run"
    break
  fi
  ran=$c
  kill9=$((c % 5 == 0))
  t=0
  t0=$(ms)
  for vm in "${VMS[@]}"; do launch "$vm" "$c"; done
  for vm in "${VMS[@]}"; do
    if ! "$BIN/vmwarden" wait-ready "$vm" --timeout 120 >"$DIR/logs/$vm.ready" 2>&1; then
      note "cycle $c: $vm: wait-ready failed: $(tail -3 "$DIR/logs/$vm.ready" | tr '\n' ' ') serial: $(tail -3 "$DIR/logs/$vm.serial" | tr '\n' ' ')"
      residue=$((residue + 1))
    fi
  done
  t=$((t + $(ms) - t0))
  if [ "$boot_wait" = 1 ]; then
    for vm in "${VMS[@]}"; do
      ready_line "$vm" || { note "cycle $c: $vm: no ready line: $(tail -3 "$DIR/logs/$vm.serial" | tr '\n' ' ')"; residue=$((residue + 1)); }
    done
  fi
  # Both VMs stop at once, as a host shutting down stops its units.
  declare -A STOPPER=()
  for vm in "${VMS[@]}"; do
    if [ "$kill9" = 1 ]; then
      kill -9 "${PID[$vm]}" 2>/dev/null
    else
      "$BIN/vmwarden" stop "$vm" --timeout "$stop_timeout" >"$DIR/logs/$vm.stop" 2>&1 &
      STOPPER[$vm]=$!
    fi
  done
  for vm in "${!STOPPER[@]}"; do
    if ! wait "${STOPPER[$vm]}"; then
      note "cycle $c: $vm: stop failed: $(tail -3 "$DIR/logs/$vm.stop" | tr '\n' ' ')"
      residue=$((residue + 1))
    fi
  done
  unset STOPPER
  for vm in "${VMS[@]}"; do wait "${PID[$vm]}" 2>/dev/null; PID[$vm]=; done
  t0=$(ms)
  for vm in "${VMS[@]}"; do
    if ! "$BIN/vmwarden-cleanup" "$vm" >"$DIR/logs/$vm.cleanup" 2>&1; then
      note "cycle $c: $vm: cleanup not clean: $(tr '\n' ' ' <"$DIR/logs/$vm.cleanup" | cut -c1-400)"
      residue=$((residue + 1))
    fi
  done
  t=$((t + $(ms) - t0))
  for vm in "${VMS[@]}"; do
    if ! "$BIN/vmwarden" verify-clean "$vm" >"$DIR/logs/$vm.verify" 2>&1; then
      n=$(grep -c 'check=FAIL' "$DIR/logs/$vm.verify")
      note "cycle $c: $vm: verify-clean: $(grep -v 'check=ok' "$DIR/logs/$vm.verify" | tr '\n' ' ' | cut -c1-400)"
      residue=$((residue + (n > 0 ? n : 1)))
    fi
  done
  times+=("$t")
  [ "$c" = 1 ] && [ "${#WIDE[@]}" -gt 0 ] && wide_round
  # The first cycle leaves what stays by design (each VM's runtime dir with
  # its instance.lock): from here on /run must not change.
  [ "$c" = 1 ] && run_c1=$(run_bytes)
  # A VM that never came up in the first cycles is a broken setup, not a
  # soak finding: stop there rather than fail the same way N times.
  if [ "$c" -le 3 ] && grep -q "^  cycle $c: .*: wait-ready failed" "$DIR/logs/findings"; then
    cat "$DIR/logs/findings"
    echo "soak.sh: a VM did not start in cycle $c; stopping" >&2
    echo "soak: $c cycles, $residue residue, fds 0->0, mounts 0->0, taps 0->0, run-bytes 0->0, cycle-ms first10 0 last10 0"
    exit 1
  fi
  printf 'cycle %d%s: %d ms, residue %d\n' "$c" "$([ "$kill9" = 1 ] && echo ' (SIGKILL)')" "$t" "$residue"
done
kill "$LOAD_PID" 2>/dev/null; wait "$LOAD_PID" 2>/dev/null; LOAD_PID=
cat "$DIR/logs/load"
fds1=$(count_fds); mounts1=$(count_mounts); taps1=$(count_taps); run1=$(run_bytes)
[ -s "$DIR/logs/findings" ] && { echo "findings:"; cat "$DIR/logs/findings"; }

avg() { local s=0 n=0 x; for x in "$@"; do s=$((s + x)); n=$((n + 1)); done; echo $((n ? s / n : 0)); }
k=$(( ${#times[@]} < 10 ? ${#times[@]} : 10 ))
first=$(avg "${times[@]:0:k}")
last=$(avg "${times[@]: -k}")
bad=0
[ "$residue" = 0 ] || bad=1
[ "$fds0" = "$fds1" ] || { echo "fds: $fds0 before, $fds1 after"; bad=1; }
[ "$mounts0" = "$mounts1" ] || { echo "mounts: $mounts0 before, $mounts1 after"; bad=1; }
[ "$taps0" = "$taps1" ] || { echo "taps: $taps0 before, $taps1 after"; bad=1; }
if [ "$ran" -ge 1 ]; then
  echo "run-bytes after cycle 1: $run_c1 (each VM's runtime dir and instance.lock stay by design)"
  [ "$run1" = "$run_c1" ] || { echo "/run usage changed from $run_c1 after cycle 1 to $run1 after cycle $ran"; bad=1; }
fi
[ $((run1 - run0 - wide_bytes)) -le 65536 ] || { echo "/run usage grew by $((run1 - run0)) bytes ($wide_bytes of them the runtime dirs of the ${#WIDE[@]} --wide VMs)"; bad=1; }
[ "$last" -le $((2 * first)) ] || { echo "cycle time grew: first 10 $first ms, last 10 $last ms"; bad=1; }
# run-bytes compares after cycle 1 with the end (what must be equal): the
# first launch makes each VM's runtime dir and lease file, kept by design.
echo "soak: $ran cycles, $residue residue, fds $fds0->$fds1, mounts $mounts0->$mounts1, taps $taps0->$taps1, run-bytes $(if [ "$ran" -ge 1 ]; then echo "$run_c1"; else echo "$run0"; fi)->$run1, cycle-ms first10 $first last10 $last"
[ "$bad" = 0 ]
