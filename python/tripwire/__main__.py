"""Command line: ``python -m tripwire demo | doctor | inspect TARGET | diff A B``.

``doctor`` prints every path tripwire takes here (the torch adapter, the array reader, dict hints,
frame layouts, store backends), each with its reason, after forcing their first use.
``inspect`` and ``diff`` read saved guard sets (``GuardSet.to_bytes()``) or store entries
(``tripwire.store``), from a file or from Redis (``redis://host:port/db/KEY`` or
``redis://host:port/KEY``). They resolve no reference and import nothing: references are shown by
name. The benchmarks live outside the package, in a checkout's bench/ (``python bench/guard_eval.py``).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from urllib.parse import urlsplit


def read_target(target: str) -> bytes:
    """The bytes at a file path or a ``redis://`` URL naming a key."""
    if target.startswith(("redis://", "rediss://")):
        import redis

        parts = urlsplit(target)
        path = parts.path.lstrip("/")
        db, sep, key = path.partition("/")
        if not sep or not db.isdigit():
            db, key = "0", path
        if not key:
            raise SystemExit(f"no key in {target!r} (redis://host:port/KEY or redis://host:port/DB/KEY)")
        client = redis.Redis(
            host=parts.hostname or "127.0.0.1", port=parts.port or 6379, db=int(db), socket_timeout=5
        )
        data = client.get(key)
        if data is None:
            raise SystemExit(f"{target}: no such key")
        if not isinstance(data, bytes):  # a client made with decode_responses=True
            raise SystemExit(f"{target}: the client returned {type(data).__name__}, not bytes")
        return data
    with open(target, "rb") as f:
        return f.read()


def split(data: bytes) -> tuple[bytes, str | None]:
    """(guard-set bytes, description of the entry around them or None for bare guards)."""
    from .store import ENTRY_MAGIC, decode_entry

    if data[:8] == ENTRY_MAGIC:
        e = decode_entry(data)
        return (
            e.guards,
            f"store entry: codec {e.codec!r}, payload {len(e.payload)} bytes, guards {len(e.guards)} bytes",
        )
    return data, None


def inspect_command(target: str) -> int:
    from .errors import FormatError
    from .serialization import describe_bytes

    try:
        guards, entry = split(read_target(target))
        text = describe_bytes(guards)
    except FormatError as e:
        print(f"{target}: {e}", file=sys.stderr)
        return 1
    print(f"{target} ({len(guards)} bytes of guards)")
    if entry:
        print(entry)
    print(text)
    return 0


def diff_command(a: str, b: str) -> int:
    """The guards only in A (-) and only in B (+); exit 1 when they differ, as diff(1) does."""
    from .errors import FormatError
    from .serialization import guard_lines

    try:
        la = guard_lines(split(read_target(a))[0])
        lb = guard_lines(split(read_target(b))[0])
    except FormatError as e:
        print(f"diff: {e}", file=sys.stderr)
        return 2
    changes = [
        line
        for line in difflib.unified_diff(sorted(la), sorted(lb), fromfile=a, tofile=b, lineterm="", n=0)
        if not line.startswith("@@")
    ]
    if not changes:
        print(f"the same {len(la)} guards")
        return 0
    print("\n".join(changes))
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tripwire", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "demo", help="build guards for a small example: a pass, a failure with its reason, the tree"
    )
    sub.add_parser(
        "doctor",
        help="print every path in use (torch adapter, array reader, dict hints, frame layouts, stores) "
        "with its reason; builds the torch adapter if this torch has none yet",
    )
    p = sub.add_parser("inspect", help="print a saved guard set or store entry: metadata, references, guards")
    p.add_argument("target", help="a file, or redis://host:port/[DB/]KEY")
    p = sub.add_parser("diff", help="print the guards that differ between two saved sets (exit 1 if any)")
    p.add_argument("a")
    p.add_argument("b")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command == "inspect":
        return inspect_command(args.target)
    if args.command == "diff":
        return diff_command(args.a, args.b)
    if args.command == "doctor":
        from .doctor import run as doctor

        return doctor()
    from .demo import run

    return run()


if __name__ == "__main__":
    sys.exit(main())
