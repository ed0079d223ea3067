#!/usr/bin/env bash
# The scale bench: what vmwarden's steps cost as the host fills with VMs,
# 50 VMs started at once, and the host memory a VM costs beside its
# hypervisor. Run as root on a quiet machine; not part of CI.
#
#   sudo tests/bench/scale.sh
#
# Environment:
#   VMWARDEN_SCALE_N        VMs running for the "@N" figures (default 100)
#   VMWARDEN_SCALE_AT_ONCE  VMs started at once (default 50)
#   VMWARDEN_SCALE_ROUNDS   rounds per figure, medians taken (default 5)
#   VMWARDEN_SCALE_UID_BASE first principal uid (default 3900000; one per VM,
#                           N + AT_ONCE + 2 in all: keep it apart from any
#                           other test run's uids on the machine)
#   VMWARDEN_BIN            directory of the vmwarden binaries (default: a
#                           `cargo build --release` of this tree)
#   VMWARDEN_SCALE_KEEP     set: keep the bench's directory (logs) at the end
#
# The VMs are real: each is `vmwarden-launch NAME` (no unit: this host need
# not run systemd) with its principal, lease, intent record, mount
# namespace, noswap credential tmpfs and sandbox, exec'ing the real QEMU
# with the whole machine built (microvm, TCG) and `-S` from the spec's
# extra_args: the guest never runs, so the VMs cost the host what the
# hypervisor process holds and no CPU. The launcher treats it exactly like
# any QEMU (wait-ready asks QMP; cleanup, verify-clean, status and reap see
# a QEMU). The launches run in this script's cgroup, so liveness takes the
# /proc path (the whole-host scan), not a unit's cgroup.
#
# 1. Steps at 0, N/2 and N VMs running, ROUNDS rounds each (@0 before the
#    fill and again after the drain, pooled): a probe launch
#    (`vmwarden-launch probe --probe -- /bin/true`, the whole launch sequence
#    ending in an exec of /bin/true) minus /bin/true run the same way (the
#    launcher's overhead), `vmwarden-cleanup probe`, `vmwarden verify-clean
#    probe`, `vmwarden status` (every VM) and `vmwarden reap --json` (dry
#    run). Also each VM's launch-to-ready as the host fills, and beside
#    the launcher's overhead the kernel's part of it alone: `unshare -m -i
#    --propagation slave /bin/true` minus /bin/true (the launch's mount
#    and IPC namespaces made, entered and torn down, no launcher).
#    At 0 and N, untimed, cleanup and verify-clean of one more probe
#    launch under `strace -f -c -w`: their six costliest system calls
#    (wall ms, strace's own cost included), and every round's cleanup and
#    verify-clean figure (@0: the rounds before the fill, then after the
#    drain), so that a median's cause can be read.
# 2. AT_ONCE VMs launched at once, until every QMP answers; against the
#    same QEMU argv (each launched VM's own, from /proc) started bare by
#    root at once (this host has no systemd: the floor under a unit's
#    hardening is the systemd suite's `hv_bench`). The locks a launch
#    takes, with how long, from strace of one launch among them. Each
#    round's CPU time of the whole host (/proc/stat) from the first start
#    until every QMP answered, both ways: what the launches add in CPU,
#    and what that is on this host's cores beside the wall difference.
# 3. One VM with a read-only and an owned virtiofs share, user networking
#    (passt), the user vsock backend (vhost-device-vsock) and the console
#    relay: the PSS (/proc/PID/smaps_rollup) of every process it runs,
#    the hypervisor apart; against what microvm.nix's runner runs for the
#    same guest: supervisord with its event listener (a python3 process)
#    and a virtiofsd per share (as root, `--thread-pool-size` nproc,
#    `--inode-file-handles=prefer`, its defaults; not its `--rlimit-nofile
#    1048576`, above this host's nr_open: virtiofsd's own default, the
#    most it may), with SLIRP inside QEMU
#    (-netdev user) and the kernel's vhost-vsock (no process; this host's
#    kernel has no vhost_vsock, so that QEMU has no vsock device). The
#    hypervisor is counted on both sides.
#
#    Beside them, each round, the scan floor (tests/bench/scan-floor.c,
#    built here with cc): the least kernel work the credential-mount proof
#    needs (every mount namespace enumerated, its mounts listed, each
#    one's file system and a tmpfs's source stated), timed inside one
#    process (its CPU time: the work, not a loaded machine's waits), no
#    exec, no /proc.
#
# Output: the table, then three lines, and the scan floors' lines:
#   scale: launch@N / launch@0 R, cleanup@N / cleanup@0 R, verify-clean@N / @0 R, status@N R ms, reap@N R ms
#   scale: AT_ONCE at once, all ready R s, / floor R
#   scale: host memory per VM beyond the hypervisor R MiB (vmwarden) vs R MiB (microvm.nix's helpers for the same guest); total per VM ratio R
#   scale: scan floor @0 R ms, @N R ms (NS namespaces, M mounts); cleanup@0 + the floor's growth, / cleanup@0 R; verify-clean likewise R
#   scale: scan floor from the VM's credential floor @0 R ms, @N R ms (M stated …); cleanup@0 + its growth, / cleanup@0 R; verify-clean likewise R
#   scale: process walk floor @0 R ms, @N R ms (P processes …); cleanup@0 + its growth and the credential-floor scan's, / cleanup@0 R; verify-clean likewise R
# (the first: every mount stated, as reap and verify-clean of every VM
# ask; the second: only mounts made since the probe's credential floor,
# instance/creds_floor.rs, as cleanup and verify-clean of the probe ask;
# the third: /proc read and each process's owner stated
# (tests/bench/proc-floor.c), what the uid walk pays per process before
# it can pass one, added to the second: the least both whole-host scans
# of cleanup and verify-clean cost)
# Exits non-zero when anything fails (a launch, a cleanup that is not
# clean, a verify-clean finding); asserts no timing.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin:$HOME/.cargo/bin"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/tests/bench

