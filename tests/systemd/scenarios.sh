#!/bin/bash
# Real-systemd scenarios for microvm@.service. Runs INSIDE the L2 guest, as
# vmwarden-scenarios.service (After=multi-user.target), put there by run.sh.
#
# Output contract (stdout = journal + the serial console, and results.txt on the
# results disk, LABEL=vmw-results, which the host reads with debugfs):
#   VMWARDEN-L2-UP uptime=<s> ...                                     once, first
#   SCENARIO name=<x> result=pass|fail time_s=<s> detail=<text>       one per scenario
#   SCENARIOS passed=<N> failed=<M>                                   last
#   VMWARDEN-L2-ALIVE uptime=<s> scenario=<x>       every HEARTBEAT s, console only
#   VMWARDEN-L2-STUCK scenario=<x> after=<s> ...    a scenario past SCENARIO_LIMIT
# Everything else (commands run, journal excerpts) goes to scenarios.log and
# journal.txt on the results disk.
#
# /opt/vmwarden-test/run.env (written by run.sh) sets MODE=full|smoke,
# READY_TIMEOUT, POWEROFF, ONLY (optional list of scenario names), CREDS_<vm>.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LC_ALL=C
T=/opt/vmwarden-test
MODE=full READY_TIMEOUT=300 POWEROFF=1 ONLY=""
# shellcheck source=/dev/null
. "$T/run.env"
# run.sh boots several guests from one image in the default run: each one's
# scenarios come on its kernel command line (vmwarden.only=a,b,c)
for w in $(cat /proc/cmdline); do
  case "$w" in vmwarden.only=*) ONLY=$(printf '%s' "${w#vmwarden.only=}" | tr ',' ' ') ;; esac
done
VMW=/usr/local/bin/vmwarden
RUNTIME_ROOT=/run/vmwarden
STATE_ROOT=/var/lib/vmwarden

# ---------------------------------------------------------------- results disk
RES=/run/vmwarden-results
mkdir -p "$RES"
for _ in $(seq 1 100); do
  dev=$(blkid -L vmw-results 2>/dev/null) && [ -b "$dev" ] && break
  udevadm settle -t 1 2>/dev/null || sleep 0.3
done
if [ -n "${dev:-}" ] && mount -o rw,sync "$dev" "$RES"; then :; else
  echo "VMWARDEN-L2-WARN results disk not mounted; serial console only"
fi
OUT=$RES/results.txt
LOG=$RES/scenarios.log
: >"$OUT"; : >"$LOG"

# stdout is the journal; the console copy is written directly so that the
# serial log has clean lines (journald's console forwarding adds prefixes)
say() { echo "$*"; echo "$*" >>"$OUT"; echo "$*" >/dev/console 2>/dev/null; }
log() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*" >>"$LOG"; }

lsm=$(cat /sys/kernel/security/lsm 2>/dev/null)
say "VMWARDEN-L2-UP uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r) systemd=$(systemctl --version | awk 'NR==1{print $2}') state=$(systemctl is-system-running) mode=$MODE lsm=$lsm"

# ---------------------------------------------------------------- liveness
# The heartbeat tells run.sh that L2's kernel and userspace still run: a
# shard whose console has been silent for several beats is wedged below the
# scenarios (run.sh then stops it, prints its console and runs what it had
# left in a fresh guest). The scenario it names is the one running.
HEARTBEAT=${HEARTBEAT:-60} SCENARIO_LIMIT=${SCENARIO_LIMIT:-900}
CURRENT=/run/vmwarden-scenario-current STUCK=/run/vmwarden-scenario-stuck
echo "(none yet)" >"$CURRENT"
( while sleep "$HEARTBEAT"; do
    echo "VMWARDEN-L2-ALIVE uptime=$(cut -d' ' -f1 /proc/uptime) scenario=$(cat "$CURRENT" 2>/dev/null)" >/dev/console 2>/dev/null
  done ) &
HEARTBEAT_PID=$!
# A scenario still running after SCENARIO_LIMIT s (the slowest passing one
# takes about a third of it in CI) is stuck: say so on the console first
# (run.sh counts that as progress), then what every process waits on, then
# kill what the scenario runs, every 5 s, until it returns; it fails.
# A scenario with a limit of its own names it in LIMIT_<name>.
LIMIT_fifty_units=7200
limit_of() { local v="LIMIT_$1"; echo "${!v:-$SCENARIO_LIMIT}"; }
watchdog() { # NAME SCENARIO_SHELL_PID
  local me p kids limit
  limit=$(limit_of "$1")
  sleep "$limit"
  : >"$STUCK"
  say "VMWARDEN-L2-STUCK scenario=$1 after=${limit}s: killing what it runs"
  { echo "=== stuck: $1 after ${limit} s"
    timeout 20 ps -eo pid,ppid,stat,wchan:32,etimes,args --forest
    echo "=== systemctl list-jobs"; timeout 20 systemctl list-jobs --no-pager
  } >>"$LOG" 2>&1
  # blocked tasks' stacks into the kernel log (and so the console)
  echo w >/proc/sysrq-trigger 2>/dev/null
  me=$BASHPID n=0
  while :; do
    # still there 2 min later: what it waits on cannot be killed (a task
    # blocked in the kernel); the guest is as good as wedged, so stop the
    # heartbeat and let run.sh treat it as such
    n=$((n + 1))
    if [ $n = 25 ]; then
      say "VMWARDEN-L2-STUCK scenario=$1: its commands outlive SIGKILL; stopping the heartbeat"
      kill "$HEARTBEAT_PID" 2>/dev/null
    fi
    # everything below the scenario's shell but this watchdog and the heartbeat
    kids=$(ps -e -o pid=,ppid= | awk -v root="$2" -v me="$me" -v hb="$HEARTBEAT_PID" '
      { kids[$2] = kids[$2] " " $1 }
      END { n = split(kids[root], q, " ")
            while (n > 0) { p = q[n--]; if (p == me || p == hb) continue; print p
                            m = split(kids[p], c, " "); for (i = 1; i <= m; i++) q[++n] = c[i] } }')
    for p in $kids; do kill -KILL "$p" 2>/dev/null; done
    sleep 5
  done
}

# ---------------------------------------------------------------- helpers
PASS=0 FAIL=0 DETAIL=""
fail() { DETAIL="$*"; log "FAIL: $*"; return 1; }
note() { DETAIL="${DETAIL:+$DETAIL; }$*"; }

# journal cursor of the newest entry: "what happened after this point" queries
mark() { journalctl -q -n 1 -o export 2>/dev/null | sed -n 's/^__CURSOR=//p' | tail -1; }
# messages of one unit after a cursor (plain text)
jlog() { # UNIT CURSOR
  if [ -n "$2" ]; then journalctl -q --no-pager -o cat -u "$1" --after-cursor="$2"
  else journalctl -q --no-pager -o cat -u "$1"; fi
}
wait_journal() { # UNIT CURSOR REGEX TIMEOUT_S -> 0 when a line matches
  local end=$((SECONDS + $4))
  while :; do
    jlog "$1" "$2" | grep -Eq -- "$3" && return 0
    [ $SECONDS -ge $end ] && return 1
    sleep 1
  done
}
state() { systemctl show -p ActiveState --value "$1" 2>/dev/null; }
wait_settled() { # UNIT TIMEOUT -> waits until not activating/deactivating/active
  local end=$((SECONDS + $2)) s
  while :; do
    s=$(state "$1")
    case "$s" in active|activating|deactivating|reloading) ;; *) return 0 ;; esac
    [ $SECONDS -ge $end ] && return 1
    sleep 0.5
  done
}
mainpid() { systemctl show -p MainPID --value "$1" 2>/dev/null; }
# the unit a VM runs under: microvm@NAME.service, except the coexist
# scenario's cx, rendered with `render-unit --prefix vmwarden`
UNIT_PREFIX_cx=vmwarden
unit_of() { local p="UNIT_PREFIX_$1"; echo "${!p:-microvm}@$1.service"; }

# QMP query-status through the control socket, without vmwarden (root may connect)
qmp_status() { # VM -> prints "running" etc
  local sock=$RUNTIME_ROOT/$1/control/qmp.sock
  [ -S "$sock" ] || { echo "no-socket"; return 1; }
  printf '%s\n%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"query-status"}' \
    | timeout 10 nc -U -q 2 "$sock" 2>/dev/null \
    | jq -r 'select(.return.status? != null) | .return.status' 2>/dev/null | head -1
}

# credentials: every CREDS_<vm> entry "name:/source/file" must show up in the
# guest's console (journal of the unit) as VMWARDEN-CRED name=<name> sha256=<sha of source>
check_creds() { # VM UNIT CURSOR
  local vm=$1 unit=$2 cur=$3 var="CREDS_$1" spec name src want got n=0 lines
  lines=$(jlog "$unit" "$cur" | grep -E '^VMWARDEN-CRED ' || true)
  for spec in ${!var}; do
    name=${spec%%:*}; src=${spec#*:}
    want=$(sha256sum <"$src" | cut -d' ' -f1)
    got=$(printf '%s\n' "$lines" | sed -n "s/^VMWARDEN-CRED name=$name sha256=\\([0-9a-f]*\\).*/\\1/p" | tail -1)
    [ -n "$got" ] || { fail "$vm: credential $name not seen in the guest"; return 1; }
    [ "$got" = "$want" ] || { fail "$vm: credential $name sha256 $got != source $want"; return 1; }
    n=$((n + 1))
  done
  note "$vm creds=$n/$n"
}

# the secret bytes must not be on the hypervisor command line
check_no_secret_argv() { # VM PID
  local var="CREDS_$1" spec src secret
  for spec in ${!var}; do
    src=${spec#*:}
    secret=$(head -c 32 "$src")
    if tr '\0' '\n' <"/proc/$2/cmdline" 2>/dev/null | grep -qF -- "$secret"; then
      fail "$1: credential content from $src is on the hypervisor command line"; return 1
    fi
  done
}

# the ExecStopPost cleanup reports (one JSON object per line) after a cursor
cleanup_report() { # UNIT CURSOR first|last -> prints that report
  jlog "$1" "$2" | grep -E '^\{.*\}$' | while IFS= read -r l; do
    printf '%s\n' "$l" | jq -e 'type=="object" and has("clean")' >/dev/null 2>&1 && printf '%s\n' "$l"
  done | if [ "${3:-last}" = first ]; then head -1; else tail -1; fi
}
check_cleanup() { # VM UNIT CURSOR [first|last]
  local rep ok
  for _ in $(seq 1 20); do rep=$(cleanup_report "$2" "$3" "${4:-last}"); [ -n "$rep" ] && break; sleep 0.5; done
  log "cleanup report $1: $rep"
  [ -n "$rep" ] || { fail "$1: no cleanup JSON report in the journal (did ExecStopPost run?)"; return 1; }
  ok=$(printf '%s\n' "$rep" | jq -r '.clean == true and ((.failed // []) | length) == 0')
  [ "$ok" = true ] || { fail "$1: cleanup report not clean: $(printf '%s' "$rep" | jq -c '{clean, failed, liveness}' 2>/dev/null | head -c 400)"; return 1; }
  note "$1 cleanup=clean($(printf '%s' "$rep" | jq -r '(.deleted|length|tostring) + " deleted"'))"
}
# vmwarden's own audit plus independent checks that do not trust vmwarden
check_clean() { # VM
  local vm=$1 out rc p
  out=$("$VMW" verify-clean "$vm" 2>&1); rc=$?
  log "verify-clean $vm rc=$rc"; printf '%s\n' "$out" >>"$LOG"
  [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q 'result=clean' \
    || { fail "$vm: vmwarden verify-clean rc=$rc: $(printf '%s\n' "$out" | grep -E 'FAIL|result=' | head -3 | tr '\n' ' ')"; return 1; }
  independent_clean "$vm" || return 1
  note "$vm verify-clean=clean"
}
independent_clean() { # VM
  local vm=$1 p left
  if id "vm-$vm" >/dev/null 2>&1 && p=$(pgrep -u "vm-$vm" | tr '\n' ' ') && [ -n "$p" ]; then
    fail "$vm: processes of vm-$vm still running: $p"; return 1
  fi
  if grep -qs " $RUNTIME_ROOT/$vm/credentials " /proc/[0-9]*/mountinfo; then
    fail "$vm: a credential tmpfs for $vm survives in some mount namespace"; return 1
  fi
  if [ -d "$RUNTIME_ROOT/$vm" ]; then
    # the keep set: the lease file, the last cleanup's record and the
    # credential floor
    left=$(find "$RUNTIME_ROOT/$vm" -mindepth 1 -maxdepth 1 ! -name instance.lock ! -name last-cleanup.json ! -name creds-floor.json -printf '%f ' 2>/dev/null)
    [ -z "$left" ] || { fail "$vm: left in $RUNTIME_ROOT/$vm: $left"; return 1; }
  fi
}

# start one or more VMs and check each: active only after wait-ready, QMP
# running, runs as its principal, credentials reached the guest
check_running() { # VM CURSOR
  local vm=$1 cur=$2 u=$(unit_of "$1") pid st post
  [ "$(state "$u")" = active ] || { fail "$vm: $u is $(state "$u") after start"; return 1; }
  post=$(systemctl show -p ExecStartPost "$u" 2>/dev/null)
  log "$u ExecStartPost: $post"
  case "$post" in *wait-ready*) ;; *) fail "$vm: ExecStartPost has no wait-ready: $post"; return 1 ;; esac
  printf '%s' "$post" | grep -Eq 'code=exited ; status=0( |/)' \
    || { fail "$vm: wait-ready did not exit 0 before active: $post"; return 1; }
  st=$(qmp_status "$vm")
  [ "$st" = running ] || { fail "$vm: QMP query-status=$st"; return 1; }
  if "$VMW" status "$vm" --json >"$RES/status-$vm.json" 2>>"$LOG"; then
    jq -e . "$RES/status-$vm.json" >/dev/null 2>&1 \
      || { fail "$vm: vmwarden status --json is not JSON"; return 1; }
    grep -qi running "$RES/status-$vm.json" \
      || { fail "$vm: vmwarden status --json does not say running: $(head -c 200 "$RES/status-$vm.json")"; return 1; }
  else
    fail "$vm: vmwarden status $vm --json failed"; return 1
  fi
  pid=$(mainpid "$u")
  [ -n "$pid" ] && [ "$pid" != 0 ] || { fail "$vm: no MainPID"; return 1; }
  [ "$(stat -c %U "/proc/$pid")" = "vm-$vm" ] \
    || { fail "$vm: hypervisor pid $pid runs as $(stat -c %U "/proc/$pid"), not vm-$vm"; return 1; }
  check_no_secret_argv "$vm" "$pid" || return 1
  note "$vm active qmp=running uid=vm-$vm"
}
wait_guest() { # VM CURSOR -> READY + creds
  local vm=$1 u=$(unit_of "$1") t0=$SECONDS end=$((SECONDS + READY_TIMEOUT))
  until jlog "$u" "$2" | grep -q '^VMWARDEN-GUEST-READY'; do
    if [ "$(state "$u")" != active ]; then
      fail "$vm: the unit went $(state "$u") before the guest was ready: $(jlog "$u" "$2" | tail -4 | tr '\n' ' ')"; return 1
    fi
    [ $SECONDS -lt $end ] || { fail "$vm: no VMWARDEN-GUEST-READY within ${READY_TIMEOUT}s"; return 1; }
    sleep 1
  done
  note "$vm guest_ready_s=$((SECONDS - t0))"
  check_creds "$vm" "$u" "$2"
}
check_graceful_stop() { # VM CURSOR [MARKER: the guest's line for the stop request]
  local u=$(unit_of "$1") j m=${3:-VMWARDEN-GUEST-POWERBUTTON}
  wait_journal "$u" "$2" "^$m" 10 \
    || { fail "$1: no $m: the stop was not graceful"; return 1; }
  j=$(jlog "$u" "$2")
  if printf '%s\n' "$j" | grep -qE "State 'stop-sigterm' timed out|Killing process .* with signal SIGKILL"; then
    fail "$1: systemd had to kill the hypervisor"; return 1
  fi
  note "$1 $m=seen"
}

run_scenario() { # NAME FUNCTION
  local name=$1 fn=$2 t0 dt r wd kids
  if [ -n "$ONLY" ] && ! printf ' %s ' "$ONLY" | grep -q " $name "; then return 0; fi
  DETAIL=""
  log "=== scenario $name"
  echo "$name" >"$CURRENT"; rm -f "$STUCK"
  watchdog "$name" "$$" >>"$LOG" 2>&1 &
  wd=$!
  t0=$(date +%s.%N)
  if "$fn" >>"$LOG" 2>&1; then r=pass; else r=fail; fi
  # the watchdog first (once its sleep is gone it would go on to mark the
  # scenario stuck), then its sleep
  kids=$(pgrep -P "$wd"); kill "$wd" 2>/dev/null; wait "$wd" 2>/dev/null
  [ -z "$kids" ] || kill $kids 2>/dev/null
  if [ -e "$STUCK" ]; then
    r=fail; DETAIL="stuck: still running after $(limit_of "$name") s, its commands killed (scenarios.log has every process's state; the console the blocked tasks); last: ${DETAIL:-none}"
  fi
  if [ $r = pass ]; then PASS=$((PASS + 1)); else FAIL=$((FAIL + 1)); fi
  dt=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}')
  say "SCENARIO name=$name result=$r time_s=$dt detail=${DETAIL:-none}"
}

# ---------------------------------------------------------------- scenarios (full)
# firecracker's drop-in (RestartForceExitStatus=0), when the run has one
vmw_fc_unit() { [ -d /etc/systemd/system/microvm@fc.service.d ] && echo /etc/systemd/system/microvm@fc.service; }
s_unit_verify() {
  local f out all=""
  for f in /etc/systemd/system/microvm@.service /etc/systemd/system/microvm@a.service \
           /etc/systemd/system/microvm@b.service /etc/systemd/system/microvm@vfs.service /etc/systemd/system/microvm@un.service \
           /etc/systemd/system/microvms.target /etc/systemd/system/vmwarden@.service \
           /etc/systemd/system/vmwarden@cx.service /etc/systemd/system/vmwarden-vms.target \
           /etc/systemd/system/microvm@vsk.service $(vmw_fc_unit); do
    out=$(systemd-analyze verify "$f" 2>&1)
    log "systemd-analyze verify $f: rc=$? output: $out"
    [ -z "$out" ] || all="$all $f: $(printf '%s' "$out" | head -2 | tr '\n' ' ')"
  done
  [ -z "$all" ] || { fail "systemd-analyze verify printed:$all"; return 1; }
  note "no output for microvm@.service, microvm@a/b/vfs/vsk/un${HV_FEATURES_fc+/fc} (with drop-ins), microvms.target, vmwarden@.service, vmwarden@cx (with its drop-in), vmwarden-vms.target"
}

s_start_ab() {
  local cur rc; cur=$(mark)
  timeout 600 systemctl start microvm@a.service microvm@b.service; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start microvm@a microvm@b rc=$rc: $(jlog microvm@a.service "$cur" | tail -3 | tr '\n' ' ')"; return 1; }
  check_running a "$cur" && check_running b "$cur" && wait_guest a "$cur" && wait_guest b "$cur"
}

s_stop_a() {
  local cur rc; cur=$(mark)
  [ "$(state microvm@a.service)" = active ] || { fail "precondition: microvm@a not active"; return 1; }
  timeout 300 systemctl stop microvm@a.service; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl stop rc=$rc"; return 1; }
  check_graceful_stop a "$cur" && check_cleanup a microvm@a.service "$cur" || return 1
  [ "$(state microvm@a.service)" = inactive ] \
    || { fail "microvm@a is $(state microvm@a.service) after stop (ExecStop/ExecStopPost failed?)"; return 1; }
  check_clean a
}

s_kill_b() {
  local cur cur2 rc st sub n0 n restart end
  cur=$(mark)
  [ "$(state microvm@b.service)" = active ] || { fail "precondition: microvm@b not active"; return 1; }
  restart=$(systemctl show -p Restart --value microvm@b.service)
  n0=$(systemctl show -p NRestarts --value microvm@b.service)
  systemctl kill -s KILL microvm@b.service || { fail "systemctl kill failed"; return 1; }
  # The killed instance is torn down (ExecStopPost ran) once the unit is failed
  # or inactive, or, with Restart=on-failure, waiting in auto-restart.
  end=$((SECONDS + 120))
  while :; do
    st=$(state microvm@b.service); sub=$(systemctl show -p SubState --value microvm@b.service)
    n=$(systemctl show -p NRestarts --value microvm@b.service)
    case "$st/$sub" in failed/*|inactive/*|*/auto-restart) break ;; esac
    if [ "$st" = active ] && [ "${n:-0}" -gt "${n0:-0}" ]; then break; fi  # restarted already
    [ $SECONDS -lt $end ] || { fail "microvm@b still $st/$sub 120s after SIGKILL"; return 1; }
    sleep 0.2
  done
  note "after SIGKILL: $st/$sub (Restart=$restart)"
  # the kill's own ExecStopPost report is the first one after the cursor
  check_cleanup b microvm@b.service "$cur" first || return 1
  # Hold it down so the teardown can be audited: stop cancels a pending
  # automatic restart (or stops the restarted instance).
  timeout 300 systemctl stop microvm@b.service
  st=$(state microvm@b.service)
  case "$st" in failed|inactive) ;; *) fail "microvm@b is $st after the kill and a stop"; return 1 ;; esac
  check_clean b || return 1
  systemctl reset-failed microvm@b.service 2>/dev/null
  cur2=$(mark)
  timeout 600 systemctl start microvm@b.service; rc=$?
  [ $rc -eq 0 ] || { fail "start after kill: systemctl start rc=$rc"; return 1; }
  check_running b "$cur2" && wait_guest b "$cur2"
}

s_restart_b() {
  local cur rc old new; cur=$(mark)
  [ "$(state microvm@b.service)" = active ] || { fail "precondition: microvm@b not active"; return 1; }
  old=$(mainpid microvm@b.service)
  timeout 900 systemctl restart microvm@b.service; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl restart rc=$rc"; return 1; }
  new=$(mainpid microvm@b.service)
  [ "$new" != "$old" ] || { fail "MainPID unchanged ($old) across restart"; return 1; }
  check_graceful_stop b "$cur" && check_cleanup b microvm@b.service "$cur" \
    && check_running b "$cur" && wait_guest b "$cur"
}

s_target_stop() {
  local cur cur0 rc v; cur0=$(mark)
  timeout 600 systemctl start microvms.target; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start microvms.target rc=$rc"; return 1; }
  for v in a b; do
    [ "$(state microvm@$v.service)" = active ] || { fail "microvms.target did not start microvm@$v ($(state microvm@$v.service))"; return 1; }
  done
  wait_guest a "$cur0" || return 1   # graceful power-down needs a booted guest
  cur=$(mark)
  timeout 600 systemctl stop microvms.target; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl stop microvms.target rc=$rc"; return 1; }
  for v in a b; do
    wait_settled microvm@$v.service 60
    [ "$(state microvm@$v.service)" = inactive ] \
      || { fail "after stopping microvms.target microvm@$v is $(state microvm@$v.service)"; return 1; }
  done
  for v in a b; do
    check_graceful_stop $v "$cur" && check_cleanup $v microvm@$v.service "$cur" && check_clean $v || return 1
  done
}

s_broken_spec() {
  local cur rc st j nr prevent
  install -m 0644 "$T/specs/c.json" /etc/vmwarden/vms/c.json
  cur=$(mark)
  timeout 120 systemctl start microvm@c.service; rc=$?
  [ $rc -ne 0 ] || { fail "systemctl start microvm@c succeeded with a broken spec"; return 1; }
  wait_settled microvm@c.service 60
  st=$(state microvm@c.service)
  case "$st" in failed|inactive) ;; *) fail "microvm@c is $st"; return 1 ;; esac
  wait_journal microvm@c.service "$cur" 'field `memory_mib`' 10 \
    || { fail "no validation message naming memory_mib in the journal: $(jlog microvm@c.service "$cur" | tail -4 | tr '\n' ' ')"; return 1; }
  j=$(jlog microvm@c.service "$cur" | grep -m1 'memory_mib')
  log "validation message: $j"
  # The unit has RestartPreventExitStatus=78: a spec error (EX_CONFIG) must not
  # be retried until the start limit.
  nr=$(systemctl show -p NRestarts --value microvm@c.service)
  prevent=$(systemctl show -p RestartPreventExitStatus --value microvm@c.service)
  if [ "${nr:-0}" -gt 0 ]; then
    fail "a spec error was retried $nr times (launcher exit status $(systemctl show -p ExecMainStatus --value microvm@c.service), unit RestartPreventExitStatus=$prevent); message: $(printf '%s' "$j" | head -c 160)"
    systemctl reset-failed microvm@c.service 2>/dev/null; return 1
  fi
  if [ -e "$STATE_ROOT/c" ]; then fail "state dir $STATE_ROOT/c was created for an invalid spec"; return 1; fi
  note "start failed ($st, NRestarts=$(systemctl show -p NRestarts --value microvm@c.service)), message: $(printf '%s' "$j" | head -c 200)"
  check_clean c || return 1
  systemctl reset-failed microvm@c.service 2>/dev/null
  return 0
}

# vol: a 9p share and a volume the launcher creates (a created volume), through the
# real unit. The image is the principal's, 0600, sparse; the guest sees its
# size and mounts it as ext4; stop is graceful and clean; the image and what
# the guest wrote on it survive.
s_share_volume() {
  local cur rc img=$STATE_ROOT/vol/data.img u=microvm@vol.service j st ino alloc
  [ ! -e "$img" ] || { fail "precondition: $img exists before the first start"; return 1; }
  cur=$(mark)
  timeout 600 systemctl start $u; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start $u rc=$rc: $(jlog $u "$cur" | tail -4 | tr '\n' ' ')"; return 1; }
  check_running vol "$cur" && wait_guest vol "$cur" || return 1
  j=$(jlog $u "$cur")
  for want in 'VMWARDEN-DISK name=vda bytes=33554432 serial=vol-1' 'T-SHARE from the L2 host' \
              'T-FS-EXT4' 'T-BEFORE none' 'T-WROTE' 'VMWARDEN-RUN-END rc=0'; do
    printf '%s\n' "$j" | grep -qF -- "$want" \
      || { fail "vol: guest output lacks '$want': $(printf '%s\n' "$j" | grep -E '^(T-|VMWARDEN-)' | tr '\n' ' ' | head -c 400)"; return 1; }
  done
  st=$(stat -c '%U:%G %a %s %b %i' "$img") || { fail "vol: no $img"; return 1; }
  log "vol image: $st"
  set -- $st
  [ "$1 $2 $3" = "vm-vol:vm-vol 600 33554432" ] || { fail "vol: $img is $1 mode $2 size $3, not vm-vol:vm-vol 600 33554432"; return 1; }
  alloc=$(( $4 * 512 )); ino=$5
  [ "$alloc" -lt $(( 33554432 / 2 )) ] || { fail "vol: $img is not sparse ($alloc bytes allocated)"; return 1; }
  note "vol image vm-vol 0600 allocated=$alloc/33554432"
  cur=$(mark)
  timeout 300 systemctl stop $u; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl stop $u rc=$rc"; return 1; }
  check_graceful_stop vol "$cur" && check_cleanup vol $u "$cur" && check_clean vol || return 1
  [ "$(stat -c %i "$img" 2>/dev/null)" = "$ino" ] || { fail "vol: $img did not survive the stop and cleanup"; return 1; }
  # What the guest wrote is on the volume (debugfs reads it without mounting).
  debugfs -R 'cat /mark' "$img" 2>/dev/null | grep -qx persisted \
    || { fail "vol: the guest's write is not on $img"; return 1; }
  [ -z "$(find "$STATE_ROOT/vol" -name '.*.vmwarden-new')" ] || { fail "vol: a temporary image is left"; return 1; }
  note "vol image survives stop, guest write persisted"
}

