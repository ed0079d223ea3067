#!/usr/bin/env python3
"""Fail on an import circle between the crate's top-level parts, and on more
than two imports that run from a lower layer up; on an import circle between
two files of one part (a parent `mod.rs` that composes its children is not a
node: the children may name its re-exports); on a file of `launcher/src`
over MAX_LINES lines; and on a ticket number (the word "issue" followed by a
number) anywhere in the tree: code, tests, scripts, nix and docs name the
feature, commit messages may name the ticket. Each offending file (and
line) is printed.

A part is a top-level module of `launcher/src` (a folder or a file). An
import is any `crate::PART` path in a part's files (use lines and inline
paths alike, tests included: a test module that reaches up is still a
dependency). The layer order below is the architecture (docs/architecture.md);
a part may use any part listed before it.

    python3 tests/lint/layers.py [--graph]
"""
import os
import re
import sys

# Lowest first.
LAYERS = [
    "profile",     # step timestamps (feature step-profile): imports nothing
    "config",      # spec, names, roots: imports nothing
    "host",        # dirs, ownership, mountinfo, procs, net, peer
    "devices",     # PCI (VFIO) and USB devices: checked, taken, given back
    "hypervisor",  # argv/config rendering, QMP and HTTP API clients
    "identity",    # principals and the registry
    "instance",    # lease, intent record, liveness
    "launch",      # the launch sequence and the sandbox
    "control",     # status, wait-ready, stop
    "teardown",    # cleanup, reap, purge, verify-clean
    "status",      # the operator's view: deciding (gather) and rendering
    "unit",        # render-unit
    "error",       # the crate error: composes every part's own error enum
]
MAX_UPWARD = 2
# No file of launcher/src over this many lines.
MAX_LINES = 800
# The word "issue" (any case), then a space, a hyphen or nothing, then a
# digit: a ticket, not a feature.
TICKET_RE = re.compile(r"issue[ -]?[0-9]", re.I)

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SRC = os.path.join(TOP, "launcher", "src")
PATH_RE = re.compile(r"\bcrate::([a-z_]+)")
# `use crate::{a, b::c}` groups
GROUP_RE = re.compile(r"\bcrate::\{([^}]*)\}", re.S)


