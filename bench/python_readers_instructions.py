#!/usr/bin/env python
"""Instructions per value of TENSOR_MATCH and ARRAY_MATCH through the Python readers (the path
without the torch adapter or the array struct), against the adapter and the struct:
``python bench/python_readers_instructions.py`` (bench/README.md, "The Python readers").

One ``valgrind --tool=callgrind`` child (torch is imported once) builds every contender, then
collects only inside ``_floor.repeat_call``, called twice per contender (100 then 600 checks, one
dump after each); per check = the difference / 500, so the call's own setup cancels; per value = (per check - the empty set's) / K.
Contenders: tripwire's empty set; K=8 2-D tensors with ``tensor_match`` built under
``_force_python_readers(True)`` and without it (the adapter); K=8 2-D float32 arrays with
``array_match``, the same two ways (the struct). A noise-free second opinion to
``bench/tensor_guards.py -w P1``, for a machine too loaded for nanosecond ratios.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from typing import Any

import _callgrind

HERE = os.path.dirname(os.path.abspath(__file__))
K = 8
CONTENDERS = ("empty", "tensors_python", "tensors_adapter", "arrays_python", "arrays_struct")


def build(which: str) -> tuple[Any, dict]:
    import numpy as np
    import torch

    import tripwire as tw
    from tripwire import _core

    if which.startswith("tensors"):
        values = {sys.intern(f"x{i}"): torch.randn(4, 8) for i in range(K)}
    else:
        values = {sys.intern(f"a{i}"): np.zeros((4, 8), dtype=np.float32) for i in range(K)}
    b = tw.GuardBuilder(values if which != "empty" else {})
    if which != "empty":
        for name in values:
            getattr(b, "tensor_match" if which.startswith("tensors") else "array_match")(f"L['{name}']")
    was = _core._force_python_readers(which.endswith("python"))
    try:
        fn = b.build().check
    finally:
        _core._force_python_readers(was)
    for _ in range(20):
        assert fn(values)
    return fn, values


def child(chosen: list[str], counts: list[int]) -> None:
    sys.path.insert(0, HERE)
    import floor_build
    import tripwire as tw

    tw.tensors.ensure_torch()
    tw.tensors.ensure_numpy()
    floor = floor_build.load()
    built = [build(w) for w in chosen]
    gc.collect()
    gc.disable()
    for fn, values in built:  # one dump after each call: len(counts) dumps per contender, in order
        for n in counts:
            floor.repeat_call(fn, values, n)


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        n_counts = int(sys.argv[2])
        rest = sys.argv[3:]
        child(rest[n_counts:], [int(x) for x in rest[:n_counts]])
        return 0
    chosen = [w for w in CONTENDERS if w in sys.argv[1:]] or list(CONTENDERS)
    if "empty" not in chosen:
        chosen.insert(0, "empty")
    lo, hi = 100, 600
    out_dir = tempfile.mkdtemp(prefix="tripwire-readers-")
    totals = _callgrind.totals(
        [os.path.abspath(__file__), "--child", "2", str(lo), str(hi), *chosen],
        os.path.join(out_dir, "callgrind.readers"),
    )
    if totals is None or len(totals) != 2 * len(chosen):
        raise SystemExit("callgrind failed")
    per = {w: (totals[2 * j + 1] - totals[2 * j]) / (hi - lo) for j, w in enumerate(chosen)}
    print(f"instructions per check (callgrind, {hi} - {lo} checks; outputs in {out_dir})")
    for w in chosen:
        extra = (
            "" if w == "empty" else f"   per value (minus empty, / {K}): {(per[w] - per['empty']) / K:,.0f}"
        )
        print(f"  {w:16} {per[w]:10,.0f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
