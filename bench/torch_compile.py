"""Per-call time of tripwire.torch.compile against eager, torch.compile and torch.compile with
``set_stance(skip_guard_eval_unsafe=True)``, all in one run, on five real models.

    python bench/torch_compile.py [--backend eager] [--repeats 11] [--calls 200]

Every contender computes the same outputs (checked before timing: torch.equal for eager and
aot_eager backends). Each repeat times ``--calls`` calls of every contender, round-robin in a
rotating order; the table gives per-call microseconds, min and median over the repeats, with the
ratio to torch.compile. "graph" is the compiled graphs alone (the backend's callables, timed on
the inputs they were compiled with), and "overhead" a route's time minus that floor: the target
is tripwire's overhead at most 1/5 of torch.compile's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
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


def _per_call(fn: Callable[[], Any], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def run_model(name: str, backend: str, repeats: int, calls: int) -> dict[str, list[float]]:
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
    floor_graphs = list(graphs)

    def graph_floor() -> None:
        for g, ex in floor_graphs:
            g(*ex)

    def skip_guards() -> None:
        with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
            for _ in range(calls):
                theirs(*args)

    contenders: dict[str, Callable[[], float]] = {
        "eager": lambda: _per_call(lambda: model(*args), calls),
        "torch.compile": lambda: _per_call(lambda: theirs(*args), calls),
        "torch.compile + skip_guard_eval_unsafe": lambda: _timed_block(skip_guards, calls),
        "tripwire.torch.compile": lambda: _per_call(lambda: ours(*args), calls),
        "graph": lambda: _per_call(graph_floor, calls),
    }
    times: dict[str, list[float]] = {k: [] for k in contenders}
    times["graph_count"] = [float(len(floor_graphs))] if floor_graphs else []
    order = list(contenders)
    with torch.no_grad():
        for r in range(repeats):
            k = r % len(order)
            for key in order[k:] + order[:k]:
                times[key].append(contenders[key]())
    return times


def _timed_block(block: Callable[[], None], calls: int) -> float:
    t0 = time.perf_counter()
    block()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="eager")
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--models", default=",".join(MODELS))
    a = p.parse_args(argv)
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
        base = min(t["torch.compile"])
        print(f"\n{name}")
        for key, xs in t.items():
            if key == "graph_count":
                continue
            print(f"  {key:40s} {min(xs):9.1f} / {statistics.median(xs):9.1f}  ({min(xs) / base:.2f})")
        if not t["graph_count"]:
            print("  (Dynamo compiled no graph: both routes run the frames eagerly)")
            continue
        g = min(t["graph"])
        over_t, over_o = base - g, min(t["tripwire.torch.compile"]) - g
        share = over_t / base
        print(
            f"  overhead over the graphs: torch.compile {over_t:.1f}, tripwire {over_o:.1f} "
            f"({over_o / over_t if over_t > 0 else float('nan'):.2f} of torch's); "
            f"torch.compile's overhead is {share:.0%} of its time"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
