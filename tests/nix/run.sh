#!/usr/bin/env bash
# The Nix CI stage: everything about the NixOS module, the flake and the
# nixosTests that can be checked on a machine without a NixOS builder.
#
#   tests/nix/run.sh
#
# Installs what it needs: nix-bin (Nix 2.8: parse + eval), python3-pyflakes
# (apt), deadnix and alejandra (cargo install, cached in $VMWARDEN_NIX_TOOLS,
# default ~/.cache/vmwarden/nix-tools). Then:
#   * every .nix file parses (nix-instantiate --parse);
#   * alejandra --check . and deadnix --fail . pass;
#   * every nixosTest testScript in checks/nixos parses, passes pyflakes, and
#     uses only real Machine methods and declared node names;
#   * the units `vmwarden render-unit` prints pass `systemd-analyze verify`
#     with no output; their `systemd-analyze security` exposure is recorded
#     (and must stay <= MAX_EXPOSURE);
#   * with NIXPKGS_LIB=<nixpkgs lib> (see tests/nix/README.md): the
#     module-evaluation tests: cases/*.nix succeed or fail with the expected
#     message, the specs carry exactly the contract's fields and pass the
#     launcher's validation, the rendered units pass systemd-analyze verify
#     with no output; the units both read from units/*.toml render the same
#     key by key, and one key edited in a copy of that data changes both
#     renderings; the per-VM drop-in (code on both sides) matches
#     `vmwarden render-unit --dropin`; keys can be overridden with mkForce and
#     systemd.globalEnvironment does not reach vmwarden's units.
#     Without NIXPKGS_LIB they are not run, and one line says so.
# Ends with "nix: N passed, M failed"; exits 1 if anything failed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(git -C "$here" rev-parse --show-toplevel)
cd "$top" || exit 1

MAX_EXPOSURE=${MAX_EXPOSURE:-3.5}