# share_created: vol's writable 9p share "made" names a source that does not
# exist, /var/lib/vmwarden-test/vol-made (its parent root's 0755). The
# launcher makes it, vm-vol's, 0700, and records it; the guest writes in it;
# a restart keeps it (same inode, the guest's file); `vmwarden purge
# --keep-identity` says it deletes it (made by vmwarden) and does. In the
# default run share_volume's start made it: this scenario adds one start.
s_share_created() {
  local src=/var/lib/vmwarden-test/vol-made u=microvm@vol.service cur rc j st ino="" run first=1 out
  # share_volume (before it in the same list) started vol once: the launcher
  # made the source then and its guest wrote once; only the restart is left.
  if [ -e "$src" ]; then
    st=$(stat -c '%U:%G %a %i' "$src"); log "share_created: made at share_volume's start: $src is $st"
    [ "${st% *}" = "vm-vol:vm-vol 700" ] && [ "$(wc -l <"$src/boots" 2>/dev/null)" = 1 ] \
      || { fail "share_created: $src made at share_volume's start is ${st% *} with $(wc -l <"$src/boots" 2>/dev/null) boots, not vm-vol:vm-vol 700 with 1"; return 1; }
    ino=${st##* }; first=2
  fi
  for run in $(seq $first 2); do
    cur=$(mark)
    timeout 600 systemctl start $u; rc=$?
    [ $rc -eq 0 ] || { fail "share_created: systemctl start $u rc=$rc: $(jlog $u "$cur" | tail -4 | tr '\n' ' ')"; return 1; }
    check_running vol "$cur" && wait_guest vol "$cur" || { systemctl stop $u; return 1; }
    j=$(jlog $u "$cur")
    printf '%s\n' "$j" | grep -qF "T-MADE boots=$run root=" \
      || { systemctl stop $u; fail "share_created: start $run: the guest did not write in the made share: $(printf '%s\n' "$j" | grep -E '^T-' | tr '\n' ' ' | head -c 300)"; return 1; }
    st=$(stat -c '%U:%G %a %i' "$src") || { systemctl stop $u; fail "share_created: no $src"; return 1; }
    log "share_created: start $run: $src is $st"
    [ "${st% *}" = "vm-vol:vm-vol 700" ] || { systemctl stop $u; fail "share_created: $src is ${st% *}, not vm-vol:vm-vol 700"; return 1; }
    [ -z "$ino" ] || [ "$ino" = "${st##* }" ] || { systemctl stop $u; fail "share_created: the restart made $src again (inode $ino -> ${st##* })"; return 1; }
    ino=${st##* }
    cur=$(mark)
    timeout 300 systemctl stop $u; rc=$?
    [ $rc -eq 0 ] || { fail "share_created: systemctl stop $u rc=$rc"; return 1; }
    check_cleanup vol $u "$cur" && check_clean vol || return 1
    # the start that made it names it: its cleanup keeps it, saying why
    [ $run = 2 ] || cleanup_report $u "$cur" | jq -e --arg p "$src" '.kept[] | select(.path == $p and (.reason | test("made by vmwarden")))' >/dev/null \
      || { fail "share_created: cleanup does not report $src kept as made by vmwarden"; return 1; }
    [ "$(wc -l <"$src/boots")" = $run ] || { fail "share_created: $src/boots has $(wc -l <"$src/boots") lines after start $run"; return 1; }
  done
  jq -e --arg p "$src" --argjson i "$ino" '.sources[] | select(.path == $p and .ino == $i)' "$STATE_ROOT/.made-sources-vol.json" >/dev/null \
    || { fail "share_created: $STATE_ROOT/.made-sources-vol.json does not name $src (inode $ino)"; return 1; }
  note "$src made vm-vol 0700, used by the guest, kept by a restart (inode $ino)"
  # purge on a terminal (script(1)), typing the phrase once the plan is out
  out=$({ sleep 3; printf 'DELETE-EVERYTHING\r'; sleep 10; } | script -q -e -c "$VMW purge vol --keep-identity" /dev/null 2>&1 | tr -d '\r')
  log "share_created: purge: $out"
  printf '%s\n' "$out" | grep -qF "delete $src (share source: share source made by vmwarden" \
    || { fail "share_created: purge's plan does not say it deletes $src: $(printf '%s' "$out" | tr '\n' ' ' | head -c 400)"; return 1; }
  printf '%s\n' "$out" | grep -qxF "deleted $src" && printf '%s\n' "$out" | grep -qxF 'purge: done' \
    || { fail "share_created: purge did not delete $src: $(printf '%s' "$out" | tr '\n' ' ' | head -c 400)"; return 1; }
  [ ! -e "$src" ] && [ ! -e "$STATE_ROOT/.made-sources-vol.json" ] || { fail "share_created: $src or its record left after purge"; return 1; }
  note "purge said and deleted what vmwarden made"
}

# vsk: the kernel's vhost-vsock backend. The launcher (root) opens
# /dev/vhost-vsock and hands QEMU the fd; QEMU runs as vm-vsk, which cannot
# open the device itself; the guest sees a virtio vsock device (id 0x0013).
# Start microvm@NAME, run CHECKS (a function given the journal cursor of the
# start) once its guest is up, then stop it whatever they found, so a failure
# leaves nothing running for the scenarios after it; a good run must then stop
# gracefully and leave the host clean.
start_check_stop() { # NAME CHECKS
  local cur rc u=microvm@$1.service
  cur=$(mark)
  timeout 600 systemctl start $u; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start $u rc=$rc: $(jlog $u "$cur" | tail -6 | tr '\n' ' ')"; return 1; }
  rc=0
  check_running $1 "$cur" && wait_guest $1 "$cur" && $2 "$cur" || rc=1
  cur=$(mark)
  timeout 300 systemctl stop $u || { fail "systemctl stop $u failed"; return 1; }
  [ $rc -eq 0 ] || return 1
  check_graceful_stop $1 "$cur" && check_cleanup $1 $u "$cur" && check_clean $1
}
s_vhost_vsock() {
  modprobe vhost_vsock || { fail "modprobe vhost_vsock failed"; return 1; }
  [ -c /dev/vhost-vsock ] || { fail "no /dev/vhost-vsock after modprobe"; return 1; }
  start_check_stop vsk vsk_checks
}
vsk_checks() { # CURSOR
  local u=microvm@vsk.service pid j fds
  pid=$(mainpid $u)
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qE 'vhost-vsock-(device|pci),guest-cid=5,vhostfd=[0-9]+' \
    || { fail "vsk: no vhost-vsock device with vhostfd on QEMU's command line: $(tr '\0' ' ' <"/proc/$pid/cmdline" | grep -o 'vhost-vsock[^ ]*')"; return 1; }
  ls -l "/proc/$pid/fd" >>"$LOG" 2>&1
  # The unit's /dev is its own mount: seen from here the fd reads
  # "/vhost-vsock", the path inside that mount.
  fds=$(find "/proc/$pid/fd" -lname '*vhost-vsock*' 2>/dev/null | wc -l)
  [ "$fds" -ge 1 ] || { fail "vsk: QEMU holds no fd of /dev/vhost-vsock (its fds: $(find "/proc/$pid/fd" -printf '%l ' 2>/dev/null | head -c 300))"; return 1; }
  if setpriv --reuid=vm-vsk --regid=vm-vsk --clear-groups sh -c 'exec 3<>/dev/vhost-vsock' 2>/dev/null; then
    fail "vsk: the principal can open /dev/vhost-vsock itself"; return 1
  fi
  j=$(jlog $u "$1")
  printf '%s\n' "$j" | grep -q '^T-VIRTIO 0x0013' \
    || { fail "vsk: the guest has no virtio vsock device: $(printf '%s\n' "$j" | grep '^T-VIRTIO' | tr '\n' ' ')"; return 1; }
  note "vsk vhostfd held by QEMU (uid vm-vsk), guest virtio vsock device present"
}

# vnq: vhost-net and a two-queue tap through the real unit, where the
# kernel has vhost-net (L2's does; the host this suite runs on may not).
# QEMU gets root's tap and /dev/vhost-net fds (two of each) and never the
# node; the principal cannot open it; the tap is multi-queue on the bridge;
# vhost-net runs (QEMU has vhost worker threads); the guest runs two queue
# pairs and L2 reaches it over them. Graceful stop, clean, the tap gone.
s_vhost_net() {
  modprobe vhost_net || { fail "modprobe vhost_net failed"; return 1; }
  [ -c /dev/vhost-net ] || { fail "no /dev/vhost-net after modprobe"; return 1; }
  hv_bridge || return 1
  start_check_stop vnq vnq_checks || return 1
  [ ! -e /sys/class/net/vmw-vnq0 ] || { fail "vnq: tap vmw-vnq0 survives the stop"; return 1; }
}
vnq_checks() { # CURSOR
  local u=microvm@vnq.service pid j argv n l
  pid=$(mainpid $u)
  argv=$(tr '\0' ' ' <"/proc/$pid/cmdline")
  printf '%s' "$argv" | grep -qE 'tap,id=net0,fds=[0-9]+:[0-9]+,vhost=on,vhostfds=[0-9]+:[0-9]+' \
    && printf '%s' "$argv" | grep -qE 'virtio-net-pci,netdev=net0,mac=[0-9a-f:]+,mq=on,vectors=6' \
    || { fail "vnq: QEMU's netdev/device: $(printf '%s' "$argv" | grep -oE '(tap,id|virtio-net)[^ ]*' | tr '\n' ' ')"; return 1; }
  ls -l "/proc/$pid/fd" >>"$LOG" 2>&1
  # /dev is the unit's own mount: the fds read "/vhost-net" from here
  n=$(find "/proc/$pid/fd" -lname '*vhost-net*' 2>/dev/null | wc -l)
  [ "$n" = 2 ] || { fail "vnq: QEMU holds $n fds of /dev/vhost-net, not 2"; return 1; }
  n=$(grep -l '^iff:[[:space:]]*vmw-vnq0' /proc/"$pid"/fdinfo/* 2>/dev/null | wc -l)
  [ "$n" = 2 ] || { fail "vnq: QEMU holds $n fds of tap vmw-vnq0, not 2"; return 1; }
  if setpriv --reuid=vm-vnq --regid=vm-vnq --clear-groups sh -c 'exec 3<>/dev/vhost-net' 2>/dev/null; then
    fail "vnq: the principal can open /dev/vhost-net itself"; return 1
  fi
  # IFF_MULTI_QUEUE is 0x100 in the tap's flags
  l=$(cat /sys/class/net/vmw-vnq0/tun_flags 2>&1)
  [ $(( l & 0x100 )) != 0 ] && [ "$(basename "$(readlink /sys/class/net/vmw-vnq0/master)")" = vmwbr0 ] \
    || { fail "vnq: vmw-vnq0 is not a multi-queue tap on vmwbr0: tun_flags $l, master $(readlink /sys/class/net/vmw-vnq0/master)"; return 1; }
  n=$(cat /proc/"$pid"/task/*/comm 2>/dev/null | grep -c '^vhost-')
  [ "$n" -ge 1 ] || { fail "vnq: no vhost worker among QEMU's threads: vhost-net is not running the queues"; return 1; }
  j=$(jlog $u "$1")
  printf '%s\n' "$j" | grep -q '^T-QUEUES rx-0 rx-1 tx-0 tx-1' \
    || { fail "vnq: the guest's queues: $(printf '%s\n' "$j" | grep '^T-QUEUES')"; return 1; }
  $BB ping -c 3 -W 5 10.77.0.7 >>"$LOG" 2>&1 || { fail "vnq: L2 cannot ping the guest over vmw-vnq0"; return 1; }
  note "vnq: QEMU has 2 tap and 2 vhost-net fds from root, $n vhost worker(s), the guest 2 queue pairs, ping ok"
}

# mvt: a macvtap in bridge mode through the real unit (its drop-in's
# DeviceAllow=char-macvtap). Its link is one end of a veth whose other end,
# 10.78.0.1, is in a peer network namespace: the guest pings it and it pings
# the guest. The launcher made the macvtap (the guest's MAC, on mvt-up, named
# in the intent record) and QEMU holds its character device, which the
# principal cannot open; a graceful stop, clean, and the link is gone.
s_macvtap() {
  modprobe macvtap || { fail "modprobe macvtap failed"; return 1; }
  ip netns add mvtpeer && ip link add mvt-up type veth peer name mvt-peer netns mvtpeer \
    && ip link set mvt-up up && ip -n mvtpeer addr add 10.78.0.1/24 dev mvt-peer \
    && ip -n mvtpeer link set mvt-peer up \
    || { fail "mvt: cannot make the veth into the peer namespace"; return 1; }
  local rc=0
  start_check_stop mvt mvt_checks || rc=1
  ip netns del mvtpeer; ip link del mvt-up 2>/dev/null
  [ $rc = 0 ] || return 1
  [ ! -e /sys/class/net/vmw-mvt0 ] || { fail "mvt: macvtap vmw-mvt0 survives the stop"; return 1; }
}
mvt_checks() { # CURSOR
  local u=microvm@mvt.service pid l idx dev hex n f j
  pid=$(mainpid $u)
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qE 'tap,id=net0,fd=[0-9]+,vhost=off' \
    || { fail "mvt: QEMU's netdev: $(tr '\0' ' ' <"/proc/$pid/cmdline" | grep -oE 'tap,id[^ ]*')"; return 1; }
  l=$(ip -o -d link show dev vmw-mvt0 2>&1)
  printf '%s' "$l" | grep -q 'vmw-mvt0@mvt-up' && printf '%s' "$l" | grep -q 'macvtap mode bridge' \
    && printf '%s' "$l" | grep -q 'link/ether 02:00:00:00:78:02' \
    || { fail "mvt: vmw-mvt0 is not the guest's bridge-mode macvtap on mvt-up: $l"; return 1; }
  jq -e '.resources[] | select(.kind == "macvtap" and .name == "vmw-mvt0" and .link == "mvt-up" and .mode == "bridge")' \
    "$RUNTIME_ROOT/mvt/instance.json" >/dev/null || { fail "mvt: the intent record does not name the macvtap"; return 1; }
  idx=$(cat /sys/class/net/vmw-mvt0/ifindex)
  dev=$(cat "/sys/class/net/vmw-mvt0/macvtap/tap$idx/dev")
  hex=$(printf '%x:%x' "${dev%%:*}" "${dev##*:}")
  n=0
  for f in /proc/"$pid"/fd/*; do [ "$(stat -L -c '%t:%T' "$f" 2>/dev/null)" = "$hex" ] && n=$((n + 1)); done
  [ "$n" = 1 ] || { fail "mvt: QEMU holds $n fds of the macvtap's device $dev, not 1"; return 1; }
  if setpriv --reuid=vm-mvt --regid=vm-mvt --clear-groups sh -c "exec 3<>/dev/tap$idx" 2>/dev/null; then
    fail "mvt: the principal can open /dev/tap$idx itself"; return 1
  fi
  j=$(jlog $u "$1")
  printf '%s\n' "$j" | grep -q '^T-PEER-OK' \
    || { fail "mvt: the guest cannot ping the peer namespace: $(printf '%s\n' "$j" | grep '^T-' | tr '\n' ' ')"; return 1; }
  ip netns exec mvtpeer $BB ping -c 3 -W 5 10.78.0.2 >>"$LOG" 2>&1 \
    || { fail "mvt: the peer namespace cannot ping the guest"; return 1; }
  note "mvt: macvtap vmw-mvt0 (bridge, guest MAC) on mvt-up, QEMU holds its device $dev from root, guest <-> peer namespace ping ok"
}

# pci_passthrough: L2's own PCI device ($PCI_ADDR, behind QEMU's emulated
# intel-iommu) given to the VM pci through VFIO by the real unit: the guest
# sees its vendor and device id; meanwhile the device is on vfio-pci, its
# group's node the principal's, and pc2, asking for the same device, is
# refused. After the stop, and after a SIGKILL of the hypervisor, cleanup
# gives it back: the driver it had, the node root's 0600, no holder.
pci_dev() { echo "/sys/bus/pci/devices/$PCI_ADDR"; }
# Whether the fd /proc/PID/fd/N reaches what it names: still open and not
# O_PATH (udev opens a node O_PATH for a few calls at each event for it;
# such an fd holds nothing, as the launcher's own holder scan judges).
holding_fd() { # FD-LINK
  local fl; fl=$(sed -n 's/^flags:[[:space:]]*//p' "${1/\/fd\//\/fdinfo\/}" 2>/dev/null)
  [ -n "$fl" ] && [ $(( 8#$fl & 8#10000000 )) = 0 ]
}
pci_driver() { local l; l=$(readlink "$(pci_dev)/driver" 2>/dev/null) && basename "$l" || echo none; }
pci_given_back() { # DRIVER GROUP WHEN
  local d st
  d=$(pci_driver)
  [ "$d" = "$1" ] || { fail "pci: after $3 the device is on $d, not $1"; return 1; }
  if [ -e "/dev/vfio/$2" ]; then
    st=$(stat -c '%u:%g %a' "/dev/vfio/$2")
    [ "$st" = "0:0 600" ] || { fail "pci: after $3 /dev/vfio/$2 is $st, not 0:0 600"; return 1; }
  fi
  [ -z "$(find /proc/[0-9]*/fd -lname '*vfio/'"$2" 2>/dev/null | while read -r f; do holding_fd "$f" && echo "$f"; done)" ] \
    || { fail "pci: after $3 a process still holds /dev/vfio/$2"; return 1; }
  note "after $3: on $d, /dev/vfio/$2 $(stat -c '%u:%g %a' "/dev/vfio/$2" 2>/dev/null || echo gone), no holder"
}
s_pci_passthrough() {
  local g d0 u=microvm@pci.service cur pid end st sub
  [ -e "$(pci_dev)/iommu_group" ] \
    || { fail "L2 has no IOMMU group for $PCI_ADDR: $(dmesg | grep -iE 'DMAR|IOMMU|remap' | head -4 | tr '\n' ' ')"; return 1; }
  g=$(basename "$(readlink "$(pci_dev)/iommu_group")")
  d0=$(pci_driver)
  note "L2: $PCI_ADDR $(cat "$(pci_dev)/vendor"):$(cat "$(pci_dev)/device") in group $g on $d0; IR: $(grep -c 'IR-' /proc/interrupts) lines"
  modprobe vfio-pci || { fail "modprobe vfio-pci failed"; return 1; }
  PCI_GROUP=$g start_check_stop pci pci_checks || return 1
  pci_given_back "$d0" "$g" "the stop" || return 1
  # A SIGKILLed hypervisor: cleanup (ExecStopPost) gives it back.
  systemctl reset-failed $u 2>/dev/null
  cur=$(mark)
  timeout 600 systemctl start $u || { fail "pci: second start failed"; return 1; }
  wait_guest pci "$cur" || { timeout 300 systemctl stop $u; return 1; }
  pid=$(mainpid $u)
  [ "$(pci_driver)" = vfio-pci ] || { fail "pci: second start: device on $(pci_driver)"; timeout 300 systemctl stop $u; return 1; }
  systemctl kill --kill-who=main -s KILL $u || { fail "systemctl kill failed"; return 1; }
  end=$((SECONDS + 120))
  while :; do
    st=$(state $u); sub=$(systemctl show -p SubState --value $u)
    case "$st/$sub" in failed/*|inactive/*|*/auto-restart) break ;; esac
    [ $SECONDS -lt $end ] || { fail "pci: still $st/$sub 120s after SIGKILL"; return 1; }
    sleep 0.2
  done
  # no restart into the middle of the check
  systemctl stop $u 2>/dev/null; systemctl reset-failed $u 2>/dev/null
  pci_given_back "$d0" "$g" "SIGKILL and cleanup" || return 1
  check_clean pci || return 1
  pci_kill_every_step "$d0" "$g"
}
# The launcher killed after each of its steps (the fault-injection build,
# by hand: the guarantee holds without the unit), the real device asked
# for: cleanup gives it back every time, and verify-clean agrees.
pci_kill_every_step() { # DRIVER GROUP
  local fl=/usr/local/libexec/vmwarden-launch-faults step rc n=0 keep
  [ -x $fl ] || { fail "pci: no fault-injection launcher in L2 (build it: cargo test --features fault-injection --no-run, or set VMWARDEN_FAULT_LAUNCH)"; return 1; }
  for step in $($fl --list-steps); do
    rc=0; VMWARDEN_FAULT_AFTER=$step $fl pci </dev/null >/run/pci-launch.out 2>&1 || rc=$?
    cat /run/pci-launch.out >>"$LOG"
    [ $rc = 137 ] || { fail "pci: the launch to be killed after $step ended with $rc: $(grep -v 'fault injection' /run/pci-launch.out | tail -3 | tr '\n' ' ')"; /usr/local/bin/vmwarden-cleanup pci >>"$LOG" 2>&1; return 1; }
    /usr/local/bin/vmwarden-cleanup pci >>"$LOG" 2>&1 || { fail "pci: cleanup after a kill at $step failed"; return 1; }
    keep=$DETAIL; pci_given_back "$1" "$2" "a kill after $step" || return 1; DETAIL=$keep
    /usr/local/bin/vmwarden verify-clean pci >>"$LOG" 2>&1 || { fail "pci: verify-clean after a kill at $step is not clean"; return 1; }
    n=$((n + 1))
  done
  note "killed after each of $n steps with $PCI_ADDR asked for: cleanup gave it back each time (on $1, node root's 0600, no holder), verify-clean clean"
}
pci_checks() { # CURSOR
  local u=microvm@pci.service j want st out rc
  want="T-PCI $(cat "$(pci_dev)/vendor") $(cat "$(pci_dev)/device")"
  j=$(jlog $u "$1")
  printf '%s\n' "$j" | grep -qx "$want" \
    || { fail "pci: the guest does not see '$want': $(printf '%s\n' "$j" | grep '^T-PCI' | tr '\n' ' ')"; return 1; }
  [ "$(pci_driver)" = vfio-pci ] || { fail "pci: running, the device is on $(pci_driver)"; return 1; }
  st=$(stat -c '%U %a' "/dev/vfio/$PCI_GROUP" 2>&1)
  [ "$st" = "vm-pci 600" ] || { fail "pci: running, /dev/vfio/$PCI_GROUP is $st"; return 1; }
  # One device, one VM: pc2 asks for it and is refused (exit 78, not retried).
  cur2=$(mark)
  timeout 120 systemctl start microvm@pc2.service; rc=$?
  out=$(jlog microvm@pc2.service "$cur2" | grep -E 'vmwarden-launch: error' | tail -1)
  systemctl stop microvm@pc2.service 2>/dev/null; systemctl reset-failed microvm@pc2.service 2>/dev/null
  [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "IOMMU group $PCI_GROUP .* is held by" \
    || { fail "pc2 was not refused the held device: rc=$rc '$out'"; return 1; }
  [ "$(stat -c '%U' "/dev/vfio/$PCI_GROUP")" = vm-pci ] || { fail "pc2's refusal changed the node"; return 1; }
  note "guest sees $want; device on vfio-pci, /dev/vfio/$PCI_GROUP vm-pci 600; pc2 refused: ${out#*: }"
}

# usb_passthrough: L2's own USB keyboard ($USB_IDS, QEMU's usb-kbd on an
# emulated xHCI; L2 runs Debian's generic kernel) given to a VM by the real
# unit: usb asks for it by ids, us2 by bus and address, both started at
# once: exactly one wins, the other is refused by name and leaves nothing;
# the winner's guest sees the device, its node is the principal's 0600,
# the loser asking again is refused; after the stop the node is as it
# was. The loser then runs with it by its own form, and gives it back the
# same way. hub, asking for the root hub, is refused by name. (An unplug
# under a running VM is not driven here: disabling the device's port in
# L2's sysfs while QEMU in L3 held it hung L2's kernel, the writer and the
# hub's worker blocked for good; tests/device_claim.rs covers cleanup's
# side of it on the host.)
usb_dev() { local d; for d in /sys/bus/usb/devices/*; do
  [ "$(cat "$d/idVendor" 2>/dev/null):$(cat "$d/idProduct" 2>/dev/null)" = "$USB_IDS" ] && { echo "$d"; return 0; }
done; return 1; }
usb_holders() { # NODE -> pids whose fds are that character device (by its numbers)
  local want f; want=$(stat -c '%t:%T' "$1" 2>/dev/null) || return 0
  for f in /proc/[0-9]*/fd/*; do
    [ "$(stat -L -c '%F %t:%T' "$f" 2>/dev/null)" = "character special file $want" ] && holding_fd "$f" && echo "${f%%/fd/*}"
  done | sort -u | tr '\n' ' '
}
usb_refused() { # VM WHAT REGEX CURSOR -> the unit failed with a launcher error matching REGEX
  local u=microvm@$1.service out
  out=$(jlog $u "$4" | grep -E 'vmwarden-launch: error' | tail -1)
  systemctl stop $u 2>/dev/null; systemctl reset-failed $u 2>/dev/null
  printf '%s' "$out" | grep -qE "$3" || { fail "$1 ($2) was not refused by name: '$out'"; return 1; }
  note "$1 refused: ${out#*: }"
}
s_usb_passthrough() {
  local d bus addr node st0 st cur p1 p2 r1 r2 win lose hubst
  modprobe xhci_pci 2>/dev/null
  for _ in $(seq 1 60); do d=$(usb_dev) && break; sleep 0.5; done
  [ -n "$d" ] || { fail "L2 has no USB device $USB_IDS: $(ls /sys/bus/usb/devices 2>&1 | tr '\n' ' ')"; return 1; }
  bus=$(cat "$d/busnum") addr=$(cat "$d/devnum")
  [ "$bus/$addr" = "$USB_BUS/$USB_ADDR" ] || { fail "$USB_IDS is at bus $bus address $addr, not the $USB_BUS/$USB_ADDR that us2 names"; return 1; }
  node=/dev/bus/usb/$(printf '%03d/%03d' "$bus" "$addr")
  st0=$(stat -c '%u:%g %a' "$node") || { fail "no node $node"; return 1; }
  note "L2: $USB_IDS at ${d##*/} ($node $st0)"
  # a hub hands over every device behind it: refused by name, its node untouched
  hubst=$(stat -c '%u:%g %a' "/dev/bus/usb/$(printf '%03d/001' "$bus")")
  cur=$(mark)
  timeout 120 systemctl start microvm@hub.service && { fail "hub: the root hub was taken"; systemctl stop microvm@hub.service; return 1; }
  usb_refused hub "the root hub" "is a USB hub .*class 0x09" "$cur" || return 1
  [ "$(stat -c '%u:%g %a' "/dev/bus/usb/$(printf '%03d/001' "$bus")")" = "$hubst" ] || { fail "hub's refusal changed the root hub's node"; return 1; }
  # two launches at once for one device: exactly one wins
  cur=$(mark)
  timeout 600 systemctl start microvm@usb.service & p1=$!
  timeout 600 systemctl start microvm@us2.service & p2=$!
  wait $p1; r1=$?; wait $p2; r2=$?
  if [ $r1 -eq 0 ] && [ $r2 -ne 0 ]; then win=usb lose=us2
  elif [ $r2 -eq 0 ] && [ $r1 -ne 0 ]; then win=us2 lose=usb
  else fail "usb and us2 started at once: rc $r1 and $r2, not exactly one winner"; systemctl stop microvm@usb.service microvm@us2.service; return 1; fi
  usb_refused $lose "started beside $win" "USB device .* is (held by|owned by)|is held by" "$cur" \
    || { systemctl stop microvm@$win.service; return 1; }
  independent_clean $lose || { systemctl stop microvm@$win.service; return 1; }
  check_running $win "$cur" && wait_guest $win "$cur" && usb_checks $win "$node" "$cur" || { systemctl stop microvm@$win.service; return 1; }
  cur=$(mark)
  timeout 300 systemctl stop microvm@$win.service || { fail "systemctl stop $win failed"; return 1; }
  check_graceful_stop $win "$cur" && check_cleanup $win microvm@$win.service "$cur" || return 1
  st=$(stat -c '%u:%g %a' "$node")
  [ "$st" = "$st0" ] || { fail "after the stop $node is $st, not $st0"; return 1; }
  [ -z "$(usb_holders "$node")" ] || { fail "after the stop $node is held by $(usb_holders "$node")"; return 1; }
  check_clean $win || return 1
  note "after the stop: $node $st, no holder"
  # the loser, by its own form, now free
  cur=$(mark)
  timeout 600 systemctl start microvm@$lose.service || { fail "$lose: start after $win stopped failed: $(jlog microvm@$lose.service "$cur" | tail -4 | tr '\n' ' ')"; return 1; }
  wait_guest $lose "$cur" && usb_checks $lose "$node" "$cur" || { systemctl stop microvm@$lose.service; return 1; }
  cur=$(mark)
  timeout 300 systemctl stop microvm@$lose.service || { fail "systemctl stop $lose failed"; return 1; }
  check_graceful_stop $lose "$cur" && check_cleanup $lose microvm@$lose.service "$cur" || return 1
  st=$(stat -c '%u:%g %a' "$node")
  [ "$st" = "$st0" ] || { fail "after $lose's stop $node is $st, not $st0"; return 1; }
  check_clean $lose
}
usb_checks() { # VM NODE CURSOR
  local vm=$1 u=microvm@$1.service j want st other cur2
  want="T-USB ${USB_IDS%:*} ${USB_IDS#*:}"
  j=$(jlog $u "$3")
  printf '%s\n' "$j" | grep -qx "$want" \
    || { fail "$vm: the guest does not see '$want': $(printf '%s\n' "$j" | grep '^T-USB' | tr '\n' ' ')"; return 1; }
  st=$(stat -c '%U %a' "$2" 2>&1)
  [ "$st" = "vm-$vm 600" ] || { fail "$vm: running, $2 is $st"; return 1; }
  # one device, one VM: the other asks for it again and is refused
  if [ "$vm" = usb ]; then other=us2; else other=usb; fi
  cur2=$(mark)
  timeout 120 systemctl start microvm@$other.service && { fail "$other was given the device $vm holds"; return 1; }
  usb_refused $other "while $vm runs" "USB device .* is held by" "$cur2" || return 1
  [ "$(stat -c '%U' "$2")" = "vm-$vm" ] || { fail "$other's refusal changed $2"; return 1; }
  note "$vm's guest sees $want; $2 vm-$vm 600"
}

# vfs: the helper daemons through the real unit and its hardening: a
# virtiofsd per virtiofs share (one read-only, one writable) and
# vhost-device-vsock for the user vsock backend. The guest reads the
# read-only share and cannot write it, its write to the other one is the
# principal's file here, and data crosses the hybrid vsock from L2's side.
# The helpers run as vm-vfs with no capabilities, in the unit's cgroup; a
# graceful stop leaves nothing of vm-vfs. Then a SIGKILL of the unit's main
# process (the hypervisor) alone: the helpers die with it, cleanup is clean.
VFS_RW=/var/lib/vmwarden-test/vfs-rw
VFS_RO=/opt/vmwarden-test/share
s_virtiofs_vsock() {
  start_check_stop vfs vfs_checks || return 1
  vfs_kill
}
# The hybrid vsock from L2: on control/vsock.sock, `CONNECT 1234` gets `OK`,
# and the guest's vsock-echo (port 1234) answers and logs what it got.
check_hybrid_vsock() { # VM CURSOR
  local out
  out=$( { printf 'CONNECT 1234\n'; sleep 2; printf 'ping-from-l2\n'; sleep 5; } \
         | timeout 30 nc -U -q 1 "$RUNTIME_ROOT/$1/control/vsock.sock" 2>&1 | tr -d '\r')
  log "vsock exchange $1: $out"
  printf '%s\n' "$out" | grep -q '^OK ' && printf '%s\n' "$out" | grep -qx 'guest-got:ping-from-l2' \
    || { fail "$1: hybrid vsock exchange failed: $(printf '%s' "$out" | tr '\n' ' ' | head -c 200)"; return 1; }
  wait_journal microvm@$1.service "$2" '^VSOCK-ECHO got=ping-from-l2' 10 \
    || { fail "$1: the guest did not log the vsock message"; return 1; }
  note "$1 vsock CONNECT/OK/echo from L2"
}
# the principal's processes other than the hypervisor: "PID COMM" lines
vfs_helpers() { # HYPERVISOR_PID [PRINCIPAL, default vm-vfs]
  local p
  for p in $(pgrep -u "${2:-vm-vfs}"); do
    [ "$p" = "$1" ] || echo "$p $(cat "/proc/$p/comm" 2>/dev/null)"
  done
}
# a /proc/PID/status value, its fields joined by single spaces
status_field() { awk -v k="$2:" '$1 == k {$1 = ""; sub(/^ /, ""); print; exit}' "/proc/$1/status" 2>/dev/null; }
vfs_checks() { # CURSOR
  local u=microvm@vfs.service pid j want out names hs h c uid cg ns md
  pid=$(mainpid $u)
  wait_journal $u "$1" '^VSOCK-ECHO listening port=1234' 60 \
    || { fail "vfs: the guest's vsock echo is not listening: $(jlog $u "$1" | grep -E '^(T-|VSOCK-|VMWARDEN-RUN)' | tr '\n' ' ' | head -c 400)"; return 1; }
  j=$(jlog $u "$1")
  for want in 'T-VREAD from the L2 host' 'T-VWROTE' 'T-RO-WRITE-REFUSED' 'VMWARDEN-VSOCK dev=present' \
              'VSOCK-ECHO cid=6' 'VMWARDEN-RUN-END rc=0'; do
    printf '%s\n' "$j" | grep -qF -- "$want" \
      || { fail "vfs: guest output lacks '$want': $(printf '%s\n' "$j" | grep -E '^(T-|VSOCK-|VMWARDEN-RUN)' | tr '\n' ' ' | head -c 400)"; return 1; }
  done
  ! printf '%s\n' "$j" | grep -q '^T-MOUNT-' || { fail "vfs: $(printf '%s\n' "$j" | grep '^T-MOUNT-' | tr '\n' ' ')"; return 1; }
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'vhost-user-fs-device,chardev=fs0,tag=vro' \
    && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'vhost-user-vsock-device,chardev=vsock' \
    || { fail "vfs: QEMU's command line lacks the vhost-user devices: $(tr '\0' ' ' <"/proc/$pid/cmdline" | grep -o 'vhost-user[^ ]*' | tr '\n' ' ')"; return 1; }
  note "vfs guest read ro, write to ro refused, wrote rw"
  # the guest's write is the principal's file; the read-only share is as it was
  md=$(stat -c '%U:%G' "$VFS_RW/out" 2>/dev/null)
  [ "$md" = vm-vfs:vm-vfs ] && [ "$(cat "$VFS_RW/out")" = guest-wrote ] \
    || { fail "vfs: $VFS_RW/out is '$md' with '$(head -c 60 "$VFS_RW/out" 2>/dev/null)', not vm-vfs:vm-vfs 'guest-wrote'"; return 1; }
  [ "$(ls -A "$VFS_RO")" = hello ] || { fail "vfs: the read-only share changed: $(ls -A "$VFS_RO" | tr '\n' ' ')"; return 1; }
  # hybrid vsock from L2: vhost-device-vsock's host socket in control/
  check_hybrid_vsock vfs "$1" || return 1
  # the helpers: as vm-vfs, no capabilities, children of QEMU in the unit's
  # cgroup; virtiofsd in a mount namespace of its own rooted in its share
  hs=$(vfs_helpers "$pid")
  log "vfs helpers (hypervisor $pid): $(printf '%s' "$hs" | tr '\n' ',')"
  names=$(printf '%s\n' "$hs" | awk '{print $2}' | sort | tr '\n' ' ')
  # vrw is writable, so the guest owns it: its virtiofsd and a broker
  [ "$names" = "vhost-device-vs virtiofsd virtiofsd vmwarden-broker " ] \
    || { fail "vfs: the principal's processes besides QEMU are '$names', not vhost-device-vs virtiofsd virtiofsd vmwarden-broker"; return 1; }
  uid=$(id -u vm-vfs)
  cg=$(cat "/proc/$pid/cgroup")
  case "$cg" in *"/microvm@vfs.service"*) ;; *) fail "vfs: QEMU's cgroup is $cg"; return 1 ;; esac
  ns=$(readlink "/proc/$pid/ns/mnt")
  [ "$ns" != "$(readlink /proc/self/ns/mnt)" ] || { fail "vfs: QEMU is in L2's mount namespace"; return 1; }
  for h in $(printf '%s\n' "$hs" | awk '{print $1}'); do
    c=$(cat "/proc/$h/comm")
    [ "$(status_field "$h" Uid)" = "$uid $uid $uid $uid" ] \
      || { fail "vfs: $c $h Uid: $(status_field "$h" Uid)"; return 1; }
    # in a user namespace of its own (the owned share's virtiofsd and its
    # broker): capabilities there only, none in L2's (owned_share_checks)
    if [ "$(readlink "/proc/$h/ns/user")" != "$(readlink /proc/self/ns/user)" ]; then
      owned_ns_checks vfs "$h" || return 1
    else
      for want in CapEff CapPrm CapInh CapAmb; do
        [ "$(status_field "$h" $want)" = 0000000000000000 ] || { fail "vfs: $c $h $want=$(status_field "$h" $want)"; return 1; }
      done
    fi
    [ "$(status_field "$h" NoNewPrivs)" = 1 ] && [ "$(status_field "$h" Seccomp)" = 2 ] \
      || { fail "vfs: $c $h NoNewPrivs=$(status_field "$h" NoNewPrivs) Seccomp=$(status_field "$h" Seccomp)"; return 1; }
    [ "$(status_field "$h" PPid)" = "$pid" ] || { fail "vfs: $c $h is not QEMU's child (PPid $(status_field "$h" PPid))"; return 1; }
    [ "$(cat "/proc/$h/cgroup")" = "$cg" ] || { fail "vfs: $c $h is in cgroup $(cat "/proc/$h/cgroup"), not the unit's"; return 1; }
    # vhost-device-vsock lives in QEMU's mount namespace; each virtiofsd in
    # one of its own, rooted in its share (neither QEMU's nor L2's).
    hns=$(readlink "/proc/$h/ns/mnt")
    if [ "$c" = virtiofsd ] || [ "$c" = vmwarden-broker ]; then
      [ "$hns" != "$ns" ] && [ "$hns" != "$(readlink /proc/self/ns/mnt)" ] \
        || { fail "vfs: $c $h is not in a mount namespace of its own ($hns; QEMU $ns)"; return 1; }
      [ ! -e "/proc/$h/root/etc/passwd" ] || { fail "vfs: $c $h sees the host's /etc/passwd: its root is not its share"; return 1; }
    else
      [ "$hns" = "$ns" ] || { fail "vfs: $c $h is not in QEMU's mount namespace"; return 1; }
    fi
  done
  md=$(stat -c '%U %a' "$RUNTIME_ROOT/vfs/control/virtiofs-vrw.sock" 2>/dev/null)
  [ "$md" = "vm-vfs 600" ] || { fail "vfs: virtiofs-vrw.sock is '$md', not vm-vfs 600"; return 1; }
  note "helpers vm-vfs nnp seccomp, QEMU's children in the unit's cgroup; CapEff=0 but vrw's virtiofsd and broker (caps in their own user namespace only)"
}
# SIGKILL to the hypervisor only (not to the cgroup): its helpers must not
# outlive it (PR_SET_PDEATHSIG), and the kill's cleanup is clean.
vfs_kill() {
  local cur rc u=microvm@vfs.service pid hs h st sub end t0 left
  rm -f "$VFS_RW/out"
  systemctl reset-failed $u 2>/dev/null
  cur=$(mark)
  timeout 600 systemctl start $u; rc=$?
  [ $rc -eq 0 ] || { fail "vfs second start rc=$rc"; return 1; }
  check_running vfs "$cur" && wait_guest vfs "$cur" || { timeout 300 systemctl stop $u; return 1; }
  pid=$(mainpid $u)
  hs=$(vfs_helpers "$pid" | awk '{print $1}' | tr '\n' ' ')
  [ "$(echo $hs | wc -w)" = 4 ] || { fail "vfs: second start has helpers '$hs'"; timeout 300 systemctl stop $u; return 1; }
  systemctl kill --kill-who=main -s KILL $u || { fail "systemctl kill --kill-who=main failed"; return 1; }
  # Gone on their own, not through systemd's final SIGKILL of the cgroup,
  # which only comes after ExecStopPost (KillMode=mixed): the cleanup report
  # below is clean only if no helper held the lease when cleanup ran.
  t0=$(date +%s.%N); left=$hs
  for _ in $(seq 1 100); do
    left=$(for h in $hs; do [ "$(stat -c %U "/proc/$h" 2>/dev/null)" = vm-vfs ] && echo "$h"; done)
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || { fail "vfs: helpers $(echo $left) outlived the killed hypervisor by 10 s"; return 1; }
  note "helpers gone $(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}') s after SIGKILL of QEMU"
  end=$((SECONDS + 120))
  while :; do
    st=$(state $u); sub=$(systemctl show -p SubState --value $u)
    case "$st/$sub" in failed/*|inactive/*|*/auto-restart) break ;; esac
    [ "$st" = active ] && [ "$(mainpid $u)" != "$pid" ] && break   # restarted already
    [ $SECONDS -lt $end ] || { fail "vfs: still $st/$sub 120s after SIGKILL"; return 1; }
    sleep 0.2
  done
  note "then $st/$sub"
  check_cleanup vfs $u "$cur" first || return 1
  timeout 300 systemctl stop $u
  st=$(state $u)
  case "$st" in failed|inactive) ;; *) fail "vfs: $u is $st after the kill and a stop"; return 1 ;; esac
  check_clean vfs || return 1
  # (fails when the stopped unit was already unloaded: nothing to reset)
  systemctl reset-failed $u 2>/dev/null || true
}

