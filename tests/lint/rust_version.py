#!/usr/bin/env python3
"""The workspace's `rust-version` is a claim that holds.

  rust_version.py [--manifest DIR] [--nixpkgs-rustc FILE] [--flake-lock FILE]

Fails (exit 1, naming each offender) when
  * a dependency locked in DIR's Cargo.lock declares a newer
    `rust-version` than DIR's claim (`[package]` or `[workspace.package]`
    `rust-version` in DIR/Cargo.toml): the claim would promise a build the
    lockfile cannot give;
  * the claim is newer than the rustc of the nixpkgs that flake.lock pins
    (tests/lint/nixpkgs-rustc.toml, which says where that version was
    read): `nix build` would refuse the package;
  * flake.lock pins another nixpkgs revision than the one that data file
    was read at (move both together).

The dependencies are those `cargo metadata --locked --offline` resolves
for the Linux targets the flake builds (x86_64 and aarch64): what
buildRustPackage compiles. Needs the registry sources cargo has already
fetched (any build of the workspace fetches them); a missing one is an
error, not a pass. Defaults: the repository's root.
"""
import argparse
import json
import os
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGETS = ("x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu")


def version(v):
    """'1.89' / '1.89.0' -> (1, 89, 0)."""
    parts = [int(p) for p in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def claim_of(manifest_dir):
    with open(os.path.join(manifest_dir, "Cargo.toml"), "rb") as f:
        m = tomllib.load(f)
    v = m.get("workspace", {}).get("package", {}).get("rust-version") or m.get("package", {}).get("rust-version")
    if not isinstance(v, str):
        raise SystemExit(f"{manifest_dir}/Cargo.toml: no rust-version to check")
    return v


def locked_packages(manifest_dir):
    """(name, version, rust_version or None) of every locked registry
    package resolved for TARGETS."""
    out = {}
    for t in TARGETS:
        r = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--offline", "--filter-platform", t,
             "--manifest-path", os.path.join(manifest_dir, "Cargo.toml")],
            capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"cargo metadata ({t}) in {manifest_dir} failed (fetch the dependencies first, "
                             f"e.g. cargo fetch --locked):\n{r.stderr.strip()}")
        meta = json.loads(r.stdout)
        ids = {n["id"] for n in meta["resolve"]["nodes"]}
        for p in meta["packages"]:
            if p["id"] in ids and p.get("source"):
                out[(p["name"], p["version"])] = p.get("rust_version")
    return [(n, v, rv) for (n, v), rv in sorted(out.items())]


def check(manifest_dir, rustc_file, flake_lock):
    problems = []
    claim = claim_of(manifest_dir)
    pkgs = locked_packages(manifest_dir)
    needs = [(version(rv), n, v, rv) for n, v, rv in pkgs if rv]
    for _, n, v, rv in sorted(needs, reverse=True):
        if version(rv) > version(claim):
            problems.append(f"{n} {v} (locked) declares rust-version {rv}, newer than the claim {claim}: "
                            f"raise rust-version in {manifest_dir}/Cargo.toml, or lock an older {n}")
    most = max(needs)[3] if needs else "-"
    with open(rustc_file, "rb") as f:
        nix = tomllib.load(f)
    if version(claim) > version(nix["rustc"]):
        problems.append(f"rust-version {claim} is newer than rustc {nix['rustc']} of the pinned nixpkgs "
                        f"({nix['nixpkgs_ref']}, {nix['source']}): nix build cannot build it")
    if flake_lock:
        with open(flake_lock) as f:
            rev = json.load(f)["nodes"]["nixpkgs"]["locked"]["rev"]
        if rev != nix["nixpkgs_rev"]:
            problems.append(f"{flake_lock} pins nixpkgs {rev}, but {rustc_file} was read at {nix['nixpkgs_rev']}: "
                            f"read rustc's version at {rev} and update the file")
    return claim, most, len(pkgs), nix["rustc"], problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", default=ROOT)
    ap.add_argument("--nixpkgs-rustc", default=os.path.join(ROOT, "tests/lint/nixpkgs-rustc.toml"))
    ap.add_argument("--flake-lock", default=os.path.join(ROOT, "flake.lock"))
    a = ap.parse_args()
    claim, most, n, rustc, problems = check(a.manifest, a.nixpkgs_rustc, a.flake_lock)
    for p in problems:
        print(f"rust-version: {p}")
    if problems:
        return 1
    print(f"rust-version: claim {claim}; {n} locked dependencies need at most {most}; "
          f"the pinned nixpkgs has rustc {rustc}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
