"""Guard sets of real torch.compile'd models: tripwire's import of them against torch itself.

The guards come from torch's own guard tree: each workload compiles a real ``nn.Module`` (or a
function) with ``torch.compile(backend="eager", dynamic=False)`` (``marked``: an input under
``mark_dynamic``; ``dynamic``: ``dynamic=True``), and ``tripwire.torch.guards_of`` imports the
cache entry whole: TENSOR_MATCH, the dimension markings, SHAPE relations, NO_TENSOR_ALIASING, the
``a is b`` lambda and torch's framework-state guards map onto tripwire's kinds (the saved-tensor
hooks lambda and Python lambdas call torch's own leaf; ``tripwire.torch.PENDING_KINDS`` holds only
the tensor-property accessors, which these models do not reach). One run compares, on the same
locals:

* ``tripwire``        the imported set (``equals="exact"``: an EQUALS_MATCH on a tuple keeps torch's
                      Python ``==`` and is evaluated by calling torch's own leaf guard);
* ``tripwire-strict`` the same import with ``equals="strict"`` (tripwire's type-exact EQUALS for
                      containers: stricter than torch, so every guard is tripwire's own);
* ``torch-same``      torch's guard manager of the same model compiled with a ``guard_filter_fn``
                      that drops exactly the guard types whose guards tripwire dropped: like for
                      like (the script imports that entry too and checks that it holds the same
                      guards, kind by kind and source by source, as the ``tripwire`` set);
* ``torch``           torch's guard manager with all its guards;
* ``no-op``           ``def f(L): return True``.

    python bench/real_models.py                  # every workload; 15 repeats
    python bench/real_models.py --quick          # smoke run
    python bench/real_models.py -w gpt --instructions   # + callgrind instructions per check

Timing and the table are bench/contenders.py's (``Contender``, ``measure``), the callgrind loop
bench/guard_eval.py's (``_floor.repeat_call``). Models and inputs are seeded: the guard sets are the same on every run.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import gc
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _callgrind  # noqa: E402
import guard_eval  # noqa: E402
from contenders import Contender, fmt_ns, measure, ratio_columns, table  # noqa: E402

# torch guard types (guard_filter_fn's GuardFilterEntry.guard_type) whose guards guards_of would
# not import: none, so the filter keeps everything and torch-same holds torch's whole set.
TORCH_PENDING_GUARD_TYPES: frozenset[str] = frozenset()
WORKLOAD_NAMES = (
    "gpt",
    "cnn",
    "config",
    "lstm",
    "encoder",
    "hooked",
    "marked",
    "dynamic",
    "parametrized",
    "aliased",
    "partial",
    "running",
)


# =================================================================================================
# The models
# =================================================================================================
def _models():
    """bench/torch_models.py (shared with tests/python/pytorch/test_torch_import.py), imported on first
    use: importing this module does not import torch."""
    import torch_models

    return torch_models


@dataclasses.dataclass(frozen=True)
class Optim:
    lr: float = 1e-3
    betas: tuple = (0.9, 0.95)
    clip: float | None = 1.0
    schedule: str = "cosine"


def config_step(x, cfg):
    """A config-driven function: a nested dict of layer specs, a frozen dataclass, lists."""
    y = x
    for name, spec in cfg["layers"].items():
        if spec["op"] == "scale":
            y = y * spec["k"]
        elif spec["op"] == "shift":
            y = y + spec["k"]
        if spec["act"] == "relu":
            y = y.relu()
        if name in cfg["skip"]:
            y = y - 1
    opt = cfg["optim"]
    y = y * opt.lr
    for b in opt.betas:
        y = y + b
    if opt.clip is not None:
        y = y.clamp(-opt.clip, opt.clip)
    if opt.schedule == "cosine":
        y = y.cos()
    return y + cfg["depth"] * len(cfg["tags"])


def config_value(n_layers: int = 12) -> dict:
    return {
        "layers": {
            f"layer{i}": {
                "op": ("scale", "shift")[i % 2],
                "k": 1.0 + i / 10,
                "act": ("relu", "none")[i % 3 == 0],
            }
            for i in range(n_layers)
        },
        "skip": ["layer3", "layer7"],
        "optim": Optim(),
        "depth": n_layers,
        "tags": ["a", "b", "c"],
    }


# =================================================================================================
# Workloads
# =================================================================================================
@dataclass
class Workload:
    name: str
    title: str
    obj: Any  # what torch compiled (a module or function)
    args: tuple
    fail: Callable[[dict], dict]  # a failing variant of the passing locals (one value changed late)
    results: dict = field(default_factory=dict)
    dynamo_config: dict = field(default_factory=dict)  # torch._dynamo.config while compiling
    dynamic: bool | None = False  # torch.compile's `dynamic`


def build(name: str) -> Workload:
    import torch

    torch.manual_seed(0)
    m = _models()
    if name == "gpt":
        cfg = m.GPTConfig(vocab=128, block=32, d=64, heads=4, n_layer=6)
        model = m.GPT(cfg)
        idx = torch.randint(0, cfg.vocab, (2, 16))

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            bad.blocks[-1].mlp.drop.p = 0.1  # the last block's dropout
            return {**L, "self": bad}

        return Workload(
            "gpt",
            f"GPT: {cfg.n_layer} blocks (LayerNorm, q/k/v/o attention, MLP, dropout), "
            "one shared config object",
            model,
            (idx,),
            fail,
        )
    if name == "cnn":
        model = m.ConvNet(c=16, blocks=4, classes=10, bias=False)
        x = torch.randn(2, 3, 16, 16)

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            bad.layers[-1].body[-1].momentum = 0.2  # the last BatchNorm2d
            return {**L, "self": bad}

        return Workload(
            "cnn",
            "ConvNet: stem + 4 residual blocks (Conv2d, BatchNorm2d, ReLU in Sequentials), pool, Linear",
            model,
            (x,),
            fail,
        )
    if name == "config":
        x = torch.ones(8)

        def fail(L: dict) -> dict:
            cfg = copy.deepcopy(L["cfg"])
            cfg["tags"].append("d")
            return {**L, "cfg": cfg}

        return Workload(
            "config",
            "config_step(x, cfg): 12 layer specs in a nested dict, a frozen dataclass, lists",
            config_step,
            (x, config_value()),
            fail,
        )
    if name == "lstm":
        model = m.LSTMLM(vocab=128, d=64, layers=2)
        idx = torch.randint(0, 128, (2, 16))

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            lstm = bad.lstm
            lstm._flat_weights[-1] = lstm._flat_weights[-1].detach().clone()  # no longer the parameter
            return {**L, "self": bad}

        return Workload(
            "lstm",
            "LSTM language model: Embedding, 2-layer LSTM (`a is b` over _flat_weights[i] and "
            "_flat_weight_refs[i]()), Linear",
            model,
            (idx,),
            fail,
            dynamo_config={"allow_rnn": True},
        )
    if name == "encoder":
        model = m.Encoder(d=64, heads=4, layers=4)
        x = torch.randn(2, 16, 64)
        pad = torch.zeros(2, 16, dtype=torch.bool)
        pad[1, 12:] = True

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            bad.enc.layers[-1].norm_first = True  # the last layer
            return {**L, "self": bad}

        return Workload(
            "encoder",
            "TransformerEncoder: 4 post-norm layers with a padding mask (MultiheadAttention's "
            "defaults guarded through its class dict)",
            model,
            (x, pad),
            fail,
        )
    if name == "hooked":
        model = m.Hooked(d=64)
        x = torch.randn(2, 64)

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            bad.a._forward_hooks.clear()  # the hook removed
            return {**L, "self": bad}

        return Workload(
            "hooked",
            "two Linears, a forward hook on the first (hook dicts; nn.Module's _compiled_call_impl "
            "through the MRO)",
            model,
            (x,),
            fail,
        )
    if name in ("marked", "dynamic"):
        # A small model with a dynamic batch: `mark_dynamic` on the input's first dimension, or
        # `dynamic=True` (every input dimension a symbol, the parameters static). Its guards are
        # mostly the fixed cost: torch's ambient state, the tensors, the SHAPE relations.
        model = m.SmallMLP(d=32, hidden=64, out=8)
        x = torch.randn(4, 32)
        if name == "marked":
            torch._dynamo.mark_dynamic(x, 0)

            def fail(L: dict) -> dict:
                return {**L, "x": torch.randn(1, 32)}  # a batch of 1: torch specializes 0 and 1

            title = "two Linears and a ReLU, the input under torch._dynamo.mark_dynamic(x, 0)"
        else:

            def fail(L: dict) -> dict:
                return {**L, "x": torch.randn(4, 33)}  # breaks the Linear's size relation

            title = "two Linears and a ReLU compiled with dynamic=True"
        return Workload(name, title, model, (x,), fail, dynamic=None if name == "marked" else True)
    if name == "parametrized":
        model = m.Parametrized(d=8)
        x = torch.randn(3, 8)

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            bad.c.parametrizations.weight._modules["1"] = m.Symmetric()  # a second parametrization
            return {**L, "self": bad}

        return Workload(
            "parametrized",
            "three parametrized Linears (orthogonal, a custom one, weight norm): NO_HASATTR on "
            "nn.Module subclasses",
            model,
            (x,),
            fail,
        )
    if name == "aliased":
        model = m.Aliased(d=16)
        x = torch.randn(2, 16)

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            bad.scale = 0.25
            return {**L, "self": bad}

        return Workload(
            "aliased",
            "a module class with its own __getattr__ (aliases through super().__getattr__)",
            model,
            (x,),
            fail,
        )
    if name == "partial":
        model = m.PartialAct(d=16)
        x = torch.randn(2, 16)

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            bad.gate.keywords["max"] = 2.0
            return {**L, "self": bad}

        return Workload(
            "partial",
            "activations held as functools.partial objects (func and keywords read from slots)",
            model,
            (x,),
            fail,
        )
    if name == "running":
        model = m.RunningStats(d=16)
        x = torch.randn(8, 16)

        def fail(L: dict) -> dict:
            bad = copy.deepcopy(L["self"])
            bad.momentum = 0.1
            return {**L, "self": bad}

        return Workload(
            "running",
            "running statistics updated in place under no_grad in training mode, then a Linear",
            model,
            (x,),
            fail,
        )
    raise ValueError(name)


def _eager_again(gm, example_inputs):
    """backend="eager" under another identity (torch keeps one cache entry per backend)."""
    return gm.forward


def _filter_pending(entries):
    return [e.guard_type not in TORCH_PENDING_GUARD_TYPES for e in entries]


def _guard_keys(gs) -> collections.Counter:
    """(kind, source, code) of every imported guard; Dynamo numbers the builtins dict it installs
    in the globals per compile (``__builtins_dict___0``, ``___2``...), which is not a difference."""

    def norm(text: str) -> str:
        return re.sub(r"__builtins_dict___\d+", "__builtins_dict___N", text)

    return collections.Counter(
        (g.kind, norm(g.source), norm(g.code))
        for g in gs.torch_import.guards
        if g.outcome in ("native", "torch")
    )


def prepare(
    w: Workload, log: Callable[[str], None], only: set[str] | None = None, probe: bool = False
) -> list[Contender]:
    """Compile, import, verify like for like, and build every contender (asserting each answers
    True on the passing locals and False on the failing ones)."""
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    import tripwire.torch as twt
    from tripwire.torch._tree import resolve_target

    want = (lambda n: True) if only is None else (lambda n: n in only)
    torch._dynamo.reset()
    target = resolve_target(w.obj)
    t0 = time.perf_counter()
    with torch._dynamo.config.patch(**w.dynamo_config):
        torch.compile(w.obj, backend="eager", dynamic=w.dynamic)(*w.args)
    compile_all = time.perf_counter() - t0
    gs = twt.guards_of(w.obj, drop=twt.PENDING_KINDS)
    gs_strict = twt.guards_of(w.obj, drop=twt.PENDING_KINDS, equals="strict")
    gm_all = _debug_get_cache_entry_list(target.code)[0].guard_manager
    # Like for like: the same code compiled again, with torch dropping the same guard types. Another
    # backend object (eager in all but identity) makes torch add a second cache entry instead of
    # hitting the first; both read the same globals (torch.compile's reset would delete the
    # builtins dict Dynamo installed there, which the first entry's guards read). The new entry is
    # entry 0 (LRU order); importing it must need no drop= and give the same guards.
    with torch._dynamo.config.patch(**w.dynamo_config):
        torch.compile(
            w.obj, backend=_eager_again, dynamic=w.dynamic, options={"guard_filter_fn": _filter_pending}
        )(*w.args)
    entries = _debug_get_cache_entry_list(target.code)
    assert len(entries) == 2 and entries[1].guard_manager is gm_all
    gm_same = entries[0].guard_manager
    same = twt.guards_of(w.obj, entry=0)
    a, b = _guard_keys(gs), _guard_keys(same)
    if a != b:
        raise AssertionError(
            f"{w.name}: torch-same does not hold the guards tripwire imported: only in tripwire "
            f"{sorted((a - b).elements())[:5]}, only in torch-same {sorted((b - a).elements())[:5]}"
        )
    L = twt.frame_locals(w.obj, *w.args)
    L_fail = w.fail(L)
    for label, check in (("tripwire", gs.check), ("tripwire-strict", gs_strict.check)):
        probe_ok, probe_bad = check(L), check(L_fail)
        if probe_ok is not True or probe_bad is not False:
            raise AssertionError(f"{w.name} {label}: passing -> {probe_ok}, failing -> {probe_bad}")
    for label, gm in (("torch-same", gm_same), ("torch", gm_all)):
        ok, bad = gm.check(L), gm.check_verbose(L_fail).result
        if ok is not True or bad is not False:
            raise AssertionError(f"{w.name} {label}: passing -> {ok}, failing -> {bad}")
    rec = gs.torch_import
    n_torch = len(rec.guards)
    counts = guard_eval.torch_guard_count(gm_all)
    counts_same = guard_eval.torch_guard_count(gm_same)
    w.results = {
        "gs": gs,
        "gs_strict": gs_strict,
        "compile_s": compile_all,
        "torch_counts": counts,
        "same_counts": counts_same,
        "record": rec,
        "like_for_like": sum(a.values()),
        "fast": {label: _fast_path(s, L) for label, s in (("tripwire", gs), ("tripwire-strict", gs_strict))},
        "torch_guards": n_torch,
    }
    out = []
    if want("tripwire"):
        out.append(Contender("tripwire", gs.check, L, len(gs), f"{gs.node_count} sources"))
    if want("tripwire-strict"):
        out.append(Contender("tripwire-strict", gs_strict.check, L, len(gs_strict), "equals='strict'"))
    if probe or (only is not None and "strict-fast-probe" in only):
        # Not like for like: the strict set without Dynamo's `__code__` checks. Written when a guard
        # without a fast form sent the whole set to the tree walk; since residues are evaluated in
        # place (and `__code__` of a function has a fast form) it should cost about what `strict` does.
        slow = _functions_with_code_guards(gs_strict)
        gs_probe = twt.guards_of(w.obj, drop=(*twt.PENDING_KINDS, *slow), equals="strict")
        assert gs_probe.check(L) and not gs_probe.check(L_fail)
        note = f"strict minus {len(gs_strict) - len(gs_probe)} guards on {len(slow)} functions' __code__ (not like for like)"
        out.append(Contender("strict-fast-probe", gs_probe.check, L, len(gs_probe), note))
    if want("torch-same"):
        out.append(
            Contender("torch-same", gm_same.check, L, counts_same["leaf"], "guard_filter_fn: same guards")
        )
    if want("torch"):
        out.append(Contender("torch", gm_all.check, L, counts["leaf"], "all of torch's guards"))
    if want("no-op"):
        out.append(Contender("no-op", guard_eval._noop, L, 0, "def f(L): return True"))
    return out


def _functions_with_code_guards(gs) -> list[str]:
    """torch sources of the functions whose `__code__` torch guards (dropping one drops its guards)."""
    return sorted(
        {g.source.rsplit(".__code__", 1)[0] for g in gs.torch_import.guards if g.source.endswith(".__code__")}
    )


def _fast_path(gs, f_locals: dict) -> dict[str, Any]:
    """How much of the set the fast pass decides without user code: by kind (guards with a form
    free of user code, the others are residues evaluated in place), and in a passing check on the
    workload's own locals (forms that apply to the objects at hand), plus the guards the skip of
    unchanged subtrees proved without evaluating them in that check (the second of two)."""
    # The first check makes the skip's claims, the second uses them.
    assert gs.check(f_locals) and gs.check(f_locals)
    return {
        "uses_fast_pass": bool(gs._uses_fast_pass),  # no residue at all
        "fast": gs._fast_guard_count,
        "fraction": gs.fast_path_fraction,
        "last_fast": gs._last_fast_guards,
        "skipped": gs._last_skipped_guards,
        "guards": len(gs),
    }


# =================================================================================================
# Instruction counts
# =================================================================================================
def _callgrind_child(workload: str, contenders: list[str], n: int) -> None:
    """Run inside valgrind: compile and import once, then for each contender in order, n checks
    inside ``_floor.repeat_call`` (the one function callgrind collects; one dump after each)."""
    import floor_build

    _floor = floor_build.load()
    w = build(workload)
    by = {c.name: c for c in prepare(w, lambda m: None, only=set(contenders))}
    for name in contenders:
        c = by[name]
        for _ in range(50):
            c.check(c.f_locals)
    gc.collect()
    gc.disable()
    _floor.start_instrumentation()  # torch's import and compile ran uninstrumented
    for name in contenders:
        c = by[name]
        for _ in range(50):  # warm again, instrumented (first-run effects out of the counts)
            c.check(c.f_locals)
        _floor.repeat_call(c.check, c.f_locals, n)


def callgrind_counts(workload: str, contenders: list[str], n: int, out_dir: str) -> dict[str, float | None]:
    """Instructions per check of each contender, from one valgrind run of the workload (torch
    compiles once under valgrind, which is the slow part): one dump per ``repeat_call``, in the
    order the contenders ran."""
    base = os.path.join(out_dir, f"callgrind.real.{workload}.out")
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import warnings; warnings.filterwarnings('ignore'); "
        f"from real_models import _callgrind_child; _callgrind_child({workload!r}, {contenders!r}, {n})"
    )
    found = _callgrind.totals(["-c", code], base, instr_atstart=False, env={"PYTHONHASHSEED": "0"})
    totals = [t for t in found or [] if t > 0]
    if len(totals) == len(contenders):
        return {name: t / n for name, t in zip(contenders, totals, strict=True)}
    sys.stderr.write(f"callgrind: {len(totals)} dumps for {len(contenders)} contenders in {base}.*\n")
    return dict.fromkeys(contenders)


# =================================================================================================
# Report
# =================================================================================================
def describe(w: Workload) -> str:
    r = w.results
    rec = r["record"]
    c, cs = r["torch_counts"], r["same_counts"]
    lines = [
        f"{w.name}: {w.title}",
        f"    torch: {c['leaf']} leaf guards + {c['dict_managers']} DictGuardManagers (compiled in "
        f"{r['compile_s']:.1f}s); torch-same: {cs['leaf']} leaf guards + {cs['dict_managers']} DictGuardManagers",
        f"    imported: {rec.summary()}",
        f"    like for like: torch-same holds the same {r['like_for_like']} guards as the tripwire set "
        "(kind, source and code compared)",
    ]
    for label, f in r["fast"].items():
        lines.append(
            f"    {label}: fast path {f['fast']} of {f['guards']} guards ({100 * f['fraction']:.1f}%); in a "
            f"passing check {f['last_fast']} ({100 * f['last_fast'] / max(f['guards'], 1):.1f}%), "
            f"{f['skipped']} of them proved by unchanged dicts; no residue at all: {f['uses_fast_pass']}"
        )
    cov = rec.coverage()
    parts = []
    for kind, row in cov.items():
        imported = row["native"] + row["torch"]
        extra = f" ({row['torch']} via torch)" if row["torch"] else ""
        parts.append(f"{kind} {imported}/{row['total']}{extra}")
    lines.append("    coverage, imported/torch: " + ", ".join(parts))
    return "\n".join(lines)


def report(workloads: list[Workload], repeat: int) -> str:
    with_ir = any(c.instructions for w in workloads for c in w.results["contenders"])
    header = ["workload", "contender", "guards", "min ns", "median ns", "tw/x (min)", "tw/x (med)"]
    if with_ir:
        header += ["instr/check"]
    header.append("notes")
    rows = []
    for w in workloads:
        cs = w.results["contenders"]
        tw = cs[0]
        for c in cs:
            row = [
                w.name,
                c.name,
                str(c.guards),
                fmt_ns(c.min),
                fmt_ns(c.median),
                *ratio_columns(tw, c),
            ]
            if with_ir:
                row.append(f"{c.instructions:,.0f}" if c.instructions else "-")
            row.append(c.note)
            rows.append(row)
        rows.append([""] * len(header))
    rows.pop()
    right = set(range(2, 7)) | ({7} if with_ir else set())
    out = [
        f"ns per check on a passing input; min and median over {repeat} repeats (round-robin); tw/x = "
        "the `tripwire` column's time / the contender's (below 1: tripwire is faster)",
        table(rows, header, right),
        "",
        "Targets: tripwire <= 1/3 of torch like for like; <= 1/5 of torch with all its guards.",
    ]
    for w in workloads:
        by = {c.name: c for c in w.results["contenders"]}
        for label in ("tripwire", "tripwire-strict"):
            if label not in by:
                continue
            t = by[label]
            for other, bound in (("torch-same", 1 / 3), ("torch", 1 / 5)):
                if other not in by:
                    continue
                o = by[other]
                r_min, r_med = t.min / o.min, t.median / o.median
                ok = r_min <= bound and r_med <= bound
                out.append(
                    f"  {w.name} {label} vs {other}: {r_min:.3f} (min), {r_med:.3f} (median), bound "
                    f"{bound:.3f} -> {'MET' if ok else 'missed'}"
                )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/real_models.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", "-w", action="append", choices=WORKLOAD_NAMES)
    p.add_argument("--repeat", "-r", type=int, default=15)
    p.add_argument("--time", type=float, default=0.02, help="target seconds per repeat per contender")
    p.add_argument("--quick", action="store_true", help="5 repeats of ~5 ms")
    p.add_argument(
        "--instructions",
        type=int,
        nargs="?",
        const=2000,
        default=0,
        metavar="N",
        help="also count instructions per check with callgrind (N checks; the tripwire columns and no-op, "
        "one valgrind run per workload, a few minutes each)",
    )
    p.add_argument("--instructions-torch", action="store_true", help="count the torch columns too (slow)")
    p.add_argument("--explain", action="store_true", help="print each imported set's explain()")
    p.add_argument(
        "--fast-pass-probe",
        action="store_true",
        help="add `strict-fast-probe`: the strict set without the guards that have no fast form (not "
        "like for like; what the fast pass gives once it is not all or nothing)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.repeat, args.time = min(args.repeat, 5), min(args.time, 0.005)
    guard_eval._torch_available(lambda m: print(m, file=sys.stderr))
    names = tuple(args.workload or WORKLOAD_NAMES)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log(f"environment: {guard_eval.environment()}")
    workloads = []
    for name in names:
        w = build(name)
        log(f"{name}: compiling and importing ...")
        w.results["contenders"] = prepare(w, log, probe=args.fast_pass_probe)
        gc.collect()
        measure(w.results["contenders"], args.repeat, args.time)
        workloads.append(w)
    if args.instructions:
        import shutil
        import tempfile

        if shutil.which("valgrind") is None:
            log("--instructions: valgrind not found, skipped")
        else:
            out_dir = tempfile.mkdtemp(prefix="tripwire-callgrind-")
            log(f"callgrind: {args.instructions} checks per contender, outputs in {out_dir}")
            for w in workloads:
                names = [
                    c.name
                    for c in w.results["contenders"]
                    if args.instructions_torch or not c.name.startswith("torch")
                ]
                counts = callgrind_counts(w.name, names, args.instructions, out_dir)
                for c in w.results["contenders"]:
                    if c.name in counts:
                        c.instructions = counts[c.name]
                        log(
                            f"  {w.name} {c.name}: {c.instructions and round(c.instructions)} instructions/check"
                        )
    print(f"tripwire real-model guard benchmark -- {guard_eval.environment()}")
    for w in workloads:
        print(describe(w))
    print()
    print(report(workloads, args.repeat))
    if args.explain:
        for w in workloads:
            print(f"\n# ---- {w.name} ----\n{w.results['gs'].explain()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
