"""Kill and restart (issue 64): `tandem serve` and `tandem ui` (tests/fakeserve.py: the
commands' own servers over the fake pair, with the stores a real load keeps) are killed with
SIGKILL at seeded random points while they stream answers, and started again over the same
stores, many times in a row.

A kill lands either in a stream (the test kills the server after reading a chosen number of
events of a chosen answer: mid-answer, with the saves of that answer pending) or inside a write
(the server kills itself at a chosen step of its Nth write of a chosen store, through
models/atomic.py's seam: tests/fakeserve.py's TANDEM_KILL_AT). After each kill the stores are
read as the next start reads them, and the server is started again:

- every file of every store reads back whole (nothing set aside, no `warning` or traceback in
  the restarted server's log), and none is older than before the kill: the history's clock and
  the evidence's answers never go back, a chat never loses a message it had;
- what the client saw finished is there: a response whose `response.completed` event arrived
  is stored with that text and the restarted server returns it (`GET /v1/responses/{id}`); a
  chat answer the page saw end is in its chat; the history holds at least one document per
  answer that ended;
- the pairing record (written by `tandem tune`, read by a load, never by these servers) is the
  same bytes throughout;
- the restarted server answers again, and the next write of a store removes what the killed
  writers left.

The kill points come from one seed (TANDEM_KILL_SEED, default `SEED`), printed with every
kill, so a failure is replayed by setting it. What happened is asserted, never when: a kill in a
write that the run did not reach is counted as such (the test then kills the server after its
answers). A few kills run in `scripts/test`; `LONG_KILLS` behind `long` (scripts/test --all).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from gradio_client import Client

from loading.calibrations import CalibrationFile, calibrations_path
from loading.chats import ChatStore
from loading.evidence import EvidenceFile, evidence_path, identity
from loading.history import HistoryStore
from loading.responses import ResponseStore
from models import tuned
from models.candidate import Candidate
from models.tuned import Choice, PairingRecord
from tests.appserver import free_port
from tests.fakeserve import HISTORY_TOKENIZER, STORE_KEY
from tests.serve_fakes import fake_pair

ROOT = Path(__file__).resolve().parents[1]
KEY = "kill-test-key"
SEED = 6406
STORES = ("RESPONSES", "HISTORY", "EVIDENCE", "CALIBRATIONS", "CHATS", "PAIRS")
# The stores each command writes (the kills inside a write choose among them).
WRITES = {"serve": ("responses", "history", "evidence", "calibrations"),
          "ui": ("chats", "history", "evidence", "calibrations")}
STEPS = ("written", "synced", "renamed")
# Answers a life asks for (a kill usually ends it sooner), and how long each is.
ANSWERS = {"serve": 4, "ui": 2}
MAX_TOKENS = 32
# Each target decode sleeps this long, so an answer streams over many events.
DECODE_S = "0.004"
DRAFTERS = ("draft", "lookup", "hybrid", "suffix")
START_TIMEOUT_S = 300
CHAIN_DEPTH = 3
LONG_KILLS = {"serve": 40, "ui": 10}
ANSWERED = "answered to the end"
MID_ANSWER = "killed by the test mid-answer"
NOT_REACHED = "killed after its answers (its kill point was not reached)"
QUESTIONS = ("Tell me about rivers.", "And mountains?", "Which is older?", "Why?")


@dataclass(frozen=True)
class Kill:
    """Where one life ends: `answer`'s `event`th event read (a stream kill), or the server's
    `nth` write of `store` at `step`, its temporary file cut to `fraction` at "written"."""
    answer: int = 0
    event: int = 0
    store: str = ""
    step: str = ""
    nth: int = 0
    fraction: float = 1.0

    @property
    def in_a_write(self) -> bool:
        return bool(self.store)

    def env(self) -> dict[str, str]:
        return {"TANDEM_KILL_AT": f"{self.store}:{self.step}:{self.nth}:{self.fraction}"} \
            if self.in_a_write else {}

    def __str__(self) -> str:
        if self.in_a_write:
            cut = f" ({self.fraction:.0%} of its bytes)" if self.step == "written" else ""
            return f"in write {self.nth} of the {self.store} at {self.step}{cut}"
        return f"after event {self.event} of answer {self.answer + 1}"


def random_kills(command: str, n: int, rng: random.Random) -> list[Kill]:
    kills = []
    for _ in range(n):
        if rng.random() < 0.5:
            kills.append(Kill(answer=rng.randrange(ANSWERS[command]),
                              event=rng.randrange(24 if command == "serve" else 3)))
        else:
            step = rng.choice(STEPS)
            kills.append(Kill(store=rng.choice(WRITES[command]), step=step,
                              nth=rng.randint(1, 3),
                              fraction=round(rng.random(), 2) if step == "written" else 1.0))
    return kills


# The few kills of scripts/test: one mid-stream, and one in a write of each kind of store.
DEFAULT_KILLS = {
    "serve": [Kill(answer=1, event=5), Kill(store="responses", step="written", nth=1,
                                            fraction=0.5),
              Kill(store="history", step="synced", nth=2)],
    "ui": [Kill(answer=1, event=1), Kill(store="chats", step="written", nth=2, fraction=0.3)],
}


@dataclass
class Seen:
    """What the client saw end, and the stores as last read, across the lives of one run."""
    completed: dict[str, str] = field(default_factory=dict)  # response id -> its text
    last_response: str | None = None
    chain: int = 0  # the responses its conversation holds
    chat_answers: list[tuple[str, str]] = field(default_factory=list)  # (question, answer)
    answers_ended: int = 0
    answers_started: int = 0
    clock: dict[str, int] = field(default_factory=dict)  # history file -> its clock
    evidence_answers: int = 0
    chat_messages: dict[str, list[dict]] = field(default_factory=dict)
    calibrated: set[str] = field(default_factory=set)
    outcomes: Counter = field(default_factory=Counter)


class Run:
    """One command's servers, one life after another, over stores in `tmp`."""

    def __init__(self, command: str, tmp: Path) -> None:
        self.command = command
        self.tmp = tmp
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "TANDEM_FAKE_STORES": "1",
                    "TANDEM_FAKE_DECODE_S": DECODE_S, "TANDEM_API_KEY": KEY,
                    **{f"TANDEM_{s}": str(tmp / s.lower()) for s in STORES}}
        self.seen = Seen()
        self.proc: subprocess.Popen | None = None
        self.lives = 0
        self.record = self._pairing_record()
        self.ident = identity(STORE_KEY, fake_pair())

    # --- the server -------------------------------------------------------------------

    def start(self, kill: Kill | None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.tmp / f"{self.command}.{self.lives}.log"
        self.lives += 1
        argv = [sys.executable, "-m", "tests.fakeserve", self.command, "--port", str(self.port)]
        if self.command == "ui":
            argv.append("--api")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         env={**self.env, **(kill.env() if kill else {})})
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._up():
            assert self.proc.poll() is None and time.monotonic() < deadline, \
                f"{self.command} did not come up: {self.log.read_text(errors='replace')}"
            time.sleep(0.3)

    def _up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)

    def died(self, wait_s: float = 0) -> bool:
        """Whether the server has exited; `wait_s`: how long to wait for an exit under way (a
        client sees the connection close before the process is gone)."""
        assert self.proc is not None
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    # --- one life ------------------------------------------------------------------------

    def life(self, kill: Kill | None) -> str:
        """Start the server, check what it reads back, ask for answers until `kill` ends it
        (or, with None, to the end); returns what happened: ANSWERED, MID_ANSWER, "in a write
        of STORE at STEP" or NOT_REACHED."""
        self.start(kill)
        self.check_served()
        for answer in range(ANSWERS[self.command]):
            stop_at = kill.event if kill is not None and not kill.in_a_write \
                and kill.answer == answer else None
            ended = self.answer(answer, stop_at)
            if stop_at is not None and not ended:
                self.kill()
                return MID_ANSWER
            if self.died():
                break
        if kill is None:
            assert not self.died(), self.log_text()
            return ANSWERED
        if self.died():
            self.proc.wait(60)
            assert self.proc.returncode == -signal.SIGKILL, self.log_text()
            return f"in a write of the {kill.store} at {kill.step}"
        self.kill()
        return NOT_REACHED

    def answer(self, i: int, stop_at: int | None) -> bool:
        """Answer `i` of this life, streamed; stops reading after `stop_at` events. True when
        the client saw it end."""
        self.seen.answers_started += 1
        try:
            ended = self._serve_answer(i, stop_at) if self.command == "serve" \
                else self._ui_answer(i, stop_at)
        except (httpx.HTTPError, ConnectionError, OSError, ValueError) as exc:
            # The server died under the client (a kill in a write).
            assert stop_at is not None or self.died(30), f"{exc!r}: {self.log_text()}"
            return False
        except Exception:  # noqa: BLE001 - gradio_client's errors when its server is gone
            if self.command == "ui" and (stop_at is not None or self.died(30)):
                return False
            raise
        if ended:
            self.seen.answers_ended += 1
        return ended

    def _serve_answer(self, i: int, stop_at: int | None) -> bool:
        headers = {"Authorization": f"Bearer {KEY}"}
        if i % 2 == 0:
            body: dict = {"input": QUESTIONS[i % len(QUESTIONS)], "stream": True,
                          "max_output_tokens": MAX_TOKENS}
            # Chained to the last response that ended, three deep at most (the fake's context
            # holds 256 tokens).
            if self.seen.last_response is not None and self.seen.chain < CHAIN_DEPTH:
                body["previous_response_id"] = self.seen.last_response
            path = "/v1/responses"
        else:
            body = {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                    "stream": True, "max_tokens": MAX_TOKENS,
                    "speculative": {"drafter": DRAFTERS[(self.lives + i) % len(DRAFTERS)]}}
            path = "/v1/chat/completions"
        n = 0
        with httpx.stream("POST", self.url + path, json=body, headers=headers,
                          timeout=120) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if n == stop_at:
                    return False
                n += 1
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    return True
                event = json.loads(data)
                if event.get("type") in ("response.completed", "response.incomplete"):
                    response = event["response"]
                    text = "".join(part["text"] for item in response["output"]
                                   if item["type"] == "message" for part in item["content"])
                    self.seen.completed[response["id"]] = text
                    self.seen.chain = self.seen.chain + 1 if "previous_response_id" in body else 1
                    self.seen.last_response = response["id"]
                    return True
        return False

    def _ui_answer(self, i: int, stop_at: int | None) -> bool:
        chats = ChatStore(self.tmp / "chats").list()
        chat = chats[0] if chats else None
        question = QUESTIONS[i % len(QUESTIONS)]
        client = Client(self.url, verbose=False)
        try:
            job = client.submit(
                question, [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                           for m in chat.messages] if chat else [],
                DRAFTERS[(self.lives + i) % len(DRAFTERS)], "adaptive", 3, 0.0, 0, 1.0, 0.0,
                -1, MAX_TOKENS, True, "off", "", chat.id if chat else "", api_name="/chat")
            # The page's updates as they arrive; a client left waiting on a dead server would
            # wait for ever, so the server's exit ends the wait.
            while not job.done():
                if stop_at is not None and len(job.outputs()) >= stop_at:
                    return False
                if self.proc is not None and self.proc.poll() is not None:
                    job.cancel()
                    return False
                time.sleep(0.01)
            history = job.result()[0]
        finally:
            client.close()
        content = history[-1]["content"]
        text = content if isinstance(content, str) else \
            "".join(part.get("text", "") for part in content)
        self.seen.chat_answers.append((question, text))
        return True

    # --- what the next start finds ---------------------------------------------------------

    def _pairing_record(self) -> bytes:
        record = PairingRecord(key=STORE_KEY, target="t.gguf", draft="d.gguf", adapter="",
                               adapter_scale=1.0, chosen=Choice(Candidate("draft"), n_prompts=3),
                               measured={"draft": {"n": 3}})
        return tuned.save(record).read_bytes()

    def check_stores(self, context: str) -> None:
        """The stores as the next start reads them: whole, and none older than before."""
        seen = self.seen
        corrupt = [p.name for p in self.tmp.rglob("*.corrupt-*")]
        assert not corrupt, f"{context}: set aside {corrupt}"
        # The pairing record: untouched.
        path = tuned.pairs_dir() / f"{STORE_KEY.id}.json"
        assert path.read_bytes() == self.record and tuned.find(STORE_KEY) is not None, context
        # Stored responses: each file whole; each one the client saw complete, there with its text.
        store = ResponseStore(self.tmp / "responses")
        for owner in (self.tmp / "responses").glob("*"):
            for f in owner.glob("resp_*.json"):
                assert store.get(owner.name, f.stem) is not None, f"{context}: {f.name}"
        for response_id, text in seen.completed.items():
            record = next((store.get(o.name, response_id)
                           for o in (self.tmp / "responses").glob("*")), None)
            assert record is not None, f"{context}: {response_id} completed but not stored"
            output = record["response"]["output"]
            assert "".join(p["text"] for item in output if item["type"] == "message"
                           for p in item["content"]) == text, context
        # The history: every owner's reads, its clock (a tick per document added or drafted
        # from) never goes back, and it holds a document for every answer that ended (saved
        # before the answer's last event), none for one never started.
        total = 0
        for f in (self.tmp / "history" / HISTORY_TOKENIZER).glob("*.npz"):
            index = HistoryStore(HISTORY_TOKENIZER, 1 << 20, self.tmp / "history").index(f.stem)
            assert index.clock >= seen.clock.get(f.name, 0), \
                f"{context}: history {f.name} went back"
            seen.clock[f.name] = index.clock
            total += index.n_documents
        assert seen.answers_ended <= total <= seen.answers_started, \
            f"{context}: history of {total} answers, {seen.answers_ended} ended, " \
            f"{seen.answers_started} started"
        # The evidence: whole, of this pair, its answers never fewer.
        evidence = evidence_path(STORE_KEY)
        if evidence.exists():
            kept = json.loads(evidence.read_text(encoding="utf-8"))
            assert kept["identity"] == self.ident, context
            answers = sum(d["answers"] for d in kept["drafters"].values())
            assert answers >= seen.evidence_answers, f"{context}: evidence went back"
            seen.evidence_answers = answers
            EvidenceFile(evidence, self.ident)
        # The calibrations: whole, each drafter kept stays kept.
        calibrations = CalibrationFile(calibrations_path(STORE_KEY), self.ident)
        kept_now = set(calibrations._drafters())
        assert seen.calibrated <= kept_now, f"{context}: calibrations lost"
        for name, entry in calibrations._drafters().items():
            assert calibrations.restore(name, entry["model"], 1) is not None, context
        seen.calibrated = kept_now
        # The chats: each whole, its turns ours, none lost; each answer the page saw end is there.
        for chat in ChatStore(self.tmp / "chats").list():
            messages = list(chat.messages)
            before = seen.chat_messages.get(chat.id, [])
            assert [m["content"] for m in messages if m["role"] == "user"][:1] and all(
                m["content"] in QUESTIONS for m in messages if m["role"] == "user"), context
            assert messages[:len(before)] == before, \
                f"{context}: chat {chat.id} lost a message"
            seen.chat_messages[chat.id] = messages
        turns = {(q["content"], a["content"]) for chat in seen.chat_messages.values()
                 for q, a in zip(chat, chat[1:]) if (q["role"], a["role"]) == ("user", "assistant")}
        assert set(seen.chat_answers) <= turns, f"{context}: an answer that ended is not saved"

    def check_served(self) -> None:
        """The restarted server: said nothing amiss, and returns what it stored."""
        if self.command == "serve":
            for response_id, text in self.seen.completed.items():
                r = httpx.get(f"{self.url}/v1/responses/{response_id}", timeout=60,
                              headers={"Authorization": f"Bearer {KEY}"})
                assert r.status_code == 200, r.text

    def check_log(self, context: str) -> None:
        log = self.log_text()
        assert "warning" not in log.lower() and "Traceback" not in log, f"{context}: {log}"

    def orphans(self) -> list[Path]:
        return list(self.tmp.rglob(".*.part"))


