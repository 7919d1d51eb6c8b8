"""The command line: `python -m art_rlvr.report RUN_DIR [--out DIR]`; exit code 2 with one
line on stderr when the folder is missing or not a run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from art_rlvr.report.build import write_report
from art_rlvr.rundir.reader import RunFolderError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m art_rlvr.report",
        description="Write a self-contained HTML report (and its PNGs) of a run folder.",
    )
    parser.add_argument("run_dir", type=Path, help="the run folder, e.g. runs/arith-rl-s0")
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: RUN_DIR/report)"
    )
    args = parser.parse_args(argv)
    try:
        page = write_report(args.run_dir, args.out)
    except RunFolderError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
