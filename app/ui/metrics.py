"""HTML for generation statistics: the live metrics panel (with the prompt tokens the KV cache
held), the context meter, the acceptance-by-position chart and the token view coloured by origin
(the tokens a grammar forced in their own colour), with its legend.

Everything is inline-styled HTML built from `GenerationStats` and token events, so it renders
the same in any theme and costs no plotting library on a CPU that is busy decoding.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from engine.events import FORCED
from engine.stats import GenerationStats

# Colours chosen to stay readable on light and dark backgrounds.
ORIGIN_COLORS: dict[str, str] = {
    "draft": "#2e9d57",
    "correction": "#d9534f",
    "bonus": "#3b7dd8",
    "plain": "#8a8f98",
    FORCED: "#9b59b6",
}
ORIGIN_LABELS: dict[str, str] = {
    "draft": "draft token accepted by the target",
    "correction": "target's correction after a rejection",
    "bonus": "target's bonus token (whole draft accepted)",
    "plain": "target alone (plain decoding)",
    FORCED: "forced by the grammar (the only token it allows; no model asked)",
}


@dataclass(frozen=True)
class Piece:
    text: str
    origin: str


def live_tokens_per_s(stats: GenerationStats, done: bool) -> float:
    """Output tokens per second of decoding; mid-run the decode clock is not final, so the
    rounds' draft + verify time stands in for it."""
    if done:
        return stats.tokens_per_s
    busy_ms = stats.draft_time_ms + stats.verify_time_ms
    return stats.output_tokens / (busy_ms / 1e3) if busy_ms > 0 else 0.0


def _card(label: str, value: str, hint: str = "") -> str:
    title = f' title="{html.escape(hint)}"' if hint else ""
    return (f'<div class="tandem-card"{title} style="flex:1 1 7.5em;min-width:7.5em;padding:6px 10px;'
            f'border:1px solid rgba(128,128,128,.35);border-radius:8px">'
            f'<div style="font-size:.75em;opacity:.75">{html.escape(label)}</div>'
            f'<div style="font-size:1.25em;font-weight:600">{html.escape(value)}</div></div>')


def position_chart(stats: GenerationStats) -> str:
    """Bars of acceptance rate at each draft position (how far into a draft the target agrees)."""
    rates = stats.acceptance_by_position
    if not rates:
        return '<div class="tandem-chart" style="opacity:.7;font-size:.85em">no drafted tokens yet</div>'
    bars = []
    for i, (rate, n) in enumerate(zip(rates, stats.drafted_at)):
        pct = 100.0 * rate
        bars.append(
            f'<div style="display:flex;align-items:center;gap:6px;font-size:.8em">'
            f'<span style="width:2.2em;text-align:right">#{i + 1}</span>'
            f'<span style="flex:1;background:rgba(128,128,128,.18);border-radius:3px;height:12px">'
            f'<span style="display:block;width:{pct:.1f}%;height:12px;border-radius:3px;'
            f'background:{ORIGIN_COLORS["draft"]}"></span></span>'
            f'<span style="width:7.5em">{pct:.0f}% of {n}</span></div>')
    return ('<div class="tandem-chart"><div style="font-size:.8em;opacity:.75;margin-bottom:2px">'
            'acceptance by draft position</div>' + "".join(bars) + "</div>")