def run_kills(command: str, kills: list[Kill], tmp: Path, seed: int | None) -> Counter:
    run = Run(command, tmp)
    try:
        return _run_kills(run, kills, seed)
    finally:
        if run.proc is not None:
            run.kill()


def _run_kills(run: Run, kills: list[Kill], seed: int | None) -> Counter:
    command = run.command
    replay = f"TANDEM_KILL_SEED={seed}" if seed is not None else "the default kills"
    for i, kill in enumerate(kills, 1):
        context = f"{command} kill {i} of {len(kills)} ({kill}; replay: {replay})"
        outcome = run.life(kill)
        run.seen.outcomes[outcome] += 1
        print(f"{context}: {outcome}")
        run.check_stores(context)
        run.check_log(context)
    # The last start: it says nothing, answers to the end, and its writes sweep the leftovers.
    outcome = run.life(None)
    run.check_stores(f"{command} after the kills ({replay})")
    run.check_log(f"{command} after the kills")
    assert outcome == ANSWERED
    run.kill()
    left = run.orphans()
    assert left == [], f"{command}: the killed writers' temporary files are still there: {left}"
    print(f"{command}: {len(kills)} kills: {dict(run.seen.outcomes)}; "
          f"{len(run.seen.completed)} responses completed, {run.seen.answers_ended} of "
          f"{run.seen.answers_started} answers ended")
    return run.seen.outcomes


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    for s in STORES:
        monkeypatch.setenv(f"TANDEM_{s}", str(tmp_path / s.lower()))
    return tmp_path


@pytest.mark.parametrize("command", ["serve", "ui"])
def test_a_server_killed_mid_answer_starts_again_with_every_store_whole(command, isolated,
                                                                          capsys):
    with capsys.disabled():
        outcomes = run_kills(command, DEFAULT_KILLS[command], isolated, None)
    assert sum(outcomes.values()) == len(DEFAULT_KILLS[command])


@pytest.mark.long
@pytest.mark.parametrize("command", ["serve", "ui"])
def test_fifty_kills_and_restarts(command, isolated, capsys):
    seed = int(os.environ.get("TANDEM_KILL_SEED", SEED))
    kills = random_kills(command, LONG_KILLS[command], random.Random(f"{seed}-{command}"))
    with capsys.disabled():
        print(f"\n{command}: seed {seed}")
        outcomes = run_kills(command, kills, isolated, seed)
    # Most kills land where they were aimed: a stream kill mid-answer, a write kill in its write.
    assert outcomes[NOT_REACHED] <= len(kills) // 2, outcomes
