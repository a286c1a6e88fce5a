"""Pairing records in the store, and how generate/app/serve use them (no models loaded)."""
from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest

from app.runtime.tuned import expected_acceptance, for_command, lookup, running_name
from app.runtime.request import resolve
from app.settings import pairing_rule, request_spec
from loading.options import LoadOptions
from engine.backend import ModelConfig
from loading.plan import LoadPlan
from models import tuned
from app.runtime.tuned import key_for
from models.candidate import Candidate
from models.tuned import Choice, PairingRecord, all_records, find, save, stale_for


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.delenv("TANDEM_PAIRS", raising=False)
    files = {}
    for name in ("target", "target2", "draft", "adapter"):
        files[name] = tmp_path / f"{name}.gguf"
        files[name].write_bytes(name.encode() * 100)
    return files


def _record(key, target, draft, drafter="draft", acceptance=0.7, **kw) -> PairingRecord:
    chosen = Choice(Candidate(drafter, draft_quant="q4_0"), acceptance=acceptance,
                    speedup_median=1.4, speedup_p10=1.1, n_prompts=6)
    return PairingRecord(key=key, target=str(target), draft=str(draft), adapter="",
                         adapter_scale=1.0, chosen=chosen,
                         measured={"draft-q4_0": {"acceptance": acceptance,
                                                  "acceptance_min": acceptance - 0.1, "n": 6}},
                         **kw)


def test_key_depends_on_every_file_and_the_adapter_scale(store):
    base = key_for(store["target"], store["draft"])
    assert base == key_for(store["target"], store["draft"])
    assert base.adapter_sha256 == ""
    weak = key_for(store["target"], store["draft"], [(str(store["adapter"]), 0.1)])
    strong = key_for(store["target"], store["draft"], [(str(store["adapter"]), 2.0)])
    assert len({base.id, weak.id, strong.id,
                key_for(store["target2"], store["draft"]).id,
                key_for(store["target"], None).id}) == 5
    assert weak.target_sha256 == base.target_sha256 and weak.draft_sha256 == base.draft_sha256


def test_save_find_list_and_round_trip(store):
    key = key_for(store["target"], store["draft"])
    assert find(key) is None
    rec = _record(key, store["target"], store["draft"], machine={"device": "CPU", "threads": 2},
                  tandem_version="0.1.0")
    path = save(rec)
    assert path.parent.name == "pairs" and path.is_file()
    got = find(key)
    assert got.chosen == rec.chosen and got.machine["threads"] == 2 and got.date
    assert [r.key for r in all_records()] == [key]


def test_stale_records_are_those_of_the_same_draft_with_another_target_or_adapter(store):
    old = key_for(store["target"], store["draft"])
    save(_record(old, store["target"], store["draft"]))
    new_target = key_for(store["target2"], store["draft"])
    adapted = key_for(store["target"], store["draft"], [(str(store["adapter"]), 1.0)])
    assert [r.key for r in stale_for(new_target)] == [old]
    assert [r.key for r in stale_for(adapted)] == [old]
    assert stale_for(old) == []
    assert stale_for(key_for(store["target2"], None)) == []


def test_an_unreadable_record_is_set_aside_with_one_warning_line(store, capsys):
    key = key_for(store["target"], store["draft"])
    for read in (all_records, lambda: find(key)):
        (tuned.pairs_dir() / f"{key.id}.json").write_text("{not json")
        assert read() in ([], None)
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "tandem tune" in err, err
    assert len(list(tuned.pairs_dir().glob(f"{key.id}.json.corrupt-*"))) == 2
    assert find(key) is None and all_records() == []


def _args(*argv: str) -> argparse.Namespace:
    """`tandem generate`'s options as the command line gives them."""
    from app.cli import build_parser
    return build_parser().parse_args(["generate", "--prompt", "x", *argv])


def _for_command(args: argparse.Namespace, use):
    """for_command under the rule the command line `args` gives (app/settings.py)."""
    rule = pairing_rule(args)
    return for_command(use, rule.chose_speculation, rule.no_pairing)


