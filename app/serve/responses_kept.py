"""A /v1/responses request's stored responses: its owner's (the API key's, as for the history:
app/serve/routes.py `history_owner`) in loading/responses.py's store.

A request with `previous_response_id` continues that response's conversation: its items are
read before the request's own (`parse`), from the store of the request's owner only, so an
unknown id and another key's id are both 404. Re-prefilled, the conversation's prefix is what
the slot's KV cache may still hold (the slot is chosen by the longest shared prefix:
engine/slots.py), and `usage.input_tokens_details.cached_tokens` says how much it held.

With `store` true (OpenAI's default) the finished response is kept (`keep`) with the
conversation it ends (the items it continued, its input, its output), and `GET` / `DELETE
/v1/responses/{id}` find it. A response that cannot be stored (a full disk) is still answered,
with one warning line.
"""
from __future__ import annotations

import logging
import time

from app.runtime.request import Offer
from app.serve.errors import BadRequestError, NotFoundError
from app.serve.parsing import GenerationRequest
from app.serve.responses_request import input_items, parse_responses
from loading.responses import ResponseStore

log = logging.getLogger("tandem.serve")


class KeptResponses:
    """One request's view of the stored responses, and the conversation it continues."""

    def __init__(self, store: ResponseStore, owner: str) -> None:
        self.store = store
        self.owner = owner
        self.earlier: list[dict] = []

    def parse(self, body: dict, offer: Offer) -> GenerationRequest:
        """The request, after the items of the response it continues (404 when unknown)."""
        previous = body.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str):
                raise BadRequestError("previous_response_id must be a string",
                                      param="previous_response_id")
            record = self.store.get(self.owner, previous)
            if record is None:
                raise NotFoundError(f"no stored response {previous!r:.80}",
                                    param="previous_response_id")
            self.earlier = list(record.get("conversation") or [])
        return parse_responses(body, offer, self.earlier)

    def keep(self, body: dict, response: dict) -> None:
        """Store the finished `response` unless the request said `store: false`."""
        if not body.get("store", True):
            return
        record = {"id": response["id"], "stored_at": time.time(),
                  "conversation": [*self.earlier, *input_items(body), *response["output"]],
                  "response": response}
        try:
            self.store.put(self.owner, record)
        except OSError as exc:
            log.warning("response %s not stored: %s", response["id"], exc.strerror or exc)

    def get(self, response_id: str) -> dict:
        record = self.store.get(self.owner, response_id)
        if record is None:
            raise NotFoundError(f"no stored response {response_id!r:.80}")
        return record["response"]

    def delete(self, response_id: str) -> dict:
        if not self.store.delete(self.owner, response_id):
            raise NotFoundError(f"no stored response {response_id!r:.80}")
        return {"id": response_id, "object": "response", "deleted": True}
