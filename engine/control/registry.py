"""Gamma policies by name (the --policy choices): the simple ones of `engine.control.policy` and the
adaptive controller of `engine.control.controller`."""
from __future__ import annotations

from engine.control.controller import AdaptiveController
from engine.errors import SettingsError
from engine.control.policy import FixedGamma, GammaPolicy, HeuristicGamma, NeverDraft

POLICIES = ("adaptive", "fixed", "heuristic", "plain")


def make_policy(name: str, gamma: int, opening: int | None = None, **calibration) -> GammaPolicy:
    """A policy by name. `gamma` is the fixed gamma, the heuristic's start, or the adaptive
    controller's maximum; `opening` its plain opening tokens (None: the default);
    `calibration` (Calibration.as_kwargs()) feeds the adaptive one, which without it is
    calibrated by `Pair.generate` before its first round."""
    if name == "fixed":
        return FixedGamma(gamma)
    if name == "heuristic":
        return HeuristicGamma(gamma)
    if name == "plain":
        return NeverDraft()
    if name == "adaptive":
        if opening is not None:
            calibration["opening_plain"] = opening
        return AdaptiveController(max_gamma=gamma, **calibration)
    raise SettingsError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
