"""Per-check cost of the C++ tensor steps (TENSOR_SIZE, GRAD) and STORAGE_OVERLAPPING, against
tripwire's Python-level SIZE step (read by the C-level reader on the fast pass). Wall time, one
run, 7 repeats of 20,000 checks: min and median. ``python bench/cpp_tensor_steps.py``."""

import statistics
import timeit

import torch

import tripwire as tw
from tripwire import GuardBuilder, Source

x = torch.randn(8, 3)
L = {"x": x}


def build(src):
    b = GuardBuilder(L)
    b.equals(src, 8)
    return b.build()


s = Source.local("x")
sets = {
    "SIZE (C-level reader, fast pass)": build(s.step(tw.StepKind.SIZE, 0)),
    "TENSOR_SIZE (adapter, walk)": build(s.tensor_size(0)),
}
g = torch.randn(8, 3, requires_grad=True)
g.grad = torch.ones(8, 3)
b = GuardBuilder({"x": g})
b.not_none(s.grad())
sets["GRAD + NOT_NONE"] = b.build()
base = torch.arange(20.0)
Lo = {"a": base[0:6], "b": base[4:10], "c": base[12:18]}
b = GuardBuilder(Lo)
b.storage_overlapping(overlapping=["L['a']", "L['b']"], non_overlapping=["L['c']"])
sets["STORAGE_OVERLAPPING (3 tensors)"] = b.build()
for name, gs in sets.items():
    loc = Lo if "OVERLAP" in name else ({"x": g} if "GRAD" in name else L)
    assert gs.check(loc)
    n = 20000
    ts = [timeit.timeit(lambda: gs.check(loc), number=n) / n * 1e9 for _ in range(7)]
    print(f"{name}: min {min(ts):.0f} ns, median {statistics.median(ts):.0f} ns per check")
