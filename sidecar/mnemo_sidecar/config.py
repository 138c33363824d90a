"""Sidecar configuration: defaults < TOML file (`--config` / MNEMO_SIDECAR_CONFIG) <
MNEMO_SIDECAR_<SECTION>__<KEY> environment variables. Same loader rules as the server."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mnemo_server.config import apply_sections, read_toml, refuse_misspelt_settings, sections_from_env

ENV_PREFIX = "MNEMO_SIDECAR_"
Precision = Literal["fp32", "int8"]


@dataclass(frozen=True)
class SidecarServerConfig:
    host: str = "127.0.0.1"
    port: int = 50052
    max_workers: int = 16
    # Train streams followed at once: each holds one of the max_workers for its whole run,
    # so without a bound callers following a run left Score and Rerank no worker (probe: 16
    # followers, then every Score timed out unseen). More are RESOURCE_EXHAUSTED.
    max_train_streams: int = 4
    shutdown_grace_s: float = 3.0
    # When set, callers must send `authorization: Bearer <auth_token>`.
    auth_token: str = ""
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # glibc malloc thresholds for `mnemo-sidecar serve`, as the server's (process_memory.py;
    # 0: glibc's dynamic ones): a cross-encoder dropped from memory (cross_encoder.max_resident)
    # gives its ~100 MiB back to the system instead of leaving it in malloc's heap.
    malloc_mmap_threshold_kb: int = 128
    malloc_trim_threshold_kb: int = 1024


@dataclass(frozen=True)
class InferenceConfig:
    # Requests running inference at once, and waiting beyond those; the rest are shed.
    max_running: int = 2
    max_queued: int = 8
    # Threads per onnxruntime call.
    intra_op_threads: int = 1
    # Candidates scored per request at most (the server's session pool is at most 70).
    max_candidates: int = 100
    # Characters a query or a candidate's text may hold: the server's default limit on a
    # memory's content (limits.max_content_chars; a server allowed longer needs this raised
    # too, or its sessions go unranked). Longer is INVALID_ARGUMENT, not megabytes stored.
    max_text_chars: int = 20_000
    # Margin kept from the caller's deadline for the reply to travel back.
    deadline_margin_ms: float = 3.0
    # Where the embedding blend's model is prepared (~9 s the first time, at start-up, then
    # kept); empty: <data_dir>/embedder. Test runs point every sidecar they start at one.
    embedder_cache_dir: str = ""


@dataclass(frozen=True)
class CrossEncoderConfig:
    # A Hugging Face-format cross-encoder to serve (and to fine-tune from). Empty: the
    # sidecar serves no cross-encoder until one is trained from session feedback, and
    # fine-tunes from the bundled all-MiniLM-L6-v2.
    path: str = ""
    precision: Precision = "fp32"
    # The precision the sidecar's own fine-tunes (of the bundled MiniLM or of `path`) are
    # judged and served in. int8 measured as good as fp32 and faster, at a quarter of the
    # memory: on ../shared/rerank validation MRR@10 0.9055 vs 0.9047; on LoCoMo sessions,
    # judged alone on 43 held-back ones, NDCG@10 0.5664 vs 0.5628, scoring a head of 24 in
    # 219 vs 380 ms (different runs); a sidecar holding 12 tenants' fine-tunes: 1,002 vs
    # 1,359 MB after start-up, Rerank p50 51 vs 101 ms (mnemo-sidecar bench-residency).
    fine_tune_precision: Precision = "int8"
    # Candidates (best baseline first) the cross-encoder scores inside Score; the rest get
    # no cross-encoder feature (the ranker handles missing values).
    score_head: int = 24
    # The ranker takes a cross-encoder's scores as a feature only if scoring that head takes
    # at most this long here (median over held-back sessions, measured when training; 0: no
    # limit). Score answers inside StartSession's deadline (120 ms by default, the server's
    # own work included) and runs about twice as slow under load; MiniLM-L6 takes 270-370 ms
    # for 24 candidates on 2 cores in fp32, ~220 in int8. One too slow for that is judged alone (blended
    # with the baseline), for Recall's rerank, whose deadline is longer.
    feature_max_ms: float = 40.0
    # As the ranker's feature, a cross-encoder scores the heads of at most this many of the
    # newest sessions in a training run (0: all); older ones have no score, like candidates
    # beyond the head (the ranker handles missing values). A run scores each session with the
    # fine-tune, the current version and a fold model: at up to feature_max_ms a head, all
    # 20,000 sessions the store keeps would take up to 40 minutes; 2,000 up to 4.
    feature_max_sessions: int = 2_000
    # Tenants whose fine-tuned cross-encoders stay in memory, the most recently served (0: all).
    # Each holds ~65 MB in int8 (~95 MB in fp32); one dropped is loaded again by a
    # background thread on its tenant's next Rerank or Score (~0.4 s here), which is served
    # by the configured cross-encoder, or none, meanwhile.
    max_resident: int = 8
    # In-domain fine-tuning on session feedback (the recipe measured in shared/rerank's README:
    # per query its used memories, 12 hard negatives from the candidates and 3 random ones,
    # positives weighted 3x, 2 epochs).
    epochs: int = 2
    learning_rate: float = 5e-5
    batch_size: int = 16
    max_length: int = 128
    hard_negatives: int = 12
    random_negatives: int = 3
    positive_weight: float = 3.0
    max_pairs: int = 8_000
    # Seconds a fine-tune's training steps may take (0: no limit); a run whose pace does not
    # fit is cut to the steps that do, its learning rate still decaying to zero. 357 s here
    # for 2,865 pairs, so the 8,000-pair cap would take ~17 minutes and the whole training
    # run (held-back scoring, ranker) past the 20 its users were promised on 2 cores. Fold
    # models (cross_fit_folds) run the same share of their steps as the served one.
    fine_tune_max_s: float = 600.0
    # A fine-tune judged alone (blended with the baseline) is compared with the current
    # version on at most this many of the newest held-back sessions (0: all). It scores every
    # candidate of each, ~0.4 s a session in fp32 here, twice with a current version: at the
    # store's cap (4,000 held back) that alone would take ~1 hour.
    judge_max_sessions: int = 200
    # The ranker learns from the fine-tune's training sessions scored by fold models that
    # did not see them (learning/cross_fit.py): this many extra fine-tunes, each on the
    # other folds' sessions. 0 or 1: scored by the fine-tune itself.
    cross_fit_folds: int = 2
    # A background training (every `training.retrain_every` sessions) fine-tunes again only
    # once the sessions received since the last fine-tune reach (growth - 1) x the sessions
    # stored then: with 2, once the data has doubled (or, at the store's cap, been replaced).
    # Each fine-tune starts from the base on every session so far: 357 s of the 2 cores here
    # for 231 sessions (2,865 pairs), so about 17 minutes at the 8,000-pair cap; one every 50
    # sessions kept a busy tenant's sidecar training all the time. The ranker (seconds) still
    # trains every run; a Train call fine-tunes when asked. 1 or less: every background run.
    finetune_growth: float = 2.0


@dataclass(frozen=True)
class RankerConfig:
    # Strongly regularised: a few hundred sessions are little data, and the baseline it
    # competes with is already good (measured on LoCoMo: these beat the LightGBM defaults).
    num_leaves: int = 7
    n_estimators: int = 200
    learning_rate: float = 0.03
    min_child_samples: int = 50
    colsample_bytree: float = 0.8
    reg_lambda: float = 5.0
    # Once a ranker has earned promotion on the held-back sessions, fit it again on all of
    # them before serving: with a few hundred sessions every one counts (on LoCoMo, 221
    # sessions instead of 177 lifted the test split's NDCG@10 by about 0.01).
    refit_on_all: bool = True
    # Columns the ranker derives from the query and the texts (ranker/text_features.py):
    # what the question asks for, and whether a memory holds it (measured there).
    text_features: bool = True


@dataclass(frozen=True)
class TrainingConfig:
    # Sessions with feedback before the first model is trained (cold start before that).
    min_sessions: int = 30
    # Retrain in the background every this many new sessions.
    retrain_every: int = 50
    auto: bool = True
    # Share of sessions held back (the newest) to decide promotion.
    heldout_fraction: float = 0.2
    min_heldout: int = 8
    # A new version must beat the current one (or the baseline) by at least this NDCG@10.
    promote_margin: float = 0.0
    cross_encoder: bool = True
    ranker: bool = True
    torch_threads: int = 2
    # How much nicer than serving a training run's threads are (Linux; 0: the same): the
    # kernel then gives Score, Rerank and the server the cores first (learning/priority.py).
    nice: int = 10
    # And in Linux's idle scheduling class (SCHED_IDLE): a training thread then runs only on
    # a core no other thread wants, and a serving thread that wakes takes the core at once;
    # a nice value only shrinks its share (learning/priority.py has the figures). Under
    # load that never lets up a run barely advances: its time budgets end it, unpromoted.
    idle_class: bool = True
    # A training process still running after this long is killed and the run reported as
    # failed (0: no limit): a hung run would otherwise hold the tenant's training, which
    # every Train call and background run waits on, until the sidecar restarts. Runs keep
    # to cross_encoder.fine_tune_max_s (twice that with fold models) plus minutes of
    # scoring and ranker fits, so this is a watchdog, not a budget.
    max_run_s: float = 3600.0
    # A tenant's pair store keeps its newest this many sessions (0: all). Each training run
    # reads them all; the cross-encoder fine-tunes on at most cross_encoder.max_pairs of them.
    max_stored_sessions: int = 20_000


@dataclass(frozen=True)
class HealthConfig:
    alpha: float = 0.1
    # For the first sessions after a model is promoted the baseline keeps at least this weight.
    early_sessions: int = 20
    early_min_baseline_weight: float = 0.3
    # Drift: the predictor's win rate over the window falls below the threshold.
    drift_window: int = 20
    drift_threshold: float = 0.3
    # Weight the predictor keeps while drifting (a retrain is scheduled).
    drift_predictor_weight: float = 0.1


@dataclass(frozen=True)
class SidecarStorageConfig:
    # The sidecar's own directory (pair store, model versions, ONNX caches); it shares no
    # files with the server.
    data_dir: str = "./mnemo-sidecar-data"


@dataclass(frozen=True)
class SidecarConfig:
    server: SidecarServerConfig = field(default_factory=SidecarServerConfig)
    storage: SidecarStorageConfig = field(default_factory=SidecarStorageConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    cross_encoder: CrossEncoderConfig = field(default_factory=CrossEncoderConfig)
    ranker: RankerConfig = field(default_factory=RankerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    health: HealthConfig = field(default_factory=HealthConfig)

    @property
    def data_path(self) -> Path:
        return Path(self.storage.data_dir)

    @property
    def training_scratch(self) -> Path:
        """Where training processes keep their passing files (fold models of ~180 MB each,
        probe rankers): inside the data directory, not the system's temp, so that a process
        killed mid-run leaves nothing behind once the sidecar starts again and clears it."""
        return self.data_path / "training-scratch"

    def replace(self, **sections: Any) -> SidecarConfig:
        return apply_sections(self, sections, origin="override")


def load_sidecar_config(
    path: str | Path | None = None, env: Mapping[str, str] | None = None
) -> SidecarConfig:
    env = os.environ if env is None else env
    cfg = SidecarConfig()
    file = path or env.get("MNEMO_SIDECAR_CONFIG")
    if file:
        cfg = apply_sections(cfg, read_toml(Path(file)), origin=str(file))
    refuse_misspelt_settings(cfg, env, ENV_PREFIX)
    return apply_sections(cfg, sections_from_env(env, ENV_PREFIX), origin="environment")
