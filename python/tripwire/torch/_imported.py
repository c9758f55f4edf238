"""What ``guards_of`` imported: the per-guard record, torch's laxness it inherits, and the set.

``ImportedGuardSet`` is a :class:`tripwire.GuardSet` (``check`` is the same C++ method) that
also carries a :class:`TorchImport`: one :class:`TorchGuard` per guard torch installed (what it
became in tripwire, or why not), the guards the importer added, and the places where torch is
lax (:class:`Exemption`). ``explain()`` prints them after the guard tree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from ..catalogue import GuardSpec
from ..guard_set import GuardSet

__all__ = ["OUTCOMES", "Exemption", "ImportedGuardSet", "TorchGuard", "TorchImport"]

# native      mapped onto tripwire's own kinds, deciding exactly as torch (see docs/torch.md)
# torch       a tripwire LAMBDA that calls torch's own leaf guard object: exact, slow, not portable
# pending     needs the tensor/framework-state engine (GuardBuilder.tensor_match, alias, ...)
# unsupported no exact tripwire form (and fallback="refuse", or an accessor tripwire cannot follow)
# dropped     named in ``drop=`` by the caller (``why`` keeps what it would have been)
# unreachable torch never evaluates it (an empty DictGuardManager returns before its children)
OUTCOMES = ("native", "torch", "pending", "unsupported", "dropped", "unreachable")


@dataclass(frozen=True)
class TorchGuard:
    """One guard torch installed on the imported cache entry.

    ``kind`` is torch's name for it (the leaf guard class, ``DictGuardManager`` for a dict
    manager's implicit type and length check, ``OBJECT_ALIASING`` / ``AUTOGRAD_SAVED_TENSORS_HOOKS``
    for those root lambdas); ``source`` torch's printed source of the value it checks (``"L"`` for
    the frame); ``code`` what torch printed; ``outcome`` one of :data:`OUTCOMES`; ``guards`` the
    indices (``GuardSpec.index``) of the tripwire guards that implement it; ``why`` the reason
    for anything but a plain native mapping (and, for native ones, where tripwire is stricter);
    ``via`` the accessor kind that blocked it, if any; ``details`` parsed parameters of a pending
    kind, for the tensor-engine integration.
    """

    kind: str
    source: str
    code: str
    outcome: str
    guards: tuple[int, ...] = ()
    why: str = ""
    via: str = ""
    site: str | None = None
    details: Mapping[str, Any] | None = None

    def line(self) -> str:
        """One line: ``[outcome] KIND on SOURCE: code -- why``."""
        text = f"[{self.outcome}] {self.kind} on {self.source}: {self.code}"
        return text + (f" -- {self.why}" if self.why else "")


@dataclass(frozen=True)
class Exemption:
    """A place where torch's guards are lax by design (a config default), inherited by the
    imported set because it decides exactly as torch does."""

    kind: str
    text: str
    sources: tuple[str, ...] = ()


@dataclass
class TorchImport:
    """The record of one ``guards_of`` import."""

    code_name: str
    entry: int
    entries: int
    guards: list[TorchGuard] = field(default_factory=list)
    added: list[tuple[int, str]] = field(default_factory=list)  # (GuardSpec.index, why)
    stricter: list[tuple[str, str]] = field(default_factory=list)  # (torch source, how)
    exemptions: list[Exemption] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def by_outcome(self, outcome: str) -> list[TorchGuard]:
        return [g for g in self.guards if g.outcome == outcome]

    @property
    def dropped(self) -> list[TorchGuard]:
        return self.by_outcome("dropped")

    def coverage(self) -> dict[str, dict[str, int]]:
        """Per torch kind: how many torch installed (``total``) and how many ended in each
        outcome."""
        out: dict[str, dict[str, int]] = {}
        for g in self.guards:
            row = out.setdefault(g.kind, dict.fromkeys(("total", *OUTCOMES), 0))
            row["total"] += 1
            row[g.outcome] += 1
        return dict(sorted(out.items()))

    def summary(self) -> str:
        c = Counter(g.outcome for g in self.guards)
        parts = [f"{c[o]} {o}" for o in OUTCOMES if c[o]]
        return (
            f"torch entry {self.entry} of {self.entries} for {self.code_name}: {len(self.guards)} "
            f"torch guards ({', '.join(parts) or 'none'}); {len(self.added)} guards added by the importer"
        )

    def report(self) -> str:
        """The coverage table and every guard that is not a plain native mapping."""
        lines = [self.summary(), "coverage (torch kind: total = native + torch + dropped + unreachable):"]
        for kind, row in self.coverage().items():
            extra = "".join(f" + {row[o]} {o}" for o in OUTCOMES[1:] if row[o])
            lines.append(f"  {kind}: {row['total']} = {row['native']} native{extra}")
        groups = (
            ("evaluated by calling torch's own guard (exact, slow)", "torch"),
            ("never evaluated by torch (not imported)", "unreachable"),
        )
        for title, outcome in groups:
            items = self.by_outcome(outcome)
            if items:
                lines.append(f"{title}: {len(items)}")
                lines += [f"  {g.line()}" for g in items]
        dropped = Counter((g.kind, g.via, g.why.split(":", 1)[0]) for g in self.dropped)
        if dropped:
            lines.append(f"dropped (named in drop=; torch_import.dropped lists each): {len(self.dropped)}")
            for (kind, via, was), n in sorted(dropped.items()):
                lines.append(f"  {n} x {kind}" + (f" via {via}" if via else "") + f" ({was})")
        stricter = [g for g in self.guards if g.outcome == "native" and g.why]
        if stricter or self.added or self.stricter:
            lines.append(
                "where tripwire is stricter than torch (never laxer), or exact under a stated condition:"
            )
            lines += [f"  {g.line()}" for g in stricter]
            lines += [f"  under {src}: {why}" for src, why in self.stricter]
            lines += [f"  added guard #{i}: {why}" for i, why in self.added]
        if self.exemptions:
            lines.append("torch's laxness, inherited (the set decides as torch does):")
            for e in self.exemptions:
                more = f" ({len(e.sources)} sources, e.g. {e.sources[0]})" if e.sources else ""
                lines.append(f"  {e.kind}: {e.text}{more}")
        return "\n".join(lines)


class ImportedGuardSet(GuardSet):
    """A GuardSet imported from a torch cache entry by :func:`tripwire.torch.guards_of`.

    ``check(f_locals)`` takes the locals torch's ``guard_manager.check`` takes (for a module,
    ``{"self": model, ...}``; closure variables by name). ``torch_import`` is the record.
    """

    torch_import: TorchImport
    f_globals: dict | None
    _keep_alive: Any

    def __new__(
        cls,
        specs: list[GuardSpec],
        f_globals: dict | None,
        record: TorchImport,
        *,
        keep_alive: Any = None,
        strict: bool = False,
    ) -> ImportedGuardSet:
        # GuardSet.__new__ builds the engine's set, or raises leaving no instance behind (an
        # unbuildable set, e.g. STORAGE_OVERLAPPING without the torch adapter); GuardSet's
        # __init__, which Python calls next with these arguments, does nothing.
        self = cast("ImportedGuardSet", super().__new__(cls, specs, f_globals, None, strict=strict))
        self.torch_import = record
        self.f_globals = f_globals  # what G[...] sources read (the frame's globals)
        # Guards evaluated by torch's own leaf objects call into torch's tree: keep it alive.
        self._keep_alive = keep_alive
        return self

    def __repr__(self) -> str:
        state = " INVALID" if self.invalid else ""
        return (
            f"<tripwire.torch.ImportedGuardSet {len(self)} guards on {self.node_count} sources "
            f"from {self.torch_import.code_name}{state}>"
        )

    def _drop_aliases(self) -> dict[int, frozenset[str]]:
        # Each tripwire guard also answers to the kind of every torch guard it implements.
        out: dict[int, set[str]] = {}
        for g in self.torch_import.guards:
            for i in g.guards:
                out.setdefault(i, set()).add(g.kind)
        return {i: frozenset(kinds) for i, kinds in out.items()}

    def explain(self) -> str:
        return super().explain() + "\n" + self.torch_import.report()
