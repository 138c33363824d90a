"""mnemo.ranking.v1.RankingService: thin; every inference call is bounded by the caller's
deadline and admitted through the gate (or shed)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc

from mnemo.ranking.v1 import ranking_service_pb2 as rpb
from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo_server.errors import ResourceExhausted, Unavailable
from mnemo_sidecar.api import convert
from mnemo_sidecar.api.stats import LatencyStats
from mnemo_sidecar.deadlines import AdmissionGate, Deadline
from mnemo_sidecar.engine import RankingEngine
from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.runner import TrainingRunner
from mnemo_sidecar.learning.trainer import sessions_until_fine_tune


class RankingServicer(rpb_grpc.RankingServiceServicer):
    def __init__(
        self, engine: RankingEngine, runner: TrainingRunner, gate: AdmissionGate, stats: LatencyStats
    ):
        self.engine = engine
        self.runner = runner
        self.gate = gate
        self.stats = stats
        self.cfg = engine.cfg
        self._train_streams = threading.BoundedSemaphore(self.cfg.server.max_train_streams)

    def _deadline(self, context: grpc.ServicerContext) -> Deadline:
        remaining = context.time_remaining()
        margin = self.cfg.inference.deadline_margin_ms / 1000.0
        return Deadline(None if remaining is None else remaining - margin, alive=context.is_active)

    def Rerank(self, request: rpb.RerankRequest, context: grpc.ServicerContext) -> rpb.RerankResponse:
        tenant = convert.tenant_of(request.tenant_id)
        inf = self.cfg.inference
        query = convert.query(request.query, "query", inf.max_text_chars)
        items = convert.candidates(
            list(request.candidates), "candidates", None, inf.max_candidates, inf.max_text_chars
        )
        deadline = self._deadline(context)
        with self.stats.track("Rerank", deadline), self.gate.admit(deadline):
            result = self.engine.rerank(tenant, query, items, deadline)
        method = (
            rpb.RERANK_METHOD_CROSS_ENCODER if result.cross_encoder else rpb.RERANK_METHOD_EMBEDDING_BLEND
        )
        return rpb.RerankResponse(
            scores=[
                rpb.CandidateScore(id=c.id, score=float(s)) for c, s in zip(items, result.scores, strict=True)
            ],
            method=method,
            model_version=result.version,
        )

    def Score(self, request: rpb.ScoreRequest, context: grpc.ServicerContext) -> rpb.ScoreResponse:
        tenant = convert.tenant_of(request.tenant_id)
        inf = self.cfg.inference
        query = convert.query(request.query, "query", inf.max_text_chars)
        names = convert.feature_names(request.feature_names, "feature_names")
        items = convert.candidates(
            list(request.candidates), "candidates", len(names), inf.max_candidates, inf.max_text_chars
        )
        deadline = self._deadline(context)
        with self.stats.track("Score", deadline), self.gate.admit(deadline):
            result = self.engine.score(tenant, query, names, items, deadline)
        if result.scores is None:
            return rpb.ScoreResponse(cold_start=True)
        return rpb.ScoreResponse(
            scores=[
                rpb.CandidateScore(id=c.id, score=float(s)) for c, s in zip(items, result.scores, strict=True)
            ],
            model_version=result.version,
            predictor_weight=result.predictor_weight,
        )

    def SubmitTrainingPairs(
        self, request: rpb.SubmitTrainingPairsRequest, context: grpc.ServicerContext
    ) -> rpb.SubmitTrainingPairsResponse:
        tenant = convert.tenant_of(request.tenant_id)
        inf = self.cfg.inference
        session = convert.feedback_session(request.session, inf.max_candidates * 4, inf.max_text_chars)
        with self.stats.track("SubmitTrainingPairs"):
            result = self.engine.submit(tenant, session, self._deadline(context))
        return rpb.SubmitTrainingPairsResponse(
            duplicate=result.duplicate,
            stored_pairs=result.stored_pairs,
            health=convert.health_pb(result.health),
            training_started=result.training_started,
        )

    def Train(self, request: rpb.TrainRequest, context: grpc.ServicerContext) -> Iterator[rpb.TrainResponse]:
        tenant = convert.tenant_of(request.tenant_id)
        kinds = convert.model_kinds(request.models)
        if not self._train_streams.acquire(blocking=False):
            raise ResourceExhausted(
                f"{self.cfg.server.max_train_streams} Train streams are being followed already "
                "(server.max_train_streams); call again once one ends",
                reason="TOO_MANY_TRAIN_STREAMS",
            )
        try:
            yield from self._follow(tenant, kinds, request.force, context)
        finally:
            self._train_streams.release()

    def _follow(
        self, tenant: str, kinds: set[ModelKind], force: bool, context: grpc.ServicerContext
    ) -> Iterator[rpb.TrainResponse]:
        run, _ = self.runner.start(tenant, kinds, force)
        for e in run.follow(alive=context.is_active):
            if not context.is_active():
                return  # the caller left; the run goes on in the background
            msg = rpb.TrainResponse(
                model=convert.KINDS_PB[e.model], stage=e.stage, progress=e.progress, message=e.message
            )
            if e.outcome is not None:
                msg.outcome.CopyFrom(convert.outcome_pb(e.outcome))
            yield msg
        if run.error is not None:
            raise run.error
        if run.failure:
            raise Unavailable(f"training failed: {run.failure}", reason="TRAINING_FAILED")

    def _note(self, tenant: str, has_ce: bool) -> str:
        registry = self.engine.registry
        notes = []
        if unloaded := registry.unloaded_version(tenant, ModelKind.CROSS_ENCODER):
            serving = "the configured cross-encoder" if has_ce else "the embedding blend"
            notes.append(
                f"the fine-tuned cross-encoder {unloaded} is not in memory (cross_encoder.max_resident "
                f"keeps {self.engine.cfg.cross_encoder.max_resident} tenants' loaded): the next "
                f"Rerank or Score loads it, {serving} serving meanwhile"
            )
        elif not has_ce:
            notes.append(
                "no cross-encoder configured or trained yet: Rerank uses the embedding blend "
                "(0.7 x first-stage + 0.3 x cosine)"
            )
        for kind in ModelKind:
            if why := registry.broken(tenant, kind):
                notes.append(f"the promoted {kind.value} does not load and is not served ({why})")
        # A ranker that loads but fails to score (ranker/model.py) shows only here and in logs.
        ranker = self.engine.ranker(tenant)
        if ranker is not None and ranker.model.failures:
            notes.append(
                f"the ranker {ranker.version} failed to score {ranker.model.failures} times since it loaded: "
                "those Scores fell back to the baseline (see the sidecar's log)"
            )
        if shadow := self.engine.shadow_failures.get(tenant, 0):
            notes.append(
                f"{shadow} submitted sessions were stored unjudged: the ranker failed their shadow prediction"
            )
        # sessions_until_fine_tune counts down to a fine-tune these settings never start.
        training = self.engine.cfg.training
        if not training.cross_encoder:
            notes.append("cross-encoder fine-tuning is switched off (training.cross_encoder = false)")
        if not training.auto:
            notes.append(
                "background training is switched off (training.auto = false): models train on a Train call"
            )
        return "; ".join(notes)

    def GetModelStatus(
        self, request: rpb.GetModelStatusRequest, context: grpc.ServicerContext
    ) -> rpb.GetModelStatusResponse:
        tenant = convert.tenant_of(request.tenant_id)
        ce, ce_source = self.engine.resident_cross_encoder(tenant)  # a status call loads nothing
        ce_version, ce_promoted_ns = self.engine.cross_encoder_name(tenant, ce) if ce else ("", 0)
        ranker = self.engine.ranker(tenant)
        sessions, pairs = self.engine.store.counts(tenant)
        resp = rpb.GetModelStatusResponse(
            cross_encoder=rpb.ModelInfo(
                kind=rpb.MODEL_KIND_CROSS_ENCODER,
                version=ce_version,
                ready=ce is not None,
                source=ce_source,
            ),
            ranker=rpb.ModelInfo(
                kind=rpb.MODEL_KIND_RANKER,
                version=ranker.version if ranker else "",
                ready=ranker is not None,
                source=ranker.source if ranker else "",
            ),
            health=convert.health_pb(self.engine.health.snapshot(tenant, ranker is not None)),
            stored_sessions=sessions,
            stored_pairs=pairs,
            training=self.runner.running(tenant),
            recent_outcomes=[convert.outcome_pb(o) for o in self.engine.store.outcomes(tenant)],
            cold_start=ranker is None,
            note=self._note(tenant, ce is not None),
            sessions_until_fine_tune=sessions_until_fine_tune(
                self.engine.store.last_fine_tune(tenant),
                self.engine.store.session_mark(tenant),
                self.engine.cfg.cross_encoder.finetune_growth,
            ),
            resident_cross_encoders=convert.residency_pb(
                self.engine.registry.residency(ModelKind.CROSS_ENCODER)
            ),
        )
        if ranker is not None:
            resp.ranker.promote_time.FromNanoseconds(ranker.promote_time_ns)
        if ce_promoted_ns:
            resp.cross_encoder.promote_time.FromNanoseconds(ce_promoted_ns)
        for name, s in self.stats.snapshot().items():
            resp.latency[name].CopyFrom(
                rpb.LatencyStats(
                    calls=s.calls,
                    p50_ms=s.percentile(0.5),
                    p99_ms=s.percentile(0.99),
                    deadline_exceeded=s.deadline_exceeded,
                    shed=s.shed,
                )
            )
        return resp
