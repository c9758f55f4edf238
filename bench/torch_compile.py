"""Per-call time of tripwire.torch.compile against eager, torch.compile and torch.compile with
``set_stance(skip_guard_eval_unsafe=True)``, all in one run, on five real models.

    python bench/torch_compile.py [--backend eager] [--repeats 11] [--calls 200]

Every contender computes the same outputs (checked before timing: torch.equal for eager and
aot_eager backends). Each repeat times ``--calls`` calls of every contender, round-robin in a
rotating order; the table gives per-call microseconds, min and median over the repeats, with the
ratio to torch.compile. "graph" is the compiled graphs alone (what each ``__compiled_fn_*``
wraps, called directly on the inputs it was compiled with), and "overhead" a route's time minus
that floor (minus eager's time where Dynamo compiled no graph): the target is tripwire's overhead
at most 1/5 of torch.compile's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import tripwire.torch as twt

torch.set_num_threads(1)


class Block(nn.Module):
    """A pre-norm transformer block from torch.nn pieces (causal SDPA, GELU MLP)."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def control(x: torch.Tensor, n: int, scale: float, mode: str) -> torch.Tensor:
    """Python control flow with two graph breaks (an explicit one and a data-dependent branch)."""
    y = x
    for i in range(n):
        y = y * scale + i
    if mode == "tanh":
        y = y.tanh()
    torch._dynamo.graph_break()
    if y.sum() > 0:
        y = y - 1
    return y.relu()


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class LSTMTagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _mlp() -> tuple[Any, list[tuple[Any, ...]]]:
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
    return m, [(torch.randn(8, 32),), (torch.randn(8, 32),), (torch.randn(24, 32),)]


def _block() -> tuple[Any, list[tuple[Any, ...]]]:
    return Block().eval(), [(torch.randn(2, 8, 32),), (torch.randn(2, 8, 32),), (torch.randn(2, 13, 32),)]


def _control() -> tuple[Any, list[tuple[Any, ...]]]:
    x = torch.randn(16)
    return control, [(x, 3, 0.5, "tanh"), (x, 3, 0.5, "tanh"), (-x.abs() - 5, 2, 1.5, "id")]


def _cnn() -> tuple[Any, list[tuple[Any, ...]]]:
    return CNN().eval(), [
        (torch.randn(2, 3, 16, 16),),
        (torch.randn(2, 3, 16, 16),),
        (torch.randn(4, 3, 16, 16),),
    ]


def _lstm() -> tuple[Any, list[tuple[Any, ...]]]:
    return LSTMTagger().eval(), [
        (torch.randn(4, 10, 16),),
        (torch.randn(4, 10, 16),),
        (torch.randn(4, 6, 16),),
    ]


MODELS: dict[str, Callable[[], tuple[Any, list[tuple[Any, ...]]]]] = {
    "mlp": _mlp,
    "block": _block,
    "control": _control,
    "cnn": _cnn,
    "lstm": _lstm,
}
"""name -> make(): (model or function, argument tuples). The first tuple is the one timed; the
others (a hit, then a shape or value change) are for the tests (tests/python/pytorch/test_torch_compile.py)."""


def _recording(backend: str, graphs: list[tuple[Any, list[Any]]]) -> Any:
    """A backend that compiles as ``backend`` and records each compiled callable with its example
    inputs (the graph floor)."""
    from torch._dynamo.backends.registry import lookup_backend

    inner = lookup_backend(backend)

    def record(gm: Any, example_inputs: list[Any]) -> Any:
        compiled = inner(gm, example_inputs)
        graphs.append((compiled, list(example_inputs)))
        return compiled

    return record