# ch, fc: cloud-hypervisor and firecracker boot the shares guest (Debian's
# kernel as an ELF vmlinux, busybox initramfs) through microvm@NAME with KVM.
# run.sh put into each spec the features the launcher accepts for that
# hypervisor (HV_FEATURES_<vm>) and recorded the refusals (HV_REFUSED_<vm>),
# which are reported, not checked. First run: from outside, the hypervisor
# is the principal (all four uids) with every capability set empty,
# NoNewPrivs, seccomp, its own mount namespace, in the unit's cgroup, no
# secret on its argv or environ nor in L2's mount namespace; each accepted
# feature works (tap on a bridge: L2 pings the guest; created ext4 volume:
# the guest mounts it and writes; hybrid vsock in control/; a virtiofs share;
# credentials: sha256 in the guest); a graceful stop (cloud-hypervisor: the
# ACPI power button through its API; firecracker: SendCtrlAltDel, which
# the guest sees as Ctrl-Alt-Del), clean. Second run: the volume still has
# the first run's write, then SIGKILL of the hypervisor, clean.
HV_MARKER_ch=VMWARDEN-GUEST-POWERBUTTON
HV_MARKER_fc=VMWARDEN-GUEST-CTRLALTDEL
BB=/opt/vmwarden-test/bin/busybox
hv_has() { local v="HV_FEATURES_$1"; printf ' %s ' "${!v:-}" | grep -q " $2 "; }
hv_bridge() { # the bridge the taps go on, with L2's address on it
  [ -d "/sys/class/net/$HV_BRIDGE" ] && return 0
  $BB ip link add name "$HV_BRIDGE" type bridge 2>>"$LOG" || $BB brctl addbr "$HV_BRIDGE" \
    || { fail "cannot create bridge $HV_BRIDGE"; return 1; }
  $BB ip addr add 10.77.0.1/24 dev "$HV_BRIDGE" && $BB ip link set "$HV_BRIDGE" up \
    || { fail "cannot configure bridge $HV_BRIDGE"; return 1; }
}
# the hypervisor as the unit runs it, seen from L2
hv_running() { # VM CURSOR
  local vm=$1 u=microvm@$1.service pid post uid gid f sec src spec var
  [ "$(state "$u")" = active ] || { fail "$vm: $u is $(state "$u") after start"; return 1; }
  post=$(systemctl show -p ExecStartPost "$u" 2>/dev/null)
  printf '%s' "$post" | grep -q wait-ready && printf '%s' "$post" | grep -Eq 'code=exited ; status=0( |/)' \
    || { fail "$vm: wait-ready did not exit 0 before active: $post"; return 1; }
  "$VMW" status "$vm" --json >"$RES/status-$vm.json" 2>>"$LOG" && grep -qi running "$RES/status-$vm.json" \
    || { fail "$vm: vmwarden status --json does not say running: $(head -c 300 "$RES/status-$vm.json")"; return 1; }
  pid=$(mainpid "$u")
  [ -n "$pid" ] && [ "$pid" != 0 ] || { fail "$vm: no MainPID"; return 1; }
  log "$vm hypervisor $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline")"
  uid=$(id -u "vm-$vm"); gid=$(id -g "vm-$vm")
  [ "$(status_field "$pid" Uid)" = "$uid $uid $uid $uid" ] && [ "$(status_field "$pid" Gid)" = "$gid $gid $gid $gid" ] \
    || { fail "$vm: hypervisor $pid Uid $(status_field "$pid" Uid) Gid $(status_field "$pid" Gid), not vm-$vm ($uid/$gid)"; return 1; }
  for f in CapInh CapPrm CapEff CapAmb; do
    [ "$(status_field "$pid" $f)" = 0000000000000000 ] || { fail "$vm: hypervisor $f=$(status_field "$pid" $f)"; return 1; }
  done
  [ "$(status_field "$pid" NoNewPrivs)" = 1 ] && [ "$(status_field "$pid" Seccomp)" = 2 ] \
    || { fail "$vm: hypervisor NoNewPrivs=$(status_field "$pid" NoNewPrivs) Seccomp=$(status_field "$pid" Seccomp)"; return 1; }
  [ "$(readlink "/proc/$pid/ns/mnt")" != "$(readlink /proc/1/ns/mnt)" ] || { fail "$vm: hypervisor in L2's mount namespace"; return 1; }
  case "$(cat "/proc/$pid/cgroup")" in *"/microvm@$vm.service"*) ;; *) fail "$vm: cgroup $(cat "/proc/$pid/cgroup")"; return 1 ;; esac
  # no secret on argv or in the environment, none visible in L2's mount namespace
  var="CREDS_$vm"
  for spec in ${!var}; do
    src=${spec#*:}; sec=$(head -c 32 "$src")
    if tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qF -- "$sec" || tr '\0' '\n' <"/proc/$pid/environ" | grep -qF -- "$sec"; then
      fail "$vm: the content of $src is on the hypervisor's argv or in its environment"; return 1
    fi
    if grep -rqsF -- "$sec" "$RUNTIME_ROOT/$vm" "$STATE_ROOT/$vm"; then
      fail "$vm: the content of $src is readable under $RUNTIME_ROOT/$vm or $STATE_ROOT/$vm in L2's mount namespace"; return 1
    fi
  done
  if grep -qs " $RUNTIME_ROOT/$vm/credentials " /proc/1/mountinfo; then
    fail "$vm: the credential tmpfs is mounted in L2's mount namespace"; return 1
  fi
  note "$vm uid=vm-$vm caps=0 nnp=1 seccomp=2 own-mntns (CapBnd=$(status_field "$pid" CapBnd))"
}
hv_checks() { # VM CURSOR RUN(1|2)
  local vm=$1 u=microvm@$1.service j want img=$STATE_ROOT/$1/data.img tap=vmw-${1}0 ip var st rx tx h hs
  j=$(jlog "$u" "$2")
  printf '%s\n' "$j" | grep -q '^VMWARDEN-RUN-END rc=0' \
    || { fail "$vm: the guest's script did not end with rc=0: $(printf '%s\n' "$j" | grep -E '^(T-|VMWARDEN-RUN)' | tr '\n' ' ' | head -c 300)"; return 1; }
  if hv_has "$vm" volume; then
    for want in T-FS-EXT4 "T-BOOTS $3"; do
      printf '%s\n' "$j" | grep -qx -- "$want" \
        || { fail "$vm: guest output lacks '$want' (run $3): $(printf '%s\n' "$j" | grep -E '^T-' | tr '\n' ' ' | head -c 300)"; return 1; }
    done
    st=$(stat -c '%U:%G %a %s' "$img" 2>/dev/null)
    [ "$st" = "vm-$vm:vm-$vm 600 33554432" ] || { fail "$vm: $img is '$st', not vm-$vm:vm-$vm 600 33554432"; return 1; }
    note "$vm volume ext4 vm-$vm 0600, guest boots recorded on it: $3"
  fi
  if hv_has "$vm" net; then
    var="HV_IP_$vm"; ip=${!var}
    [ "$(basename "$(readlink "/sys/class/net/$tap/master" 2>/dev/null)")" = "$HV_BRIDGE" ] \
      || { fail "$vm: tap $tap is not on $HV_BRIDGE ($(ls /sys/class/net | tr '\n' ' '))"; return 1; }
    printf '%s\n' "$j" | grep -qx "T-NET-UP $ip" || { fail "$vm: the guest did not bring eth0 up with $ip"; return 1; }
    $BB ping -c 3 -W 5 "$ip" >>"$LOG" 2>&1 || { fail "$vm: L2 cannot ping the guest at $ip over $tap"; return 1; }
    rx=$(cat "/sys/class/net/$tap/statistics/rx_packets"); tx=$(cat "/sys/class/net/$tap/statistics/tx_packets")
    [ "$rx" -gt 0 ] && [ "$tx" -gt 0 ] || { fail "$vm: $tap rx=$rx tx=$tx packets"; return 1; }
    note "$vm tap $tap on $HV_BRIDGE: L2 pings $ip (rx=$rx tx=$tx)"
    # firecracker (opens its taps by name): a network namespace of its own
    # holding only its taps; on L2, $tap is the host end of its link.
    if [ "$vm" = fc ]; then
      local fpid; fpid=$(mainpid "$u")
      [ "$(readlink "/proc/$fpid/ns/net")" != "$(readlink /proc/1/ns/net)" ] \
        || { fail "fc: firecracker $fpid shares L2's network namespace"; return 1; }
      [ ! -e "/sys/class/net/$tap/tun_flags" ] \
        || { fail "fc: $tap on L2 is a tap, not the host end of the link into firecracker's namespace"; return 1; }
      note "fc: own network namespace; $tap on $HV_BRIDGE is the host end of its link"
    fi
  fi
  if hv_has "$vm" vsock; then
    wait_journal "$u" "$2" '^VSOCK-ECHO listening port=1234' 60 || { fail "$vm: the guest's vsock echo is not listening"; return 1; }
    check_hybrid_vsock "$vm" "$2" || return 1
  fi
  if hv_has "$vm" virtiofs; then
    printf '%s\n' "$j" | grep -qx 'T-VREAD from the L2 host' \
      || { fail "$vm: the guest did not read the virtiofs share: $(printf '%s\n' "$j" | grep -E '^T-' | tr '\n' ' ' | head -c 300)"; return 1; }
    hs=$(pgrep -u "vm-$vm" -x virtiofsd)
    [ -n "$hs" ] || { fail "$vm: no virtiofsd of vm-$vm"; return 1; }
    for h in $hs; do
      [ "$(status_field "$h" CapEff)" = 0000000000000000 ] && [ "$(status_field "$h" NoNewPrivs)" = 1 ] \
        || { fail "$vm: virtiofsd $h CapEff=$(status_field "$h" CapEff) NoNewPrivs=$(status_field "$h" NoNewPrivs)"; return 1; }
    done
    note "$vm virtiofs share read by the guest (virtiofsd as vm-$vm, CapEff=0)"
  fi
  # -- The host's own tools: the console relay under this hypervisor (the
  #    guest's READY above came through its journal copy); attach, detach,
  #    the VM runs on.
  if hv_has "$vm" console; then
    con_open "$vm"
    con_wait "Ctrl-] detaches" 15 || { fail "$vm: vmwarden console: no greeting: $(tr -d '\r' <"$CON_DIR/out" | tail -2 | tr '\n' ' ')"; con_close; return 1; }
    con_close || { fail "$vm: vmwarden console did not end after Ctrl-]"; return 1; }
    grep -qF "Detached from the console of $vm" "$CON_DIR/out" || { fail "$vm: no detach message"; return 1; }
    [ "$(state "$u")" = active ] || { fail "$vm: $u is $(state "$u") after the console detached"; return 1; }
    note "$vm console attached and detached (serial through the relay, READY in the journal)"
  fi
}
# after a SIGKILL: wait until the unit is torn down (failed, inactive,
# waiting to restart, or restarted with another MainPID)
wait_torn_down() { # UNIT OLD_PID
  local st sub end=$((SECONDS + 120))
  while :; do
    st=$(state "$1"); sub=$(systemctl show -p SubState --value "$1")
    case "$st/$sub" in failed/*|inactive/*|*/auto-restart) break ;; esac
    [ "$st" = active ] && [ "$(mainpid "$1")" != "$2" ] && break
    [ $SECONDS -lt $end ] || { fail "$1: still $st/$sub 120s after SIGKILL"; return 1; }
    sleep 0.2
  done
  note "then $st/$sub"
}
s_hv() { # VM
  local vm=$1 u=microvm@$1.service cur rc st pid var=HV_REFUSED_$1 m=HV_MARKER_$1 img=$STATE_ROOT/$1/data.img
  note "$vm accepted: $(v=HV_FEATURES_$vm; echo "${!v:-none}")"
  [ -z "${!var:-}" ] || note "refused by the launcher (not checked): ${!var}"
  if hv_has "$vm" net; then hv_bridge || return 1; fi
  [ ! -e "$img" ] || { fail "precondition: $img exists before the first start"; return 1; }
  cur=$(mark)
  timeout 600 systemctl start "$u"; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start $u rc=$rc: $(jlog "$u" "$cur" | tail -6 | tr '\n' ' ')"; return 1; }
  rc=0
  hv_running "$vm" "$cur" && wait_guest "$vm" "$cur" && hv_checks "$vm" "$cur" 1 || rc=1
  cur=$(mark)
  timeout 300 systemctl stop "$u" || { fail "systemctl stop $u failed"; return 1; }
  [ $rc -eq 0 ] || return 1
  check_graceful_stop "$vm" "$cur" "${!m}" && check_cleanup "$vm" "$u" "$cur" || return 1
  [ "$(state "$u")" = inactive ] || { fail "$vm: $u is $(state "$u") after stop"; return 1; }
  check_clean "$vm" || return 1
  [ ! -e "/sys/class/net/vmw-${vm}0" ] || { fail "$vm: tap vmw-${vm}0 survives the stop"; return 1; }
  # second run: the volume kept the first run's write; then SIGKILL
  systemctl reset-failed "$u" 2>/dev/null
  cur=$(mark)
  timeout 600 systemctl start "$u"; rc=$?
  [ $rc -eq 0 ] || { fail "second start of $u rc=$rc"; return 1; }
  hv_running "$vm" "$cur" && wait_guest "$vm" "$cur" && hv_checks "$vm" "$cur" 2 \
    || { timeout 300 systemctl stop "$u"; return 1; }
  pid=$(mainpid "$u")
  systemctl kill --kill-who=main -s KILL "$u" || { fail "systemctl kill --kill-who=main failed"; return 1; }
  wait_torn_down "$u" "$pid" || return 1
  check_cleanup "$vm" "$u" "$cur" first || return 1
  timeout 300 systemctl stop "$u"
  st=$(state "$u")
  case "$st" in failed|inactive) ;; *) fail "$vm: $u is $st after the kill and a stop"; return 1 ;; esac
  check_clean "$vm" || return 1
  [ ! -e "/sys/class/net/vmw-${vm}0" ] || { fail "$vm: tap vmw-${vm}0 survives the SIGKILL"; return 1; }
  if hv_has "$vm" volume; then
    [ "$(debugfs -R 'cat /boots' "$img" 2>/dev/null | grep -c '^boot$')" = 2 ] \
      || { fail "$vm: $img does not hold both runs' writes"; return 1; }
    note "$vm volume holds both runs' writes"
  fi
  systemctl reset-failed "$u" 2>/dev/null || true
}
s_cloud_hypervisor() { s_hv ch; }
s_firecracker() { s_hv fc; }

