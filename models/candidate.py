"""A configuration `tandem tune` measures and a pairing record keeps: which drafter, on which
draft file variant, under which policy (bench/tuning/candidates.py lists the ones worth measuring;
models/tuned.py's `Choice` holds the one chosen with what it measured)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One configuration: which drafter, on which draft file variant, under which policy."""
    drafter: str
    draft_quant: str = "off"
    draft_vocab: str = "full"
    early_exit_layers: int | None = None
    policy: str = "adaptive"
    gamma: int = 8

    @property
    def name(self) -> str:
        """A unique, readable label; also the drafter's name while it is measured."""
        parts = [self.drafter]
        if self.draft_quant != "off":
            parts.append(self.draft_quant)
        if self.draft_vocab != "full":
            parts.append(f"vocab-{self.draft_vocab}")
        if self.early_exit_layers is not None:
            parts.append(str(self.early_exit_layers))
        return "-".join(parts)

    @property
    def reads_history(self) -> bool:
        """Measured drafting from a history of the run's earlier prompts and answers."""
        return self.drafter == "suffix"

    @property
    def needs_draft(self) -> bool:
        return self.drafter in ("draft", "hybrid")