def _as_dynamo_calls(compiled: Any) -> Any:
    """The callable Dynamo wraps in ``__compiled_fn_*`` for a backend's result. The eager backend
    returns ``gm.forward`` before the graph module's lazy recompile, a ``_lazy_forward`` bound
    method that recompiles if needed and then calls the module (``nn.Module.__call__``); Dynamo
    forces the recompile and calls the generated ``forward`` instead (OutputGraph's
    compile_and_call_fx_graph). Timing the backend's result as returned would put that module
    call in the floor, which neither route runs, and understate every route's overhead."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    owner = getattr(compiled, "__self__", None)
    if isinstance(owner, _LazyGraphModule) and getattr(compiled, "__name__", None) == "_lazy_forward":
        _LazyGraphModule.force_recompile(owner)
        return owner.forward
    return compiled


def _per_call(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


CONTENDERS = (
    "eager",
    "torch.compile",
    "torch.compile + skip_guard_eval_unsafe",
    "tripwire.torch.compile",
    "graph",
)
SKIP_GUARDS = CONTENDERS[2]


def _routes(name: str, backend: str) -> tuple[dict[str, Callable[[], Any]], int]:
    """One call of each contender (``SKIP_GUARDS``: of torch.compile, to be run under the stance),
    after compiling and checking the outputs; and the number of graphs Dynamo compiled."""
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    args = inputs[0]
    torch._dynamo.reset()
    graphs: list[tuple[Any, list[Any]]] = []
    theirs = torch.compile(model, backend=_recording(backend, graphs))
    ours = twt.compile(model, backend=backend)
    with torch.no_grad():
        expect = model(*args)
        for _ in range(3):  # compile and settle (automatic dynamic needs no second shape here)
            got_t, got_o = theirs(*args), ours(*args)
        for got in (got_t, got_o):
            same = (
                torch.equal(got, expect) if backend != "inductor" else torch.allclose(got, expect, atol=1e-5)
            )
            if not same:
                raise AssertionError(f"{name}: a compiled route disagrees with eager")
    floor_graphs = [(_as_dynamo_calls(g), ex) for g, ex in graphs]

    def graph_floor() -> None:
        for g, ex in floor_graphs:
            g(*ex)

    calls = dict(
        zip(
            CONTENDERS,
            (
                lambda: model(*args),
                lambda: theirs(*args),
                lambda: theirs(*args),
                lambda: ours(*args),
                graph_floor,
            ),
        )
    )
    return calls, len(floor_graphs)


def _stance(key: str) -> Any:
    if key == SKIP_GUARDS:
        return torch.compiler.set_stance(skip_guard_eval_unsafe=True)
    return contextlib.nullcontext()


def run_model(name: str, backend: str, repeats: int, calls: int) -> dict[str, list[float]]:
    one, graph_count = _routes(name, backend)

    def timed(key: str) -> float:
        fn = one[key]
        with _stance(key):  # once around the calls, as a user would set it
            return _per_call(fn, calls)

    times: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    times["graph_count"] = [float(graph_count)] if graph_count else []
    order = list(CONTENDERS)
    with torch.no_grad():
        for r in range(repeats):
            k = r % len(order)
            for key in order[k:] + order[:k]:
                times[key].append(timed(key))
    return times


INSTRUCTION_CALLS = (2, 12)
"""Each contender runs these numbers of calls under callgrind: the difference of the two totals
over the difference of the counts is its instructions per call (the fixed costs cancel)."""


def _instructions_child(name: str, backend: str) -> None:
    """Under callgrind (``--instr-atstart=no``): compile, then start the instrumentation and run
    every contender ``INSTRUCTION_CALLS`` times through bench/floor.c's C loop (one dump each)."""
    import floor_build

    floor = floor_build.load()
    one, _ = _routes(name, backend)
    with torch.no_grad():
        for key in CONTENDERS:
            with _stance(key):
                one[key]()
        floor.start_instrumentation()
        for key in CONTENDERS:
            fn = one[key]
            with _stance(key):
                for n in INSTRUCTION_CALLS:
                    floor.repeat_call(lambda _: fn(), None, n)


def instructions(name: str, backend: str) -> dict[str, float] | None:
    """Instructions per call of each contender (callgrind, one child process), or None."""
    import _callgrind

    with tempfile.TemporaryDirectory() as d:
        found = _callgrind.totals(
            [os.path.abspath(__file__), "--instructions-child", name, "--backend", backend],
            os.path.join(d, "cg"),
            instr_atstart=False,
        )
    if found is None or len(found) != 2 * len(CONTENDERS):
        return None
    n1, n2 = INSTRUCTION_CALLS
    return {k: (found[2 * i + 1] - found[2 * i]) / (n2 - n1) for i, k in enumerate(CONTENDERS)}


def _timed_block(block: Callable[[], None], calls: int) -> float:
    t0 = time.perf_counter()
    block()
    return (time.perf_counter() - t0) / calls * 1e6


def _overhead(t: dict[str, float], graph_count: int, unit: str = "time") -> str:
    """Each route's overhead over the graphs (over eager when Dynamo compiled no graph: both
    routes then run the model eagerly, and an empty floor would count the model as overhead);
    ``unit`` names what ``t`` measures (time or instructions)."""
    base = t["torch.compile"]
    floor, what = (t["graph"], "the graphs") if graph_count else (t["eager"], "eager")
    over_t, over_o = base - floor, t["tripwire.torch.compile"] - floor
    ratio = over_o / over_t if over_t > 0 else float("nan")
    return (
        f"overhead over {what}: torch.compile {over_t:,.1f}, tripwire {over_o:,.1f} ({ratio:.2f} of "
        f"torch's); torch.compile's overhead is {over_t / base:.0%} of its {unit}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="eager")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument(
        "--instructions",
        action="store_true",
        help="also callgrind instructions per call (one child per model)",
    )
    p.add_argument("--instructions-child", metavar="MODEL", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.instructions_child:
        _instructions_child(a.instructions_child, a.backend)
        return 0
    import tripwire.tensors

    print(
        f"torch {torch.__version__}, Python {sys.version.split()[0]}, backend={a.backend}, "
        f"{a.repeats} repeats of {a.calls} calls, 1 torch thread"
    )
    print("per call, us: min / median (ratio of the min to torch.compile's)")
    for i, name in enumerate(a.models.split(",")):
        t = run_model(name, a.backend, a.repeats, a.calls)
        if i == 0:
            print(f"tensor guards: {tripwire.tensors.adapter_status()}")
        graph_count = len(t.pop("graph_count"))
        base = min(t["torch.compile"])
        print(f"\n{name}")
        for key, xs in t.items():
            print(f"  {key:40s} {min(xs):9.1f} / {statistics.median(xs):9.1f}  ({min(xs) / base:.2f})")
        print("  min: " + _overhead({k: min(xs) for k, xs in t.items()}, graph_count))
        if a.instructions:
            ins = instructions(name, a.backend)
            if ins is None:
                print("  instructions: callgrind failed")
                continue
            print("  instructions per call (callgrind):")
            for key, n in ins.items():
                print(f"  {key:40s} {n:11,.0f}  ({n / ins['torch.compile']:.2f})")
            print("  instructions: " + _overhead(ins, graph_count, "instructions"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