# The bench row measured where these hypervisors boot: start to "running"
# (the API's VM state), interleaved round by round, on VMs chb and fcb (the
# same guest, no devices), four ways:
#   unit   vmwarden through its unit, `systemctl start --no-block
#          microvm@NAME` (systemd's unit setup is in it);
#   alone  the launcher alone: `vmwarden-launch NAME` run by root from this
#          script, no unit;
#   bare   the bare binary started by root with the same argv
#          (cloud-hypervisor: the launched one's, with another API socket;
#          firecracker: the same config file);
#   floor  that bare argv as ExecStart of a unit with microvm@.service's
#          hardening and nothing of vmwarden's (floor_unit), started the way
#          the unit is: what systemd's own sandbox setup costs a hypervisor.
# Each is killed once running (the launched ones cleaned up as ExecStopPost
# would). Prints the medians, their ratios to bare, and where the time goes
# (the journal's monotonic clock): up to the launcher's main(), in the
# launcher (main() to its execve) and in the hypervisor to Running; a
# launcher built with the `step-profile` feature gives its marks, else its
# first and last log lines stand in (the launcher alone then has none).
# Asserts only that all reached Running and were cleaned up.
# 3 rounds in the default run, 5 when the scenario is picked by name
BENCH_PAIRS=3; [ -z "$ONLY" ] || BENCH_PAIRS=5
# ms between two monotonic times in seconds; "-" (or nothing) for either
# is unknown, and so is the result (awk would read "-" as 0: a time since
# boot, not a phase)
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "" || b == "" || a == "-" || b == "-") print "-"; else printf "%.0f", (b - a) * 1000 }'; }
# A launch's lines on stdin (the unit's short-monotonic journal, or the
# launcher's own stderr) -> "MAIN EXEC" in monotonic seconds: the
# step-profile marks exec-to-main and seccomp, else (journal only) the times
# of the launcher's first line and of its "landlock applied"; "-" unknown
launcher_marks() {
  awk '
    /vmwarden-profile exec-to-main / { for (i = 1; i <= NF; i++) if ($i == "vmwarden-profile") main = $(i + 4) / 1e9 }
    /vmwarden-profile seccomp / { for (i = 1; i <= NF; i++) if ($i == "vmwarden-profile") ex = $(i + 4) / 1e9 }
    /^\[ *[0-9.]+\] .*vmwarden-launch|^\[ *[0-9.]+\] .*launch\{vm=/ {
      t = $0; sub(/^\[ */, "", t); sub(/\].*/, "", t)
      if (first == "") first = t
      if ($0 ~ /landlock applied/) last = t
    }
    END { if (main == "") main = first; if (ex == "") ex = last; print (main == "" ? "-" : main), (ex == "" ? "-" : ex) }'
}
bench_launcher() { # VM URI OUT -> "MS PID TO_MAIN LAUNCHER HYPERVISOR" once running
  local u=microvm@$1.service out=$3 pid cur t0 t1 m
  systemctl reset-failed "$u" 2>/dev/null
  cur=$(mark)
  "$T/bin/api-running" "$RUNTIME_ROOT/$1/control/api.sock" "$2" 120 -- /usr/bin/systemctl start --no-block "$u" >"$out" 2>&1 \
    || { fail "$1: the launched VM never said Running: $(tail -3 "$out" | tr '\n' ' ')"; return 1; }
  pid=$(mainpid "$u")
  t0=$(sed -n 's/^API-RUNNING .* t0=\([0-9.]*\).*/\1/p' "$out"); t1=$(sed -n 's/^API-RUNNING .* t1=\([0-9.]*\).*/\1/p' "$out")
  journalctl -q --no-pager -o short-monotonic -u "$u" --after-cursor="$cur" >"$out.journal" 2>/dev/null
  m=$(launcher_marks <"$out.journal")
  { echo "bench $1 unit: t0=$t0 t1=$t1 launcher main/exec=$m; journal:"; grep -v 'vmwarden-profile' "$out.journal" | head -20; grep 'vmwarden-profile' "$out.journal"; } >>"$LOG"
  echo "$(sed -n 's/^API-RUNNING ms=\([0-9.]*\).*/\1/p' "$out") $pid $(ms_between "$t0" "${m% *}") $(ms_between "${m% *}" "${m#* }") $(ms_between "${m#* }" "$t1")"
}
bench_kill_launched() { # VM PID
  local u=microvm@$1.service keep=$DETAIL
  systemctl kill --kill-who=main -s KILL "$u"
  wait_torn_down "$u" "$2" || return 1
  DETAIL=$keep
  timeout 300 systemctl stop "$u"
  systemctl reset-failed "$u" 2>/dev/null || true
}
# the launcher alone: root runs vmwarden-launch (no unit), then kills the
# hypervisor and runs vmwarden-cleanup as ExecStopPost would. Its output
# goes to the journal through systemd-cat (which execs it: no process
# between): the launcher's stderr lines carry no time of their own, the
# journal's monotonic stamps give its phases as they do the unit's.
bench_alone() { # VM URI OUT -> "MS TO_MAIN LAUNCHER HYPERVISOR"
  local vm=$1 out=$3 pid t0 t1 m rep cur
  cur=$(mark)
  "$T/bin/api-running" "$RUNTIME_ROOT/$vm/control/api.sock" "$2" 120 -- /usr/bin/systemd-cat -t vmwarden-launch /usr/local/bin/vmwarden-launch "$vm" >"$out" 2>&1 \
    || { fail "$vm: the launcher alone never said Running: $(tail -3 "$out" | tr '\n' ' ')"; return 1; }
  pid=$(sed -n 's/^API-RUNNING .*pid=//p' "$out")
  t0=$(sed -n 's/^API-RUNNING .* t0=\([0-9.]*\).*/\1/p' "$out"); t1=$(sed -n 's/^API-RUNNING .* t1=\([0-9.]*\).*/\1/p' "$out")
  kill -9 "$pid" 2>/dev/null
  for _ in $(seq 1 100); do [ -e "/proc/$pid" ] || break; sleep 0.05; done
  rep=$(/usr/local/bin/vmwarden-cleanup "$vm" 2>>"$LOG")
  printf '%s' "$rep" | jq -e '.clean == true' >/dev/null 2>&1 \
    || { fail "$vm: cleanup after the launcher alone not clean: $(printf '%s' "$rep" | head -c 300)"; return 1; }
  journalctl -q --no-pager -o short-monotonic _PID="$pid" --after-cursor="$cur" >"$out.journal" 2>/dev/null
  m=$(launcher_marks <"$out.journal")
  { echo "bench $vm alone: t0=$t0 t1=$t1 launcher main/exec=$m; journal:"; grep -v 'vmwarden-profile' "$out.journal" | head -20; grep 'vmwarden-profile' "$out.journal"; } >>"$LOG"
  echo "$(sed -n 's/^API-RUNNING ms=\([0-9.]*\).*/\1/p' "$out") $(ms_between "$t0" "${m% *}") $(ms_between "${m% *}" "${m#* }") $(ms_between "${m#* }" "$t1")"
}
bench_bare() { # VM URI OUT ARGV... -> MS
  local vm=$1 uri=$2 out=$3 ms pid; shift 3
  rm -f "/run/vmwarden-bench/$vm/api.sock"
  "$T/bin/api-running" "/run/vmwarden-bench/$vm/api.sock" "$uri" 120 -- "$@" >"$out" 2>&1 \
    || { fail "$vm: the bare binary never said Running: $(tail -3 "$out" | tr '\n' ' ')"; return 1; }
  ms=$(sed -n 's/^API-RUNNING ms=\([0-9.]*\).*/\1/p' "$out"); pid=$(sed -n 's/^API-RUNNING .*pid=//p' "$out")
  kill -9 "$pid" 2>/dev/null
  for _ in $(seq 1 100); do [ -e "/proc/$pid" ] || break; sleep 0.05; done
  echo "$ms"
}
median() { sort -n | awk '{ if ($1 != "-") v[++n] = $1 } END {if (n == 0) print "-"; else if (n % 2) print v[(n+1)/2]; else printf "%.1f\n", (v[n/2]+v[n/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
bench_one() { # VM URI
  local vm=$1 uri=$2 d=/run/vmwarden-bench/$1 i r ms pid argv L="" A="" B="" F="" ml ma mb mf
  local LM="" LL="" LH="" AM="" AL="" AH=""
  mkdir -p "$d"
  for i in $(seq 1 "$BENCH_PAIRS"); do
    r=$(bench_launcher "$vm" "$uri" "$d/launch.out") || return 1
    set -- $r
    ms=$1; pid=$2; LM="$LM $3"; LL="$LL $4"; LH="$LH $5"
    if [ "$i" = 1 ]; then
      mapfile -d '' argv <"/proc/$pid/cmdline"
      case "$vm" in
        chb) argv=("${argv[@]//path=$RUNTIME_ROOT\/$vm\/control\/api.sock/path=$d/api.sock}") ;;
        fcb) cp "$RUNTIME_ROOT/$vm/control/firecracker.json" "$d/firecracker.json" || { fail "$vm: cannot copy its config"; return 1; }
             argv=("${argv[0]}" --api-sock "$d/api.sock" --config-file "$d/firecracker.json") ;;
      esac
      log "bench $vm bare argv: ${argv[*]}"
    fi
    bench_kill_launched "$vm" "$pid" || return 1
    L="$L $ms"
    ms=$(bench_bare "$vm" "$uri" "$d/bare.out" "${argv[@]}") || return 1
    B="$B $ms"
    [ "$i" = 1 ] && floor_unit "$vm" "${argv[@]}"
    ms=$(bench_floor "$vm" "$uri" "$d/floor.out") || return 1
    F="$F $ms"
    r=$(bench_alone "$vm" "$uri" "$d/alone.out") || return 1
    set -- $r
    A="$A $1"; AM="$AM $2"; AL="$AL $3"; AH="$AH $4"
  done
  if [ "${HV_ATTRIB:-0}" != 0 ]; then bench_attrib "$vm" "$uri" || return 1; fi
  rm -f "/run/systemd/system/vmwarden-bench-floor-$vm.service"; systemctl daemon-reload
  check_clean "$vm" || return 1
  ml=$(printf '%s\n' $L | median); ma=$(printf '%s\n' $A | median); mb=$(printf '%s\n' $B | median); mf=$(printf '%s\n' $F | median)
  log "bench $vm unit ms:$L alone ms:$A bare ms:$B bare under the hardened unit ms:$F"
  log "bench $vm unit phases (to main, launcher, hypervisor) ms: [$LM] [$LL] [$LH]; alone: [$AM] [$AL] [$AH]"
  note "$vm start->running: unit ${ml} ms / bare ${mb} ms = $(ratio "$ml" "$mb"), launcher alone ${ma} ms = $(ratio "$ma" "$mb"), the bare hypervisor under the template's hardening (no vmwarden) ${mf} ms = $(ratio "$mf" "$mb") (unit ÷ that $(ratio "$ml" "$mf")) (medians of $BENCH_PAIRS rounds); unit: to main() $(printf '%s\n' $LM | median), launcher $(printf '%s\n' $LL | median), hypervisor $(printf '%s\n' $LH | median) ms; alone: to main() $(printf '%s\n' $AM | median), launcher $(printf '%s\n' $AL | median), hypervisor $(printf '%s\n' $AH | median) ms"
}
# The floor under the unit: a unit with microvm@.service's [Service]
# hardening (no RuntimeDirectory/StateDirectory, no ExecStartPost, nothing of
# vmwarden's) whose ExecStart is the bare hypervisor's argv, started the same
# way (`systemctl start --no-block`): what systemd's own unit setup costs a
# hypervisor. Written once per VM, after the first round gave the argv.
floor_unit() { # VM ARGV... -> installs vmwarden-bench-floor-VM.service
  floor_unit_file "$@" && systemctl daemon-reload
}
floor_unit_file() { # VM ARGV... -> writes it, no daemon-reload (a caller writing many reloads once)
  local vm=$1 u=/run/systemd/system/vmwarden-bench-floor-$1.service a q=""; shift
  for a in "$@"; do q="$q \"$a\""; done
  { echo "[Service]"; echo "Type=exec"; echo "ExecStart=$q"
    sed -n '/^\[Service\]/,/^\[/p' /etc/systemd/system/microvm@.service \
      | grep -E '^[A-Z][A-Za-z]+=' \
      | grep -Ev '^(Exec|Restart|RuntimeDirectory|StateDirectory|Type=|Timeout|SyslogIdentifier)'
    echo "ReadWritePaths=/run/vmwarden-bench"; } >"$u" || return 1
  log "bench $vm floor unit: $(tr '\n' ' ' <"$u" | head -c 600)"
}
bench_floor() { # VM URI OUT -> MS (the floor unit floor_unit wrote)
  bench_floor_as "vmwarden-bench-floor-$1.service" "$@"
}
# Attribution (opt-in: VMWARDEN_HV_ATTRIB=1 on run.sh, or the number of
# rounds, HV_ATTRIB in run.env; CI's default run skips it): what of the real unit the floor lacks,
# one group at a time, interleaved round by round in the same run (median of
# BENCH_PAIRS rounds each, at least 5):
#   floor       the floor unit as above;
#   +dirs       floor + the template's RuntimeDirectory=/StateDirectory= lines
#               (names, modes, Preserve: the very same directories);
#   +post       floor + the template's ExecStartPost (`+vmwarden wait-ready`,
#               root, beside the main process; "-": here it finds no lease
#               and gives up after its grace, so this is its start-up and
#               first poll, not its whole polling);
#   unit        microvm@VM as installed;
#   unit-post   microvm@VM with a drop-in clearing ExecStartPost= (what
#               wait-ready costs the real start, measured from the unit side).
# The VM's drop-in (credentials, writable paths) is logged: chb and fcb have
# none. With a `step-profile` launcher the unit rounds' marks give the
# launcher's slowest steps (median wall ms per step).
attrib_unit() { # VM KIND EXTRA_LINES -> installs vmwarden-bench-KIND-VM.service
  local f=/run/systemd/system/vmwarden-bench-floor-$1.service u=/run/systemd/system/vmwarden-bench-$2-$1.service
  { cat "$f"; printf '%s\n' "$3"; } >"$u"
}
bench_attrib() { # VM URI
  local vm=$1 uri=$2 d=/run/vmwarden-bench/$1 i r v order n k ms dd=/run/systemd/system/microvm@$1.service.d
  local -A M=()
  local rounds=$BENCH_PAIRS; [ "$HV_ATTRIB" -gt "$rounds" ] && rounds=$HV_ATTRIB; [ "$rounds" -ge 5 ] || rounds=5
  log "bench $vm attrib: the VM's drop-in: $(cat "/etc/systemd/system/microvm@$vm.service.d/"*.conf 2>/dev/null | grep -v '^#' | tr '\n' ' ' | head -c 600)"
  attrib_unit "$vm" dirs "$(grep -E '^(RuntimeDirectory|StateDirectory)' /etc/systemd/system/microvm@.service)"
  attrib_unit "$vm" post "$(sed -n 's/^ExecStartPost=+\(.*\)%i$/ExecStartPost=-+\1'"$vm"'/p' /etc/systemd/system/microvm@.service)"
  systemctl daemon-reload
  log "bench $vm attrib +dirs: $(grep -E '^(Runtime|State)Directory' "/run/systemd/system/vmwarden-bench-dirs-$vm.service" | tr '\n' ' '); +post: $(grep '^ExecStartPost' "/run/systemd/system/vmwarden-bench-post-$vm.service")"
  : >"$d/attrib.profile"
  for i in $(seq 1 "$rounds"); do
    order="floor dirs post unit nopost"
    # rotate the order by round: no variant always follows the same one
    for _ in $(seq 1 $(( (i - 1) % 5 ))); do order="${order#* } ${order%% *}"; done
    for v in $order; do
      case "$v" in
        floor|dirs|post)
          ms=$(bench_floor_as "vmwarden-bench-$v-$vm.service" "$vm" "$uri" "$d/attr-$v.out") || return 1 ;;
        unit|nopost)
          if [ "$v" = nopost ]; then
            mkdir -p "$dd"; printf '[Service]\nExecStartPost=\n' >"$dd/zz-bench-nopost.conf"; systemctl daemon-reload
          fi
          r=$(bench_launcher "$vm" "$uri" "$d/attr-$v.out") || return 1
          set -- $r; ms=$1
          grep -o 'vmwarden-profile .*' "$d/attr-$v.out.journal" >>"$d/attrib.profile"
          bench_kill_launched "$vm" "$2" || return 1
          if [ "$v" = nopost ]; then rm -f "$dd/zz-bench-nopost.conf"; rmdir "$dd" 2>/dev/null; systemctl daemon-reload; fi ;;
      esac
      M[$v]="${M[$v]:-} $ms"
    done
  done
  rm -f "/run/systemd/system/vmwarden-bench-dirs-$vm.service" "/run/systemd/system/vmwarden-bench-post-$vm.service"; systemctl daemon-reload
  log "bench $vm attrib rounds ms: $(for v in floor dirs post unit nopost; do printf '%s [%s ] ' "$v" "${M[$v]}"; done)"
  for v in floor dirs post unit nopost; do M[$v]=$(printf '%s\n' ${M[$v]} | median); done
  log "bench $vm attrib ms (median of $rounds): floor ${M[floor]} +dirs ${M[dirs]} +post ${M[post]} unit ${M[unit]} unit-post ${M[nopost]}"
  n="$vm attribution (start->running, medians of $rounds, ms): unit ÷ floor $(ratio "${M[unit]}" "${M[floor]}"); floor ${M[floor]}; RuntimeDirectory/StateDirectory $(awk -v a="${M[dirs]}" -v b="${M[floor]}" 'BEGIN{printf "%+.0f", a-b}')"
  n="$n; ExecStartPost wait-ready on the floor $(awk -v a="${M[post]}" -v b="${M[floor]}" 'BEGIN{printf "%+.0f", a-b}')"
  n="$n, in the unit $(awk -v a="${M[unit]}" -v b="${M[nopost]}" 'BEGIN{printf "%+.0f", a-b}') (unit ${M[unit]}, without it ${M[nopost]})"
  n="$n; the launcher (unit-post minus floor+dirs) $(awk -v a="${M[nopost]}" -v b="${M[dirs]}" 'BEGIN{printf "%+.0f", a-b}')"
  k=$(attrib_steps <"$d/attrib.profile")
  note "$n; launcher's slowest steps (median wall ms): ${k:-none (not a step-profile build)}"
}
# vmwarden-profile lines (STEP CPU_NS WALL_NS AT_NS) -> the six slowest
# steps by median wall time, "step ms cpu ms, ..."
attrib_steps() {
  awk '$1 == "vmwarden-profile" && $2 != "exec-to-main" { w[$2] = w[$2] " " $4; c[$2] = c[$2] " " $3 }
    function med(s,  a, n, i, j, t) { n = split(s, a, " "); for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
      return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
    END { for (s in w) printf "%.1f %s %.1f\n", med(w[s]) / 1e6, s, med(c[s]) / 1e6 }' \
    | sort -rn | head -6 | awk '{ printf "%s%s %s (cpu %s)", (NR > 1 ? ", " : ""), $2, $1, $3 }'
}
bench_floor_as() { # UNIT VM URI OUT -> MS: start UNIT, time it to the API's Running, kill it
  local u=$1 vm=$2 out=$4 ms
  rm -f "/run/vmwarden-bench/$vm/api.sock"
  systemctl reset-failed "$u" 2>/dev/null
  "$T/bin/api-running" "/run/vmwarden-bench/$vm/api.sock" "$3" 120 -- /usr/bin/systemctl start --no-block "$u" >"$out" 2>&1 \
    || { fail "$vm: $u never said Running: $(tail -3 "$out" | tr '\n' ' ') $(journalctl -q -n 5 -u "$u" | tr '\n' ' ')"; systemctl kill -s KILL "$u" 2>/dev/null; return 1; }
  ms=$(sed -n 's/^API-RUNNING ms=\([0-9.]*\).*/\1/p' "$out")
  systemctl kill -s KILL "$u" 2>/dev/null
  for _ in $(seq 1 100); do case "$(state "$u")" in active|deactivating|activating) sleep 0.05 ;; *) break ;; esac; done
  systemctl reset-failed "$u" 2>/dev/null
  echo "$ms"
}
# ------------------------------------------------------ hibernate (ch, fc)
# hibernate_cloud_hypervisor, hibernate_firecracker: chh/fch (run.sh: the
# shares guest ticking with an in-memory marker, hibernate.allowed). Cold
# start through the unit, `vmwarden hibernate` (the snapshot the principal's
# 0600, the unit ends cleanly, not restarted), start again: restored, not
# booted (no READY; the same marker; the uptime going on), in the same
# sandbox (hv_running), the snapshot consumed; stop, clean. Prints the
# bench line: start → the guest's first tick, restore vs cold boot.
hib_first_tick() { # UNIT CURSOR TIMEOUT_S -> "UP MARKER" of the first tick after the cursor
  local end=$((SECONDS + $3)) l
  while :; do
    l=$(jlog "$1" "$2" | sed -n 's/^VMWARDEN-TICK up=\([0-9.]*\) marker=\(.*\)$/\1 \2/p' | head -1)
    [ -n "$l" ] && { echo "$l"; return 0; }
    [ $SECONDS -lt $end ] || return 1
    [ "$(state "$1")" != failed ] || return 1
    sleep 0.1
  done
}
hib_ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# A start's marks in monotonic µs, each an exact stamp (no poll loop):
# systemd's InactiveExitTimestampMonotonic (the start job began), then the
# journal's __MONOTONIC_TIMESTAMP of the launcher's first line ("spec
# valid": the unit's setup before main(), and the spec's read), of its
# last ("exec": the hypervisor's execve follows at once), of wait-ready's
# "the snapshot is loaded, the guest paused" and "the restored guest
# runs" (consumed, then resumed), and of the guest's first tick.
# "START MAIN EXEC LOADED RESUMED TICK", "-" for a mark not seen.
hib_marks() { # UNIT CURSOR
  local s
  s=$(systemctl show -p InactiveExitTimestampMonotonic --value "$1")
  journalctl -q --no-pager -o json --output-fields=MESSAGE,SYSLOG_IDENTIFIER -u "$1" --after-cursor="$2" 2>/dev/null \
    | jq -r '[.__MONOTONIC_TIMESTAMP, (.SYSLOG_IDENTIFIER // "-"), (.MESSAGE | if type == "string" then . else "-" end)] | @tsv' 2>/dev/null \
    | awk -F'\t' -v s="${s:--}" '
        $2 == "vmwarden-launch" && m == "" { m = $1 }
        $2 == "vmwarden-launch" && $3 == "exec" && e == "" { e = $1 }
        $2 == "vmwarden" && $3 ~ /^the snapshot is loaded/ && l == "" { l = $1 }
        $2 == "vmwarden" && $3 ~ /^the restored guest runs/ && r == "" { r = $1 }
        $3 ~ /^VMWARDEN-TICK / && t == "" { t = $1 }
        END { printf "%s %s %s %s %s %s\n", s, (m == "" ? "-" : m), (e == "" ? "-" : e), (l == "" ? "-" : l), (r == "" ? "-" : r), (t == "" ? "-" : t) }'
}
hib_d() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || a == "" || b == "") print "-"; else printf "%.0f", (b - a) / 1000 }'; }
hib_r() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f", a / b }'; }
# The restore's and the cold boot's phases from their marks, and the
# ratios: whole (start → first tick), without the unit's setup before
# main() (the same fixed cost in both), and the hypervisor's part alone
# (its execve → first tick).
hib_breakdown() { # VM COLD_MARKS RESTORE_MARKS
  local vm=$1 cs cm ce ct rs rm re rl rr rt
  read -r cs cm ce _ _ ct <<<"$2"
  read -r rs rm re rl rr rt <<<"$3"
  log "hibernate $vm marks (µs): cold $2; restore $3"
  note "$vm restore phases: unit setup $(hib_d "$rs" "$rm"), launcher $(hib_d "$rm" "$re"), hypervisor load+resume $(hib_d "$re" "$rr") (load $(hib_d "$re" "$rl"), consume+resume $(hib_d "$rl" "$rr")), resume→first tick $(hib_d "$rr" "$rt") ms; cold: unit setup $(hib_d "$cs" "$cm"), launcher $(hib_d "$cm" "$ce"), hypervisor boot→first tick $(hib_d "$ce" "$ct") ms"
  note "$vm exact: restore $(hib_d "$rs" "$rt") ms vs cold $(hib_d "$cs" "$ct") ms (ratio $(hib_r "$(hib_d "$rs" "$rt")" "$(hib_d "$cs" "$ct")")); without the unit's setup $(hib_d "$rm" "$rt") vs $(hib_d "$cm" "$ct") ms (ratio $(hib_r "$(hib_d "$rm" "$rt")" "$(hib_d "$cm" "$ct")")); the hypervisor's part alone $(hib_d "$re" "$rt") vs $(hib_d "$ce" "$ct") ms (ratio $(hib_r "$(hib_d "$re" "$rt")" "$(hib_d "$ce" "$ct")"))"
}
# cloud-hypervisor opens the devices its snapshot's config.json names: one
# byte of its kernel path changed in place is refused at the next start
# (exit 78), by root's record (the file is not the one captured: its ctime
# moved) and by field (payload.kernel), the snapshot kept. A write to a
# snapshot file cannot be undone for the record, so this runs on a second
# hibernation after the restore's; purge then deletes the snapshot.
hib_tampered_is_refused() { # VM
  local vm=$1 u=microvm@$1.service f=$STATE_ROOT/$1/.vmwarden-hibernate/config.json off cur out
  off=$(grep -abo 'assets-shares/vmlinux' "$f" | head -1 | cut -d: -f1)
  [ -n "$off" ] || { fail "$vm: no kernel path in $f"; return 1; }
  off=$((off + 20))
  printf y | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
  cur=$(mark)
  timeout 300 systemctl start "$u" && { fail "$vm: a snapshot naming another kernel was restored"; timeout 300 systemctl stop "$u"; return 1; }
  wait_settled "$u" 120
  jlog "$u" "$cur" | grep -q 'payload.kernel: the snapshot has "/opt/vmwarden-test/assets-shares/vmlinuy"' \
    || { fail "$vm: the tampered snapshot was not refused by field: $(jlog "$u" "$cur" | grep -i snapshot | tail -2 | tr '\n' ' ' | head -c 400)"; return 1; }
  [ -d "$STATE_ROOT/$vm/.vmwarden-hibernate" ] || { fail "$vm: the refused snapshot was not kept"; return 1; }
  systemctl reset-failed "$u" 2>/dev/null
  note "$vm: a config.json naming another kernel refused by field (payload.kernel), the snapshot kept"
  out=$({ sleep 1; printf 'DELETE-EVERYTHING\r'; sleep 3; } | script -q -e -c "$VMW purge $vm --keep-identity" /dev/null 2>&1 | tr -d '\r')
  log "hibernate $vm: purge: $out"
  [ ! -e "$STATE_ROOT/$vm/.vmwarden-hibernate" ] && [ ! -e "$STATE_ROOT/.hibernated-$vm.json" ] \
    || { fail "$vm: purge left the snapshot or its record: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"; return 1; }
  note "$vm: purge deleted the refused snapshot and its record"
}
s_hib_vmm() { # VM
  local vm=$1 u=microvm@$1.service cur t0 cold rest a b f st out cmk rmk snap=$STATE_ROOT/$1/.vmwarden-hibernate
  systemctl reset-failed "$u" 2>/dev/null
  cur=$(mark); t0=$(date +%s%N)
  systemctl start --no-block "$u"
  a=$(hib_first_tick "$u" "$cur" "$READY_TIMEOUT") \
    || { fail "$vm: no tick after the cold start: $(jlog "$u" "$cur" | tail -5 | tr '\n' ' ')"; timeout 300 systemctl stop "$u"; return 1; }
  cold=$(hib_ms "$t0")
  cmk=$(hib_marks "$u" "$cur")
  wait_journal "$u" "$cur" '^VMWARDEN-GUEST-READY' 120 && sleep 2
  [ "$(state "$u")" = active ] || { fail "$vm: $u is $(state "$u") after the cold start"; return 1; }
  out=$(timeout 600 "$VMW" hibernate "$vm" --timeout 300 2>&1) \
    || { fail "$vm: vmwarden hibernate: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"; timeout 300 systemctl stop "$u"; return 1; }
  log "hibernate $vm: $out"
  wait_settled "$u" 120 || { fail "$vm: $u still $(state "$u") after hibernate"; return 1; }
  st=$(state "$u")
  [ "$st" = inactive ] || { fail "$vm: $u is $st after hibernate (not a clean end)"; return 1; }
  for f in "$snap"/*; do
    [ "$(stat -c '%U %a' "$f")" = "vm-$vm 600" ] || { fail "$vm: $f is $(stat -c '%U %a' "$f"), not vm-$vm 600"; return 1; }
  done
  "$VMW" status "$vm" --json 2>>"$LOG" | grep -q hibernated || { fail "$vm: status does not say hibernated"; return 1; }
  note "$vm hibernated: $(du -sh "$snap" | cut -f1) in $(ls "$snap" | tr '\n' ' ')"
  cur=$(mark); t0=$(date +%s%N)
  systemctl start --no-block "$u"
  b=$(hib_first_tick "$u" "$cur" "$READY_TIMEOUT") \
    || { fail "$vm: no tick after the restoring start: $(jlog "$u" "$cur" | tail -5 | tr '\n' ' ')"; timeout 300 systemctl stop "$u"; return 1; }
  rest=$(hib_ms "$t0")
  rmk=$(hib_marks "$u" "$cur")
  [ "${b#* }" = "${a#* }" ] || { fail "$vm: marker ${b#* } after the restore, ${a#* } before"; timeout 300 systemctl stop "$u"; return 1; }
  awk -v x="${a%% *}" -v y="${b%% *}" 'BEGIN { exit !(y >= x) }' || { fail "$vm: uptime went back: ${a%% *} then ${b%% *}"; timeout 300 systemctl stop "$u"; return 1; }
  ! jlog "$u" "$cur" | grep -q '^VMWARDEN-GUEST-READY' || { fail "$vm: the guest booted instead of resuming"; timeout 300 systemctl stop "$u"; return 1; }
  for _ in $(seq 1 120); do [ "$(state "$u")" = active ] && break; sleep 0.5; done
  hv_running "$vm" "$cur" || { timeout 300 systemctl stop "$u"; return 1; }
  [ ! -e "$snap" ] || { fail "$vm: the snapshot was not consumed by the restore"; timeout 300 systemctl stop "$u"; return 1; }
  note "restore: start → guest ready $rest ms vs cold boot $cold ms (ratio $(awk -v r="$rest" -v c="$cold" 'BEGIN { printf "%.2f", r / c }'))"
  hib_breakdown "$vm" "$cmk" "$rmk"
  if [ "$vm" = chh ]; then
    out=$(timeout 600 "$VMW" hibernate "$vm" --timeout 300 2>&1) \
      || { fail "$vm: the second vmwarden hibernate: $(printf '%s' "$out" | tail -3 | tr '\n' ' ')"; timeout 300 systemctl stop "$u"; return 1; }
    wait_settled "$u" 120 || { fail "$vm: $u still $(state "$u") after the second hibernate"; return 1; }
    hib_tampered_is_refused "$vm" || return 1
  else
    timeout 300 systemctl stop "$u"
  fi
  wait_settled "$u" 120
  check_clean "$vm" || return 1
  systemctl reset-failed "$u" 2>/dev/null || true
}
s_hibernate_cloud_hypervisor() { s_hib_vmm chh; }
s_hibernate_firecracker() { s_hib_vmm fch; }

s_hv_bench() {
  bench_one chb /api/v1/vm.info && bench_one fcb /
}
# ---------------------------------------------------------------- vsock_ssh
# `ssh vsock/<cid>` from L2 reaches the guest's sshd on vsock port 22 over
# the kernel's vhost-vsock (vsk: vsock.backend = "vhost", cid 5; dropbear
# behind vsock-serve in the shares guest). L2's systemd 252 has no
# systemd-ssh-proxy: run.sh's ssh_config gives vsock/* the same ProxyCommand
# (guest/vsock-ssh-proxy, socat), the guest's host key pinned. The command
# runs in that guest (it prints the boot id the guest printed on its
# console), its exit status comes back, and a client that does not know the
# host key is refused (what keeps `ssh vsock/<cid>` from talking to another
# VM that took a stopped VM's CID).
guest_bootids() { # UNIT CURSOR -> the boot ids the guest printed, in order
  jlog "$1" "$2" | sed -n 's/^T-BOOTID \([0-9a-f-]*\).*/\1/p'
}
s_vsock_ssh() {
  modprobe vhost_vsock || { fail "modprobe vhost_vsock failed"; return 1; }
  start_check_stop vsk vsock_ssh_checks
}
vsock_ssh_checks() { # CURSOR
  local u=microvm@vsk.service id out rc t0
  wait_journal $u "$1" '^VSOCK-SERVE listening port=22' 60 \
    || { fail "vsk: the guest's sshd is not listening on vsock port 22: $(jlog $u "$1" | grep -E '^(T-|VSOCK-|VMWARDEN-RUN)' | tr '\n' ' ' | head -c 300)"; return 1; }
  id=$(guest_bootids $u "$1" | tail -1)
  [ -n "$id" ] || { fail "vsk: the guest printed no boot id"; return 1; }
  t0=$(date +%s.%N)
  out=$(timeout 90 ssh vsock/5 'echo "T-SSH-RAN boot=$(cat /proc/sys/kernel/random/boot_id)"' 2>>"$LOG"); rc=$?
  log "ssh vsock/5: rc=$rc out=$out"
  [ $rc -eq 0 ] && [ "$out" = "T-SSH-RAN boot=$id" ] \
    || { fail "vsk: ssh vsock/5 rc=$rc said '$(printf '%s' "$out" | head -c 200)', not the guest's boot id $id"; return 1; }
  note "ssh vsock/5 ran a command in the guest (its boot id $id) in $(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}') s"
  timeout 90 ssh vsock/5 'exit 7' 2>>"$LOG"; rc=$?
  [ $rc -eq 7 ] || { fail "vsk: ssh vsock/5 'exit 7' returned $rc"; return 1; }
  out=$(timeout 90 ssh -o UserKnownHostsFile=/dev/null vsock/5 true 2>&1); rc=$?
  log "ssh vsock/5 without the host key: rc=$rc $out"
  [ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'Host key verification failed' \
    || { fail "vsk: ssh vsock/5 with an unknown host key was not refused (rc=$rc): $(printf '%s' "$out" | tr '\n' ' ' | head -c 200)"; return 1; }
  note "exit status passed back; an unknown host key refused"
}

# ---------------------------------------------------------------- guest_reboot
# A reboot and a poweroff from inside the guest, on each hypervisor, through
# the unit. The guest is reached the way an operator reaches it, `ssh
# vsock-mux/<its control/vsock.sock>` (run.sh's ssh_config, the hybrid vsock
# of each VM), and runs `kill -USR2 1` (its PID 1 reboots, as systemd's
# `reboot` ends) or `kill -USR1 1` (poweroff). The VMs and what each must do:
#   rbq  QEMU: a credential, a read-only virtiofs share, the user vsock
#        backend (virtiofsd and vhost-device-vsock must serve the second
#        boot as they served the first). Reboot in place; poweroff: off.
#   rbc  cloud-hypervisor: a credential, a tap, its own hybrid vsock. Reboot
#        in place; poweroff: off.
#   rbf  firecracker: a tap, its hybrid vsock, and with it the guest's
#        notify socket (vsock.notify, on by default): the guest's PID 1
#        sends systemd-shutdown's X_SYSTEMD_SHUTDOWN=reboot|poweroff to the
#        vsock port of the vmm.notify_socket credential on its command line
#        before it ends (`VMM-NOTIFY sent=...`). A reboot ends firecracker
#        with 0 and the unit restarts it (RestartForceExitStatus=0; the
#        helper vmm-notify leaves it alone); `vmwarden stop` by hand is
#        refused (the unit would restart it); a poweroff halts the guest
#        (firecracker has no ACPI power-off) and vmm-notify ends firecracker
#        with SIGTERM: off, Result=success, not restarted.
#   rbv  cloud-hypervisor with a virtiofs share: its in-place reboot
#        could not reconnect to virtiofsd (which ends when its client
#        goes), so the launcher's helper reboot-watch ends cloud-hypervisor
#        with SIGHUP at its `rebooting` event (a clean exit), and the unit
#        restarts it (RestartForceExitStatus=SIGHUP) with a fresh virtiofsd;
#        `vmwarden stop` by hand is refused (the unit would restart it).
#        Poweroff: off.
# In place: the same hypervisor process and instance, no cleanup, the unit
# active throughout. Restarted: a new process and instance, NRestarts one
# up, the run's cleanup report clean (with the exit systemd saw), wait-ready
# passed again. Either way: a new boot (another boot id on the console),
# the credential, the share and the tap work in it, ssh reaches it again.
# Off: the unit inactive with Result=success (not failed), the cleanup
# report saying the hypervisor exited 0 (firecracker: ended by SIGTERM,
# which systemd counts as clean), no restart, verify-clean clean.
RB_REBOOT_rbq=in-place RB_REBOOT_rbc=in-place RB_REBOOT_rbf=restart RB_REBOOT_rbv=restart
RB_EXIT_rbf='"success","exited","0"' RB_EXIT_rbv='"success","killed","HUP"'
RB_OFF_rbf='"success","killed","TERM"'
rb_ssh() { # VM COMMAND: run COMMAND in VM's guest over its hybrid vsock socket
  timeout 90 ssh "vsock-mux$RUNTIME_ROOT/$1/control/vsock.sock" "$2" 2>>"$LOG"
}
rb_props() { systemctl show -p ActiveState,SubState,Result,MainPID,NRestarts "$1" | tr '\n' ' '; }
rb_prop() { systemctl show -p "$2" --value "$1"; }
rb_instance() { "$VMW" status "$1" --json 2>>"$LOG" | jq -r '.[0].instance_id // "none"'; }
# what systemd told the cleanup of the run after CURSOR about the exit
rb_exit_seen() { # UNIT CURSOR -> "result","code","status"
  cleanup_report "$1" "$2" first | jq -r '.service_result | "\"\(.service_result)\",\"\(.exit_code)\",\"\(.exit_status)\""' 2>/dev/null
}
# the guest's next boot after CURSOR: a boot id other than OLD, its READY
# and its sshd; prints the new boot id
rb_wait_boot() { # VM CURSOR OLD_ID
  local u=microvm@$1.service end=$((SECONDS + READY_TIMEOUT)) new j
  while :; do
    j=$(jlog "$u" "$2")
    new=$(printf '%s\n' "$j" | sed -n 's/^T-BOOTID \([0-9a-f-]*\).*/\1/p' | grep -vx -- "$3" | tail -1)
    if [ -n "$new" ] && printf '%s\n' "$j" | grep -q '^VMWARDEN-GUEST-READY' \
       && printf '%s\n' "$j" | grep -q '^VSOCK-SERVE listening port=22'; then
      echo "$new"; return 0
    fi
    [ $SECONDS -lt $end ] || return 1
    sleep 1
  done
}
rb_one() { # VM
  local vm=$1 u=microvm@$1.service kind cur cur1 cur2 pid1 pid2 n1 n2 id1 id2 inst1 inst2 out rc ip var
  local how=RB_REBOOT_$1 exitv=RB_EXIT_$1 offv=RB_OFF_$1 off
  kind=$(jq -r .hypervisor.kind "/etc/vmwarden/vms/$vm.json")
  systemctl reset-failed "$u" 2>/dev/null
  cur=$(mark)
  timeout 600 systemctl start "$u"; rc=$?
  [ $rc -eq 0 ] || { fail "$vm: systemctl start rc=$rc: $(jlog "$u" "$cur" | tail -4 | tr '\n' ' ')"; return 1; }
  if [ "$kind" = qemu ]; then check_running "$vm" "$cur" || return 1; else hv_running "$vm" "$cur" || return 1; fi
  wait_guest "$vm" "$cur" || return 1
  wait_journal "$u" "$cur" '^VSOCK-SERVE listening port=22' 60 || { fail "$vm: the guest's sshd is not listening"; return 1; }
  id1=$(guest_bootids "$u" "$cur" | tail -1)
  pid1=$(mainpid "$u"); n1=$(rb_prop "$u" NRestarts); inst1=$(rb_instance "$vm")
  log "$vm ($kind) before its reboot: $(rb_props "$u") boot=$id1 instance=$inst1"

  # reboot from inside
  cur1=$(mark)
  rb_ssh "$vm" '(sleep 1; kill -USR2 1) </dev/null >/dev/null 2>&1 &' \
    || { fail "$vm: ssh vsock-mux$RUNTIME_ROOT/$vm/control/vsock.sock failed"; return 1; }
  id2=$(rb_wait_boot "$vm" "$cur1" "$id1") \
    || { fail "$vm: no new boot within ${READY_TIMEOUT}s of the guest's reboot: $(rb_props "$u") $(jlog "$u" "$cur1" | tail -5 | tr '\n' ' ')"; return 1; }
  pid2=$(mainpid "$u"); n2=$(rb_prop "$u" NRestarts); inst2=$(rb_instance "$vm")
  log "$vm ($kind) after its reboot: $(rb_props "$u") boot=$id2 instance=$inst2"
  [ "$(state "$u")" = active ] || { fail "$vm: $u is $(state "$u") after the guest's reboot"; return 1; }
  "$VMW" status "$vm" --json 2>>"$LOG" | jq -e '.[0].state == "running"' >/dev/null \
    || { fail "$vm: vmwarden status does not say running after the reboot"; return 1; }
  case ${!how} in
    restart)
      [ "$pid2" != "$pid1" ] && [ "$n2" -eq $((n1 + 1)) ] && [ "$inst2" != "$inst1" ] \
        || { fail "$vm: $kind's reboot: MainPID $pid1 -> $pid2, NRestarts $n1 -> $n2, instance $inst1 -> $inst2 (want a restart by the unit)"; return 1; }
      check_cleanup "$vm" "$u" "$cur1" first || return 1
      out=$(rb_exit_seen "$u" "$cur1")
      [ "$out" = "${!exitv}" ] || { fail "$vm: the run ended with $out, not ${!exitv}"; return 1; }
      systemctl show -p ExecStartPost "$u" | grep -Eq 'wait-ready.*code=exited ; status=0( |/)' \
        || { fail "$vm: wait-ready did not pass again after the restart"; return 1; }
      note "$vm reboot: $kind ended ($out), restarted by its unit (pid $pid1 -> $pid2, NRestarts $n1 -> $n2), cleanup between the runs clean, new boot"
      if [ "$kind" = firecracker ]; then
        # the guest told vmm-notify, which left firecracker to its own exit
        jlog "$u" "$cur1" | grep -v 'vmwarden vmm-notify:' | tr -d '\n' | grep -q 'VMM-NOTIFY sent=reboot port=8888' \
          && jlog "$u" "$cur1" | grep -q "vmm-notify: the guest's systemd says reboot: the hypervisor is left to it" \
          || { fail "$vm: the guest's reboot message did not reach vmm-notify: $(jlog "$u" "$cur1" | grep -E 'VMM-NOTIFY|vmm-notify' | tr '\n' ' ')"; return 1; }
        note "$vm reboot: X_SYSTEMD_SHUTDOWN=reboot reached vmm-notify, which left firecracker to its own exit"
      fi
      if [ "$kind" = cloud-hypervisor ]; then
        jlog "$u" "$cur1" | grep -q 'vmwarden reboot-watch: cloud-hypervisor reboots the VM' \
          && [ "$(rb_prop "$u" Result)" = success ] \
          || { fail "$vm: the reboot did not go through reboot-watch: Result=$(rb_prop "$u" Result) $(jlog "$u" "$cur1" | grep -E 'reboot-watch|virtiofsd' | tail -3 | tr '\n' ' ')"; return 1; }
        note "$vm reboot: reboot-watch ended cloud-hypervisor (SIGHUP) at its rebooting event, a fresh virtiofsd served the new boot"
      fi
      ;;
    *)
      [ "$pid2" = "$pid1" ] && [ "$n2" = "$n1" ] && [ "$inst2" = "$inst1" ] \
        || { fail "$vm: $kind's reboot: MainPID $pid1 -> $pid2, NRestarts $n1 -> $n2, instance $inst1 -> $inst2 (want the same, in place)"; return 1; }
      [ -z "$(cleanup_report "$u" "$cur1")" ] || { fail "$vm: a cleanup ran across the in-place reboot"; return 1; }
      note "$vm reboot: in place (same pid $pid1 and instance), new boot"
      ;;
  esac
  check_creds "$vm" "$u" "$cur1" || return 1
  if jlog "$u" "$cur" | grep -q '^T-VREAD'; then
    jlog "$u" "$cur1" | grep -qx 'T-VREAD from the L2 host' \
      || { fail "$vm: the virtiofs share is not readable in the new boot"; return 1; }
    note "$vm share read again"
  fi
  if hv_has "$vm" net; then
    var="HV_IP_$vm"; ip=${!var}
    $BB ping -c 2 -W 5 "$ip" >>"$LOG" 2>&1 || { fail "$vm: L2 cannot ping the guest at $ip after its reboot"; return 1; }
    note "$vm tap: ping $ip again"
  fi
  # Restarted by its unit (firecracker; cloud-hypervisor with a virtiofs
  # share, whose guest may answer the power button with a reboot).
  if [ "${!how}" = restart ]; then
    out=$("$VMW" stop "$vm" --timeout 5 2>&1); rc=$?
    log "$vm: vmwarden stop by hand: rc=$rc $out"
    [ $rc -eq 1 ] && printf '%s' "$out" | grep -q "systemctl stop $u" \
      && [ "$(state "$u")" = active ] && [ "$(mainpid "$u")" = "$pid2" ] \
      || { fail "$vm: vmwarden stop by hand rc=$rc ($(printf '%s' "$out" | tail -1 | head -c 200)), unit $(state "$u") pid $(mainpid "$u")"; return 1; }
    note "$vm: vmwarden stop by hand refused, pointing to systemctl stop; still running"
  fi

  # poweroff from inside
  cur2=$(mark)
  rb_ssh "$vm" '(sleep 1; kill -USR1 1) </dev/null >/dev/null 2>&1 &' || { fail "$vm: ssh for the poweroff failed"; return 1; }
  off=${!offv:-'"success","exited","0"'}
  # (a bound on liveness, not a speed: in a fresh-clone run the guest's
  # shutdown began 125 s after the ssh under three L2 machines' load)
  wait_settled "$u" 360 || { fail "$vm: $u still $(state "$u") 360 s after the guest's poweroff: $(jlog "$u" "$cur2" | tail -4 | tr '\n' ' ')"; return 1; }
  check_cleanup "$vm" "$u" "$cur2" || return 1
  out=$(rb_exit_seen "$u" "$cur2")
  # longer than RestartSec=5s: a restart would have begun by now
  sleep 6
  log "$vm ($kind) after its poweroff: $(rb_props "$u")"
  [ "$(state "$u")" = inactive ] && [ "$(rb_prop "$u" Result)" = success ] \
    && ! jlog "$u" "$cur2" | grep -q 'Scheduled restart job' && [ "$out" = "$off" ] \
    || { fail "$vm: after the guest's poweroff: $(rb_props "$u"), the run ended with $out (want inactive, success, $off, no restart)"; return 1; }
  if [ "$kind" = firecracker ]; then
    # The helper's line is the proof: it says so only once it has read
    # X_SYSTEMD_SHUTDOWN=poweroff from the guest's notify socket. The
    # guest's own `VMM-NOTIFY sent=poweroff` is printed after its write,
    # and the SIGTERM that answers it may end firecracker before that
    # console line leaves the guest (a fresh-clone run lost it so): logged
    # when there, not required.
    jlog "$u" "$cur2" | grep -q "vmm-notify: the guest's systemd said poweroff: ending the hypervisor (SIGTERM)" \
      || { fail "$vm: the guest's poweroff did not go through vmm-notify: $(jlog "$u" "$cur2" | grep -E 'VMM-NOTIFY|vmm-notify' | tr '\n' ' ')"; return 1; }
    log "$vm: the guest's console after its notify: $(jlog "$u" "$cur2" | grep -v 'vmwarden vmm-notify:' | tr -d '\n' | grep -o 'VMM-NOTIFY sent=poweroff port=8888' || echo 'its VMM-NOTIFY line lost to the SIGTERM')"
    log "$vm: the guest halted before firecracker ended: $(jlog "$u" "$cur2" | grep -c 'reboot: System halted')"
    note "$vm poweroff: the guest told vmm-notify, which ended firecracker (SIGTERM): inactive, success, not restarted"
  else
    note "$vm poweroff: inactive (success, $kind exited 0), not restarted"
  fi
  check_clean "$vm" || return 1
  if hv_has "$vm" net; then
    [ ! -e "/sys/class/net/vmw-${vm}0" ] || { fail "$vm: tap vmw-${vm}0 survives"; return 1; }
  fi
}
s_guest_reboot() {
  local vm vms="rbq rbc rbf rbv" rc=0 bad="" t0
  hv_bridge || return 1
  for vm in $vms; do
    t0=$SECONDS
    if rb_one "$vm"; then
      note "${vm}_s=$((SECONDS - t0))"
    else
      rc=1; bad="$bad $vm: $DETAIL;"
      timeout 300 systemctl stop "microvm@$vm.service"
      systemctl reset-failed "microvm@$vm.service" 2>/dev/null
    fi
  done
  [ $rc -eq 0 ] || DETAIL="failed:$bad"
  return $rc
}

