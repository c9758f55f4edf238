"""The real ``nn.Module``s whose torch.compile guards tripwire imports: one definition for the
benchmark (bench/real_models.py) and the import tests (tests/python/test_torch_import.py).

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

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GPT", "MLP", "Attention", "Block", "ConvNet", "GPTConfig", "Residual", "act", "act_twin"]


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
