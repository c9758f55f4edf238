"""Whole ``tripwire.torch.guards_of`` sets of real models, saved and loaded in a fresh process.

The GPT, the CNN and the config function of test_torch_import.py are compiled by torch here, their
guards imported with ``guards_of`` and saved whole with ``to_bytes()``: every guard of these
sets is tripwire's own (tuple equality is EQUALS_MATCH with python_eq, torch's saved-tensor-hooks
lambda is the GLOBAL_STATE probe ``torch_saved_tensors_hooks``, stored while no hooks are
installed), so nothing is dropped. A fresh ``python`` process rebuilds the same inputs
(torch_roundtrip.py: seeded models, the same mutations in the same order), loads the bytes and
answers; its decisions and first failures (guard, kind, source) must be the live imported set's,
and the decisions torch's own guard_manager.check.

What a loading process must provide: the module globals torch.compile added in the compiling
process and the guards read (``__builtins_dict___N``, ``__import_torch_dot_nn_...``;
``tripwire.torch.install_dynamo_globals``), since the child never compiles: before it, the
loaded set fails the unchanged inputs (safe, never a false pass), after it, it answers as the live
set.

Bounded for CI (TRIALS mutated inputs per model, scaled under --gc-stress); the long run is
``TRIPWIRE_ROUNDTRIP_TRIALS=5000 python -m pytest tests/python/pytorch/test_serialization_torch.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
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
sys.path[:0] = [{here!r}, {here!r} + "/../support", {bench!r}]  # what pyproject's pytest pythonpath gives the parent
import torch_roundtrip as R
import tripwire as tw
import tripwire.torch as twt
out = {{}}
for name, path in {paths!r}.items():
    case = R.CASES[name]()
    gs = tw.GuardSet.from_bytes(open(path, "rb").read())
    before = R.answer(gs, case.make_locals())
    installed = twt.install_dynamo_globals(gs)  # into the module recorded at save
    out[name] = {{
        "answers": [R.answer(gs, f_locals) for _, f_locals in R.trials(case, {trials})],
        "dropped": [list(d) for d in gs.dropped],
        "explain_has_dropped": "dropped at save" in gs.explain(),
        "installed": installed,
        "before": before,
        "again": twt.install_dynamo_globals(gs),
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
        assert not [g for g in gs.guards if g.kind is tw.GuardKind.LAMBDA], name
        blob = gs.to_bytes()
        dropped[name] = [list(d) for d in tw.GuardSet.from_bytes(blob).dropped]
        assert dropped[name] == [], dropped[name]
        answers = []
        for what, f_locals in R.trials(case, TRIALS):
            live = R.answer(gs, f_locals)
            assert gm.check(f_locals) == live[0], f"{name} after {what}: torch and the live set disagree"
            answers.append(live)
        decisions = [a[0] for a in answers]
        # The mutations reach both answers often, or the comparison proves little.
        assert decisions.count(True) >= TRIALS // 10 and decisions.count(False) >= TRIALS // 10, name
        expected[name] = answers
        paths[name] = str(tmp_path / f"{name}.twg")
        Path(paths[name]).write_bytes(blob)
    child = _CHILD.format(here=str(HERE), bench=str(HERE.parents[2] / "bench"), paths=paths, trials=TRIALS)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    for name, answers in expected.items():
        got = loaded[name]
        assert got["dropped"] == dropped[name] and not got["explain_has_dropped"]
        assert any(n.startswith("__builtins_dict___") for n in got["installed"]), got["installed"]
        assert got["again"] == []  # names already bound are left alone
        # Without Dynamo's globals the loaded set fails the example on one of them.
        assert got["before"][0] is False and "G['__" in got["before"][1][2], got["before"]
        want = json.loads(json.dumps(answers))
        for i, (a, b) in enumerate(zip(want, got["answers"], strict=True)):
            assert a == b, f"{name}, input {i}: live {a}, loaded in a fresh process {b}"


def test_install_dynamo_globals_takes_modules_from_sys_modules_only() -> None:
    gm = T.compile_and_call(T.config_fn, torch.ones(3), T.config_base())
    assert gm is not None
    gs = tw.GuardSet.from_bytes(twt.guards_of(T.config_fn, drop=twt.PENDING_KINDS).to_bytes())
    read = {s.name for spec in gs.guards for s in spec.sources if s.name.startswith("__")}
    assert any(n.startswith("__builtins_dict___") for n in read), read
    g: dict = {}
    installed = twt.install_dynamo_globals(gs, g)
    assert installed and set(installed) <= read and all(g[n] is not None for n in installed)
    for n in installed:
        if n.startswith("__import_"):
            assert g[n] is sys.modules[n[len("__import_") :].replace("_dot_", ".")]
    # A module that is not imported is left out, never imported.
    from tripwire.source import RootKind, Source

    absent = "__import_tripwire_no_such_module_dot_x"
    spec = types.SimpleNamespace(sources=[Source(RootKind.GLOBAL, absent, ())])
    fake = types.SimpleNamespace(guards=[spec], _f_globals={})
    assert twt.install_dynamo_globals(fake) == [] and absent not in fake._f_globals
    assert "tripwire_no_such_module.x" not in sys.modules
    with pytest.raises(TypeError):
        twt.install_dynamo_globals(types.SimpleNamespace(guards=[], _f_globals=None))