def part_of(rel):
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def strong_components(nodes, adj):
    """Tarjan: the strongly connected components of more than one node."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(adj.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for p in sorted(nodes):
        if p not in index:
            strong(p)
    return sccs


def use_paths(text):
    """Every `crate::a::b::c` path of a file, `use` groups expanded."""
    out = []
    i = 0
    while True:
        i = text.find("crate::", i)
        if i < 0:
            return out
        if i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
            i += 7
            continue
        i, paths = tree(text, i + 7, [])
        out.extend(paths)


def tree(text, i, prefix):
    """Parse a use tree at text[i:] under `prefix`: (end, [paths])."""
    paths = []
    while True:
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", text[i:])
        if m:
            prefix = prefix + [m.group(1)]
            i += m.end()
            if text.startswith("::", i):
                i += 2
                if text[i:].lstrip().startswith("{"):
                    i = text.index("{", i) + 1
                    while True:
                        i, sub = tree(text, i, prefix)
                        paths.extend(sub)
                        rest = text[i:].lstrip()
                        i = len(text) - len(rest)
                        if rest.startswith(","):
                            i += 1
                            if text[i:].lstrip().startswith("}"):
                                i = text.index("}", i) + 1
                                return i, paths
                            continue
                        if rest.startswith("}"):
                            return i + 1, paths
                        return i, paths
                continue
            return i, paths + [prefix]
        rest = text[i:].lstrip()
        if rest.startswith("*"):
            return len(text) - len(rest) + 1, paths + [prefix]
        return i, paths + ([prefix] if prefix else [])


def module_files():
    """Module path (tuple) -> file, for every file of launcher/src but bin/."""
    mods = {}
    for dirpath, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), SRC)
            if rel.startswith("bin" + os.sep) or rel == "lib.rs":
                continue
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            mods[tuple(parts)] = rel
    return mods


def file_circles():
    """Import circles between two files of one part, mod.rs files aside."""
    mods = module_files()
    adj = {}
    for mod, rel in mods.items():
        text = open(os.path.join(SRC, rel), encoding="utf-8").read()
        for path in use_paths(text):
            # the deepest module the path names
            for n in range(len(path), 0, -1):
                target = mods.get(tuple(path[:n]))
                if target:
                    break
            if not target or target == rel or target.endswith("mod.rs") or rel.endswith("mod.rs"):
                continue
            adj.setdefault(rel, set()).add(target)
    nodes = {r for r in mods.values() if not r.endswith("mod.rs")}
    return [(c, adj) for c in strong_components(nodes, adj)]


def long_files():
    """(file, lines, ceiling) of every file of launcher/src over its limit."""
    out = []
    for dirpath, _, files in os.walk(SRC):
        for f in sorted(files):
            if f.endswith(".rs"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, SRC)
                n = sum(1 for _ in open(path, encoding="utf-8"))
                limit = MAX_LINES
                if n > limit:
                    out.append((rel, n, limit))
    return sorted(out)


def tree_files():
    """Every file of the tree: git's list when there is one, else a walk
    that leaves out build output and version-control data."""
    try:
        import subprocess
        out = subprocess.run(["git", "-C", TOP, "ls-files", "-z"], capture_output=True, check=True)
        return [p for p in out.stdout.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for dirpath, dirs, files in os.walk(TOP):
            dirs[:] = [d for d in dirs if d not in (".git", "target", "result")]
            found += [os.path.relpath(os.path.join(dirpath, f), TOP) for f in files]
        return found


def tickets():
    """file:line: text of every ticket number in the tree."""
    hits = []
    for rel in sorted(tree_files()):
        path = os.path.join(TOP, rel)
        try:
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if TICKET_RE.search(line):
                        hits.append(f"{rel}:{n}: {line.strip()[:120]}")
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
    return hits


def main():
    edges = {}
    for dirpath, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, SRC)
            if rel.startswith("bin" + os.sep) or rel == "lib.rs":
                continue
            src_part = part_of(rel)
            text = open(path, encoding="utf-8").read()
            targets = set(PATH_RE.findall(text))
            for group in GROUP_RE.findall(text):
                targets.update(re.findall(r"(?:^|,)\s*([a-z_]+)", group))
            for t in targets:
                if t != src_part:
                    edges.setdefault((src_part, t), set()).add(rel)
    parts = set(LAYERS)
    unknown = {p for e in edges for p in e} - parts
    if unknown:
        print(f"layers: parts not in the layer list: {sorted(unknown)} (add them to LAYERS)")
        return 1
    if "--graph" in sys.argv:
        for (a, b), files in sorted(edges.items()):
            print(f"{a} -> {b}   ({', '.join(sorted(files))})")
    # circles: strongly connected components of size > 1
    adj = {p: {b for (a, b) in edges if a == p} for p in parts}
    sccs = strong_components(parts, adj)
    rank = {p: i for i, p in enumerate(LAYERS)}
    upward = sorted((a, b) for (a, b) in edges if rank[b] > rank[a])
    ok = True
    for comp in sccs:
        ok = False
        members = set(comp)
        cyc = [f"{a} -> {b} ({', '.join(sorted(edges[(a, b)]))})" for (a, b) in sorted(edges) if a in members and b in members]
        print("layers: FAIL import circle between " + ", ".join(comp) + ":\n  " + "\n  ".join(cyc))
    for a, b in upward:
        print(f"layers: upward import {a} -> {b} ({', '.join(sorted(edges[(a, b)]))})")
    if len(upward) > MAX_UPWARD:
        ok = False
        print(f"layers: FAIL {len(upward)} upward imports (at most {MAX_UPWARD})")
    fcircles = file_circles()
    for comp, fadj in fcircles:
        ok = False
        members = set(comp)
        cyc = [f"{a} -> {b}" for a in comp for b in sorted(fadj.get(a, ())) if b in members]
        print("layers: FAIL import circle between files " + ", ".join(comp) + ":\n  " + "\n  ".join(cyc))
    long = long_files()
    for rel, n, limit in long:
        ok = False
        print(f"layers: FAIL launcher/src/{rel} has {n} lines (at most {limit}); split it by what it does")
    found = tickets()
    for hit in found:
        ok = False
        print(f"layers: FAIL ticket number (name the feature instead): {hit}")
    print(
        f"layers: {len(parts)} parts, {len(edges)} edges, {len(sccs)} circles, {len(upward)} upward, "
        f"{len(fcircles)} file circles, {len(long)} files over {MAX_LINES} lines, "
        f"{len(found)} ticket numbers: {'ok' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
