"""The real-model cases of the fresh-process round trip (test_serialization_torch.py).

Each case builds the same model or function and inputs in any process (seeded), and ``trials``
yields the same sequence of mutated inputs from a seed in every process: the mutations of
test_torch_import.py's differential cases (configs, training flags, submodules swapped or
replaced, hooks, rebound globals), its tensor mutations (shape, stride, dtype, requires_grad,
Parameter, copies, views, aliasing, marked dims) and its torch-state mutations (grad mode,
default dtype, determinism, threads, autocast, a torch-function mode, a default device). The
parent process compiles with torch and records torch's and the live set's answers; a fresh child
process rebuilds the inputs without compiling and answers with the loaded set.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import random
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

import test_torch_import as T

Mutation = Callable[[random.Random], Callable[[], None]]


@dataclasses.dataclass
class Case:
    target: Any  # what torch compiles and guards_of imports
    args: tuple  # the call that compiles it
    make_locals: Callable[[], dict]
    mutations: list[Mutation]
    seed: int


def gpt() -> Case:
    torch.manual_seed(0)
    cfg = T.GPTConfig()
    model = T.GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (2, 8))
    one_of, set_attr, subs = T.one_of, T.set_attr, T.submodules

    def cfg_field(rng: random.Random) -> Callable[[], None]:
        name, values = one_of(
            rng, [("heads", (2, 8, 4.0, 4)), ("causal", (False, 1, None, True)), ("d", (8, 16))]
        )
        return set_attr(cfg, name, one_of(rng, values))

    def training(rng: random.Random) -> Callable[[], None]:
        return set_attr(one_of(rng, subs(model)), "training", one_of(rng, (True, False, 0)))

    def dropout_p(rng: random.Random) -> Callable[[], None]:
        return set_attr(one_of(rng, subs(model, nn.Dropout)), "p", one_of(rng, (0.1, 0.0, 0)))

    def layernorm(rng: random.Random) -> Callable[[], None]:
        m = one_of(rng, subs(model, nn.LayerNorm))
        name, values = one_of(rng, [("eps", (1e-6, 1e-05, 1)), ("normalized_shape", ((16,), [16], (17,)))])
        return set_attr(m, name, one_of(rng, values))

    def hook(rng: random.Random) -> Callable[[], None]:
        return one_of(rng, subs(model)).register_forward_hook(lambda *a: None).remove

    def swap_blocks(rng: random.Random) -> Callable[[], None]:
        mods = model.blocks._modules
        return T.replace_dict(mods, [("0", mods["1"]), ("1", mods["0"])])

    def grow_blocks(rng: random.Random) -> Callable[[], None]:
        mods = model.blocks._modules
        return T.replace_dict(mods, [*mods.items(), ("2", T.Block(cfg))])

    def fresh_submodule(rng: random.Random) -> Callable[[], None]:
        b = one_of(rng, model.blocks)
        name = one_of(rng, ("mlp", "ln1"))
        return set_attr(b, name, T.MLP(cfg) if name == "mlp" else nn.LayerNorm(cfg.d))

    def other_type(rng: random.Random) -> Callable[[], None]:
        return set_attr(one_of(rng, model.blocks).mlp, "drop", one_of(rng, (nn.Identity(), nn.Dropout(0.0))))

    def rebind_act(rng: random.Random) -> Callable[[], None]:
        g = vars(T.torch_models)  # the MLP's globals
        return T.set_global("act", one_of(rng, (T.act_twin, types.FunctionType(T.act.__code__, g), T.act)), g)

    return Case(
        model,
        (idx,),
        lambda: {"self": model, "idx": idx},
        [
            cfg_field,
            training,
            dropout_p,
            layernorm,
            hook,
            swap_blocks,
            grow_blocks,
            fresh_submodule,
            other_type,
            rebind_act,
        ],
        seed=1,
    )


def cnn() -> Case:
    torch.manual_seed(0)
    model = T.ConvNet()
    x = torch.randn(2, 3, 8, 8)
    one_of, set_attr, subs = T.one_of, T.set_attr, T.submodules

    def conv_field(rng: random.Random) -> Callable[[], None]:
        m = one_of(rng, subs(model, nn.Conv2d))
        name = one_of(rng, ("stride", "padding", "dilation"))
        return set_attr(m, name, one_of(rng, ((1, 1), (2, 2), (1.0, 1), [1, 1], (1,))))

    def batchnorm(rng: random.Random) -> Callable[[], None]:
        m = one_of(rng, subs(model, nn.BatchNorm2d))
        name, values = one_of(
            rng, [("momentum", (0.1, None, 0.2)), ("eps", (1e-5, 1e-3)), ("training", (True, False))]
        )
        return set_attr(m, name, one_of(rng, values))

    def relu(rng: random.Random) -> Callable[[], None]:
        return set_attr(one_of(rng, subs(model, nn.ReLU)), "inplace", one_of(rng, (True, False)))

    def swap_res(rng: random.Random) -> Callable[[], None]:
        mods = model.layers._modules
        return T.replace_dict(mods, [("0", mods["1"]), ("1", mods["0"])])

    def seq_change(rng: random.Random) -> Callable[[], None]:
        seq = one_of(rng, [model.stem, model.layers[0].body, model.layers[1].body])
        items = list(seq._modules.items())
        i = rng.randrange(len(items))
        choice = rng.randrange(4)
        if choice == 0:
            items[i] = (items[i][0], copy.deepcopy(items[i][1]))
        elif choice == 1:
            items[i] = (items[i][0], nn.GELU())
        elif choice == 2:
            del items[i]
        else:
            items.append((str(len(items)), nn.Identity()))
        return T.replace_dict(seq._modules, items)

    def training(rng: random.Random) -> Callable[[], None]:
        return set_attr(one_of(rng, subs(model)), "training", one_of(rng, (True, False)))

    def hook(rng: random.Random) -> Callable[[], None]:
        return one_of(rng, subs(model)).register_forward_pre_hook(lambda *a: None).remove

    return Case(
        model,
        (x,),
        lambda: {"self": model, "x": x},
        [conv_field, batchnorm, relu, swap_res, seq_change, training, hook],
        seed=2,
    )


def config() -> Case:
    x = torch.ones(3)
    state: dict[str, Any] = {"cfg": T.config_base()}
    one_of, set_item = T.one_of, T.set_item

    def value(rng: random.Random) -> Callable[[], None]:
        spec = one_of(rng, list(state["cfg"]["layers"].values()))
        return set_item(spec, one_of(rng, ("kind", "k")), one_of(rng, ("mul", "add", 2, 0.5, 2.0, "2")))

    def opt(rng: random.Random) -> Callable[[], None]:
        cfg = state["cfg"]
        field, values = one_of(
            rng,
            [
                ("scale", (2.0, 2, 3.0)),
                ("use_bias", (True, False, 1)),
                ("sizes", ((1, 2), (1, 2, 3), [1, 2])),
            ],
        )
        cur = cfg["opt"] if isinstance(cfg["opt"], T.Opt) else T.Opt()
        return set_item(cfg, "opt", dataclasses.replace(cur, **{field: one_of(rng, values)}))

    def layers_keys(rng: random.Random) -> Callable[[], None]:
        layers = state["cfg"]["layers"]
        items = list(layers.items())
        if rng.random() < 0.5:
            items.reverse()
        else:
            items.append(("c", {"kind": "mul", "k": 1}))
        return T.replace_dict(layers, items)

    def layers_type(rng: random.Random) -> Callable[[], None]:
        cfg = state["cfg"]
        kind = one_of(rng, (collections.OrderedDict, T.MyDict, dict))
        return set_item(cfg, "layers", kind(cfg["layers"]))

    def tags(rng: random.Random) -> Callable[[], None]:
        return set_item(state["cfg"], "tags", one_of(rng, (["x"], ["x", "y"], ("x", "y"), [])))

    def depth(rng: random.Random) -> Callable[[], None]:
        return set_item(state["cfg"], "depth", one_of(rng, (3, 4, 3.0, True)))

    return Case(
        T.config_fn,
        (x, T.config_base()),
        lambda: {"x": x, "cfg": state["cfg"]},
        [value, opt, layers_keys, layers_type, tags, depth],
        seed=4,
    )


CASES: dict[str, Callable[[], Case]] = {"gpt": gpt, "cnn": cnn, "config": config}


def trials(case: Case, n: int) -> Iterator[tuple[str, dict]]:
    """(what was mutated, the locals) for the unmutated input and then n trials of zero to three
    mutations each, undone after the consumer's step: the same sequence in every process."""
    d = T.Differential(None, None, case.make_locals)
    mutations = [*case.mutations, *d.tensor_mutations(), *d.state_mutations()]
    rng = random.Random(case.seed)
    yield "nothing", d.locals()
    for t in range(n):
        chosen = [rng.choice(mutations) for _ in range(rng.choice((0, 1, 1, 1, 2, 2, 3)))]
        undos = []
        try:
            for m in chosen:
                undos.append(m(rng))
            yield f"trial {t}: " + ", ".join(m.__name__ for m in chosen), d.locals()
        finally:
            for u in reversed(undos):
                u()


def answer(gs: Any, f_locals: dict) -> list:
    """A set's decision and its first failure: (passed, [guard index, kind, source] or None)."""
    ok = gs.check(f_locals)
    f = None if ok else gs.why_not(f_locals)
    return [ok, None if f is None else [f.guard.index, f.kind, f.source]]
