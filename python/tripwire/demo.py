"""The demo: what a JIT does with tripwire, on a small example.

A "compiled" function was specialised for a model object and a config dict. We build the
guards that decide whether that compiled code may be reused, check them on a new call that
matches, on calls that do not (with the reason), show the explained tree, and show that a
guarded object's death invalidates the set.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from . import GuardBuilder, GuardSet, guards_for


class Layer:
    def __init__(self, width: int, act: str) -> None:
        self.width = width
        self.act = act
        self.training = False


class Model:
    def __init__(self) -> None:
        self.layers = [Layer(64, "relu"), Layer(32, "gelu")]
        self.scale = 0.5


def _ns_per_check(gs: GuardSet, f_locals: dict[str, Any], n: int = 20000) -> float:
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
    failure = gs.why_not(same)
    print(f"   why_not: {failure.reason if failure else None}")
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
    del model
    gc.collect()
    print(f"   {gs!r}; check -> {gs.check({'self': Model(), 'cfg': cfg, 'n': 3})}")
    print(f"   reason: {gs.invalid_reason}")

    _jit_demo()
    return 0


def _jit_demo() -> None:
    """A JIT end to end with @specialize: compile, hit, recompile with a reason, the limit, an
    invalidation."""
    import io
    import logging

    from . import RecompileLimitExceeded
    from .logs import RECOMPILES, set_logs
    from .specialized import specialize

    compiles: list[str] = []

    def compiler(fn, example_args, builder):
        # a "JIT": specialise on the arguments it saw; pin the model object by identity
        builder.id_match("L['model']")
        mode = example_args["cfg"]["mode"]
        compiles.append(f"{mode}/n={example_args['n']}")

        def compiled(model, cfg, n):
            return fn(model, cfg, n)

        return compiled

    def forward(model, cfg, n):
        return model.scale * n

    fwd = specialize(forward, compiler=compiler, backend="demo", recompile_limit=3)
    stream = io.StringIO()
    set_logs("recompiles", stream=stream)
    propagate, RECOMPILES.propagate = RECOMPILES.propagate, False  # the demo prints it itself
    try:
        print("\n== 7. @specialize: a JIT on top of the cache")
        model = Model()
        cfg = {"mode": "fast"}
        fwd(model, cfg, 3)
        fwd(model, cfg, 3)
        print(
            f"   two calls f(model, cfg, 3): compiled {len(compiles)} time(s), {fwd.cache.stats['hits']} hit(s)"
        )

        print("\n== 8. A recompile, with its reason (TRIPWIRE_LOGS=recompiles)")
        fwd(model, {"mode": "slow"}, 3)
        print("   " + stream.getvalue().strip().replace("\n", "\n   "))

        print("\n== 9. The recompile limit (recompile_limit=3, on_limit='raise')")
        RECOMPILES.setLevel(logging.WARNING)
        fwd(model, cfg, 4)
        try:
            fwd(model, cfg, 5)
        except RecompileLimitExceeded as e:
            print(f"   RecompileLimitExceeded: {str(e)[:160]}...")

        print("\n== 10. Invalidation: the model dies, its entries can never hit again")
        before = len(compiles)
        del model
        gc.collect()
        fwd(Model(), cfg, 3)
        print(
            f"   a new Model at f(new, cfg, 3): compiled again ({len(compiles) - before} compile); "
            f"stats {dict((k, v) for k, v in fwd.cache.stats.items() if k != 'entries')}"
        )
    finally:
        RECOMPILES.propagate = propagate
        set_logs("")