def live_panel(stats: GenerationStats | None, done: bool = False, note: str = "") -> str:
    """The metrics panel: rates, per-round timings, TTFT and the position chart."""
    if stats is None:
        body = '<div style="opacity:.7">send a message to see live statistics</div>'
        return f'<div class="tandem-metrics" data-state="idle">{body}</div>'
    rounds = max(stats.rounds, 1)
    speculative = stats.mode == "speculative"
    cards = [
        _card("tokens/s", f"{live_tokens_per_s(stats, done):.2f}", "output tokens per second of decoding"),
        _card("acceptance", f"{100 * stats.acceptance_rate:.0f}%" if speculative else "n/a",
              "accepted drafted tokens / drafted tokens"),
        _card("accepted / target call", f"{stats.accepted_per_target_call:.2f}" if speculative else "n/a",
              "drafted tokens accepted per target forward pass"),
        _card("draft ms / round", f"{stats.draft_time_ms / rounds:.0f}" if speculative else "n/a"),
        _card("verify ms / round", f"{stats.verify_time_ms / rounds:.0f}",
              "target forward pass over the drafted tokens"),
        _card("TTFT ms", f"{stats.ttft_ms:.0f}" if stats.ttft_ms else "…", "time to first token"),
        _card("prompt from cache", f"{stats.prompt_cached_tokens} / {stats.prompt_tokens}",
              "prompt tokens the KV cache already held from the previous turn"),
        _card("prompt computed", f"{stats.prompt_computed_tokens}",
              "prompt tokens decoded for this turn"),
    ]
    if stats.forced_tokens:
        share = stats.forced_tokens / max(stats.output_tokens, 1)
        cards.append(_card("forced", f"{stats.forced_tokens} ({100 * share:.0f}%)",
                           "tokens the grammar allowed alone, committed without asking a model"))
    state = "done" if done else "running"
    head = (f'<div style="font-size:.8em;opacity:.8;margin-bottom:4px">{html.escape(stats.mode)}'
            f'{" · " + html.escape(stats.drafter) if speculative else ""}'
            f' · {stats.output_tokens} tokens · {stats.rounds} target calls · {state}'
            f'{" (" + html.escape(stats.finish_reason) + ")" if done and stats.finish_reason else ""}'
            f'{" · " + html.escape(note) if note else ""}</div>')
    chart = position_chart(stats) if speculative else ""
    why = (f'<div class="tandem-reason" style="font-size:.8em;opacity:.8;margin-bottom:6px">'
           f'controller: {html.escape(stats.reason)}</div>' if speculative and stats.reason else "")
    return (f'<div class="tandem-metrics" data-state="{state}" data-tokens="{stats.output_tokens}">'
            f'{head}<div style="display:flex;flex-wrap:wrap;gap:6px;margin-bottom:8px">{"".join(cards)}</div>'
            f'{why}{chart}</div>')


def context_meter(used: int | None, n_ctx: int | None, note: str = "") -> str:
    """Tokens in the context out of its size, as a bar; `note` says what the overflow policy
    left out. Unknown (no model loaded, nothing sent): a dash."""
    if used is None or not n_ctx:
        return ('<div class="tandem-context" data-used="" data-ctx="" style="font-size:.8em;'
                'opacity:.75">context: –</div>')
    share = min(used / n_ctx, 1.0)
    color = "#d9534f" if share > 0.9 else "#e0a43b" if share > 0.7 else "#3b7dd8"
    said = (f'<div class="tandem-dropped" style="margin-top:2px">{html.escape(note)}</div>'
            if note else "")
    return (f'<div class="tandem-context" data-used="{used}" data-ctx="{n_ctx}" '
            f'style="font-size:.8em">context: <b>{used:,} / {n_ctx:,}</b> tokens '
            f'({100 * share:.0f}%)<div style="height:6px;border-radius:3px;margin-top:2px;'
            f'background:rgba(128,128,128,.25)"><div style="width:{100 * share:.1f}%;height:6px;'
            f'border-radius:3px;background:{color}"></div></div>{said}</div>')


def legend(origins: tuple[str, ...] = tuple(ORIGIN_COLORS)) -> str:
    items = "".join(
        f'<span style="display:inline-flex;align-items:center;gap:4px;margin-right:12px">'
        f'<span style="width:12px;height:12px;border-radius:3px;background:{ORIGIN_COLORS[o]}"></span>'
        f'{html.escape(ORIGIN_LABELS[o])}</span>' for o in origins)
    return f'<div class="tandem-legend" style="font-size:.8em;margin-bottom:6px">{items}</div>'


def token_view(pieces: list[Piece]) -> str:
    """The answer with each token underlined in its origin's colour; the legend sits on top."""
    spans = []
    for p in pieces:
        if not p.text:
            continue
        color = ORIGIN_COLORS.get(p.origin)
        text = html.escape(p.text)
        if color is None:
            spans.append(f"<span>{text}</span>")
        else:
            spans.append(f'<span class="tok-{p.origin}" title="{p.origin}" style="background:{color}26;'
                         f'border-bottom:2px solid {color}">{text}</span>')
    counts = {o: sum(1 for p in pieces if p.origin == o) for o in ORIGIN_COLORS}
    summary = " · ".join(f"{n} {o}" for o, n in counts.items() if n)
    return (f'<div class="tandem-tokens">{legend()}'
            f'<div style="white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85em;'
            f'line-height:1.6">{"".join(spans)}</div>'
            f'<div style="font-size:.75em;opacity:.7;margin-top:4px">{html.escape(summary)}</div></div>')
