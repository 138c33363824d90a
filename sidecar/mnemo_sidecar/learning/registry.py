"""Versioned models on disk, per tenant and kind, with an atomically replaced pointer to
the promoted version:  <root>/<tenant>/<kind>/<version>/...  and  <root>/<tenant>/<kind>/current.json
A crash mid-training leaves at most an unreferenced directory; the pointer always names a
complete version. Loaded models are swapped in memory under a lock (readers keep whatever
reference they took)."""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from mnemo_sidecar.learning.model import ModelKind

M = TypeVar("M")
KEEP_VERSIONS = 4


@dataclass(frozen=True)
class Promoted(Generic[M]):
    version: str
    model: M
    source: str
    promote_time_ns: int


class ModelRegistry:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._loaded: dict[tuple[str, ModelKind], Promoted[Any]] = {}
        self._lock = threading.Lock()

    def _kind_dir(self, tenant: str, kind: ModelKind) -> Path:
        return self.root / tenant / kind.value

    def new_version(self, tenant: str, kind: ModelKind) -> tuple[str, Path]:
        version = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        path = self._kind_dir(tenant, kind) / version
        path.mkdir(parents=True)
        return version, path

    def pointer(self, tenant: str, kind: ModelKind) -> dict[str, Any] | None:
        f = self._kind_dir(tenant, kind) / "current.json"
        if not f.exists():
            return None
        data: dict[str, Any] = json.loads(f.read_text())
        return data

    def promote(self, tenant: str, kind: ModelKind, version: str, model: Any, source: str) -> None:
        kind_dir = self._kind_dir(tenant, kind)
        now = time.time_ns()
        tmp = kind_dir / f".current.{uuid.uuid4().hex}.json"
        tmp.write_text(json.dumps({"version": version, "source": source, "promote_time_ns": now}))
        tmp.replace(kind_dir / "current.json")
        with self._lock:
            self._loaded[(tenant, kind)] = Promoted(version, model, source, now)
        self._prune(kind_dir, keep={version})

    def discard(self, tenant: str, kind: ModelKind, version: str) -> None:
        shutil.rmtree(self._kind_dir(tenant, kind) / version, ignore_errors=True)

    def _prune(self, kind_dir: Path, keep: set[str]) -> None:
        versions = sorted(p for p in kind_dir.iterdir() if p.is_dir())
        for old in versions[:-KEEP_VERSIONS]:
            if old.name not in keep:
                shutil.rmtree(old, ignore_errors=True)

    def current(self, tenant: str, kind: ModelKind, loader: Callable[[Path], M]) -> Promoted[M] | None:
        """The promoted model, loaded on first use (e.g. after a restart)."""
        with self._lock:
            hit = self._loaded.get((tenant, kind))
        if hit is not None:
            return hit
        ptr = self.pointer(tenant, kind)
        if ptr is None:
            return None
        model = loader(self._kind_dir(tenant, kind) / ptr["version"])
        loaded: Promoted[M] = Promoted(
            ptr["version"], model, ptr.get("source", ""), int(ptr["promote_time_ns"])
        )
        with self._lock:
            return self._loaded.setdefault((tenant, kind), loaded)
