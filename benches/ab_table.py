"""Tables the output of benches/ab_rounds.sh (or any run with the same "== process R, BUILD"
headers before each bench process): for each row, every build's us per batch round by
round, their medians, and each build's paired differences against the first build
(same round), with how many rounds it was faster.

    python3 benches/ab_table.py ab.txt [ROW-SUBSTRING]

Only the standard library. A difference is worth reporting when it holds in most rounds
and also beats the spread of a row the builds do not change (the control).
"""

import re
import statistics
import sys

HEADER = re.compile(r"^== process (\d+), (.+?)\s*$")
# The bench's table: columns two spaces or more apart: batch, direction, GB/s, x limit,
# us/batch, pinned MiB, CPU s/GB.
BATCH = re.compile(r"^\d+ x ")


def row_of(line):
    """(row name, us per batch) of a line of the bench's table, else None."""
    cols = re.split(r"\s{2,}", line.strip())
    if len(cols) < 5 or not BATCH.match(cols[0]) or not cols[1].startswith(("H2D", "D2H")):
        return None
    try:
        return f"{cols[0]} {cols[1]}", float(cols[4])
    except ValueError:
        return None


def parse(lines):
    """{(row, build): {round: us}} and the builds in first-seen order."""
    values, builds, current = {}, [], None
    for line in lines:
        m = HEADER.match(line)
        if m:
            current = (int(m.group(1)), m.group(2))
            if current[1] not in builds:
                builds.append(current[1])
            continue
        r = row_of(line)
        if r and current:
            values.setdefault((r[0], current[1]), {})[current[0]] = r[1]
    return values, builds


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        values, builds = parse(f)
    only = sys.argv[2] if len(sys.argv) > 2 else ""
    rows = sorted({row for row, _ in values if only in row})
    if not rows:
        sys.exit("no bench rows found")
    base = builds[0]
    print(f"| row | build | us per batch, round by round | median | paired vs {base}: median (faster in) |")
    print("| --- | --- | --- | ---: | --- |")
    for row in rows:
        ref = values.get((row, base), {})
        for b in builds:
            v = values.get((row, b), {})
            if not v:
                continue
            rounds = " / ".join(f"{v[r]:.1f}" for r in sorted(v))
            paired = [v[r] - ref[r] for r in sorted(v) if r in ref]
            if b == base or not paired:
                diff = ""
            else:
                faster = sum(d < 0 for d in paired)
                diff = f"{statistics.median(paired):+.1f} ({faster} of {len(paired)})"
            print(f"| {row} | {b} | {rounds} | {statistics.median(v.values()):.1f} | {diff} |")


if __name__ == "__main__":
    main()
