#!/usr/bin/env python3
"""Summarise a ``py-spy record --format raw`` profile of the daemon: the share of samples
per thread kind and per component (the innermost ckptfs/trio/pyfuse3 frame that names one).

    python scripts/spy_summary.py PROFILE.txt [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^:()]*)(?::(?P<line>\d+))?\)$")


def frames(stack: str) -> list[tuple[str, str]]:
    out = []
    for f in stack.split(";"):
        m = _FRAME.match(f.strip())
        out.append((m.group("fn"), m.group("file")) if m else (f.strip(), ""))
    return out


def component(fs: list[tuple[str, str]]) -> str:
    """The innermost frame of ckptfs (with its module), else the innermost Python frame."""
    for fn, file in reversed(fs):
        if "/ckptfs/" in file:
            mod = file.split("/ckptfs/", 1)[1].removesuffix(".py")
            return f"{mod}:{fn}"
    for fn, file in reversed(fs):
        if file.endswith(".py") or file.endswith(".pyx"):
            return f"{file.rsplit('/', 1)[-1]}:{fn}"
    return fs[-1][0] if fs else "?"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--outer", action="store_true",
                    help="attribute to the outermost ckptfs frame instead")
    args = ap.parse_args()
    by_thread: collections.Counter[str] = collections.Counter()  # by thread kind
    by_comp: collections.Counter[str] = collections.Counter()
    by_leaf: collections.Counter[str] = collections.Counter()
    total = 0
    with open(args.profile) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, n = line.rpartition(" ")
            count = int(n)
            fs = frames(stack)
            total += count
            kind = "worker" if any("_thread_cache" in fl for _, fl in fs) else (
                "trio" if any("trio/_core/_run" in fl for _, fl in fs) else "other")
            by_thread[kind] += count
            py = [x for x in fs if x[1]]
            if args.outer:
                ck = [x for x in py if "/ckptfs/" in x[1]]
                comp = component(ck[:1]) if ck else component(py)
            else:
                comp = component(py)
            by_comp[f"{kind:6} {comp}"] += count
            by_leaf[fs[-1][0] + " " + fs[-1][1].rsplit("/", 1)[-1]] += count
    print(f"{total} samples")
    for k, v in by_thread.most_common():
        print(f"  {k:8} {100 * v / total:5.1f}%")
    print("components:")
    for k, v in by_comp.most_common(args.top):
        print(f"  {100 * v / total:5.1f}%  {k}")
    print("leaf frames:")
    for k, v in by_leaf.most_common(args.top):
        print(f"  {100 * v / total:5.1f}%  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
