"""Acceptance of tripwire.torch.compile on models that are not in its issue: each runs through
torch.compile and tripwire.torch.compile from identical copies, and every output, every state
(parameters, buffers, Python-side counters) and every error is compared (torch.equal on eager and
aot_eager, a tolerance on inductor, which is marked slow). Inputs change to hit and to recompile."""

from __future__ import annotations

import copy
import threading
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch")

import tripwire.torch as twt  # noqa: E402
from tripwire import frame as twf  # noqa: E402
from tripwire.torch import _compile  # noqa: E402

nn = torch.nn
counters = torch._dynamo.utils.counters
FAST = ["eager", "aot_eager"]
# inductor's import warns (torch.jit) in the test that imports it first
ALL = [
    *FAST,
    pytest.param(
        "inductor", marks=[pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
    ),
]


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    counters.clear()
    _compile._warned.clear()  # each test sees its own once-only warnings (errors under pytest)
    yield
    torch._dynamo.reset()
    assert twf.current() is None
    assert twf.status()["eval_frame"] == "default"


def same(a, b, backend: str) -> bool:
    """Outputs compared as trees: dicts, NamedTuples, tuples, lists, tensors, plain values."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.requires_grad != b.requires_grad:
            return False
        if backend == "inductor":
            return torch.allclose(a, b, rtol=1e-4, atol=1e-5)
        return torch.equal(a, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], backend) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y, backend) for x, y in zip(a, b, strict=True))
    return a == b


def same_state(m1, m2, backend: str) -> None:
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys()
    for k in s1:
        assert same(s1[k], s2[k], backend), k


def pair(make, backend: str, **kwargs):
    """Identical copies of a model, one compiled by each route."""
    torch.manual_seed(0)
    ref = make()
    ours = copy.deepcopy(ref)
    return (
        ref,
        ours,
        torch.compile(ref, backend=backend, **kwargs),
        twt.compile(ours, backend=backend, **kwargs),
    )


def run_both(make, calls, backend: str, prepare=None):
    """Each call (args, a mode) through both routes; outputs and states compared after each."""
    ref, ours, ct, cw = pair(make, backend)
    for args, mode in calls:
        for m in (ref, ours):
            m.train(mode == "train")
        with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
            a = ct(*args)
            b = cw(*args)
        assert same(a, b, backend), (args, mode)
        same_state(ref, ours, backend)
    return ref, ours


# -- a ViT-style patch embedding and attention ------------------------------------------------------
class PatchAttention(nn.Module):
    def __init__(self, dim=32, patch=4, heads=4):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, img):
        x = self.embed(img).flatten(2).transpose(1, 2)  # (B, N, dim)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
        return x + self.proj(y)


@pytest.mark.parametrize("backend", ALL)
def test_vit_patch_attention(backend):
    calls = [
        ((torch.randn(2, 3, 16, 16),), "eval"),
        ((torch.randn(2, 3, 16, 16),), "eval"),  # hit
        ((torch.randn(3, 3, 16, 16),), "eval"),  # batch: recompile (automatic dynamic)
        ((torch.randn(2, 3, 24, 24),), "eval"),  # more patches
        ((torch.randn(2, 3, 16, 16),), "no_grad"),  # grad mode: recompile
    ]
    run_both(PatchAttention, calls, backend)


# -- a ResNet basic block with BatchNorm, in train and eval mode ------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


@pytest.mark.parametrize("backend", ALL)
def test_resnet_block_batchnorm_train_and_eval(backend):
    x = torch.randn(4, 8, 8, 8)
    calls = [
        ((x,), "train"),  # updates running_mean/var and num_batches_tracked: compared after
        ((x.clone(),), "train"),
        ((x,), "eval"),  # training flag: recompile; running stats used
        ((torch.randn(4, 8, 8, 8),), "eval"),
        ((torch.randn(2, 8, 8, 8),), "train"),
    ]
    ref, ours = run_both(BasicBlock, calls, backend)
    assert int(ours.bn1.num_batches_tracked) == 3


# -- a GRU --------------------------------------------------------------------------------------------
class GRUHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(6, 12, num_layers=2, batch_first=True)
        self.head = nn.Linear(12, 3)

    def forward(self, x, h=None):
        out, h = self.gru(x, h)
        return self.head(out[:, -1]), h


@pytest.mark.parametrize("backend", ALL)
def test_gru(backend):
    h0 = torch.zeros(2, 3, 12)
    calls = [
        ((torch.randn(3, 5, 6),), "eval"),
        ((torch.randn(3, 5, 6),), "eval"),
        ((torch.randn(3, 7, 6),), "eval"),  # sequence length
        ((torch.randn(3, 5, 6), h0), "eval"),  # an initial state: another signature
        ((torch.randn(3, 5, 6), h0 + 1), "no_grad"),
    ]
    run_both(GRUHead, calls, backend)


# -- outputs that are a dict and a NamedTuple ---------------------------------------------------------
class Out(NamedTuple):
    logits: torch.Tensor
    loss: torch.Tensor | None


class Structured(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 4)

    def forward(self, batch):
        logits = self.lin(batch["x"])
        loss = None
        if "y" in batch:
            loss = nn.functional.cross_entropy(logits, batch["y"])
        return {"out": Out(logits, loss), "n": batch["x"].shape[0], "tag": batch.get("tag", "none")}


@pytest.mark.parametrize("backend", ALL)
def test_dict_and_namedtuple_outputs(backend):
    x = torch.randn(6, 5)
    y = torch.randint(0, 4, (6,))
    calls = [
        (({"x": x},), "eval"),
        (({"x": x, "y": y},), "eval"),  # another key: recompile, loss computed
        (({"x": x, "y": y, "tag": "t"},), "eval"),
        (({"x": x[:3], "y": y[:3]},), "eval"),
        (({"x": x},), "eval"),  # hit on the first entry
    ]
    ref, ours = run_both(Structured, calls, backend)
    out = twt.compile(ours, backend=backend)({"x": x, "y": y})
    assert isinstance(out["out"], Out) and out["out"].loss is not None


# -- Python-side side effects: no frame runs twice ----------------------------------------------------
class Counted(nn.Module):
    """Python state the compiled code mutates (Dynamo replays the mutation after the graph): each
    count is one run of the frame."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0
        self.seen = []

    def forward(self, x):
        self.calls += 1
        self.seen.append(x.shape[0])
        y = self.lin(x)
        if self.calls % 2:  # reads the counter: guards on it, recompiles on the other parity
            y = y * 2
        return y


@pytest.mark.parametrize("backend", FAST)
def test_python_side_counter_counts_each_call_once(backend):
    ref, ours, ct, cw = pair(Counted, backend)
    log = []
    g_ref = {"n": 0}
    g_ours = {"n": 0}

    def step(state, x):
        state["n"] += 1  # a dict mutated in compiled code
        log.append(state["n"])
        return x.sin() + state["n"]

    st, sw = torch.compile(step, backend=backend), twt.compile(step, backend=backend)
    for i in range(6):
        x = torch.randn(i % 3 + 1, 4)
        assert same(ct(x), cw(x), backend)
        assert same(st(g_ref, x), sw(g_ours, x), backend)
    assert ref.calls == ours.calls == 6 and ref.seen == ours.seen == [1, 2, 3, 1, 2, 3]
    assert g_ref == g_ours == {"n": 6}
    assert log == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]  # each route's frame ran once per call


