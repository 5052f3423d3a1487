"""Where a kernel's time goes, from the per-instruction CSV of scripts/profile_candidate_gpu.sh
(ncu --page source --print-source sass; gzipped, as that script writes it, or not): the
warp-state samples summed by reason (stalls, and `selected`: a warp issuing), then the
instructions with the most samples, each with its two largest reasons.

    python scripts/ncu_sass_summary.py FILE.csv.gz [--top N]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import sys
from collections import Counter
from pathlib import Path


def read_rows(path: Path) -> list[dict[str, str]]:
    """The instruction rows of the CSV (ncu prints its own lines before the header)."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        raise ValueError(f'{path}: no per-instruction table (no line starting with "Address")')
    rows = list(csv.DictReader(lines[start:]))
    if not rows:
        raise ValueError(f"{path}: the per-instruction table has a header and no instruction")
    return rows


def summarize(rows: list[dict[str, str]], top: int) -> str:
    """The report: samples by reason, then the `top` instructions by samples."""
    reasons = [key for key in rows[0] if key.startswith("stall_") and "Not Issued" not in key]
    by_reason: Counter[str] = Counter()
    for row in rows:
        for reason in reasons:
            by_reason[reason] += int(row[reason] or 0)
    total = sum(by_reason.values()) or 1
    out = [f"{total} warp samples over {len(rows)} instructions"]
    out += [
        f"  {reason:24s} {n:7d} {100 * n / total:5.1f} %" for reason, n in by_reason.most_common(8)
    ]
    samples = "Warp Stall Sampling (All Samples)"
    out.append(f"top {top} instructions by samples:")
    for row in sorted(rows, key=lambda r: -int(r[samples] or 0))[:top]:
        mine = sorted(((int(row[r] or 0), r[6:]) for r in reasons), reverse=True)[:2]
        why = ", ".join(f"{name} {n}" for n, name in mine if n)
        out.append(f"  {int(row[samples] or 0):6d}  {row['Source'].strip()[:60]:60s} {why}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        print(summarize(read_rows(args.csv), args.top))
    except (OSError, ValueError) as exc:
        print(f"ncu_sass_summary: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
