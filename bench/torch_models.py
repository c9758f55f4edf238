"""The real ``nn.Module``s whose torch.compile guards tripwire imports: one definition for the
benchmark (bench/real_models.py) and the import tests (tests/python/pytorch/test_torch_import.py).

* :class:`GPT`: token and position embeddings, ``n_layer`` blocks of LayerNorm, q/k/v/o attention
  and an MLP, dropout, one :class:`GPTConfig` object shared by every block (torch guards block 0's
  fields and ``is`` for the rest). The MLP's activation is the module global :func:`act`, so
  rebinding it must recompile (the tests rebind it here, in this module's globals).
* :class:`ConvNet`: a stem, ``blocks`` :class:`Residual` blocks (Conv2d, BatchNorm2d, ReLU in
  ``Sequential``s), pooling and a Linear.

The defaults are the tests' small sizes; the benchmark passes its own (bench/real_models.py).

Where this lives: bench/ is where the benchmark scripts import their siblings from (a script's
own directory is on its path), and pytest puts bench/ on the tests' path through
``pythonpath = ["bench"]`` in pyproject.toml (bench/ is already one of its ``testpaths``), so both
import it as ``torch_models`` with no ``sys.path`` edits. It imports torch: import it only where
torch is wanted (the tests after ``pytest.importorskip("torch")``, the benchmark lazily).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "GPT",
    "LSTMLM",
    "MLP",
    "Attention",
    "Block",
    "Chain",
    "ConvNet",
    "Encoder",
    "GPTConfig",
    "Hooked",
    "ModulesLoop",
    "Residual",
    "act",
    "act_twin",
    "double_output",
]


@dataclasses.dataclass
class GPTConfig:
    vocab: int = 32
    block: int = 16  # positions (the position embedding's size)
    d: int = 16
    heads: int = 4
    n_layer: int = 2
    dropout: float = 0.0
    causal: bool = True


def act(t):  # the MLP's activation, read as a global: rebinding it must recompile
    return F.gelu(t)


def act_twin(t):  # the same body, another code object
    return F.gelu(t)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg  # one config object shared by every block
        self.q = nn.Linear(cfg.d, cfg.d)
        self.k = nn.Linear(cfg.d, cfg.d)
        self.v = nn.Linear(cfg.d, cfg.d)
        self.o = nn.Linear(cfg.d, cfg.d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        B, T, C = x.shape
        h = self.cfg.heads
        q = self.q(x).view(B, T, h, C // h).transpose(1, 2)
        k = self.k(x).view(B, T, h, C // h).transpose(1, 2)
        v = self.v(x).view(B, T, h, C // h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.cfg.causal)
        return self.drop(self.o(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d, 4 * cfg.d)
        self.proj = nn.Linear(4 * cfg.d, cfg.d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.proj(act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d)
        self.wpe = nn.Embedding(cfg.block, cfg.d)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, cfg.vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


class Residual(nn.Module):
    def __init__(self, c: int, bias: bool = True) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, bias=bias),
            nn.BatchNorm2d(c),
            nn.ReLU(),
            nn.Conv2d(c, c, 3, padding=1, bias=bias),
            nn.BatchNorm2d(c),
        )

    def forward(self, x):
        return F.relu(x + self.body(x))


class ConvNet(nn.Module):
    def __init__(self, c: int = 8, blocks: int = 2, classes: int = 10, bias: bool = True) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=bias), nn.BatchNorm2d(c), nn.ReLU())
        self.layers = nn.Sequential(*[Residual(c, bias) for _ in range(blocks)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


class LSTMLM(nn.Module):
    """An LSTM language model: embedding, a batch-first LSTM, a Linear head. torch guards the
    LSTM's ``_flat_weights`` list against its parameters (``a is b``)."""

    def __init__(self, vocab: int = 32, d: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, num_layers=layers, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        h, _ = self.lstm(self.emb(idx))
        return self.head(h)


class Encoder(nn.Module):
    """An ``nn.TransformerEncoder`` (pre- or post-norm) called with a padding mask. Its layers call
    ``self.self_attn(...)``, an ``nn.MultiheadAttention`` whose ``forward`` has defaults: torch
    guards them through the class dict (``dict(type(X).__dict__)['forward'].__defaults__``)."""

    def __init__(self, d: int = 16, heads: int = 4, layers: int = 2, norm_first: bool = False) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            d, heads, dim_feedforward=2 * d, dropout=0.0, batch_first=True, norm_first=norm_first
        )
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x, pad):
        return self.enc(x, src_key_padding_mask=pad)