s_all_clean() {
  local out rc p
  out=$("$VMW" verify-clean 2>&1); rc=$?
  printf '%s\n' "$out" >>"$LOG"
  [ $rc -eq 0 ] || { fail "vmwarden verify-clean (all) rc=$rc: $(printf '%s\n' "$out" | grep FAIL | head -3 | tr '\n' ' ')"; return 1; }
  p=$(pgrep -a 'qemu-system|cloud-hyperviso|firecracker' 2>/dev/null)
  [ -z "$p" ] || { fail "hypervisors still running: $p"; return 1; }
  for v in a b c vol vsk vfs un ch fc chb fcb cx ops rbq rbc rbf rbv st own vnq mtr res hbq; do independent_clean $v || return 1; done
  p=$(pgrep -u microvm 2>/dev/null | tr '\n' ' ')
  [ -z "$p" ] || { fail "processes of microvm (the coexist scenario's foreign VM) left: $p"; return 1; }
  note "verify-clean (all VMs) clean, no hypervisor left"
}

# ---------------------------------------------------------------- metrics
# metrics: vmwarden-metrics.service (render-unit --metrics-service, started
# here directly rather than waiting for its timer) writes the textfile
# node-exporter reads; with VM mtr running, its figures come from the
# unit's cgroup: CPU seconds grow, and block bytes grow by what the guest
# writes to its volume after READY; after the stop, the last cleanup's
# verdict and the start are counted.
PROM=/var/lib/prometheus/node-exporter/vmwarden.prom
prom_value() { # SERIES -> its value in $PROM
  awk -v s="$1" 'index($0, s " ") == 1 { print $2; exit }' "$PROM" 2>/dev/null
}
metrics_write() {
  systemctl start vmwarden-metrics.service \
    || { fail "metrics: systemctl start vmwarden-metrics.service failed: $(journalctl -q -u vmwarden-metrics.service -n 3 | tr '\n' ' ')"; return 1; }
  cp "$PROM" "$RES/vmwarden-$1.prom" 2>/dev/null
}
mtr_checks() { # CURSOR
  local cpu0 cpu1 w0 w1 mem st left
  metrics_write running0 || return 1
  st=$(stat -c '%U %a' "$PROM")
  [ "$st" = "root 644" ] || { fail "metrics: $PROM is $st, not root 644"; return 1; }
  left=$(find "${PROM%/*}" -mindepth 1 ! -name vmwarden.prom -printf '%f ')
  [ -z "$left" ] || { fail "metrics: left beside the textfile: $left"; return 1; }
  [ "$(prom_value 'vmwarden_vm_state{vm="mtr",state="running"}')" = 1 ] \
    || { fail "metrics: mtr not running in $PROM: $(grep 'vm="mtr"' "$PROM" | head -5 | tr '\n' ' ')"; return 1; }
  cpu0=$(prom_value 'vmwarden_vm_cpu_seconds_total{vm="mtr"}')
  w0=$(prom_value 'vmwarden_vm_block_written_bytes_total{vm="mtr"}')
  mem=$(prom_value 'vmwarden_vm_memory_bytes{vm="mtr"}')
  [ -n "$cpu0" ] && [ -n "$w0" ] && [ -n "$mem" ] && [ "$mem" -gt 0 ] \
    || { fail "metrics: no CPU, block or memory figures for mtr (cpu=$cpu0 written=$w0 memory=$mem)"; return 1; }
  wait_journal microvm@mtr.service "$1" '^T-WROTE' 120 || { fail "metrics: the guest did not write its volume"; return 1; }
  metrics_write running1 || return 1
  cpu1=$(prom_value 'vmwarden_vm_cpu_seconds_total{vm="mtr"}')
  w1=$(prom_value 'vmwarden_vm_block_written_bytes_total{vm="mtr"}')
  awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { exit !(b > a) }' || { fail "metrics: CPU seconds $cpu0 then $cpu1"; return 1; }
  [ $((w1 - w0)) -ge $((8 * 1024 * 1024)) ] || { fail "metrics: block bytes written $w0 then $w1, not 8 MiB more"; return 1; }
  note "mtr cpu_seconds $cpu0 -> $cpu1, block written $w0 -> $w1, memory $mem"
}
s_metrics() {
  local f out
  for f in /etc/systemd/system/vmwarden-metrics.service /etc/systemd/system/vmwarden-metrics.timer; do
    out=$(systemd-analyze verify "$f" 2>&1)
    [ -z "$out" ] || { fail "metrics: systemd-analyze verify $f: $out"; return 1; }
  done
  start_check_stop mtr mtr_checks || return 1
  metrics_write stopped || return 1
  [ "$(prom_value 'vmwarden_vm_state{vm="mtr",state="stopped"}')" = 1 ] \
    && [ "$(prom_value 'vmwarden_vm_starts_total{vm="mtr"}')" = 1 ] \
    && [ "$(prom_value 'vmwarden_vm_last_cleanup_clean{vm="mtr"}')" = 1 ] \
    && [ "$(prom_value 'vmwarden_vm_last_cleanup_residue{vm="mtr"}')" = 0 ] \
    || { fail "metrics: after the stop: $(grep 'vm="mtr"' "$PROM" | grep -E 'state=.stopped|starts|last_cleanup_(clean|residue)' | tr '\n' ' ')"; return 1; }
  note "after the stop: stopped, starts_total 1, last cleanup clean with no residue"
}

# ---------------------------------------------------------------- resources
# resources: VM res's drop-in (render-unit --dropin from its spec's
# `resources`) puts every limit on its unit's cgroup; then its guest fills
# a tmpfs past MemoryMax=256M and the kernel's OOM killer ends the VM in
# that cgroup; cleanup after it is clean.
s_resources() {
  local cur rc u=microvm@res.service cg got want f end result rep
  cur=$(mark)
  timeout 600 systemctl start $u; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start $u rc=$rc: $(jlog $u "$cur" | tail -4 | tr '\n' ' ')"; return 1; }
  check_running res "$cur" && wait_guest res "$cur" || { systemctl stop $u; return 1; }
  cg=/sys/fs/cgroup$(systemctl show -p ControlGroup --value $u)
  for want in "memory.max 268435456" "cpu.max 150000 100000" "cpu.weight 50" \
              "io.weight default 20" "pids.max 256" "cpuset.cpus 0"; do
    f=${want%% *}
    got=$(head -1 "$cg/$f" 2>/dev/null)
    log "res $f: $got"
    [ "$f $got" = "$want" ] || { fail "res: $cg/$f is '$got', not '${want#* }'"; systemctl stop $u; return 1; }
  done
  note "res cgroup: memory.max 256M, cpu.max 150000 100000, cpu.weight 50, io.weight 20, pids.max 256, cpuset.cpus 0"
  # The guest allocates past MemoryMax: the kernel kills the hypervisor.
  wait_journal $u "$cur" '^T-ALLOCATING' 480 || { fail "res: the guest never started allocating (480 s)"; systemctl stop $u; return 1; }
  end=$((SECONDS + 300))
  until jlog $u "$cur" | grep -qE "Failed with result 'oom-kill'|A process of this unit has been killed by the OOM killer"; do
    [ $SECONDS -lt $end ] || { fail "res: no OOM kill within 300 s: $(jlog $u "$cur" | tail -4 | tr '\n' ' ')"; systemctl stop $u; return 1; }
    sleep 1
  done
  result=$(journalctl -q -k --since "-10min" 2>/dev/null | grep -E "Memory cgroup out of memory|oom-kill:" | tail -2 | tr '\n' ' ')
  log "res: kernel: $result"
  # The unit restarts a failed VM (Restart=on-failure): stop it for good.
  timeout 300 systemctl stop $u || { fail "res: systemctl stop after the OOM kill failed"; return 1; }
  rep=$(for _ in $(seq 1 20); do r=$(cleanup_report $u "$cur" first); [ -n "$r" ] && { echo "$r"; break; }; sleep 0.5; done)
  log "res: the OOM-killed instance's cleanup: $rep"
  [ "$(printf '%s' "$rep" | jq -r '.clean')" = true ] \
    || { fail "res: cleanup after the OOM kill not clean: $(printf '%s' "$rep" | jq -c '{clean, failed, service_result}' | head -c 300)"; return 1; }
  [ "$(printf '%s' "$rep" | jq -r '.service_result.service_result')" = oom-kill ] \
    || note "res: cleanup saw SERVICE_RESULT=$(printf '%s' "$rep" | jq -r '.service_result.service_result')"
  check_cleanup res $u "$cur" last && check_clean res || return 1
  note "res: OOM-killed in its cgroup past MemoryMax; cleanup clean"
}

