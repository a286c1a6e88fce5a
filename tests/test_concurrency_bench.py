"""bench/concurrency.py on a cost profile's virtual clock: the serial queue makes each request
wait for the ones before it, the slots run up to their number together, and clients past the
slots wait for one to free, as `tandem serve` admits them."""
from __future__ import annotations

import pytest

from bench.concurrency import main, profile_pair
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


def test_slots_run_together_and_clients_past_them_wait_for_one():
    alone = plain(4, 1)[0].latency
    done = plain(4, 8)
    first, second = done[:4], done[4:]
    # The GPU profile: a step of 4 rows costs 1.03 of one row.
    for d in first:
        assert d.latency == pytest.approx(1.03 * alone, rel=0.1)
    for d in second:
        assert d.latency == pytest.approx(2 * 1.03 * alone, rel=0.1)
        assert d.ttft > first[-1].latency * 0.9


def test_the_table_has_every_mode_for_every_client_count(tmp_path):
    out = tmp_path / "gpu.md"
    main(["--profile", "gpu", "--clients", "1", "2", "--max-tokens", "8", "--out", str(out)])
    rows = [r for r in out.read_text().splitlines() if r.startswith("| 1 ") or r.startswith("| 2 ")]
    assert [r.split(" | ")[1] for r in rows] == ["serial", "plain batched", "spec. batched"] * 2
