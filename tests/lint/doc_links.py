#!/usr/bin/env python3
"""Check every Markdown link in docs/ and README.md.

A link must stay inside the repository (no scheme, no //host, no path that
climbs out), its file or directory must exist, and a #anchor must name a
heading of the target Markdown file as GitHub slugs it (lower case,
punctuation but - and _ dropped, spaces to -, -1, -2 for repeats). Links in
fenced code blocks and inline code are not links.

    python3 tests/lint/doc_links.py
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FENCE_RE = re.compile(r"```.*?```", re.S)
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
SCHEME_RE = re.compile(r"^[a-z][a-z0-9+.-]*:")


def markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    for d, _, names in os.walk(os.path.join(ROOT, "docs")):
        files += [os.path.join(d, n) for n in names if n.endswith(".md")]
    return sorted(files)


def without_fences(text):
    return FENCE_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, out = {}, set()
        with open(path, encoding="utf-8") as f:
            text = without_fences(f.read())
        for line in text.split("\n"):
            m = HEADING_RE.match(line)
            if m:
                s = slug(m.group(2))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
        _anchors[path] = out
    return _anchors[path]


def check(path):
    problems, count = [], 0
    rel = os.path.relpath(path, ROOT)
    with open(path, encoding="utf-8") as f:
        text = without_fences(f.read())
    # inline code is not a link unless it is a link's text
    text = re.sub(r"`[^`\n]*`", lambda m: m.group(0) if "](" in m.group(0) else " " * len(m.group(0)), text)
    for ln, line in enumerate(text.split("\n"), 1):
        for m in LINK_RE.finditer(line):
            target = m.group(1)
            count += 1
            if SCHEME_RE.match(target) or target.startswith("//"):
                problems.append(f"{rel}:{ln}: links outside the repository: {target}")
                continue
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not (dest + os.sep).startswith(ROOT + os.sep):
                problems.append(f"{rel}:{ln}: climbs out of the repository: {target}")
            elif not os.path.exists(dest):
                problems.append(f"{rel}:{ln}: no such file: {target}")
            elif frag and not dest.endswith(".md"):
                problems.append(f"{rel}:{ln}: an anchor into a file that is not Markdown: {target}")
            elif frag and frag not in anchors(dest):
                problems.append(f"{rel}:{ln}: no heading #{frag} in {os.path.relpath(dest, ROOT)}")
    return problems, count


def main():
    files = markdown_files()
    problems, count = [], 0
    for path in files:
        p, n = check(path)
        problems += p
        count += n
    for p in problems:
        print(p)
    print(f"doc links: {count} links in {len(files)} files, {len(problems)} bad: {'ok' if not problems else 'FAIL'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
