"""Generated SHAPE relations and inputs, for comparing the engine with the reference.

``relation_set(r)`` draws a few well-typed relations over a fixed pool of symbols (sizes, strides
and the storage offset of a tensor-like object, int and float locals, a global, an attribute),
printed with as few parentheses as Python's grammar allows (so the engine's precedence is
checked against Python's own parser, which the reference uses). ``frame(r)`` draws values:
zero, one, negative numbers, numbers around 2**63 and far beyond, NaN, infinities, -0.0,
subnormals, and now and then a value of the wrong type or a missing local.

Used by tests/python/shapes/test_shapes.py (bounded) and, by hand, for the long run::

    python tests/python/support/shape_cases.py --pairs 100000 --seed 1
"""

from __future__ import annotations

import argparse
import ast
import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import reference
import tripwire as tw
from tripwire import _core
from tripwire.catalogue import GuardSpec


class FakeTensor:
    """Enough of a tensor for the SIZE/STRIDE/STORAGE_OFFSET steps' generic path."""

    def __init__(self, sizes: tuple, strides: tuple, offset: Any) -> None:
        self._sizes, self._strides, self._offset = sizes, strides, offset

    def size(self) -> tuple:
        return self._sizes

    def stride(self) -> tuple:
        return self._strides

    def storage_offset(self) -> Any:
        return self._offset


class Holder:
    def __init__(self, n: Any) -> None:
        self.n = n


INT_SYMBOLS = [
    "L['a']",
    "L['b']",
    "L['x'].size()[0]",
    "L['x'].size()[1]",
    "L['x'].stride()[0]",
    "L['x'].storage_offset()",
    "G['g']",
    "L['o'].n",
]
FLOAT_SYMBOLS = ["L['s']", "L['t']"]

_BIG = [2**31, 2**53 - 1, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 3 * 2**70, 10**30, 2**100]
INT_VALUES = (
    [0, 1, -1, 2, -2, 3, 4, 7, 8, 9, 16, -9, 1000] + _BIG + [-v for v in _BIG] + [-(2**63), -(2**63) - 1]
)
FLOAT_VALUES = [
    0.0,
    -0.0,
    0.5,
    -1.5,
    2.0,
    3.0,
    1e16,
    2.0**53,
    1e308,
    -1e308,
    5e-324,
    math.inf,
    -math.inf,
    math.nan,
    0.1,
    -7.25,
]


def int_value(r: random.Random) -> int:
    x = r.random()
    if x < 0.6:
        return r.choice(INT_VALUES)
    if x < 0.85:
        return r.randint(-20, 20)
    return r.randint(-(2**66), 2**66)


def float_value(r: random.Random) -> float:
    x = r.random()
    if x < 0.7:
        return r.choice(FLOAT_VALUES)
    if x < 0.9:
        return r.uniform(-100, 100)
    return r.choice([-1.0, 1.0]) * 2.0 ** r.randint(-1074, 1023)


# -- expressions ---------------------------------------------------------------------------------
# Built fully parenthesised; parentheses Python's grammar does not need are dropped afterwards.


def _int_const(r: random.Random) -> str:
    v = r.choice([0, 1, 2, 3, 4, 6, 8, 16, 1024, 2**63 - 1, 2**63, 2**64, 10**20, 2])
    return str(v)


def _float_const(r: random.Random) -> str:
    return r.choice(["0.5", "2.0", "1.5", "0.0", "1e308", "math.inf", "math.nan", "3.25", "1e-300"])


