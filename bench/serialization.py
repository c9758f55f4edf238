"""Guard-set serialization cost, in one run: bytes per guard; encode, and decode plus resolve,
per guard for a 1,000-guard set, against pickle of an equivalent plain structure; and torch's own
guard save/load for a compiled function when torch is importable.

The set: guards_for on a frame of 1,000 guards of the kinds Dynamo installs most (types,
constants of every constant type, lengths, dict keys, nested containers, enum members, function
code, module-level classes by identity), references to 6 distinct objects. Timings (min and
median of --repeat runs, each the mean of --number calls):

  to_bytes          GuardSet.to_bytes(): naming, encoding (C++), and the proof (decode + rebuild)
  encode only       the C++ encoder on the prepared declarations (to_bytes minus naming and proof)
  decode            the C++ decoder and validator alone (_core.decode_guard_set)
  decode+resolve    decode, resolve every reference (lookup + fingerprint) and build the constants
  from_bytes        GuardSet.from_bytes(): all of the above, every load-time check (source texts
                    against steps, operands: one C++ pass) and the engine's compiled tree (a set
                    ready to check); the GuardSpecs are built on the first diagnostic
  + first diagnostic   from_bytes, then .guards (the lazy GuardSpec build) on the fresh set
  live build        GuardSet(specs): compiling the same GuardSpecs in this process (what a load
                    replaces), the specs made beforehand
  guards_for        inferring and building the same set from the frame
  pickle.dumps/loads   the same guards as a plain structure: (kind, source text, arguments, index,
                    install stack), classes, functions, code and enum members as (module, qualname)

    python bench/serialization.py [--guards 1000] [--repeat 11] [--number 20] [--no-torch]
"""

from __future__ import annotations

import argparse
import enum
import os
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import tripwire as tw
from tripwire import _core
from tripwire.catalogue import resolve


class Mode(enum.Enum):
    FAST = 1
    SLOW = 2


class Layer:
    pass


def helper(x: Any) -> Any:
    return x


def make_frame(n_guards: int) -> dict[str, Any]:
    """A frame whose inferred guards number about n_guards."""
    items = []
    i = 0
    while True:
        k = i % 8
        if k == 0:
            v: Any = {"mode": Mode.FAST, "depth": i, "name": f"layer{i}"}
        elif k == 1:
            v = (i, float(i) + 0.5, f"s{i}")
        elif k == 2:
            v = helper
        elif k == 3:
            v = [i, None, True]
        elif k == 4:
            v = Layer
        elif k == 5:
            v = b"bytes%d" % i
        elif k == 6:
            v = range(i, i + 10)
        else:
            v = {"inner": {"a": i, "b": (1, 2)}}
        items.append(v)
        i += 1
        if i % 16 == 0:
            gs = tw.guards_for({f"a{j}": x for j, x in enumerate(items)}, globals())
            if len(gs) >= n_guards:
                return {f"a{j}": x for j, x in enumerate(items)}


def timed(fn: Callable[[], Any], number: int, repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number)
    return min(runs), statistics.median(runs)


def _plain_arg(a: Any) -> Any:
    a = resolve(a)
    if _core.is_constant(a) and not isinstance(a, enum.Enum):
        return a
    # Classes, functions, code objects and enum members by name, as a reference would store them
    # (pickle itself cannot pickle builtins.function, for one).
    return (getattr(a, "__module__", None) or "", getattr(a, "__qualname__", None) or repr(a))


def plain(gs: tw.GuardSet) -> list[tuple]:
    """The guards as plain data for pickle: (kind, source text, arguments, index, install stack)."""
    return [
        (s.kind.name, str(s.source), tuple(_plain_arg(a) for a in s.args), s.index, s.stack)
        for s in gs.guards
    ]


