"""bench/real_models.py measures what it names: no timing here.

``prepare`` itself asserts that every contender answers True on the workload's passing locals and
False on its failing ones, and that torch's filtered entry (``torch-same``) holds exactly the
guards tripwire imported. These tests run it for each workload and check the report's parts.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import real_models as bench  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("name", bench.WORKLOAD_NAMES)
def test_workload_contenders_and_like_for_like(name):
    w = bench.build(name)
    contenders = bench.prepare(w, lambda m: None)
    assert [c.name for c in contenders] == ["tripwire", "tripwire-strict", "torch-same", "torch", "no-op"]
    r = w.results
    rec = r["record"]
    # Everything not dropped for the tensor engine is imported, and only that is dropped.
    assert {g.kind for g in rec.dropped} <= set(bench.TORCH_PENDING_GUARD_TYPES) | {
        "DIMENSION_DYNAMIC_MARKING_GUARD",
        "TORCH_FUNCTION_MODE_STACK",
        "OBJECT_ALIASING",
    }
    assert all(g.outcome in ("native", "torch", "dropped") for g in rec.guards)
    assert r["like_for_like"] == sum(1 for g in rec.guards if g.outcome in ("native", "torch"))
    for label in ("tripwire", "tripwire-strict"):
        fast = r["fast"][label]
        assert 0 <= fast["last_fast"] <= fast["fast"] <= fast["guards"] == len(r["gs"])
        assert fast["fraction"] == fast["fast"] / fast["guards"]
        assert 0 <= fast["skipped"] <= fast["last_fast"]
    # Off the fast path in the exact import: exactly the guards evaluated by torch's own leaf (each a
    # LAMBDA, a residue). In the strict import every container EQUALS is tripwire's own; what still
    # calls torch's leaf is what no tripwire kind reads (the encoder's `... == torch.bool`, whose
    # printed value is no literal): at most 1 in 200 of torch's guards.
    via_torch = sum(1 for g in rec.guards if g.outcome == "torch")
    assert r["fast"]["tripwire"]["guards"] - r["fast"]["tripwire"]["fast"] == via_torch
    strict_lambdas = sum(1 for g in r["gs_strict"].guards if g.kind.name == "LAMBDA")
    strict_via_torch = sum(1 for g in r["gs_strict"].torch_import.guards if g.outcome == "torch")
    assert strict_lambdas == strict_via_torch <= len(rec.guards) // 200
    assert r["fast"]["tripwire-strict"]["guards"] - r["fast"]["tripwire-strict"]["fast"] == strict_lambdas
    text = bench.describe(w)
    assert "like for like" in text and "coverage" in text
    torch._dynamo.reset()


def test_main_quick(capsys):
    assert bench.main(["--quick", "-w", "config", "--repeat", "1", "--time", "0.001"]) == 0
    out = capsys.readouterr().out
    for col in ("tripwire", "tripwire-strict", "torch-same", "torch", "no-op", "Targets:"):
        assert col in out
    torch._dynamo.reset()
