"""What a store costs per entry as it grows: ``@specialize`` writes N entries of one function into a
fresh store (N misses, each compiling and saving), then another "process" (a fresh store object and
function) reads them back (its first miss loads all N, the other calls hit). Per-entry cost for
N = 10, 100, 1000, min and median over repeats, and the ratio N=1000 / N=10 (the target is <= 2).

Then the killed-writers scenario: a store with 2,000 entries of one function and 2,000 temporary
files left by writers killed mid-write; a reader serves the 2,000 calls, and a miss in the
unchanged store is timed.

    python bench/store_scaling.py                 # Directory (and Redis when redis-server runs)
    python bench/store_scaling.py --repeat 5 --no-redis
"""

from __future__ import annotations

import argparse
import functools
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tripwire as tw
from tripwire.store import Directory, Redis, encode_entry, entry_key, namespace_of


def target(x: Any) -> Any:
    return x + 1


def fast_target(x: Any) -> Any:
    return x + 1


def compiler(fn: Any, args: Any, builder: Any) -> Any:
    return fast_target


def specialized(store: Any, n: int) -> Any:
    return tw.specialize(
        target, compiler=compiler, store=store, recompile_limit=n + 1, accumulated_limit=n + 1
    )


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def write_then_read(make_store: Callable[[], Any], n: int) -> list[float]:
    """Microseconds per entry to write n entries, then to read them back with a fresh reader
    (each of its n calls): [write wall, write CPU, read wall, read CPU]. CPU is this process's
    time (``time.process_time``): on a shared machine the wall clock also counts the time other
    processes hold the CPU, which grows with the length of a run (a run shorter than a
    scheduler slice rarely waits). Wall time keeps the time blocked on I/O (fsync)."""
    w = specialized(make_store(), n)
    a = _clock()
    for i in range(n):
        w(i)
    b = _clock()
    r = specialized(make_store(), n)
    c = _clock()
    for i in range(n):
        r(i)
    d = _clock()
    assert r.store_loads == n, (r.store_loads, n)
    return [(y[k] - x[k]) / n * 1e6 for x, y in ((a, b), (c, d)) for k in (0, 1)]


@functools.cache
def entries(n: int) -> list[tuple[str, bytes]]:
    """n distinct entries of one function (guards x == i), as (key, bytes)."""
    payload = tw.store.ReferenceCodec(modules=[__name__]).encode(fast_target)
    out = []
    for i in range(n):
        b = tw.GuardBuilder({"x": i})
        b.equals("L['x']")
        data = encode_entry(b.build().to_bytes(), "reference", payload)
        out.append((entry_key(data), data))
    return out


def store_alone(make_store: Callable[[], Any], n: int) -> list[float]:
    """The store's own part of write_then_read, with the entries encoded beforehand: each write
    is a miss's read (from the writer's position, passing over its own keys) and a save; the
    read back is one read of all n by a fresh store object."""
    ns, known, position, w = namespace_of([f"alone{n}"]), set(), None, make_store()
    todo = entries(n)
    a = _clock()
    for key, data in todo:
        _, position = w.read(ns, position, known)
        known.add(key)
        w.save(ns, key, data)
    b = _clock()
    got = make_store().read(ns)[0]
    c = _clock()
    assert len(got) == n, (len(got), n)
    return [(y[k] - x[k]) / n * 1e6 for x, y in ((a, b), (b, c)) for k in (0, 1)]


def no_store(make_store: Callable[[], Any], n: int) -> list[float]:
    """@specialize without a store: n misses, then n hits (what the cache itself costs)."""
    f = specialized(None, n)
    a = _clock()
    for i in range(n):
        f(i)
    b = _clock()
    for i in range(n):
        f(i)
    c = _clock()
    return [(y[k] - x[k]) / n * 1e6 for x, y in ((a, b), (b, c)) for k in (0, 1)]


def start_redis() -> tuple[subprocess.Popen | None, str]:
    exe = shutil.which("redis-server")
    if exe is None:
        return None, ""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    return None, ""


_COLUMNS = ("write wall", "write CPU", "read wall", "read CPU")


