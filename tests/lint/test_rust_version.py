#!/usr/bin/env python3
"""tests/lint/rust_version.py refuses what it must: a lockfile that needs a
newer Rust than the claim (fixtures/rust-version-too-low: rust-version 1.80,
uuid 1.29.3 locked, which declares 1.89.0), a claim newer than the pinned
nixpkgs' rustc, and a flake.lock pinning another nixpkgs than the data file
was read at; and the repository itself passes."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "rust_version.py")
FIXTURE = os.path.join(HERE, "fixtures", "rust-version-too-low")
DATA = os.path.join(HERE, "nixpkgs-rustc.toml")


def run(*args):
    r = subprocess.run([sys.executable, CHECK, *args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def expect(label, rc_out, rc, needle):
    got_rc, out = rc_out
    if got_rc != rc or needle not in out:
        print(f"FAIL {label}: exit {got_rc} (want {rc}), output lacks {needle!r}:\n{out}")
        return False
    print(f"ok   {label}")
    return True


def main():
    ok = True
    ok &= expect("the repository's claim holds", run(), 0, ": ok")
    ok &= expect("a locked dependency needing more fails",
                 run("--manifest", FIXTURE), 1,
                 "uuid 1.29.3 (locked) declares rust-version 1.89.0, newer than the claim 1.80")
    with tempfile.TemporaryDirectory() as t:
        old = os.path.join(t, "nixpkgs-rustc.toml")
        with open(DATA) as f:
            text = f.read()
        with open(old, "w") as f:
            f.write(text.replace('rustc = "1.91.1"', 'rustc = "1.85.0"'))
        ok &= expect("a claim newer than the pinned nixpkgs' rustc fails",
                     run("--nixpkgs-rustc", old), 1, "is newer than rustc 1.85.0 of the pinned nixpkgs")
        lock = os.path.join(t, "flake.lock")
        shutil.copy(os.path.join(HERE, "..", "..", "flake.lock"), lock)
        with open(lock) as f:
            text = f.read()
        with open(lock, "w") as f:
            f.write(text.replace("8fd9daa3db09ced9700431c5b7ad0e8ba199b575", "0" * 40))
        ok &= expect("another pinned nixpkgs than the data was read at fails",
                     run("--flake-lock", lock), 1, "read rustc's version at " + "0" * 40)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
