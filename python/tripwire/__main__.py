"""Command line: ``tripwire demo | doctor | inspect TARGET | diff A B | report OUT.html SCRIPT [ARGS...]``.

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


class TargetError(Exception):
    """A target that cannot be read: the message is one line for stderr."""


def read_target(target: str) -> bytes:
    """The bytes at a file path or a ``redis://`` URL naming a key. Raises TargetError with one
    line saying what is wrong (no traceback: the file or server is the user's, not a bug)."""
    if target.startswith(("redis://", "rediss://")):
        return _read_redis(target)
    try:
        with open(target, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise TargetError(f"{target}: no such file") from None
    except IsADirectoryError:
        raise TargetError(f"{target}: is a directory, not a saved guard set or store entry") from None
    except PermissionError:
        raise TargetError(f"{target}: permission denied") from None
    except OSError as e:
        raise TargetError(f"{target}: cannot read: {e.strerror or e}") from None


def _read_redis(target: str) -> bytes:
    try:
        import redis
    except ImportError:
        raise TargetError(f"{target}: reading from Redis needs redis-py: pip install redis") from None
    parts = urlsplit(target)
    path = parts.path.lstrip("/")
    db, sep, key = path.partition("/")
    if not sep or not db.isdigit():
        db, key = "0", path
    if not key:
        raise TargetError(f"no key in {target!r} (redis://host:port/KEY or redis://host:port/DB/KEY)")
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    # A short connect timeout and no retries (redis-py retries a refused connection with backoff,
    # about 5 s): a server that is not there is reported at once, one that does not answer within
    # a second.
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(
        host=host,
        port=port,
        db=int(db),
        socket_connect_timeout=1,
        socket_timeout=5,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        data = client.get(key)
    except redis.exceptions.ConnectionError as e:
        raise TargetError(f"{target}: cannot connect to Redis at {host}:{port}: {_first_line(e)}") from None
    except redis.exceptions.RedisError as e:
        raise TargetError(f"{target}: Redis error: {_first_line(e)}") from None
    finally:
        client.close()
    if data is None:
        raise TargetError(f"{target}: no such key")
    if not isinstance(data, bytes):  # a client made with decode_responses=True
        raise TargetError(f"{target}: the client returned {type(data).__name__}, not bytes")
    return data


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


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
    except TargetError as e:
        print(f"inspect: {e}", file=sys.stderr)
        return 1
    except FormatError as e:
        print(f"inspect: {target}: {e}", file=sys.stderr)
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

    lines = []
    for target in (a, b):
        try:
            lines.append(guard_lines(split(read_target(target))[0]))
        except TargetError as e:
            print(f"diff: {e}", file=sys.stderr)
            return 2
        except FormatError as e:
            print(f"diff: {target}: {e}", file=sys.stderr)
            return 2
    la, lb = lines
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
    parser = argparse.ArgumentParser(prog="tripwire", description=__doc__)
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
    p = sub.add_parser(
        "report", help="run a Python script, then write an HTML report of its caches and recompiles"
    )
    p.add_argument("out", help="the HTML file to write")
    p.add_argument("script", help="the script to run (as __main__)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command == "report":
        from .html_report import run_and_report

        return run_and_report(args.out, [args.script, *args.args])
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