# ---------------------------------------------------------------- the guests microvm.nix users run
# store_share: VM st, microvm.nix's flake template. The host's /nix/store
# (made by run.sh exactly as Nix makes it: root:nixbld 1775, a file in it)
# over 9p (`ro-store`, read-only) and over virtiofs, and a var.img volume the
# launcher creates. The guest reads the store's file through both and sees
# its owner, group and mode, cannot write either, mounts and writes the
# volume; on L2 the store is as it was, the image the principal's; a
# graceful stop, clean.
s_store_share() {
  local before after
  before=$(stat -c '%u:%g %a' /nix/store)
  [ "$before" = "0:$(getent group nixbld | cut -d: -f3) 1775" ] \
    || { fail "st: precondition: /nix/store is $before, not root:nixbld 1775"; return 1; }
  start_check_stop st store_checks || return 1
  after=$(stat -c '%u:%g %a' /nix/store)
  [ "$after" = "$before" ] && [ ! -e /nix/store/evil ] \
    && [ "$(cat "$STORE_FILE")" = "from the L2 store" ] \
    || { fail "st: the store changed: $after, $(ls -A /nix/store | tr '\n' ' ')"; return 1; }
  note "st store as it was ($after)"
}
store_checks() { # CURSOR
  local u=microvm@st.service j want nixbld img
  nixbld=$(getent group nixbld | cut -d: -f3)
  j=$(jlog $u "$1")
  for want in "T-READ-p9 from the L2 store" "T-READ-vfs from the L2 store" \
              "T-STAT-p9 0 $nixbld 1775" "T-STAT-vfs 0 $nixbld 1775" \
              T-WRITE-p9-REFUSED T-WRITE-vfs-REFUSED T-VAR-EXT4 T-VAR-WROTE 'VMWARDEN-RUN-END rc=0'; do
    printf '%s\n' "$j" | grep -qF -- "$want" \
      || { fail "st: guest output lacks '$want': $(printf '%s\n' "$j" | grep -E '^(T-|VMWARDEN-RUN)' | tr '\n' ' ' | head -c 500)"; return 1; }
  done
  img=$(stat -c '%U:%G %a %s' "$STATE_ROOT/st/var.img" 2>/dev/null)
  [ "$img" = "vm-st:vm-st 600 33554432" ] || { fail "st: var.img is '$img'"; return 1; }
  note "st guest read the store over 9p and virtiofs (0:nixbld 1775), writes refused, var.img created and written"
}
# owned_share: VM own, a writable virtiofs share its guest owns, used as
# journald uses /var/log/journal. The guest's chown, chgrp, chmod and setgid
# directory work, it sees the ids it set; on L2 each file's owner and group
# is the principal (guest 0) or the VM's own range (base + guest id, from
# the registry), nothing is root's, no regular file is set-id; the two
# processes serving it (virtiofsd, vmwarden-broker) are roots of a user
# namespace of their own with capabilities there only; a graceful stop,
# clean, no process with an id of the range.
OWN_RW=/var/lib/vmwarden-test/own-rw
s_owned_share() {
  start_check_stop own owned_checks || return 1
  "$VMW" verify-clean own 2>&1 | grep -q '^no-range-process vm=own check=ok' \
    || { fail "own: verify-clean has no passing no-range-process: $("$VMW" verify-clean own 2>&1 | tr '\n' ' ' | head -c 300)"; return 1; }
  note "own no-range-process=ok"
}
# The capabilities and id map of a process of a share the guest owns
# (virtiofsd: its six; its broker: DAC_READ_SEARCH FOWNER FSETID SYS_PTRACE),
# held in a user namespace whose parent is L2's, with guest 0 the principal.
owned_ns_checks() { # VM PID
  local c want uid map
  c=$(cat "/proc/$2/comm")
  case "$c" in virtiofsd) want=00000000000000db ;; vmwarden-broker) want=000000000008001c ;;
    *) fail "$1: $c $2 is in a user namespace of its own"; return 1 ;; esac
  [ "$(status_field "$2" CapEff)" = $want ] && [ "$(status_field "$2" CapPrm)" = $want ] \
    && [ "$(status_field "$2" CapInh)" = 0000000000000000 ] && [ "$(status_field "$2" CapAmb)" = 0000000000000000 ] \
    || { fail "$1: $c $2 CapEff=$(status_field "$2" CapEff) CapPrm=$(status_field "$2" CapPrm) CapInh=$(status_field "$2" CapInh), not $want"; return 1; }
  uid=$(id -u "vm-$1")
  map=$(awk '{print $1, $2, $3}' "/proc/$2/uid_map" | tr '\n' ';')
  case "$map" in "0 $uid 1;1 "*" 65535;") ;; *) fail "$1: $c $2 uid_map is '$map'"; return 1 ;; esac
  [ "$(readlink "/proc/$2/ns/user")" != "$(readlink /proc/self/ns/user)" ] || { fail "$1: $c $2 in L2's user namespace"; return 1; }
}
owned_checks() { # CURSOR
  local u=microvm@own.service j want pid hs h base uid gid p id bad
  j=$(jlog $u "$1")
  for want in T-SETGID-DIR-OK T-MADE-IN-IT T-OWN-OK T-SGID-FILE-REFUSED T-SUID-FILE-REFUSED T-BEYOND-REFUSED \
              'T-SEE f=1000:190:640 log=0:190:2755 m=190:2755 journal=190' 'VMWARDEN-RUN-END rc=0'; do
    printf '%s\n' "$j" | grep -qF -- "$want" \
      || { fail "own: guest output lacks '$want': $(printf '%s\n' "$j" | grep -E '^(T-|VMWARDEN-RUN)' | tr '\n' ' ' | head -c 500)"; return 1; }
  done
  # The host-wide record of id ranges (one per host, whatever the state root).
  base=$(jq -r --arg root "$STATE_ROOT" 'select(.vm == "own" and .state == "active" and .state_root == $root) | .base' /var/lib/vmwarden/.ranges/range-*.json 2>/dev/null | head -1)
  [ -n "$base" ] || { fail "own: no active id range of $STATE_ROOT in /var/lib/vmwarden/.ranges"; return 1; }
  uid=$(id -u vm-own); gid=$(id -g vm-own)
  [ "$(stat -c '%u:%g %a' "$OWN_RW/f")" = "$((base + 1000)):$((base + 190)) 640" ] \
    && [ "$(stat -c '%u:%g %a' "$OWN_RW/log")" = "$uid:$((base + 190)) 2755" ] \
    && [ "$(stat -c '%g' "$OWN_RW/log/m/system.journal")" = "$((base + 190))" ] \
    || { fail "own: on L2 f=$(stat -c '%u:%g %a' "$OWN_RW/f") log=$(stat -c '%u:%g %a' "$OWN_RW/log") (range base $base)"; return 1; }
  bad=""
  while read -r p id; do
    for x in ${id%:*} ${id#*:}; do
      [ "$x" = "$uid" ] || [ "$x" = "$gid" ] || { [ "$x" -gt "$base" ] && [ "$x" -lt $((base + 65536)) ]; } || bad="$bad $p($id)"
    done
  done < <(find "$OWN_RW" -printf '%p %U:%G\n')
  [ -z "$bad" ] || { fail "own: files of ids not the VM's:$bad"; return 1; }
  [ -z "$(find "$OWN_RW" -type f -perm /6000)" ] || { fail "own: set-id files on L2: $(find "$OWN_RW" -type f -perm /6000)"; return 1; }
  note "own guest ids seen; on L2 principal or range $((base + 1)).. only, setgid dir, no set-id file"
  pid=$(mainpid $u)
  hs=$(vfs_helpers "$pid" vm-own)
  [ "$(printf '%s\n' "$hs" | awk '{print $2}' | sort | tr '\n' ' ')" = "virtiofsd vmwarden-broker " ] \
    || { fail "own: the principal's processes besides QEMU: $(printf '%s' "$hs" | tr '\n' ',')"; return 1; }
  for h in $(printf '%s\n' "$hs" | awk '{print $1}'); do
    owned_ns_checks own "$h" || return 1
    [ "$(status_field "$h" Uid)" = "$uid $uid $uid $uid" ] && [ "$(status_field "$h" NoNewPrivs)" = 1 ] \
      && [ "$(status_field "$h" Seccomp)" = 2 ] && [ "$(status_field "$h" PPid)" = "$pid" ] \
      || { fail "own: $(cat "/proc/$h/comm") $h Uid=$(status_field "$h" Uid) nnp=$(status_field "$h" NoNewPrivs) PPid=$(status_field "$h" PPid)"; return 1; }
  done
  note "own virtiofsd and broker: roots of their own user namespace, caps there only, QEMU's children"
}

# ---------------------------------------------------------------- coexist
# vmwarden's VM cx under vmwarden@cx.service (`render-unit --prefix
# vmwarden`) beside microvm.nix's VM mnix under microvm@mnix.service, a
# template that is not vmwarden's (guest/microvm-nix/: microvm.nix's unit
# and QEMU runner, QEMU as the service user microvm). For the scenario the
# stand-in takes the name microvm@.service, as microvm.nix's host module
# owns it on such a host; vmwarden's own microvm@.service (the other
# scenarios') is put back afterwards. Both start; each runs in a cgroup of
# its own; stopping either leaves the other running, the same process; the
# vmwarden VM's stop, cleanup, verify-clean and reap leave the foreign VM's
# files and processes as they were, and vmwarden's status knows only cx.
MVN=mnix
MVN_U=microvm@mnix.service
MVN_DIR=/var/lib/microvms/mnix
CX_U=vmwarden@cx.service
UNITS=/etc/systemd/system
SAVED=/run/vmwarden-test/saved-units
coexist_install() {
  mkdir -p "$SAVED"
  mv "$UNITS/microvm@.service" "$SAVED/" || { fail "cannot move vmwarden's microvm@.service aside"; return 1; }
  # a template drop-in (VMWARDEN_SYSTEMD_EXTRA_ENV) would apply to microvm.nix's too
  if [ -d "$UNITS/microvm@.service.d" ]; then mv "$UNITS/microvm@.service.d" "$SAVED/"; fi
  install -m 0644 "$T/microvm-nix/microvm@.service" "$UNITS/microvm@.service"
  systemctl daemon-reload
}
coexist_restore() { # FAILED(0|1): after a failure, no waiting for a guest to act on Ctrl-Alt-Del
  [ "${1:-0}" = 0 ] || systemctl kill -s KILL "$MVN_U" 2>/dev/null
  timeout 300 systemctl stop "$MVN_U" "$CX_U"
  systemctl reset-failed "$MVN_U" "$CX_U" 2>/dev/null
  rm -f "$UNITS/microvm@.service"
  mv "$SAVED/microvm@.service" "$UNITS/" || { fail "cannot put vmwarden's microvm@.service back"; return 1; }
  if [ -d "$SAVED/microvm@.service.d" ]; then mv "$SAVED/microvm@.service.d" "$UNITS/"; fi
  systemctl daemon-reload
}
s_coexist() {
  local rc=0
  coexist_install || return 1
  coexist_run || rc=1
  coexist_restore $rc || rc=1
  return $rc
}
# the QMP status of microvm.nix's VM, on its own socket (root may connect)
mvn_qmp() {
  printf '%s\n%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"query-status"}' \
    | timeout 10 nc -U -q 2 "$MVN_DIR/$MVN.sock" 2>/dev/null \
    | jq -r 'select(.return.status? != null) | .return.status' 2>/dev/null | head -1
}
# what vmwarden must leave alone: microvm.nix's files (path, inode, owner,
# mode, size, mtime) and the service user's processes (pid, start time, exe)
mvn_snapshot() {
  local p
  find /var/lib/microvms -printf '%p %i %U:%G %m %s %T@ %y\n' | sort
  for p in $(pgrep -u microvm); do
    echo "proc $p $(awk '{print $22}' "/proc/$p/stat" 2>/dev/null) $(readlink "/proc/$p/exe")"
  done
}
mvn_running() { # CURSOR -> checks microvm@mnix: active, QEMU as microvm, its cgroup, QMP
  local pid cg
  [ "$(state "$MVN_U")" = active ] || { fail "$MVN_U is $(state "$MVN_U")"; return 1; }
  pid=$(mainpid "$MVN_U")
  [ -n "$pid" ] && [ "$pid" != 0 ] || { fail "$MVN_U: no MainPID"; return 1; }
  [ "$(readlink "/proc/$pid/exe")" = /usr/bin/qemu-system-x86_64 ] && [ "$(stat -c %U "/proc/$pid")" = microvm ] \
    || { fail "$MVN_U: MainPID $pid is $(readlink "/proc/$pid/exe") as $(stat -c %U "/proc/$pid"), not QEMU as microvm"; return 1; }
  cg=$(cut -d: -f3 "/proc/$pid/cgroup")
  case "$cg" in */microvm@mnix.service) ;; *) fail "$MVN_U: QEMU's cgroup is $cg"; return 1 ;; esac
  [ "$(mvn_qmp)" = running ] || { fail "$MVN_U: QMP query-status on $MVN_DIR/$MVN.sock says '$(mvn_qmp)'"; return 1; }
}
mvn_wait_ready() { # CURSOR
  wait_journal "$MVN_U" "$1" '^VMWARDEN-GUEST-READY' "$READY_TIMEOUT" \
    || { fail "$MVN_U: its guest printed no VMWARDEN-GUEST-READY within ${READY_TIMEOUT}s: $(jlog "$MVN_U" "$1" | tail -3 | tr '\n' ' ')"; return 1; }
}
mvn_stopped() { # CURSOR -> stopped through its own ExecStop, nothing of it left
  local p
  [ "$(state "$MVN_U")" = inactive ] || { fail "$MVN_U is $(state "$MVN_U") after its stop"; return 1; }
  wait_journal "$MVN_U" "$1" '^VMWARDEN-GUEST-CTRLALTDEL' 10 \
    || { fail "$MVN_U: its guest saw no Ctrl-Alt-Del (microvm-shutdown): $(jlog "$MVN_U" "$1" | tail -3 | tr '\n' ' ')"; return 1; }
  p=$(pgrep -u microvm | tr '\n' ' ')
  [ -z "$p" ] || { fail "$MVN_U: processes of microvm left: $p"; return 1; }
}
coexist_run() {
  local cur cur2 pc pm pm2 cgc cgm out rc before after names rec why
  # the names are apart: vmwarden@cx is vmwarden's, microvm@mnix the stand-in's
  systemctl show -p ExecStart --value "$CX_U" | grep -q vmwarden-launch \
    && systemctl show -p ExecStart --value "$MVN_U" | grep -q "$MVN_DIR/current/bin/microvm-run" \
    || { fail "the templates are not as installed: $CX_U $(systemctl show -p ExecStart --value "$CX_U" | head -c 120); $MVN_U $(systemctl show -p ExecStart --value "$MVN_U" | head -c 120)"; return 1; }
  if systemctl cat "$CX_U" | grep -v '^#' | grep -q 'microvm'; then
    fail "$CX_U names something of microvm's: $(systemctl cat "$CX_U" | grep -v '^#' | grep microvm | head -2 | tr '\n' ' ')"; return 1
  fi
  cur=$(mark)
  timeout 600 systemctl start "$MVN_U" "$CX_U"; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start $MVN_U $CX_U rc=$rc: $(jlog "$MVN_U" "$cur" | tail -3 | tr '\n' ' ') / $(jlog "$CX_U" "$cur" | tail -3 | tr '\n' ' ')"; return 1; }
  mvn_running "$cur" && check_running cx "$cur" || return 1
  pm=$(mainpid "$MVN_U"); pc=$(mainpid "$CX_U")
  cgm=$(cut -d: -f3 "/proc/$pm/cgroup"); cgc=$(cut -d: -f3 "/proc/$pc/cgroup")
  case "$cgc" in */vmwarden@cx.service) ;; *) fail "cx: the hypervisor's cgroup is $cgc"; return 1 ;; esac
  # The intent record names the unit's cgroup (where ExecStartPost's
  # wait-ready runs beside the launcher): liveness asks it, not /proc.
  # It counts as the VM's own only as the unit that started the launch
  # (systemd executed the launcher with the $INVOCATION_ID the cgroup
  # carries as trusted.invocation_id): the launcher's log says which rule.
  rec=$(jq -r '.cgroup.path // "none"' "$RUNTIME_ROOT/cx/instance.json")
  case "$rec" in "/sys/fs/cgroup$cgc") ;; *) fail "cx: the intent record's cgroup is $rec, not the unit's $cgc: $(jlog "$CX_U" "$cur" | grep -o 'cgroup=.*' | head -1)"; return 1 ;; esac
  why=$(jlog "$CX_U" "$cur" | grep 'intent recorded' | grep -o '([^)]*)' | tail -1)
  note "both active: $MVN_U QEMU $pm as microvm in $cgm, QMP running; $CX_U QEMU $pc as vm-cx in $cgc (intent record's cgroup: $rec, $why; InvocationID $(systemctl show -p InvocationID --value "$CX_U"))"
  # vmwarden's status: cx running with the unit's MainPID, mnix unknown to it
  "$VMW" status --json >"$RES/status-coexist.json" 2>>"$LOG" || { fail "vmwarden status --json failed"; return 1; }
  names=$(jq -r '[.[] | select(.state == "running") | "\(.name):\(.pid)"] | join(" ")' "$RES/status-coexist.json")
  [ "$names" = "cx:$pc" ] || { fail "vmwarden status: running VMs '$names', not cx:$pc"; return 1; }
  if jq -e '.[] | select(.name == "mnix")' "$RES/status-coexist.json" >/dev/null; then
    fail "vmwarden status lists microvm.nix's VM mnix"; return 1
  fi
  out=$("$VMW" status mnix 2>&1); rc=$?
  [ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'no VM "mnix"' \
    || { fail "vmwarden status mnix rc=$rc: $out"; return 1; }
  note "vmwarden status: running cx:$pc only, mnix unknown (rc=$rc)"
  mvn_wait_ready "$cur" && wait_guest cx "$cur" || return 1
  # 1. stop microvm.nix's VM: vmwarden's runs on, the same process
  cur=$(mark)
  timeout 300 systemctl stop "$MVN_U" || { fail "systemctl stop $MVN_U failed"; return 1; }
  mvn_stopped "$cur" || return 1
  [ "$(state "$CX_U")" = active ] && [ "$(mainpid "$CX_U")" = "$pc" ] && [ "$(qmp_status cx)" = running ] \
    || { fail "after stopping $MVN_U: $CX_U is $(state "$CX_U") with MainPID $(mainpid "$CX_U") (was $pc), QMP $(qmp_status cx)"; return 1; }
  [ -z "$(cleanup_report "$CX_U" "$cur")" ] || { fail "$CX_U ran its cleanup when $MVN_U stopped"; return 1; }
  note "stop $MVN_U: inactive, guest saw Ctrl-Alt-Del, no microvm process; $CX_U active, same MainPID $pc, QMP running"
  # 2. start it again, then stop vmwarden's: microvm.nix's runs on, untouched
  cur2=$(mark)
  timeout 600 systemctl start "$MVN_U" || { fail "second systemctl start $MVN_U failed"; return 1; }
  mvn_running "$cur2" || return 1
  pm2=$(mainpid "$MVN_U")
  before=$(mvn_snapshot)
  log "microvm.nix's files and processes before vmwarden's stop:"; printf '%s\n' "$before" >>"$LOG"
  cur=$(mark)
  timeout 300 systemctl stop "$CX_U" || { fail "systemctl stop $CX_U failed"; return 1; }
  check_graceful_stop cx "$cur" && check_cleanup cx "$CX_U" "$cur" || return 1
  [ "$(state "$CX_U")" = inactive ] || { fail "$CX_U is $(state "$CX_U") after stop"; return 1; }
  check_clean cx || return 1
  # vmwarden's audit and reap's dry run over the whole host, with microvm.nix's VM running
  out=$("$VMW" verify-clean 2>&1); rc=$?
  printf '%s\n' "$out" >>"$LOG"
  [ $rc -eq 0 ] || { fail "vmwarden verify-clean (all) rc=$rc with $MVN_U running: $(printf '%s\n' "$out" | grep -E 'FAIL|result=' | head -3 | tr '\n' ' ')"; return 1; }
  out=$("$VMW" reap --kill --json 2>&1); rc=$?
  printf '%s\n' "$out" >>"$LOG"
  [ $rc -eq 0 ] || { fail "vmwarden reap --kill --json (dry run) rc=$rc"; return 1; }
  if printf '%s' "$out" | grep -Eq "mnix|microvms|\"$pm2\"|[^0-9]$pm2[^0-9]"; then
    fail "vmwarden reap's dry run would act on microvm.nix's VM: $(printf '%s' "$out" | tr '\n' ' ' | head -c 300)"; return 1
  fi
  after=$(mvn_snapshot)
  [ "$before" = "$after" ] || { fail "microvm.nix's files or processes changed across vmwarden's stop: $(diff <(printf '%s\n' "$before") <(printf '%s\n' "$after") | grep '^[<>]' | head -4 | tr '\n' ' ')"; return 1; }
  mvn_running "$cur2" || return 1
  [ "$(mainpid "$MVN_U")" = "$pm2" ] || { fail "$MVN_U has MainPID $(mainpid "$MVN_U"), not $pm2"; return 1; }
  note "stop $CX_U: graceful, clean report, verify-clean cx and all clean, reap dry run names nothing of mnix; $MVN_U active, same QEMU $pm2, its $(printf '%s\n' "$after" | grep -c .) files/processes unchanged"
  # 3. microvm.nix's VM stops on its own (its guest up, so it sees Ctrl-Alt-Del)
  mvn_wait_ready "$cur2" || return 1
  cur=$(mark)
  timeout 300 systemctl stop "$MVN_U" || { fail "last systemctl stop $MVN_U failed"; return 1; }
  mvn_stopped "$cur" || return 1
  check_clean cx || return 1
  note "$MVN_U stopped; cx still clean"
}

# ---------------------------------------------------------------- user_net
# un: user networking through passt under the real unit and its drop-in
# (IPAddressAllow=any, AF_INET/AF_INET6/AF_NETLINK, the user, UTS and PID
# namespaces passt's sandbox needs). The guest takes 10.0.2.15 from passt by
# DHCP and fetches from a server on L2's loopback through the gateway
# 10.0.2.2; L2 reaches the guest's port 22 on 127.0.0.1:2222. passt runs as
# vm-un, QEMU's child, in the unit's cgroup, with no capability, no_new_privs,
# seccomp, in a user namespace of its own with an empty root; QEMU holds no IP
# socket. A graceful stop leaves no passt; then a SIGKILL of QEMU alone:
# passt is gone on its own and the cleanup is clean. L2 has no interface
# but loopback here: every address used is L2's own.
UN_SERVER_PID=""
s_user_net() {
  local rc
  # the server on L2's loopback the guest reaches through the gateway
  socat TCP-LISTEN:8080,bind=127.0.0.1,reuseaddr,fork SYSTEM:'echo T-L2-LOOPBACK-SAYS-HI' >>"$LOG" 2>&1 &
  UN_SERVER_PID=$!
  start_check_stop un un_checks; rc=$?
  kill "$UN_SERVER_PID" 2>/dev/null; wait "$UN_SERVER_PID" 2>/dev/null
  [ $rc -eq 0 ] || return 1
  pgrep -u vm-un >/dev/null && { fail "un: a process of vm-un survives the stop: $(pgrep -a -u vm-un | tr '\n' ' ')"; return 1; }
  un_kill
}
# the principal's processes other than QEMU: passt
un_passt() { # HYPERVISOR_PID -> "PID COMM" lines
  local p
  for p in $(pgrep -u vm-un); do
    [ "$p" = "$1" ] || echo "$p $(cat "/proc/$p/comm" 2>/dev/null)"
  done
}
un_checks() { # CURSOR
  local u=microvm@un.service pid j hs h c uid cg out ip q
  pid=$(mainpid $u)
  wait_journal $u "$1" '^T-LISTENING' 60 \
    || { fail "un: the guest never listened: $(jlog $u "$1" | grep -E '^(T-|VMWARDEN-RUN)' | tr '\n' ' ' | head -c 400)"; return 1; }
  j=$(jlog $u "$1")
  for want in 'T-DHCP ip=10.0.2.15 mask=24 router=10.0.2.2 dns=10.0.2.3' 'T-FETCH T-L2-LOOPBACK-SAYS-HI'; do
    printf '%s\n' "$j" | grep -qF -- "$want" \
      || { fail "un: guest output lacks '$want': $(printf '%s\n' "$j" | grep -E '^T-' | tr '\n' ' ' | head -c 400)"; return 1; }
  done
  note "un: DHCP 10.0.2.15 from passt, fetched from L2's loopback through 10.0.2.2"
  out=$(timeout 30 nc -N -q 2 127.0.0.1 2222 </dev/null 2>&1 | tr -d '\r')
  [ "$out" = T-GUEST-SERVED ] || { fail "un: L2's 127.0.0.1:2222 gave '$(printf '%s' "$out" | head -c 100)', not the guest's T-GUEST-SERVED"; return 1; }
  note "L2 reached the guest's port 22 on 127.0.0.1:2222"
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q 'stream,id=qemu,server=off,addr.type=fd' \
    || { fail "un: QEMU's command line has no stream netdev on an fd: $(tr '\0' ' ' <"/proc/$pid/cmdline" | grep -o '\-netdev [^ ]*')"; return 1; }
  hs=$(un_passt "$pid")
  log "un helpers (hypervisor $pid): $(printf '%s' "$hs" | tr '\n' ',')"
  [ "$(printf '%s\n' "$hs" | grep -c .)" = 1 ] && printf '%s' "$hs" | awk '{print $2}' | grep -q '^passt' \
    || { fail "un: the principal's processes besides QEMU are '$(printf '%s' "$hs" | tr '\n' ' ')', not one passt"; return 1; }
  h=$(printf '%s' "$hs" | awk '{print $1}'); c=$(cat "/proc/$h/comm")
  uid=$(id -u vm-un); cg=$(cat "/proc/$pid/cgroup")
  [ "$(status_field "$h" Uid)" = "$uid $uid $uid $uid" ] || { fail "un: $c Uid: $(status_field "$h" Uid)"; return 1; }
  for want in CapEff CapPrm CapInh CapAmb; do
    [ "$(status_field "$h" $want)" = 0000000000000000 ] || { fail "un: $c $want=$(status_field "$h" $want)"; return 1; }
  done
  [ "$(status_field "$h" NoNewPrivs)" = 1 ] && [ "$(status_field "$h" Seccomp)" = 2 ] \
    || { fail "un: $c NoNewPrivs=$(status_field "$h" NoNewPrivs) Seccomp=$(status_field "$h" Seccomp)"; return 1; }
  [ "$(status_field "$h" PPid)" = "$pid" ] || { fail "un: $c is not QEMU's child"; return 1; }
  [ "$(cat "/proc/$h/cgroup")" = "$cg" ] || { fail "un: $c is in cgroup $(cat "/proc/$h/cgroup"), not the unit's ($cg)"; return 1; }
  [ "$(readlink "/proc/$h/ns/user")" != "$(readlink /proc/self/ns/user)" ] || { fail "un: $c is in L2's user namespace"; return 1; }
  [ -z "$(ls -A "/proc/$h/root" 2>&1)" ] || { fail "un: $c's root is not empty: $(ls -A "/proc/$h/root" 2>&1 | head -c 100)"; return 1; }
  # QEMU has no IP socket: none of its socket inodes is in the IP tables
  ip=$(awk 'FNR > 1 {print $10}' /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6 /proc/net/raw /proc/net/raw6 2>/dev/null | sort -u)
  q=$(find "/proc/$pid/fd" -lname 'socket:*' -printf '%l\n' 2>/dev/null | sed 's/socket:\[\(.*\)\]/\1/' | sort -u)
  [ -z "$(comm -12 <(printf '%s\n' "$ip") <(printf '%s\n' "$q"))" ] || { fail "un: QEMU holds an IP socket"; return 1; }
  jq -e '[.resources[] | select(.kind == "helper")] == [{"kind":"helper","helper":"passt","tag":"qemu"}]' \
    "$RUNTIME_ROOT/un/instance.json" >/dev/null || { fail "un: the intent record does not name passt: $(jq -c '.resources' "$RUNTIME_ROOT/un/instance.json" | head -c 300)"; return 1; }
  note "passt vm-un CapEff=0 nnp seccomp, own user namespace, empty root, QEMU's child in the unit's cgroup; QEMU no IP socket; passt in the intent record"
}
# SIGKILL to QEMU alone: passt is gone on its own (its death signal, and its
# end of the socket pair closing), and the kill's cleanup is clean.
un_kill() {
  local cur rc u=microvm@un.service pid h left st sub end
  systemctl reset-failed $u 2>/dev/null
  cur=$(mark)
  timeout 600 systemctl start $u; rc=$?
  [ $rc -eq 0 ] || { fail "un second start rc=$rc"; return 1; }
  check_running un "$cur" || { timeout 300 systemctl stop $u; return 1; }
  pid=$(mainpid $u)
  h=$(un_passt "$pid" | awk '{print $1}')
  [ -n "$h" ] || { fail "un: no passt at the second start"; timeout 300 systemctl stop $u; return 1; }
  systemctl kill --kill-who=main -s KILL $u || { fail "systemctl kill --kill-who=main failed"; return 1; }
  for _ in $(seq 1 100); do
    [ "$(stat -c %U "/proc/$h" 2>/dev/null)" = vm-un ] || break
    sleep 0.1
  done
  [ "$(stat -c %U "/proc/$h" 2>/dev/null)" != vm-un ] || { fail "un: passt $h outlived the killed hypervisor by 10 s"; return 1; }
  end=$((SECONDS + 120))
  while :; do
    st=$(state $u); sub=$(systemctl show -p SubState --value $u)
    case "$st/$sub" in failed/*|inactive/*|*/auto-restart) break ;; esac
    [ "$st" = active ] && [ "$(mainpid $u)" != "$pid" ] && break
    [ $SECONDS -lt $end ] || { fail "un: still $st/$sub 120s after SIGKILL"; return 1; }
    sleep 0.2
  done
  check_cleanup un $u "$cur" first || return 1
  timeout 300 systemctl stop $u
  systemctl reset-failed $u 2>/dev/null
  check_clean un || return 1
  note "passt gone with the SIGKILLed QEMU; clean"
}

