"""The sidecar's composition root: stores, models, trainer and the gRPC server, from one
SidecarConfig. Nothing is shared with the server process but the wire contract."""

from __future__ import annotations

import logging
import os
import shutil

from mnemo.ranking.v1 import ranking_service_pb2_grpc as rpb_grpc
from mnemo_server.api.interceptor import ApiInterceptor
from mnemo_server.api.server import GrpcServer, listen_address
from mnemo_server.config import ServerConfig
from mnemo_server.errors import Unauthenticated
from mnemo_server.store.database import make_data_dir
from mnemo_server.tenancy.tenants import Principal
from mnemo_sidecar.api.ranking_servicer import RankingServicer
from mnemo_sidecar.api.stats import LatencyStats
from mnemo_sidecar.config import SidecarConfig
from mnemo_sidecar.data_lock import hold_data_dir
from mnemo_sidecar.deadlines import AdmissionGate
from mnemo_sidecar.engine import RankingEngine
from mnemo_sidecar.learning.model import ModelKind
from mnemo_sidecar.learning.pair_store import PairStore
from mnemo_sidecar.learning.runner import TrainingRunner

log = logging.getLogger(__name__)
SERVICE = "mnemo.ranking.v1.RankingService"


class SidecarServer:
    def __init__(self, cfg: SidecarConfig):
        self.cfg = cfg
        # First, so that its TLS settings are checked before the stores and models open.
        s = cfg.server
        past_train_streams = max(s.max_workers, s.max_train_streams)
        self.grpc = GrpcServer(
            ServerConfig(
                host=s.host,
                port=s.port,
                max_workers=s.max_workers,
                shutdown_grace_s=s.shutdown_grace_s,
                tls_cert_file=s.tls_cert_file,
                tls_key_file=s.tls_key_file,
            ),
            # Train, the one streamed call, is bounded by server.max_train_streams in the
            # servicer, with its own reason. The interceptor's stream caps are the memory
            # server's (exports and imports, per tenant, where every sidecar caller is one
            # principal): at their defaults they refused a 5th Train whatever
            # max_train_streams said, naming settings the sidecar does not have. Past the
            # workers a stream would not run anyway.
            ApiInterceptor(
                self._authenticate,
                max_streams=past_train_streams,
                max_streams_per_tenant=past_train_streams,
            ),
        )
        data = cfg.data_path
        make_data_dir(data)
        self._data_lock = hold_data_dir(data)  # before anything there is opened or removed
        self.store = PairStore(data / "pairs.sqlite", cfg.training.max_stored_sessions)
        self.engine = RankingEngine.over(
            cfg, self.store, data / "models", {ModelKind.CROSS_ENCODER: cfg.cross_encoder.max_resident}
        )
        self.runner = TrainingRunner(self.engine)
        self.engine.start_background_training = self.runner.start_background
        self.stats = LatencyStats()
        inf = cfg.inference
        self.gate = AdmissionGate(inf.max_running, inf.max_queued)
        self.grpc.add(
            rpb_grpc.add_RankingServiceServicer_to_server,
            RankingServicer(self.engine, self.runner, self.gate, self.stats),
            SERVICE,
        )

    def _authenticate(self, token: str) -> Principal:
        expected = self.cfg.server.auth_token
        if expected and token != expected:
            raise Unauthenticated("the sidecar needs its auth token", reason="INVALID_SIDECAR_TOKEN")
        return Principal(tenant_id="sidecar-caller")

    @property
    def port(self) -> int:
        return self.grpc.port

    def start(self) -> int:
        # Models load before SERVING (an export may take a while once; a cross-encoder takes
        # ~1 s to open), not inside the first calls' deadlines.
        self.engine.warm_up()
        # No training process runs yet: what is here was left by one killed mid-run.
        shutil.rmtree(self.cfg.training_scratch, ignore_errors=True)
        self.engine.registry.remove_abandoned()
        for stale in self.engine.prune_onnx_cache():
            log.info("removed %s from the ONNX cache: no model served here uses it", stale)
        try:
            port = self.grpc.start()
        except BaseException:
            self.stop(0.0)  # not served (the port in use, say): the pair store closed here
            raise
        log.info(
            "mnemo-sidecar serving on %s (data in %s)",
            listen_address(self.cfg.server.host, port),
            self.cfg.data_path,
        )
        return port

    def stop(self, grace_s: float | None = None) -> None:
        self.runner.stop()
        self.grpc.stop(self.cfg.server.shutdown_grace_s if grace_s is None else grace_s)
        self.store.close()
        if self._data_lock >= 0:
            os.close(self._data_lock)
            self._data_lock = -1
