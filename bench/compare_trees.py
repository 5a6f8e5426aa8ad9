"""Two trees of the daemon in alternation: what a change did to inbound and speech.

    python bench/compare_trees.py BEFORE [AFTER] [--rounds 4]

BEFORE and AFTER are git revisions of this repository (AFTER defaults to the work tree's HEAD),
or directories holding a tree, used as they are. A revision is checked out into a temporary
worktree; each round runs ``bench_inbound.py`` and ``bench_speech.py`` (one round each, each
tree's own copy, its own package on ``PYTHONPATH``) in both trees, the order alternating round
by round, so load that comes and goes on the machine falls on both sides alike. A side's
figures are its own ratios against the bare forwarder measured in the same run (and the trio
thread's µs a message), so the comparison is of ratios, not of absolute rates. Prints each
round and the medians of the after ÷ before ratios. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The inbound table's row of the daemon on an empty journal: msgs/s, msgs/CPU-s, ÷ forwarder,
#: ÷ floor, ÷ empty journal, µs of the trio thread, of its other threads, of the load.
INBOUND_ROW = re.compile(r"^daemon@0\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\s+(?:[\d.]+\s+)?(-?[\d,]+)\s+(-?[\d,]+)\s+(-?[\d,]+)\s*$", re.M)
SPEECH_RATIO = re.compile(r"^daemon ÷ forwarder \(same host calls and server messages\): ([\d.]+)$", re.M)


def number(text: str) -> float:
    return float(text.replace(",", ""))


def run_bench(tree: Path, script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed in {tree}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def measure(tree: Path) -> dict[str, float]:
    inbound = INBOUND_ROW.search(run_bench(tree, "bench_inbound.py", "--rounds", "1"))
    speech = SPEECH_RATIO.search(run_bench(tree, "bench_speech.py", "--rounds", "1"))
    if inbound is None or speech is None:
        raise SystemExit(f"could not read the figures printed in {tree}")
    return {
        "inbound ÷ forwarder": number(inbound.group(3)),
        "inbound ÷ floor": number(inbound.group(4)),
        "trio µs a message": number(inbound.group(5)),
        "speech ÷ forwarder": number(speech.group(1)),
    }


def checkout(revision: str, where: Path) -> Path:
    """``revision`` checked out at ``where``; a directory named instead of a revision is used as
    it is (a tree with something a revision can't hold: modules compiled in place, say)."""
    if Path(revision).is_dir():
        return Path(revision).resolve()
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(where), revision], check=True)
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after", nargs="?", default="HEAD")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mr-compare-", dir="/tmp") as tmp:
        trees = {"before": Path(tmp) / "before", "after": Path(tmp) / "after"}
        try:
            trees = {"before": checkout(args.before, trees["before"]), "after": checkout(args.after, trees["after"])}
            readings: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for round_ in range(args.rounds):
                order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
                for side in order:
                    readings[side].append(measure(trees[side]))
                line = ", ".join(f"{name} {readings['before'][-1][name]:.3f} → {readings['after'][-1][name]:.3f}"
                                 for name in readings["before"][-1])
                print(f"round {round_ + 1} ({' then '.join(order)}): {line}", flush=True)
        finally:
            for tree in trees.values():
                if tree.is_relative_to(tmp):  # a directory given as a side is not ours to remove
                    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
    print(f"\n{args.before} → {args.after}, {args.rounds} rounds in alternation; medians:")
    for name in readings["before"][0]:
        before = statistics.median(r[name] for r in readings["before"])
        after = statistics.median(r[name] for r in readings["after"])
        ratios = statistics.median(a[name] / b[name] for a, b in zip(readings["after"], readings["before"], strict=True))
        print(f"  {name:<22} before {before:8.3f}   after {after:8.3f}   after ÷ before (median of rounds) {ratios:.3f}")


if __name__ == "__main__":
    main()