# ---------------------------------------------------------------- soak
# SOAK_CYCLES start/stop cycles of a and b through systemctl (50 when the
# soak is named in VMWARDEN_SYSTEMD_ONLY; run.sh sets fewer for the default
# run). A cycle: `systemctl start microvm@a microvm@b` (active after
# wait-ready: QMP answers; the guests are not waited for), both running
# (QMP, their principals); in every fifth cycle the hypervisor of b, then
# of a, then b, … is SIGKILLed (from outside systemd: a crash) and
# Restart=on-failure must bring the unit back with a new MainPID whose QMP
# answers, the kill's own cleanup report clean; then `systemctl stop` of
# both: clean reports, verify-clean and the independent checks after every
# stop. The guests are still booting when the stop comes, so the power
# button has no one to act on it: a drop-in for the scenario gives `vmwarden
# stop` --timeout 1 (it then quits QEMU through QMP), instead of 30 s of
# waiting per stop, and machine.slice gets the lowest CPU weight while it
# runs. One summary line: SOAK cycles=… residue=… restarts=…
SOAK_DROPIN=50-soak-stop.conf
soak_setup() {
  local v
  for v in a b; do
    mkdir -p "/run/systemd/system/microvm@$v.service.d"
    printf '[Service]\nExecStop=\nExecStop=/usr/local/bin/vmwarden stop %%i --timeout 1\n' \
      >"/run/systemd/system/microvm@$v.service.d/$SOAK_DROPIN"
  done
  systemctl daemon-reload
  # L2 is one TCG vCPU: two nested guests booting in machine.slice would
  # take most of it from systemd and the checks; the lowest weight leaves
  # them what the rest does not use
  systemctl set-property --runtime machine.slice CPUWeight=1
}
soak_teardown() {
  timeout 300 systemctl stop microvm@a.service microvm@b.service
  rm -f /run/systemd/system/microvm@a.service.d/$SOAK_DROPIN /run/systemd/system/microvm@b.service.d/$SOAK_DROPIN
  systemctl revert machine.slice >/dev/null 2>&1
  systemctl daemon-reload
  systemctl reset-failed microvm@a.service microvm@b.service 2>/dev/null || true
}
# QMP query-status without qmp_status's fixed 2 s wait: nc leaves as soon
# as its input ends, which is given 0.2 s (then 1 s, 3 s) for the answer
qmp_quick() { # VM -> prints the status
  local w out sock=$RUNTIME_ROOT/$1/control/qmp.sock
  for w in 0.2 1 3; do
    out=$( { printf '%s\n%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"query-status"}'; sleep $w; } \
           | timeout 10 nc -U -q 0 "$sock" 2>/dev/null \
           | jq -r 'select(.return.status? != null) | .return.status' 2>/dev/null | head -1)
    [ -n "$out" ] && { echo "$out"; return 0; }
  done
  echo "no-answer"; return 1
}
soak_up() { # VM -> running: QMP, its principal
  local u=microvm@$1.service pid st
  [ "$(state "$u")" = active ] || { fail "$u is $(state "$u")"; return 1; }
  st=$(qmp_quick "$1")
  [ "$st" = running ] || { fail "$1: QMP query-status says '$st'"; return 1; }
  pid=$(mainpid "$u")
  [ "$(stat -c %U "/proc/$pid" 2>/dev/null)" = "vm-$1" ] || { fail "$1: MainPID $pid is not vm-$1's"; return 1; }
}
soak_kill() { # VM -> SIGKILL its hypervisor, wait for Restart=on-failure
  local v=$1 u=microvm@$1.service pid n0 n cur end
  pid=$(mainpid "$u"); n0=$(systemctl show -p NRestarts --value "$u")
  cur=$(mark)
  kill -KILL "$pid" || { fail "kill -KILL $pid ($v's hypervisor) failed"; return 1; }
  end=$((SECONDS + 180))
  while :; do
    n=$(systemctl show -p NRestarts --value "$u")
    [ "$(state "$u")" = active ] && [ "$(mainpid "$u")" != "$pid" ] && [ "$n" -gt "$n0" ] && break
    [ $SECONDS -lt $end ] \
      || { fail "$u is $(state "$u")/$(systemctl show -p SubState --value "$u") (NRestarts $n) 180 s after SIGKILL of $pid, not restarted"; return 1; }
    sleep 0.5
  done
  check_cleanup "$v" "$u" "$cur" first || return 1
  soak_up "$v" || return 1
  SOAK_RESTARTS=$((SOAK_RESTARTS + 1))
}
soak_cycle() { # N
  local c=$1 v cur rc out k=""
  systemctl reset-failed microvm@a.service microvm@b.service 2>/dev/null
  timeout 300 systemctl start microvm@a.service microvm@b.service; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start microvm@a microvm@b rc=$rc: $(jlog microvm@a.service "" | tail -2 | tr '\n' ' ')"; return 1; }
  soak_up a && soak_up b || return 1
  case $((c % 10)) in 5) k=b ;; 0) k=a ;; esac
  if [ -n "$k" ]; then
    SOAK_KILLS=$((SOAK_KILLS + 1))
    soak_kill "$k" || return 1
  fi
  cur=$(mark)
  timeout 300 systemctl stop microvm@a.service microvm@b.service; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl stop microvm@a microvm@b rc=$rc"; return 1; }
  for v in a b; do
    case "$(state microvm@$v.service)" in inactive|failed) ;; *) fail "microvm@$v is $(state microvm@$v.service) after stop"; return 1 ;; esac
    check_cleanup $v microvm@$v.service "$cur" || { SOAK_RESIDUE=$((SOAK_RESIDUE + 1)); return 1; }
  done
  # check_clean for both at once: one verify-clean run audits a and b
  out=$("$VMW" verify-clean a b 2>&1); rc=$?
  log "verify-clean a b rc=$rc"; printf '%s\n' "$out" >>"$LOG"
  if [ $rc -ne 0 ] || [ "$(printf '%s\n' "$out" | grep -c '^result=clean')" != 1 ] || printf '%s\n' "$out" | grep -q 'FAIL'; then
    SOAK_RESIDUE=$((SOAK_RESIDUE + 1))
    fail "vmwarden verify-clean a b rc=$rc: $(printf '%s\n' "$out" | grep -E 'FAIL|result=' | head -3 | tr '\n' ' ')"; return 1
  fi
  for v in a b; do independent_clean $v || { SOAK_RESIDUE=$((SOAK_RESIDUE + 1)); return 1; }; done
}
mean() { awk '{s += $1; n++} END {if (n) printf "%.1f", s / n; else print "-"}'; }
s_soak() {
  local n=${SOAK_CYCLES:-50} c t0 dt times="" rc=0 done=0 sum
  SOAK_RESTARTS=0 SOAK_KILLS=0 SOAK_RESIDUE=0
  soak_setup
  for c in $(seq 1 "$n"); do
    t0=$(date +%s.%N)
    DETAIL=""
    soak_cycle "$c" || { DETAIL="cycle $c: $DETAIL"; rc=1; break; }
    dt=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}')
    times="$times $dt"; done=$c
    log "soak cycle $c clean in $dt s (kills $SOAK_KILLS, restarts $SOAK_RESTARTS)"
  done
  soak_teardown
  sum="SOAK cycles=$done/$n residue=$SOAK_RESIDUE restarts=$SOAK_RESTARTS/$SOAK_KILLS cycle_s_first10_mean=$(printf '%s\n' $times | head -10 | mean) cycle_s_last10_mean=$(printf '%s\n' $times | tail -10 | mean) cycle_s_max=$(printf '%s\n' $times | sort -n | tail -1)"
  say "$sum"
  log "soak cycle times:$times"
  [ $rc -ne 0 ] || DETAIL=""
  note "${sum#SOAK }"
  return $rc
}

# ---------------------------------------------------------------- scenario (smoke)
# Infrastructure self-test without vmwarden: a hand-written unit runs qemu
# (KVM, as vm-a, kvm group, LoadCredential= -> fw_cfg) and stops it via QMP.
s_smoke() {
  local cur rc u=vmwarden-smoke@a.service pid
  cur=$(mark)
  timeout 120 systemctl start $u; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start $u rc=$rc: $(jlog $u "$cur" | tail -3 | tr '\n' ' ')"; return 1; }
  pid=$(mainpid $u)
  note "kvm=$(stat -c '%G:%a' /dev/kvm) uid=$(stat -c %U /proc/$pid)"
  wait_journal $u "$cur" '^VMWARDEN-GUEST-READY' "$READY_TIMEOUT" \
    || { fail "no VMWARDEN-GUEST-READY within ${READY_TIMEOUT}s: $(jlog $u "$cur" | tail -3 | tr '\n' ' ')"; return 1; }
  check_creds a $u "$cur" || return 1
  timeout 120 systemctl stop $u || { fail "stop failed"; return 1; }
  wait_journal $u "$cur" '^VMWARDEN-GUEST-POWERBUTTON' 10 || { fail "no POWERBUTTON"; return 1; }
  note "graceful stop ok"
}

# ---------------------------------------------------------------- the host's own tools
# VM ops (run.sh: the shares guest with a shell on its serial port, console,
# a balloon without deflate-on-OOM, registered with systemd-machined). One
# nested boot serves the three scenarios: console and balloon use the VM the
# first of them started; machined checks the registration and ends with the
# stop, after which the registration must be gone. Each starts the VM when it
# is not running, so any of them runs alone (VMWARDEN_SYSTEMD_ONLY).
OPS_U=microvm@ops.service
OPS_CUR=""
ops_up() {
  [ "$(state $OPS_U)" = active ] && [ -n "$OPS_CUR" ] && return 0
  local rc; OPS_CUR=$(mark)
  timeout 600 systemctl start $OPS_U; rc=$?
  [ $rc -eq 0 ] || { fail "systemctl start $OPS_U rc=$rc: $(jlog $OPS_U "$OPS_CUR" | tail -4 | tr '\n' ' ')"; return 1; }
  check_running ops "$OPS_CUR" && wait_guest ops "$OPS_CUR"
}
# `vmwarden console ops` on a pseudo-terminal (script(1) allocates it), its
# input a FIFO this shell writes to: CON_OUT is what the terminal showed.
CON_DIR=/run/vmwarden-test-console
con_open() { # [VM, default ops]
  rm -rf "$CON_DIR"; mkdir -p "$CON_DIR"; mkfifo "$CON_DIR/in"
  script -q -e -c "$VMW console ${1:-ops}" /dev/null <"$CON_DIR/in" >"$CON_DIR/out" 2>&1 &
  CON_PID=$!
  exec 8>"$CON_DIR/in"
}
con_type() { printf '%s\r' "$1" >&8; }
con_wait() { # TEXT TIMEOUT_S -> 0 when the terminal showed TEXT
  local end=$((SECONDS + $2))
  until grep -qF -- "$1" "$CON_DIR/out" 2>/dev/null; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.5
  done
}
# Enter until the guest's shell answers (a line typed before its reader
# holds the port is the serial line's alone), as on a fresh console.
con_sync() {
  local i
  for i in $(seq 1 20); do
    con_type "echo SYNC-\$((100+$i))"
    con_wait "SYNC-$((100 + i))" 3 && return 0
  done
  return 1
}
con_close() { # detach (Ctrl-]) and wait for the client
  printf '\035' >&8; exec 8>&-
  local end=$((SECONDS + 15))
  while kill -0 "$CON_PID" 2>/dev/null; do
    [ $SECONDS -lt $end ] || { kill "$CON_PID" 2>/dev/null; return 1; }
    sleep 0.3
  done
  wait "$CON_PID"
}
# The guest's MemTotal (kB) through the console.
con_memtotal() { # TAG
  con_type "grep MemTotal /proc/meminfo | sed s/^/$1-/"
  con_wait "$1-MemTotal:" 30 || return 1
  sed -n "s/.*$1-MemTotal: *\([0-9]*\) kB.*/\1/p" "$CON_DIR/out" | tail -1
}

s_console() {
  local rc j
  ops_up || return 1
  con_open
  con_wait "Ctrl-] detaches" 15 || { fail "console: no greeting: $(tr -d '\r' <"$CON_DIR/out" | tail -3 | tr '\n' ' ')"; con_close; return 1; }
  con_sync || { fail "console: the guest's serial shell never answered: $(tr -d '\r' <"$CON_DIR/out" | tail -5 | tr '\n' ' ')"; con_close; return 1; }
  con_type 'echo ANSWER-$((6*7))'
  con_wait ANSWER-42 30 || { fail "console: no ANSWER-42: $(tr -d '\r' <"$CON_DIR/out" | tail -5 | tr '\n' ' ')"; con_close; return 1; }
  con_close; rc=$?
  log "console terminal: $(tr -d '\r' <"$CON_DIR/out" | tr '\n' '|')"
  [ $rc -eq 0 ] || { fail "console: vmwarden console did not end after Ctrl-] (rc=$rc)"; return 1; }
  grep -qF "Detached from the console of ops" "$CON_DIR/out" || { fail "console: no detach message"; return 1; }
  [ "$(state $OPS_U)" = active ] && [ "$(qmp_status ops)" = running ] \
    || { fail "console: ops is $(state $OPS_U), QMP $(qmp_status ops) after the detach"; return 1; }
  j=$(jlog $OPS_U "$OPS_CUR")
  printf '%s\n' "$j" | grep -q 'ANSWER-42' || { fail "console: the guest's answer is not in the unit's journal"; return 1; }
  # The console socket is root's.
  [ "$(stat -c '%U %a' $RUNTIME_ROOT/ops/control/console.sock)" = "root 600" ] \
    || { fail "console: console.sock is $(stat -c '%U %a' $RUNTIME_ROOT/ops/control/console.sock)"; return 1; }
  note "typed into the guest's shell through a pty, ANSWER-42 on the terminal and in the journal, detached, ops still running"
}

s_balloon() {
  local before after b end
  ops_up || return 1
  con_open
  con_wait "Ctrl-] detaches" 15 && con_sync || { fail "balloon: no serial shell: $(tr -d '\r' <"$CON_DIR/out" | tail -3 | tr '\n' ' ')"; con_close; return 1; }
  before=$(con_memtotal MEM0)
  "$VMW" balloon ops 64 >>"$LOG" 2>&1 || { fail "balloon: vmwarden balloon ops 64 failed: $("$VMW" balloon ops 64 2>&1 | tail -1)"; con_close; return 1; }
  end=$((SECONDS + 60))
  while :; do
    b=$("$VMW" status ops --json 2>/dev/null | jq -r '.[0].balloon_mib')
    [ "$b" = 64 ] && break
    [ $SECONDS -lt $end ] || { fail "balloon: status says balloon_mib=$b, not 64, after 60 s"; con_close; return 1; }
    sleep 1
  done
  after=$(con_memtotal MEM1)
  con_close
  log "balloon: MemTotal before=$before after=$after"
  [ -n "$before" ] && [ -n "$after" ] && [ $((before - after)) -eq $((64 * 1024)) ] \
    || { fail "balloon: the guest's MemTotal went $before -> $after kB, not 64 MiB less"; return 1; }
  "$VMW" status ops | grep -q ' 64M' || { fail "balloon: the status table lacks 64M"; return 1; }
  "$VMW" balloon ops 0 >>"$LOG" 2>&1 || { fail "balloon: deflating failed"; return 1; }
  note "target 64 MiB: status balloon_mib=64 (QMP actual), guest MemTotal $before -> $after kB"
}

s_machined() {
  local pid line leader class unit cur rc
  ops_up || return 1
  pid=$(mainpid $OPS_U)
  line=$(machinectl list --no-legend 2>&1 | awk '$1 == "ops"')
  log "machinectl list: $(machinectl list --no-legend 2>&1 | tr '\n' '|')"
  [ -n "$line" ] || { fail "machined: machinectl list has no ops: $(machinectl list --no-legend 2>&1 | tr '\n' ' ')"; return 1; }
  class=$(machinectl show ops -p Class --value 2>&1)
  leader=$(machinectl show ops -p Leader --value 2>&1)
  unit=$(machinectl show ops -p Unit --value 2>&1)
  [ "$class" = vm ] || { fail "machined: class $class, not vm"; return 1; }
  [ "$leader" = "$pid" ] || { fail "machined: leader $leader, not the unit's MainPID $pid"; return 1; }
  [ "$unit" = "$OPS_U" ] || { fail "machined: unit $unit, not $OPS_U"; return 1; }
  machinectl status ops >"$RES/machinectl-status-ops.txt" 2>&1
  grep -q "$OPS_U" "$RES/machinectl-status-ops.txt" && grep -q "Leader: $pid" "$RES/machinectl-status-ops.txt" \
    || { fail "machined: machinectl status lacks the unit or the leader: $(head -c 300 "$RES/machinectl-status-ops.txt" | tr '\n' ' ')"; return 1; }
  # No way in: a VM has no namespace to enter.
  if timeout 20 machinectl shell ops /bin/true >>"$LOG" 2>&1; then fail "machined: machinectl shell into ops succeeded"; return 1; fi
  cur=$(mark)
  timeout 300 systemctl stop $OPS_U; rc=$?
  [ $rc -eq 0 ] || { fail "machined: systemctl stop rc=$rc"; return 1; }
  OPS_CUR=""
  # The serial shell's prompt stays at the start of the console's last
  # line, so the guest's power-button marker is not at a line start.
  check_graceful_stop ops "$cur" '.*VMWARDEN-GUEST-POWERBUTTON' && check_cleanup ops $OPS_U "$cur" && check_clean ops || return 1
  machinectl status ops >/dev/null 2>&1 && { fail "machined: ops still registered after the stop"; return 1; }
  machinectl list --no-legend 2>/dev/null | awk '$1 == "ops"' | grep -q . && { fail "machined: machinectl list still has ops"; return 1; }
  # The launcher's and cleanup's lines carry the VM's name as a field.
  journalctl -q --no-pager VMWARDEN_VM=ops SYSLOG_IDENTIFIER=vmwarden-launch -o cat | grep -q 'registered with systemd-machined' \
    || { fail "machined: no launcher line with VMWARDEN_VM=ops"; return 1; }
  journalctl -q --no-pager VMWARDEN_VM=ops SYSLOG_IDENTIFIER=vmwarden-cleanup -o cat | grep -q '"clean":true' \
    || { fail "machined: no cleanup report with VMWARDEN_VM=ops"; return 1; }
  note "machinectl: class vm, leader = MainPID $pid, unit $OPS_U; machinectl shell refused; gone after the stop; clean; journal VMWARDEN_VM=ops has the launcher's and cleanup's lines"
}

# The guest's bytes cannot speak for the journal or reach a terminal: on
# ops's serial shell (through the console), the guest prints lines starting
# <0> and <1>, and one of escape sequences and BEL. Each is in the unit's
# journal at priority 6 (the unit's SyslogLevel=, SyslogLevelPrefix=no, and
# the launcher's own stream without level prefixes), its <N> kept as text.
# No wall went out: a root login (login -f on a pseudo-terminal of
# script(1), so utmp lists it, which is where journald's ForwardToWall=
# writes) shows none of them, while an emergency logged on L2 afterwards
# (systemd-cat -p emerg, the control) does reach it.
WALL_DIR=/run/vmwarden-test-wall
s_guest_bytes() {
  local cur tty j m p bad=""
  ops_up || return 1
  rm -rf "$WALL_DIR"; mkdir -p "$WALL_DIR"; mkfifo "$WALL_DIR/in"
  script -q -f -c "login -f root" /dev/null <"$WALL_DIR/in" >"$WALL_DIR/out" 2>&1 &
  local login_pid=$!
  exec 7>"$WALL_DIR/in"
  local end=$((SECONDS + 60))
  until tty=$(who | awk '$1 == "root" && $2 ~ /^pts\// {print $2}' | tail -1); [ -n "$tty" ] || [ $SECONDS -ge $end ]; do
    sleep 1
  done
  log "guest_bytes: who: $(who | tr '\n' '|')"
  [ -n "$tty" ] || { fail "guest_bytes: the login on a pty is not in utmp (who: $(who | tr '\n' ' ')): no terminal to watch"; exec 7>&-; kill $login_pid; return 1; }
  con_open
  con_wait "Ctrl-] detaches" 15 && con_sync || { fail "guest_bytes: no serial shell: $(tr -d '\r' <"$CON_DIR/out" | tail -3 | tr '\n' ' ')"; con_close; exec 7>&-; kill $login_pid; return 1; }
  cur=$(mark)
  # %s in the typed line: its echo on the serial port does not hold the marks.
  con_type "M=VMWJ; printf '<0>%s-P0\n<1>%s-P1\n\033[31m\033]0;%s\007%s-ESC\007\033[2J\n' \$M \$M \$M \$M"
  con_wait "VMWJ-ESC" 30 || { fail "guest_bytes: the guest did not print the lines"; con_close; exec 7>&-; kill $login_pid; return 1; }
  con_close
  wait_journal $OPS_U "$cur" 'VMWJ-ESC' 30 || { fail "guest_bytes: the guest's lines are not in the unit's journal"; exec 7>&-; kill $login_pid; return 1; }
  # Each line as journalctl -o json has it (a message with control
  # characters is an array of bytes there): PRIORITY and MESSAGE.
  j=$(journalctl -q --no-pager -u $OPS_U --after-cursor="$cur" -o json \
      | jq -c '{p: .PRIORITY, m: (if (.MESSAGE|type) == "array" then (.MESSAGE|implode) else .MESSAGE end)} | select(.m | test("VMWJ-(P0|P1|ESC)"))')
  log "guest_bytes: journal: $j"
  for m in P0 P1 ESC; do
    p=$(printf '%s\n' "$j" | jq -r "select(.m | test(\"VMWJ-$m\")) | .p" | head -1)
    [ "$p" = 6 ] || bad="$bad VMWJ-$m at priority ${p:-none}"
  done
  printf '%s\n' "$j" | jq -r .m | grep -q '^<0>VMWJ-P0' || bad="$bad <0> not kept as text"
  printf '%s\n' "$j" | jq -r .m | grep -q '^<1>VMWJ-P1' || bad="$bad <1> not kept as text"
  [ -z "$bad" ] || bad="$bad (journal: $(printf '%s' "$j" | tr '\n' ' ' | head -c 400))"
  # The control: an emergency logged on L2 reaches the watched terminal.
  systemd-cat -t vmwj-control -p emerg echo VMWJ-WALL-CONTROL
  local end=$((SECONDS + 20))
  until grep -q VMWJ-WALL-CONTROL "$WALL_DIR/out"; do
    [ $SECONDS -lt $end ] || break
    sleep 0.5
  done
  log "guest_bytes: the watched terminal ($tty): $(tr -d '\r' <"$WALL_DIR/out" | tr '\033\007' '^!' | tr '\n' '|' | tail -c 600)"
  exec 7>&-; kill $login_pid 2>/dev/null; wait $login_pid 2>/dev/null
  grep -q VMWJ-WALL-CONTROL "$WALL_DIR/out" || bad="$bad; the control emergency never reached $tty: a wall would not have been seen"
  if grep -q 'VMWJ-P\|VMWJ-ESC' "$WALL_DIR/out"; then
    bad="$bad; the guest's line reached the terminal $tty by wall: $(tr -d '\r' <"$WALL_DIR/out" | grep -a 'VMWJ-P' | tr -c '[:print:]\n' '?' | tr '\n' ' ' | head -c 200)"
  fi
  [ -z "$bad" ] || { fail "guest_bytes:$bad"; return 1; }
  note "<0>, <1> and an escape/BEL line of the guest at priority 6 with <N> as text; no wall to $tty (utmp), where the control emergency arrived"
}