def scaling(
    name: str,
    fresh: Callable[[], Callable[[], Any]],
    sizes: list[int],
    repeat: int,
    run: Callable[[Callable[[], Any], int], list[float]] = write_then_read,
) -> None:
    """``repeat`` rounds; each round runs every size in turn (so a change in the machine's load
    or the disk's speed touches all sizes alike), a size of N entries 100 / N times (at least
    once): a small store's run is short, and its minimum needs more samples."""
    print(f"\n{name}: microseconds per entry, min / median")
    samples: dict[int, list[list[float]]] = {n: [] for n in sizes}
    for _ in range(repeat):
        for n in sizes:
            for _ in range(max(1, 100 // n)):
                samples[n].append(run(fresh(), n))
    print(f"{'N':>6} {'runs':>5} | " + " | ".join(f"{c:>17}" for c in _COLUMNS))
    cols = {n: list(zip(*samples[n], strict=True)) for n in sizes}
    for n in sizes:
        print(
            f"{n:>6} {len(samples[n]):>5} | "
            + " | ".join(f"{min(c):7.1f} / {statistics.median(c):7.1f}" for c in cols[n])
        )
    lo, hi = cols[sizes[0]], cols[sizes[-1]]
    for i, what in enumerate(_COLUMNS):
        print(
            f"ratio N={sizes[-1]} / N={sizes[0]}, {what}: {min(hi[i]) / min(lo[i]):.2f} (min), "
            f"{statistics.median(hi[i]) / statistics.median(lo[i]):.2f} (median)"
        )


def killed_writers(root: Path, keys: int, temps: int) -> None:
    """A namespace of ``keys`` entries (written in the documented layout, the journal included)
    and ``temps`` half-written temporary files; a reader serves every key."""
    store = Directory(root)
    probe = specialized(store, keys)
    ns = probe._namespace()
    d = root / "v1" / ns
    d.mkdir(parents=True, exist_ok=True)
    records = []
    for key, data in entries(keys):
        (d / f"{key}.twe").write_bytes(data)
        records.append(b"\n" + key.encode() + b"\n")
    (d / "journal").write_bytes(b"".join(records))
    for i in range(temps):
        (d / f".tmp-{i:08x}.part").write_bytes(b"\x89TWE\r\n\x1a\n half an entry")
    r = specialized(Directory(root), keys)
    t0, c0 = _clock()
    for i in range(keys):
        assert r(i) == i + 1
    t1, c1 = _clock()
    assert r.store_loads == keys
    misses = []
    for i in range(200):  # misses in an unchanged store: one stat each, then a compile
        t = time.perf_counter()
        r._load_store()
        misses.append(time.perf_counter() - t)
    print(
        f"\nkilled writers: {keys} entries + {temps} temporary files: a reader serves {keys} calls in "
        f"{t1 - t0:.3f} s wall, {c1 - c0:.3f} s CPU "
        f"({(c1 - c0) / keys * 1e6:.1f} us CPU per entry); "
        f"a miss's store read in the unchanged store: {min(misses) * 1e6:.1f} / "
        f"{statistics.median(misses) * 1e6:.1f} us (min / median)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--no-redis", action="store_true")
    args = p.parse_args(argv)
    print(
        f"Python {sys.version.split()[0]}; fsync per entry (Directory: the entry's bytes before its rename)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1_000_000))

        def fresh_directory() -> Callable[[], Any]:
            path = Path(tmp) / f"d{next(counter)}"
            return lambda: Directory(path)

        scaling("@specialize, Directory", fresh_directory, args.sizes, args.repeat)
        scaling(
            "Directory alone (read + save per entry)", fresh_directory, args.sizes, args.repeat, store_alone
        )
        scaling(
            "@specialize without a store (misses, then hits)",
            fresh_directory,
            args.sizes,
            args.repeat,
            no_store,
        )
        killed_writers(Path(tmp) / "killed", 2000, 2000)
    if not args.no_redis:
        proc, url = start_redis()
        if proc is None:
            print("\nRedis: redis-server not found, skipped")
            return 0
        try:

            def fresh_redis() -> Callable[[], Any]:
                prefix = f"b{next(counter)}"
                return lambda: Redis(url, prefix=prefix)

            scaling(
                "@specialize, Redis (loopback; the server's CPU is not counted)",
                fresh_redis,
                args.sizes,
                args.repeat,
            )
            scaling("Redis alone (read + save per entry)", fresh_redis, args.sizes, args.repeat, store_alone)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
