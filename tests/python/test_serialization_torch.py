"""Whole ``tripwire.torch.guards_of`` sets of real models, saved and loaded in a fresh process.

The GPT, the CNN and the config function of test_torch_import.py are compiled by torch here, their
guards imported with ``guards_of`` and saved with ``to_bytes(drop=["LAMBDA"])``: the only guard
that cannot be stored is torch's saved-tensor-hooks check, a lambda (the format never stores
code). A fresh ``python`` process rebuilds the same inputs (torch_roundtrip.py: seeded models,
the same mutations in the same order), loads the bytes and answers; its decisions and first
failures (guard, kind, source) must be the live imported set's, and the decisions torch's own
guard_manager.check (the dropped hook check passes in both processes: no hooks are installed).

What a loading process must provide: the module globals torch.compile added in the compiling
process and the guards read (``__builtins_dict___N``, ``__import_torch_dot_nn_...``;
torch_roundtrip.install_dynamo_globals), since the child never compiles.

Bounded for CI (TRIALS mutated inputs per model, scaled under --gc-stress); the long run is
``TRIPWIRE_ROUNDTRIP_TRIALS=5000 python -m pytest tests/python/test_serialization_torch.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gc_stress

torch = pytest.importorskip("torch")

import test_torch_import as T  # noqa: E402
import torch_roundtrip as R  # noqa: E402
import tripwire as tw  # noqa: E402
import tripwire.torch as twt  # noqa: E402

pytestmark = pytest.mark.torch

HERE = Path(__file__).parent
TRIALS = gc_stress.scaled(int(os.environ.get("TRIPWIRE_ROUNDTRIP_TRIALS", "300")))

_CHILD = """
import json, sys
sys.path.insert(0, {here!r})
import torch_roundtrip as R
import tripwire as tw
out = {{}}
for name, path in {paths!r}.items():
    case = R.CASES[name]()
    gs = tw.GuardSet.from_bytes(open(path, "rb").read())
    installed = R.install_dynamo_globals(gs, vars(R.T))
    out[name] = {{
        "answers": [R.answer(gs, f_locals) for _, f_locals in R.trials(case, {trials})],
        "dropped": [list(d) for d in gs.dropped],
        "explain_has_dropped": "dropped at save" in gs.explain(),
        "installed": installed,
    }}
print(json.dumps(out))
"""


def test_real_model_sets_round_trip_in_a_fresh_process(tmp_path: Path) -> None:
    expected: dict[str, list] = {}
    dropped: dict[str, list] = {}
    paths = {}
    for name, make in R.CASES.items():
        case = make()
        gm = T.compile_and_call(case.target, *case.args)
        gs = twt.guards_of(case.target, drop=twt.PENDING_KINDS)
        blob = gs.to_bytes(drop=["LAMBDA"])
        # The LAMBDAs torch's import leaves: the saved-tensor-hooks check, and EQUALS_MATCH guards
        # kept as torch's own guard objects (Python == semantics on a container: (16.0,) passes
        # where tripwire's exact-type EQUALS_MATCH would fail). Both are live objects of this
        # process, never stored.
        lambdas = [g for g in gs.guards if g.kind is tw.GuardKind.LAMBDA]
        assert any("SAVED_TENSORS_HOOKS" in g.describe() for g in lambdas)
        assert all(
            "SAVED_TENSORS_HOOKS" in g.describe() or "torch's own guard object" in g.describe()
            for g in lambdas
        ), [g.describe() for g in lambdas]
        gone = {g.index for g in lambdas}
        dropped[name] = [[k, s, d] for k, s, d in tw.GuardSet.from_bytes(blob).dropped]
        assert {k for k, _, _ in dropped[name]} == {"LAMBDA"} and len(dropped[name]) == len(gone)
        answers = []
        for what, f_locals in R.trials(case, TRIALS):
            live = R.answer(gs, f_locals)
            assert gm.check(f_locals) == live[0], f"{name} after {what}: torch and the live set disagree"
            # What the loaded set must answer: the live set's first failure among the guards kept
            # (a dropped LAMBDA that fails widens reuse, which .dropped and explain() say).
            kept = [f for f in gs.failures(f_locals) if f.guard.index not in gone]
            answers.append(
                [not kept, None if not kept else [kept[0].guard.index, kept[0].kind, kept[0].source]]
            )
            if live[1] is not None and live[1][0] not in gone:
                assert answers[-1] == live, f"{name} after {what}"
        decisions = [a[0] for a in answers]
        # The mutations reach both answers often, or the comparison proves little.
        assert decisions.count(True) >= TRIALS // 10 and decisions.count(False) >= TRIALS // 10, name
        expected[name] = answers
        paths[name] = str(tmp_path / f"{name}.twg")
        Path(paths[name]).write_bytes(blob)
    child = _CHILD.format(here=str(HERE), paths=paths, trials=TRIALS)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    for name, answers in expected.items():
        got = loaded[name]
        assert got["dropped"] == dropped[name] and got["explain_has_dropped"]
        assert any(n.startswith("__builtins_dict___") for n in got["installed"]), got["installed"]
        want = json.loads(json.dumps(answers))
        for i, (a, b) in enumerate(zip(want, got["answers"], strict=True)):
            assert a == b, f"{name}, input {i}: live {a}, loaded in a fresh process {b}"