class Gen:
    def __init__(self, r: random.Random) -> None:
        self.r = r

    def pick(self, *options: Any) -> Any:
        return self.r.choice(options)

    def int_(self, d: int) -> str:
        r = self.r
        if d <= 0 or r.random() < 0.3:
            return r.choice(INT_SYMBOLS) if r.random() < 0.7 else _int_const(r)
        k = r.randrange(14)
        a = lambda: self.int_(d - 1)
        if k == 0:
            return f"({a()} {self.pick('+', '-', '*')} {a()})"
        if k == 1:
            return f"({a()} {self.pick('//', '%')} {a()})"
        if k == 2:
            return f"({a()} ** {self.pick('0', '1', '2', '3', '5', a())})"
        if k == 3:
            return f"{self.pick('min', 'max', 'Min', 'Max')}({a()}, {a()})"
        if k == 4:
            return f"{self.pick('abs', 'Abs')}({a()})"
        if k == 5:
            return f"(-{a()})"
        if k == 6:
            fn = self.pick("math.floor", "math.ceil", "math.trunc", "int", "round", "FloorToInt", "CeilToInt")
            return f"{fn}({self.float_(d - 1)})"
        if k == 7:
            return f"({a()} if {self.bool_(d - 1)} else {a()})"
        if k == 8:
            fn = self.pick("FloorDiv", "CleanDiv", "Mod", "PythonMod", "PowByNatural")
            return f"{fn}({a()}, {a() if fn != 'PowByNatural' else self.pick('2', '3', a())})"
        if k == 9:
            return f"{self.pick('Add', 'Mul')}({a()}, {a()}, {a()})"
        if k == 10:
            return f"max({a()}, {a()}, {a()})"
        return f"({a()} {self.pick('+', '-', '*', '//', '%')} {a()})"

    def float_(self, d: int) -> str:
        r = self.r
        if d <= 0 or r.random() < 0.3:
            return r.choice(FLOAT_SYMBOLS) if r.random() < 0.7 else _float_const(r)
        k = r.randrange(11)
        f = lambda: self.float_(d - 1)
        i = lambda: self.int_(d - 1)
        if k == 0:
            return f"({f()} {self.pick('+', '-', '*', '/')} {f()})"
        if k == 1:
            return f"({f()} {self.pick('+', '*', '/', '//', '%')} {i()})"
        if k == 2:
            return f"({i()} {self.pick('-', '/', '//', '%')} {f()})"
        if k == 3:
            return f"({f()} {self.pick('//', '%')} {f()})"
        if k == 4:
            return f"({i()} / {i()})"
        if k == 5:
            return f"{self.pick('float', 'torch.sym_float', 'ToFloat')}({i()})"
        if k == 6:
            return f"{self.pick('IntTrueDiv', 'FloatTrueDiv')}({i()}, {i()})"
        if k == 7:
            return f"{self.pick('min', 'max')}({f()}, {f()})"
        if k == 8:
            return f"{self.pick('abs', '-')}({f()})"
        if k == 9:
            return f"({f()} if {self.bool_(d - 1)} else {f()})"
        return f"({f()} {self.pick('+', '-')} {f()})"

    def number(self, d: int) -> str:
        return self.int_(d) if self.r.random() < 0.7 else self.float_(d)

    def bool_(self, d: int) -> str:
        r = self.r
        ops = ("==", "!=", "<", "<=", ">", ">=")
        k = r.randrange(12) if d > 0 else r.randrange(4)
        if k == 0:
            return f"({self.int_(d - 1)} {r.choice(ops)} {self.int_(d - 1)})"
        if k == 1:
            return f"({self.number(d - 1)} {r.choice(ops)} {self.number(d - 1)})"
        if k == 2:  # a chain, as torch prints ranges
            return f"({self.number(d - 1)} {r.choice(ops)} {self.number(d - 1)} {r.choice(ops)} {self.number(d - 1)})"
        if k == 3:
            return f"(not {self.pick('math.isnan')}({self.number(d - 1)}))"
        if k == 4:
            return f"({self.bool_(d - 1)} {self.pick('and', 'or')} {self.bool_(d - 1)})"
        if k == 5:
            return f"(not {self.bool_(d - 1)})"
        if k == 6:
            fn = self.pick("Eq", "Ne", "Lt", "Le", "Gt", "Ge")
            return f"{fn}({self.number(d - 1)}, {self.number(d - 1)})"
        if k == 7:
            return f"{self.pick('And', 'Or')}({self.bool_(d - 1)}, {self.bool_(d - 1)}, {self.bool_(d - 1)})"
        if k == 8:
            return f"({self.bool_(d - 1)} {self.pick('==', '!=')} {self.bool_(d - 1)})"
        if k == 9:
            return f"Not({self.bool_(d - 1)})"
        if k == 10:
            return f"({self.bool_(d - 1)} {self.pick('and', 'or')} {self.pick('True', 'False')})"
        return f"(({self.int_(d - 1)} % {self.int_(d - 1)}) == 0)"


