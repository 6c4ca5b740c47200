"""Rank a py-spy collapsed-stack profile (`py-spy record --format raw`): where the samples are.

Prints the functions with the most samples of their own (self) and under them (total), as a share of
all samples, and the same summed per module (file): enough to say where a process's milliseconds go
without a flame-graph viewer. `bench_throughput.py --pprof DIR` writes one per extender scenario.

  python bench/stacks_top.py DIR/frag-1000-extender.collapsed [--top 30]

The bench records with `--gil`: only the thread holding the GIL is sampled, so the samples are the
Python time the process spent (py-spy's idle detection misses threads blocked in an SSL read).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def parse(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        body, _, count = line.rpartition(" ")
        if body and count.isdigit():
            stacks.append((body.split(";"), int(count)))
    return stacks


def where(frame: str) -> tuple[str, str]:
    """(function, file) of a py-spy frame `func (path/file.py:line)`."""
    m = _FRAME.match(frame)
    if m is None:
        return frame, "?"
    return m.group("func"), m.group("file").rsplit("/site-packages/", 1)[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    stacks = parse(args.profile)
    total = sum(n for _, n in stacks)
    if not total:
        print("no samples", file=sys.stderr)
        return 1
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    for frames, n in stacks:
        func, file = where(frames[-1])
        own[f"{func} ({file})"] += n
        modules[file] += n
        for name in {"{} ({})".format(*where(f)) for f in frames}:
            under[name] += n
    print(f"{total} samples")
    for title, counts in (("self", own), ("total", under), ("self, per file", modules)):
        print(f"\n## {title}")
        for name, n in counts.most_common(args.top):
            print(f"{100 * n / total:6.2f} %  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
