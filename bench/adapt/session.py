"""One `tandem adapt` run from the pair's configs to the verdict: the one code path that the
command line (app/adapt_cli.py) and the Models tab's action (app/ui/adapt_action.py) both run,
each with its own way of showing progress.

In order: the memory plan (refused with one line before anything loads), the user's prompts
through the target's chat template (a request too long for the teacher's context skipped with a
note; too few left to hold out MIN_YOURS refused), the target's teacher answers and the held-out
ones (cached in the store), the base draft's acceptance on them (declined above the app's
threshold unless forced, before the held-out suite is answered), training into the store, the proof on held-out prompts with the files
as served and the pairing record's verdict (bench/adapt/build.py). With a LoRA adapter on the
target, the teacher is the target with its adapter (the draft is adapted toward the adapted
target, and measured against it), and the adapted draft and its record are keyed by the adapter
too.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from bench.adapt import data, run, train
from bench.adapt.build import Result, Serve, adapt, declined
from bench.adapt.data import Example
from bench.adapt.settings import Settings
from bench.benchmark.suite import load_suite
from engine.backend import Backend, ModelConfig
from engine.errors import SettingsError
from loading.derived.files import derived_dir
from models.candidate import Candidate
from models.gguf_info import read_info
from models.tuned import PairKey


class Progress(Protocol):
    """How a front end shows a run: a line, a counted stage with its ETA, a training step."""

    def line(self, text: str) -> None: ...

    def stage(self, what: str) -> Callable[[int, int], None]: ...

    def step(self, s: train.Step) -> None: ...


# The teacher's context: a prompt with its answer must fit (longer ones are skipped).
TEACHER_CTX = 2048

# The user's prompts as (category, tokens), given a function that puts a request through the
# target's chat template (engine/pair.py `tokens_for`).
Prompts = Callable[[Callable[[str], list[int]]], list[tuple[str, list[int]]]]


def assistant_header(tokens_for: Callable[[str], list[int]]) -> list[int]:
    """The chat template's tokens after a request: what two requests' token lists end with."""
    a, b = tokens_for("alpha"), tokens_for("omega beta")
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n:]


def history_prompts(tcfg: ModelConfig) -> Prompts:
    """The requests in the user's history of this target, each up to the assistant header."""
    def prompts(tokens_for: Callable[[str], list[int]]) -> list[tuple[str, list[int]]]:
        from loading.history import LOCAL, HistoryStore
        from models.gguf_info import read_info
        state = HistoryStore.for_model(read_info(tcfg.path), 1 << 30).index(LOCAL).state()
        tokens, starts = state["tokens"], list(state["starts"]) + [len(state["tokens"])]
        docs = [tokens[s:e - 1].tolist() for s, e in zip(starts, starts[1:])]
        found = data.history_prompts(docs, assistant_header(tokens_for))
        return [("history", t) for t in found]
    return prompts


def text_prompts(prompts: Sequence[tuple[str, str]]) -> Prompts:
    """Requests given as (category, text), as a prompts file holds them."""
    return lambda tokens_for: [(cat, tokens_for(text)) for cat, text in prompts]


def teacher_id(key: PairKey) -> str:
    """What the teacher is: the target's hash, and its adapters' (with their scales) if any, so
    an adapter's answers are never taken for the bare target's."""
    return key.target_sha256 + (f"+{key.adapter_sha256}" if key.adapter_sha256 else "")


def fitting(prompts: Sequence[tuple[str, list[int]]], limit: int,
            note: Callable[[str], None]) -> list[tuple[str, list[int]]]:
    """The prompts of at most `limit` tokens (what the teacher's context holds beside an
    answer); the others skipped with one note saying how many and how long."""
    kept = [(c, t) for c, t in prompts if len(t) <= limit]
    if len(kept) < len(prompts):
        longest = max(len(t) for _, t in prompts)
        note(f"skipped {len(prompts) - len(kept)} of {len(prompts)} requests longer than "
             f"{limit} tokens (the longest {longest}): the teacher's context of {TEACHER_CTX} "
             "holds no answer beside them")
    return kept


def enough(held: Sequence[tuple[str, list[int]]], given: int) -> None:
    """A SettingsError unless the held-out prompts of yours are enough for the gate."""
    if len(held) < run.MIN_YOURS:
        raise SettingsError(f"{given} requests give {len(held)} held-out ones; the proof needs "
                            f"{run.MIN_YOURS} (every {run.HOLD_OUT_EVERY}th of at least "
                            f"{run.MIN_YOURS * run.HOLD_OUT_EVERY}): use the app more, or give "
                            "a prompts file")


