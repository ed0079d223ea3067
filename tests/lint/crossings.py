#!/usr/bin/env python3
"""Count how often following the spec from `launch()` to `execve` leaves a
file, and how often it climbs back up.

The walk. It starts in `launch::launch` (launch/mod.rs) and goes depth
first, in source order, through the calls of each function it reaches.
From `launch` it follows every call (the spec is not born yet); from then
on it follows a call only when the spec goes with it: an argument (or the
receiver of a method call) names the spec — `spec`, a parameter whose type
is `Spec`, or `self` in `impl Spec`. A function is expanded once, at its
first call; every later call site still counts. Only the crate's own
functions are calls (std, nix and the other crates are not rooms); a
method call `.f(` counts when exactly one function of the crate with a
`self` receiver is named `f`. Unit tests (`#[cfg(test)]`, tests.rs) are
not on the path.

The counts, over the call sites of that walk:
  crossings: calls into a function defined in another file;
  climbs:    crossings that go up: into a part listed later in
             tests/lint/layers.py's LAYERS than the caller's, or into a
             module that encloses the caller's (a step file calling back
             into launch/mod.rs).

    python3 tests/lint/crossings.py [--list] [SRC_DIR]
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layers import LAYERS  # noqa: E402

KEYWORDS = {
    "if", "while", "for", "match", "return", "loop", "fn", "in", "as", "let", "mut",
    "Some", "Ok", "Err", "None", "Box", "Vec", "String", "PathBuf", "matches",
    "format", "vec", "assert", "debug_assert_eq", "write", "writeln", "unsafe", "move",
}
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def blank(text):
    """Comments, strings and char literals replaced by spaces (the
    structure, newlines and offsets kept)."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            wipe(i + 1, j - 1)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i + 1, j)
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
            if m:
                wipe(i + 1, i + m.end() - 1)
                i += m.end()
            else:
                i += 1  # a lifetime
        else:
            i += 1
    return "".join(out)


def close_of(text, i, o="{", c="}"):
    """Index just after the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == o:
            depth += 1
        elif text[j] == c:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def drop_tests(text):
    """`#[cfg(test)]` items blanked out."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]", text)
        if not m:
            return text
        j = m.end()
        brace, semi = text.find("{", j), text.find(";", j)
        end = semi + 1 if semi >= 0 and (brace < 0 or semi < brace) else close_of(text, brace)
        text = text[: m.start()] + re.sub(r"[^\n]", " ", text[m.start():end]) + text[end:]


class Fn:
    def __init__(self, file, module, name, impl, params, body, start):
        self.file, self.module, self.name, self.impl = file, module, name, impl
        self.params, self.body, self.start = params, body, start
        self.spec_vars = {"spec"}
        for p in split_top(params):
            m = re.match(r"\s*(?:mut\s+)?(" + IDENT + r")\s*:(.*)", p, re.S)
            if m and re.search(r"\bSpec\b", m.group(2)):
                self.spec_vars.add(m.group(1))
        if impl == "Spec" and re.match(r"\s*&?\s*(mut\s+)?self\b", params):
            self.spec_vars.add("self")
        self.has_self = bool(re.match(r"\s*&?\s*('\w+\s+)?(mut\s+)?self\b", params))

    def key(self):
        return f"{self.file}::{self.impl + '::' if self.impl else ''}{self.name}"


