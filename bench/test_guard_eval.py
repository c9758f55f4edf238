"""The benchmark's baselines check the same guards as the engine (bench/README.md).

The generated Python guard functions (py-fn, py-fn+) and the hand-written C floor are only fair
baselines if they answer exactly as the GuardSet does; these tests compare them on the workloads'
inputs and on single-value mutations of them. No timing here.
"""

from __future__ import annotations

import copy

import pytest

import guard_eval as bench


def _answers(res, f_locals):
    return {c.name: c.check(f_locals) for c in res["contenders"] if c.name != "no-op"}


@pytest.mark.parametrize("name", bench.WORKLOAD_NAMES)
def test_contenders_agree_on_pass_and_fail(name):
    w = bench.BUILDERS[name](False)
    res = bench.prepare(w, torch_ok=False, log=lambda m: None)  # asserts True/False itself
    assert {c.name for c in res["contenders"]} == {"tripwire", "py-fn", "py-fn+", "C floor", "no-op"}
    for c in res["contenders"]:
        if c.name != "no-op":
            assert c.guards == len(res["gs"]), c.name
    assert set(_answers(res, w.f_locals).values()) == {True}
    assert set(_answers(res, w.f_locals_fail).values()) == {False}


def _w2_mutations():
    def layer(net, i=5):
        return net._modules[f"layer{i}"]

    yield lambda n: setattr(n, "training", False)
    yield lambda n: setattr(layer(n), "in_features", 999)
    yield lambda n: setattr(layer(n), "scale", 0.25)
    yield lambda n: setattr(layer(n), "act", "tanh")
    yield lambda n: setattr(layer(n), "act_fn", bench.relu if layer(n).act_fn is bench.gelu else bench.gelu)
    yield lambda n: layer(n).dims.append(1)
    yield lambda n: layer(n).cfg.__setitem__("extra", 1)
    yield lambda n: layer(n)._parameters.pop("bias")
    yield lambda n: layer(n).__dict__.__setitem__("forward", None)
    yield lambda n: n._modules.pop("layer11")
    yield lambda n: setattr(layer(n), "use_bias", 1)  # == True, but not the same type


@pytest.mark.parametrize("mutate", list(_w2_mutations()))
def test_w2_mutations(mutate):
    w = bench.build_w2(False)
    res = bench.prepare(w, torch_ok=False, log=lambda m: None)
    net = bench.Net(bench.W2_LAYERS)
    mutate(net)
    got = _answers(res, {"self": net, "x": 1.0})
    assert set(got.values()) == {False}, got


@pytest.mark.parametrize("i", range(len(bench.W3_ARGS)))
def test_w3_each_argument(i):
    w = bench.build_w3(False)
    res = bench.prepare(w, torch_ok=False, log=lambda m: None)
    f_locals = copy.deepcopy(w.f_locals)
    v = f_locals[f"a{i}"]
    if isinstance(v, list):
        v.append(0)
    elif isinstance(v, dict):
        v["new"] = 0
    elif isinstance(v, tuple):
        f_locals[f"a{i}"] = v[:-1]
    elif v is None:
        f_locals[f"a{i}"] = 0
    elif isinstance(v, bool):
        f_locals[f"a{i}"] = not v
    elif isinstance(v, float):
        f_locals[f"a{i}"] = int(v)  # equal or not, a different type must fail
    else:
        f_locals[f"a{i}"] = v * 2 if v else 1
    got = _answers(res, f_locals)
    assert set(got.values()) == {False}, got


def test_w1_type_change_of_equal_value():
    w = bench.build_w1(False)
    res = bench.prepare(w, torch_ok=False, log=lambda m: None)
    m = bench._w1_object(bench.W1Config)
    m.a1 = 1  # float 1.25 -> an int: different value and type
    assert set(_answers(res, {"m": m, "x": 1.0}).values()) == {False}
    m = bench._w1_object(bench.W1Config)
    m.a3 = False  # None -> False
    assert set(_answers(res, {"m": m, "x": 1.0}).values()) == {False}


def test_python_guard_source_cse_hoists_shared_prefixes():
    w = bench.build_w2(False)
    specs = list(w.builder.build().guards)
    plain, _ = bench.python_guard_source(specs)
    cse, _ = bench.python_guard_source(specs, cse=True, c_helpers=True)
    assert "_var0 = L['self']" in cse
    assert "L['self']._modules['layer3'].cfg['k']" in plain
    assert plain.count("return False") == cse.count("return False") == len(specs)


def test_main_quick_no_torch(capsys):
    assert bench.main(["--quick", "--no-torch", "-w", "W3", "--repeat", "2", "--time", "0.001"]) == 0
    out = capsys.readouterr().out
    for col in ("tripwire", "py-fn", "py-fn+", "C floor", "no-op"):
        assert col in out
