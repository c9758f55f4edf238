"""Command line: ``python -m tripwire demo``.

The benchmarks live outside the package, in a checkout's bench/ (``python bench/guard_eval.py``).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tripwire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "demo", help="build guards for a small example: a pass, a failure with its reason, the tree"
    )
    parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    from .demo import run

    return run()


if __name__ == "__main__":
    sys.exit(main())