def _unparenthesise(text: str, r: random.Random) -> str:
    """Drop parentheses that Python's grammar does not need (same tree), in random order."""
    want = ast.dump(ast.parse(text, mode="eval"))
    pairs = []
    stack = []
    in_str = None
    for i, c in enumerate(text):
        if in_str:
            if c == in_str:
                in_str = None
            continue
        if c in "'\"":
            in_str = c
        elif c == "(":
            stack.append(i)
        elif c == ")":
            pairs.append((stack.pop(), i))
    r.shuffle(pairs)
    removed: set[int] = set()
    for open_, close in pairs:
        # Keep call parentheses: a name (not a keyword) or a closing bracket right before.
        before = text[:open_].rstrip()
        word = before[
            len(before.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")) :
        ]
        if (word and word not in ("and", "or", "not", "if", "else")) or (before and before[-1] in ")]"):
            continue
        trial = removed | {open_, close}
        candidate = "".join(c for k, c in enumerate(text) if k not in trial)
        try:
            same = ast.dump(ast.parse(candidate, mode="eval")) == want
        except SyntaxError:
            same = False
        if same:
            removed = trial
    return "".join(c for k, c in enumerate(text) if k not in removed)


def relation(r: random.Random) -> str:
    text = Gen(r).bool_(r.randint(1, 4))
    return _unparenthesise(text, r) if r.random() < 0.8 else text


# -- relation sets and frames --------------------------------------------------------------------
@dataclass
class Case:
    specs: list[GuardSpec]
    texts: list[str]


def _symbol_type(src: tw.Source) -> str:
    return "float" if str(src) in FLOAT_SYMBOLS else "int"


def relation_set(r: random.Random) -> Case:
    specs: list[GuardSpec] = []
    texts: list[str] = []
    index = 0
    for _ in range(r.randint(1, 4)):
        if r.random() < 0.15:  # a plain guard in between, on a symbol's root
            specs.append(
                GuardSpec(tw.GuardKind.NOT_NONE, tw.Source.parse(r.choice(["L['x']", "L['a']"])), (), index)
            )
            index += 1
        text = relation(r)
        if r.random() < 0.1 and texts:
            text = r.choice(texts)  # a duplicate, to be merged
        rel = tw.shapes.parse(text)
        types = tuple(_symbol_type(s) for s in rel.symbols)
        specs.append(GuardSpec(tw.GuardKind.SHAPE, None, (rel.text, rel.symbols, types), index))
        texts.append(rel.text)
        index += 1
    return Case(specs, texts)


def frame(r: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    def iv() -> Any:
        x = r.random()
        if x < 0.02:
            return True  # a bool is not an int symbol's type
        if x < 0.04:
            return 3.0
        return int_value(r)

    def fv() -> Any:
        return 3 if r.random() < 0.03 else float_value(r)

    f_locals: dict[str, Any] = {
        "a": iv(),
        "b": iv(),
        "x": FakeTensor((iv(), iv()), (iv(),), iv()),
        "o": Holder(iv()),
        "s": fv(),
        "t": fv(),
    }
    if r.random() < 0.03:
        del f_locals[r.choice(list(f_locals))]
    if r.random() < 0.02:
        f_locals["x"] = FakeTensor((iv(),), (), iv())  # a size index past the rank
    return f_locals, {"g": iv()}


def run_pairs(n_pairs: int, seed: int, inputs_per_set: int = 4) -> dict[str, int]:
    """Compare the engine with the reference on ``n_pairs`` (relation set, input) pairs: check(),
    and the first failing guard of why_not(); raises AssertionError on the first mismatch."""
    r = random.Random(seed)
    stats = {"pairs": 0, "sets": 0, "relations": 0, "passed": 0, "failed": 0, "merged_or_implied": 0}
    while stats["pairs"] < n_pairs:
        case = relation_set(r)
        f_globals: dict[str, Any] = {"g": 0}
        gs = tw.GuardSet(case.specs, f_globals)
        stats["sets"] += 1
        stats["relations"] += len(case.texts)
        stats["merged_or_implied"] += sum(
            1 for _id, status, _by, _n in gs._shape_info["relations"] if status != "kept"
        )
        for _ in range(inputs_per_set):
            f_locals, g = frame(r)
            f_globals.clear()
            f_globals.update(g)
            want_first = reference.first_failure(case.specs, f_locals, f_globals)
            want = want_first is None
            got = gs.check(f_locals)
            detail = f"relations {case.texts} on {f_locals} / {g}"
            assert got == want, f"check: engine {got}, reference {want}: {detail}"
            failure = gs.why_not(f_locals)
            got_index = None if failure is None else failure.guard.index
            want_index = None if want_first is None else want_first[0].index
            assert got_index == want_index, f"why_not: engine #{got_index}, reference #{want_index}: {detail}"
            stats["pairs"] += 1
            stats["passed" if want else "failed"] += 1
    return stats


def run_relations(n: int, seed: int) -> dict[str, int]:
    """One relation at a time through _core.evaluate_relation (the fast path checked against the
    exact one inside) against the reference evaluator."""
    r = random.Random(seed)
    stats = {"relations": 0, "fast": 0, "exact": 0}
    while stats["relations"] < n:
        rel = tw.shapes.parse(relation(r))
        types = [_symbol_type(s) for s in rel.symbols]
        values = [int_value(r) if t == "int" else float_value(r) for t in types]
        holds, _error, path = _core.evaluate_relation(
            rel.text, [0 if t == "int" else 1 for t in types], values
        )
        want = reference.shape_holds(
            rel.text, rel.symbols, types, {str(s): v for s, v in zip(rel.symbols, values)}
        )
        assert holds == want, f"{rel.text} with {values}: engine {holds}, reference {want}"
        stats["relations"] += 1
        stats[path] += 1
    return stats


def run_builder(n: int, seed: int) -> dict[str, int]:
    """GuardBuilder.shape (each symbol read once from the example, the relation evaluated as a
    check evaluates it) against the reference, on generated relations and frames (values of the
    wrong type, missing locals and size indices past the rank included): the spec's symbol types
    when the relation holds, else the error that says why, and the index given back on refusal."""
    r = random.Random(seed)
    stats = {"relations": 0, "held": 0, "refused": 0, "unreadable": 0, "wrong_type": 0, "type_errors": 0}
    while stats["relations"] < n:
        rel = tw.shapes.parse(relation(r))
        f_locals, g = frame(r)
        b = tw.GuardBuilder(f_locals, g)
        got: Any
        try:
            got = ("spec", b.shape(rel).args[2])
        except tw.ShapeSyntaxError as e:
            got = ("syntax", e.offset, e.message)
        except tw.GuardBuildError as e:
            got = ("refused", str(e))
        detail = f"{rel.text} on {f_locals} / {g}: got {got}"
        stats["relations"] += 1
        if got[0] != "spec":
            assert b._next_index == 0, f"a refusal keeps its index: {detail}"
        values = []
        unreadable = False
        for src in rel.symbols:
            try:
                values.append(b.value(src))
            except tw.GuardBuildError:
                unreadable = True
                break
        if unreadable:
            assert got[0] == "refused", f"unreadable: {detail}"
            stats["unreadable"] += 1
            continue
        if any(type(v) not in (int, float) for v in values):
            assert got[0] == "refused" and "a symbol is an int or a float" in got[1], detail
            stats["wrong_type"] += 1
            continue
        codes = [0 if type(v) is int else 1 for v in values]
        try:
            holds, _error, _path = _core.evaluate_relation(rel.text, codes, values)
        except tw.ShapeSyntaxError as e:
            want = ("syntax", rel.original_offset(e.offset), e.message)
            assert got == want, f"type error: want {want}: {detail}"
            stats["type_errors"] += 1
            continue
        types = ["int" if c == 0 else "float" for c in codes]
        ref = reference.shape_holds(
            rel.text, rel.symbols, types, {str(s): v for s, v in zip(rel.symbols, values)}
        )
        assert holds == ref, f"evaluate_relation {holds}, reference {ref}: {detail}"
        if ref:
            assert got == ("spec", tuple(types)), detail
            stats["held"] += 1
        else:
            assert got[0] == "refused" and "does not hold on the example" in got[1], detail
            stats["refused"] += 1
    return stats


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=100_000)
    p.add_argument("--relations", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    stats = run_pairs(args.pairs, args.seed)
    t1 = time.perf_counter()
    print(f"pairs: {stats} in {t1 - t0:.1f} s: zero mismatches")
    rstats = run_relations(args.relations, args.seed)
    t2 = time.perf_counter()
    print(f"single relations: {rstats} in {t2 - t1:.1f} s: zero mismatches")
    bstats = run_builder(args.relations, args.seed)
    print(f"builder checks: {bstats} in {time.perf_counter() - t2:.1f} s: zero mismatches")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
