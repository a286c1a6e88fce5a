"""Whether a draft model can speculate for a target: tokenizer agreement read from both headers.

The hard rules mirror llama.cpp's common_speculative_are_compatible (common/speculative.cpp):
same vocabulary type; the same add-BOS and add-EOS flags, and the same BOS (EOS) id where the
add-BOS (add-EOS) flag is set; vocabulary sizes within 128 tokens; identical token texts from id 5
up to the smaller vocabulary. A flag or id absent from the header takes llama.cpp's default for the
tokenizer type (src/llama-vocab.cpp), as the loaded model would. Softer differences (pre-tokenizer,
BOS/EOS ids that no one adds, EOT id, special-token set, chat template) only earn a warning: the
draft is fed the target's token ids, so they cost acceptance rate, never exactness.
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


# llama.cpp's defaults per tokenizer type when the header leaves a key out (llama-vocab.cpp,
# llama_vocab::impl::load): add-BOS for SPM ("llama") and WPM ("bert"), add-EOS for UGM ("t5");
# BPE ("gpt2") adds BOS only for the pre-tokenizers listed below.
_ADD_BOS_DEFAULT = {"llama": True, "bert": True}
_ADD_EOS_DEFAULT = {"t5": True}
_BPE_PRE_ADDING_BOS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                       "midm-2.0", "lfm2", "tekken", "chameleon"}
# Default (BOS, EOS) ids per tokenizer type; None is LLAMA_TOKEN_NULL.
_SPECIAL_DEFAULT: dict[str, tuple[int | None, int | None]] = {
    "llama": (1, 2), "bert": (101, None), "gpt2": (11, 11), "t5": (None, 1), "rwkv": (None, None),
    "plamo2": (1, 2)}


@dataclass(frozen=True)
class SpecialTokens:
    """BOS/EOS ids and whether the tokenizer adds them, as llama.cpp resolves them at load."""
    add_bos: bool
    add_eos: bool
    bos: int | None
    eos: int | None


def special_tokens(info: GGUFInfo) -> SpecialTokens:
    """The header's BOS/EOS ids and add flags, with llama.cpp's defaults where a key is absent
    (and where an id lies outside the vocabulary, which llama.cpp ignores with a warning)."""
    model = info.tokenizer_model
    add_bos = info.add_bos if info.add_bos is not None else (
        _ADD_BOS_DEFAULT.get(model, False)
        or (model == "gpt2" and info.tokenizer_pre in _BPE_PRE_ADDING_BOS))
    add_eos = info.add_eos if info.add_eos is not None else _ADD_EOS_DEFAULT.get(model, False)
    bos, eos = _SPECIAL_DEFAULT.get(model, (None, None))
    if model == "gpt2" and info.tokenizer_pre in ("glm4", "chatglm-bpe"):
        bos = None
    if info.bos_id is not None and 0 <= info.bos_id < info.n_vocab:
        bos = info.bos_id
    if info.eos_id is not None and 0 <= info.eos_id < info.n_vocab:
        eos = info.eos_id
    return SpecialTokens(bool(add_bos), bool(add_eos), bos, eos)


def _special_differences(target: GGUFInfo, draft: GGUFInfo) -> tuple[list[str], list[str]]:
    """(hard, soft) differences of BOS and EOS: llama.cpp compares an id only where its add
    flag is set; an id no one adds only costs acceptance (the draft may end a draft early)."""
    t, d = special_tokens(target), special_tokens(draft)
    hard: list[str] = []
    soft: list[str] = []
    for label, t_add, d_add, t_id, d_id in (("BOS", t.add_bos, d.add_bos, t.bos, d.bos),
                                            ("EOS", t.add_eos, d.add_eos, t.eos, d.eos)):
        if t_add != d_add:
            hard.append(f"add-{label} flag differs (target {t_add}, draft {d_add})")
        elif t_id != d_id and t_add:
            hard.append(f"{label} differs (target {t_id}, draft {d_id}) and both add it")
        elif t_id != d_id:
            soft.append(f"{label} ids differ (target {t_id}, draft {d_id}); neither adds {label},"
                        " so llama.cpp does not compare them")
    return hard, soft


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

    special_hard, special_soft = _special_differences(target, draft)
    hard += special_hard
    soft += special_soft
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
    return require(check_pair(target_path, draft_path))


def require(report: CompatReport) -> CompatReport:
    """`report`, or IncompatiblePairError with its one-sentence summary when incompatible (the
    loading step compares headers it has already read: `require(compare(target, draft))`)."""
    if report.verdict == INCOMPATIBLE:
        raise IncompatiblePairError(report.summary)
    return report