# ---------------------------------------------------------------- hibernate
# hibernate_qemu: a VM (hbq: a guest that keeps a random marker in memory and prints it
# with its uptime every second) started by its unit, put down to disk with
# `vmwarden hibernate`, its unit then inactive (not failed, not restarted),
# its snapshot the principal's and complete, `status` saying hibernated and
# verify-clean clean; started again by its unit, it is restored: no second
# READY, the same marker, a later uptime, the hypervisor in the full sandbox
# as its principal, the snapshot consumed; then a clean stop.
# host_shutdown_restore: the same for hbq through
# vmwarden-hibernate-on-shutdown.service (render-unit
# --hibernate-on-shutdown): its stop (what a shutdown does) hibernates hbq,
# its start (what the next boot does) starts microvm@hbq over D-Bus, which
# restores it.
hib_tick() { # UNIT CURSOR -> "UP MARKER" of the newest tick after CURSOR
  jlog "$1" "$2" | sed -n 's/^VMWARDEN-TICK up=\([0-9.]*\) marker=\([0-9a-f-]*\).*$/\1 \2/p' | tail -1
}
hib_wait_tick() { # UNIT CURSOR TIMEOUT_S -> "UP MARKER"
  local end=$((SECONDS + $3)) t
  while :; do
    t=$(hib_tick "$1" "$2")
    [ -n "$t" ] && { echo "$t"; return 0; }
    [ $SECONDS -ge $end ] && return 1
    sleep 1
  done
}
hib_down() { # VM CURSOR: after the capture: unit down for good, snapshot complete
  local vm=$1 u=microvm@$1.service snap=$STATE_ROOT/$1/.vmwarden-hibernate rec=$STATE_ROOT/.hibernated-$1.json out
  wait_settled "$u" 120 || { fail "$vm: $u still $(state "$u") 120 s after the capture"; return 1; }
  # RestartSec=5s: a unit that took the capture's end for a crash would be back by now
  sleep 8
  [ "$(state "$u")" = inactive ] \
    || { fail "$vm: $u is $(state "$u") after the hibernation (want inactive: not failed, not restarted): $(jlog "$u" "$2" | tail -4 | tr '\n' ' ')"; return 1; }
  [ -d "$snap" ] && [ ! -e "$snap.new" ] || { fail "$vm: snapshot $snap missing or $snap.new left: $(ls -la "$STATE_ROOT/$vm" | tr '\n' ' ')"; return 1; }
  [ "$(stat -c '%U %a' "$snap")" = "vm-$vm 700" ] || { fail "$vm: $snap is $(stat -c '%U %a' "$snap"), want vm-$vm 700"; return 1; }
  out=$(find "$snap" -mindepth 1 \( ! -user "vm-$vm" -o -perm /077 \) -printf '%p %u %m; ')
  [ -z "$out" ] || { fail "$vm: snapshot files not the principal's 0600: $out"; return 1; }
  [ "$(stat -c '%U %a' "$rec")" = "root 600" ] || { fail "$vm: record $rec is $(stat -c '%U %a' "$rec" 2>&1), want root 600"; return 1; }
  out=$("$VMW" status "$vm" 2>&1)
  printf '%s\n' "$out" | grep -q hibernated || { fail "$vm: vmwarden status does not say hibernated: $(printf '%s' "$out" | tr '\n' ' ' | head -c 300)"; return 1; }
  check_clean "$vm" || return 1
  note "$vm hibernated: $(du -sm "$snap" | cut -f1) MiB, unit inactive"
}
hib_back() { # VM CURSOR "UP MARKER" (before): restored, not booted
  local vm=$1 u=microvm@$1.service before=$3 t up0=${3%% *} m0=${3#* } up1 m1 t0=$SECONDS
  t=$(hib_wait_tick "$u" "$2" 180) || { fail "$vm: no tick within 180 s of the restoring start: $(jlog "$u" "$2" | tail -4 | tr '\n' ' ')"; return 1; }
  up1=${t%% *} m1=${t#* }
  [ "$m1" = "$m0" ] || { fail "$vm: the marker changed ($m0 -> $m1): booted, not restored"; return 1; }
  awk -v a="$up0" -v b="$up1" 'BEGIN { exit !(b >= a) }' || { fail "$vm: uptime went back ($up0 -> $up1)"; return 1; }
  ! jlog "$u" "$2" | grep -q '^VMWARDEN-GUEST-READY' || { fail "$vm: the guest booted again (a second READY)"; return 1; }
  hv_running "$vm" "$2" || return 1
  [ ! -e "$STATE_ROOT/$vm/.vmwarden-hibernate" ] && [ ! -e "$STATE_ROOT/.hibernated-$vm.json" ] \
    || { fail "$vm: the snapshot was not consumed by the restore"; return 1; }
  note "$vm restored: marker kept, uptime $up0 -> $up1, no second boot, snapshot consumed (before: $before); restore_s<=$((SECONDS - t0)) after the start returned"
}
hib_stop() { # VM CURSOR
  local u=microvm@$1.service
  systemctl stop "$u"
  wait_settled "$u" 120 || { fail "$1: $u still $(state "$u") after stop"; return 1; }
  check_cleanup "$1" "$u" "$2" && check_clean "$1"
}
s_hib() { # VM
  local vm=$1 u=microvm@$1.service c1 c2 t out
  [ -f "/etc/vmwarden/vms/$vm.json" ] || { fail "$vm: no spec (hypervisor binaries not installed in this run?)"; return 1; }
  c1=$(mark)
  systemctl start "$u" || { fail "$vm: start failed: $(jlog "$u" "$c1" | tail -4 | tr '\n' ' ')"; return 1; }
  wait_guest "$vm" "$c1" || return 1
  t=$(hib_wait_tick "$u" "$c1" 60) || { fail "$vm: no tick from the guest"; return 1; }
  sleep 2; t=$(hib_tick "$u" "$c1")
  c2=$(mark)
  out=$("$VMW" hibernate "$vm" --timeout 240 2>&1) || { fail "$vm: vmwarden hibernate failed: $(printf '%s' "$out" | tr '\n' ' ' | head -c 400)"; return 1; }
  log "$vm: $out"
  hib_down "$vm" "$c2" || return 1
  c1=$(mark); local ts=$SECONDS
  systemctl start "$u" || { fail "$vm: the restoring start failed: $(jlog "$u" "$c1" | tail -4 | tr '\n' ' ')"; return 1; }
  note "$vm restoring start (to active, after wait-ready) $((SECONDS - ts)) s"
  hib_back "$vm" "$c1" "$t" || return 1
  hib_stop "$vm" "$c1"
}
s_hibernate_qemu() { s_hib hbq; }
s_host_shutdown_restore() {
  local vm=hbq u=microvm@hbq.service h=vmwarden-hibernate-on-shutdown.service c1 c2 t rec=$STATE_ROOT/.hibernated-at-shutdown.json
  systemctl start "$h" || { fail "$h: the boot-time start failed: $(journalctl -q -u "$h" -n 4 | tr '\n' ' ')"; return 1; }
  c1=$(mark)
  systemctl start "$u" || { fail "$vm: start failed"; return 1; }
  wait_guest "$vm" "$c1" || return 1
  t=$(hib_wait_tick "$u" "$c1" 60) || { fail "$vm: no tick from the guest"; return 1; }
  sleep 2; t=$(hib_tick "$u" "$c1")
  # the shutdown: systemd stops the unit, whose ExecStop= hibernates hbq
  c2=$(mark)
  systemctl stop "$h" || { fail "$h: stop (the shutdown's hibernation) failed: $(jlog "$h" "$c2" | tail -4 | tr '\n' ' ')"; return 1; }
  jlog "$h" "$c2" | grep -q "hbq: hibernated" || { fail "$h: no 'hbq: hibernated' in its journal: $(jlog "$h" "$c2" | tail -4 | tr '\n' ' ')"; return 1; }
  [ "$(jq -c .vms "$rec" 2>/dev/null)" = '["hbq"]' ] || { fail "$rec does not name hbq: $(cat "$rec" 2>&1)"; return 1; }
  hib_down "$vm" "$c2" || return 1
  # the next boot: the unit starts, and starts microvm@hbq, which restores
  c1=$(mark)
  systemctl start "$h" || { fail "$h: the boot-time start failed: $(jlog "$h" "$c1" | tail -4 | tr '\n' ' ')"; return 1; }
  local end=$((SECONDS + 180))
  until [ "$(state "$u")" = active ]; do
    [ $SECONDS -lt $end ] || { fail "$vm: $u not started by $h within 180 s ($(state "$u")): $(jlog "$h" "$c1" | tail -3 | tr '\n' ' ')"; return 1; }
    sleep 1
  done
  [ ! -e "$rec" ] || { fail "$rec left after the boot-time start"; return 1; }
  hib_back "$vm" "$c1" "$t" || return 1
  # hbq first: the unit's stop would hibernate it again
  hib_stop "$vm" "$c1" || return 1
  systemctl stop "$h"
}

# ---------------------------------------------------------------- fifty_units
# fifty_units (a measurement only, run when named: not in run.sh's
# SHARD_LISTS): FIFTY_N VMs (v01..v50, default 50) through the real template,
# each a QEMU that does no guest work (the busybox guest's machine built,
# `-S` from the spec's extra_args: the guest never runs; the launcher treats
# it like any QEMU, wait-ready asks QMP, as tests/bench/scale.sh's VMs),
# started with ONE `systemctl start microvm@v01 ... microvm@v50`, timed to
# its return (every unit active: ExecStartPost wait-ready passed). The
# floor: the same QEMU argvs (round 0's, the QMP socket a path of its own)
# as hv_bench's floor units (floor_unit: the template's hardening, nothing
# of vmwarden's), started with one `systemctl start` too, timed until every
# QMP answers query-status (one poller for all, tests/bench/qmp-ready.py's
# rule, in perl: L2 has no python). FIFTY_ROUNDS rounds (default 5),
# interleaved unit, floor; medians. Every VM is SIGKILLed and stopped
# (ExecStopPost's cleanup) between rounds; verify-clean for each after the
# last. The lock table, from scale.sh's source: round 0 (untimed) launches
# v01 under `strace -f` (root, no unit: the launch's own code path) while
# v02..v50 start through their units, each flock with its file and how long
# it was held; and /proc/locks once all are up, the flocks each launch holds.
# The scenario makes the principals, specs and drop-ins and removes them.
FIFTY_N=${FIFTY_N:-50} FIFTY_ROUNDS=${FIFTY_ROUNDS:-5}
FIFTY_DIR=/run/vmwarden-fifty
# qmp-ready (perl): every socket named answers query-status; exits 1 after LIMIT s
fifty_poller() {
  cat >"$FIFTY_DIR/qmp-ready.pl" <<'PL'
use strict; use warnings; use Socket; use IO::Socket::UNIX;
my ($limit, @pending) = @ARGV; my $end = time + $limit;  # each PID:SOCKET
sub answers {
  my ($pid, $path) = split /:/, $_[0], 2;
  $pid > 0 && kill(0, $pid) or do { print "DIED pid=$pid $path\n"; exit 2 };
  my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM, Peer => $path) or return 0;
  my $ok = eval {
    local $SIG{ALRM} = sub { die "timeout\n" }; alarm 2;
    my $g = <$s>; die "no greeting\n" unless defined $g && $g =~ /"QMP"/;
    for my $c ("qmp_capabilities", "query-status") {
      print $s "{\"execute\":\"$c\"}\n";
      while (1) { my $l = <$s>; die "eof\n" unless defined $l; last if $l =~ /"return"/; die "error\n" if $l =~ /"error"/ }
    }
    alarm 0; 1 };
  alarm 0; close $s; return $ok ? 1 : 0;
}
while (@pending) {
  if (time > $end) { print "NOT-READY n=" . scalar(@pending) . " first=$pending[0]\n"; exit 1 }
  @pending = grep { !answers($_) } @pending;
  select(undef, undef, undef, 0.01) if @pending;
}
print "READY\n";
PL
}
fifty_names() { local i; for i in $(seq 1 "$FIFTY_N"); do printf 'v%02d\n' "$i"; done; }
fifty_units() { local v; for v in $(fifty_names); do printf 'microvm@%s.service\n' "$v"; done; }
fifty_floors() { local v; for v in $(fifty_names); do printf 'vmwarden-bench-floor-%s.service\n' "$v"; done; }
fifty_setup() {
  local v
  mkdir -p "$FIFTY_DIR"; FIFTY_MADE=""
  for v in $(fifty_names); do
    if ! id "vm-$v" >/dev/null 2>&1; then
      useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "vm-$v" \
        || { fail "fifty: useradd vm-$v failed"; return 1; }
      FIFTY_MADE="$FIFTY_MADE $v"
    fi
    [ ! -e "/etc/vmwarden/vms/$v.json" ] || { fail "fifty: /etc/vmwarden/vms/$v.json exists already: not the scenario's"; return 1; }
    jq -n --arg n "$v" --arg a "$L3_ACCEL" '{ version: 1, name: $n,
        principal: { user: ("vm-" + $n), group: ("vm-" + $n) },
        hypervisor: { kind: "qemu", binary: "/usr/bin/qemu-system-x86_64", accel: $a, machine: "microvm", extra_args: [ "-S" ] },
        vcpus: 1, memory_mib: 64,
        kernel: "/opt/vmwarden-test/assets/vmlinuz", initrd: "/opt/vmwarden-test/assets/initramfs.img",
        cmdline: "console=ttyS0 quiet panic=-1",
        credentials: [], disks: [], interfaces: [],
        landlock: { mode: "required", read: [], write: [] } }' >"/etc/vmwarden/vms/$v.json" \
      || { fail "fifty: cannot write the spec of $v"; return 1; }
    mkdir -p "/etc/systemd/system/microvm@$v.service.d"
    "$VMW" render-unit --dropin "$v" --spec "/etc/vmwarden/vms/$v.json" --credentials-dir /etc/vmwarden/credentials \
      >"/etc/systemd/system/microvm@$v.service.d/vmwarden.conf" 2>>"$LOG" \
      || { fail "fifty: render-unit --dropin $v failed"; return 1; }
  done
  systemctl daemon-reload
}
fifty_teardown() { # leaves nothing of the scenario's (best effort: every step runs)
  local v
  local keep=$DETAIL
  fifty_down units; fifty_down floors
  DETAIL=$keep
  for v in $(fifty_names); do
    rm -rf "/etc/systemd/system/microvm@$v.service.d" "/run/systemd/system/vmwarden-bench-floor-$v.service" "/run/vmwarden-bench/$v"
    rm -f "/etc/vmwarden/vms/$v.json"
  done
  for v in $FIFTY_MADE; do userdel "vm-$v" 2>>"$LOG"; groupdel "vm-$v" 2>/dev/null; done
  systemctl daemon-reload
}
# one property of each unit, a line each in order (systemctl show separates
# units by an empty line). A query that fails (in L2 `systemctl show` of the
# 50 timed out while systemd stopped them) is tried again; after 3 it prints
# "?" for every unit and fails, so a caller counting stopped or active units
# never reads a failed query as all of them (it had ended a wait for the
# stops early)
fifty_show() { # PROPERTY UNIT...
  local p=$1 out try; shift
  for try in 1 2 3; do
    out=$(systemctl show -p "$p" "$@" 2>>"$LOG" | sed -n "s/^$p=//p")
    [ "$(printf '%s' "$out" | grep -c '')" = $# ] && { printf '%s\n' "$out"; return 0; }
    sleep 1
  done
  log "fifty: systemctl show -p $p of $# units failed 3 times"
  printf '?\n%.0s' "$@"; return 1
}
fifty_down() { # KIND(units|floors): SIGKILL every hypervisor, at once a stop job for every unit (it forbids the restart the SIGKILL would bring; a guest that never runs answers no power button), wait (cleanup runs), reset-failed
  local -a us; mapfile -t us < <("fifty_$1")
  local t0=$SECONDS up
  systemctl kill -s KILL --kill-who=main "${us[@]}" 2>/dev/null
  systemctl stop --no-block "${us[@]}" 2>/dev/null
  while :; do
    up=$(fifty_show ActiveState "${us[@]}" | grep -cvE '^(inactive|failed)$')
    [ "$up" = 0 ] && break
    [ $((SECONDS - t0)) -lt 900 ] || { fail "fifty: $up of the $1 not stopped 900 s after the SIGKILL and stop"; return 1; }
    sleep 2
  done
  systemctl reset-failed "${us[@]}" 2>/dev/null
  log "fifty: the $1 down in $((SECONDS - t0)) s"
}
ms_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", (b - a) * 1000 }'; }
fifty_time_units() { # -> FIFTY_MS: one `systemctl start` of every unit, to its return (all active)
  local -a us; mapfile -t us < <(fifty_units)
  local t0 bad
  systemctl reset-failed "${us[@]}" 2>/dev/null
  t0=$EPOCHREALTIME
  timeout 900 systemctl start "${us[@]}" 2>>"$LOG" || { fifty_crashed "$t0" "${us[@]}"; return; }
  FIFTY_MS=$(ms_since "$t0")
  bad=$(fifty_show ActiveState "${us[@]}" | grep -cvx active)
  [ "$bad" = 0 ] || { fail "fifty: $bad units not active after the start"; return 1; }
}
# a start that failed: 2 when every unit that failed did so because its
# hypervisor died of a signal (QEMU 7.2's monitor thread segfaults now and
# then in L2; the round is done again and the crash counted), else 1
fifty_crashed() { # SINCE(EPOCHREALTIME) UNIT...
  local since=$1 u r bad="" crashed=""; shift
  for u in "$@"; do
    [ "$(state "$u")" = active ] && continue
    r=$(systemctl show -p Result --value "$u")
    if [ "$r" = signal ] || journalctl -q --no-pager -o cat -u "$u" -S "@${since%.*}" | grep -q 'Main process exited, code=killed, status=11/SEGV'; then
      crashed="$crashed $u"
    else bad="$bad $u=$(state "$u")/$r"; fi
  done
  log "fifty: a start failed; hypervisor crashes:${crashed:- none}; other failures:${bad:- none}; $(journalctl -q -k --no-pager -S "@${since%.*}" | grep -E 'segfault|traps:' | head -3 | tr '\n' ' ')"
  [ -z "$bad" ] && [ -n "$crashed" ] && { FIFTY_CRASHES=$((FIFTY_CRASHES + $(wc -w <<<"$crashed"))); return 2; }
  fail "fifty: systemctl start of $FIFTY_N units failed:${bad}${crashed:+ (and crashed:$crashed)}"; return 1
}
fifty_time_floors() { # -> FIFTY_MS: one `systemctl start` of every floor unit (Type=exec: to the last exec), then until every QMP answers
  local -a us socks pids; mapfile -t us < <(fifty_floors)
  local t0 v
  for v in $(fifty_names); do rm -f "/run/vmwarden-bench/$v/qmp.sock"; socks+=("/run/vmwarden-bench/$v/qmp.sock"); done
  systemctl reset-failed "${us[@]}" 2>/dev/null
  t0=$EPOCHREALTIME
  timeout 900 systemctl start "${us[@]}" 2>>"$LOG" || { fifty_crashed "$t0" "${us[@]}"; return; }
  mapfile -t pids < <(fifty_show MainPID "${us[@]}")
  case " ${pids[*]} " in *" ? "*) fail "fifty: the floors' MainPIDs unreadable (systemctl show failed)"; return 1 ;; esac
  local i; for i in "${!socks[@]}"; do socks[i]="${pids[i]}:${socks[i]}"; done
  perl "$FIFTY_DIR/qmp-ready.pl" 600 "${socks[@]}" >"$FIFTY_DIR/poll.out" 2>&1
  case $? in
    0) ;;
    2) log "fifty: a floor QEMU died: $(cat "$FIFTY_DIR/poll.out"); $(journalctl -q -k --no-pager -S "@${t0%.*}" | grep -E 'segfault|traps:' | head -3 | tr '\n' ' ')"
       FIFTY_CRASHES=$((FIFTY_CRASHES + 1)); return 2 ;;
    *) fail "fifty: the floor's QMPs: $(cat "$FIFTY_DIR/poll.out") $(journalctl -q -n 3 -u "${us[0]}" | tr '\n' ' ')"; return 1 ;;
  esac
  FIFTY_MS=$(ms_since "$t0")
}
# scale.sh's lock table (tests/bench/lock-table.awk, put here by run.sh):
# strace -f -ttt of one launch -> each flock, its file, held how long
fifty_lock_table() { # STRACE_OUT
  awk -f /opt/vmwarden-test/lock-table.awk "$1"
}
# round 0 (untimed): v01 under strace (root, no unit) while the others start
# through their units; the QEMU argvs for the floor; memory with all up;
# /proc/locks. Leaves everything stopped.
fifty_round0() {
  local -a us; mapfile -t us < <(fifty_units | tail -n +2)
  local v pid qp sp rep inode held other avail0 avail1 pss=0 k p
  [ -x "$T/bin/strace" ] || { fail "fifty: $T/bin/strace missing (run.sh puts the host's strace in L2 when fifty_units is named)"; return 1; }
  avail0=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
  "$T/bin/strace" -f -ttt -e trace=flock,openat,close,fcntl -o "$FIFTY_DIR/locks.strace" \
    /usr/local/bin/vmwarden-launch v01 >"$FIFTY_DIR/v01.alone" 2>&1 &
  sp=$!
  local try t0
  for try in 1 2 3; do
    t0=$EPOCHREALTIME
    timeout 900 systemctl start "${us[@]}" 2>>"$LOG" && break
    fifty_crashed "$t0" "${us[@]}"; [ $? = 2 ] && [ "$try" != 3 ] || return 1
    systemctl reset-failed "${us[@]}" 2>/dev/null
  done
  "$VMW" wait-ready v01 --timeout 300 >>"$LOG" 2>&1 || { fail "fifty: round 0: v01 (under strace) not ready: $(tail -3 "$FIFTY_DIR/v01.alone" | tr '\n' ' ')"; return 1; }
  avail1=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
  FIFTY_ARGV_DIR=$FIFTY_DIR/argv; mkdir -p "$FIFTY_ARGV_DIR"
  : >"$FIFTY_DIR/leases"
  cp /proc/locks "$FIFTY_DIR/proc-locks"
  FIFTY_LEASES=0
  for v in $(fifty_names); do
    qp=$(pgrep -u "vm-$v" | tr '\n' ' '); qp=${qp% }
    case "$qp" in ""|*" "*) fail "fifty: round 0: vm-$v runs '$qp', not one QEMU"; return 1 ;; esac
    [ "$v" = v01 ] && pid=$qp
    k=$(awk '/^Pss:/ { print $2 }' "/proc/$qp/smaps_rollup" 2>/dev/null); pss=$((pss + ${k:-0}))
    tr '\0' '\n' <"/proc/$qp/cmdline" >"$FIFTY_ARGV_DIR/$v"
    inode=$(stat -c %i "$RUNTIME_ROOT/$v/instance.lock")
    # the flocks on this VM's lease (ours: FLOCK, its inode), by holder
    held=$(awk -v i=":$inode" '$2 == "FLOCK" && substr($6, length($6) - length(i) + 1) == i { print $4 " pid " $5 }' "$FIFTY_DIR/proc-locks")
    echo "$v: $RUNTIME_ROOT/$v/instance.lock: ${held:-none} (its QEMU: pid $qp, $(cat "/proc/$qp/comm"), uid $(stat -c %u "/proc/$qp"))" >>"$FIFTY_DIR/leases"
    [ "$held" = "WRITE pid $qp" ] && FIFTY_LEASES=$((FIFTY_LEASES + 1))
  done
  # any other flock a VM's process holds
  other=$(for v in $(fifty_names); do for p in $(pgrep -u "vm-$v"); do
      awk -v p="$p" '$2 == "FLOCK" && $5 == p' "$FIFTY_DIR/proc-locks" | wc -l | awk -v v="$v" '$1 != 1 { print v ": " $1 " flocks" }'
    done; done | tr '\n' ' ')
  log "fifty round 0: leases with all $FIFTY_N up:"; cat "$FIFTY_DIR/leases" >>"$LOG"
  log "fifty round 0: /proc/locks:"; cat "$FIFTY_DIR/proc-locks" >>"$LOG"
  FIFTY_MEM="MemAvailable ${avail0} MiB before, ${avail1} MiB with all $FIFTY_N up (the QEMUs' PSS $((pss / 1024)) MiB)"
  FIFTY_OTHER=${other:-none}
  # down: v01 (its QEMU under strace) killed and cleaned as ExecStopPost would; the units stopped
  kill -9 "$pid" 2>/dev/null; wait "$sp" 2>/dev/null
  rep=$(/usr/local/bin/vmwarden-cleanup v01 2>>"$LOG")
  printf '%s' "$rep" | jq -e '.clean == true' >/dev/null 2>&1 || { fail "fifty: cleanup of v01 (under strace) not clean: $(printf '%s' "$rep" | head -c 300)"; return 1; }
  fifty_lock_table "$FIFTY_DIR/locks.strace" >"$FIFTY_DIR/lock-table"
  log "fifty: locks v01's launch took (strace -f, among the units starting):"; cat "$FIFTY_DIR/lock-table" >>"$LOG"
  [ -s "$FIFTY_DIR/lock-table" ] || { fail "fifty: no flock in v01's strace: $(grep -c . "$FIFTY_DIR/locks.strace") lines"; return 1; }
  fifty_down units
}
fifty_floor_units() { # the floor units from round 0's argvs (hv_bench's floor_unit), all written, then one daemon-reload
  local v t0=$SECONDS; local -a argv
  for v in $(fifty_names); do
    mkdir -p "/run/vmwarden-bench/$v"
    mapfile -t argv < <(sed -e "s|id=vmwarden-qmp,fd=[0-9]*|id=vmwarden-qmp,path=/run/vmwarden-bench/$v/qmp.sock|" \
                           -e "s|$RUNTIME_ROOT/$v/control|/run/vmwarden-bench/$v|g" "$FIFTY_ARGV_DIR/$v")
    argv[0]=/usr/bin/qemu-system-x86_64
    grep -q "path=/run/vmwarden-bench/$v/qmp.sock" < <(printf '%s\n' "${argv[@]}") \
      || { fail "fifty: $v: no QMP chardev to rewrite in its argv: ${argv[*]}"; return 1; }
    floor_unit_file "$v" "${argv[@]}" >/dev/null || { fail "fifty: cannot write the floor unit of $v"; return 1; }
  done
  systemctl daemon-reload
  log "fifty: the $FIFTY_N floor units written, one daemon-reload, in $((SECONDS - t0)) s"
}
fifty_measure() { # units|floors -> FIFTY_MS; a round a hypervisor crashed in is done again (up to 3 times)
  local try rc
  for try in 1 2 3; do
    "fifty_time_$1"; rc=$?
    fifty_down "$1" || return 1
    [ $rc = 2 ] || return $rc
  done
  fail "fifty: a hypervisor crashed in 3 tries of the $1' round"; return 1
}
s_fifty_units() {
  local r U="" F="" R="" mu mf v bad="" lt n_note=""
  [ "$FIFTY_N" = 50 ] || n_note=" (FIFTY_N=$FIFTY_N, not 50)"
  FIFTY_CRASHES=0
  fifty_setup || { fifty_teardown; return 1; }
  fifty_poller
  fifty_round0 || { fifty_teardown; return 1; }
  fifty_floor_units || { fifty_teardown; return 1; }
  for r in $(seq 1 "$FIFTY_ROUNDS"); do
    fifty_measure units || { fifty_teardown; return 1; }
    U="$U $FIFTY_MS"
    fifty_measure floors || { fifty_teardown; return 1; }
    F="$F $FIFTY_MS"
    R="$R $(ratio "${U##* }" "${F##* }")"
    log "fifty round $r: units ${U##* } ms, floor ${F##* } ms, / floor ${R##* }"
    echo "fifty_units round $r/$FIFTY_ROUNDS: units ${U##* } ms, floor ${F##* } ms, / floor ${R##* }" >/dev/console 2>/dev/null
  done
  log "fifty rounds ms: units [$U ] floor [$F ] / floor [$R ]"
  for v in $(fifty_names); do check_clean "$v" >/dev/null || bad="$bad $v"; done
  DETAIL=""
  [ -z "$bad" ] || { fail "fifty: verify-clean not clean for:$bad"; fifty_teardown; return 1; }
  mu=$(printf '%s\n' $U | median); mf=$(printf '%s\n' $F | median)
  lt=$(awk '{ f = $1; sub(/^\/run\/vmwarden\/v01\//, "<v01 runtime>/", f); $1 = f; print }' "$FIFTY_DIR/lock-table" | tr '\n' ';' | sed 's/;$//')
  fifty_teardown
  local out; out=$("$VMW" verify-clean 2>&1) || { fail "fifty: vmwarden verify-clean (all) after the teardown: $(printf '%s\n' "$out" | grep FAIL | head -3 | tr '\n' ' ')"; return 1; }
  note "$FIFTY_N units at once$n_note, all active $(awk -v m="$mu" 'BEGIN { printf "%.2f", m / 1000 }') s, floor $(awk -v m="$mf" 'BEGIN { printf "%.2f", m / 1000 }') s, / floor $(ratio "$mu" "$mf") (medians of $FIFTY_ROUNDS rounds; units ms:$U; floor ms:$F; per round / floor:$R, median $(printf '%s\n' $R | median); rounds done again after a hypervisor crashed: $FIFTY_CRASHES)"
  note "locks: v01's launch among the others (strace -f, scale.sh's table): $lt; with all $FIFTY_N up (/proc/locks) $FIFTY_LEASES of $FIFTY_N VMs' QEMUs each hold exactly their own lease (RUNTIME/NAME/instance.lock, exclusive, the VM's life); a VM's process holding any other flock: $FIFTY_OTHER"
  note "$FIFTY_MEM; verify-clean clean for all $FIFTY_N after the last round; principals, specs, drop-ins and floor units removed, verify-clean (all) clean"
}

# ---------------------------------------------------------------- main
log "lsm=$lsm kvm=$(ls -l /dev/kvm 2>&1)"
if [ "$MODE" = smoke ]; then
  run_scenario smoke s_smoke
else
  run_scenario unit_verify s_unit_verify
  run_scenario start_ab s_start_ab
  run_scenario stop_a s_stop_a
  run_scenario kill_b s_kill_b
  run_scenario restart_b s_restart_b
  run_scenario target_stop s_target_stop
  run_scenario broken_spec s_broken_spec
  run_scenario share_volume s_share_volume
  run_scenario share_created s_share_created
  run_scenario vhost_vsock s_vhost_vsock
  run_scenario vsock_ssh s_vsock_ssh
  run_scenario vhost_net s_vhost_net
  run_scenario macvtap s_macvtap
  run_scenario virtiofs_vsock s_virtiofs_vsock
  run_scenario user_net s_user_net
  run_scenario store_share s_store_share
  run_scenario owned_share s_owned_share
  run_scenario cloud_hypervisor s_cloud_hypervisor
  run_scenario firecracker s_firecracker
  run_scenario hibernate_cloud_hypervisor s_hibernate_cloud_hypervisor
  run_scenario hibernate_firecracker s_hibernate_firecracker
  run_scenario hv_bench s_hv_bench
  run_scenario console s_console
  run_scenario balloon s_balloon
  run_scenario guest_bytes s_guest_bytes
  run_scenario machined s_machined
  run_scenario guest_reboot s_guest_reboot
  run_scenario resources s_resources
  run_scenario coexist s_coexist
  run_scenario metrics s_metrics
  run_scenario soak s_soak
  run_scenario pci_passthrough s_pci_passthrough
  run_scenario usb_passthrough s_usb_passthrough
  run_scenario hibernate_qemu s_hibernate_qemu
  run_scenario host_shutdown_restore s_host_shutdown_restore
  run_scenario all_clean s_all_clean
  # a measurement only, when named (not in SHARD_LISTS: CI does not run it)
  run_scenario fifty_units s_fifty_units
fi
echo "(done)" >"$CURRENT"; kill "$HEARTBEAT_PID" 2>/dev/null
say "SCENARIOS passed=$PASS failed=$FAIL"

journalctl -b --no-pager -o short-monotonic >"$RES/journal.txt" 2>&1
sync
umount "$RES" 2>/dev/null
if [ "$POWEROFF" = 1 ]; then systemctl poweroff --no-block; fi
exit 0