def split_top(s):
    """`s` split at the commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def mentions(text, names):
    """Whether `text` names one of `names` (as a whole identifier)."""
    return any(re.search(r"(?<![\w.])" + re.escape(n) + r"\b(?!\s*\.)", text) for n in names)


def module_of(rel):
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


def parse(src):
    files, fns, uses = {}, [], {}
    for dirpath, _, names in os.walk(src):
        for f in names:
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            if not f.endswith(".rs") or f == "tests.rs" or rel.startswith("bin" + os.sep):
                continue
            text = drop_tests(blank(open(os.path.join(src, rel), encoding="utf-8").read()))
            files[module_of(rel)] = rel
            uses[rel] = imports(text, module_of(rel))
            impls = [(m.start(), close_of(text, text.index("{", m.end() - 1)), m.group(1))
                     for m in re.finditer(r"\bimpl\b[^{;]*?\b(?:for\s+)?(" + IDENT + r")(?:<[^{;]*>)?\s*(?:where[^{]*)?\{", text)]
            for m in re.finditer(r"\bfn\s+(" + IDENT + r")\s*(?:<[^(]*>)?\s*\(", text):
                p_end = close_of(text, m.end() - 1, "(", ")")
                brace, semi = text.find("{", p_end), text.find(";", p_end)
                if brace < 0 or (0 <= semi < brace):
                    continue  # a trait method without a body
                body_end = close_of(text, brace)
                impl = next((n for a, b, n in impls if a < m.start() < b), None)
                fns.append(Fn(rel, module_of(rel), m.group(1), impl, text[m.end():p_end - 1], text[brace:body_end], m.start()))
    return files, fns, uses


def imports(text, module):
    """alias -> absolute path (a list of segments) of every `use`."""
    out = {}

    def tree(s, prefix):
        s = s.strip()
        if "{" in s and s.endswith("}"):
            head = s[: s.index("{")].rstrip(":").strip()
            base = prefix + [x for x in head.split("::") if x]
            for part in split_top(s[s.index("{") + 1:-1]):
                tree(part, base)
            return
        m = re.match(r"(.*?)(?:\s+as\s+(" + IDENT + r"))?$", s, re.S)
        segs = prefix + [x.strip() for x in m.group(1).split("::") if x.strip()]
        if not segs or segs[-1] == "*":
            return
        if segs[-1] == "self":
            segs = segs[:-1]
        out[m.group(2) or segs[-1]] = segs

    for m in re.finditer(r"\buse\s+([^;]+);", text):
        s = m.group(1).strip()
        if s.startswith("crate::"):
            tree(s[len("crate::"):], [])
        elif s.startswith("super::"):
            tree(s[len("super::"):], list(module[:-1]) if module else [])
        elif s.startswith("self::"):
            tree(s[len("self::"):], list(module))
        else:
            # relative to this module (`pub use child::f`); a path into
            # another crate resolves to nothing of this one
            tree(s, list(module))
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "launcher", "src")
    files, fns, uses = parse(src)
    by_module = {}
    for f in fns:
        by_module.setdefault((f.module, f.impl, f.name), []).append(f)
    methods = {}
    for f in fns:
        if f.has_self:
            methods.setdefault(f.name, []).append(f)

    def in_module(mod, name, seen=()):
        """The free fn `name` of module `mod`, through its re-exports."""
        for f in by_module.get((tuple(mod), None, name), []):
            return f
        rel = files.get(tuple(mod))
        if rel and rel not in seen:
            target = uses[rel].get(name)
            if target:
                return in_module(target[:-1], target[-1], seen + (rel,))
        return None

    def in_type(ty, name):
        cands = [f for f in fns if f.impl == ty and f.name == name]
        return cands[0] if len(cands) == 1 else None

    def resolve(caller, segs, name):
        mod = caller.module
        imp = uses[caller.file]
        if not segs:
            for f in fns:
                if f.file == caller.file and f.name == name and f.impl is None:
                    return f
            if caller.impl:
                f = in_type(caller.impl, name)
                if f and not f.has_self:
                    return f
            if name in imp:
                t = imp[name]
                return in_module(t[:-1], t[-1])
            return None
        head = segs[0]
        if head == "crate":
            path = segs[1:]
        elif head == "Self":
            return in_type(caller.impl, name)
        elif head == "super":
            path = list(mod[:-1]) + segs[1:]
        elif head in imp:
            path = imp[head] + segs[1:]
        elif tuple(mod) + (head,) in files:
            path = list(mod) + segs
        elif (head,) in files:
            path = segs
        else:
            path = None
        if path is None:
            return None
        if tuple(path) in files:
            return in_module(path, name)
        # a type: Type::f
        return in_type(path[-1], name)

    call_re = re.compile(r"(?<![\w.])((?:" + IDENT + r"\s*::\s*)*)(" + IDENT + r")\s*(?:::\s*<[^()]*>\s*)?\(")
    meth_re = re.compile(r"\.\s*(" + IDENT + r")\s*(?:::\s*<[^()]*>\s*)?\(")

    def calls(fn):
        """(callee, carries_spec) of fn's body, in source order."""
        body = fn.body
        found = []
        for m in call_re.finditer(body):
            segs = [s.strip() for s in m.group(1).split("::") if s.strip()]
            name = m.group(2)
            if not segs and name in KEYWORDS:
                continue
            callee = resolve(fn, segs, name)
            if callee is None:
                continue
            end = close_of(body, m.end() - 1, "(", ")")
            argtext = body[m.end():end - 1]
            found.append((m.start(), callee, mentions(argtext, fn.spec_vars)))
        for m in meth_re.finditer(body):
            cands = methods.get(m.group(1), [])
            if len(cands) != 1:
                continue
            recv = re.search(r"(?<![\w.])(" + IDENT + r")\s*$", body[:m.start()])
            end = close_of(body, m.end() - 1, "(", ")")
            carries = mentions(body[m.end():end - 1], fn.spec_vars) or bool(recv and recv.group(1) in fn.spec_vars)
            found.append((m.start(), cands[0], carries))
        return [(c, s) for _, c, s in sorted(found, key=lambda x: x[0])]

    rank = {p: i for i, p in enumerate(LAYERS)}

    start = by_module[(("launch",), None, "launch")][0]
    seen, trace = {start.key()}, []

    def step_list(fn):
        return fn is start

    def walk(fn, depth):
        for callee, carries in calls(fn):
            if not (step_list(fn) or carries):
                continue
            trace.append((depth, fn, callee))
            if callee.key() not in seen:
                seen.add(callee.key())
                walk(callee, depth + 1)

    walk(start, 0)
    crossings = [(d, a, b) for d, a, b in trace if a.file != b.file]
    # The rooms the reader is sent to, in order: a climb is a room of a
    # higher part than the room before it (down into host/, then back up
    # into identity/).
    climbs = [
        crossings[k]
        for k in range(1, len(crossings))
        if rank.get(crossings[k][2].module[0], 0) > rank.get(crossings[k - 1][2].module[0], 0)
    ]
    climb_set = {id(c) for c in climbs}
    if "--list" in sys.argv:
        for d, a, b in trace:
            mark = " " if a.file == b.file else ("^" if any(c[1] is a and c[2] is b and c[0] == d for c in climbs) else ">")
            print(f"{mark} {'  ' * d}{a.key()} -> {b.key()}")
    print(f"crossings: {len(trace)} calls on the spec's path, {len(crossings)} into another file, {len(climbs)} of them up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
