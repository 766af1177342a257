"""The overview's problem banner: what needs an operator, read from the overview's own
snapshot (views.overview) and the Limits page's counts (views.limits_held).

Each problem: {"kind", "message", "href" (where to look; None: on this page)}, in the
order an operator would act on them.
"""

from __future__ import annotations

from typing import Any

from pgworkerd.durations import format_duration

# A due job waiting longer than this is a problem: nothing claims it, or too slowly.
OLDEST_DUE_PROBLEM_SECONDS = 300.0


def problems(
    snap: dict[str, Any],
    jobs_url: str,
    paused_url: str,
    limits: list[dict[str, Any]] | None = None,
    limits_url: str = "",
) -> list[dict[str, Any]]:
    """What the banner lists for an overview snapshot (jobs_url: the jobs page, for the
    dead jobs' link; paused_url: the paused page; limits: views.limits rows with
    views.limits_held's counts, and limits_url their page)."""
    found: list[dict[str, Any]] = []
    dead = sum(minute.get("dead", 0) for minute in snap.get("throughput", []))
    if dead:
        found.append(
            {
                "kind": "dead",
                "message": f"{dead} job(s) died in the last hour (no attempt left)",
                "href": f"{jobs_url}?status=dead",
            }
        )
    silent = [
        d["id"] for d in snap.get("daemons", []) if d.get("silent") and d.get("state") != "gone"
    ]
    if silent:
        found.append(
            {
                "kind": "silent",
                "message": f"{len(silent)} daemon(s) silent (no heartbeat): "
                + ", ".join(str(d) for d in silent[:5])
                + (f" and {len(silent) - 5} more" if len(silent) > 5 else ""),
                "href": None,
            }
        )
    unserved = snap.get("unserved", [])
    if unserved:
        handlers = sorted({str(u["handler"]) for u in unserved})
        jobs = sum(int(u["jobs"]) for u in unserved)
        found.append(
            {
                "kind": "unserved",
                "message": f"{jobs} pending job(s) of {len(handlers)} handler(s) no live "
                "daemon serves: "
                + ", ".join(handlers[:5])
                + (f" and {len(handlers) - 5} more" if len(handlers) > 5 else ""),
                "href": None,
            }
        )
    paused = snap.get("paused", [])
    if paused:
        names = [_paused_name(p) for p in paused]
        found.append(
            {
                "kind": "paused",
                "message": f"{len(paused)} paused: "
                + ", ".join(names[:5])
                + (f" and {len(names) - 5} more" if len(names) > 5 else ""),
                "href": paused_url,
            }
        )
    held = [
        (str(r["handler"]), int(r["held_by_max"]) + int(r["held_by_key"]))
        for r in limits or []
        if r.get("held_by_max") or r.get("held_by_key")
    ]
    if held:
        held.sort(key=lambda h: (-h[1], h[0]))
        found.append(
            {
                "kind": "limits",
                "message": f"{sum(n for _, n in held)} due job(s) held back by limits: "
                + ", ".join(f"{name} ({n})" for name, n in held[:5])
                + (f" and {len(held) - 5} more" if len(held) > 5 else ""),
                "href": limits_url,
            }
        )
    oldest = snap.get("oldest_pending_seconds")
    if oldest is not None and oldest > OLDEST_DUE_PROBLEM_SECONDS:
        found.append(
            {
                "kind": "oldest-due",
                "message": "the oldest due job has waited "
                + format_duration(float(oldest), rounded=True)
                + f" (over {format_duration(OLDEST_DUE_PROBLEM_SECONDS, rounded=True)})",
                "href": f"{jobs_url}?status=pending",
            }
        )
    return found


# Characters of a pause's reason the banner shows (the Paused page shows it whole).
BANNER_REASON_CHARS = 80


def _paused_name(p: dict[str, Any]) -> str:
    """A pause as the banner names it: what, by whom (the person, else the role), why."""
    by = p.get("requested_by") or p.get("paused_by") or "?"
    reason = p.get("comment") or ""
    if len(reason) > BANNER_REASON_CHARS:
        reason = reason[:BANNER_REASON_CHARS] + "…"
    return f"{p['kind']} {p['name']} (by {by}{': ' + reason if reason else ''})"
