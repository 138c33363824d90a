"""Synthetic but varied memory text for load tests: sentences recombined from parts, so
every memory differs, vocabulary overlaps the way real notes do, and lengths vary."""

from __future__ import annotations

import random

_PEOPLE = [
    "Ana",
    "Bilal",
    "Chen",
    "Dara",
    "Emeka",
    "Farah",
    "Goran",
    "Hana",
    "Ivo",
    "Jun",
    "Kemal",
    "Lena",
    "Marco",
    "Nia",
    "Oskar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tomas",
    "Uma",
    "Viktor",
    "Wen",
    "Yusuf",
]
_SYSTEMS = [
    "the billing service",
    "the search cluster",
    "the mobile app",
    "the data pipeline",
    "the auth gateway",
    "the staging database",
    "the CI runners",
    "the recommendation model",
    "the payments API",
    "the onboarding flow",
    "the analytics dashboard",
    "the notification worker",
    "the CDN config",
    "the feature-flag service",
    "the export job",
    "the metrics exporter",
]
_ACTIONS = [
    "migrated",
    "rolled back",
    "load-tested",
    "refactored",
    "deployed",
    "profiled",
    "patched",
    "documented",
    "reviewed",
    "upgraded",
    "benchmarked",
    "paused",
    "re-indexed",
    "split",
    "audited",
]
_REASONS = [
    "because latency doubled under load",
    "after a memory leak was found",
    "to cut cloud costs",
    "since the vendor deprecated the old API",
    "because customers reported timeouts",
    "to prepare for the quarterly release",
    "after the security review",
    "to unblock the mobile team",
    "because error rates crossed two percent",
    "while the on-call rotation was short-staffed",
]
_TIMES = [
    "on Monday",
    "last Tuesday",
    "in early March",
    "before the holidays",
    "during the outage",
    "at the end of the sprint",
    "on the 14th",
    "over the weekend",
    "in Q3",
    "yesterday evening",
]
_PREFS = [
    "prefers dark mode",
    "likes short status updates",
    "wants tests before every deploy",
    "reads the changelog every Friday",
    "uses vim keybindings",
    "asks for metrics in milliseconds",
    "prefers async standups",
    "keeps notes in Markdown",
    "dislikes meetings after 4pm",
    "wants alerts routed to Slack",
]
_FOLLOWUPS = [
    "Next step is a canary in one region.",
    "The dashboard now shows p99 per endpoint.",
    "Nobody owns the cleanup yet.",
    "A runbook entry was added.",
    "The fix needs a second review.",
    "Rollout resumes once the flag is green.",
    "We should revisit this in two weeks.",
    "",
]


def sentence(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        text = (
            f"{rng.choice(_PEOPLE)} {rng.choice(_ACTIONS)} {rng.choice(_SYSTEMS)} {rng.choice(_TIMES)} "
            f"{rng.choice(_REASONS)}."
        )
    elif kind < 0.75:
        text = f"{rng.choice(_PEOPLE)} {rng.choice(_PREFS)} and {rng.choice(_PREFS)}."
    else:
        text = (
            f"Decision: {rng.choice(_SYSTEMS)} will be {rng.choice(_ACTIONS)} {rng.choice(_TIMES)} "
            f"{rng.choice(_REASONS)}; {rng.choice(_PEOPLE)} owns it."
        )
    follow = rng.choice(_FOLLOWUPS)
    return f"{text} {follow}".strip()


def memory_text(rng: random.Random, n: int, run: str = "") -> str:
    """The n-th memory: one or two sentences plus a ticket number, so texts never repeat
    within a run; `run` (a run's id) in the ticket keeps them apart from an earlier run's."""
    parts = [sentence(rng)]
    if rng.random() < 0.3:
        parts.append(sentence(rng))
    ticket = f"{run}-{n}" if run else str(n)
    return " ".join(parts) + f" (ticket {ticket})"


def query_text(rng: random.Random) -> str:
    shapes = [
        lambda: f"what happened to {rng.choice(_SYSTEMS)}?",
        lambda: f"why was {rng.choice(_SYSTEMS)} {rng.choice(_ACTIONS)}",
        lambda: f"what does {rng.choice(_PEOPLE)} prefer",
        lambda: f"who owns {rng.choice(_SYSTEMS)}",
        lambda: f"{rng.choice(_ACTIONS)} {rng.choice(_SYSTEMS)} {rng.choice(_TIMES)}",
        lambda: f"decisions about {rng.choice(_SYSTEMS)}",
    ]
    return rng.choice(shapes)()


def fresh_query_text(rng: random.Random) -> str:
    """A query that does not repeat: a template query plus a made-up word no memory holds
    (26^6 of them), so the server embeds every one, as it would an agent's own questions,
    while full-text search meets one unknown term more."""
    word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
    return f"{query_text(rng)} {word}"