# -- a training loop with an optimizer and recompiles -----------------------------------------------
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.bn = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 2)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.body(x))))


def _train(model, compiled, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(compiled(x).float(), y)
    loss.backward()
    opt.step()
    with torch.no_grad():
        model.out.bias.add_(0.001)  # an in-place update outside the optimizer
    return loss.detach()


@pytest.mark.parametrize("backend", ALL)
def test_training_loop_with_optimizer_and_recompiles(backend):
    ref, ours, ct, cw = pair(Net, backend)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    plan = [
        (8, torch.float32, True, "train"),
        (8, torch.float32, True, "train"),  # hit
        (5, torch.float32, True, "train"),  # batch size: recompile
        (8, torch.float64, True, "train"),  # dtype: recompile (the model goes float64 too)
        (8, torch.float32, False, "train"),  # first layer frozen: requires_grad changes
        (8, torch.float32, True, "eval"),  # train/eval: recompile
        (8, torch.float32, True, "train"),
    ]
    for batch, dtype, grad, mode in plan:
        for m in (ref, ours):
            m.to(dtype)
            m.train(mode == "train")
            m.body[0].weight.requires_grad_(grad)
        x = torch.randn(batch, 8, generator=g, dtype=dtype)
        y = torch.randint(0, 2, (batch,), generator=g)
        a = _train(ref, ct, opt_ref, x, y)
        b = _train(ours, cw, opt_ours, x, y)
        assert same(a, b, backend), (batch, dtype, grad, mode)
        same_state(ref, ours, backend)
        for p, q in zip(ref.parameters(), ours.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                assert same(p.grad, q.grad, backend)


# -- an exception raised inside compiled code ---------------------------------------------------------
class Checked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.after = 0

    def forward(self, x, limit):
        y = self.lin(x)
        if x.shape[0] > limit:
            raise ValueError(f"batch {x.shape[0]} over {limit}")
        self.after += 1
        return y


@pytest.mark.parametrize("backend", FAST)
def test_exception_inside_compiled_code(backend):
    ref, ours, ct, cw = pair(Checked, backend)
    for n, limit in [(2, 4), (5, 4), (2, 4), (6, 4), (3, 1), (1, 1)]:
        x = torch.randn(n, 3)
        outcomes = []
        for c in (ct, cw):
            try:
                outcomes.append(("ok", c(x, limit)))
            except ValueError as e:
                outcomes.append(("raised", str(e)))
        (ka, va), (kb, vb) = outcomes
        assert ka == kb, (n, limit)
        assert same(va, vb, backend) if ka == "ok" else va == vb
    assert ref.after == ours.after == 3
    assert torch.is_grad_enabled()  # nothing left behind by the raising calls


# -- threads calling one compiled module --------------------------------------------------------------
@pytest.mark.parametrize("backend", FAST)
def test_threads_call_one_compiled_module(backend):
    torch.manual_seed(0)
    model = PatchAttention().eval()
    cw = twt.compile(model, backend=backend)
    inputs = [torch.randn(b, 3, 16, 16) for b in (1, 2, 3, 2, 1, 3)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]  # eager: the oracle for every thread
    errors = []
    barrier = threading.Barrier(4)

    def worker(k):
        try:
            barrier.wait()
            with torch.no_grad():
                for i in range(12):
                    j = (i + k) % len(inputs)
                    out = cw(inputs[j])
                    if not torch.allclose(out, expected[j], rtol=1e-5, atol=1e-6):
                        errors.append((k, j, "mismatch"))
            if twf.current() is not None:
                errors.append((k, "hook left set"))
        except Exception as e:  # reported below
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    # The threads' compiled outputs equal torch.compile's on the same inputs.
    tc = torch.compile(copy.deepcopy(model), backend=backend)
    with torch.no_grad():
        for x in inputs:
            assert same(tc(x), cw(x), backend)
