#!/usr/bin/env python3
"""Fails if the modules of any workspace crate import each other in a cycle.

A module's edges are the `crate::<module>` paths in its files (a directory module's files count
as one module). Prints each crate's module layers, top to bottom, and every cycle it finds.

    deploy/local/check-cycles.py [REPO]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
members = re.search(r"members\s*=\s*\[([^\]]*)\]", (root / "Cargo.toml").read_text())
crates = re.findall(r'"([^"]+)"', members.group(1)) if members else []

# `crate::x` anywhere but in comments, including grouped imports `crate::{a, b::c}`.
PATH = re.compile(r"\bcrate::(\{[^}]*\}|[a-z_][a-z0-9_]*)")


def edges_of(text):
    text = re.sub(r"//[^\n]*", "", text)
    out = set()
    for m in PATH.finditer(text):
        g = m.group(1)
        if g.startswith("{"):
            out.update(re.findall(r"(?:^|[{,\s])([a-z_][a-z0-9_]*)", g))
        else:
            out.add(g)
    return out


def module_of(src, f):
    rel = f.relative_to(src).parts
    name = rel[0][:-3] if len(rel) == 1 else rel[0]
    return None if name in ("lib", "main") and len(rel) == 1 else name


failed = False
for crate in crates:
    src = root / crate / "src"
    if not src.is_dir():
        continue
    graph = {}
    for f in sorted(src.rglob("*.rs")):
        if "bin" in f.relative_to(src).parts[:1]:
            continue
        m = module_of(src, f)
        if m is None:
            continue
        graph.setdefault(m, set()).update(edges_of(f.read_text()))
    for m in graph:
        graph[m] = {d for d in graph[m] if d in graph and d != m}
    # Layers: repeatedly take the modules nothing left depends on... from the bottom up.
    left, layers = dict(graph), []
    while left:
        bottom = sorted(m for m, deps in left.items() if not deps & left.keys())
        if not bottom:
            break
        layers.append(bottom)
        for m in bottom:
            del left[m]
    if left:
        failed = True
        # Report one cycle per strongly connected remainder: walk until a module repeats.
        start = sorted(left)[0]
        path, seen = [start], {start}
        while True:
            nxt = sorted(d for d in left[path[-1]] if d in left)[0]
            if nxt in seen:
                cycle = path[path.index(nxt):] + [nxt]
                break
            path.append(nxt)
            seen.add(nxt)
        print(f"{crate}: import cycle {' → '.join(cycle)}", file=sys.stderr)
    else:
        print(f"{crate}: " + " | ".join(" ".join(layer) for layer in reversed(layers)))
sys.exit(1 if failed else 0)
