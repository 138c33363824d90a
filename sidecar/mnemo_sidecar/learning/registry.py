"""Versioned models on disk, per tenant and kind, with an atomically replaced pointer to
the promoted version:  <root>/<tenant>/<kind>/<version>/...  and  <root>/<tenant>/<kind>/current.json
A crash mid-training leaves at most an unreferenced directory; the pointer always names a
complete version. Loaded models are swapped in memory under a lock (readers keep whatever
reference they took).

Promoted models are loaded once: at start-up (`warm_up`, before the sidecar serves, since a
cross-encoder takes ~1 s to hash and open and a Score that met the load would overrun its
deadline), or by the first caller, the callers that come meanwhile waiting for that one
load instead of each loading a copy. A version that does not load (damaged files, a
pointer to a pruned version) is remembered with its error and served as no model (cold
start) rather than tried again on every call; the next promotion replaces it."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from mnemo_server.store.durable import fsync_tree, write_text_durably
from mnemo_sidecar.learning.model import ModelKind

M = TypeVar("M")
KEEP_VERSIONS = 4
log = logging.getLogger(__name__)


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
        self._broken: dict[tuple[str, ModelKind], str] = {}
        self._loading: dict[tuple[str, ModelKind], threading.Lock] = {}
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
        # The version's files reach the disk before the pointer that names them does: after
        # a power cut the pointer must not name a version whose files came back empty.
        fsync_tree(kind_dir / version)
        pointer = json.dumps({"version": version, "source": source, "promote_time_ns": now})
        write_text_durably(kind_dir / "current.json", pointer)
        with self._lock:
            self._loaded[(tenant, kind)] = Promoted(version, model, source, now)
            self._broken.pop((tenant, kind), None)
        self._prune(kind_dir, keep={version})

    def discard(self, tenant: str, kind: ModelKind, version: str) -> None:
        shutil.rmtree(self._kind_dir(tenant, kind) / version, ignore_errors=True)

    def _prune(self, kind_dir: Path, keep: set[str]) -> None:
        versions = sorted(p for p in kind_dir.iterdir() if p.is_dir())
        for old in versions[:-KEEP_VERSIONS]:
            if old.name not in keep:
                shutil.rmtree(old, ignore_errors=True)

    def current(self, tenant: str, kind: ModelKind, loader: Callable[[Path], M]) -> Promoted[M] | None:
        """The promoted model, loaded on first use (e.g. after a restart); None when there is
        none or it does not load (see `broken`)."""
        key = (tenant, kind)
        with self._lock:
            if key in self._loaded or key in self._broken:
                return self._loaded.get(key)
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._lock:
                if key in self._loaded or key in self._broken:
                    return self._loaded.get(key)  # loaded while this caller waited
            return self._load(tenant, kind, loader)

    def refresh(self, tenant: str, kind: ModelKind, loader: Callable[[Path], M]) -> None:
        """Serve the version the pointer names now (promoted by a training process); callers
        keep whatever reference they took. One that does not load leaves the served one."""
        key = (tenant, kind)
        with self._lock:
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            try:
                loaded = self._from_pointer(tenant, kind, loader)
            except Exception as exc:  # any damage: this version is unusable, the served one is not
                log.error("the %s promoted for tenant %r does not load: %s", kind.value, tenant, exc)
                return
            if loaded is not None:
                with self._lock:
                    self._loaded[key] = loaded
                    self._broken.pop(key, None)

    def _from_pointer(self, tenant: str, kind: ModelKind, loader: Callable[[Path], M]) -> Promoted[M] | None:
        ptr = self.pointer(tenant, kind)
        if ptr is None:
            return None
        version = str(ptr["version"])
        return Promoted(
            version,
            loader(self._kind_dir(tenant, kind) / version),
            ptr.get("source", ""),
            int(ptr["promote_time_ns"]),
        )

    def _load(self, tenant: str, kind: ModelKind, loader: Callable[[Path], M]) -> Promoted[M] | None:
        key = (tenant, kind)
        started = time.perf_counter()
        try:
            loaded = self._from_pointer(tenant, kind, loader)
            if loaded is None:
                return None
        except Exception as exc:  # any damage: the model is unusable, the sidecar is not
            error = f"{type(exc).__name__}: {exc}"
            log.error(
                "the promoted %s of tenant %r does not load, served as none: %s", kind.value, tenant, error
            )
            with self._lock:
                if key not in self._loaded:  # else a promotion came meanwhile: it stands
                    self._broken[key] = error
                return self._loaded.get(key)
        log.info(
            "loaded %s %s of tenant %r in %.2f s",
            kind.value,
            loaded.version,
            tenant,
            time.perf_counter() - started,
        )
        with self._lock:
            return self._loaded.setdefault(key, loaded)

    def broken(self, tenant: str, kind: ModelKind) -> str:
        """Why the promoted model does not load ("" when it does, or none is promoted)."""
        with self._lock:
            return self._broken.get((tenant, kind), "")

    def warm_up(self, loaders: dict[ModelKind, Callable[[Path], Any]]) -> int:
        """Load every tenant's promoted models; returns how many loaded."""
        count = 0
        for tenant_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for kind, loader in loaders.items():
                if (self._kind_dir(tenant_dir.name, kind) / "current.json").exists():
                    count += self.current(tenant_dir.name, kind, loader) is not None
        return count