# The test inputs CI has beside the clone (../shared, read-only): nixpkgs
# `lib` at the release flake.lock pins and microvm.nix at its pinned
# revision. An explicit NIXPKGS_LIB / MICROVM_NIX_SRC wins. In CI (CI=true)
# a missing copy is a failure; elsewhere one NOT RUN line says what did not
# run (and .ci/run fails on any NOT RUN line).
shared=$(cd "$top/.." && pwd)/shared
for var in NIXPKGS_LIB:nix-eval/nixpkgs-lib/lib MICROVM_NIX_SRC:reference/microvm.nix; do
  name=${var%%:*}
  rel=${var#*:}
  if [ -z "${!name:-}" ] && [ -d "$shared/$rel" ]; then
    export "$name=$shared/$rel"
  fi
  if [ "${CI:-}" = true ] && [ -z "${!name:-}" ]; then
    echo "FAIL $name is not set and $shared/$rel does not exist (CI must evaluate the module and compare with microvm.nix)" >&2
    missing_ci_input=1
  fi
done
echo "NIXPKGS_LIB=${NIXPKGS_LIB:-unset} MICROVM_NIX_SRC=${MICROVM_NIX_SRC:-unset}"
TOOLS=${VMWARDEN_NIX_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/vmwarden/nix-tools}
work=$(mktemp -d /tmp/vmwarden-nix.XXXXXX)
trap 'rm -rf "$work"' EXIT

pass=0
fail=0
[ -z "${missing_ci_input:-}" ] || fail=1
ok() {
  pass=$((pass + 1))
  echo "ok   $*"
}
bad() {
  fail=$((fail + 1))
  echo "FAIL $*"
}
# Each section's passed/failed count, printed at the end, so a log shows
# that the module evaluation and the microvm.nix comparison ran.
sections=()
section=""
section_pass=0
section_fail=0
close_section() {
  [ -n "$section" ] && sections+=("$section: $((pass - section_pass)) passed, $((fail - section_fail)) failed")
  return 0
}
step() {
  close_section
  section=$*
  section_pass=$pass
  section_fail=$fail
  echo "== $*"
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# ------------------------------------------------------------ tools
apt_install() { # apt_install PACKAGE: install; `apt-get update` only if that fails
  local t
  t=$(now)
  if ! apt-get -o DPkg::Lock::Timeout=300 install -y "$1" >"$work/apt.log" 2>&1; then
    apt-get -o DPkg::Lock::Timeout=300 update >>"$work/apt.log" 2>&1
    apt-get -o DPkg::Lock::Timeout=300 install -y "$1" >>"$work/apt.log" 2>&1 ||
      { tail -20 "$work/apt.log"; return 1; }
  fi
  echo "installed $1 ($(since "$t") s)"
}

step "tools"
command -v nix-instantiate >/dev/null || apt_install nix-bin || bad "apt-get install nix-bin"
command -v pyflakes3 >/dev/null || apt_install python3-pyflakes || bad "apt-get install python3-pyflakes"
command -v systemd-analyze >/dev/null || apt_install systemd || bad "apt-get install systemd"
mkdir -p "$TOOLS"
if [ ! -x "$TOOLS/bin/deadnix" ]; then
  t=$(now)
  if cargo install --quiet --locked --root "$TOOLS" --target-dir "$TOOLS/build" deadnix --version 1.3.1; then
    echo "installed deadnix 1.3.1 ($(since "$t") s)"
  else
    bad "cargo install deadnix"
  fi
fi
# crates.io's `alejandra` is a library only; tests/nix/alejandra-cli is its
# CLI. Reinstalled when that source changes.
stamp=$(cat tests/nix/alejandra-cli/Cargo.toml tests/nix/alejandra-cli/Cargo.lock tests/nix/alejandra-cli/src/*.rs | sha256sum | cut -c1-16)
if [ ! -x "$TOOLS/bin/alejandra" ] || [ "$(cat "$TOOLS/alejandra.stamp" 2>/dev/null)" != "$stamp" ]; then
  t=$(now)
  if cargo install --quiet --locked --force --root "$TOOLS" --target-dir "$TOOLS/build" --path tests/nix/alejandra-cli; then
    echo "$stamp" >"$TOOLS/alejandra.stamp"
    echo "installed alejandra (library 3.1.0 + tests/nix/alejandra-cli) ($(since "$t") s)"
  else
    bad "cargo install --path tests/nix/alejandra-cli"
  fi
fi
export PATH="$TOOLS/bin:$PATH"

# ------------------------------------------------------------ syntax and lint
step "parse, format, lint"
mapfile -t nixfiles < <(git ls-files --cached --others --exclude-standard '*.nix')
perr=0
for f in "${nixfiles[@]}"; do
  [ -f "$f" ] || continue
  if ! out=$(nix-instantiate --parse "$f" 2>&1 >/dev/null); then
    echo "$out"
    perr=$((perr + 1))
  fi
done
if [ "$perr" -eq 0 ] && [ "${#nixfiles[@]}" -gt 0 ]; then
  ok "nix-instantiate --parse: ${#nixfiles[@]} files"
else
  bad "nix-instantiate --parse: $perr of ${#nixfiles[@]} files do not parse"
fi
if out=$(alejandra --check . 2>&1); then ok "alejandra --check . (${out##*: })"; else
  echo "$out"
  bad "alejandra --check . (run: $TOOLS/bin/alejandra .)"
fi
if out=$(deadnix --fail . 2>&1); then ok "deadnix --fail ."; else
  echo "$out"
  bad "deadnix --fail ."
fi

# ------------------------------------------------------------ nixosTests
step "checks/nixos testScripts"
if nix-instantiate --eval --strict --json tests/nix/testscripts.nix >"$work/ts.json" 2>"$work/ts.err"; then
  out=$(python3 tests/nix/check_testscripts.py --pyflakes <"$work/ts.json")
  echo "$out" | grep -v ' passed, '
  if [[ $(echo "$out" | tail -1) =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    pass=$((pass + BASH_REMATCH[1]))
    fail=$((fail + BASH_REMATCH[2]))
  else
    bad "check_testscripts.py printed no result"
  fi
else
  cat "$work/ts.err"
  bad "tests/nix/testscripts.nix does not evaluate"
fi
# The checker must catch what it claims to (negative control).
printf '%s' '{"neg.nix":{"name":"neg","nodeNames":["host"],"testScript":"start_all()\nhost.wait_for_units(\"x\")\nhots.succeed(\"y\")\n"}}' >"$work/neg.json"
if out=$(python3 tests/nix/check_testscripts.py <"$work/neg.json") ||
  ! grep -q "wait_for_units is not a Machine method" <<<"$out" || ! grep -q "unknown name 'hots'" <<<"$out"; then
  echo "$out"
  bad "check_testscripts.py misses a wrong method or node name"
else
  ok "check_testscripts.py rejects host.wait_for_units and an unknown node"
fi
missing=""
for f in checks/nixos/*.nix; do
  grep -q "./nixos/$(basename "$f")" checks/default.nix || missing="$missing $f"
done
if [ -z "$missing" ]; then ok "checks/default.nix runs every checks/nixos test"; else bad "not in checks/default.nix:$missing"; fi

# ------------------------------------------------------------ units
# Stub binaries at the ExecStart= paths: `systemd-analyze verify` checks
# that they exist and are executable, nothing more.
stubs="$work/root"
mkdir -p "$stubs/bin"
for b in vmwarden-launch vmwarden-cleanup vmwarden; do
  printf '#!/bin/sh\nexit 0\n' >"$stubs/bin/$b"
  chmod +x "$stubs/bin/$b"
done
sed "s|@BIN@|$stubs/bin|g" tests/nix/fixtures/microvm-nix-style@.service >"$stubs/microvm-nix-style@.service"
for b in microvm-run microvm-pre-start microvm-shutdown microvm-post-stop; do cp "$stubs/bin/vmwarden" "$stubs/bin/$b"; done

verify() { # verify LABEL UNITFILE: systemd-analyze verify, no output allowed
  local out
  out=$(cd "$(dirname "$2")" && systemd-analyze verify --man=no "$2" 2>&1)
  local rc=$?
  if [ "$rc" -eq 0 ] && [ -z "$out" ]; then ok "systemd-analyze verify $1"; else
    echo "$out"
    bad "systemd-analyze verify $1 (rc=$rc)"
  fi
}
exposure() { # exposure UNITFILE -> prints the overall exposure number
  (cd "$(dirname "$1")" && systemd-analyze security --offline=true --man=no "$1" 2>/dev/null) |
    sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p'
}

step "vmwarden render-unit"
vmw=${VMWARDEN_BIN:-}
if [ -z "$vmw" ]; then
  if cargo build --quiet --bin vmwarden 2>"$work/build.err"; then
    vmw="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/vmwarden"
  else
    cat "$work/build.err"
    bad "cargo build --bin vmwarden"
  fi
fi
ru="$work/render-unit"
mkdir -p "$ru"
if [ -n "$vmw" ] && "$vmw" render-unit --bin-dir "$stubs/bin" >"$ru/microvm@.service" &&
  "$vmw" render-unit --reap-report --bin-dir "$stubs/bin" >"$ru/vmwarden-reap-report.service" &&
  "$vmw" render-unit --target >"$ru/microvms.target"; then
  verify "(render-unit) microvm@.service" "$ru/microvm@.service"
  verify "(render-unit) vmwarden-reap-report.service" "$ru/vmwarden-reap-report.service"
  verify "(render-unit) microvms.target" "$ru/microvms.target"
  e_t=$(exposure "$ru/microvm@.service")
  e_r=$(exposure "$ru/vmwarden-reap-report.service")
  e_m=$(exposure "$stubs/microvm-nix-style@.service")
  echo "systemd-analyze security --offline=true: microvm@.service ${e_t:-?}, vmwarden-reap-report.service ${e_r:-?}, microvm.nix-style microvm@.service ${e_m:-?} (0 best, 10 worst)"
  if [ -n "$e_t" ] && awk -v e="$e_t" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e <= m) }'; then
    ok "microvm@.service exposure $e_t <= $MAX_EXPOSURE"
  else
    bad "microvm@.service exposure ${e_t:-unknown} > $MAX_EXPOSURE"
  fi
else
  bad "vmwarden render-unit failed"
fi

# ------------------------------------------------------------ golden specs, flake.lock
step "golden specs, flake.lock"
# Every golden spec (tests/nix/golden/*/, compared with the module's
# output below when NIXPKGS_LIB is set) has exactly the contract's fields,
# shares, disks and vsock included.
n=0
nbad=0
for f in tests/nix/golden/*/*.json; do
  if out=$(python3 tests/nix/units.py spec "$f"); then n=$((n + 1)); else
    echo "$out"
    nbad=$((nbad + 1))
  fi
done
if [ "$nbad" -eq 0 ] && [ "$n" -gt 0 ]; then ok "golden specs: $n have exactly the contract's fields"; else bad "golden specs: $nbad of $((n + nbad)) break the contract"; fi
# flake.lock is written by hand (never by `nix flake` in the repository):
# version 7, every input locked with a rev and a narHash, microvm.nix's
# nixpkgs following ours. With MICROVM_NIX_SRC (an unpacked microvm.nix at
# the pinned rev) also: its NAR hash is the lock's, and its own input
# spectrum is locked as microvm.nix's flake.lock locks it.
if out=$(python3 - flake.lock "${MICROVM_NIX_SRC:-}" <<'PY'
import json, subprocess, sys, base64
lock, src = json.load(open(sys.argv[1])), sys.argv[2]
n = lock["nodes"]
bad = []
if lock.get("version") != 7: bad.append("version is not 7")
if n["root"].get("inputs") != {"microvm": "microvm", "nixpkgs": "nixpkgs"}: bad.append(f"root inputs {n['root'].get('inputs')}")
for name, node in n.items():
    if name == "root": continue
    l = node.get("locked", {})
    if not (len(l.get("rev", "")) == 40 and l.get("narHash", "").startswith("sha256-") and isinstance(l.get("lastModified"), int)):
        bad.append(f"{name}: locked needs rev, narHash and lastModified: {l}")
if n["microvm"].get("inputs") != {"nixpkgs": ["nixpkgs"], "spectrum": "spectrum"}: bad.append(f"microvm inputs {n['microvm'].get('inputs')}")
if n["spectrum"].get("flake") is not False: bad.append("spectrum is flake = false in microvm.nix")
checked = "structure"
if src:
    h = subprocess.run(["nix-hash", "--type", "sha256", src], capture_output=True, text=True, check=True).stdout.strip()
    sri = "sha256-" + base64.b64encode(bytes.fromhex(h)).decode()
    if sri != n["microvm"]["locked"]["narHash"]: bad.append(f"microvm: {src} has NAR hash {sri}, the lock says {n['microvm']['locked']['narHash']}")
    theirs = json.load(open(f"{src}/flake.lock"))["nodes"]["spectrum"]
    if theirs != n["spectrum"]: bad.append(f"spectrum: microvm.nix locks {theirs}")
    checked = f"structure, microvm narHash of {src}, spectrum as microvm.nix locks it"
print("\n".join(bad) if bad else checked)
sys.exit(1 if bad else 0)
PY
); then ok "flake.lock: $out"; else
  echo "$out"
  bad "flake.lock"
fi
[ -n "${MICROVM_NIX_SRC:-}" ] || echo "NOT RUN: flake.lock's microvm narHash and the stand-in for microvm.nix's options against microvm.nix itself (MICROVM_NIX_SRC is not set; see tests/nix/README.md)"

# ------------------------------------------------------------ module evaluation
step "module evaluation"
if [ -z "${NIXPKGS_LIB:-}" ]; then
  echo "NOT RUN: module-evaluation tests (NIXPKGS_LIB is not set; see tests/nix/README.md to provide a nixpkgs lib)"
else
  H=tests/nix/harness/eval.nix
  modules() { echo "[ $top/modules/default.nix $top/tests/nix/support.nix $* ]"; }
  ev() { # ev ATTR MODULE... : evaluate the harness
    local attr=$1
    shift
    nix-instantiate --eval --strict --json "$H" --arg modules "$(modules "$@")" \
      --arg extraPkgNames '["vmwarden" "virtiofsd" "vhost-device-vsock" "passt"]' -A "$attr"
  }
  # Cases whose specs and drop-ins are compared with tests/nix/golden/CASE/:
  # an existing configuration (two-vms: its specs must not change), one
  # using the shares, disks and vsock fields directly, and microvm.nix-shaped guests
  # (tests/nix/guests/) mapped onto specs.
  GOLDEN_CASES="two-vms shares-vsock guest-store-share guest-store-disk guest-networked guest-creds-vsock guest-nixostest guest-ch-creds guest-fc-networked guest-host-tools guest-user-net"
  # microvm.vsock.ssh.enable (`ssh vsock/<cid>`): the backend each guest gets
  GOLDEN_CASES="$GOLDEN_CASES guest-vsock-ssh"
  # the guest's notify socket on firecracker: default, another port, off
  GOLDEN_CASES="$GOLDEN_CASES fc-notify"
  # microvm.nix's own guest shapes: the flake template, the FAQ's journal share.
  GOLDEN_CASES="$GOLDEN_CASES guest-flake-template guest-journal-share"
  GOLDEN_CASES="$GOLDEN_CASES guest-fast-io"
  # guest memory: hugepageMem mapped, memMerge chosen by the host
  GOLDEN_CASES="$GOLDEN_CASES guest-memory"
  # a macvtap in bridge mode (the most common NIC of public microvm.nix hosts)
  GOLDEN_CASES="$GOLDEN_CASES guest-macvtap"
  # devices: a GPU with its audio function (QEMU), a router's NIC (cloud-hypervisor)
  GOLDEN_CASES="$GOLDEN_CASES guest-gpu guest-router"
  # the unit's limits: in the spec and in the drop-in
  GOLDEN_CASES="$GOLDEN_CASES resources"
  # hibernate and restore: in the spec only when allowed
  GOLDEN_CASES="$GOLDEN_CASES hibernate"
  # case | expectation ("ok" or a fixed string the error must contain)
  while IFS='|' read -r case want; do
    [ -n "$case" ] || continue
    out=$(ev report "$top/tests/nix/cases/$case.nix" 2>&1 >/dev/null)
    rc=$?
    if [ "$want" = ok ]; then
      if [ "$rc" -eq 0 ]; then ok "eval $case: evaluates"; else
        echo "$out"
        bad "eval $case: should evaluate"
      fi
    elif [ "$rc" -ne 0 ] && grep -qF -- "$want" <<<"$out"; then
      ok "eval $case: fails with \"$want\""
    else
      echo "$out"
      bad "eval $case: should fail with \"$want\""
    fi
  done <<'CASES'
two-vms|ok
base|ok
microvm-nix-disabled|ok
microvm-nix-beside|ok
type-error|option `vmwarden.vms.web.vcpus' is not of type `integer between 1 and 255
unknown-option|The option `vmwarden.vms.web.vcpu' does not exist
relative-path|option `vmwarden.vms.web.kernel' is not of type `normalised absolute path
comma-disk|is not of type `normalised absolute path
extra-args-monitor|"-mon" is refused: it puts a monitor
duplicate-uid|uid 30001 is used by several users (vm-db, vm-web)
uid-taken|uid 1000 is used by several users (alice, vm-web)
shared-user|principal.user "vm-web" is shared by several VMs (db, web)
bad-name|vmwarden.vms."Web_1": VM names must match ^[a-z][a-z0-9-]{0,31}$
privileged-group|principal.group = "wheel" is a privileged group
shared-group|principal.group = "kvm" is shared with others
fwcfg-too-long|is 56 bytes; QEMU allows 55
store-secret|is in the Nix store, which every local user can read
hidden-path|/home/alice/web.img is under /home, which microvm@.service hides
old-kernel|vmwarden needs Linux >= 6.4
unsupported-hypervisor|vmwarden.vms.web.credentials: firecracker cannot receive credentials safely
firecracker-tap|ok
ch-credentials|ok
duplicate-tap|vmwarden: tap "vmw-web0" is used by several VMs (db, web)
multicast-mac|mac "01:00:5e:00:00:01" of vmw-web0 is not a unicast address
zero-mac|mac "00:00:00:00:00:00" of vmw-web0 is not a unicast address
bad-bridge|bridge "vmw-br0" of vmw-web0 is not a bridge the launcher accepts
override|ok
microvm-nix|and microvm.nix's host module both define microvm@.service and microvms.target; set vmwarden.unitPrefix
shares-vsock|ok
aarch64-host|ok
guest-store-share|ok
guest-store-disk|ok
guest-networked|ok
guest-user-net|ok
guest-macvtap|ok
guest-fast-io|ok
guest-creds-vsock|ok
guest-nixostest|ok
guest-host-tools|ok
guest-foreign|the guest is built for aarch64-linux (its pkgs.stdenv.hostPlatform.system), this host is x86_64-linux
guest-not-microvm|vmwarden.vms.web.guest: it has no config.microvm
guest-cid-twice|vmwarden: vsock CID 7 is used by several VMs (edge, other)
guest-vsock-ssh|ok
fc-notify|ok
guest-flake-template|ok
guest-journal-share|ok
guest-gpu|ok
guest-router|ok
metrics|ok
resources|ok
hibernate|ok
hibernate-on-shutdown|ok
CASES

  # Inline cases, one refusal each: LABEL|expected message|a module (Nix
  # expression; paths relative to the repository). `B` stands for
  # ./tests/nix/cases/base.nix, `G M` for a microvm.nix-shaped guest with
  # module M added (tests/nix/cases/guest-refused.nix).
  while IFS='|' read -r label want expr; do
    [ -n "$label" ] || continue
    expr=${expr//B:/imports = [./tests/nix/cases/base.nix];}
    expr=${expr//G /import ./tests/nix/cases/guest-refused.nix }
    out=$(ev report "($expr)" 2>&1 >/dev/null)
    rc=$?
    # For a bad name, vmwarden's assertions must be the only failures (no
    # NixOS assertion, type error or abort about a name derived from it).
    others=""
    case $label in vm-name-* | principal-*) others=$(grep -E '^ *- ' <<<"$out" | grep -v '^ *- vmwarden\.vms\.') ;; esac
    if [ "$rc" -ne 0 ] && grep -qF -- "$want" <<<"$out" && [ -z "$others" ]; then
      ok "eval $label: fails with \"$want\""
    else
      echo "$out" | tail -5
      bad "eval $label: should fail with \"$want\""
    fi
  done <<'INLINE'
resources-high-above-max|vmwarden.vms.web.resources.memoryHighMiB = 512 is above memoryMaxMiB = 256|{B: vmwarden.vms.web.resources = {memoryMaxMiB = 256; memoryHighMiB = 512;};}
resources-cpus|vmwarden.vms.web.resources.cpus' is not of type|{B: vmwarden.vms.web.resources.cpus = "all";}
hibernate-blocked|vmwarden.vms.web.hibernate.allowed: shares[0] (tag "data") is virtiofs, which cloud-hypervisor cannot snapshot|{B: vmwarden.vms.web = {hypervisor = "cloud-hypervisor"; hibernate.allowed = true; shares = [{tag = "data"; source = "/srv/data"; proto = "virtiofs";}];};}
resources-tasks|vmwarden.vms.web.resources.tasksMax' is not of type `null or integer between 32|{B: vmwarden.vms.web.resources.tasksMax = 4;}
metrics-no-directory|vmwarden.metrics.textfile.enable is set, but no textfile directory is known|{B: vmwarden.metrics.textfile.enable = true;}
metrics-interval|vmwarden.metrics.textfile.interval' is not of type|{B: vmwarden.metrics.textfile = {enable = true; directory = "/srv/textfiles"; interval = "5m";};}
vm-name-not-a-unit-name|vmwarden.vms."web 1": VM names must match|{B: vmwarden.vms."web 1".kernel = "/srv/images/vmlinuz";}
principal-too-long|principal.user = "vm-abcdefghijklmnopqrstuvwxyz0123" is not a valid user name|{B: vmwarden.vms.abcdefghijklmnopqrstuvwxyz0123.kernel = "/srv/images/vmlinuz";}
share-tag-long|vmwarden.vms.web.shares[0] (tag "a-tag-that-is-far-too-long-for-9p"): a tag is 1 to 31 bytes|{B: vmwarden.vms.web.shares = [{tag = "a-tag-that-is-far-too-long-for-9p"; source = "/srv/share";}];}
share-tag-comma|vmwarden.vms.web.shares[0] (tag "a,b"): a tag is 1 to 31 bytes|{B: vmwarden.vms.web.shares = [{tag = "a,b"; source = "/srv/share";}];}
share-tag-twice|vmwarden.vms.web.shares: tag "data" appears twice|{B: vmwarden.vms.web.shares = [{tag = "data"; source = "/srv/a";} {tag = "data"; source = "/srv/b";}];}
share-store-writable|/nix/store is in the Nix store, which is shared read-only only; set readOnly = true|{B: vmwarden.vms.web.shares = [{tag = "store"; source = "/nix/store";}];}
share-firecracker|vmwarden.vms.web.shares: firecracker has no shared file systems|{B: vmwarden.vms.web = {hypervisor = "firecracker"; shares = [{tag = "data"; source = "/srv/a";}];};}
share-9p-cloud-hypervisor|cloud-hypervisor has no 9p|{B: vmwarden.vms.web = {hypervisor = "cloud-hypervisor"; shares = [{tag = "data"; source = "/srv/a"; proto = "9p";}];};}
share-other-vm|vmwarden.vms.web.shares: /var/lib/vmwarden/db/data is in VM db's state directory|{B: vmwarden.vms.db.kernel = "/srv/images/vmlinuz"; vmwarden.vms.web.shares = [{tag = "data"; source = "/var/lib/vmwarden/db/data";}];}
share-runtime-root|vmwarden.vms.web.shares: /run/vmwarden/web/control is under /run/vmwarden, which belongs to vmwarden|{B: vmwarden.vms.web.shares = [{tag = "c"; source = "/run/vmwarden/web/control";}];}
share-hidden|vmwarden.vms.web.shares: /home/alice is under /home, which microvm@.service hides|{B: vmwarden.vms.web.shares = [{tag = "h"; source = "/home/alice";}];}
share-comma|option `vmwarden.vms.web.shares."[definition 1-entry 1]".source' is not of type `normalised absolute path|{B: vmwarden.vms.web.shares = [{tag = "d"; source = "/srv/a,b";}];}
disk-other-vm|vmwarden.vms.web.disks: /var/lib/vmwarden/db/root.img is in VM db's state directory|{B: vmwarden.vms.db.kernel = "/srv/images/vmlinuz"; vmwarden.vms.web.disks = [{path = "/var/lib/vmwarden/db/root.img";}];}
create-outside|vmwarden.vms.web.disks[0] (/srv/images/var.img): create makes images inside the VM's own state directory only|{B: vmwarden.vms.web.disks = [{path = "/srv/images/var.img"; create.sizeMiB = 64;}];}
create-state-root|create makes images inside the VM's own state directory only|{B: vmwarden.vms.web.disks = [{path = "/var/lib/vmwarden/web"; create.sizeMiB = 64;}];}
create-qcow2|create makes a raw image|{B: vmwarden.vms.web.disks = [{path = "/var/lib/vmwarden/web/var.img"; format = "qcow2"; create.sizeMiB = 64;}];}
create-fstype|create.fsType' is not of type `null or value "ext4"|{B: vmwarden.vms.web.disks = [{path = "/var/lib/vmwarden/web/var.img"; create = {sizeMiB = 64; fsType = "xfs";};}];}
serial-bad|serial "var,x" must be 1 to 20 bytes|{B: vmwarden.vms.web.disks = [{path = "/srv/a.img"; serial = "var,x";}];}
serial-long|serial "abcdefghijklmnopqrstu" must be 1 to 20 bytes|{B: vmwarden.vms.web.disks = [{path = "/srv/a.img"; serial = "abcdefghijklmnopqrstu";}];}
serial-firecracker|firecracker's drives have no serial|{B: vmwarden.vms.web = {hypervisor = "firecracker"; disks = [{path = "/srv/a.img"; serial = "a";}];};}
qcow2-firecracker|firecracker takes raw images only|{B: vmwarden.vms.web = {hypervisor = "firecracker"; disks = [{path = "/srv/a.img"; format = "qcow2";}];};}
cid-low|vmwarden.vms.web.vsock.cid = 2: CIDs 0, 1 and 2 are the hypervisor, loopback and the host|{B: vmwarden.vms.web.vsock.cid = 2;}
cid-any|vmwarden.vms.web.vsock.cid = 4294967295|{B: vmwarden.vms.web.vsock.cid = 4294967295;}
cid-twice|vmwarden: vsock CID 5 is used by several VMs (db, web)|{B: vmwarden.vms.db = {kernel = "/srv/images/vmlinuz"; vsock.cid = 5;}; vmwarden.vms.web.vsock.cid = 5;}
vhost-firecracker|vmwarden.vms.web.vsock.backend = "vhost": firecracker serves vsock itself|{B: vmwarden.vms.web = {hypervisor = "firecracker"; vsock = {cid = 5; backend = "vhost";};};}
vhost-cloud-hypervisor|vmwarden.vms.web.vsock.backend = "vhost": cloud-hypervisor serves vsock itself|{B: vmwarden.vms.web = {hypervisor = "cloud-hypervisor"; vsock = {cid = 5; backend = "vhost";};};}
notify-qemu|vmwarden.vms.web.vsock.notify = true: qemu needs no notify socket|{B: vmwarden.vms.web.vsock = {cid = 5; notify = true;};}
notify-no-cid|vmwarden.vms.web.vsock.notify = true: the notify socket is a vsock port; give the VM a vsock.cid|{B: vmwarden.vms.web = {hypervisor = "firecracker"; vsock.notify = true;};}
notify-port-off|vmwarden.vms.web.vsock.notifyPort is set, but the VM has no notify socket|{B: vmwarden.vms.web = {hypervisor = "firecracker"; vsock = {cid = 5; notify = false; notifyPort = 9000;};};}
notify-port-any|vsock.notifyPort' is not of type `null or integer between 1 and 4294967294|{B: vmwarden.vms.web = {hypervisor = "firecracker"; vsock = {cid = 5; notifyPort = 4294967295;};};}
notify-cmdline|vmwarden.vms.web.cmdline sets the vmm.notify_socket credential itself|{B: vmwarden.vms.web = {hypervisor = "firecracker"; vsock.cid = 5; cmdline = "console=ttyS0 systemd.set_credential=vmm.notify_socket:vsock-stream:2:1";};}
machine-virt-on-x86_64|vmwarden.vms.web.machine = "virt" is a machine of qemu-system-aarch64, but this VM runs qemu-system-x86_64|{B: vmwarden.vms.web.machine = "virt";}
machine-q35-on-aarch64|vmwarden.vms.web.machine = "q35" is a machine of qemu-system-x86_64, but this VM runs qemu-system-aarch64; use "virt"|{imports = [./tests/nix/cases/aarch64-host.nix]; vmwarden.vms.web.machine = "q35";}
cmdline-long|vmwarden.vms.web.cmdline: the kernel command line is at most 4096 bytes|{lib, ...}: {B: vmwarden.vms.web.cmdline = lib.concatStrings (lib.replicate 4097 "x");}
macvtap-no-link|vmwarden.vms.web.interfaces: macvtap "vmw-web0" needs macvtap.link (the host interface it sits on, e.g. "enp3s0") and macvtap.mode|{B: vmwarden.vms.web.interfaces = [{tap = "vmw-web0"; type = "macvtap";}];}
macvtap-on-a-bridge|vmwarden.vms.web.interfaces: macvtap "vmw-web0" sits on its macvtap.link, never on a bridge; remove bridge = "br0"|{B: vmwarden.vms.web.interfaces = [{tap = "vmw-web0"; type = "macvtap"; bridge = "br0"; macvtap = {link = "eth0"; mode = "bridge";};}];}
macvtap-vm-link|vmwarden.vms.web.interfaces: macvtap "vmw-web0": macvtap.link "vmw-db0" is a VM's link|{B: vmwarden.vms.web.interfaces = [{tap = "vmw-web0"; type = "macvtap"; macvtap = {link = "vmw-db0"; mode = "bridge";};}];}
macvtap-firecracker|vmwarden.vms.web.interfaces: macvtap "vmw-web0": firecracker opens its network devices by name|{B: vmwarden.vms.web = {hypervisor = "firecracker"; interfaces = [{tap = "vmw-web0"; type = "macvtap"; macvtap = {link = "eth0"; mode = "bridge";};}];};}
tapbridges-without-guest|vmwarden.vms.web.tapBridges."vmw-web0": tapBridges attaches a guest's type = "tap" interfaces|{B: vmwarden.vms.web.tapBridges.vmw-web0 = "br0";}
tapbridges-typo|vmwarden.vms.edge.tapBridges."vmw-edge9": the guest has no interface of type "tap" with id "vmw-edge9" (its tap interfaces: vmw-edge0)|{imports = [./tests/nix/cases/guest-networked.nix]; vmwarden.vms.edge.tapBridges.vmw-edge9 = "br0";}
qemu -sandbox|vmwarden.vms.web.extraArgs: "-sandbox" is refused|{B: vmwarden.vms.web.extraArgs = ["-sandbox" "off"];}
qemu --sandbox|vmwarden.vms.web.extraArgs: "--sandbox" is refused|{B: vmwarden.vms.web.extraArgs = ["--sandbox" "off"];}
qemu -runas|vmwarden.vms.web.extraArgs: "-runas" is refused|{B: vmwarden.vms.web.extraArgs = ["-runas" "root"];}
qemu -run-with|vmwarden.vms.web.extraArgs: "-run-with" is refused|{B: vmwarden.vms.web.extraArgs = ["-run-with" "user=root"];}
qemu -chroot|vmwarden.vms.web.extraArgs: "-chroot" is refused|{B: vmwarden.vms.web.extraArgs = ["-chroot" "/srv/jail"];}
qemu -daemonize|vmwarden.vms.web.extraArgs: "-daemonize" is refused|{B: vmwarden.vms.web.extraArgs = ["-daemonize"];}
qemu -readconfig|vmwarden.vms.web.extraArgs: "-readconfig" is refused|{B: vmwarden.vms.web.extraArgs = ["-readconfig" "/srv/qemu.cfg"];}
qemu -set|vmwarden.vms.web.extraArgs: "-set" is refused|{B: vmwarden.vms.web.extraArgs = ["-set" "chardev.c.path=/tmp/x"];}
qemu -qmp tcp|vmwarden.vms.web.extraArgs: "-qmp" "tcp:127.0.0.1:4444,server=on,wait=off" is refused|{B: vmwarden.vms.web.extraArgs = ["-qmp" "tcp:127.0.0.1:4444,server=on,wait=off"];}
qemu -qmp outside control|"-qmp" "unix:/run/vmwarden/web/qmp2.sock,server=on" is refused: a monitor socket outside /run/vmwarden/web/control/|{B: vmwarden.vms.web.extraArgs = ["-qmp" "unix:/run/vmwarden/web/qmp2.sock,server=on"];}
qemu -qmp escaping control|"-qmp" "unix:/run/vmwarden/web/control/../../db/control/q.sock,server=on" is refused|{B: vmwarden.vms.web.extraArgs = ["-qmp" "unix:/run/vmwarden/web/control/../../db/control/q.sock,server=on"];}
qemu -monitor stdio|vmwarden.vms.web.extraArgs: "-monitor" "stdio" is refused|{B: vmwarden.vms.web.extraArgs = ["-monitor" "stdio"];}
qemu -monitor abstract|"-monitor" "unix:/run/vmwarden/web/control/m.sock,abstract=on" is refused: an abstract socket|{B: vmwarden.vms.web.extraArgs = ["-monitor" "unix:/run/vmwarden/web/control/m.sock,abstract=on"];}
qemu -chardev socket outside|"-chardev" "socket,id=c,path=/srv/c.sock,server=on" is refused: a socket outside /run/vmwarden/web/control/|{B: vmwarden.vms.web.extraArgs = ["-chardev" "socket,id=c,path=/srv/c.sock,server=on"];}
qemu -chardev socket tcp|"-chardev" "socket,id=c,host=0.0.0.0,port=4444,server=on" is refused: a TCP socket|{B: vmwarden.vms.web.extraArgs = ["-chardev" "socket,id=c,host=0.0.0.0,port=4444,server=on"];}
qemu -chardev json|"-chardev" "{\"id\":\"c\"}" is refused: write it in the key=value form|{B: vmwarden.vms.web.extraArgs = ["-chardev" "{\"id\":\"c\"}"];}
qemu -fw_cfg file|"-fw_cfg" "name=opt/x,file=/etc/shadow" is refused: fw_cfg files are read by QEMU from a host path|{B: vmwarden.vms.web.extraArgs = ["-fw_cfg" "name=opt/x,file=/etc/shadow"];}
qemu -fw_cfg credential name|"-fw_cfg" "name=opt/io.systemd.credentials/x,string=y" is refused: names under opt/io.systemd.credentials/ are vmwarden's credentials|{B: vmwarden.vms.web.extraArgs = ["-fw_cfg" "name=opt/io.systemd.credentials/x,string=y"];}
qemu -netdev tap|"-netdev" "tap,id=n0,ifname=vm-web" is refused: QEMU would open a tap|{B: vmwarden.vms.web.extraArgs = ["-netdev" "tap,id=n0,ifname=vm-web"];}
qemu -nic bridge|"-nic" "bridge,br=br0" is refused|{B: vmwarden.vms.web.extraArgs = ["-nic" "bridge,br=br0"];}
qemu -net tap|"-net" "tap,ifname=x" is refused|{B: vmwarden.vms.web.extraArgs = ["-net" "tap,ifname=x"];}
qemu -netdev type=tap|"-netdev" "type=tap,id=n0,ifname=x" is refused|{B: vmwarden.vms.web.extraArgs = ["-netdev" "type=tap,id=n0,ifname=x"];}
qemu -chardev backend=socket|"-chardev" "backend=socket,id=c,path=/srv/c.sock" is refused: a socket outside|{B: vmwarden.vms.web.extraArgs = ["-chardev" "backend=socket,id=c,path=/srv/c.sock"];}
qemu -serial tcp|"-serial" "tcp::4444,server=on" is refused: a network socket|{B: vmwarden.vms.web.extraArgs = ["-serial" "tcp::4444,server=on"];}
qemu -gdb unix outside|"-gdb" "unix:/srv/gdb.sock,server=on" is refused|{B: vmwarden.vms.web.extraArgs = ["-gdb" "unix:/srv/gdb.sock,server=on"];}
qemu -qmp without value|"-qmp" needs a value|{B: vmwarden.vms.web.extraArgs = ["-device" "virtio-rng-device" "-qmp"];}
qemu -chardev keys past the first|"-chardev" "id=m,backend=socket,path=/run/vmwarden/web/control/m.sock,abstract=on,server=on" is refused: an abstract socket|{B: vmwarden.vms.web.extraArgs = ["-chardev" "id=m,backend=socket,path=/run/vmwarden/web/control/m.sock,abstract=on,server=on" "-mon" "chardev=m,mode=control"];}
qemu -mon|"-mon" is refused: it puts a monitor, the VM's control plane, on a chardev|{B: vmwarden.vms.web.extraArgs = ["-chardev" "socket,id=m,path=/run/vmwarden/web/control/m.sock,server=on" "-mon" "chardev=m,mode=control"];}
qemu -chardev key twice|"-chardev" "socket,id=c,path=/run/vmwarden/web/control/c.sock,path=/srv/c.sock" is refused: "path" is given twice|{B: vmwarden.vms.web.extraArgs = ["-chardev" "socket,id=c,path=/run/vmwarden/web/control/c.sock,path=/srv/c.sock"];}
qemu -chardev escaped key|"-chardev" "socket,id=c,pa,,th=/srv/c.sock" is refused: the key "pa,,th" holds|{B: vmwarden.vms.web.extraArgs = ["-chardev" "socket,id=c,pa,,th=/srv/c.sock"];}
qemu -qmp path twice|"-qmp" "unix:/run/vmwarden/web/control/q.sock,path=/srv/q.sock" is refused: "path" is given twice|{B: vmwarden.vms.web.extraArgs = ["-qmp" "unix:/run/vmwarden/web/control/q.sock,path=/srv/q.sock"];}
qemu -serial mon:unix|"-serial" "mon:unix:/srv/s.sock,server=on" is refused: a socket outside|{B: vmwarden.vms.web.extraArgs = ["-serial" "mon:unix:/srv/s.sock,server=on"];}
qemu -fw_cfg name last|"-fw_cfg" "string=y,name=opt/io.systemd.credentials/x" is refused: names under|{B: vmwarden.vms.web.extraArgs = ["-fw_cfg" "string=y,name=opt/io.systemd.credentials/x"];}
qemu -netdev stream|"-netdev" "id=n,type=stream,addr.type=unix,addr.path=/srv/n.sock" is refused: QEMU would put the VM's network on a host socket|{B: vmwarden.vms.web.extraArgs = ["-netdev" "id=n,type=stream,addr.type=unix,addr.path=/srv/n.sock"];}
user-network firecracker|vmwarden.vms.web.userNetwork.enable: firecracker has no user networking in vmwarden|{B: vmwarden.vms.web = {hypervisor = "firecracker"; userNetwork.enable = true;};}
user-network port below the sysctl|vmwarden.vms.web.userNetwork.forwardPorts[0].host.port = 1000: it is below net.ipv4.ip_unprivileged_port_start (1024)|{B: vmwarden.vms.web.userNetwork = {enable = true; forwardPorts = [{host.port = 1000; guest.port = 80;}];};}
user-network port above a lowered sysctl|vmwarden.vms.web.userNetwork.forwardPorts[0].host.port = 80: it is below net.ipv4.ip_unprivileged_port_start (443)|{B: boot.kernel.sysctl."net.ipv4.ip_unprivileged_port_start" = 443; vmwarden.vms.web.userNetwork = {enable = true; forwardPorts = [{host.port = 80; guest.port = 80;} {host.port = 443; guest.port = 443;}];};}
user-network without user namespaces|vmwarden.vms.web.userNetwork.enable: passt's own sandbox is a user namespace, but security.allowUserNamespaces = false|{B: security.allowUserNamespaces = false; vmwarden.vms.web.userNetwork.enable = true;}
user-network netdev id of a tap|vmwarden.vms.web.userNetwork.id = "net1": an id is a letter|{B: vmwarden.vms.web.userNetwork = {enable = true; id = "net1";};}
user-network bad address|vmwarden.vms.web.userNetwork.forwardPorts[0].host.address = "localhost": give an IPv4 address|{B: vmwarden.vms.web.userNetwork = {enable = true; forwardPorts = [{host = {address = "localhost"; port = 2222;}; guest.port = 22;}];};}
cloud-hypervisor --api-socket|"--api-socket=/srv/api.sock" is refused: the API socket is vmwarden's control socket|{B: vmwarden.vms.web = {hypervisor = "cloud-hypervisor"; extraArgs = ["--api-socket=/srv/api.sock"];};}
cloud-hypervisor --seccomp|"--seccomp" is refused: cloud-hypervisor's own seccomp filter|{B: vmwarden.vms.web = {hypervisor = "cloud-hypervisor"; extraArgs = ["--seccomp" "false"];};}
cloud-hypervisor --net|"--net" is refused: cloud-hypervisor would open a tap by name|{B: vmwarden.vms.web = {hypervisor = "cloud-hypervisor"; extraArgs = ["--net" "tap=vm-web"];};}
firecracker console|vmwarden.vms.web.console: firecracker's serial console is only its own stdin and stdout|{B: vmwarden.vms.web = {hypervisor = "firecracker"; console = true;};}
memMerge firecracker|vmwarden.vms.web.memMerge: firecracker never marks guest memory mergeable|{B: vmwarden.vms.web = {hypervisor = "firecracker"; memMerge = true;};}
memMerge cloud-hypervisor with virtiofs|vmwarden.vms.web.memMerge: cloud-hypervisor cannot merge memory it shares with virtiofsd|{B: vmwarden.vms.web = {hypervisor = "cloud-hypervisor"; memMerge = true; shares = [{tag = "s"; source = "/srv/s"; proto = "virtiofs"; readOnly = true;}];};}
hugepageMem odd memoryMiB|vmwarden.vms.web.memoryMiB = 1025: hugepageMem backs the guest with 2 MiB pages|{B: vmwarden.vms.web = {hugepageMem = true; memoryMiB = 1025;};}
initialBalloonMem too large|vmwarden.vms.web.initialBalloonMem = 1020: the guest must keep at least 16 MiB|{B: vmwarden.vms.web = {balloon = true; initialBalloonMem = 1020; memoryMiB = 1024;};}
firecracker --no-seccomp|"--no-seccomp" is refused: firecracker's own seccomp filter|{B: vmwarden.vms.web = {hypervisor = "firecracker"; extraArgs = ["--no-seccomp"];};}
firecracker --config-file|"--config-file" is refused: vmwarden writes firecracker's configuration itself|{B: vmwarden.vms.web = {hypervisor = "firecracker"; extraArgs = ["--config-file" "/srv/fc.json"];};}
guest.enable|vmwarden.vms.web.guest: microvm.guest.enable = false|G {microvm.guest.enable = false;}
cpu|vmwarden.vms.web.guest: microvm.cpu = "cortex-a53": vmwarden picks -cpu from accel|G {microvm.cpu = "cortex-a53";}
hypervisor crosvm|vmwarden.vms.web.guest: microvm.hypervisor = "crosvm": vmwarden runs qemu, cloud-hypervisor and firecracker only|G {microvm.hypervisor = "crosvm";}
hypervisor vfkit|microvm.hypervisor = "vfkit": vmwarden runs qemu, cloud-hypervisor and firecracker only|G {microvm.hypervisor = "vfkit";}
preStart|vmwarden.vms.web.guest: microvm.preStart = "ip link set vm-web up": it would run as root|G {microvm.preStart = "ip link set vm-web up";}
extraArgsScript|microvm.extraArgsScript = "/srv/args.sh": arguments computed at start escape vmwarden's checks|G {microvm.extraArgsScript = "/srv/args.sh";}
user|microvm.user = "microvm": every vmwarden VM runs as its own principal|G {microvm.user = "microvm";}
hugepageMem odd mem|microvm.mem = 1025: hugepageMem backs the guest with 2 MiB pages; give an even microvm.mem|G ({lib, ...}: {microvm.hugepageMem = true; microvm.mem = lib.mkForce 1025;})
hotplugMem|microvm.hotplugMem = 1024: virtio-mem|G {microvm.hotplugMem = 1024;}
hotpluggedMem|microvm.hotpluggedMem = 256: as hotplugMem|G {microvm.hotpluggedMem = 256;}
balloon firecracker|microvm.balloon = true: vmwarden drives no firecracker balloon|G {microvm.hypervisor = "firecracker"; microvm.balloon = true;}
initialBalloonMem without balloon|microvm.initialBalloonMem = 128: it sizes the balloon, which needs microvm.balloon = true|G {microvm.initialBalloonMem = 128;}
hotplugMem with balloon|microvm.hotplugMem = 512: virtio-mem|G {microvm.balloon = true; microvm.hotplugMem = 512;}
forwardPorts without a user interface|microvm.forwardPorts = [{"from":"host","guest":{"address":"","port":22},"host":{"address":"","port":2222},"proto":"tcp"}]: it forwards to an interface of type = "user"|G {microvm.forwardPorts = [{host.port = 2222; guest.port = 22;}];}
forwardPorts from the guest to another address|microvm.forwardPorts[0].guest.address = "10.0.2.100": passt forwards from the guest only to the host's loopback|G {microvm.interfaces = [{type = "user"; id = "qemu"; mac = "02:00:00:01:01:01";}]; microvm.forwardPorts = [{from = "guest"; host = {address = "127.0.0.1"; port = 8080;}; guest = {address = "10.0.2.100"; port = 8080;};}];}
forwardPorts to another guest address|microvm.forwardPorts[0].guest.address = "10.0.2.16": the guest's only address on the user network is 10.0.2.15|G {microvm.interfaces = [{type = "user"; id = "qemu"; mac = "02:00:00:01:01:01";}]; microvm.forwardPorts = [{host.port = 2222; guest = {address = "10.0.2.16"; port = 22;};}];}
forwardPorts twice|microvm.forwardPorts[1].host.port = 2222: tcp port 2222 is forwarded twice|G {microvm.interfaces = [{type = "user"; id = "qemu"; mac = "02:00:00:01:01:01";}]; microvm.forwardPorts = [{host.port = 2222; guest.port = 22;} {host = {address = "127.0.0.1"; port = 2222;}; guest.port = 23;}];}
forwardPorts below 1024|vmwarden.vms.web.userNetwork.forwardPorts[0].host.port = 80 (the guest's microvm.forwardPorts): it is below net.ipv4.ip_unprivileged_port_start (1024)|G {microvm.interfaces = [{type = "user"; id = "qemu"; mac = "02:00:00:01:01:01";}]; microvm.forwardPorts = [{host.port = 80; guest.port = 80;}];}
graphics.enable|microvm.graphics.enable = true: a display needs a desktop session|G {microvm.graphics.enable = true;}
binScripts|microvm.binScripts = ["backup"]: vmwarden never builds or runs microvm.nix's runner|G {microvm.binScripts.backup = "echo";}
vcpu|microvm.vcpu = 300: vmwarden allows 1 to 255 vCPUs|G ({lib, ...}: {microvm.vcpu = lib.mkForce 300;})
mem|microvm.mem = 8: vmwarden allows 16 to 1048576 MiB|G ({lib, ...}: {microvm.mem = lib.mkForce 8;})
machineId|microvm.machineId = "web,x": it becomes QEMU's -smbios uuid=|G {microvm.machineId = "web,x";}
qemu.machine|microvm.qemu.machine = "isapc": vmwarden's argv knows the machines|G {microvm.qemu.machine = "isapc";}
qemu.machineOpts|microvm.qemu.machineOpts = { ... }: vmwarden passes a plain -machine|G {microvm.qemu.machineOpts.pit = "off";}
qemu.pcieRootPorts|microvm.qemu.pcieRootPorts = [{"addr":null,"bus":null,"chassis":null,"id":"p0","slot":null}]: root ports serve hot-plug|G {microvm.qemu.pcieRootPorts = [{id = "p0";}];}
qemu.extraArgs|vmwarden.vms.web.guest: microvm.qemu.extraArgs: "-sandbox" is refused|G {microvm.qemu.extraArgs = ["-sandbox" "off"];}
qemu.extraArgs monitor on an abstract socket|vmwarden.vms.web.guest: microvm.qemu.extraArgs: "-chardev" "id=m,backend=socket,path=/run/vmwarden/web/control/m.sock,abstract=on,server=on" is refused: an abstract socket|G {microvm.qemu.extraArgs = ["-chardev" "id=m,backend=socket,path=/run/vmwarden/web/control/m.sock,abstract=on,server=on" "-mon" "chardev=m,mode=control"];}
cloud-hypervisor.platformOEMStrings|microvm.cloud-hypervisor.platformOEMStrings = ["io.systemd.credential:KEY=x"]: OEM strings are on cloud-hypervisor's command line|G {microvm.hypervisor = "cloud-hypervisor"; microvm.cloud-hypervisor.platformOEMStrings = ["io.systemd.credential:KEY=x"];}
cloud-hypervisor.extraArgs|microvm.cloud-hypervisor.extraArgs: "--cpus" is refused: use `vcpus`|G {microvm.hypervisor = "cloud-hypervisor"; microvm.cloud-hypervisor.extraArgs = ["--cpus" "boot=2"];}
firecracker.cpu|microvm.firecracker.cpu = { ... }: vmwarden's firecracker configuration has no CPU template|G {microvm.hypervisor = "firecracker"; microvm.firecracker.cpu = {template = "T2";};}
firecracker.extraConfig|microvm.firecracker.extraConfig = { ... }: vmwarden writes firecracker's configuration itself|G {microvm.hypervisor = "firecracker"; microvm.firecracker.extraConfig.machine-config.smt = true;}
firecracker.extraArgs|microvm.firecracker.extraArgs: "--api-sock" is refused|G {microvm.hypervisor = "firecracker"; microvm.firecracker.extraArgs = ["--api-sock" "/srv/fc.sock"];}
volumes.label|microvm.volumes[0].label = "var": vmwarden's create makes no file system label|G {microvm.volumes = [{image = "var.img"; mountPoint = "/var"; size = 64; label = "var";}];}
volumes.autoCreate outside|microvm.volumes[0].autoCreate = true: vmwarden creates images only inside the VM's state directory (/var/lib/vmwarden/web/)|G {microvm.volumes = [{image = "/srv/images/var.img"; mountPoint = "/var"; size = 64;}];}
volumes.mkfsExtraArgs|microvm.volumes[0].mkfsExtraArgs = ["-O","^has_journal"]: vmwarden's create runs its own mkfs|G {microvm.volumes = [{image = "var.img"; mountPoint = "/var"; size = 64; mkfsExtraArgs = ["-O" "^has_journal"];}];}
volumes.fsType|microvm.volumes[0].fsType = "xfs": vmwarden's create makes ext4 only|G {microvm.volumes = [{image = "var.img"; mountPoint = "/var"; size = 64; fsType = "xfs";}];}
volumes.imageType vhd|microvm.volumes[0].imageType = "vhd": vmwarden's disk formats are raw and qcow2|G {microvm.volumes = [{image = "var.vhd"; mountPoint = "/var"; autoCreate = false; imageType = "vhd";}];}
volumes.imageType qcow2 created|microvm.volumes[0].imageType = "qcow2": vmwarden's create makes raw images|G {microvm.volumes = [{image = "var.qcow2"; mountPoint = "/var"; size = 64; imageType = "qcow2";}];}
volumes.image|microvm.volumes[0].image = "../shared.img": it must resolve to a normalised absolute path|G {microvm.volumes = [{image = "../shared.img"; mountPoint = "/var"; autoCreate = false;}];}
volumes.size|microvm.volumes[0].size = null: autoCreate needs a size in MiB|G {microvm.volumes = [{image = "var.img"; mountPoint = "/var";}];}
volumes.serial|microvm.volumes[0].serial = "var,x": a serial is 1 to 20 bytes|G {microvm.volumes = [{image = "var.img"; mountPoint = "/var"; size = 64; serial = "var,x";}];}
volumes.serial firecracker|microvm.volumes[0].serial = "var": firecracker's drives have no serial|G {microvm.hypervisor = "firecracker"; microvm.volumes = [{image = "var.img"; mountPoint = "/var"; size = 64; serial = "var";}];}
volumes.direct firecracker|microvm.volumes[0].direct = true: firecracker's drives have no O_DIRECT mode|G {microvm.hypervisor = "firecracker"; microvm.volumes = [{image = "var.img"; mountPoint = "/var"; size = 64; direct = true;}];}
devices firecracker|microvm.devices = ["0000:01:00.0"]: firecracker has no PCI or USB passthrough|G {microvm.hypervisor = "firecracker"; microvm.devices = [{bus = "pci"; path = "0000:01:00.0";}];}
devices usb on cloud-hypervisor|microvm.devices.0.bus = "usb": cloud-hypervisor has no USB controller|G {microvm.hypervisor = "cloud-hypervisor"; microvm.devices = [{bus = "usb"; path = "vendorid=0x0627,productid=0x0001";}];}
devices qemu options on cloud-hypervisor|microvm.devices.0.qemu = { ... }: these are QEMU's device options; remove them|G {microvm.hypervisor = "cloud-hypervisor"; microvm.devices = [{bus = "pci"; path = "0000:03:00.0"; qemu.id = "nic";}];}
devices in two VMs|vmwarden: device pci 0000:01:00.0 is in the devices of several VMs (gpu, other); a device is one VM's for its life|{imports = [./tests/nix/cases/guest-gpu.nix]; vmwarden.vms.other = {kernel = "/srv/images/vmlinuz"; machine = "q35"; devices = [{bus = "pci"; path = "0000:01:00.0";}];};}
interfaces.type user on cloud-hypervisor|microvm.interfaces[0].type = "user": cloud-hypervisor has no user networking in vmwarden|G {microvm.hypervisor = "cloud-hypervisor"; microvm.interfaces = [{type = "user"; id = "qemu"; mac = "02:00:00:01:01:01";}];}
interfaces.type user twice|microvm.interfaces[1].type = "user": vmwarden gives a VM one user-networking interface|G {microvm.interfaces = [{type = "user"; id = "qemu"; mac = "02:00:00:01:01:01";} {type = "user"; id = "qemu2"; mac = "02:00:00:01:01:02";}];}
interfaces.type user id|microvm.interfaces[0].id = "net0": a user interface's id|G {microvm.interfaces = [{type = "user"; id = "net0"; mac = "02:00:00:01:01:01";}];}
interfaces.type macvtap firecracker|microvm.interfaces[0].type = "macvtap": firecracker opens its network devices by name|G {microvm.hypervisor = "firecracker"; microvm.shares = []; microvm.interfaces = [{type = "macvtap"; id = "vmw-web0"; mac = "02:00:00:01:01:01"; macvtap = {link = "eth0"; mode = "bridge";};}];}
interfaces.macvtap.link of a VM|microvm.interfaces[0].macvtap.link = "vmw-db0": the host interface the macvtap sits on|G {microvm.interfaces = [{type = "macvtap"; id = "vmw-web0"; mac = "02:00:00:01:01:01"; macvtap = {link = "vmw-db0"; mode = "bridge";};}];}
interfaces.id macvtap|microvm.interfaces[0].id = "vm-web": vmwarden's taps are named ^vmw-|G {microvm.interfaces = [{type = "macvtap"; id = "vm-web"; mac = "02:00:00:01:01:01"; macvtap = {link = "eth0"; mode = "bridge";};}];}
interfaces.id|microvm.interfaces[0].id = "vm-web": vmwarden's taps are named ^vmw-|G {microvm.interfaces = [{type = "tap"; id = "vm-web"; mac = "02:00:00:01:01:01";}];}
interfaces.mac|microvm.interfaces[0].mac = "02-00-00-01-01-01": a MAC is six hex pairs|G {microvm.interfaces = [{type = "tap"; id = "vmw-web0"; mac = "02-00-00-01-01-01";}];}
interfaces.tap.vhost cloud-hypervisor|microvm.interfaces[0].tap.vhost = true: cloud-hypervisor's network devices run in cloud-hypervisor itself|G {microvm.hypervisor = "cloud-hypervisor"; microvm.interfaces = [{type = "tap"; id = "vmw-web0"; mac = "02:00:00:01:01:01"; tap.vhost = true;}];}
shares firecracker|microvm.shares = ["ro-store","home"]: firecracker has no shared file systems|G {microvm.hypervisor = "firecracker";}
shares.proto 9p cloud-hypervisor|microvm.shares[0].proto = "9p": cloud-hypervisor has no 9p|G {microvm.hypervisor = "cloud-hypervisor"; microvm.shares = [{tag = "data"; source = "data"; mountPoint = "/data";}];}
shares.tag|microvm.shares[0].tag = "a-tag-that-is-far-too-long-for-9p": a tag is 1 to 31 bytes|G {microvm.shares = [{tag = "a-tag-that-is-far-too-long-for-9p"; source = "data"; mountPoint = "/data";}];}
shares.source|microvm.shares[0].source = "../db/data": it must resolve to a normalised absolute path|G {microvm.shares = [{tag = "data"; source = "../db/data"; mountPoint = "/data";}];}
shares.securityModel|microvm.shares[0].securityModel = "mapped-file": vmwarden's 9p security model is QEMU's mapped-xattr|G {microvm.shares = [{tag = "data"; source = "data"; mountPoint = "/data"; securityModel = "mapped-file";}];}
shares.cache|microvm.shares[0].cache = "always": vmwarden runs virtiofsd with its default cache policy|G {microvm.shares = [{tag = "data"; source = "data"; mountPoint = "/data"; proto = "virtiofs"; cache = "always";}];}
shares.posixAcl|microvm.shares[0].posixAcl = false: it only exists for virtiofsd's --translate-uid|G {microvm.shares = [{tag = "data"; source = "data"; mountPoint = "/data"; proto = "virtiofs"; posixAcl = false;}];}
shares.extraArgs|microvm.shares[0].extraArgs = ["--sandbox=none"]: virtiofsd's arguments are vmwarden's|G {microvm.shares = [{tag = "data"; source = "data"; mountPoint = "/data"; proto = "virtiofs"; extraArgs = ["--sandbox=none"];}];}
virtiofsd.inodeFileHandles|microvm.virtiofsd.inodeFileHandles = "mandatory": file handles need CAP_DAC_READ_SEARCH|G {microvm.virtiofsd.inodeFileHandles = "mandatory";}
virtiofsd.threadPoolSize|microvm.virtiofsd.threadPoolSize = "many": vmwarden takes a thread count or|G {microvm.virtiofsd.threadPoolSize = "many";}
virtiofsd.extraArgs|microvm.virtiofsd.extraArgs = ["--announce-submounts"]: virtiofsd's arguments are vmwarden's|G {microvm.virtiofsd.extraArgs = ["--announce-submounts"];}
credentialFiles firecracker|microvm.credentialFiles = ["token"]: firecracker has no channel|G {microvm.hypervisor = "firecracker"; microvm.credentialFiles.token = "/run/secrets/token";}
vsock.cid low|microvm.vsock.cid = 2: CIDs 0, 1 and 2 are the hypervisor, loopback and the host|G {microvm.vsock.cid = 2;}
credentialFiles name|microvm.credentialFiles.-token = "/run/secrets/token": credential names are|G {microvm.credentialFiles."-token" = "/run/secrets/token";}
credentialFiles long name|microvm.credentialFiles.a-credential-name-of-29-bytes = "/run/secrets/x": QEMU keeps fw_cfg names of 55 bytes|G {microvm.credentialFiles.a-credential-name-of-29-bytes = "/run/secrets/x";}
credentialFiles store path|microvm.credentialFiles.token = "/nix/store/00000000000000000000000000000000-token": it is in the Nix store|G {microvm.credentialFiles.token = "/nix/store/00000000000000000000000000000000-token";}
INLINE

  # Golden files: what each of these cases makes of its VMs, byte for byte
  # (the launch spec and the drop-in). A change to the module that changes
  # the spec of an existing configuration changes its golden file, and with
  # it every running VM at the next switch. VMWARDEN_UPDATE_GOLDEN=1
  # rewrites them (review the diff).
  for case in $GOLDEN_CASES; do
    if nix-instantiate --eval --strict --json tests/nix/golden.nix \
      --arg modules "$(modules "$top/tests/nix/cases/$case.nix")" >"$work/golden.json" 2>"$work/e"; then
      if out=$(python3 - "$work/golden.json" "tests/nix/golden/$case" "${VMWARDEN_UPDATE_GOLDEN:-}" <<'PY'
import json, os, sys
got, d, update = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
if update:
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    for name, text in got.items():
        open(os.path.join(d, name), "w").write(text)
    print(f"rewrote {len(got)} file(s)")
    sys.exit(0)
want = {f: open(os.path.join(d, f)).read() for f in os.listdir(d)} if os.path.isdir(d) else {}
bad = [f"{n}: {'missing in ' + d if n not in want else 'not produced' if n not in got else 'differs'}"
       for n in sorted(set(got) | set(want)) if got.get(n) != want.get(n)]
for n in sorted(set(got) & set(want)):
    if got[n] != want[n] and n.endswith(".json"):
        a, b = json.loads(want[n]), json.loads(got[n])
        bad += [f"  {n} field {k}: golden {json.dumps(a.get(k))}, now {json.dumps(b.get(k))}"
                for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
print("\n".join(bad) if bad else ", ".join(sorted(got)))
sys.exit(1 if bad else 0)
PY
      ); then
        ok "golden $case: $out"
      else
        echo "$out"
        bad "golden $case: differs from tests/nix/golden/$case (VMWARDEN_UPDATE_GOLDEN=1 rewrites it; review the diff)"
      fi
    else
      cat "$work/e"
      bad "golden $case does not evaluate"
    fi
  done

  # `ssh vsock/<cid>` (guest-vsock-ssh, whose specs the golden files
  # show): the one QEMU guest with vsock.ssh.enable whose host chose the
  # "user" backend gets a warning saying what reaches it instead, no other
  # VM does, and a host with a "vhost" VM loads vhost_vsock at boot (one
  # without does not).
  if out=$(ev config.warnings "$top/tests/nix/cases/guest-vsock-ssh.nix" 2>"$work/e") &&
    mods=$(ev report.boot.kernelModules "$top/tests/nix/cases/guest-vsock-ssh.nix" 2>>"$work/e") &&
    none=$(ev report.boot.kernelModules "$top/tests/nix/cases/two-vms.nix" 2>>"$work/e") &&
    why=$(python3 - "$out" "$mods" "$none" <<'PY'
import json, sys
w, mods, none = (json.loads(a) for a in sys.argv[1:4])
bad = []
if len(w) != 1: bad.append(f"{len(w)} warnings, not 1: {w}")
elif not (w[0].startswith('vmwarden.vms.shellu.vsock.backend = "user": the guest enables microvm.vsock.ssh')
          and "`ssh vsock/43`" in w[0] and "`ssh vsock-mux/run/vmwarden/shellu/control/vsock.sock`" in w[0]):
    bad.append(f"the warning does not name the VM, its CID and the socket: {w[0]}")
if "vhost_vsock" not in mods: bad.append(f"boot.kernelModules lacks vhost_vsock: {mods}")
if "vhost_vsock" in none: bad.append(f"two-vms (no vhost backend) loads vhost_vsock: {none}")
print("; ".join(bad))
sys.exit(1 if bad else 0)
PY
    ); then
    ok "vsock ssh: one warning, for shellu (host chose \"user\"), none for shell (vhost) or shellch (cloud-hypervisor); vhost_vsock loaded at boot only with a vhost VM"
  else
    cat "$work/e"
    echo "$why"
    bad "vsock ssh: warnings or boot.kernelModules not as expected"
  fi

  # A read-only share the guest mounts without nosuid,nodev
  # (guest-ro-share-nosuid): one warning, naming the VM, the share and the
  # line that fixes it; none for the guest that has the line.
  if out=$(ev config.warnings "$top/tests/nix/cases/guest-ro-share-nosuid.nix" 2>"$work/e") &&
    why=$(python3 - "$out" <<'PY'
import json, sys
w = json.loads(sys.argv[1])
bad = []
if len(w) != 1: bad.append(f"{len(w)} warnings, not 1: {w}")
elif not (w[0].startswith('vmwarden.vms.plain.guest: the guest mounts the read-only share "ro-store"')
          and 'fileSystems."/nix/.ro-store".options = ["nosuid" "nodev"];' in w[0]):
    bad.append(f"the warning does not name the VM, the share and the fix: {w[0]}")
print("; ".join(bad))
sys.exit(1 if bad else 0)
PY
    ); then
    ok "read-only share without nosuid,nodev in the guest: one warning, for plain, none for hardened or the writable share"
  else
    cat "$work/e"
    echo "$why"
    bad "read-only share without nosuid,nodev: warnings not as expected"
  fi

  # The shutdown's hibernation with no VM allowing hibernation: one warning
  # saying what to set; none once a VM allows it.
  if out=$(ev config.warnings "$top/tests/nix/cases/hibernate-on-shutdown.nix" 2>"$work/e") &&
    out2=$(ev config.warnings "$top/tests/nix/cases/hibernate-on-shutdown-allowed.nix" 2>>"$work/e") &&
    [ "$out2" = "[]" ] &&
    python3 -c 'import json, sys; w = json.loads(sys.argv[1]); sys.exit(not (len(w) == 1 and w[0].startswith("vmwarden.hibernateOnShutdown.enable is set, but no VM has hibernate.allowed = true")))' "$out"; then
    ok "hibernateOnShutdown without a VM that allows hibernation: one warning naming the option to set; none with one"
  else
    cat "$work/e"
    echo "$out / $out2"
    bad "hibernateOnShutdown: warnings not as expected"
  fi

  # The stand-in for microvm.nix's guest module declares the options
  # microvm.nix declares, with its defaults.
  step "microvm.nix comparison"
  if [ -n "${MICROVM_NIX_SRC:-}" ]; then
    if out=$(nix-instantiate --eval --strict --json tests/nix/guests/compare.nix --arg src "$MICROVM_NIX_SRC" --arg libPath "$NIXPKGS_LIB" 2>&1) &&
      [ "$out" = '{"defaultsDiffer":[],"onlyInMicrovmNix":[],"onlyInStandIn":[]}' ]; then
      ok "tests/nix/guests: the stand-in has microvm.nix's options and defaults ($MICROVM_NIX_SRC)"
    else
      echo "$out"
      bad "tests/nix/guests: the stand-in differs from microvm.nix ($MICROVM_NIX_SRC)"
    fi
  fi

  step "microvm.nix host module beside vmwarden"
  # vmwarden beside microvm.nix's real host module (tests/nix/both-hosts.nix):
  # with vmwarden.unitPrefix = "vmwarden" each module keeps its own template
  # and target and no unit name is defined by both; a VM name in both
  # modules, and the default prefix, are refused with a message naming them.
  if [ -n "${MICROVM_NIX_SRC:-}" ]; then
    both() { nix-instantiate --eval --strict --json tests/nix/both-hosts.nix --arg microvmSrc "$MICROVM_NIX_SRC" --arg libPath "$NIXPKGS_LIB" -A result "$@"; }
    if both >"$work/both.json" 2>"$work/e" && both --arg claimTwice true >"$work/twice.json" 2>>"$work/e" &&
      both --argstr prefix microvm >"$work/same.json" 2>>"$work/e" &&
      out=$(python3 - "$work/both.json" "$work/twice.json" "$work/same.json" <<'PY'
import json, sys
r, twice, same = (json.load(open(p)) for p in sys.argv[1:4])
m, v, b = r["microvm"], r["vmwarden"], r["both"]
bad = []
for k in ("services", "targets", "units"):
    shared = sorted(set(m[k]) & set(v[k]))
    if shared: bad.append(f"{k} defined by both modules: {shared}")
    if sorted(b[k]) != sorted(set(m[k]) | set(v[k])): bad.append(f"{k} of both together is not the union of each alone: {b[k]}")
want = {"microvm@.service", "microvms.target", "vmwarden@.service", "vmwarden-vms.target", "microvm@legacy.service", "vmwarden@web.service"}
if not want <= set(b["units"]): bad.append(f"missing units: {sorted(want - set(b['units']))}")
if b["targetWants"] != {"microvms": ["microvm@legacy.service"], "vmwarden-vms": ["vmwarden@web.service"]}: bad.append(f"target wants {b['targetWants']}")
for name, e in (("microvm", m), ("vmwarden", v), ("both", b)):
    if e["failed"]: bad.append(f"{name}: assertions failed: {e['failed']}")
f = twice["both"]["failed"]
if not any('VM "web" is claimed by both vmwarden.vms.web and microvm.nix\'s microvm.vms.web' in x for x in f): bad.append(f"a VM in both modules: {f}")
f = same["both"]["failed"]
if not any("both define microvm@.service and microvms.target; set vmwarden.unitPrefix = \"vmwarden\"" in x for x in f): bad.append(f"the default prefix beside microvm.nix: {f}")
if same["vmwarden"]["failed"] or same["microvm"]["failed"]: bad.append("each module alone must evaluate")
print("; ".join(bad) if bad else f"{len(b['units'])} units, {len(set(m['units']) & set(v['units']))} shared")
sys.exit(1 if bad else 0)
PY
      ); then
      ok "both host modules (microvm.nix at $MICROVM_NIX_SRC, vmwarden.unitPrefix = \"vmwarden\"): two templates, two targets, $out; a VM in both and the shared default names refused"
    else
      cat "$work/e"
      echo "${out:-}"
      bad "both host modules on one host (tests/nix/both-hosts.nix)"
    fi
  elif [ "${CI:-}" = true ]; then
    bad "vmwarden beside microvm.nix's host module: MICROVM_NIX_SRC is not set (CI needs it)"
  else
    echo "NOT RUN: vmwarden beside microvm.nix's host module (MICROVM_NIX_SRC is not set)"
  fi

  step "module evaluation: packages, activation, parity"
  # mkfs.ext4 for created images: in the system profile when a VM creates
  # an ext4 image (shares-vsock does), not otherwise (two-vms).
  if a=$(ev config.environment.systemPackages "$top/tests/nix/cases/shares-vsock.nix" 2>"$work/e") &&
    b=$(ev config.environment.systemPackages "$top/tests/nix/cases/two-vms.nix" 2>>"$work/e") &&
    grep -q -- '-e2fsprogs' <<<"$a" && ! grep -q -- '-e2fsprogs' <<<"$b"; then
    ok "e2fsprogs: in systemPackages with a created ext4 image, not without"
  else
    cat "$work/e"
    bad "e2fsprogs: systemPackages ($a | $b)"
  fi

  # Removed VMs: the activation snippet lists state and runtime directories
  # without a configured VM (two-vms configures web and batch), and only
  # those; it reads, and changes nothing.
  if ev config.system.activationScripts.vmwarden-removed.text "$top/tests/nix/cases/two-vms.nix" 2>"$work/e" |
    python3 -c 'import json,sys; sys.stdout.write(json.load(sys.stdin))' >"$work/removed.sh"; then
    r="$work/removed"
    mkdir -p "$r/state/web" "$r/state/gone" "$r/state/.principals" "$r/run/batch" "$r/run/gone" "$r/run/old"
    ln -s /etc "$r/state/link"
    sed -i "s|vmwarden_state=/var/lib/vmwarden vmwarden_run=/run/vmwarden|vmwarden_state=$r/state vmwarden_run=$r/run|" "$work/removed.sh"
    before=$(find "$r" -printf '%p %m %s\n' | sort | sha256sum)
    got=$(bash -eu "$work/removed.sh" 2>&1 | sed "s|$r|R|g")
    want="vmwarden: VM gone is no longer configured; its state is in R/state/gone: 'vmwarden purge gone' deletes it (after a backup of what you want to keep)
vmwarden: VM gone is no longer configured; 'vmwarden reap --apply' removes R/run/gone
vmwarden: VM old is no longer configured; 'vmwarden reap --apply' removes R/run/old"
    if [ "$got" = "$want" ] && [ "$before" = "$(find "$r" -printf '%p %m %s\n' | sort | sha256sum)" ]; then
      ok "removed VMs: the activation snippet reports gone/ and old/ only, and changes nothing"
    else
      printf '%s\n--- want\n%s\n' "$got" "$want"
      bad "removed VMs: activation snippet output"
    fi
  else
    cat "$work/e"
    bad "the removed-VM activation snippet does not evaluate"
  fi

  # A host overrides keys of the unit data with lib.mkForce; the harness's
  # systemd.globalEnvironment (TZDIR, LOCALE_ARCHIVE, as on NixOS) reaches a
  # host's own service but none of vmwarden's (parity below shows the same
  # for every unit: render-unit has no Environment= line).
  if ev unitTexts "$top/tests/nix/cases/override.nix" >"$work/override.json" 2>"$work/e"; then
    if out=$(python3 - "$work/override.json" <<'PY'
import json, sys
u = json.load(open(sys.argv[1]))
want = {
    "microvm@.service": ["KillMode=control-group", "After=network-online.target", 'Environment="TZDIR=/etc/zoneinfo"'],
    "probe.service": ['Environment="TZDIR=/nix/store/', 'Environment="LOCALE_ARCHIVE=/nix/store/'],
}
bad = [f"{n}: no line starting {w!r}" for n, ws in want.items() for w in ws
       if not any(line.startswith(w) for line in u[n].splitlines())]
bad += [f"{n}: has {line!r}" for n in ("microvm@.service", "microvm@web.service", "vmwarden-reap-report.service")
        for line in u[n].splitlines()
        if line.startswith("KillMode=mixed") or line.startswith('Environment="LOCALE_ARCHIVE') or line.startswith("After=network.target")]
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
    ); then
      ok "override: lib.mkForce replaces data keys (KillMode=, After=, TZDIR); globalEnvironment reaches probe.service, not vmwarden's units"
    else
      echo "$out"
      bad "override: mkForce or globalEnvironment"
    fi
  else
    cat "$work/e"
    bad "override does not evaluate"
  fi

  # The flake's outputs, evaluated with stub packages; its module on a host.
  if out=$(nix-instantiate --eval --strict --json tests/nix/flake-eval.nix -A problems 2>&1) && [ "$out" = "[]" ]; then
    ok "flake.nix: packages, nixosModules.default (x86_64 + aarch64), checks, apps, devShells, source filter"
  else
    echo "$out"
    bad "flake.nix outputs (tests/nix/flake-eval.nix)"
  fi

  # Specs: exactly the contract's fields, and accepted by the launcher's
  # own validation (render-unit --dropin runs Spec::read + Spec::validate).
  two="$top/tests/nix/cases/two-vms.nix"
  for vm in web batch; do
    if ev "config.environment.etc.\"vmwarden/vms/$vm.json\".source.text" "$two" 2>"$work/e" |
      python3 -c 'import json,sys; sys.stdout.write(json.load(sys.stdin))' >"$work/$vm.json"; then
      if out=$(python3 tests/nix/units.py spec "$work/$vm.json"); then ok "spec $vm: ${out#ok   }"; else
        echo "$out"
        bad "spec $vm"
      fi
    else
      cat "$work/e"
      bad "spec $vm does not evaluate"
    fi
  done

  # The module's units with the package at the stub directory: verify.
  printf '{lib, ...}: {vmwarden.package = lib.mkForce {type = "derivation"; name = "vmwarden"; outPath = "%s";};}\n' "$stubs" >"$work/stub-package.nix"
  mu="$work/module-units"
  mkdir -p "$mu"
  if ev checked.systemd.units "$two" "$work/stub-package.nix" >"$work/units.json" 2>"$work/e" &&
    python3 tests/nix/units.py write "$work/units.json" "$mu" >/dev/null; then
    for u in "microvm@.service" "microvm@web.service" "microvm@batch.service" microvms.target vmwarden-reap-report.service; do
      verify "(module) $u" "$mu/$u"
    done
    e_n=$(exposure "$mu/microvm@.service")
    echo "systemd-analyze security --offline=true: module microvm@.service ${e_n:-?}, with the web drop-in $(exposure "$mu/microvm@web.service")"
  else
    cat "$work/e"
    bad "module units do not evaluate"
  fi

  # The three fixed units are data (units/*.toml) that both renderers read.
  # Both renderings of the repo's data agree key by key, and one key edited
  # in a copy of the data changes both renderings, and only that key.
  if [ -n "$vmw" ] && [ -s "$work/units.json" ]; then
    text() { python3 -c 'import json,sys; sys.stdout.write(json.load(open(sys.argv[1]))[sys.argv[2]]["text"])' "${2:-$work/units.json}" "$1"; }
    ed="$work/edited"
    mkdir -p "$ed"
    cp -r modules units "$ed/"
    edit() { # edit FILE OLD NEW: replace the one line OLD of the copied data
      python3 -c 'import sys
p, a, b = sys.argv[1:]
s = open(p).read()
assert s.count(a + "\n") == 1, (p, a)
open(p, "w").write(s.replace(a + "\n", b + "\n"))' "$ed/units/$1" "$2" "$3"
    }
    if edit "microvm@.service.toml" 'TimeoutStopSec = 150' 'TimeoutStopSec = 151' &&
      edit "vmwarden-reap-report.service.toml" 'UMask = "0077"' 'UMask = "0027"' &&
      edit "microvms.target.toml" 'Description = "vmwarden microVMs"' 'Description = "vmwarden microVMs (edited)"' &&
      nix-instantiate --eval --strict --json "$H" --arg modules "[ $ed/modules/default.nix $top/tests/nix/support.nix $two $work/stub-package.nix ]" \
        --arg extraPkgNames '["vmwarden"]' -A checked.systemd.units >"$work/units-edited.json" 2>"$work/e" &&
      "$vmw" render-unit --units-dir "$ed/units" --bin-dir "$stubs/bin" >"$work/edited-microvm@.service" &&
      "$vmw" render-unit --units-dir "$ed/units" --reap-report --bin-dir "$stubs/bin" >"$work/edited-vmwarden-reap-report.service" &&
      "$vmw" render-unit --units-dir "$ed/units" --target >"$work/edited-microvms.target"; then
      onekey() { # onekey UNIT KIND SECTION KEY VALUE
        text "$1" >"$work/nix-orig"
        text "$1" "$work/units-edited.json" >"$work/nix-edited"
        if out=$(python3 tests/nix/units.py onekey "$work/nix-orig" "$ru/$1" "$work/nix-edited" "$work/edited-$1" "$2" "$3" "$4" "$5"); then
          ok "$1 from units/: module and render-unit agree key by key; ${out#ok   $2: }"
        else
          echo "$out"
          bad "$1 from units/: the module and render-unit differ, or an edited key did not change both"
        fi
      }
      onekey "microvm@.service" template Service TimeoutStopSec 151
      onekey "vmwarden-reap-report.service" reap Service UMask 0027
      onekey "microvms.target" target Unit Description "vmwarden microVMs (edited)"
    else
      cat "$work/e"
      bad "units from an edited copy of units/ do not render"
    fi
    # Negative control: one changed value must be found.
    sed 's/^KillMode=mixed$/KillMode=control-group/' "$ru/microvm@.service" >"$work/changed.service"
    text "microvm@.service" >"$work/nix-unit"
    if out=$(python3 tests/nix/units.py parity "$work/nix-unit" "$work/changed.service" template) ||
      ! grep -q "KillMode" <<<"$out"; then
      echo "$out"
      bad "parity check misses a changed KillMode="
    else
      ok "parity check catches a changed KillMode="
    fi
    # vmwarden.metrics.textfile (tests/nix/cases/metrics.nix: the directory
    # from node-exporter's flags, interval 1min) and `render-unit
    # --metrics-service/--metrics-timer` with the same directory and
    # interval: the same two units, key by key; both verify, and the
    # service's exposure stays within the template's bound.
    if ev checked.systemd.units "$top/tests/nix/cases/metrics.nix" "$work/stub-package.nix" >"$work/units-metrics.json" 2>"$work/e" &&
      python3 tests/nix/units.py write "$work/units-metrics.json" "$work/metrics-units" >/dev/null &&
      "$vmw" render-unit --metrics-service --textfile-dir /var/lib/node-exporter-textfiles --bin-dir "$stubs/bin" >"$ru/vmwarden-metrics.service" &&
      "$vmw" render-unit --metrics-timer --interval 1min --bin-dir "$stubs/bin" >"$ru/vmwarden-metrics.timer"; then
      for u in vmwarden-metrics.service vmwarden-metrics.timer; do
        text "$u" "$work/units-metrics.json" >"$work/nix-unit"
        if out=$(python3 tests/nix/units.py parity "$work/nix-unit" "$ru/$u" reap); then
          ok "parity $u (vmwarden.metrics.textfile): ${out#ok   }"
        else
          echo "$out"
          bad "parity $u: the module and render-unit differ"
        fi
        verify "(module) $u" "$work/metrics-units/$u"
        verify "(render-unit) $u" "$ru/$u"
      done
      e_x=$(exposure "$ru/vmwarden-metrics.service")
      if [ -n "$e_x" ] && awk -v e="$e_x" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e <= m) }'; then
        ok "vmwarden-metrics.service exposure $e_x <= $MAX_EXPOSURE"
      else
        bad "vmwarden-metrics.service exposure ${e_x:-unknown} > $MAX_EXPOSURE"
      fi
    else
      cat "$work/e"
      bad "the metrics units do not evaluate or render"
    fi
    # vmwarden.hibernateOnShutdown (tests/nix/cases/hibernate-on-shutdown.nix:
    # 60 s per VM, two VMs, one not autostarted) and `render-unit
    # --hibernate-on-shutdown --hibernate-timeout 60`: the same unit key by
    # key but for the module's After= on each declared VM; the module's
    # names both VMs; both verify; a switch neither restarts nor, on
    # removal, stops it (that stop would hibernate every VM).
    if ev checked.systemd.units "$top/tests/nix/cases/hibernate-on-shutdown.nix" "$work/stub-package.nix" >"$work/units-hib.json" 2>"$work/e" &&
      python3 tests/nix/units.py write "$work/units-hib.json" "$work/hib-units" >/dev/null &&
      "$vmw" render-unit --hibernate-on-shutdown --hibernate-timeout 60 --bin-dir "$stubs/bin" >"$ru/vmwarden-hibernate-on-shutdown.service"; then
      u=vmwarden-hibernate-on-shutdown.service
      text "$u" "$work/units-hib.json" >"$work/nix-unit"
      if out=$(python3 tests/nix/units.py parity "$work/nix-unit" "$ru/$u" shutdown); then
        ok "parity $u (vmwarden.hibernateOnShutdown): ${out#ok   }"
      else
        echo "$out"
        bad "parity $u: the module and render-unit differ"
      fi
      if grep -q '^After=.*microvm@batch.service' "$work/nix-unit" && grep -q '^After=.*microvm@web.service' "$work/nix-unit" &&
        grep -q '^X-RestartIfChanged=false' "$work/nix-unit" && grep -q '^X-StopOnRemoval=false' "$work/nix-unit" &&
        grep -q '^ExecStop=.*vmwarden hibernate-all --timeout 60$' "$work/nix-unit"; then
        ok "$u: after every declared VM, not restarted or stopped by a switch, 60 s per VM"
      else
        cat "$work/nix-unit"
        bad "$u: After= of each VM, X-RestartIfChanged/X-StopOnRemoval=false or the deadline missing"
      fi
      verify "(module) $u" "$work/hib-units/$u"
      verify "(render-unit) $u" "$ru/$u"
    else
      cat "$work/e"
      bad "the hibernate-on-shutdown unit does not evaluate or render"
    fi
    # The unit's limits (tests/nix/cases/resources.nix) in a VM's drop-in:
    # it verifies, and the template with it stays within the exposure bound.
    if ev checked.systemd.units "$top/tests/nix/cases/resources.nix" "$work/stub-package.nix" >"$work/units-resources.json" 2>"$work/e" &&
      python3 tests/nix/units.py write "$work/units-resources.json" "$work/resources-units" >/dev/null; then
      verify "(module) microvm@web.service with resources" "$work/resources-units/microvm@web.service"
      e_l=$(exposure "$work/resources-units/microvm@web.service")
      if [ -n "$e_l" ] && awk -v e="$e_l" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(e <= m) }'; then
        ok "microvm@web.service with resources: exposure $e_l <= $MAX_EXPOSURE"
      else
        bad "microvm@web.service with resources: exposure ${e_l:-unknown} > $MAX_EXPOSURE"
      fi
    else
      cat "$work/e"
      bad "the resources case's units do not evaluate"
    fi
    # The per-VM drop-in stays code on both sides (modules/lib.nix `dropin`,
    # launcher/src/unit.rs `dropin`): module vs render-unit, key by key.
    par() { # par LABEL KIND NIXUNIT RUSTFILE [opts]
      local label=$1 kind=$2 nixu=$3 rust=$4
      shift 4
      text "$nixu" >"$work/nix-unit"
      if out=$(python3 tests/nix/units.py parity "$work/nix-unit" "$rust" "$kind" "$@"); then
        ok "parity $label: ${out#ok   }"
      else
        echo "$out"
        bad "parity $label: the module and render-unit differ"
      fi
    }
    # vmwarden.unitPrefix = "vmwarden" and `render-unit --prefix vmwarden`
    # (both from units/unit-names.toml): the same units under the other
    # names, key by key, and no name of microvm.nix's left in them.
    printf '{vmwarden.unitPrefix = "vmwarden";}\n' >"$work/prefix.nix"
    if ev checked.systemd.units "$two" "$work/stub-package.nix" "$work/prefix.nix" >"$work/units-prefix.json" 2>"$work/e" &&
      "$vmw" render-unit --prefix vmwarden --bin-dir "$stubs/bin" >"$ru/vmwarden@.service" &&
      "$vmw" render-unit --prefix vmwarden --reap-report --bin-dir "$stubs/bin" >"$ru/prefix-vmwarden-reap-report.service" &&
      "$vmw" render-unit --prefix vmwarden --target >"$ru/vmwarden-vms.target"; then
      pre() { # pre KIND NIXUNIT RUSTFILE
        text "$2" "$work/units-prefix.json" >"$work/nix-unit"
        if out=$(python3 tests/nix/units.py parity "$work/nix-unit" "$3" "$1") && ! grep -qE 'microvm@|microvms\.target' "$work/nix-unit" "$3"; then
          ok "parity --prefix vmwarden $2: ${out#ok   }"
        else
          echo "$out"
          grep -HE 'microvm@|microvms\.target' "$work/nix-unit" "$3"
          bad "parity --prefix vmwarden $2: the module and render-unit differ, or a microvm.nix name is left"
        fi
      }
      pre template "vmwarden@.service" "$ru/vmwarden@.service"
      pre reap "vmwarden-reap-report.service" "$ru/prefix-vmwarden-reap-report.service"
      pre target "vmwarden-vms.target" "$ru/vmwarden-vms.target"
      python3 -c 'import json,sys; u=json.load(open(sys.argv[1])); sys.exit(0 if {"vmwarden@web.service","vmwarden@batch.service"} <= set(u) and not any(n.startswith("microvm") for n in u) else 1)' "$work/units-prefix.json" &&
        ok "vmwarden.unitPrefix = \"vmwarden\": drop-ins vmwarden@web, vmwarden@batch; no microvm* unit" ||
        bad "vmwarden.unitPrefix = \"vmwarden\": unit names $(python3 -c 'import json,sys; print(sorted(json.load(open(sys.argv[1]))))' "$work/units-prefix.json")"
    else
      cat "$work/e"
      bad "units with vmwarden.unitPrefix = \"vmwarden\" do not evaluate or render"
    fi
    for vm in web batch; do
      if "$vmw" render-unit --dropin "$vm" --spec "$work/$vm.json" >"$ru/$vm.conf" 2>"$work/e"; then
        par "microvm@$vm drop-in" dropin "microvm@$vm.service" "$ru/$vm.conf" --cred-dir /etc/vmwarden/credentials --vm "$vm"
      else
        cat "$work/e"
        bad "render-unit --dropin $vm (the launcher refused the module's spec)"
      fi
    done
    # The golden guests (shares, disks, vsock, extra_args and the
    # microvm.nix-shaped ones): the launcher accepts every spec the module
    # wrote, and renders the same drop-in.
    for g in tests/nix/golden/*/*.json; do
      vm=$(basename "$g" .json)
      case=$(basename "$(dirname "$g")")
      [ "$case" = two-vms ] && continue
      if "$vmw" render-unit --dropin "$vm" --spec "$g" >"$ru/$case-$vm.conf" 2>"$work/e"; then
        if out=$(python3 tests/nix/units.py parity "${g%.json}.conf" "$ru/$case-$vm.conf" dropin --cred-dir /etc/vmwarden/credentials --vm "$vm"); then
          ok "parity golden $case/$vm drop-in: ${out#ok   }"
        else
          echo "$out"
          bad "parity golden $case/$vm drop-in: the module and render-unit differ"
        fi
      else
        cat "$work/e"
        bad "render-unit --dropin $vm for golden $case (the launcher refused the module's spec)"
      fi
    done
  else
    bad "parity: no vmwarden binary or no module units"
  fi
fi

close_section
echo "== sections"
printf '   %s\n' "${sections[@]}"
echo "nix: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
