#!/usr/bin/env python
"""Instructions per build of 20 shape relations: ``python bench/shape_build_instructions.py``
(bench/README.md, "Shape relations"; wall times on a loaded machine disagree, these do not).

The 20 relations are the code parts torch 2.13 prints for ``f_twenty`` of bench/shape_eval.py (a
function over three dynamic tensors), with the same example tensors; torch compiles the function
once, in this parent process. Each mode then runs in its own ``valgrind --tool=callgrind`` child
(``--instr-atstart=no``: importing torch runs uninstrumented), collecting only inside
``_floor.repeat_call`` (bench/floor.c), called twice (20 then 120 builds, one dump after each);
per build = the difference / 100, so the call's own set-up cancels. Before counting, every mode is
run once (warm memos, as in a process that has built these texts before; the cold modes build
texts it has not seen). The modes are the rows of bench/shape_eval.py's build table:

- ``builder``: ``GuardBuilder(example)``, ``relations_from_torch`` + ``GuardBuilder.shape`` per
  part, ``build()`` (what a JIT does);
- ``engine``: ``GuardSet(specs)`` on the builder's specs (encoding and the C++ build);
- ``cold``: ``builder`` on texts never built before: the locals renamed per build
  (bench/shape_eval.py ``_fresh``, made before counting), so every memo keyed by text misses (what a
  JIT pays for a new function's guards);
- ``cold_parse``, ``cold_shape`` (not run by default): the cold build up to the end of its parse
  (``relations_from_torch`` of every part) and of its ``GuardBuilder.shape`` calls (no
  ``build()``). The phases are the differences: parse = cold_parse, shape = cold_shape -
  cold_parse, build = cold - cold_shape (``--modes cold_parse,cold_shape,cold``).

``--modes builder,engine`` picks modes; ``--keep`` keeps the callgrind outputs (for
``callgrind_annotate``) and prints where they are.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile

import _callgrind

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("builder", "engine", "cold")
PHASE_MODES = ("cold_parse", "cold_shape")
LO, HI = 20, 120


def _example() -> dict:
    import torch

    return {"x": torch.randn(8, 3), "y": torch.randn(10), "w": torch.randn(4, 9)}


def child(mode: str, parts_file: str) -> None:
    sys.path.insert(0, HERE)
    import floor_build
    import shape_eval as bench
    import tripwire as tw

    floor = floor_build.load()
    with open(parts_file) as f:
        parts = json.load(f)
    example = _example()
    specs: list = []

    # Fresh texts for every cold build, made before counting (the warm-up's, then LO + HI).
    fresh = iter([bench._fresh(parts, example, k) for k in range(2 * (1 + LO + HI))])

    def cold(_: object) -> None:
        bench._tripwire_set(*next(fresh))

    def cold_parse(_: object) -> None:
        for part in next(fresh)[0]:
            tw.shapes.relations_from_torch(part)

    def cold_shape(_: object) -> None:
        fresh_parts, fresh_example = next(fresh)
        b = tw.GuardBuilder(fresh_example)
        for part in fresh_parts:
            for rel in tw.shapes.relations_from_torch(part):
                b.shape(rel)

    runs = {
        "cold": cold,
        "cold_parse": cold_parse,
        "cold_shape": cold_shape,
        "builder": lambda _: bench._tripwire_set(parts, example),
        "engine": lambda _: tw.GuardSet(specs),
    }
    runs["cold"](None)
    if mode in PHASE_MODES:
        runs[mode](None)
    gs, b = bench._tripwire_set(parts, example)  # the memos as the builder rows leave them
    assert gs.check(example) and len(gs.guards) == 20
    # The engine row builds the specs of a build made after the memos were filled: its sources are
    # the memoised Source objects (as for a builder), not equal copies.
    specs[:] = b.guards
    runs["engine"](None)
    gc.collect()
    gc.disable()
    floor.start_instrumentation()
    for n in (LO, HI):
        floor.repeat_call(runs[mode], None, n)


def count(mode: str, parts_file: str, out_dir: str) -> float:
    totals = _callgrind.totals(
        [os.path.abspath(__file__), "--child", mode, parts_file],
        os.path.join(out_dir, f"callgrind.{mode}"),
        instr_atstart=False,
        env={"PYTHONHASHSEED": "0"},
    )
    if totals is None or len(totals) != 2:
        raise SystemExit(f"callgrind failed for {mode}")
    return (totals[1] - totals[0]) / (HI - LO)


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--keep", action="store_true", help="keep the callgrind outputs")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import shape_eval as bench

    out_dir = tempfile.mkdtemp(prefix="tripwire-shape-build-ir-")
    _gm, lam, _ = bench._torch_entry(bench.f_twenty, _example())
    parts = list(lam.verbose_code_parts())[:20]
    assert len(parts) == 20, len(parts)
    parts_file = os.path.join(out_dir, "parts.json")
    with open(parts_file, "w") as f:
        json.dump(parts, f)
    print(f"instructions per build of 20 relations (callgrind, {HI} - {LO} builds, PYTHONHASHSEED=0)")
    for mode in args.modes.split(","):
        print(f"  {mode:10} {count(mode, parts_file, out_dir):12,.0f}", flush=True)
    if args.keep:
        print(f"callgrind outputs: {out_dir}")
    else:
        shutil.rmtree(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
