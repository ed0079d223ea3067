#!/usr/bin/env python3
"""Fail on an import circle between the crate's top-level parts, and on more
than two imports that run from a lower layer up.

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

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "launcher", "src")
PATH_RE = re.compile(r"\bcrate::([a-z_]+)")
# `use crate::{a, b::c}` groups
GROUP_RE = re.compile(r"\bcrate::\{([^}]*)\}", re.S)


def part_of(rel):
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


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
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
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

    for p in sorted(parts):
        if p not in index:
            strong(p)
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
    print(f"layers: {len(parts)} parts, {len(edges)} edges, {len(sccs)} circles, {len(upward)} upward: {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
