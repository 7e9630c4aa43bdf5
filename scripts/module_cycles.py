#!/usr/bin/env python3
"""Finds import cycles between the files of a crate.

Usage: scripts/module_cycles.py [crate-src-dir] [--top]

Reads every `crate::…` and `super::…` path in the code (comments skipped, `use` groups
expanded), resolves each to the file that defines the module it names, and prints the
strongly connected components with more than one file: each is a circle of files that
import one another. A parent `mod.rs` that only declares its children (`mod x;`) is not an
edge; a parent that calls into a child is. Test code is left out: inline `#[cfg(test)] mod`
blocks and files of `#[cfg(test)] mod x;` modules. With `--top` files are grouped by their
top-level module (`api/deployments.rs` counts as `api`). Exits 1 when a cycle exists.
"""

import os
import re
import sys


def module_files(src):
    """Maps module paths (tuples) to files under src."""
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(root, name), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            files[tuple(parts)] = rel
    return files


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def expand_use(tree):
    """Expands `a::{b, c::{d, e}}` into ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
    if start is None:
        return [tree]
    prefix, inner = tree[:start], tree[start + 1 : tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out.extend(prefix + e for e in expand_use(p))
    return out


def paths_in(text):
    """Every crate-relative path written in a file, as lists of segments."""
    found = []
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        found.extend(expand_use(m.group(1)))
    body = re.sub(r"\buse\s+[^;]+;", "", text)
    found.extend(m.group(0) for m in re.finditer(r"\b(?:crate|super)(?:::[A-Za-z_][A-Za-z0-9_]*)+", body))
    return [p.split(" as ")[0].split("::") for p in found]


def resolve(segments, here, files):
    """The file a path points into, or None for external crates."""
    if segments[0] == "crate":
        base, rest = (), segments[1:]
    elif segments[0] in ("super", "self"):
        base = here
        rest = segments
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    else:
        return None
    best = base if base in files else None
    for i in range(1, len(rest) + 1):
        key = base + tuple(rest[:i])
        if key in files:
            best = key
    return best


def sccs(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = "--top" in sys.argv
    src = args[0] if args else "control-plane/src"
    files = module_files(src)
    # Files of test-only modules (`#[cfg(test)] mod tests;`) are not part of the layout.
    for mod, rel in list(files.items()):
        with open(os.path.join(src, rel)) as f:
            for child in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+(\w+)\s*;", f.read()):
                files.pop(mod + (child,), None)
    name = (lambda m: m[0] if m else "lib") if top else (lambda m: files[m])
    graph = {}
    for mod, rel in files.items():
        with open(os.path.join(src, rel)) as f:
            text = strip_comments(f.read())
        # An inline `mod tests { use super::*; }` (at a file's end) would resolve `super` one
        # level too high; tests are not part of the layout anyway.
        text = re.split(r"#\[cfg\(test\)\]\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+\w+\s*\{", text)[0]
        for segs in paths_in(text):
            target = resolve(segs, mod, files)
            if target is None or target == mod:
                continue
            a, b = name(mod), name(target)
            if a != b:
                graph.setdefault(a, set()).add(b)
    cycles = [sorted(c) for c in sccs(graph) if len(c) > 1]
    for c in sorted(cycles, key=len, reverse=True):
        print(f"{len(c)} in a circle: {', '.join(c)}")
    if not cycles:
        print("no cycles")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
