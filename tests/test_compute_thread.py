"""Every llama.cpp decode runs on the process's one compute thread (engine/llama/compute_thread.py),
whoever calls: one OpenMP team, so libgomp never throttles its barriers to kernel sleeps."""
from __future__ import annotations

import threading

import pytest

from engine.llama.compute_thread import ComputeThread


def test_calls_from_every_thread_run_on_one():
    compute = ComputeThread()
    seen: list[int] = []
    record = lambda: seen.append(threading.get_ident())  # noqa: E731
    threads = [threading.Thread(target=lambda: [compute.run(record) for _ in range(5)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    compute.run(record)
    assert len(seen) == 21
    assert set(seen) == {compute.ident}
    assert compute.ident != threading.get_ident()


def test_a_result_and_an_error_reach_the_caller():
    compute = ComputeThread()
    assert compute.run(lambda a, b: a + b, 2, 3) == 5

    def fail() -> None:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        compute.run(fail)
    # From the compute thread itself a call runs at once (no hand-over to wait on).
    assert compute.run(lambda: compute.run(threading.get_ident)) == compute.ident


def test_the_backend_decodes_through_it():
    import inspect

    from engine.llama import backend
    source = inspect.getsource(backend.LlamaBackend._run)
    assert "COMPUTE.run(llama_cpp.llama_decode" in source
    assert "llama_cpp.llama_decode(" not in source.replace("COMPUTE.run(llama_cpp.llama_decode", "")
