"""bench/concurrency.py on a cost profile's virtual clock: the serial queue makes each request
wait for the ones before it, the slots run up to their number together, and clients past the
slots wait for one to free, as `tandem serve` admits them; no cell's run sees what another's left,
and none measures a calibration its warm-up should have measured."""
from __future__ import annotations

import pytest

import engine.knowledge
from bench.concurrency import Bench, main, profile_pair
from bench.fakes.costed import GPU
from engine.generation_config import GenerationConfig
from engine.sampling import SamplingParams

TOKENS = 32
CONFIG = GenerationConfig(params=SamplingParams(temperature=0.0), gamma=8, max_tokens=TOKENS)


def plain(parallel: int, clients: int) -> list:
    b = profile_pair("gpu", parallel, 0.8)
    b.clients(1, CONFIG, "plain")
    try:
        return sorted(b.clients(clients, CONFIG, "plain"), key=lambda d: d.latency)
    finally:
        b.pair.close()


def test_the_serial_queue_makes_each_request_wait_for_the_ones_before():
    done = plain(1, 4)
    one = done[0].latency
    assert [d.tokens for d in done] == [TOKENS] * 4
    for k, d in enumerate(done):
        assert d.latency == pytest.approx((k + 1) * one, rel=0.05)
        assert d.ttft == pytest.approx(k * one + done[0].ttft, rel=0.05)


@pytest.mark.parametrize("parallel", [1, 4])
def test_after_the_warm_up_the_default_drafters_clients_measure_no_calibration(monkeypatch,
                                                                               parallel):
    # The warm-up calibrates as the default's first generation would (the controller's need,
    # a copy's width, not the request's gamma): a calibration inside the timed clients moved the
    # virtual clock while the serial queue's next client waited (2 clients at 74.8 tok/s, 1 at
    # 214.8) and while the slots' batches stood still.
    b = profile_pair("gpu", parallel, 0.8)
    try:
        b.warm(CONFIG, None)
        measured: list[int] = []
        calibrate = engine.knowledge.calibrate

        def counted(*args, **kwargs):
            measured.append(args[2])
            return calibrate(*args, **kwargs)
        monkeypatch.setattr(engine.knowledge, "calibrate", counted)
        done = sorted(b.clients(2, CONFIG, None), key=lambda d: d.latency)
    finally:
        b.pair.close()
    assert measured == []
    assert [d.tokens for d in done] == [TOKENS] * 2
    if parallel == 1:  # the queue: the second waits for the first, nothing else
        assert done[1].latency == pytest.approx(2 * done[0].latency, rel=0.05)


def test_slots_run_together_and_clients_past_them_wait_for_one():
    alone = plain(4, 1)[0].latency
    done = plain(4, 8)
    first, second = done[:4], done[4:]
    # The measured GPU profile: a step of 4 rows costs what its curve says of one row's.
    four = GPU.verify[3] / GPU.verify[0]
    for d in first:
        assert d.latency == pytest.approx(four * alone, rel=0.1)
    for d in second:
        assert d.latency == pytest.approx(2 * four * alone, rel=0.1)
        assert d.ttft > first[-1].latency * 0.9


def test_the_table_has_every_mode_for_every_client_count(tmp_path):
    out = tmp_path / "gpu.md"
    main(["--profile", "gpu", "--clients", "1", "2", "--max-tokens", "8", "--out", str(out)])
    text = out.read_text()
    assert f"the gpu cost profile: {GPU.label};" in text and "H200 measured" in text
    rows = [r for r in text.splitlines() if r.startswith("| 1 ") or r.startswith("| 2 ")]
    assert [r.split(" | ")[1] for r in rows] == ["serial", "plain batched", "spec. batched"] * 2


def test_each_run_of_a_cell_starts_from_a_pair_of_its_own_that_has_learnt_nothing(monkeypatch):
    # What each timed run starts from: its pair, and the answers the default drafter's evidence
    # has seen (engine/control/evidence.py).
    seen: list[tuple[Bench, int, str | None, int]] = []
    clients = Bench.clients

    def timed(self, k, config, drafter):
        pair = self.pair
        seen.append((self, k, drafter, pair.knowledge.evidence_of(pair.default_drafter).answers))
        return clients(self, k, config, drafter)
    monkeypatch.setattr(Bench, "clients", timed)
    main(["--profile", "gpu", "--clients", "1", "2", "--max-tokens", "8", "--repeats", "2"])
    assert len(seen) == 2 * 2 * 3
    assert len({id(b.pair) for b, *_ in seen}) == len(seen)
    assert [before for *_, before in seen] == [0] * len(seen)
    # The evidence does learn within a run: each client's answer with the default drafter.
    after = [b.pair.knowledge.evidence_of(b.pair.default_drafter).answers for b, *_ in seen]
    assert after == [0 if drafter == "plain" else k for _, k, drafter, _ in seen]
