"""Instruction counts of loading a guard set (bench/README.md, "Serialization"): run under callgrind.

    python bench/serialization_instructions.py prepare            # writes the blob and the pickle
    valgrind --tool=callgrind python bench/serialization_instructions.py from_bytes 0
    valgrind --tool=callgrind python bench/serialization_instructions.py from_bytes 10
    valgrind --tool=callgrind python bench/serialization_instructions.py pickle 10
    valgrind --tool=callgrind python bench/serialization_instructions.py live 10

Each run reads the set of bench/serialization.py (1,044 guards) and the pickle of its plain
structure, builds the GuardSpecs from one load and makes one call of each mode as a warm-up, then
N calls of its mode; (Ir of N calls - Ir of 0 calls) / N is the count per call.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import serialization as bench  # noqa: E402 - the set's references name this module
import tripwire as tw  # noqa: E402
from tripwire.catalogue import resolve  # noqa: E402

DIR = os.environ.get("TRIPWIRE_BENCH_DIR", os.path.join(tempfile.gettempdir(), "tripwire-serialization-ir"))


def main() -> None:
    if len(sys.argv) < 2 or (sys.argv[1] != "prepare" and len(sys.argv) < 3):
        raise SystemExit(__doc__)
    mode = sys.argv[1]
    if mode == "prepare":
        os.makedirs(DIR, exist_ok=True)
        gs = tw.guards_for(bench.make_frame(1000), vars(bench))
        with open(os.path.join(DIR, "blob"), "wb") as f:
            f.write(gs.to_bytes())
        with open(os.path.join(DIR, "pickled"), "wb") as f:
            f.write(pickle.dumps(bench.plain(gs)))
        return
    n = int(sys.argv[2])
    with open(os.path.join(DIR, "blob"), "rb") as f:
        data = f.read()
    with open(os.path.join(DIR, "pickled"), "rb") as f:
        pickled = f.read()
    first = tw.GuardSet.from_bytes(data)
    specs = [
        tw.GuardSpec(g.kind, g.source, tuple(resolve(a) for a in g.args), g.index, g.stack)
        for g in first.guards
    ]
    pickle.loads(pickled)
    tw.GuardSet(specs, vars(bench))
    for _ in range(n):
        if mode == "from_bytes":
            tw.GuardSet.from_bytes(data)
        elif mode == "pickle":
            pickle.loads(pickled)
        elif mode == "live":
            tw.GuardSet(specs, vars(bench))
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
