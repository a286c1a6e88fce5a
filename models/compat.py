"""Whether a draft model can speculate for a target: tokenizer agreement read from both headers.

The hard rules mirror llama.cpp's common_speculative_are_compatible (common/speculative.cpp):
same vocabulary type, same BOS/EOS ids and add-BOS/add-EOS flags, vocabulary sizes within 128
tokens, and identical token texts from id 5 up to the smaller vocabulary. Softer differences
(pre-tokenizer, EOT id, special-token set, chat template) only earn a warning: the draft is fed
the target's token ids, so they cost acceptance rate, never exactness.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import IncompatiblePairError
from models.gguf_info import GGUFInfo, read_info

VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5

COMPATIBLE = "compatible"
WARNING = "warning"
INCOMPATIBLE = "incompatible"


@dataclass
class CompatReport:
    target: Path
    draft: Path
    verdict: str
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.verdict != INCOMPATIBLE

    @property
    def summary(self) -> str:
        pair = f"draft {self.draft.name} and target {self.target.name}"
        if self.verdict == INCOMPATIBLE:
            return f"{pair} are incompatible: {self.reasons[0]}"
        if self.verdict == WARNING:
            return f"{pair} are compatible, with a warning: {self.warnings[0]}"
        return f"{pair} are compatible: same tokenizer, vocabulary and special tokens"

    def lines(self) -> list[str]:
        return [f"incompatible: {r}" for r in self.reasons] + [f"warning: {w}" for w in self.warnings]


def first_differing_token(target: GGUFInfo, draft: GGUFInfo, start: int = 0) -> int | None:
    n = min(len(target.tokens), len(draft.tokens))
    for i in range(start, n):
        if target.tokens[i] != draft.tokens[i]:
            return i
    return None


def _add_bos(info: GGUFInfo) -> bool:
    # When the key is absent llama.cpp falls back to its per-tokenizer default: SPM and WPM add BOS.
    return info.add_bos if info.add_bos is not None else info.tokenizer_model in ("llama", "bert")


def compare(target: GGUFInfo, draft: GGUFInfo) -> CompatReport:
    """Compare two parsed headers; see the module docstring for which differences are fatal."""
    hard: list[str] = []
    soft: list[str] = []

    if target.tokenizer_model != draft.tokenizer_model:
        hard.append(f"tokenizer types differ (target {target.tokenizer_model!r}, draft {draft.tokenizer_model!r})")
    elif target.tokenizer_pre != draft.tokenizer_pre:
        soft.append(f"pre-tokenizers differ (target {target.tokenizer_pre!r}, draft {draft.tokenizer_pre!r})")

    diff = abs(target.n_vocab - draft.n_vocab)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        hard.append(f"vocabulary sizes differ by {diff} tokens (target {target.n_vocab}, draft {draft.n_vocab});"
                    f" llama.cpp tolerates at most {VOCAB_MAX_SIZE_DIFFERENCE}")
    elif diff:
        soft.append(f"vocabulary sizes differ by {diff} tokens (target {target.n_vocab}, draft {draft.n_vocab}),"
                    f" within llama.cpp's tolerance of {VOCAB_MAX_SIZE_DIFFERENCE}")

    if target.tokens_sha256 != draft.tokens_sha256 and diff <= VOCAB_MAX_SIZE_DIFFERENCE:
        first = first_differing_token(target, draft, VOCAB_CHECK_START_TOKEN_ID)
        if first is not None:
            hard.append(f"token texts differ from id {first} (target {target.tokens[first]!r},"
                        f" draft {draft.tokens[first]!r})")
        else:
            early = first_differing_token(target, draft)
            if early is not None:
                soft.append(f"token texts differ at id {early}, below the ids llama.cpp checks")

    for label, t, d in (("BOS", target.bos_id, draft.bos_id), ("EOS", target.eos_id, draft.eos_id),
                        ("add-BOS flag", _add_bos(target), _add_bos(draft)),
                        ("add-EOS flag", bool(target.add_eos), bool(draft.add_eos))):
        if t != d:
            hard.append(f"{label} differs (target {t}, draft {d})")
    if target.eot_id != draft.eot_id:
        soft.append(f"EOT id differs (target {target.eot_id}, draft {draft.eot_id})")
    if target.control_tokens != draft.control_tokens and not hard:
        only_t = sorted(target.control_tokens - draft.control_tokens)[:3]
        only_d = sorted(draft.control_tokens - target.control_tokens)[:3]
        soft.append(f"special-token sets differ (target-only ids {only_t}, draft-only ids {only_d})")
    if (target.chat_template or "") != (draft.chat_template or ""):
        soft.append("chat templates differ; the target's template is the one used")

    verdict = INCOMPATIBLE if hard else WARNING if soft else COMPATIBLE
    return CompatReport(target.path, draft.path, verdict, hard, soft)


def check_pair(target_path: str | Path, draft_path: str | Path) -> CompatReport:
    """Read both headers and compare them; ModelFileError when either file is unusable."""
    return compare(read_info(target_path), read_info(draft_path))


def require_compatible(target_path: str | Path, draft_path: str | Path) -> CompatReport:
    """check_pair, raising IncompatiblePairError with the one-sentence summary when incompatible."""
    report = check_pair(target_path, draft_path)
    if report.verdict == INCOMPATIBLE:
        raise IncompatiblePairError(report.summary)
    return report
