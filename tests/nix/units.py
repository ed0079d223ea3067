#!/usr/bin/env python3
"""Helpers for tests/nix/run.sh (module-evaluation stage).

  units.py write UNITS_JSON DIR
      Write the module's rendered units (harness `checked.systemd.units`)
      into DIR the way NixOS lays them out (drop-ins as NAME.d/overrides.conf).

  units.py spec SPEC_JSON_FILE
      Check a module-written launch spec against the contract in
      docs/launch-spec.md: exactly these fields, these types.

  units.py parity NIX_TEXT_FILE RUST_TEXT_FILE KIND [--store-bin P --bin B]
              [--cred-dir D --vm NAME]
      Compare a unit rendered by the module with `vmwarden render-unit`'s,
      key by key: same sections, same keys, same values in the same order.
      KIND: template | reap | target | dropin | shutdown. NixOS-only keys (X-*) are
      ignored; for `target`, NixOS's Wants= (the autostart VMs) and the
      [Install] section (NixOS makes symlinks instead) are compared as
      documented differences; for `dropin`, LoadCredential= sources differ
      by design (the module points at the configured file, render-unit at
      D/NAME/CRED), so only the credential names are compared for equality
      and render-unit's sources must be D/NAME/CRED; for `shutdown`, the
      module's After= adds every declared VM's unit (render-unit's host adds
      them with `systemctl edit`), compared as a documented difference.

  units.py onekey NIX_ORIG RUST_ORIG NIX_EDIT RUST_EDIT KIND SECTION KEY VALUE
      One key of a unit's data (units/*.toml) was changed to VALUE in a copy:
      the module's and render-unit's renderings of the original data agree
      (parity), so do those of the edited copy, and each renderer's output
      changed in exactly [SECTION] KEY, to VALUE.
"""
import json
import os
import sys


def parse(text):
    """section -> key -> [values], in file order; comments/blank skipped."""
    out = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        if not sep or section is None:
            raise SystemExit(f"unparsable unit line: {raw!r}")
        out[section].setdefault(key, []).append(value)
    return out


def drop_nixos_only(u):
    return {s: {k: v for k, v in keys.items() if not k.startswith("X-")} for s, keys in u.items()}


