"""A/B: this checkout's benchmarks against another commit's, in one interleaved run.

    python benchmarks/ab.py --base HEAD~1 [--rounds 5] [--only W3L] [--quick]

Both sides run this checkout's benchmarks/run.py (public API only) in fresh processes,
alternating base, head, head, base, ... for --rounds rounds, so a slow phase of the
machine hits both sides alike. Each process warms up as run.py does. Prints, per row,
the median time of each side and head/base (1.00 = unchanged; > 1 = head slower),
with the spread of the rounds so noise is visible.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ROW = re.compile(r"^  (\S.*?\S)\s+([\d.]+) (ms|us)\s+[\d.]+x")


def checkout(rev, into):
    """A detached worktree of `rev` (removed at the end by the caller)."""
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", into, rev],
                   check=True, capture_output=True)
    return into


def run_once(tree, only, quick):
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, os.path.join(HERE, "run.py"), "--only", only]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree,
                         check=True).stdout
    rows, section = {}, ""
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            sec = float(m.group(2)) * (1e-3 if m.group(3) == "ms" else 1e-6)
            rows[f"{section} | {m.group(1)}"] = sec
        elif line and not line.startswith(" "):
            section = line.split("  (")[0][:60]
    return rows


def fmt(sec):
    return f"{sec * 1e3:8.2f} ms" if sec >= 1e-3 else f"{sec * 1e6:8.1f} us"


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="commit to compare against")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default="W1W2W3W4W5L")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--filter", default="tracejit", help="rows whose name contains this")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = checkout(args.base, os.path.join(tmp, "base"))
        try:
            times = {"base": {}, "head": {}}
            for r in range(args.rounds):
                # ABBA order: a machine that slows down (or warms up) over the run
                # does not favour the side that always runs first.
                order = (("base", base), ("head", ROOT))
                for side, tree in (order if r % 2 == 0 else order[::-1]):
                    for row, sec in run_once(tree, args.only, args.quick).items():
                        times[side].setdefault(row, []).append(sec)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base],
                           capture_output=True)
    print(f"A/B: head ({ROOT}) vs base {args.base}, {args.rounds} interleaved rounds, "
          f"medians (min-max)")
    for row in times["head"]:
        if args.filter not in row or row not in times["base"]:
            continue
        b, h = times["base"][row], times["head"][row]
        mb, mh = statistics.median(b), statistics.median(h)
        # The section cut, the row's own name kept: rows of one section differ there.
        section, _, name = row.partition(" | ")
        label = f"{section[:34]} | {name}"
        print(f"  {label[:72]:<72} base {fmt(mb)} ({fmt(min(b)).strip()}-{fmt(max(b)).strip()})"
              f"  head {fmt(mh)} ({fmt(min(h)).strip()}-{fmt(max(h)).strip()})"
              f"  {mh / mb:5.2f}x")


if __name__ == "__main__":
    main()
