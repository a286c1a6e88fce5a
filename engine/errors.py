"""Errors a user can cause and fix; each carries a one-line message meant to be shown as is."""
from __future__ import annotations


class TandemError(Exception):
    """Base class: the CLI prints `error: <message>` and exits non-zero; the UI shows the message."""


class SettingsError(TandemError, ValueError):
    """A sampling or hardware setting is out of range."""


class ModelFileError(TandemError):
    """A model file is missing, unreadable, not GGUF, or truncated."""


class IncompatiblePairError(TandemError):
    """Target and draft cannot be paired (different tokenizers, for example)."""


class DoesNotFitError(TandemError):
    """Target, draft and their caches do not fit in this machine's memory."""


class HubError(TandemError):
    """The model hub could not be reached or refused a request."""


class DraftLawError(TandemError):
    """A drafter's tokens and the distribution it declared for them disagree (an engine bug:
    verifying such a proposal with the p/q rule would not be exact)."""


class DecodeError(TandemError):
    """llama.cpp refused a decode (a full cache, a batch it cannot schedule)."""