def cmd_write(units_json, outdir):
    units = json.load(open(units_json))
    for name, u in units.items():
        path = os.path.join(outdir, u["file"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(u["text"])
        print(path)


CONTRACT = {
    "version": int, "name": str, "principal": dict, "hypervisor": dict,
    "vcpus": int, "memory_mib": int, "kernel": str, "initrd": str,
    "cmdline": str, "credentials": list, "disks": list, "interfaces": list,
    "landlock": dict, "keep_on_purge": list,
    # shares, disks, vsock, user networking (the module writes them only when used)
    "shares": list, "virtiofsd": dict, "vsock": dict, "user_network": dict,
    # the host's own tools (written only when on)
    "balloon": dict, "console": bool, "register_with_machined": bool,
    # host devices (written only when there are any)
    "devices": list, "allow_unsafe_interrupts": bool,
    # guest memory (written only when on)
    "mem_merge": bool, "hugepage_mem": bool,
    # the unit's limits (written only when one is set)
    "resources": dict,
    # hibernate and restore (written only when allowed)
    "hibernate": dict,
}
OPTIONAL = {"initrd", "shares", "virtiofsd", "vsock", "user_network", "balloon", "console", "register_with_machined",
            "devices", "allow_unsafe_interrupts", "mem_merge", "hugepage_mem", "resources", "hibernate"}


def type_name(t):
    return " or ".join(x.__name__ for x in t) if isinstance(t, tuple) else t.__name__


def cmd_spec(path):
    spec = json.load(open(path))
    errs = []

    def want(obj, where, fields, optional=()):
        if not isinstance(obj, dict):
            errs.append(f"{where}: not an object")
            return
        extra = set(obj) - set(fields)
        missing = set(fields) - set(obj) - set(optional)
        if extra:
            errs.append(f"{where}: fields not in the contract: {sorted(extra)}")
        if missing:
            errs.append(f"{where}: missing fields: {sorted(missing)}")
        for k, t in fields.items():
            if k in obj and not (isinstance(obj[k], t) and not (t is int and isinstance(obj[k], bool))):
                errs.append(f"{where}.{k}: {obj[k]!r} is not {type_name(t)}")

    want(spec, "spec", CONTRACT, OPTIONAL)
    if spec.get("version") != 1:
        errs.append("spec.version is not 1")
    want(spec.get("principal"), "principal", {"user": str, "group": str})
    want(spec.get("hypervisor"), "hypervisor", {"kind": str, "binary": str, "accel": str, "machine": str, "extra_args": list}, ("extra_args",))
    want(spec.get("landlock"), "landlock", {"mode": str, "read": list, "write": list})
    for i, c in enumerate(spec.get("credentials", [])):
        want(c, f"credentials[{i}]", {"name": str, "source": dict})
        want(c.get("source"), f"credentials[{i}].source", {"systemd": str})
    for i, d in enumerate(spec.get("disks", [])):
        want(d, f"disks[{i}]", {"path": str, "read_only": bool, "format": str, "serial": str, "create": dict,
                                "direct": bool, "discard": bool},
             ("format", "serial", "create", "direct", "discard"))
        if "create" in d:
            want(d["create"], f"disks[{i}].create", {"size_mib": int, "fs_type": str}, ("fs_type",))
    if "hibernate" in spec:
        want(spec["hibernate"], "hibernate", {"allowed": bool, "on_mismatch": str})
    for i, s in enumerate(spec.get("shares", [])):
        want(s, f"shares[{i}]", {"tag": str, "source": str, "proto": str, "read_only": bool})
    for i, d in enumerate(spec.get("devices", [])):
        want(d, f"devices[{i}]", {"bus": str, "path": str, "id": str, "qemu_bus": str, "qemu_properties": list,
                                  "keep_on_vfio_pci": bool},
             ("id", "qemu_bus", "qemu_properties", "keep_on_vfio_pci"))
    if spec.get("allow_unsafe_interrupts") is False:
        errs.append("allow_unsafe_interrupts: written as false (the module leaves it out when off)")
    if "balloon" in spec:
        want(spec["balloon"], "balloon", {"initial_mib": int, "deflate_on_oom": bool})
    if "resources" in spec:
        rf = {"cpu_quota_percent": int, "cpu_weight": int, "memory_max_mib": int, "memory_high_mib": int,
              "io_weight": int, "tasks_max": int, "cpus": str}
        want(spec["resources"], "resources", rf, tuple(rf))
    for k in ("console", "register_with_machined"):
        if spec.get(k) is False:
            errs.append(f"{k}: written as false (the module leaves it out when off)")
    if "virtiofsd" in spec:
        want(spec["virtiofsd"], "virtiofsd", {"binary": str, "thread_pool_size": (int, str)}, ("thread_pool_size",))
    if "vsock" in spec:
        want(spec["vsock"], "vsock", {"cid": int, "backend": str, "binary": str, "notify": bool, "notify_port": int},
             ("binary", "notify", "notify_port"))
    if "user_network" in spec:
        u = spec["user_network"]
        want(u, "user_network", {"binary": str, "id": str, "mac": str, "forward_ports": list}, ("mac", "forward_ports"))
        for i, f in enumerate(u.get("forward_ports", []) if isinstance(u, dict) else []):
            want(f, f"user_network.forward_ports[{i}]", {"from": str, "proto": str, "host": dict, "guest": dict})
            for end in ("host", "guest"):
                want(f.get(end), f"user_network.forward_ports[{i}].{end}", {"address": str, "port": int})
    for i, a in enumerate(spec.get("hypervisor", {}).get("extra_args", [])):
        if not isinstance(a, str):
            errs.append(f"hypervisor.extra_args[{i}]: {a!r} is not str")
    for i, n in enumerate(spec.get("interfaces", [])):
        want(n, f"interfaces[{i}]", {"tap": str, "bridge": str, "mac": str, "vhost": bool, "queues": int,
                                     "type": str, "macvtap": dict},
             ("bridge", "mac", "vhost", "queues", "type", "macvtap"))
        if isinstance(n, dict) and "macvtap" in n:
            want(n["macvtap"], f"interfaces[{i}].macvtap", {"link": str, "mode": str})
    for e in errs:
        print(f"FAIL {path}: {e}")
    if errs:
        sys.exit(1)
    print(f"ok   {os.path.basename(path)}: exactly the contract's fields")


def cmd_parity(nix_file, rust_file, kind, opts, quiet=False):
    nix_text = open(nix_file).read()
    if opts.get("--store-bin"):
        nix_text = nix_text.replace(opts["--store-bin"], opts["--bin"])
    nix = drop_nixos_only(parse(nix_text))
    rust = parse(open(rust_file).read())
    notes = []
    if kind == "target":
        wants = nix.get("Unit", {}).pop("Wants", None)
        notes.append(f"NixOS Wants={wants} (autostart VMs; render-unit: systemctl add-wants)")
        if rust.get("Install") != {"WantedBy": ["multi-user.target"]}:
            return [f"target [Install] is {rust.get('Install')}, want WantedBy=multi-user.target"]
        rust.pop("Install")
    if kind == "shutdown":
        after = nix.get("Unit", {}).get("After", [])
        vms = [u for line in after for u in line.split() if "@" in u and u.endswith(".service")]
        nix["Unit"]["After"] = [" ".join(u for u in line.split() if u not in vms) for line in after]
        notes.append(f"NixOS After= also {vms} (every declared VM)")
        # X-StopOnRemoval=false is in the data (NixOS's switch reads it;
        # systemd ignores X- keys): both print it, and it is checked apart.
        rust = drop_nixos_only(rust)
    if kind == "dropin":
        vm, cred_dir = opts["--vm"], opts["--cred-dir"]
        n = nix.get("Service", {}).pop("LoadCredential", [])
        r = rust.get("Service", {}).pop("LoadCredential", [])
        names_n = [x.split(":", 1)[0] for x in n]
        names_r = [x.split(":", 1)[0] for x in r]
        if names_n != names_r:
            return [f"LoadCredential names differ: module {names_n}, render-unit {names_r}"]
        for x in r:
            c, _, src = x.partition(":")
            if src != f"{cred_dir}/{vm}/{c}":
                return [f"render-unit LoadCredential={x}: want source {cred_dir}/{vm}/{c}"]
        notes.append(f"LoadCredential names {names_n}")
        nix = {s: k for s, k in nix.items() if k}
        rust = {s: k for s, k in rust.items() if k}
    problems = []
    for section in sorted(set(nix) | set(rust)):
        a, b = nix.get(section), rust.get(section)
        if a is None or b is None:
            problems.append(f"[{section}] only in {'render-unit' if a is None else 'the module'}")
            continue
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                problems.append(f"[{section}] {key}: module {a.get(key)} != render-unit {b.get(key)}")
    keys = sum(len(k) for k in nix.values())
    if not problems and not quiet:
        print(f"ok   {kind}: {len(nix)} section(s), {keys} key(s) identical" + (f"; {'; '.join(notes)}" if notes else ""))
    return problems


def changed_keys(a, b):
    """[(section, key)] whose values differ between two parsed units."""
    out = []
    for section in sorted(set(a) | set(b)):
        x, y = a.get(section, {}), b.get(section, {})
        out += [(section, k) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
    return out


def cmd_onekey(nix_orig, rust_orig, nix_edit, rust_edit, kind, section, key, value):
    problems = [f"original data: {p}" for p in cmd_parity(nix_orig, rust_orig, kind, {}, quiet=True)]
    problems += [f"edited data: {p}" for p in cmd_parity(nix_edit, rust_edit, kind, {}, quiet=True)]
    for who, orig, edit in (("module", nix_orig, nix_edit), ("render-unit", rust_orig, rust_edit)):
        a = drop_nixos_only(parse(open(orig).read()))
        b = drop_nixos_only(parse(open(edit).read()))
        changed = changed_keys(a, b)
        if changed != [(section, key)]:
            problems.append(f"{who}: editing [{section}] {key} changed {changed}")
        elif b[section][key] != [value]:
            problems.append(f"{who}: [{section}] {key} is {b[section][key]}, want [{value!r}]")
    if not problems:
        print(f"ok   {kind}: [{section}] {key}={value} in the data changed both renderings, and only that key")
    return problems


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    if args[0] == "write":
        cmd_write(args[1], args[2])
    elif args[0] == "spec":
        cmd_spec(args[1])
    elif args[0] == "parity":
        opts = dict(zip(args[4::2], args[5::2]))
        problems = cmd_parity(args[1], args[2], args[3], opts)
        for p in problems:
            print(f"FAIL {args[3]}: {p}")
        sys.exit(1 if problems else 0)
    elif args[0] == "onekey":
        problems = cmd_onekey(*args[1:9])
        for p in problems:
            print(f"FAIL {args[5]}: {p}")
        sys.exit(1 if problems else 0)
    else:
        raise SystemExit(__doc__)


main()
