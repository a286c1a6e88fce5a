"""scripts/verify-catalog's comparison, against the local hub stand-in (never the real hub):
recorded sizes, estimates, missing files and repositories, writing the hub's sizes back, and a
clear error when the hub cannot be reached."""
from __future__ import annotations

import json

import pytest

from engine.errors import HubError
from models.catalog import MIB
from models.catalog_check import DIFFERS, ESTIMATE, MISSING, OK, check, main, write_sizes
from tests.hubserver import HubServer, closed_port_url

SIZE = 40_000


def entry(name: str, size_mb: float, size: int | None = None) -> dict:
    return {"file": name, "size_mb": size_mb, **({"size": size} if size is not None else {})}


@pytest.fixture
def catalog(tmp_path):
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"models": {
        "a": {"name": "A", "repo": "org/A-GGUF", "files": {
            "Q4_K_M": entry("a-Q4_K_M.gguf", SIZE / MIB, SIZE),          # recorded, right
            "Q8_0": entry("a-Q8_0.gguf", SIZE / MIB, SIZE + 1),          # recorded, wrong
            "Q6_K": entry("a-Q6_K.gguf", 1.0)}},                         # not on the hub
        "b": {"name": "B", "repo": "org/B-GGUF", "files": {
            "Q4_K_M": entry("b-Q4_K_M.gguf", SIZE * 1.01 / MIB),         # estimate, 1% off
            "Q8_0": entry("b-Q8_0.gguf", SIZE * 1.5 / MIB)}},            # estimate, 50% off
        "c": {"name": "C", "repo": "org/Gone-GGUF", "files": {
            "Q4_K_M": entry("c-Q4_K_M.gguf", 1.0)}}},
        "pairs": []}, indent=1))
    return path


@pytest.fixture
def hub_url():
    with HubServer() as h:
        for repo, name in (("org/A-GGUF", "a-Q4_K_M.gguf"), ("org/A-GGUF", "a-Q8_0.gguf"),
                           ("org/B-GGUF", "b-Q4_K_M.gguf"), ("org/B-GGUF", "b-Q8_0.gguf")):
            h.add(repo, name, b"G" * SIZE)
        yield h.url


def test_each_file_is_compared_with_the_hub(catalog, hub_url):
    found = {(f.model, f.filename): f for f in check(catalog, hub_url)}
    assert len(found) == 6
    assert found[("a", "a-Q4_K_M.gguf")].status == OK and found[("a", "a-Q4_K_M.gguf")].ok
    wrong = found[("a", "a-Q8_0.gguf")]
    assert wrong.status == DIFFERS and not wrong.ok and wrong.hub_size == SIZE
    assert "DIFFERS" in wrong.line() and f"the catalog records {SIZE + 1}" in wrong.line()
    absent = found[("a", "a-Q6_K.gguf")]
    assert absent.status == MISSING and "does not hold this file" in absent.line()
    close, far = found[("b", "b-Q4_K_M.gguf")], found[("b", "b-Q8_0.gguf")]
    assert close.status == far.status == ESTIMATE and close.ok and not far.ok
    assert "1.0% off" in close.line() and "50.0% off" in far.line()
    gone = found[("c", "c-Q4_K_M.gguf")]
    assert gone.status == MISSING and "repository not found" in gone.detail


def test_writing_records_the_hubs_sizes(catalog, hub_url):
    assert write_sizes(check(catalog, hub_url), catalog) == 3
    data = json.loads(catalog.read_text())
    assert data["models"]["a"]["files"]["Q8_0"]["size"] == SIZE
    assert data["models"]["b"]["files"]["Q8_0"] == {"file": "b-Q8_0.gguf", "size_mb": 0, "size": SIZE}
    assert "size" not in data["models"]["a"]["files"]["Q6_K"]
    after = check(catalog, hub_url)
    assert sorted(f.status for f in after) == [MISSING, MISSING, OK, OK, OK, OK]


def test_the_command_reports_and_fails_on_what_to_fix(catalog, hub_url, capsys):
    assert main(["--catalog", str(catalog), "--endpoint", hub_url]) == 1
    out = capsys.readouterr().out
    assert "6 files, 4 to fix" in out and "ok        org/A-GGUF/a-Q4_K_M.gguf" in out


def test_an_unreachable_hub_is_one_clear_error(catalog, capsys):
    url = closed_port_url()
    with pytest.raises(HubError, match="cannot reach the hub at .*run it where the hub is reachable"):
        check(catalog, url)
    assert main(["--catalog", str(catalog), "--endpoint", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: verifying the catalog: cannot reach the hub") and err.count("\n") == 1