def teacher(tcfg: ModelConfig, prompts: Prompts, settings: Settings, threads: int,
            key: PairKey, progress: Progress) -> tuple[list[Example], list[Example]]:
    """(trained examples, your held-out examples): the answers of the target with its
    adapters, cached in the store by the prompts, the teacher (`teacher_id`) and the length.
    Each trained prompt is answered once (greedy or T 0.7 in turn), each held-out one at both."""
    from engine.llama.backend import quiet_backend
    from engine.pair import Pair
    target_sha = teacher_id(key)
    with quiet_backend(ModelConfig(path=tcfg.path, n_ctx=TEACHER_CTX, n_threads=threads,
                                   lora=tcfg.lora)) as tb:
        pair = Pair(tb)
        given = prompts(pair.tokens_for)
        mine = fitting(given, TEACHER_CTX - max(settings.max_tokens, run.HELD_OUT_TOKENS),
                       progress.line)
        to_train, to_hold = run.split_prompts(mine)
        enough(to_hold, len(mine))
        n = settings.max_tokens
        trained = data.cached(
            data.prompts_sha256(to_train, target_sha, run.SEED, n, "once"), derived_dir(),
            lambda: data.teach_once(tb, to_train, n, run.SEED,
                                    progress.stage("teacher answers")))
        yours = data.cached(
            data.prompts_sha256(to_hold, target_sha, run.SEED, n), derived_dir(),
            lambda: data.teach(tb, to_hold, n, run.SEED, progress.stage("held-out answers")))
    return trained, yours


def suite_answers(tcfg: ModelConfig, settings: Settings, threads: int, key: PairKey,
                  progress: Progress) -> list[Example]:
    """The held-out suite's answers by the target with its adapters (`held_suite`)."""
    from engine.llama.backend import quiet_backend
    from engine.pair import Pair
    with quiet_backend(ModelConfig(path=tcfg.path, n_ctx=TEACHER_CTX, n_threads=threads,
                                   lora=tcfg.lora)) as tb:
        return held_suite(tb, Pair(tb).tokens_for, settings, teacher_id(key),
                          progress.stage("held-out suite answers"))


def held_suite(tb: Backend, tokens_for: Callable[[str], list[int]], settings: Settings,
               target_sha: str, progress: Callable[[int, int], None] = lambda i, n: None
               ) -> list[Example]:
    """The held-out suite's prompts (`settings.holdout`, so many a category) answered by the
    teacher `tb`, whose `teacher_id` is `target_sha`; cached in the store by the prompts, the
    teacher and the length."""
    suite = load_suite(settings.holdout).select(None, settings.holdout_per_category)
    others = [(p.category, tokens_for(p.prompt)) for p in suite.prompts]
    return data.cached(data.prompts_sha256(others, target_sha, run.SEED, run.HELD_OUT_TOKENS),
                       derived_dir(), lambda: data.teach(tb, others, run.HELD_OUT_TOKENS,
                                                         run.SEED, progress))


def adapt_pair(tcfg: ModelConfig, dcfg: ModelConfig, key: PairKey, prompts: Prompts,
               settings: Settings, threads: int, progress: Progress,
               default: Candidate, serve: Serve) -> Result:
    """The whole run for the pair `tcfg` (with its adapters) and `dcfg`, whose pairing record's
    key is `key` (app/runtime/tuned.py `key_for`); the adapted draft's path, whether it won, and
    the lines to show (the proof's table and the reason line). A new record takes the `default`
    configuration; `serve` names the file a load of a draft reads (bench/adapt/build.py)."""
    if dcfg.lora:
        raise SettingsError("tandem adapt trains the draft file itself; drop the draft's LoRA "
                            "adapter (--draft-lora)")
    dinfo = read_info(dcfg.path)
    need = train.check_fits(dinfo, settings.train, settings.context, train.available_memory())
    progress.line(f"memory plan: {need.total / train.GIB:.1f} GiB (trained tensors "
                  f"{need.trained_bytes / train.GIB:.1f}, the rest of the draft "
                  f"{need.frozen_bytes / train.GIB:.1f}, activations and cache "
                  f"{(need.activation_bytes + need.kv_bytes) / train.GIB:.1f})")
    trained, yours = teacher(tcfg, prompts, settings, threads, key, progress)
    if settings.decline_above is not None:
        line = declined(tcfg, dcfg, key, default, serve, [*trained, *yours],
                        settings.decline_above, threads)
        if line is not None:
            return Result(None, False, [line])
    held = yours + suite_answers(tcfg, settings, threads, key, progress)
    return adapt(tcfg, dcfg, dinfo, key, trained, held, settings, threads, progress.step,
                 default, serve)