N=${VMWARDEN_SCALE_N:-100}
AT_ONCE=${VMWARDEN_SCALE_AT_ONCE:-50}
ROUNDS=${VMWARDEN_SCALE_ROUNDS:-5}
UID0=${VMWARDEN_SCALE_UID_BASE:-3900000}
for v in N AT_ONCE ROUNDS UID0; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "scale.sh: $v must be a positive number" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "scale.sh: needs root (namespaces, mounts, other uids): sudo $0" >&2; exit 1; }

die() { echo "scale.sh: $*" >&2; exit 1; }

# ------------------------------------------------------------------ setup
bash "$REPO/tests/setup-host.sh" >/dev/null 2>&1 || die "tests/setup-host.sh failed"
ASSETS_ENV=$(bash "$REPO/tests/assets/build-guest.sh") || die "tests/assets/build-guest.sh failed"
# shellcheck disable=SC1090
. "$ASSETS_ENV"
if [ -n "${VMWARDEN_BIN:-}" ]; then
  BIN=$VMWARDEN_BIN
else
  (cd "$REPO" && cargo build --release --quiet --bin vmwarden-launch --bin vmwarden-cleanup --bin vmwarden) \
    || die "cargo build --release failed"
  BIN=$REPO/target/release
fi
for b in vmwarden-launch vmwarden-cleanup vmwarden; do [ -x "$BIN/$b" ] || die "no $BIN/$b"; done
QEMU=$(command -v qemu-system-x86_64) || die "no qemu-system-x86_64"
FLOOR_BIN=$(mktemp /var/tmp/vmwarden-scan-floor.XXXXXX)
cc -O2 -o "$FLOOR_BIN" "$HERE/scan-floor.c" || die "cannot build tests/bench/scan-floor.c (cc)"
PROC_FLOOR_BIN=$(mktemp /var/tmp/vmwarden-proc-floor.XXXXXX)
cc -O2 -o "$PROC_FLOOR_BIN" "$HERE/proc-floor.c" || die "cannot build tests/bench/proc-floor.c (cc)"
CARGO_BIN=${VMWARDEN_TEST_CARGO_ROOT:-/var/cache/vmwarden-test/cargo}/bin
VIRTIOFSD=$CARGO_BIN/virtiofsd
VSOCKD=$CARGO_BIN/vhost-device-vsock
PASST=$(command -v passt) || die "no passt"
SUPERVISORD=$(command -v supervisord) || die "no supervisord (tests/setup-host.sh installs Debian's supervisor)"

# Not /tmp: the launcher refuses files in a directory others can write.
DIR=$(mktemp -d /var/lib/vmwarden-scale.XXXXXX)
chmod 0755 "$DIR"
RUNROOT=$(mktemp -d /run/vmwarden-scale.XXXXXX)
chmod 0755 "$RUNROOT"
export VMWARDEN_CONFIG_DIR=$DIR/etc VMWARDEN_RUNTIME_ROOT=$RUNROOT VMWARDEN_STATE_ROOT=$DIR/state
mkdir -p "$VMWARDEN_CONFIG_DIR" "$VMWARDEN_STATE_ROOT" "$DIR/logs" "$DIR/secrets"
declare -A PID=()
MVN_PIDS=()
finish() {
  local vm p
  for p in "${MVN_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  for vm in "${!PID[@]}"; do kill -9 "${PID[$vm]}" 2>/dev/null; done
  # Whatever of this run still runs (a hypervisor under strace, a
  # helper): a process of one of its principals whose command line names
  # this run's directories, each by its pid (another run's processes are
  # left alone even if their uids overlap).
  for u in $(seq "$UID0" $((NEXT_UID - 1))); do
    for p in $(pgrep -U "$u"); do
      grep -qF -e "$RUNROOT" -e "$DIR" "/proc/$p/cmdline" 2>/dev/null && kill -9 "$p" 2>/dev/null
    done
  done
  for vm in "${!PID[@]}"; do wait "${PID[$vm]}" 2>/dev/null; "$BIN/vmwarden-cleanup" "$vm" >/dev/null 2>&1; done
  "$BIN/vmwarden-cleanup" probe >/dev/null 2>&1
  # The mem VM's id range is in the host-wide record (/var/lib/vmwarden/.ranges,
  # whatever the state root): only purge retires it, and each run left one
  # more active range of 65536 ids naming a state root gone. Purge asks
  # for its phrase on a terminal: script(1) gives it one.
  if [ -e "$DIR/etc/mem.json" ] && ! printf 'DELETE-EVERYTHING\n' \
    | script -qefc "$BIN/vmwarden purge mem" /dev/null >"$DIR/logs/mem.purge" 2>&1; then
    echo "scale.sh: purge mem failed, its id range stays in /var/lib/vmwarden/.ranges: $(tail -c 400 "$DIR/logs/mem.purge")" >&2
  fi
  if [ -n "${VMWARDEN_SCALE_KEEP:-}" ]; then echo "scale.sh: kept $DIR" >&2; else rm -rf "$DIR"; fi
  rm -rf "$RUNROOT" "$FLOOR_BIN" "$PROC_FLOOR_BIN"
}
trap finish EXIT

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$DIR/secrets/key"
chmod 0600 "$DIR/secrets/key"
CMDLINE=$(bash "$REPO/tests/assets/guest-cmdline.sh" microvm hold tcg)
NEXT_UID=$UID0
spec() { # NAME [EXTRA JSON MEMBERS] -> CONFIG/NAME.json, its own principal
  local uid=$NEXT_UID
  NEXT_UID=$((NEXT_UID + 1))
  cat >"$VMWARDEN_CONFIG_DIR/$1.json" <<EOF
{
  "version": 1, "name": "$1",
  "principal": { "uid": $uid, "gid": $uid },
  "hypervisor": { "kind": "qemu", "binary": "$QEMU", "accel": "tcg", "machine": "microvm", "extra_args": ["-S"] },
  "vcpus": 1, "memory_mib": 128,
  "kernel": "$KERNEL", "initrd": "$INITRD", "cmdline": "$CMDLINE",
  "credentials": [ { "name": "token", "source": { "path": "$DIR/secrets/key" } } ]${2:+,
  $2}
}
EOF
}