def torch_numbers(repeat: int) -> dict[str, Any] | None:
    """torch's guard serialization (GuardsState pickle) for a compiled function, if reachable."""
    try:
        import torch
        from torch._dynamo import guards as dguards
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"torch not importable: {e}"}
    saved: dict[str, Any] = {}
    original = dguards.CheckFunctionManager.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        saved["manager"] = self

    try:
        torch._dynamo.reset()
        dguards.CheckFunctionManager.__init__ = spy  # type: ignore[method-assign]
        cfg = {"mode": "fast", "depth": 3}

        def fn(x: Any, n: int, cfg: dict) -> Any:
            return x * n + cfg["depth"]

        with torch._dynamo.config.patch(caching_precompile=True):
            torch.compile(fn, backend="eager")(torch.ones(3), 2, cfg)
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"compile failed: {type(e).__name__}: {e}"}
    finally:
        dguards.CheckFunctionManager.__init__ = original  # type: ignore[method-assign]
    mgr = saved.get("manager")
    blob = getattr(mgr, "guards_state", None)
    if blob is None:
        return {"skipped": "CheckFunctionManager kept no guards_state (caching_precompile path not taken)"}
    from torch._dynamo import package

    state = package.load_guards_state(blob)
    code = fn.__code__
    scope = fn.__globals__

    def load() -> Any:
        return package.load_guard_manager(package.load_guards_state(blob), code, scope)

    manager = load()
    args = {"x": torch.ones(3), "n": 2, "cfg": cfg}
    assert manager.check(args), "torch's rebuilt guards fail on the example"
    del state
    # Saving happens inside torch.compile (serialize_guards on the live builder state): only the
    # load is timed here.
    loaded = timed(load, 5, repeat)
    # The same compile's guards imported into tripwire (guards_of: every guard torch decided,
    # the tensor's included), saved and loaded the same way.
    ours = tw.torch.guards_of(fn)
    data = ours.to_bytes()
    back = tw.GuardSet.from_bytes(data, f_globals=scope)
    assert back.check(tw.torch.frame_locals(fn, **args)), "the loaded set fails on the example"
    return {
        "bytes": len(blob),
        "load": loaded,
        "tw_guards": len(ours),
        "tw_bytes": len(data),
        "tw_load": timed(lambda: tw.GuardSet.from_bytes(data, f_globals=scope), 50, repeat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guards", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    frame = make_frame(args.guards)
    gs = tw.guards_for(frame, globals())
    n = len(gs)
    data = gs.to_bytes()
    doc = _core.decode_guard_set(data)
    refs = doc.references
    from tripwire import serialization

    lookup = serialization._importer(None, None)

    def decode_resolve() -> None:
        d = _core.decode_guard_set(data)
        objs = [lookup(i, r) for i, r in enumerate(d.references)]
        d.constants(objs)

    # The encoder alone, on the declarations to_bytes hands it.
    from tripwire.guard_set import _Pool, encode_decls

    saver = serialization._Saver(gs)
    kept = [saver.check(s) for s in gs.guards]
    pool = _Pool()
    decls = encode_decls(kept, pool)
    weak = [1 if w else 0 for w in pool.weak]
    labels = [""] * len(kept)
    stacks = [list(s.stack) for s in kept]

    def encode_only() -> None:
        _core.encode_guard_set(
            decls,
            pool.consts,
            weak,
            labels,
            stacks,
            saver.references,
            saver.ref_of,
            None,
            [],
            [],
            False,
            "0",
            sys.version_info[:2],
        )

    specs = [
        tw.GuardSpec(g.kind, g.source, tuple(resolve(a) for a in g.args), g.index, g.stack) for g in gs.guards
    ]
    structure = plain(gs)
    pickled = pickle.dumps(structure)
    print(f"guard set: {n} guards on {gs.node_count} sources, {len(refs)} references")
    print(
        f"bytes: {len(data)} total, {len(data) / n:.1f} per guard (pickle of the plain structure: "
        f"{len(pickled)}, {len(pickled) / n:.1f} per guard)"
    )
    rows = [
        ("to_bytes", lambda: gs.to_bytes()),
        ("encode only", encode_only),
        ("decode", lambda: _core.decode_guard_set(data)),
        ("decode+resolve", decode_resolve),
        ("from_bytes", lambda: tw.GuardSet.from_bytes(data)),
        ("+ first diagnostic", lambda: tw.GuardSet.from_bytes(data).guards),
        ("live build", lambda: tw.GuardSet(specs, globals())),
        ("guards_for", lambda: tw.guards_for(frame, globals())),
        ("pickle.dumps", lambda: pickle.dumps(structure)),
        ("pickle.loads", lambda: pickle.loads(pickled)),
    ]
    results = {}
    print(f"{'':18} {'min us/set':>11} {'median':>9} {'ns/guard (min)':>15} {'per 1,000 guards (min)':>23}")
    for name, fn in rows:
        lo, med = timed(fn, args.number, args.repeat)
        results[name] = lo
        print(
            f"{name:18} {lo * 1e6:11.1f} {med * 1e6:9.1f} {lo / n * 1e9:15.0f} {lo / n * 1000 * 1e3:20.3f} ms"
        )
    print(
        f"ratios (min): from_bytes / live build = {results['from_bytes'] / results['live build']:.3f}, "
        f"from_bytes / guards_for = {results['from_bytes'] / results['guards_for']:.3f}, "
        f"from_bytes / pickle.loads = {results['from_bytes'] / results['pickle.loads']:.1f}, "
        f"decode+resolve / pickle.loads = {results['decode+resolve'] / results['pickle.loads']:.2f}, "
        f"to_bytes / pickle.dumps = {results['to_bytes'] / results['pickle.dumps']:.1f}"
    )
    target = results["decode+resolve"] / n * 1000 * 1e3
    print(
        f"target (load at most 1 ms per 1,000 guards): decode+resolve {target:.3f} ms, "
        f"from_bytes {results['from_bytes'] / n * 1e6:.3f} ms"
    )
    if not args.no_torch and os.environ.get("TRIPWIRE_BENCH_TORCH", "1") != "0":
        t = torch_numbers(args.repeat)
        if t is not None:
            if "skipped" in t:
                print(f"torch: {t['skipped']}")
            else:
                print(
                    f"torch 2.13 GuardsState (caching_precompile) of fn(x: Tensor, n: int, cfg: dict): "
                    f"{t['bytes']} bytes; load (pickle.loads + CheckFunctionManager rebuild) "
                    f"{t['load'][0] * 1e6:.1f} us min / {t['load'][1] * 1e6:.1f} median"
                )
                lo, med = t["tw_load"]
                print(
                    f"tripwire, the same compile's guards imported (guards_of): {t['tw_guards']} guards, "
                    f"{t['tw_bytes']} bytes; from_bytes {lo * 1e6:.1f} us min / {med * 1e6:.1f} median"
                )


if __name__ == "__main__":
    main()
