"""Predictor health (Signet): per session, NDCG@10 of the predictor's order vs the
baseline's on the feedback; an EMA of wins (alpha 0.1) sets the weight the predictor gets
when fused with the baseline. Early after a promotion the baseline keeps a floor; when the
win rate over a window drops below the threshold the predictor is flagged as drifting.

A session where both orders score the same NDCG is no evidence either way and moves
nothing: most sessions tie (the useful memories sit in both top tens), and counting ties
as half a win pulled every predictor's weight towards 0.5 whatever its record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mnemo_sidecar.config import HealthConfig
from mnemo_sidecar.learning.pair_store import PairStore


@dataclass(frozen=True)
class Health:
    sessions: int
    win_ema: float
    predictor_weight: float
    drift: bool
    window_win_rate: float
    window_predictor_ndcg: float
    window_baseline_ndcg: float


def win_of(predictor_ndcg: float, baseline_ndcg: float, tolerance: float = 1e-9) -> float | None:
    """1 for a win, 0 for a loss, None for a tie."""
    if predictor_ndcg > baseline_ndcg + tolerance:
        return 1.0
    if predictor_ndcg < baseline_ndcg - tolerance:
        return 0.0
    return None


def decided_win_rate(wins: Sequence[float | None]) -> float:
    """Share of the decided sessions won, with one win and one loss of prior (Laplace), so a
    handful of sessions cannot set the weight to 0 or 1 and none at all gives 0.5."""
    decided = [w for w in wins if w is not None]
    return (sum(decided) + 1.0) / (len(decided) + 2.0)


class HealthTracker:
    def __init__(self, store: PairStore, cfg: HealthConfig):
        self.store = store
        self.cfg = cfg

    def record(self, tenant: str, win: float | None) -> None:
        """After a session was stored; win is None when no predictor could be compared or
        the two orders tied."""
        alpha = self.cfg.alpha

        def after(ema: float, since_promotion: int, since_training: int) -> tuple[float, int, int]:
            if win is not None:
                ema = alpha * win + (1 - alpha) * ema
            return ema, since_promotion + 1, since_training + 1

        self.store.change_health_state(tenant, after)

    def on_promotion(self, tenant: str, heldout_win_rate: float = 0.5) -> None:
        """A new model's EMA starts from its win rate on the held-back sessions (the only
        evidence there is about it yet); live sessions then move it."""
        self.store.change_health_state(
            tenant, lambda _ema, _promo, since_training: (heldout_win_rate, 0, since_training)
        )

    def on_training(self, tenant: str, seen: int) -> None:
        """A run ended (or was refused) that began when `seen` sessions had come since the
        last: those that came while it ran count towards the next one (they were reset to 0,
        so "retrain every N" waited N more sessions after every run)."""

        def after(ema: float, since_promotion: int, since_training: int) -> tuple[float, int, int]:
            return ema, since_promotion, max(0, since_training - seen)

        self.store.change_health_state(tenant, after)

    def sessions_since_training(self, tenant: str) -> int:
        return self.store.health_state(tenant)[2]

    def snapshot(self, tenant: str, has_model: bool) -> Health:
        ema, since_promotion, _ = self.store.health_state(tenant)
        sessions, _ = self.store.counts(tenant)
        # The served model's own record: sessions judged before its promotion were its
        # predecessor's, and a model promoted because that one drifted started out flagged.
        window = self.store.recent_wins(tenant, self.cfg.drift_window, among_newest=since_promotion)
        rate = sum(w for w, _, _ in window) / len(window) if window else 0.5
        pred = [p for _, p, _ in window if p is not None]
        base = [b for _, _, b in window if b is not None]
        drift = len(window) >= self.cfg.drift_window and rate < self.cfg.drift_threshold
        weight = 0.0
        if has_model:
            weight = ema
            if since_promotion < self.cfg.early_sessions:
                weight = min(weight, 1.0 - self.cfg.early_min_baseline_weight)
            if drift:
                weight = min(weight, self.cfg.drift_predictor_weight)
        return Health(
            sessions,
            ema,
            round(weight, 4),
            drift,
            rate,
            sum(pred) / len(pred) if pred else 0.0,
            sum(base) / len(base) if base else 0.0,
        )
