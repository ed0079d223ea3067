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
TOOLS=${VMWARDEN_NIX_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/vmwarden/nix-tools}
work=$(mktemp -d /tmp/vmwarden-nix.XXXXXX)
trap 'rm -rf "$work"' EXIT

pass=0
fail=0
ok() {
  pass=$((pass + 1))
  echo "ok   $*"
}
bad() {
  fail=$((fail + 1))
  echo "FAIL $*"
}
step() { echo "== $*"; }
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
      --arg extraPkgNames '["vmwarden" "virtiofsd" "vhost-device-vsock"]' -A "$attr"
  }
  # Cases whose specs and drop-ins are compared with tests/nix/golden/CASE/.
  GOLDEN_CASES="two-vms"
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
type-error|option `vmwarden.vms.web.vcpus' is not of type `integer between 1 and 255
unknown-option|The option `vmwarden.vms.web.vcpu' does not exist
relative-path|option `vmwarden.vms.web.kernel' is not of type `normalised absolute path
comma-disk|is not of type `normalised absolute path
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
unsupported-hypervisor|vmwarden.vms.web.credentials: cloud-hypervisor cannot receive credentials safely
firecracker-tap|vmwarden.vms.web.interfaces: firecracker opens taps by name
duplicate-tap|vmwarden: tap "vmw-web0" is used by several VMs (db, web)
multicast-mac|mac "01:00:5e:00:00:01" of vmw-web0 is not a unicast address
zero-mac|mac "00:00:00:00:00:00" of vmw-web0 is not a unicast address
bad-bridge|bridge "vmw-br0" of vmw-web0 is not a bridge the launcher accepts
override|ok
microvm-nix|vmwarden and microvm.nix's host module both define microvm@.service
CASES

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
    for vm in web batch; do
      if "$vmw" render-unit --dropin "$vm" --spec "$work/$vm.json" >"$ru/$vm.conf" 2>"$work/e"; then
        par "microvm@$vm drop-in" dropin "microvm@$vm.service" "$ru/$vm.conf" --cred-dir /etc/vmwarden/credentials --vm "$vm"
      else
        cat "$work/e"
        bad "render-unit --dropin $vm (the launcher refused the module's spec)"
      fi
    done
  else
    bad "parity: no vmwarden binary or no module units"
  fi
fi

echo "nix: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
