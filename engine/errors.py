"""Errors a user can cause and fix; each carries a one-line message meant to be shown as is."""
from __future__ import annotations


class TandemError(Exception):
    """Base class: the CLI prints `error: <message>` and exits non-zero; the UI shows the message."""


class SettingsError(TandemError, ValueError):
    """A sampling or hardware setting is out of range."""


class PromptTooLongError(SettingsError):
    """The prompt leaves the context no position for the answer."""


class ModelFileError(TandemError):
    """A model file is missing, unreadable, not GGUF, or truncated."""


def store_write_error(name: str, folder: object, exc: OSError) -> ModelFileError:
    """A file the model store could not take (full, read-only), with what to do about it."""
    return ModelFileError(f"could not write {name} into the model store {folder}: "
                          f"{exc.strerror or exc}; free some space, or point TANDEM_MODELS "
                          "at a writable folder")


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


class GrammarError(SettingsError):
    """A JSON schema or grammar the constraint engine refuses (its message says why), or an
    answer the grammar cannot continue."""
