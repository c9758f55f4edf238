#!/usr/bin/env python
"""Instructions per check of torch's global-state guards, tripwire's probes against torch's leaf:
``python bench/global_state_instructions.py`` (bench/README.md, "G1 by instructions").

Each contender runs in its own ``valgrind --tool=callgrind`` child, collecting only inside
``_floor.repeat_call``, at two check counts; per check = the difference / the difference in
counts, so setup and the first calls cancel. Contenders: tripwire's empty set, a set holding only
``global_state("torch_global_state")``, only ``global_state("torch_saved_tensors_hooks")``,
torch's empty ``RootGuardManager`` and one holding only its GLOBAL_STATE leaf.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONTENDERS = ("tw_empty", "tw_global_state", "tw_saved_tensors_hooks", "torch_empty", "torch_global_state")


def child(which: str, n: int) -> None:
    sys.path.insert(0, HERE)
    import torch  # noqa: F401
    from torch._C._dynamo import guards as G

    import floor_build
    import tripwire as tw

    floor = floor_build.load()
    if which.startswith("tw"):
        b = tw.GuardBuilder({})
        if which != "tw_empty":
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
    floor.repeat_call(fn, {}, n)


def count(which: str, n: int, out_dir: str) -> int:
    out = os.path.join(out_dir, f"callgrind.{which}.{n}")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=tw_bench_repeat_call",
        f"--callgrind-out-file={out}",
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        which,
        str(n),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    with open(out) as f:
        return next(int(line.split()[1]) for line in f if line.startswith(("summary:", "totals:")))


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return 0
    lo, hi = 2_000, 12_000
    out_dir = tempfile.mkdtemp(prefix="tripwire-g1-")
    per = {w: (count(w, hi, out_dir) - count(w, lo, out_dir)) / (hi - lo) for w in CONTENDERS}
    print(f"instructions per check (callgrind, {hi} - {lo} checks; outputs in {out_dir})")
    for w in CONTENDERS:
        base = per["tw_empty"] if w.startswith("tw") else per["torch_empty"]
        extra = "" if w.endswith("empty") else f"   minus empty: {per[w] - base:,.0f}"
        print(f"  {w:24} {per[w]:8,.0f}{extra}")
    tw_gs = per["tw_global_state"] - per["tw_empty"]
    torch_gs = per["torch_global_state"] - per["torch_empty"]
    print(f"  global state, tripwire / torch: {tw_gs / torch_gs:.3f} (target <= 0.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
