"""Seconds per MB of the worst hostile inputs of each loader, at several sizes: a load must be
linear in its input, so each row's s/MB is flat across sizes.

Loaders and inputs (tests/python/support/hostile_docs.py builds them from docs/format.md):

  from_bytes      GuardSet.from_bytes of each hostile document: one long multi-byte string, one
                  string named over and over (refused by the string budget), many tiny constants,
                  deep constant trees, many guards, a frozenset of ints that all hash alike
                  (refused past 16 per hash), one of 16 ints per hash (loaded), one SHAPE relation
                  over many symbols, SHAPE literals at the digit limit, one relation named over
                  and over (refused)
  store entry     what @specialize does with a stored entry (tripwire.specialized._load_store):
                  decode_entry, from_bytes of its guards (the many-guards document), and the
                  reference codec's decode of a payload of "[" (refused: FormatError)
  relation text   GuardBuilder.shape of each hostile text on its example, every memo emptied: a
                  literal of all the digits (refused before conversion), literals at the limit, many
                  distinct symbols, long * and + chains (exact ints up to the 65,536-bit limit),
                  a long `and` chain

Each cell is min / median over --repeat runs of seconds per MB of input; the last column divides
the largest size's min by the next size's (flat: about 1).

    python bench/hostile_load.py [--sizes 0.1,1,10] [--repeat 3] [--only NAME]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "python" / "support"))

import hostile_docs as hd
import tripwire as tw
from tripwire import shapes
from tripwire.store import ReferenceCodec, decode_entry, encode_entry


def load_doc(data: bytes) -> str:
    try:
        tw.GuardSet.from_bytes(data)
    except tw.FormatError:
        return "refused"
    return "loaded"


def load_entry(data: bytes) -> str:
    entry = decode_entry(data)
    outcome = load_doc(entry.guards)
    try:
        ReferenceCodec(["hostile_docs"]).decode(entry.payload)
    except tw.FormatError:
        return outcome + ", payload refused"
    return outcome + ", payload loaded"


def build_shape(text: str, frame: dict) -> str:
    shapes.clear_memos()
    b = tw.GuardBuilder(frame)
    try:
        b.shape(text)
    except tw.ShapeSyntaxError:
        return "refused (syntax)"
    except tw.GuardBuildError:
        return "built, does not hold"
    return "built"


def cases(size: int) -> list[tuple[str, str, int, Callable[[], str]]]:
    """(loader, input, bytes, run) for inputs of about `size` bytes."""
    out: list[tuple[str, str, int, Callable[[], str]]] = []
    for name, make in hd.DOCUMENTS.items():
        data = make(size)
        out.append(("from_bytes", name, len(data), lambda d=data: load_doc(d)))
    entry = encode_entry(hd.many_guards(size // 2), "reference", b"[" * (size // 2))
    out.append(("store entry", "many_guards + '[' payload", len(entry), lambda e=entry: load_entry(e)))
    for name, (text, frame) in hd.relation_texts(size).items():
        n = len(text.encode())
        out.append(("relation text", name, n, lambda t=text, f=frame: build_shape(t, f)))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="0.1,1,10", help="input sizes in MB, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=None, help="only inputs whose name contains this")
    args = ap.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",")]
    rows: dict[tuple[str, str], dict[float, tuple[float, float, str]]] = {}
    for mb in sizes:
        for loader, name, n, run in cases(int(mb * 1_000_000)):
            if args.only and args.only not in name:
                continue
            per_mb = []
            outcome = ""
            for _ in range(args.repeat):
                gc.collect()  # each run from a collected heap: the previous input's garbage is not its cost
                t0 = time.perf_counter()
                outcome = run()
                per_mb.append((time.perf_counter() - t0) / (n / 1e6))
            rows.setdefault((loader, name), {})[mb] = (min(per_mb), statistics.median(per_mb), outcome)
            print(f"  {loader:13s} {name:32s} {n / 1e6:7.3f} MB  {min(per_mb):7.3f} / "
                  f"{statistics.median(per_mb):7.3f} s/MB  {outcome}", file=sys.stderr, flush=True)  # fmt: skip
    # Flat means linear: read the largest size against the next one (the smallest fits in the
    # caches, so it is cheaper per MB than any larger size).
    head = " | ".join(f"{mb:g} MB" for mb in sizes)
    print(f"| loader | input | {head} | largest / next (min) | outcome |")
    print("|---|---|" + "---|" * len(sizes) + "---|---|")
    for (loader, name), by_size in rows.items():
        cells = " | ".join(
            f"{by_size[mb][0]:.3f} / {by_size[mb][1]:.3f}" if mb in by_size else "-" for mb in sizes
        )
        done = [mb for mb in sizes if mb in by_size]
        last, prev = by_size[done[-1]][0], by_size[done[max(0, len(done) - 2)]][0]
        ratio = last / prev if prev > 0 else float("nan")
        print(f"| {loader} | {name} | {cells} | {ratio:.2f} | {by_size[done[-1]][2]} |")


if __name__ == "__main__":
    main()
