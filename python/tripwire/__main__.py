"""Command line: ``python -m tripwire demo`` and ``python -m tripwire bench``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # hand the rest over verbatim (argparse.REMAINDER reorders options)
        from .bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m tripwire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="build guards for a small example: a pass, a failure with its reason, the tree")
    bench = sub.add_parser("bench", help="guard evaluation benchmark (see bench/README.md)", add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    args, extra = parser.parse_known_args(argv)
    if args.command == "demo":
        from .demo import run

        return run()
    from .bench import main as bench_main

    return bench_main(list(args.rest) + list(extra))


if __name__ == "__main__":
    sys.exit(main())