def test_a_matching_record_is_applied_and_said(store):
    t, d = ModelConfig(str(store["target"])), ModelConfig(str(store["draft"]))
    save(_record(key_for(t.path, d.path), t.path, d.path))
    args = _args()
    use = _for_command(args, lookup(t, d))
    assert use.applied and use.overrides == {"drafter": "draft", "policy": "adaptive", "gamma": 8}
    assert use.load_options(LoadOptions()).draft_quant == "q4_0"
    # The record's choice is returned, not written into the command line.
    assert args.drafter is None and args.draft_quant is None
    spec = request_spec(args, use)
    assert (spec.drafter, spec.policy, spec.gamma) == ("draft", "adaptive", 8)
    assert any("using tuned pairing" in m for m in use.messages)
    assert not any("warning" in m for m in use.messages)


def test_explicit_flags_and_no_pairing_win_over_the_record(store):
    t, d = ModelConfig(str(store["target"])), ModelConfig(str(store["draft"]))
    save(_record(key_for(t.path, d.path), t.path, d.path))
    args = _args("--drafter", "lookup")
    use = _for_command(args, lookup(t, d))
    assert not use.applied and use.overrides == {} and request_spec(args, use).drafter == "lookup"
    assert any("not used" in m for m in use.messages)
    args = _args("--no-pairing")
    use = _for_command(args, lookup(t, d))
    assert not use.applied and request_spec(args, use).drafter == "hybrid"
    assert any("not used: --no-pairing" in m for m in use.messages)


def test_an_adapter_or_new_target_warns_that_the_draft_was_tuned_for_another(store):
    t, d = ModelConfig(str(store["target"])), ModelConfig(str(store["draft"]))
    save(_record(key_for(t.path, d.path), t.path, d.path))
    adapted = ModelConfig(t.path, lora=((str(store["adapter"]), 2.0),))
    use = lookup(adapted, d)
    assert use.record is None and use.reference is not None
    assert any("tuned" in m and "another version of the target" in m for m in use.messages)
    assert not _for_command(_args(), use).applied


def test_expected_acceptance_is_the_lowest_category_of_the_running_config(store):
    t, d = ModelConfig(str(store["target"])), ModelConfig(str(store["draft"]))
    save(_record(key_for(t.path, d.path), t.path, d.path, acceptance=0.7))
    use = lookup(t, d)
    # The name comes from the load's plan: its derivations, decided from the headers it read.
    header = SimpleNamespace(n_layer=28)
    quantized = LoadPlan(t, header, d, header, draft_quant="q4_0")
    name = running_name("draft", quantized)
    assert name == "draft-q4_0"
    assert expected_acceptance(use, name) == pytest.approx(0.6)
    assert expected_acceptance(use, running_name("lookup", quantized)) is None
    assert running_name("hybrid", quantized) == "" and running_name("hybrid", LoadPlan(
        t, header, d, header)) == "hybrid"
    assert running_name("early-exit", LoadPlan(t, header)) == "early-exit-21"
    assert running_name("early-exit", LoadPlan(t, header, early_exit_layers=5)) == "early-exit-5"
    assert expected_acceptance(use, "plain") is None


def test_record_json_is_readable(store):
    key = key_for(store["target"], store["draft"])
    path = save(_record(key, store["target"], store["draft"]))
    data = json.loads(path.read_text())
    assert data["key"]["target_sha256"] == key.target_sha256
    assert data["chosen"]["drafter"] == "draft"


def test_no_staleness_warning_when_the_files_have_their_own_record(store):
    t, d = ModelConfig(str(store["target"])), ModelConfig(str(store["draft"]))
    adapted = ModelConfig(t.path, lora=((str(store["adapter"]), 2.0),))
    save(_record(key_for(t.path, d.path), t.path, d.path))
    save(_record(key_for(t.path, d.path, adapted.lora), t.path, d.path))
    use = lookup(adapted, d)
    assert use.record is not None and len(use.stale) == 1
    assert not any("warning" in m for m in use.messages)


