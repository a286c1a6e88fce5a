"""The tuning loop's models: a loaded pair (the target, the draft as given) to which each
candidate's draft variant is added while it is measured and removed after, so only one
variant's extra model is in memory at a time."""
from __future__ import annotations

from dataclasses import replace

from engine.llama import backend as llama
from engine.backend import ModelConfig
from bench.benchmark.runner import HISTORY_CAP, cold_start
from bench.benchmark.suite import SuitePrompt
from engine.drafters.base import PLAIN
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.history_index import HistoryIndex
from engine.events import DoneEvent
from engine.generation_config import GenerationConfig
from engine.pair import Pair
from engine.sampling import SamplingParams
from engine.stats import GenerationStats
from models.candidate import Candidate
from bench.tuning.measure import TuneHost
from loading.derived.early_exit import default_layers
from loading.derived.embeddings import load_trimmed
from loading.derived.quantized import derive_quantized
from loading.derived.vocab_trim import derive_trimmed
from loading.load import Loader, add_early_exit
from loading.plan import LoadPlan, place_early_exit, place_later
from models.gguf_info import GGUFInfo, read_info

# A short unmeasured generation per candidate first: page faults and first-call costs.
WARMUP_TEXT = "Say hello."
WARMUP_TOKENS = 8


class PairHost(TuneHost):
    def __init__(self, pair: Pair, target: ModelConfig, draft: ModelConfig | None,
                 max_tokens: int, stop: tuple[str, ...] = (), loader: Loader | None = None,
                 plan: LoadPlan | None = None) -> None:
        self.pair = pair
        # The pair's load plan: each variant's GPU layers are planned in the room it left.
        self.plan = plan
        self.target = target
        self.draft = draft
        self.max_tokens = max_tokens
        self.stop = stop
        self.loader = loader or llama.load
        self._names: dict[Candidate, str] = {}
        # A history per candidate that reads one: the first run of every prompt so far.
        self._histories: dict[Candidate, HistoryIndex] = {}
        self._seen: dict[Candidate, set[str]] = {}

    def _variant(self, c: Candidate) -> bool:
        """Whether the candidate needs a draft file other than the one the pair loaded."""
        return c.drafter == "draft" and (c.draft_quant != "off" or c.draft_vocab != "full")

    def open(self, c: Candidate) -> None:
        if c.drafter == "early-exit":
            layers, gpu = c.early_exit_layers, None
            if self.plan is not None:
                # Planned, like the variants, in the room the pair left.
                layers = layers or default_layers(self.plan.target_info.n_layer)
                gpu = place_early_exit(self.plan, layers)
            add_early_exit(self.pair, self.target, layers, self.loader, gpu_layers=gpu)
            self._names[c] = "early-exit"
        elif self._variant(c):
            self._names[c] = c.name
            self._add_variant(c)
        else:
            self.pair.drafter(c.drafter)  # a clear error when the pair lacks it
            self._names[c] = c.drafter
        self._generate(c, SuitePrompt("warm-up", "", WARMUP_TEXT), SamplingParams(),
                       WARMUP_TOKENS)

    def _add_variant(self, c: Candidate) -> None:
        assert self.draft is not None
        cfg = self.draft
        if c.draft_quant != "off":
            cfg = replace(cfg, path=str(derive_quantized(cfg.path, c.draft_quant)))
        source = read_info(cfg.path)
        if c.draft_vocab == "trim":
            trimmed = replace(cfg, path=str(derive_trimmed(cfg.path, info=source)))
            trimmed = self._placed(trimmed, c)
            inner = self.loader(trimmed)
            try:
                backend = load_trimmed(source, trimmed.path, inner)
            except Exception:
                inner.close()
                raise
        else:
            backend = self.loader(self._placed(cfg, c, source))
        # The pair owns the variant's model and closes it when the drafter is removed.
        self.pair.add_drafter(c.name, DraftModelDrafter(backend, p_min=self.pair.p_min,
                                                        chain_min=self.pair.chain_min),
                              backend=backend)

    def _placed(self, cfg: ModelConfig, c: Candidate, info: GGUFInfo | None = None) -> ModelConfig:
        """The variant's config with its GPU layers planned from its own file's header, beside
        the loaded pair (as given where there is no plan)."""
        if self.plan is None:
            return cfg
        return replace(cfg, n_gpu_layers=place_later(self.plan, c.name,
                                                     info or read_info(cfg.path)))

    def run(self, c: Candidate | None, prompt: SuitePrompt,
            params: SamplingParams) -> GenerationStats:
        return self._generate(c, prompt, params, self.max_tokens)

    def _generate(self, c: Candidate | None, prompt: SuitePrompt, params: SamplingParams,
                  max_tokens: int) -> GenerationStats:
        name = self._names[c] if c is not None else PLAIN
        policy = None
        if c is not None:
            # Calibration (cached per drafter) touches the caches: before the cold start.
            self.pair.calibration(name, c.gamma)
            policy = self.pair.make_policy(c.policy, name, c.gamma)
        cold_start(self.pair)
        gen = GenerationConfig(params=params, gamma=c.gamma if c is not None else 0,
                               max_tokens=max_tokens, stop=self.stop)
        history = self._history(c, prompt)
        done = None
        for ev in self.pair.generate(prompt.prompt, gen, drafter=name, policy=policy,
                                     history=history):
            if isinstance(ev, DoneEvent):
                done = ev
        assert done is not None
        return done.stats

    def _history(self, c: Candidate | None, prompt: SuitePrompt) -> HistoryIndex | None:
        """The history candidate `c` drafts from for `prompt`: the earlier prompts' first runs,
        never this prompt's own earlier run (a repeat is not a regeneration)."""
        if c is None or not c.reads_history:
            return None
        kept = self._histories.setdefault(c, HistoryIndex())
        history = HistoryIndex.restore(kept.state(), HISTORY_CAP)
        seen = self._seen.setdefault(c, set())
        if prompt.id not in seen:
            seen.add(prompt.id)
            self._histories[c] = history
        return history

    def close(self, c: Candidate) -> None:
        name = self._names.pop(c, None)
        # Variants and early exit hold a model of their own: the pair closes it.
        if name is not None and (self._variant(c) or c.drafter == "early-exit"):
            self.pair.remove_drafter(name)
