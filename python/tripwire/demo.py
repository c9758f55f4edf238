"""The demo: what a JIT does with tripwire, on a small example.

A "compiled" function was specialised for a model object and a config dict. We build the
guards that decide whether that compiled code may be reused, check them on a new call that
matches, on calls that do not (with the reason), show the explained tree, and show that a
guarded object's death invalidates the set.
"""

from __future__ import annotations

import gc
import time

from . import GuardBuilder, guards_for


class Layer:
    def __init__(self, width: int, act: str) -> None:
        self.width = width
        self.act = act
        self.training = False


class Model:
    def __init__(self) -> None:
        self.layers = [Layer(64, "relu"), Layer(32, "gelu")]
        self.scale = 0.5


def _ns_per_check(gs, f_locals, n: int = 20000) -> float:
    check = gs.check
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            check(f_locals)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def run() -> int:
    model = Model()
    cfg = {"mode": "fast", "unroll": 4}
    example = {"self": model, "cfg": cfg, "n": 3}

    print("== 1. Build guards against the example call f(self=model, cfg=cfg, n=3)")
    b = GuardBuilder(example)
    b.id_match("L['self']")
    b.type_match("L['self'].layers")
    b.length("L['self'].layers")
    for i in range(2):
        b.type_match(f"L['self'].layers[{i}]")
        b.equals(f"L['self'].layers[{i}].width")
        b.equals(f"L['self'].layers[{i}].act")
        b.false(f"L['self'].layers[{i}].training")
    b.equals("L['self'].scale")
    b.dict_keys("L['cfg']")
    b.equals("L['cfg']['mode']")
    b.equals("L['n']")
    gs = b.build()
    print(f"   {gs!r}")

    print("\n== 2. A call that matches passes")
    same = {"self": model, "cfg": {"mode": "fast", "unroll": 8}, "n": 3}
    print(f"   check -> {gs.check(same)}   ({_ns_per_check(gs, same):.0f} ns per check)")

    print("\n== 3. Calls that do not match fail, with the reason")
    model.layers[1].act = "silu"
    print(f"   after model.layers[1].act = 'silu': check -> {gs.check(same)}")
    print(f"   why_not: {gs.why_not(same).reason}")
    model.layers[1].act = "gelu"
    other = {"self": model, "cfg": {"mode": "fast"}, "n": 3.0}
    for f in gs.failures(other):
        print(f"   failure: {f.reason}")

    print("\n== 4. The explained tree (adaptive order, failure counts, where each guard was installed)")
    print("   " + gs.explain().replace("\n", "\n   "))

    print("\n== 5. Inferred input guards (guards_for), Dynamo-style")
    inferred = guards_for({"xs": [1, 2.5, "a"], "opts": {"k": 3}, "flag": True})
    for g in inferred:
        print(f"   {g.kind.name:14s} {g.describe()}")

    print("\n== 6. Invalidation: the guarded object dies")
    del example, same, other, b
    model = None
    gc.collect()
    print(f"   {gs!r}; check -> {gs.check({'self': Model(), 'cfg': cfg, 'n': 3})}")
    print(f"   reason: {gs.invalid_reason}")
    return 0