us() { echo "${EPOCHREALTIME/./}"; }
median() { sort -n | awk '{ v[++n] = $1 } END { if (n == 0) print "-"; else if (n % 2) print v[(n+1)/2]; else print (v[n/2]+v[n/2+1])/2 }'; }
ms_of_us() { awk -v u="$1" 'BEGIN { if (u == "-") print "-"; else printf "%.2f", u / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }'; }
# The CPU time the whole host has spent busy (user, nice, system, irq,
# softirq, steal; /proc/stat), in ms: taken before and after a timed span,
# what every process together used in it.
CLK_TCK=$(getconf CLK_TCK)
# Bash arithmetic (64-bit): mawk's printf "%d" stops at 2^31-1, which a
# host's ticks since boot pass after ~600 CPU-hours.
busy_ms() {
  local _c us ni sy _id _io irq sirq st _rest
  read -r _c us ni sy _id _io irq sirq st _rest </proc/stat
  echo $(((us + ni + sy + irq + sirq + st) * 1000 / CLK_TCK))
}

# A VM runs: launched in the background, ready once wait-ready answers.
# Sets READY_US: the microseconds from launch to ready.
start_vm() { # NAME
  local t0 t1
  t0=$(us)
  "$BIN/vmwarden-launch" "$1" >"$DIR/logs/$1.log" 2>&1 &
  PID[$1]=$!
  "$BIN/vmwarden" wait-ready "$1" --timeout 120 >"$DIR/logs/$1.ready" 2>&1 \
    || die "$1: wait-ready failed: $(tail -3 "$DIR/logs/$1.ready" | tr '\n' ' ') launcher: $(tail -3 "$DIR/logs/$1.log" | tr '\n' ' ')"
  t1=$(us)
  READY_US=$((t1 - t0))
}
stop_vm() { # NAME: SIGKILL the hypervisor, then cleanup as ExecStopPost would
  kill -9 "${PID[$1]}" 2>/dev/null
  wait "${PID[$1]}" 2>/dev/null
  unset "PID[$1]"
  "$BIN/vmwarden-cleanup" "$1" >"$DIR/logs/$1.cleanup" 2>&1 \
    || die "$1: cleanup not clean: $(head -c 400 "$DIR/logs/$1.cleanup")"
}

# The locks of one launch under strace (lock-table.awk says how it reads them).
lock_table() { # STRACE_OUT
  awk -f "$HERE/lock-table.awk" "$1"
}

# ------------------------------------------------------------- 1. the steps
spec probe
# Samples per fill level, microseconds: S[step@level]="v v v".
declare -A S=()
timed() { # KEY CMD... : run CMD (stdout/stderr to a log), add its time to S[KEY]
  local key=$1 t0 t1 rc
  shift
  t0=$(us)
  "$@" >"$DIR/logs/step.out" 2>&1
  rc=$?
  t1=$(us)
  [ $rc = 0 ] || die "$key: '$*' exited $rc: $(head -c 600 "$DIR/logs/step.out")"
  S[$key]="${S[$key]:-} $((t1 - t0))"
  LAST=$((t1 - t0))
}
steps() { # LEVEL: ROUNDS rounds of the probe launch (paired with /bin/true), cleanup, verify-clean, status, reap
  local lvl=$1 r a
  for r in $(seq 1 "$ROUNDS"); do
    timed "true@$lvl" /bin/true
    a=$LAST
    timed "launch-raw@$lvl" "$BIN/vmwarden-launch" probe --probe -- /bin/true
    S[launch@$lvl]="${S[launch@$lvl]:-} $((LAST - a))"
    # The kernel's part alone: the launch's two namespaces made, entered
    # and torn down around the same /bin/true (no launcher), minus it.
    timed "ns-raw@$lvl" unshare -m -i --propagation slave /bin/true
    S[ns@$lvl]="${S[ns@$lvl]:-} $((LAST - a))"
    timed "cleanup@$lvl" "$BIN/vmwarden-cleanup" probe
    grep -q '"clean":true' "$DIR/logs/step.out" || die "cleanup of the probe not clean: $(head -c 400 "$DIR/logs/step.out")"
    timed "verify@$lvl" "$BIN/vmwarden" verify-clean probe
    timed "status@$lvl" "$BIN/vmwarden" status
    timed "reap@$lvl" "$BIN/vmwarden" reap --json
    read -r a FLOOR_NS FLOOR_MOUNTS < <("$FLOOR_BIN" 5) || die "scan-floor failed"
    S[floor@$lvl]="${S[floor@$lvl]:-} $a"
    FLOOR_AT[$lvl]="$FLOOR_NS namespaces, $FLOOR_MOUNTS mounts"
    # The same from the probe's credential floor, as its cleanup and
    # verify-clean ask (the record stays in its runtime dir, proven).
    since=$(sed -n 's/.*"floor":\([0-9]*\).*/\1/p' "$RUNROOT/probe/creds-floor.json" 2>/dev/null)
    [ -n "$since" ] || die "the probe has no credential floor: $(cat "$RUNROOT/probe/creds-floor.json" 2>&1)"
    read -r a _ FLOOR_SINCE_MOUNTS < <("$FLOOR_BIN" 5 "$since") || die "scan-floor from $since failed"
    S[floor-since@$lvl]="${S[floor-since@$lvl]:-} $a"
    FLOOR_SINCE_AT[$lvl]="$FLOOR_SINCE_MOUNTS mounts"
    # The process walk's floor: /proc read and every entry's owner stated.
    read -r a PROCS < <("$PROC_FLOOR_BIN" 5) || die "proc-floor failed"
    S[proc-floor@$lvl]="${S[proc-floor@$lvl]:-} $a"
    PROCS_AT[$lvl]=$PROCS
  done
}
declare -A FLOOR_AT=() FLOOR_SINCE_AT=() PROCS_AT=()
med() { printf '%s\n' ${S[$1]:-} | median; }
# Where cleanup's and verify-clean's time goes at LEVEL: one more probe
# launch, then each under `strace -f -c -w` (wall time per system call,
# strace's own cost included: compare levels, not absolutes), the six
# costliest calls kept for the report. Untimed: no figure above uses it.
PROFILES=()
profile_steps() { # LEVEL
  [ -n "$STRACE" ] || return 0
  local lvl=$1 what
  "$BIN/vmwarden-launch" probe --probe -- /bin/true >"$DIR/logs/step.out" 2>&1 || die "probe launch for the profile failed: $(head -c 400 "$DIR/logs/step.out")"
  for what in cleanup verify; do
    case $what in
      cleanup) set -- "$BIN/vmwarden-cleanup" probe ;;
      verify) set -- "$BIN/vmwarden" verify-clean probe ;;
    esac
    "$STRACE" -f -c -w -S time -o "$DIR/logs/profile-$what@$lvl" "$@" >"$DIR/logs/step.out" 2>&1 \
      || die "$what under strace at @$lvl failed: $(head -c 400 "$DIR/logs/step.out")"
    PROFILES+=("$what@$lvl: $(awk 'NR > 2 && $1 ~ /^[0-9.]+$/ && $NF != "total" && n < 6 { printf "%s%s %d× %.2f ms", (n++ ? ", " : ""), $NF, $4, $2 * 1000 }' "$DIR/logs/profile-$what@$lvl")")
  done
}
STRACE=$(command -v strace || true)

