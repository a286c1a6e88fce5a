"""Hub access through real huggingface_hub against a local hub server: search, listing, pulls."""
from __future__ import annotations

import hashlib

import pytest

from engine.errors import HubError
from models import hub
from models.registry import list_local
from tests import tinygguf
from tests.hubserver import HubServer, closed_port_url

REPO = "tandem-test/Tiny-GGUF"


@pytest.fixture
def store(tmp_path, monkeypatch):
    d = tmp_path / "store"
    monkeypatch.setenv("TANDEM_MODELS", str(d))
    return d


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory) -> bytes:
    # Larger than two of huggingface_hub's 10 MB download chunks: it writes whole chunks only,
    # so a resume point exists only past the first chunk.
    path = tmp_path_factory.mktemp("src") / "src.gguf"
    return tinygguf.write(path, n_embd=64, n_layer=4, pad_bytes=24 << 20).read_bytes()


@pytest.fixture
def server(model_bytes):
    with HubServer() as h:
        h.add(REPO, "tiny-Q4_K_M.gguf", model_bytes)
        h.add(REPO, "tiny-Q8_0.gguf", model_bytes[::-1])
        h.add(REPO, "README.md", b"# tiny\n")
        h.add("other/Unrelated", "x-F16.gguf", b"GGUF" + b"\0" * 60)
        yield h


def test_search_and_list(server):
    hits = hub.search("tiny", endpoint_url=server.url)
    assert [h.repo_id for h in hits] == [REPO]
    files = hub.list_gguf_files(REPO, endpoint_url=server.url)
    assert sorted((f.filename, f.quant) for f in files) == [("tiny-Q4_K_M.gguf", "Q4_K_M"), ("tiny-Q8_0.gguf", "Q8_0")]
    q4 = next(f for f in files if f.quant == "Q4_K_M")
    data = server.state.repos[REPO]["tiny-Q4_K_M.gguf"]
    assert q4.size == len(data) and q4.sha256 == hashlib.sha256(data).hexdigest()


def test_normal_pull_registers_verified_file(server, store, model_bytes):
    seen: list[tuple[int, int]] = []
    path = hub.pull(REPO, "tiny-Q4_K_M.gguf", endpoint_url=server.url, progress=lambda d, t: seen.append((d, t)))
    assert path == store / "tiny-Q4_K_M.gguf" and path.read_bytes() == model_bytes
    assert seen[-1] == (len(model_bytes), len(model_bytes))
    [local] = list_local(store)
    assert local.verified and local.sha256 == hashlib.sha256(model_bytes).hexdigest()
    assert local.quant == "ALL_F32" and local.source == f"{REPO}/tiny-Q4_K_M.gguf"
    # A second pull finds the verified file and downloads nothing.
    n_gets = len(server.gets("tiny-Q4_K_M.gguf"))
    assert hub.pull(REPO, "tiny-Q4_K_M.gguf", endpoint_url=server.url) == path
    assert len(server.gets("tiny-Q4_K_M.gguf")) == n_gets


def test_connection_cut_halfway_is_resumed(server, store, model_bytes):
    half = len(model_bytes) // 2
    server.state.cut[(REPO, "tiny-Q4_K_M.gguf")] = [half, 1]
    path = hub.pull(REPO, "tiny-Q4_K_M.gguf", endpoint_url=server.url)
    assert path.read_bytes() == model_bytes
    first, retry = server.gets("tiny-Q4_K_M.gguf")
    assert first is None
    resumed_at = int(retry.removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= half


def test_interrupted_pull_resumes_on_next_run(server, store, model_bytes):
    def interrupt(done: int, total: int) -> None:
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hub.pull(REPO, "tiny-Q4_K_M.gguf", endpoint_url=server.url, progress=interrupt)
    [partial] = store.glob("*.incomplete")
    kept = partial.stat().st_size
    assert 0 < kept < len(model_bytes) and not (store / "tiny-Q4_K_M.gguf").exists()
    path = hub.pull(REPO, "tiny-Q4_K_M.gguf", endpoint_url=server.url)
    assert path.read_bytes() == model_bytes
    assert server.gets("tiny-Q4_K_M.gguf")[-1] == f"bytes={kept}-"
    assert not list(store.glob("*.incomplete"))


def test_corrupted_file_is_refused(server, store, model_bytes):
    bad = bytearray(model_bytes)
    bad[len(bad) // 3] ^= 0xFF
    server.state.corrupt[(REPO, "tiny-Q4_K_M.gguf")] = bytes(bad)
    expected = hashlib.sha256(model_bytes).hexdigest()
    actual = hashlib.sha256(bytes(bad)).hexdigest()
    with pytest.raises(HubError, match=f"expected sha256 {expected}.*got {actual}"):
        hub.pull(REPO, "tiny-Q4_K_M.gguf", endpoint_url=server.url)
    assert list(store.iterdir()) == []
    assert list_local(store) == []


def test_missing_repo(server, store):
    with pytest.raises(HubError, match="nobody/Nothing-GGUF.*repository not found"):
        hub.pull("nobody/Nothing-GGUF", "x.gguf", endpoint_url=server.url)
    with pytest.raises(HubError, match="repository not found"):
        hub.list_gguf_files("nobody/Nothing-GGUF", endpoint_url=server.url)


def test_missing_file(server, store):
    with pytest.raises(HubError, match="file not found"):
        hub.pull(REPO, "absent-Q2_K.gguf", endpoint_url=server.url)


def test_server_down_names_offline_options(store):
    url = closed_port_url()
    for call in (lambda: hub.pull(REPO, "tiny-Q4_K_M.gguf", endpoint_url=url),
                 lambda: hub.search("qwen", endpoint_url=url),
                 lambda: hub.list_gguf_files(REPO, endpoint_url=url)):
        with pytest.raises(HubError, match="cannot reach the hub.*embedded pair.*--target PATH"):
            call()


def test_hf_endpoint_env_is_honoured(server, store, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    assert hub.pull(REPO, "tiny-Q8_0.gguf").is_file()


@pytest.mark.parametrize("name,quant", [("Qwen2.5-7B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
                                        ("qwen2.5-coder-1.5b-instruct-q8_0.gguf", "Q8_0"),
                                        ("gemma-3-4b-it-IQ4_XS.gguf", "IQ4_XS"), ("model-f16.gguf", "F16"),
                                        ("README.gguf", "?")])
def test_quant_from_filename(name, quant):
    assert hub.quant_of(name) == quant


def test_a_catalog_file_of_another_size_than_recorded_is_refused_before_download(store, model_bytes):
    repo, name = "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "qwen2.5-0.5b-instruct-q8_0.gguf"
    with HubServer() as h:
        h.add(repo, name, model_bytes)
        with pytest.raises(HubError, match=f"is {len(model_bytes)} bytes on the hub, but the catalog"
                                           " records 675710816; refusing it"):
            hub.pull(repo, name, endpoint_url=h.url)
        assert h.gets(name) == []
    assert not store.exists() or list(store.iterdir()) == []
