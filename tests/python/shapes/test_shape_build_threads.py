"""Building SHAPE sets from torch's code parts on several threads while finalizers empty the memos.

The build keeps process-wide memos keyed by text: the parsed relations (``shapes._parse_text``)
and sources (``source._parse_text``), and the engine's parsed and compiled relations. Reading a
symbol runs Python code (a tensor's ``size()``), so a thread can switch, or a collection can run a
finalizer, in the middle of any of them. Here the finalizers of garbage cycles empty the Python
memos and declare a guard on a builder another thread is using. Every set that builds is compared
with the reference on new examples: no decision may differ. Fixed iteration counts, no timing.
"""

from __future__ import annotations

import gc
import random
import sys
import threading

import pytest

import reference
import tripwire as tw
from gc_stress import scaled
from tripwire import builder, shapes

torch = pytest.importorskip("torch")

# Code parts as torch 2.13 prints them (a comment, a conjunction, sympy's spelling), over the
# tensors x, w (two dims) and y (one dim).
TEMPLATES = [
    "((L['{a}'].size()[{i}]*L['{a}'].size()[{j}]) % {k}) == 0  # a = x.reshape(-1, 4)",
    "(L['{a}'].size()[{i}] // {k}) <= L['y'].size()[0]  # y[: x.shape[0] // 2]  # f.py:1 in g",
    "(-1) + L['y'].size()[0] > L['{a}'].size()[{i}]",
    "{k} <= L['{a}'].size()[{i}]",
    "L['{a}'].stride()[0] == L['{a}'].size()[1]  # (unknown source)",
    "2 <= L['{a}'].size()[{i}] and L['{a}'].size()[{i}] <= 1000",
    "Eq(Mod(L['{a}'].size()[{i}], {k}), 0)",
    "L['{a}'].size()[{i}] != L['y'].size()[0]",
]


class MemoEmptier:
    """A garbage cycle whose finalizer empties the memos and, when it runs on the thread that owns
    ``b`` (a builder is used by one thread), declares a guard on it, possibly in the middle of
    another declaration."""

    def __init__(self, b: tw.GuardBuilder | None) -> None:
        self.b = b
        self.owner = threading.get_ident()
        self.cycle = self

    def __del__(self) -> None:
        builder.clear_build_memos()  # the next parse of any text is a cold one
        if self.b is not None and threading.get_ident() == self.owner:
            self.b.shape("L['n'] >= 0")  # holds on every example: it must never be refused
            FINALIZER_DECLARATIONS.append(1)


FINALIZER_DECLARATIONS: list[int] = []


def example(r: random.Random) -> dict:
    return {
        "x": torch.empty(r.randint(1, 9), r.randint(1, 9)),
        "y": torch.empty(r.randint(1, 12)),
        "w": torch.empty(r.randint(1, 9), r.randint(1, 9)),
        "n": r.randint(0, 5),
    }


def test_sets_built_on_threads_while_memos_empty_decide_as_the_reference():
    compared = [0]
    mismatches: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    unraisable: list[str] = []

    def worker(seed: int) -> None:
        r = random.Random(seed)
        for _ in range(scaled(150, 10)):
            b = tw.GuardBuilder(example(r))
            for _ in range(r.randint(1, 6)):
                text = r.choice(TEMPLATES).format(a=r.choice("xw"), i=r.randint(0, 1), j=r.randint(0, 1),
                                                  k=r.randint(1, 7))  # fmt: skip
                if r.random() < 0.25:
                    MemoEmptier(b if r.random() < 0.5 else None)
                try:
                    for rel in shapes.relations_from_torch(text):
                        b.shape(rel)
                except tw.GuardBuildError:
                    pass  # the relation does not hold on this example
                if r.random() < 0.3:
                    gc.collect(0)
            gs = b.build()  # every declared relation held on the example
            specs = list(b.guards)
            for _ in range(4):
                other = example(r)
                got, want = gs.check(other), reference.check(specs, other)
                with lock:
                    compared[0] += 1
                    if got != want:
                        mismatches.append(f"{[s.args[0] for s in specs]}: engine {got}, reference {want}")

    def run(seed: int) -> None:
        try:
            worker(seed)
        except BaseException as e:  # re-raised in the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(3)]
    old_threshold = gc.get_threshold()
    old_hook = sys.unraisablehook
    # A finalizer's exception (a refused declaration) would only be printed: collect it.
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.exc_value}")
    gc.set_threshold(50, 5, 5)  # collections (and the finalizers) often, inside the builds
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        gc.collect()
    finally:
        gc.set_threshold(*old_threshold)
        sys.unraisablehook = old_hook
    if errors:
        raise errors[0]
    assert not unraisable, unraisable[:5]
    assert not mismatches, mismatches[:5]
    assert compared[0] > 0
    assert FINALIZER_DECLARATIONS  # the finalizers did run inside builds