def test_the_app_loads_the_tuned_drafter_and_says_so(tmp_path, monkeypatch):
    from app.runtime.holder import READY, PairHolder
    from loading.options import LoadOptions
    from tests import tinygguf
    from bench.fakes.backend import FakeBackend
    monkeypatch.setenv("TANDEM_MODELS", str(tmp_path / "store"))
    monkeypatch.delenv("TANDEM_PAIRS", raising=False)
    t = tinygguf.write(tmp_path / "t.gguf", n_embd=64)
    t2 = tinygguf.write(tmp_path / "t2.gguf", n_embd=64, n_layer=3)
    d = tinygguf.write(tmp_path / "d.gguf", n_embd=64)
    rec = _record(key_for(t, d), t, d, drafter="lookup")
    rec.chosen.candidate = Candidate("lookup", policy="fixed", gamma=3)
    save(rec)
    holder = PairHolder()
    holder._loader = lambda config: FakeBackend()
    opts = LoadOptions(check_budget=False)
    assert holder.load(ModelConfig(str(t)), ModelConfig(str(d)), opts) is None
    assert holder.status.state == READY
    assert holder.offer().drafter == "lookup" and holder.pair.default_drafter == "hybrid"
    assert "tuned pairing: lookup fixed g=3" in holder.status.message
    # The page's chat starts on the record's drafter, policy and gamma; a request that chooses
    # none of them runs with them.
    from app.ui import _choice_updates
    assert [u["value"] for u in _choice_updates(holder)[:3]] == ["lookup", "fixed", 3]
    spec = resolve({}, holder.offer())
    assert (spec.drafter, spec.policy, spec.gamma) == ("lookup", "fixed", 3)
    assert resolve({"gamma": 5}, holder.offer()).drafter == "hybrid"
    # Another target with this draft: the banner says the draft was tuned for another one.
    assert holder.load(ModelConfig(str(t2)), ModelConfig(str(d)), opts) is None
    assert holder.offer().drafter == "hybrid"
    assert "another version of the target" in holder.status.message


def test_a_record_written_when_plain_decoding_was_called_none_still_reads():
    old = Choice.from_dict({"drafter": "none", "policy": "plain", "gamma": 0, "n_prompts": 4})
    assert old.candidate.drafter == "plain" and old.label == "plain decoding" and old.n_prompts == 4


def test_a_choice_holds_its_candidate_and_keeps_the_records_format():
    choice = Choice(Candidate("draft", draft_quant="q4_0", policy="fixed", gamma=3),
                    acceptance=0.7, speedup_median=1.4, n_prompts=6)
    # On disk the candidate's fields sit beside the figures, as every record was written.
    flat = {"drafter": "draft", "draft_quant": "q4_0", "draft_vocab": "full",
            "early_exit_layers": None, "policy": "fixed", "gamma": 3, "acceptance": 0.7,
            "speedup_median": 1.4, "speedup_p10": 1.0, "n_prompts": 6}
    assert choice.as_dict() == flat and Choice.from_dict(flat) == choice
    assert choice.label == "draft q4_0 fixed g=3"


def test_only_files_named_as_records_are_read_as_records(store, capsys):
    key = key_for(store["target"], store["draft"])
    save(_record(key, store["target"], store["draft"]))
    # Another store's file, a set-aside one and a temporary one in the same folder.
    for name in (f"{key.id}.evidence.json", f"{key.id}.json.corrupt-1", f".{key.id}.json.1.a.part"):
        (tuned.pairs_dir() / name).write_text('{"not": "a record"}')
    assert [r.key for r in all_records()] == [key]
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in tuned.pairs_dir().iterdir()) == sorted(
        [f"{key.id}.json", f"{key.id}.evidence.json", f"{key.id}.json.corrupt-1",
         f".{key.id}.json.1.a.part"])
