"""What ``jzero plan --search`` prints: the certified candidates ranked by predicted tokens/s, the
Pareto front of device peak against speed, and why the winner wins; and the same as JSON."""

from __future__ import annotations

from typing import Any

from jzero.planner.search import Row, Search, pareto
from jzero.records import to_json

__all__ = ["format_search", "search_json", "why_it_wins"]

SHOWN = 12  # ranked rows printed; the Pareto front's are printed too
_TERMS = {
    "compute_s": "compute",
    "exposed_communication_s": "exposed communication",
    "host_transfer_s": "host transfers",
    "memory_s": "HBM",
}


def why_it_wins(result: Search) -> str:
    """One sentence: against the runner-up (and your config), the term of the predicted step that
    differs the most."""
    ranked = result.certified
    if not ranked:
        return ""
    winner = ranked[0]
    text = f"{winner.label} is the fastest of {len(ranked)} certified candidates"
    if len(ranked) > 1:
        text += f": {_against(winner, ranked[1])}"
    yours = result.yours
    if yours is not winner and yours.fits:
        text += f"; {winner.tokens_per_sec / yours.tokens_per_sec:.2f}x your config's tokens/s ({_against(winner, yours)})"
    return text


TIE = 1e-3  # predictions this close are a tie: the model is not that precise


def _against(winner: Row, other: Row) -> str:
    if winner.tokens_per_sec <= other.tokens_per_sec * (1 + TIE):
        return f"it ties with {other.label} (within {TIE:.1%} of its predicted tokens/s)"
    a, b = winner.report.predicted, other.report.predicted
    key = max(_TERMS, key=lambda k: getattr(b, k) - getattr(a, k))
    ours, theirs = getattr(a, key), getattr(b, key)
    return (
        f"{1e3 * (theirs - ours):.3g} ms less {_TERMS[key]} than {other.label} ({1e3 * ours:.4g} against {1e3 * theirs:.4g} ms)"
    )


def _line(rank: str, row: Row, front: set[int]) -> str:
    p = row.report.predicted
    mark = "*" if id(row) in front else ""
    return (
        f"{rank:>4}  {p.tokens_per_sec:>12,.0f}  {100 * p.mfu:5.1f}%  {1e3 * p.step_time_s:>9.4g}  "
        f"{row.report.device_peak / 2**30:>8.2f}  {mark:^6}  {row.label}"
    )


def format_search(result: Search) -> str:
    """The search's text: what was considered and compiled, the ranked table, the front, the winner."""
    ranked = result.certified
    front = {id(r) for r in pareto(ranked)}
    compiled = [r for r in result.rows if r.report]
    failed = [r for r in result.rows if r.error]
    budget = result.memory_per_device / 1e9
    lines = [
        f"searched {result.considered:,} candidates for {result.target} within {budget:.4g} GB per device in "
        f"{result.elapsed_s:.0f} s: {result.over_budget:,} over budget by the estimate, {result.refused:,} refused by "
        f"validation, {len(compiled)} compiled ({len(ranked)} certified to fit by the compiled device peak, "
        f"{len(failed)} failed to compile), {result.left:,} left when --time-budget ({result.time_budget_s:.0f} s) ran out",
        "",
        f"{'rank':>4}  {'tokens/s':>12}  {'MFU':>6}  {'step ms':>9}  {'peak GiB':>8}  {'pareto':^6}  candidate (predicted)",
    ]
    for i, row in enumerate(ranked[:SHOWN], 1):
        lines.append(_line(str(i), row, front))
    for i, row in enumerate(ranked[SHOWN:], SHOWN + 1):
        if id(row) in front:
            lines.append(_line(str(i), row, front))
    if not result.yours.fits:
        why = result.yours.error or f"device peak {result.yours.report.device_peak / 2**30:.2f} GiB"
        lines.append(f"your config does not fit: {why}")
    lines += ["", "* on the Pareto front: no other certified candidate has a smaller peak and more tokens/s", why_it_wins(result)]
    return "\n".join(lines)


def _row_json(row: Row, front: set[int]) -> dict[str, Any]:
    report = to_json(row.report) if row.report else {}
    return {
        "label": row.label,
        "sets": row.sets,
        "estimated_bytes": row.estimated_bytes,
        "estimated_tokens_per_sec": row.estimated_tokens_per_sec,
        "device_peak": report.get("device_peak"),
        "fits": row.fits,
        "pareto": id(row) in front,
        "predicted": report.get("predicted"),
        "error": row.error,
    }


def search_json(result: Search) -> dict[str, Any]:
    """The winner's plan report with ``search``: the counts, every compiled row and why the winner wins."""
    front = {id(r) for r in pareto(result.certified)}
    winner = result.winner
    return {
        **(to_json(winner.report) if winner else {}),
        "search": {
            "target": result.target,
            "memory_per_device": result.memory_per_device,
            "time_budget_s": result.time_budget_s,
            "elapsed_s": result.elapsed_s,
            "considered": result.considered,
            "over_budget": result.over_budget,
            "refused": result.refused,
            "left": result.left,
            "winner": winner.label if winner else None,
            "winner_sets": winner.sets if winner else None,
            "why": why_it_wins(result),
            "rows": [_row_json(r, front) for r in result.rows],
        },
    }
