"""`tandem adapt` without real models (issue 45): the trainer's copies of a draft, the teacher
data's packing and split, the proof's acceptance arithmetic and verdict, the memory plan's
refusal, Ctrl-C during training, the pairing record's staleness rules for the adapted draft, and
the exactness check with an adapted (fake) draft."""
from __future__ import annotations

import stat
from pathlib import Path

import gguf
import numpy as np
import pytest

from bench.adapt import data, proof, run, train
from bench.adapt.data import Example
from bench.fakes.backend import FakeBackend
from engine.errors import SettingsError
from engine.llama import training
from loading.derived.adapted import derive_adapted
from loading.derived.files import derived_dir
from loading.derived.trainable import trains, write_adapted, write_trainable
from models.candidate import Candidate
from models.gguf_file import GGUFFile
from models.gguf_info import read_info
from models.tuned import AdaptedDraft, Choice, PairingRecord, PairKey, adapted_draft, save
from tests import tinygguf

N_VOCAB, N_EMBD = 64, 32


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.setenv("TANDEM_PAIRS", str(tmp_path / "pairs"))
    return tmp_path


def _draft(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    return tinygguf.write(path, tokens=tinygguf.vocab(N_VOCAB), n_embd=N_EMBD,
                          token_embd=rng.normal(size=(N_VOCAB, N_EMBD)),
                          output=rng.normal(size=(N_VOCAB, N_EMBD)),
                          embd_type=gguf.GGMLQuantizationType.Q8_0)


def _tensor(path: Path, name: str) -> tuple[int, bytes]:
    f = GGUFFile(read_info(path))
    t = f.tensor(name)
    assert t is not None
    return t.ggml_type, f.data(t).tobytes()


def test_trainable_copy_holds_the_trained_tensors_as_f32_and_the_rest_as_stored(tmp_path):
    draft = _draft(tmp_path / "d.gguf")
    names = write_trainable(draft, tmp_path / "t.gguf", trains("head", 2))
    assert names == ["output.weight"]
    kind, raw = _tensor(tmp_path / "t.gguf", "output.weight")
    q_kind, q_raw = _tensor(draft, "output.weight")
    assert kind == gguf.GGMLQuantizationType.F32
    want = gguf.quants.dequantize(np.frombuffer(q_raw, np.uint8), gguf.GGMLQuantizationType(q_kind))
    assert np.array_equal(np.frombuffer(raw, np.float32).reshape(want.shape), want)
    assert _tensor(tmp_path / "t.gguf", "token_embd.weight") == _tensor(draft, "token_embd.weight")
    # head+last2 adds the last blocks' tensors.
    assert "blk.1.attn_q.weight" in write_trainable(draft, tmp_path / "t2.gguf",
                                                    trains("head+last2", 2))


def test_adapted_draft_takes_the_trained_tensors_back_in_the_drafts_own_type(tmp_path):
    draft = _draft(tmp_path / "d.gguf")
    write_trainable(draft, tmp_path / "t.gguf", trains("head", 2))
    # "Trained": the head's values moved; saved as the trainer saves (F32).
    trained = _draft(tmp_path / "trained-src.gguf", seed=5)
    write_trainable(trained, tmp_path / "trained.gguf", trains("head", 2))
    write_adapted(draft, tmp_path / "trained.gguf", tmp_path / "a.gguf", ["output.weight"])
    kind, raw = _tensor(tmp_path / "a.gguf", "output.weight")
    assert kind == gguf.GGMLQuantizationType.Q8_0
    assert raw == _tensor(trained, "output.weight")[1]  # requantized exactly as Q8_0 stores it
    assert _tensor(tmp_path / "a.gguf", "token_embd.weight") == _tensor(draft, "token_embd.weight")


def _ex(prompt, answer, temp=0.0, cat="c"):
    return Example(cat, tuple(prompt), tuple(answer), temp)


def test_each_example_is_its_own_window_and_no_request_sees_another():
    a = Example("c", (1, 2, 3), (4, 5), 0.0)
    b = Example("c", (6, 7), (8, 9, 10), 0.0)
    got = data.windows([a, b], 8, pad=0)
    assert [w.tokens for w in got] == [[1, 2, 3, 4, 5, 0, 0, 0], [6, 7, 8, 9, 10, 0, 0, 0]]
    # A long prompt keeps its tail, the answer whole; still one request a window.
    long = Example("c", tuple(range(20, 40)), (4, 5), 0.0)
    (w,) = data.windows([long], 8, pad=0)
    assert w.tokens == [34, 35, 36, 37, 38, 39, 4, 5]


def test_only_answer_positions_carry_labels_the_prompt_is_context():
    e = Example("c", (1, 2, 3), (4, 5), 0.0)
    (w,) = data.windows([e], 8, pad=0)
    # Position 2 (the prompt's last token) predicts the answer's first token, 3 its second.
    assert w.scored == [False, False, True, True, False, False, False, False]
    assert [lab for lab, s in zip(w.labels, w.scored) if s] == [4, 5]
    # llama.cpp's one-hot labels cannot be left out: the unscored positions take the draft's
    # own argmax there (no gradient toward any text), never the prompt's text or the target's.
    own = data.with_own_labels([w], lambda toks: [100 + i for i in range(len(toks))])
    assert own[0].labels == [100, 101, 4, 5, 104, 105, 106, 107]


def test_a_sampled_answer_is_labelled_with_the_targets_argmax_not_the_sampled_token():
    target = FakeBackend(seed=3)
    prompt = [3, 14, 15, 9]
    said, best = data.answer(target, prompt, 6, 0.7, np.random.default_rng(1))
    # The target's argmax along the sampled path, computed from its own rows.
    ref = FakeBackend(seed=3)
    toks = prompt + said
    rows = ref.decode(toks, 0, list(range(len(prompt) - 1, len(toks) - 1)))
    assert best == [int(t) for t in rows.argmax(axis=1)]
    assert best != said  # this seed samples off the argmax somewhere
    e = Example("c", tuple(prompt), tuple(said), 0.7, tuple(best))
    (w,) = data.windows([e], 16, pad=0)
    assert [lab for lab, s in zip(w.labels, w.scored) if s] == best
    # Greedy: the answer is the argmax.
    g, gbest = data.answer(FakeBackend(seed=3), prompt, 6, 0.0, np.random.default_rng(1))
    assert g == gbest


def test_no_prompt_is_trained_twice():
    target = FakeBackend(seed=0)
    prompts = [("c", [1, 2, i]) for i in range(6)]
    once = data.teach_once(target, prompts, 3, seed=0)
    assert [e.prompt for e in once] == [tuple(p) for _, p in prompts]
    # Both temperatures are still taught, alternately.
    assert [e.temperature for e in once] == [0.0, 0.7] * 3


def test_the_teacher_data_is_read_back_with_its_labels(tmp_path):
    saved = [Example("c", (3, 14), (5, 6), 0.7, (5, 9)), _ex([1], [2], 0.0)]
    assert data.load(data.save(tmp_path / "d.npz", saved)) == saved


def test_every_fourth_prompt_is_held_out_as_yours():
    ex = [_ex([i], [i], temp) for i in range(8) for temp in (0.0, 0.7)]
    trained, held = run.split(ex, 8)
    assert [e.prompt[0] for e in held] == [3, 3, 7, 7]
    assert {e.category for e in held} == {run.YOURS} and len(trained) == 12


def test_history_prompts_end_at_the_assistant_header():
    header = [90, 91]
    docs = [[1, 2, 90, 91, 5, 6], [3, 90, 91, 4, 90, 91, 8], [7, 8]]
    assert data.history_prompts(docs, header) == [[1, 2, 90, 91], [3, 90, 91, 4, 90, 91]]


def test_teacher_data_is_written_user_only_and_read_back(store):
    ex = [_ex([1, 2], [3], 0.0, "a"), _ex([4], [5, 6], 0.7, "b")]
    got = data.cached("ab" * 32, derived_dir(), lambda: ex)
    path = derived_dir() / f"adapt-data-{'ab' * 8}.npz"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert got == ex and data.cached("ab" * 32, derived_dir(), lambda: []) == ex


def test_greedy_rounds_accept_per_position_up_to_the_first_miss():
    r = proof.Rounds(gamma=2, reached=np.zeros(2), accepted=np.zeros(2))
    r.add(np.array([1.0, 0.0, 1.0]))
    # Rounds at 0: pos1 ok, pos2 miss; at 1: pos1 miss; at 2: pos1 ok (no pos2).
    assert list(r.reached) == [3, 1] and list(r.accepted) == [2, 0]
    assert r.per_position[0] == pytest.approx(2 / 3) and r.tokens_per_call == pytest.approx(5 / 3)


def test_sampled_acceptance_is_the_overlap_of_the_two_distributions():
    e = _ex([0], [1, 2], 0.7)
    t = np.log(np.array([[0.5, 0.5, 1e-9], [0.2, 0.3, 0.5]]))
    assert proof.accept_chances(t, t, e) == pytest.approx([1, 1])
    d = np.log(np.array([[1.0, 1e-9, 1e-9], [0.2, 0.3, 0.5]]))
    assert proof.accept_chances(t, d, e)[0] == pytest.approx(0.5, abs=1e-3)


def test_a_run_that_does_not_fit_is_refused_with_what_would(tmp_path):
    info = read_info(_draft(tmp_path / "d.gguf"))
    need = train.plan(info, "head+last2", 512)
    assert train.check_fits(info, "head+last2", 512, need.total) == need
    fits_head = train.plan(info, "head", 512).total
    with pytest.raises(SettingsError, match=r"; --train \S+ or --context 256 would fit") as exc:
        train.check_fits(info, "head+last2", 512, fits_head)
    assert "\n" not in str(exc.value)


def test_check_fits_never_suggests_a_window_llama_cpp_cannot_train(tmp_path):
    """llama.cpp pads a context to 256 tokens: 128 or 64 would end the process in opt_epoch."""
    info = read_info(_draft(tmp_path / "d.gguf"))
    with pytest.raises(SettingsError) as exc:
        train.check_fits(info, "head", 256, 1)
    assert "--context 128" not in str(exc.value) and "--context 64" not in str(exc.value)
    for bad in (128, 64, 300, 0):
        with pytest.raises(SettingsError, match="multiple of 256"):
            train.check_fits(info, "head", bad, 1 << 40)


class _FakeTrainer:
    """Stands in for engine/llama/training.Trainer: steps, then `save` copies its input."""

    def __init__(self, path: Path, stop_at: int | None = None) -> None:
        self.path, self.stop_at, self.steps, self.closed = path, stop_at, 0, False

    def step(self, window, labels) -> tuple[float, float]:
        assert len(window) == len(labels)
        self.steps += 1
        if self.steps == self.stop_at:
            raise KeyboardInterrupt
        return 1.0 / self.steps, 0.5

    def save(self, out: Path) -> None:
        out.write_bytes(self.path.read_bytes())

    def close(self) -> None:
        self.closed = True


def _build(draft: Path, stop_at: int | None, made: list):
    info = read_info(draft)

    def make(p, n_ctx, chosen, lr):
        made.append(_FakeTrainer(p, stop_at))
        return made[-1]

    def build(work: Path, out: Path) -> None:
        window = data.Window([1] * 256, [1] * 256, [True] * 256)
        train.train_draft(info, [window] * 3, out, work, "head", 2, 1e-4, make, lambda s: None)
    return build


def test_ctrl_c_during_training_keeps_the_old_adapted_draft_whole(store):
    draft = _draft(store / "d.gguf")
    made: list = []
    old = derive_adapted(draft, "t" * 64, "", "a" * 64, _build(draft, None, made))
    before = old.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        derive_adapted(draft, "t" * 64, "", "b" * 64, _build(draft, 4, made))
    assert made[-1].closed and old.read_bytes() == before
    # Nothing half-written and no work folder is left beside it.
    assert sorted(p.name for p in derived_dir().iterdir() if "adapted" in p.name
                  or p.name.startswith(".adapt")) == [old.name]


def _record(key: PairKey, file: str, wins: bool = True) -> PairingRecord:
    return PairingRecord(key=key, target="t.gguf", draft="d.gguf", adapter="", adapter_scale=1.0,
                         chosen=Choice(Candidate("draft")),
                         adapted=AdaptedDraft(file, key.target_sha256, key.adapter_sha256,
                                              key.draft_sha256, "data", "head", wins, "why"))


def test_the_record_names_the_adapted_draft_and_a_changed_file_retires_it(store):
    key = PairKey("t" * 64, "", "d" * 64)
    (derived_dir() / "d.adapted-x.dddd.gguf").write_bytes(b"x")
    save(_record(key, "d.adapted-x.dddd.gguf"))
    assert adapted_draft(key) == derived_dir() / "d.adapted-x.dddd.gguf"
    # Another target, another adapter, another draft: not this record's.
    for other in (PairKey("u" * 64, "", "d" * 64), PairKey("t" * 64, "a@1", "d" * 64),
                  PairKey("t" * 64, "", "e" * 64)):
        assert adapted_draft(other) is None
    # A record whose entry was made for other files (copied over) does not lend it either.
    moved = PairKey("t" * 64, "a@1", "d" * 64)
    rec = _record(key, "d.adapted-x.dddd.gguf")
    rec.key = moved
    save(rec)
    assert adapted_draft(moved) is None
    # One that lost, or whose file is gone, is not used.
    save(_record(key, "d.adapted-x.dddd.gguf", wins=False))
    assert adapted_draft(key) is None
    save(_record(key, "gone.gguf"))
    assert adapted_draft(key) is None


class _Adapted:
    """A fake draft moved toward its target: logits a mix of the base draft's and the target's,
    as training on the target's answers moves them."""

    def __init__(self, base, target, weight: float) -> None:
        self.base, self.target, self.weight = base, target, weight

    def __getattr__(self, name):
        return getattr(self.base, name)

    def decode(self, tokens, pos, rows):
        b = self.base.decode(tokens, pos, rows)
        self.target.truncate(pos)
        t = self.target.decode(tokens, pos, rows)
        return (1 - self.weight) * b + self.weight * t

    def truncate(self, n: int) -> None:
        self.base.truncate(n)


def test_exactness_check_passes_with_an_adapted_draft():
    from bench.exactness.check import ExactnessPlan, run_exactness
    from bench.fakes.backend import FakeBackend
    from engine.drafters.draft_model import DraftModelDrafter
    from engine.session import Session
    plan = ExactnessPlan(samples=400, seed=0, tokens=3, greedy_tokens=16, control_tv=0.1)
    rates = {}
    for w in (0.0, 0.7):
        target = Session(FakeBackend(seed=1, scale=2.0))
        draft = _Adapted(FakeBackend(seed=1, scale=3.5, noise=1.0), FakeBackend(seed=1, scale=2.0), w)
        rep = run_exactness(target, DraftModelDrafter(draft), [3, 4, 5], plan,
                            greedy_prompts=[[1, 2]])
        assert all(r.passed for r in rep.results), w
        rates[w] = np.mean([r.acceptance_rate for r in rep.results])
    # The adapted draft is accepted more, and the target's answers are unchanged.
    assert rates[0.7] > rates[0.0]


@pytest.mark.parametrize("wins", [True, False])
def test_a_load_uses_the_adapted_draft_only_where_it_won(tmp_path, monkeypatch, capsys, wins):
    import shutil
    from app.runtime import open_pair as opening
    from app.runtime.open_pair import PairRequest, open_pair
    from app.runtime.tuned import key_for
    from bench.fakes.backend import FakeBackend
    from engine.backend import ModelConfig
    from loading.options import LoadOptions
    from models.machine import Machine
    for env, sub in (("TANDEM_HOME", "home"), ("TANDEM_MODELS", "store"),
                     ("TANDEM_HISTORY", "history"), ("TANDEM_PAIRS", "pairs")):
        monkeypatch.setenv(env, str(tmp_path / sub))
    monkeypatch.setattr("loading.devices.detect", lambda: Machine(64 << 30, 60 << 30))
    keys: list = []
    monkeypatch.setattr(opening, "keep_evidence", lambda pair, key: keys.append(key))
    vocab = tinygguf.vocab(64)
    target = str(tinygguf.write(tmp_path / "t.gguf", tokens=vocab))
    draft = str(tinygguf.write(tmp_path / "d.gguf", tokens=vocab))
    key = key_for(target, draft)
    adapted = derived_dir() / "d.adapted-x.0123456789abcdef.gguf"
    shutil.copy(draft, adapted)
    save(_record(key, adapted.name, wins))
    loaded: list[str] = []

    def loader(c):
        loaded.append(Path(c.path).name)
        return FakeBackend(eog=59)

    opened = open_pair(PairRequest(ModelConfig(target, n_ctx=256), ModelConfig(draft, n_ctx=256),
                                   LoadOptions(draft_quant="off")), loader=loader)
    opened.pair.close()
    # The evidence stays the pair's (the files the user named).
    assert keys == [key]
    assert loaded[-1] == (adapted.name if wins else "d.gguf")
    assert ("adapted draft d.adapted-x" in capsys.readouterr().err) == wins


def test_the_teacher_with_an_adapter_is_not_the_bare_target(store, monkeypatch):
    """The teacher data is cached by who answered: a target with a LoRA adapter (or another
    scale of it) answers anew, the same teacher again is read back."""
    import contextlib

    from bench.adapt import session
    from bench.adapt.settings import Settings
    from engine.backend import ModelConfig

    class _Pair:
        def __init__(self, backend) -> None:
            pass

        def tokens_for(self, text: str) -> list[int]:
            return [1, len(text)]

    taught: list[tuple] = []

    def teach(target, prompts, max_tokens, seed, progress):
        taught.append(tuple(c for c, _ in prompts))
        return [Example(c, tuple(t), (7, 8), temp) for c, t in prompts for temp in (0.0, 0.7)]

    def teach_once(target, prompts, max_tokens, seed, progress):
        taught.append(tuple(c for c, _ in prompts))
        return [Example(c, tuple(t), (7, 8), 0.0) for c, t in prompts]

    monkeypatch.setattr("engine.llama.backend.quiet_backend",
                        lambda config: contextlib.nullcontext(object()))
    monkeypatch.setattr("engine.pair.Pair", _Pair)
    monkeypatch.setattr(data, "teach", teach)
    monkeypatch.setattr(data, "teach_once", teach_once)
    prompts = session.text_prompts([("mine", f"request {i}") for i in range(32)])
    settings = Settings(holdout_per_category=1)
    progress = type("P", (), {"stage": lambda self, what: lambda i, n: None,
                              "line": lambda self, text: None})()
    for adapter in ("", "a" * 64 + "@1", "a" * 64 + "@0.5", ""):
        key = PairKey("t" * 64, adapter, "d" * 64)
        trained, yours = session.teacher(ModelConfig("t.gguf"), prompts, settings, 1, key,
                                         progress)
        suite = session.suite_answers(ModelConfig("t.gguf"), settings, 1, key, progress)
        # 24 trained prompts, once each; 8 held out, each greedy and at T 0.7.
        assert len(trained) == 24 and [e.category for e in yours] == ["yours"] * 16
        assert suite and run.YOURS not in {e.category for e in suite}
    # Three teachers, each answering your trained requests, your held-out ones and the held-out
    # suite's once; the bare target's second run reads its answers back.
    assert taught.count(("mine",) * 24) == 3 and taught.count(("yours",) * 8) == 3
    assert len(taught) == 9


def test_an_unknown_optimizer_is_refused_before_loading(tmp_path):
    with pytest.raises(ValueError, match="optimizer"):
        training.Trainer(tmp_path / "missing.gguf", 256, lambda n: True, 1e-3, optimizer=7)