def double_output(module, args, output):  # a forward hook (module-level: one code object)
    return output * 2


class Hooked(nn.Module):
    """Two Linears, the first with a forward hook: torch guards the hook dicts and, through the
    class's MRO, ``nn.Module``'s ``_compiled_call_impl``."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)
        self.a.register_forward_hook(double_output)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class SmallMLP(nn.Module):
    """Two Linears and a ReLU: a set that is mostly torch's fixed cost (ambient state, tensors)."""

    def __init__(self, d: int = 32, hidden: int = 64, out: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class ModulesLoop(nn.Module):
    """``self.modules()`` inside forward: torch guards ``nn.Module.modules``'s defaults through the
    MRO (``dict(type(X).__mro__[1].__dict__)['modules'].__defaults__``)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(d, d)
        self.act = nn.ReLU()
        self.b = nn.Linear(d, d)

    def forward(self, x):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                x = m(x)
        return x


class Chain(nn.Module):
    """``depth`` modules nested one in another, each with a Linear: the innermost parameter's
    source is three steps per level deep (``._modules['inner']``, then ``._parameters['weight']``)."""

    def __init__(self, depth: int = 25, d: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.inner = Chain(depth - 1, d) if depth > 1 else None

    def forward(self, x):
        x = self.lin(x)
        return x if self.inner is None else self.inner(x)


class Symmetric(nn.Module):
    """A parametrization: the weight's upper triangle mirrored."""

    def forward(self, w):
        return w.triu() + w.triu(1).transpose(-1, -2)


class Parametrized(nn.Module):
    """Three parametrized Linears (torch.nn.utils.parametrize: orthogonal, a custom one, weight
    norm). torch guards ``not hasattr(parametrizations.weight, '1')`` on each, which runs
    nn.Module.__getattr__ unless decided natively (runtime/eval/dict_getattr.hpp)."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.a = nn.utils.parametrizations.orthogonal(nn.Linear(d, d))
        self.b = nn.Linear(d, d)
        torch.nn.utils.parametrize.register_parametrization(self.b, "weight", Symmetric())
        self.c = nn.utils.parametrizations.weight_norm(nn.Linear(d, 4))

    def forward(self, x):
        return self.c(torch.tanh(self.b(self.a(x))))


class Aliased(nn.Module):
    """A module class with its own ``__getattr__`` that resolves aliases through
    ``super().__getattr__``: torch guards the class dict's alias table, the MRO's ``__getattr__``
    and its closure cell (``__class__``), read through type attributes and a bound method."""

    aliases: ClassVar[dict[str, str]] = {"encode": "inp", "decode": "out"}

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.scale = 0.5

    def __getattr__(self, name):
        target = type(self).aliases.get(name)
        return super().__getattr__(target if target is not None else name)

    def forward(self, x):
        return self.decode(torch.relu(self.encode(x))) * self.scale


class PartialAct(nn.Module):
    """Activations held as ``functools.partial`` objects: their ``func`` and ``keywords`` are read
    through member descriptors (object slots)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.fc2 = nn.Linear(d, d)
        self.act = functools.partial(F.leaky_relu, negative_slope=0.2)
        self.gate = functools.partial(torch.clamp, min=-1.0, max=1.0)

    def forward(self, x):
        return self.gate(self.fc2(self.act(self.fc1(x))))


class RunningStats(nn.Module):
    """Running statistics updated in place under no_grad while training (buffers mutated every
    call, ``self.training`` read), then a Linear."""

    def __init__(self, d: int = 16, momentum: float = 0.05) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(d))
        self.register_buffer("var", torch.ones(d))
        self.momentum = momentum
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.mean.lerp_(x.mean(0), self.momentum)
                self.var.lerp_(x.var(0, unbiased=False), self.momentum)
        return self.fc((x - self.mean) * torch.rsqrt(self.var + 1e-5))