echo "scale.sh: $N VMs, $ROUNDS rounds; binaries $BIN; runtime root $RUNROOT" >&2
for i in $(seq 1 "$N"); do spec "$(printf 's%03d' "$i")"; done
steps 0
profile_steps 0
HALF=$((N / 2))
FILL=()
for i in $(seq 1 "$N"); do
  start_vm "$(printf 's%03d' "$i")"
  FILL+=("$READY_US")
  [ "$i" = "$HALF" ] && [ "$HALF" -gt 0 ] && steps "$HALF"
done
steps "$N"
profile_steps "$N"
DRAIN=()
for i in $(seq "$N" -1 1); do
  vm=$(printf 's%03d' "$i")
  t0=$(us); stop_vm "$vm"; t1=$(us)
  DRAIN+=("$((t1 - t0))")
done
steps 0

levels=(0); [ "$HALF" -gt 0 ] && [ "$HALF" != "$N" ] && levels+=("$HALF"); levels+=("$N")
{
  echo
  echo "== steps as the host fills (medians of $ROUNDS rounds; @0 pools the rounds before the fill and after the drain), ms"
  printf '%-40s' "step"; for l in "${levels[@]}"; do printf '%12s' "@$l"; done; printf '%14s\n' "@$N / @0"
  for row in "floor:scan floor (tests/bench/scan-floor.c)" "floor-since:scan floor from the credential floor" "proc-floor:process walk floor (proc-floor.c)" "launch:launcher overhead (probe - /bin/true)" "ns:unshare -m -i /bin/true - /bin/true" "launch-raw:probe launch, whole" "cleanup:vmwarden-cleanup NAME" "verify:vmwarden verify-clean NAME" "status:vmwarden status (every VM)" "reap:vmwarden reap (dry run)"; do
    k=${row%%:*}
    printf '%-40s' "${row#*:}"
    for l in "${levels[@]}"; do printf '%12s' "$(ms_of_us "$(med "$k@$l")")"; done
    printf '%14s\n' "$(ratio "$(med "$k@$N")" "$(med "$k@0")")"
  done
  q() { local n=$(( $# )); [ $n -gt 0 ] || { echo "-"; return; }; ms_of_us "$(printf '%s\n' "$@" | median)"; }
  k=$(( N < 10 ? N : 10 ))
  echo "VM launch -> ready (wait-ready), ms: first $k $(q "${FILL[@]:0:k}"), last $k $(q "${FILL[@]: -k}") (median)"
  echo "VM SIGKILL + cleanup, ms: with $((N - 1))..$((N - k)) others running $(q "${DRAIN[@]:0:k}"), with $((k - 1))..0 $(q "${DRAIN[@]: -k}") (median)"
  rounds() { local v; for v in ${S[$1]:-}; do printf '%s ' "$(ms_of_us "$v")"; done; }
  echo "every round, ms (@0: before the fill, then after the drain): cleanup@0 $(rounds "cleanup@0")| cleanup@$N $(rounds "cleanup@$N")| verify@0 $(rounds "verify@0")| verify@$N $(rounds "verify@$N")"
  [ ${#PROFILES[@]} = 0 ] || { echo "the costliest system calls (strace -f -c -w, one run each; call, count, wall ms):"; printf '  %s\n' "${PROFILES[@]}"; }
} | tee "$DIR/logs/table1"
L1="launch@$N / launch@0 $(ratio "$(med "launch@$N")" "$(med "launch@0")"), cleanup@$N / cleanup@0 $(ratio "$(med "cleanup@$N")" "$(med "cleanup@0")"), verify-clean@$N / @0 $(ratio "$(med "verify@$N")" "$(med "verify@0")"), status@$N $(ms_of_us "$(med "status@$N")") ms, reap@$N $(ms_of_us "$(med "reap@$N")") ms"
# What cleanup and verify-clean would cost at N were their only growth the
# floor's: the least any implementation of the proof pays.
grown() { awk -v s="$1" -v f0="$2" -v fn="$3" 'BEGIN { if (s == "-" || f0 == "-" || fn == "-" || s == 0) print "-"; else printf "%.2f", (s + fn - f0) / s }'; }
F0=$(med "floor@0"); FN=$(med "floor@$N")
LF="scan floor @0 $(ms_of_us "$F0") ms, @$N $(ms_of_us "$FN") ms (${FLOOR_AT[0]:-?} @0; ${FLOOR_AT[$N]:-?} @$N); cleanup@0 + the floor's growth, / cleanup@0 $(grown "$(med "cleanup@0")" "$F0" "$FN"); verify-clean likewise $(grown "$(med "verify@0")" "$F0" "$FN")"
S0=$(med "floor-since@0"); SN=$(med "floor-since@$N")
P0=$(med "proc-floor@0"); PN=$(med "proc-floor@$N")
# Both whole-host scans at their floors: the credential floor's mount
# search and the process walk, their growth added to the step at @0.
both() { awk -v s="$1" -v a0="$2" -v an="$3" -v b0="$4" -v bn="$5" 'BEGIN { if (s == "-" || a0 == "-" || an == "-" || b0 == "-" || bn == "-" || s == 0) print "-"; else printf "%.2f", (s + an - a0 + bn - b0) / s }'; }
LP="process walk floor @0 $(ms_of_us "$P0") ms, @$N $(ms_of_us "$PN") ms (${PROCS_AT[0]:-?} processes @0, ${PROCS_AT[$N]:-?} @$N); cleanup@0 + its growth and the credential-floor scan's, / cleanup@0 $(both "$(med "cleanup@0")" "$S0" "$SN" "$P0" "$PN"); verify-clean likewise $(both "$(med "verify@0")" "$S0" "$SN" "$P0" "$PN")"
LS="scan floor from the VM's credential floor @0 $(ms_of_us "$S0") ms, @$N $(ms_of_us "$SN") ms (${FLOOR_SINCE_AT[0]:-?} stated @0, ${FLOOR_SINCE_AT[$N]:-?} @$N); cleanup@0 + its growth, / cleanup@0 $(grown "$(med "cleanup@0")" "$S0" "$SN"); verify-clean likewise $(grown "$(med "verify@0")" "$S0" "$SN")"

# --------------------------------------------------------- 2. many at once
for i in $(seq 1 "$AT_ONCE"); do spec "$(printf 'a%03d' "$i")"; done
ONCE_NAMES=(); for i in $(seq 1 "$AT_ONCE"); do ONCE_NAMES+=("$(printf 'a%03d' "$i")"); done
qmp_of() { echo "$RUNROOT/$1/control/qmp.sock"; }
ONCE_V=(); ONCE_F=(); ONCE_VC=(); ONCE_FC=()
# Round 0, not timed: every launcher at once, one of them under strace
# (which locks it takes, and when); each QEMU's argv kept for the floor
# (the same binary and options, started bare by root, its sockets in a
# directory of the bench's).
socks=(); for vm in "${ONCE_NAMES[@]}"; do socks+=("$(qmp_of "$vm")"); done
SPIDS=()
for vm in "${ONCE_NAMES[@]}"; do
  if [ "$vm" = "${ONCE_NAMES[0]}" ] && [ -n "$STRACE" ]; then
    "$STRACE" -f -ttt -e trace=flock,openat,close,fcntl -o "$DIR/logs/locks.strace" "$BIN/vmwarden-launch" "$vm" >"$DIR/logs/$vm.log" 2>&1 &
    SPIDS+=($!)
  else
    "$BIN/vmwarden-launch" "$vm" >"$DIR/logs/$vm.log" 2>&1 &
  fi
  PID[$vm]=$!
done
out=$(python3 "$HERE/qmp-ready.py" "$EPOCHREALTIME" 300 "${socks[@]}") || die "$AT_ONCE at once: $out; ${ONCE_NAMES[0]}: $(tail -5 "$DIR/logs/${ONCE_NAMES[0]}.log" | tr "\n" " ") strace: $(tail -5 "$DIR/logs/locks.strace" 2>/dev/null | tr "\n" " ")"
for vm in "${ONCE_NAMES[@]}"; do
  # The lease holder is the hypervisor (strace's child for the traced one).
  qpid=${PID[$vm]}
  case " ${SPIDS[*]} " in *" $qpid "*) qpid=$(pgrep -P "$qpid" | head -1) ;; esac
  tr '\0' '\n' <"/proc/$qpid/cmdline" >"$DIR/logs/$vm.argv"
  [ -s "$DIR/logs/$vm.argv" ] || die "$vm: no QEMU argv from pid $qpid"
  case " ${SPIDS[*]} " in *" ${PID[$vm]} "*) kill -9 "$qpid"; PID[$vm]=$qpid ;; esac
done
for p in "${SPIDS[@]}"; do wait "$p" 2>/dev/null; done
for vm in "${ONCE_NAMES[@]}"; do stop_vm "$vm"; done
for r in $(seq 1 "$ROUNDS"); do
  # vmwarden: every launcher at once, one poller for every QMP socket.
  c0=$(busy_ms); t0=$EPOCHREALTIME
  for vm in "${ONCE_NAMES[@]}"; do
    "$BIN/vmwarden-launch" "$vm" >"$DIR/logs/$vm.log" 2>&1 &
    PID[$vm]=$!
  done
  out=$(python3 "$HERE/qmp-ready.py" "$t0" 180 "${socks[@]}") || die "$AT_ONCE at once: $out"
  ONCE_VC+=($(($(busy_ms) - c0)))
  ONCE_V+=("$(sed -n 's/^READY ms=\([0-9]*\).*/\1/p' <<<"$out")")
  for vm in "${ONCE_NAMES[@]}"; do stop_vm "$vm"; done
  # The floor: the same argvs, bare, at once.
  fsocks=()
  for vm in "${ONCE_NAMES[@]}"; do
    d=$DIR/floor/$vm; mkdir -p "$d"; rm -f "$d"/*
    # The QMP socket was handed over bound (fd=N): the bare one makes its
    # own; the credential file it reads is a copy in its directory.
    sed -e "s|id=vmwarden-qmp,fd=[0-9]*|id=vmwarden-qmp,path=$d/qmp.sock|" \
        -e "s|$RUNROOT/$vm/control|$d|g" -e "s|$RUNROOT/$vm/credentials|$d|g" "$DIR/logs/$vm.argv" >"$d/argv"
    cp "$DIR/secrets/key" "$d/token"
    fsocks+=("$d/qmp.sock")
  done
  c0=$(busy_ms); t0=$EPOCHREALTIME
  FP=()
  for vm in "${ONCE_NAMES[@]}"; do
    d=$DIR/floor/$vm
    mapfile -t argv <"$d/argv"
    "${argv[@]}" >"$d/out" 2>&1 &
    FP+=($!)
  done
  MVN_PIDS+=("${FP[@]}")
  out=$(python3 "$HERE/qmp-ready.py" "$t0" 180 "${fsocks[@]}") \
    || die "$AT_ONCE bare QEMUs at once: $out: $(head -c 300 "$DIR/floor/${ONCE_NAMES[0]}/out")"
  ONCE_FC+=($(($(busy_ms) - c0)))
  ONCE_F+=("$(sed -n 's/^READY ms=\([0-9]*\).*/\1/p' <<<"$out")")
  kill -9 "${FP[@]}" 2>/dev/null; wait "${FP[@]}" 2>/dev/null
  MVN_PIDS=()
done
mv=$(printf '%s\n' "${ONCE_V[@]}" | median); mf=$(printf '%s\n' "${ONCE_F[@]}" | median)
{
  echo
  echo "== $AT_ONCE VMs launched at once, until every QMP answers, ms (round by round)"
  echo "vmwarden-launch:   ${ONCE_V[*]} (median $mv)"
  echo "bare QEMU (root):  ${ONCE_F[*]} (median $mf)"
  # Where the difference goes: the CPU every process on the host used
  # from the first start until every QMP answered. What the launches add
  # is spread over the host's cores; were the difference all CPU, it would
  # be that added time divided by the cores.
  echo "CPU the whole host used until every QMP answered (/proc/stat), ms: vmwarden ${ONCE_VC[*]}, bare ${ONCE_FC[*]}"
  # Then the same paired by round, and how busy the host was: where it
  # was busy throughout, CPU added is wall time added.
  awk -v vc="${ONCE_VC[*]}" -v fc="${ONCE_FC[*]}" -v vw="${ONCE_V[*]}" -v fw="${ONCE_F[*]}" -v launches="$AT_ONCE" -v cores="$(getconf _NPROCESSORS_ONLN)" '
    function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }; return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    BEGIN {
      n = split(vc, c1); split(fc, c2); split(vw, w1); split(fw, w2)
      for (i = 1; i <= n; i++) { dc[i] = (c1[i] - c2[i]) / cores; dw[i] = w1[i] - w2[i]; b1[i] = c1[i] / (cores * w1[i]); b2[i] = c2[i] / (cores * w2[i]) }
      # med() sorts in place: only after the pairs are taken.
      add = med(c1, n) - med(c2, n); wall = med(w1, n) - med(w2, n)
      printf "  medians: added by the launches %.0f ms CPU, %.2f ms a launch; over %d cores %.0f ms of the %.0f ms wall difference\n", add, add / launches, cores, add / cores, wall
      printf "  paired by round: added CPU over the cores, median %.0f ms; wall difference, median %.0f ms; the host busy %.0f%% (launches) and %.0f%% (bare), medians\n", med(dc, n), med(dw, n), 100 * med(b1, n), 100 * med(b2, n)
    }'
  if [ -s "$DIR/logs/locks.strace" ]; then
    echo "locks one launch among them took (strace -f: each flock, its file, held until its fd closed):"
    lock_table "$DIR/logs/locks.strace"
  fi
} | tee "$DIR/logs/table2"
L2="$AT_ONCE at once, all ready $(awk -v m="$mv" 'BEGIN { printf "%.2f", m / 1000 }') s, / floor $(ratio "$mv" "$mf")"

# ------------------------------------------------------------- 3. memory
pss_kib() { awk '/^Pss:/ { print $2 }' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }
SHARE=$DIR/share; mkdir -p "$SHARE/ro" "$DIR/state-src"
echo data >"$SHARE/ro/file"
spec mem "\"virtiofsd\": { \"binary\": \"$VIRTIOFSD\" },
  \"shares\": [ { \"tag\": \"ro\", \"source\": \"$SHARE/ro\", \"proto\": \"virtiofs\", \"read_only\": true },
                { \"tag\": \"rw\", \"source\": \"$VMWARDEN_STATE_ROOT/mem/rw\", \"proto\": \"virtiofs\" } ],
  \"user_network\": { \"binary\": \"$PASST\", \"id\": \"usernet\" },
  \"vsock\": { \"cid\": 33, \"backend\": \"user\", \"binary\": \"$VSOCKD\" },
  \"console\": true"
MEM_UID=$((NEXT_UID - 1))
mkdir -p "$VMWARDEN_STATE_ROOT/mem/rw"
chown "$MEM_UID:$MEM_UID" "$VMWARDEN_STATE_ROOT/mem" "$VMWARDEN_STATE_ROOT/mem/rw"
chmod 0700 "$VMWARDEN_STATE_ROOT/mem"
if [ -n "$STRACE" ]; then
  # Once under strace, for its locks (the owned share's id range among
  # them); the PSS below is of a launch without it.
  "$STRACE" -f -ttt -e trace=flock,openat,close,fcntl -o "$DIR/logs/locks-mem.strace" "$BIN/vmwarden-launch" mem >"$DIR/logs/mem.log" 2>&1 &
  sp=$!
  "$BIN/vmwarden" wait-ready mem --timeout 120 >"$DIR/logs/mem.ready" 2>&1 \
    || die "mem under strace: not ready: $(tail -3 "$DIR/logs/mem.log" | tr '\n' ' ')"
  # Killed until the lease is free: under load a helper forked after one
  # pgrep still holds it (cleanup then rightly refuses a live VM).
  holders() { # pids with an fd on FILE
    local f
    for f in /proc/[0-9]*/fd/*; do [ "$(readlink "$f" 2>/dev/null)" = "$1" ] && { f=${f#/proc/}; echo "${f%%/*}"; }; done | sort -u
  }
  holds() { # PID FILE: PID has an fd on FILE now
    local f
    for f in /proc/"$1"/fd/*; do [ "$(readlink "$f" 2>/dev/null)" = "$2" ] && return 0; done
    return 1
  }
  describe() { # PID...: each with its command, uid and state
    local p
    for p in "$@"; do printf '%s(%s uid %s state %s) ' "$p" "$(cat "/proc/$p/comm" 2>/dev/null)" "$(awk '/^Uid/ {print $2}' "/proc/$p/status" 2>/dev/null)" "$(awk '/^State/ {print $2}' "/proc/$p/status" 2>/dev/null)"; done
  }
  for _ in $(seq 1 100); do
    ps="$(pgrep -U "$MEM_UID") $(holders "$RUNROOT/mem/instance.lock")"
    [ -z "${ps// /}" ] && flock -n "$RUNROOT/mem/instance.lock" true && break
    for p in $ps; do kill -9 "$p" 2>/dev/null; done
    sleep 0.1
  done
  wait "$sp" 2>/dev/null
  flock -n "$RUNROOT/mem/instance.lock" true \
    || die "mem under strace: its lease still held 10 s after the kill, by: $(describe $(holders "$RUNROOT/mem/instance.lock"))"
  # Something took the lease for a moment after the kill, or a helper
  # forked by root before the kill dropped to the VM's uid after the last
  # pgrep (both seen at load): cleanup is asked again for up to 10 s, who
  # held the lease is named, and a process it names as the VM's is
  # killed, as `vmwarden reap --kill` would.
  for _ in $(seq 1 100); do
    "$BIN/vmwarden-cleanup" mem >"$DIR/logs/mem.cleanup" 2>&1 && break
    if grep -q 'lease .* is held' "$DIR/logs/mem.cleanup"; then
      # Only this VM's processes can hold an fd on the bench's own lease
      # file: each is named (on the output too: the first loop had seen
      # the lease free, so something took it again) and killed if its fd
      # is still on the lease when looked at again.
      late=$(holders "$RUNROOT/mem/instance.lock")
      echo "mem: lease held at cleanup by: $(grep -h "$(stat -c %i "$RUNROOT/mem/instance.lock")" /proc/locks | tr '\n' ' '); fd holders: $(describe $late)" >>"$DIR/logs/mem.cleanup-retries"
      for p in $late; do holds "$p" "$RUNROOT/mem/instance.lock" && kill -9 "$p" 2>/dev/null; done
    elif late=$(grep -o 'ambiguous: processes \[[0-9, ]*\] run as the VM' "$DIR/logs/mem.cleanup" | head -1 | tr -dc '0-9 ,' | tr ',' ' ') && [ -n "${late// /}" ]; then
      echo "mem: processes of its uid at cleanup, killed: $(for p in $late; do printf '%s(%s) ' "$p" "$(cat /proc/$p/comm 2>/dev/null)"; done)" >>"$DIR/logs/mem.cleanup-retries"
      for p in $late; do kill -9 "$p" 2>/dev/null; done
    else
      break
    fi
    sleep 0.1
  done
  [ -s "$DIR/logs/mem.cleanup-retries" ] && echo "scale.sh: mem: cleanup retried $(wc -l <"$DIR/logs/mem.cleanup-retries") times; first: $(head -1 "$DIR/logs/mem.cleanup-retries")" >&2
  grep -q '"clean":true' "$DIR/logs/mem.cleanup" || die "mem: cleanup not clean: $(head -c 400 "$DIR/logs/mem.cleanup"); its retries, first and last: $(if [ -s "$DIR/logs/mem.cleanup-retries" ]; then echo "$(head -1 "$DIR/logs/mem.cleanup-retries") / $(tail -1 "$DIR/logs/mem.cleanup-retries")"; else echo none; fi)"
fi
start_vm mem
sleep 2
QPID=${PID[mem]}
# Every process of the VM beside its hypervisor: those running as its
# principal or an id of its range, and every descendant of those and of
# the hypervisor (one snapshot of every process's pid, parent and uid).
mapfile -t helpers < <(awk -v q="$QPID" -v u="$MEM_UID" '
  FNR == 1 { pid = "" }
  /^Pid:/ { pid = $2 } /^PPid:/ { pp[pid] = $2 } /^Uid:/ { uid[pid] = $2 }
  END {
    for (p in uid) if (uid[p] == u) want[p] = 1
    do { grew = 0; for (p in pp) if (!(p in want) && (pp[p] == q || (pp[p] in want))) { want[p] = 1; grew = 1 } } while (grew)
    for (p in want) if (p != q) print p
  }' /proc/[0-9]*/status 2>/dev/null)
VQ=$(pss_kib "$QPID"); VH=0
MEMROWS=()
for p in "${helpers[@]}"; do
  k=$(pss_kib "$p"); VH=$((VH + k))
  MEMROWS+=("$(printf '  vmwarden    %-30s uid %-8s %8s KiB' "$(cat "/proc/$p/comm")" "$(stat -c %u "/proc/$p")" "$k")")
done
QARGV=$DIR/logs/mem.argv
tr '\0' '\n' <"/proc/$QPID/cmdline" >"$QARGV"
stop_vm mem

# microvm.nix's runner for the same guest: supervisord (nodaemon, root)
# with its event listener and one virtiofsd per share, then QEMU with the
# same argv but SLIRP in place of passt's socket, the virtiofsd sockets
# supervisord's, and no vsock device (see the header).
M=$DIR/mvn; mkdir -p "$M"
cat >"$M/listener.py" <<'EOF'
import sys
while True:
    sys.stdout.write("READY\n"); sys.stdout.flush()
    h = dict(x.split(":") for x in sys.stdin.readline().split())
    sys.stdin.read(int(h["len"]))
    sys.stdout.write("RESULT 2\nOK"); sys.stdout.flush()
EOF
NPROC=$(nproc)
cat >"$M/supervisord.conf" <<EOF
[supervisord]
nodaemon=true
user=root
logfile=$M/supervisord.log
pidfile=$M/supervisord.pid
childlogdir=$M
[eventlistener:notify]
buffer_size=48
command=python3 $M/listener.py
events=PROCESS_STATE
[program:virtiofsd-ro]
command=$VIRTIOFSD --socket-path=$M/ro.sock --shared-dir=$SHARE/ro --thread-pool-size $NPROC --cache=auto --inode-file-handles=prefer --readonly
[program:virtiofsd-rw]
command=$VIRTIOFSD --socket-path=$M/rw.sock --shared-dir=$VMWARDEN_STATE_ROOT/mem/rw --thread-pool-size $NPROC --cache=auto --inode-file-handles=prefer
EOF
"$SUPERVISORD" --configuration "$M/supervisord.conf" >"$M/out" 2>&1 &
SPID=$!
MVN_PIDS+=("$SPID")
for _ in $(seq 1 100); do [ -S "$M/ro.sock" ] && [ -S "$M/rw.sock" ] && break; sleep 0.1; done
[ -S "$M/ro.sock" ] && [ -S "$M/rw.sock" ] || die "supervisord's virtiofsds made no sockets: $(tail -5 "$M/supervisord.log" 2>/dev/null)"
# QEMU's argv as vmwarden gave it, rewritten the microvm.nix way.
cp "$DIR/secrets/key" "$M/token"
python3 - "$QARGV" "$RUNROOT/mem/control" "$M" "$RUNROOT/mem/credentials" >"$M/argv" <<'EOF' || die "cannot rewrite QEMU's argv"
import sys, re
argv = open(sys.argv[1]).read().split("\n")
if argv and argv[-1] == "":
    argv.pop()
ctl, m, creds = sys.argv[2], sys.argv[3], sys.argv[4]
out, i, fs = [], 0, iter(["ro", "rw"])
while i < len(argv):
    a = argv[i]
    v = argv[i + 1] if i + 1 < len(argv) else ""
    if a == "-chardev" and v.startswith("socket,id=vmwarden-qmp,"):
        out += ["-chardev", re.sub(r"fd=[0-9]+", "path=" + m + "/qmp.sock", v)]; i += 2; continue
    if a == "-netdev" and ("stream" in v or "fd=" in v):
        out += ["-netdev", "user,id=" + re.search(r"id=([^,]+)", v).group(1)]; i += 2; continue
    if a == "-chardev" and "vsock" in v:
        i += 2; continue
    if a == "-device" and "vsock" in v:
        i += 2; continue
    if a == "-chardev" and "/virtiofs-" in v:
        out += ["-chardev", re.sub(r"path=[^,]+", "path=" + m + "/" + next(fs) + ".sock", v)]; i += 2; continue
    out += [a] if a not in ("-chardev", "-device", "-netdev") else [a, v]
    i += 1 if a not in ("-chardev", "-device", "-netdev") else 2
print("\n".join(x.replace(ctl, m).replace(creds, m) for x in out))
EOF
mapfile -t margv <"$M/argv"
"${margv[@]}" >"$M/qemu.out" 2>&1 &
MQ=$!
MVN_PIDS+=("$MQ")
python3 "$HERE/qmp-ready.py" "$EPOCHREALTIME" 60 "$M/qmp.sock" >/dev/null \
  || die "microvm.nix's QEMU did not answer: $(head -c 400 "$M/qemu.out"); vmwarden's argv: $(tr "\n" " " <"$QARGV"); rewritten: $(tr "\n" " " <"$M/argv")"
sleep 2
MQK=$(pss_kib "$MQ"); MH=0
for p in $(pgrep -P "$SPID") "$SPID"; do
  k=$(pss_kib "$p"); MH=$((MH + k))
  MEMROWS+=("$(printf '  microvm.nix %-30s uid %-8s %8s KiB' "$(tr '\0' ' ' <"/proc/$p/cmdline" | awk '{ n = split($1, a, "/"); c = a[n]; if (c ~ /^python/) { n = split($2, a, "/"); c = c " " a[n] } print c }')" "$(stat -c %u "/proc/$p")" "$k")")
done
kill -9 "$MQ" 2>/dev/null; kill "$SPID" 2>/dev/null; wait "$MQ" "$SPID" 2>/dev/null
MVN_PIDS=()
{
  echo
  echo "== host memory of one VM (read-only + owned virtiofs share, user network, vsock, console), PSS"
  printf '%s\n' "${MEMROWS[@]}"
  if [ -s "$DIR/logs/locks-mem.strace" ]; then
    echo "locks this VM's launch took (strace -f: each flock, its file, held until its fd closed):"
    lock_table "$DIR/logs/locks-mem.strace"
  fi
  echo "  vmwarden    hypervisor (QEMU)                              $VQ KiB; helpers $VH KiB"
  echo "  microvm.nix hypervisor (QEMU, SLIRP)                       $MQK KiB; helpers $MH KiB"
} | tee "$DIR/logs/table3"
L3="host memory per VM beyond the hypervisor $(awk -v k="$VH" 'BEGIN { printf "%.1f", k / 1024 }') MiB (vmwarden) vs $(awk -v k="$MH" 'BEGIN { printf "%.1f", k / 1024 }') MiB (microvm.nix's helpers for the same guest); total per VM ratio $(ratio $((VQ + VH)) $((MQK + MH)))"

echo
echo "scale: $L1"
echo "scale: $L2"
echo "scale: $L3"
echo "scale: $LF"
echo "scale: $LS"
echo "scale: $LP"
