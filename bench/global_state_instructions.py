#!/usr/bin/env python
"""Instructions per check of torch's global-state guards, tripwire's probes against torch's leaf:
``python bench/global_state_instructions.py`` (bench/README.md, "G1 by instructions").

Each contender runs in its own ``valgrind --tool=callgrind`` child, collecting only inside
``_floor.repeat_call``, called twice (2,000 then 12,000 checks, one dump after each); per check =
the difference / 10,000, so the call's own setup cancels. Contenders: tripwire's empty set, a set holding only
``global_state("torch_global_state")``, only ``global_state("torch_saved_tensors_hooks")``, only
``global_state("recursion_limit")`` (an interpreter probe: what any ambient probe costs the engine),
torch's empty ``RootGuardManager`` and one holding only its GLOBAL_STATE leaf.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile

import _callgrind

HERE = os.path.dirname(os.path.abspath(__file__))
CONTENDERS = (
    "tw_empty",
    "tw_global_state",
    "tw_saved_tensors_hooks",
    "tw_recursion_limit",
    "torch_empty",
    "torch_global_state",
)


def child(which: str, counts: list[int]) -> None:
    sys.path.insert(0, HERE)
    import torch  # noqa: F401
    from torch._C._dynamo import guards as G

    import floor_build
    import tripwire as tw

    floor = floor_build.load()
    if which.startswith("tw"):
        b = tw.GuardBuilder({})
        if which == "tw_recursion_limit":
            b.global_state(
                "recursion_limit"
            )  # what one ambient probe costs the engine (gc_enabled: the child disables the GC)
        elif which != "tw_empty":
            b.global_state("torch_" + which.removeprefix("tw_"))
        fn = b.build().check
    else:
        root = G.RootGuardManager()
        if which == "torch_global_state":
            root.add_global_state_guard(G.GlobalStateGuard(), ["___check_global_state()"], None)
        fn = root.check
    for _ in range(100):
        assert fn({})
    gc.collect()
    gc.disable()
    for n in counts:
        floor.repeat_call(fn, {}, n)


def counts(which: str, ns: list[int], out_dir: str) -> list[int]:
    found = _callgrind.totals(
        [os.path.abspath(__file__), "--child", which, *map(str, ns)],
        os.path.join(out_dir, f"callgrind.{which}"),
    )
    if found is None or len(found) != len(ns):
        raise SystemExit(f"callgrind failed for {which}")
    return found


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], [int(x) for x in sys.argv[3:]])
        return 0
    # `python bench/global_state_instructions.py tw_empty tw_global_state`: only those contenders
    chosen = [w for w in CONTENDERS if w in sys.argv[1:]] or list(CONTENDERS)
    lo, hi = 2_000, 12_000
    out_dir = tempfile.mkdtemp(prefix="tripwire-g1-")
    per = {}
    for w in chosen:
        a, b = counts(w, [lo, hi], out_dir)
        per[w] = (b - a) / (hi - lo)
    print(f"instructions per check (callgrind, {hi} - {lo} checks; outputs in {out_dir})")
    for w in chosen:
        base = per["tw_empty"] if w.startswith("tw") else per["torch_empty"]
        extra = "" if w.endswith("empty") else f"   minus empty: {per[w] - base:,.0f}"
        print(f"  {w:24} {per[w]:8,.0f}{extra}")
    if len(chosen) == len(CONTENDERS):
        tw_gs = per["tw_global_state"] - per["tw_empty"]
        torch_gs = per["torch_global_state"] - per["torch_empty"]
        print(f"  global state, tripwire / torch: {tw_gs / torch_gs:.3f} (target <= 0.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
