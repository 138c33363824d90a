"""Shared fixtures: real servers on port 0 with real DuckDB/LanceDB files in tmp_path.

The ONNX export of the bundled embedding model is made once per test session and shared
through `embedding.cache_dir`, so each server only loads it."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
ADMIN_KEY = "test-admin-key-0123456789"

from mnemo_server.app import MnemoServer  # noqa: E402
from mnemo_server.config import Config  # noqa: E402


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def make_config(data_dir: Path, model_cache: Path, **sections: dict[str, Any]) -> Config:
    base: dict[str, dict[str, Any]] = {
        "server": {"port": 0, "shutdown_grace_s": 1.0},
        "auth": {"enabled": True, "admin_key": ADMIN_KEY},
        "storage": {"data_dir": str(data_dir)},
        "embedding": {"cache_dir": str(model_cache)},
        # Background jobs run on demand in tests (they are exercised explicitly).
        "index": {"optimize_interval_s": 0, "reconcile_interval_s": 0},
        "retention": {"interval_s": 0},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return Config().replace(**base)


@dataclass
class LiveServer:
    server: MnemoServer
    address: str
    channels: list[grpc.Channel]

    def channel(self) -> grpc.Channel:
        ch = grpc.insecure_channel(self.address)
        self.channels.append(ch)
        return ch

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.server.stop(0.5)


@pytest.fixture
def start_server(tmp_path: Path, model_cache: Path) -> Iterator[Callable[..., LiveServer]]:
    """start_server(data_dir=None, **config_sections) -> LiveServer; all stopped at teardown."""
    started: list[LiveServer] = []

    def start(data_dir: Path | None = None, **sections: dict[str, Any]) -> LiveServer:
        cfg = make_config(data_dir or tmp_path / f"data{len(started)}", model_cache, **sections)
        server = MnemoServer(cfg)
        port = server.start()
        live = LiveServer(server, f"127.0.0.1:{port}", [])
        started.append(live)
        return live

    yield start
    for live in started:
        live.close()


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def python_exe() -> str:
    return sys.executable


def provision(live: LiveServer, tenant_id: str) -> str:
    """Create a tenant and one API key through AdminService; returns the bearer token."""
    from mnemo.v1 import admin_service_pb2 as admin_pb
    from mnemo.v1 import admin_service_pb2_grpc as admin_grpc

    stub = admin_grpc.AdminServiceStub(live.channel())
    md = bearer(ADMIN_KEY)
    stub.CreateTenant(
        admin_pb.CreateTenantRequest(tenant=admin_pb.Tenant(id=tenant_id)), metadata=md, timeout=10
    )
    resp = stub.CreateApiKey(
        admin_pb.CreateApiKeyRequest(tenant_id=tenant_id, description="tests"), metadata=md, timeout=10
    )
    return resp.secret


def error_info(err: grpc.RpcError) -> tuple[str, list[str]]:
    """(ErrorInfo.reason, BadRequest field names) from a failed call's status details."""
    from mnemo_client.client import MnemoError

    parsed = MnemoError.from_rpc(err)
    return parsed.reason, parsed.fields


@pytest.fixture
def server(start_server: Callable[..., LiveServer]) -> LiveServer:
    return start_server()


@dataclass
class TenantClient:
    """Generated stubs bound to one tenant's key."""

    token: str
    channel: grpc.Channel

    @property
    def md(self) -> tuple[tuple[str, str], ...]:
        return bearer(self.token)

    def memory(self) -> Any:
        from mnemo.v1 import memory_service_pb2_grpc

        return memory_service_pb2_grpc.MemoryServiceStub(self.channel)


@pytest.fixture
def tenant_a(server: LiveServer) -> TenantClient:
    return TenantClient(provision(server, "tenant-a"), server.channel())


@pytest.fixture
def tenant_b(server: LiveServer) -> TenantClient:
    return TenantClient(provision(server, "tenant-b"), server.channel())


@pytest.fixture
def start_sidecar(tmp_path: Path, model_cache: Path) -> Iterator[Callable[..., Any]]:
    """start_sidecar(data_dir=None, **config_sections) -> a running SidecarServer on port 0."""
    from mnemo_sidecar.app import SidecarServer
    from mnemo_sidecar.config import SidecarConfig

    started: list[SidecarServer] = []

    def start(data_dir: Path | None = None, **sections: dict[str, Any]) -> SidecarServer:
        base: dict[str, dict[str, Any]] = {
            "server": {"port": 0, "shutdown_grace_s": 0.5},
            "storage": {"data_dir": str(data_dir or tmp_path / f"sidecar{len(started)}")},
            "training": {"auto": False},
            # The sidecar's embedding blend shares the session's ONNX export too.
            "inference": {"embedder_cache_dir": str(model_cache)},
        }
        for name, values in sections.items():
            base.setdefault(name, {}).update(values)
        side = SidecarServer(SidecarConfig().replace(**base))
        side.start()
        started.append(side)
        return side

    yield start
    for side in started:
        side.stop(0.2)
