"""Versioned models on disk, per tenant and kind, with an atomically replaced pointer to
the promoted version:  <root>/<tenant>/<kind>/<version>/...  and  <root>/<tenant>/<kind>/current.json
A version is written marked as a candidate, and the mark goes at promotion: a run ended by
the sidecar's stop or a crash leaves a marked directory, which the next start removes
(`remove_abandoned`); the pointer always names a complete version. Loaded models are
swapped in memory under a lock (readers keep whatever reference they took).

Promoted models are loaded once: at start-up (`warm_up`, before the sidecar serves, since a
cross-encoder takes ~1 s to hash and open and a Score that met the load would overrun its
deadline), or by the first caller, the callers that come meanwhile waiting for that one
load instead of each loading a copy. A version that does not load (damaged files, a
pointer to a pruned version) is remembered with its error and served as no model (cold
start) rather than tried again on every call; the next promotion replaces it.

A kind may be bounded to a number of tenants' models in memory (a fine-tuned cross-encoder
holds ~65 MB in int8): loading one more drops the least recently served. Serving callers never
wait for a load (`serving`): a model not in memory is loaded by one background thread while
they go on without it."""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from mnemo_server.one_thread import OneThreadQueue
from mnemo_server.store.durable import fsync_tree, write_text_durably
from mnemo_sidecar.learning.model import ModelKind

M = TypeVar("M")
KEEP_VERSIONS = 4
# In a version directory while it is a candidate: no promotion has named it yet.
CANDIDATE_MARK = "candidate.mark"
log = logging.getLogger(__name__)
# The last instant a protobuf Timestamp holds (9999-12-31T23:59:59.999999999Z).
_LAST_TIMESTAMP_NS = 253_402_300_799_999_999_999


@dataclass(frozen=True)
class Residency:
    """A kind's models in memory now, its bound (0: none), and since this registry opened
    how many were loaded from disk and dropped to keep to the bound."""

    in_memory: int
    bound: int
    loads: int
    drops: int


@dataclass(frozen=True)
class Promoted(Generic[M]):
    version: str
    model: M
    source: str
    promote_time_ns: int


Key = tuple[str, ModelKind]


class ModelRegistry:
    def __init__(self, root: Path, resident: Mapping[ModelKind, int] | None = None):
        """`resident`: per kind, how many tenants' models stay in memory (absent or 0: all)."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._resident = {kind: n for kind, n in (resident or {}).items() if n > 0}
        self._loaded: OrderedDict[Key, Promoted[Any]] = OrderedDict()  # least recently served first
        self._broken: dict[Key, str] = {}
        self._loading: dict[Key, threading.Lock] = {}
        self._loads: Counter[ModelKind] = Counter()
        self._drops: Counter[ModelKind] = Counter()
        self._background = OneThreadQueue("model-load")
        self._lock = threading.Lock()

    def _kind_dir(self, tenant: str, kind: ModelKind) -> Path:
        return self.root / tenant / kind.value

    def new_version(self, tenant: str, kind: ModelKind) -> tuple[str, Path]:
        version = time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
        path = self._kind_dir(tenant, kind) / version
        path.mkdir(parents=True)
        (path / CANDIDATE_MARK).touch()
        return version, path

    def remove_abandoned(self) -> int:
        """Remove the candidates of runs that ended with the process that ran them (kill -9,
        or a stop, whose parent watch ends the training child before it can discard: a
        fine-tune's is ~90 MB). Only while no training runs: at start-up. How many went."""
        abandoned = [mark.parent for mark in self.root.glob(f"*/*/*/{CANDIDATE_MARK}")]
        for directory in abandoned:
            shutil.rmtree(directory, ignore_errors=True)
        if abandoned:
            log.info("removed %d candidate model versions left by stopped training runs", len(abandoned))
        return len(abandoned)

    @contextmanager
    def candidate(self, tenant: str, kind: ModelKind) -> Iterator[tuple[str, Path]]:
        """A new version's directory for the block to train into; `promote` or `discard`
        settles it. If the block raises (a failed run, or one stopped because the sidecar is
        stopping) the directory is removed: a version nobody will promote is not left on disk."""
        version, path = self.new_version(tenant, kind)
        try:
            yield version, path
        except BaseException:
            self.discard(tenant, kind, version)
            raise

    def pointer(self, tenant: str, kind: ModelKind) -> dict[str, Any] | None:
        f = self._kind_dir(tenant, kind) / "current.json"
        if not f.exists():
            return None
        data: dict[str, Any] = json.loads(f.read_text())
        return data

    def promote(self, tenant: str, kind: ModelKind, version: str, model: Any, source: str) -> None:
        kind_dir = self._kind_dir(tenant, kind)
        now = time.time_ns()
        (kind_dir / version / CANDIDATE_MARK).unlink(missing_ok=True)
        # The version's files reach the disk before the pointer that names them does: after
        # a power cut the pointer must not name a version whose files came back empty.
        fsync_tree(kind_dir / version)
        pointer = json.dumps({"version": version, "source": source, "promote_time_ns": now})
        write_text_durably(kind_dir / "current.json", pointer)
        with self._lock:
            self._keep((tenant, kind), Promoted(version, model, source, now))
        self._prune(kind_dir, keep={version})

    def discard(self, tenant: str, kind: ModelKind, version: str) -> None:
        shutil.rmtree(self._kind_dir(tenant, kind) / version, ignore_errors=True)

    def _prune(self, kind_dir: Path, keep: set[str]) -> None:
        # Candidates are no versions to keep, nor to count: the newest promoted ones stay. Names
        # start with their second; within one, the directory's time (its mark's removal) orders.
        versions = sorted(
            (p for p in kind_dir.iterdir() if p.is_dir() and not (p / CANDIDATE_MARK).exists()),
            key=lambda p: (p.name.split("-")[0], p.stat().st_mtime_ns),
        )
        for old in versions[:-KEEP_VERSIONS]:
            if old.name not in keep:
                shutil.rmtree(old, ignore_errors=True)

    def current(self, tenant: str, kind: ModelKind, loader: Callable[[Path], M]) -> Promoted[M] | None:
        """The promoted model, loaded on first use (e.g. after a restart); None when there is
        none or it does not load (see `broken`)."""
        key = (tenant, kind)
        with self._lock:
            if key in self._loaded or key in self._broken:
                return self._touch(key)
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._lock:
                if key in self._loaded or key in self._broken:
                    return self._touch(key)  # loaded while this caller waited
            return self._load(tenant, kind, loader)

    def serving(self, tenant: str, kind: ModelKind, loader: Callable[[Path], M]) -> Promoted[M] | None:
        """The promoted model if it is in memory, without waiting: one that is promoted but
        not in memory (dropped for another tenant's, or beyond the bound at start-up) is
        loaded by a background thread, and this caller goes on without it. Loading a
        cross-encoder takes ~0.4 s, past any Score's or Rerank's deadline."""
        key = (tenant, kind)
        with self._lock:
            if key in self._loaded or key in self._broken:
                return self._touch(key)
            if self._background.pending(key):
                return None
        # Outside the lock: every Score of a tenant with nothing promoted looks, and a stat
        # is a system call. A promotion landing meanwhile is found by the next call.
        if not (self._kind_dir(tenant, kind) / "current.json").exists():
            return None  # nothing promoted: nothing to load
        # One at a time on one thread (one_thread.py); a model that does not load is
        # recorded by current().
        self._background.submit(key, lambda: self.current(tenant, kind, loader))
        return None

    def resident(self, tenant: str, kind: ModelKind) -> Promoted[Any] | None:
        """The promoted model if it is in memory now; loads nothing and counts as no use."""
        with self._lock:
            return self._loaded.get((tenant, kind))

    def residency(self, kind: ModelKind) -> Residency:
        with self._lock:
            in_memory = sum(1 for _, k in self._loaded if k == kind)
            return Residency(in_memory, self._resident.get(kind, 0), self._loads[kind], self._drops[kind])

    def unloaded_version(self, tenant: str, kind: ModelKind) -> str:
        """The version of the promoted model when it is not in memory and not known to be
        broken (so the next `serving` call loads it); "" otherwise."""
        with self._lock:
            if (tenant, kind) in self._loaded or (tenant, kind) in self._broken:
                return ""
        try:
            ptr = self.pointer(tenant, kind)
            return str(ptr["version"]) if ptr else ""
        except (OSError, ValueError, KeyError, TypeError):
            return ""  # damaged: loading it will record why

    def _touch(self, key: Key) -> Promoted[Any] | None:
        """The loaded model of `key` (None if none), marked as the most recently served.
        Called with the lock held."""
        loaded = self._loaded.get(key)
        if loaded is not None:
            self._loaded.move_to_end(key)
        return loaded

    def _keep(self, key: Key, loaded: Promoted[Any]) -> None:
        """Serve `loaded` for `key`, dropping the least recently served models of its kind
        beyond the kind's bound (their callers keep the references they took). Called with
        the lock held."""
        self._loaded[key] = loaded
        self._loaded.move_to_end(key)
        self._broken.pop(key, None)
        bound = self._resident.get(key[1])
        if bound is None:
            return
        same_kind = [k for k in self._loaded if k[1] == key[1]]
        for old in same_kind[: max(0, len(same_kind) - bound)]:
            del self._loaded[old]
            self._drops[old[1]] += 1
            log.info("dropped the %s of tenant %r from memory (at most %d stay)", old[1].value, old[0], bound)

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
                    self._loads[kind] += 1
                    self._keep(key, loaded)

    def _from_pointer(self, tenant: str, kind: ModelKind, loader: Callable[[Path], M]) -> Promoted[M] | None:
        ptr = self.pointer(tenant, kind)
        if ptr is None:
            return None
        version = str(ptr["version"])
        promote_time_ns = int(ptr["promote_time_ns"])
        if not 0 <= promote_time_ns <= _LAST_TIMESTAMP_NS:
            # Served anyway, it failed every GetModelStatus of the tenant with INTERNAL (a
            # protobuf Timestamp holds years 1-9999): damage, as a time that is no integer is.
            raise ValueError(f"promote_time_ns {promote_time_ns} is not a time")
        return Promoted(
            version, loader(self._kind_dir(tenant, kind) / version), ptr.get("source", ""), promote_time_ns
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
            self._loads[kind] += 1
            if key not in self._loaded:  # else a promotion came meanwhile: it stands
                self._keep(key, loaded)
            return self._touch(key)

    def broken(self, tenant: str, kind: ModelKind) -> str:
        """Why the promoted model does not load ("" when it does, or none is promoted)."""
        with self._lock:
            return self._broken.get((tenant, kind), "")

    def warm_up(self, loaders: dict[ModelKind, Callable[[Path], Any]]) -> int:
        """Load every tenant's promoted models, of a bounded kind the most recently promoted
        that load, up to its bound; returns how many loaded."""
        count = 0
        tenants = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        for kind, loader in loaders.items():
            bound = self._resident.get(kind)
            loaded: list[str] = []
            for tenant in reversed(self._by_promotion(tenants, kind)):  # the newest first
                if bound and len(loaded) == bound:
                    break
                if self.current(tenant, kind, loader) is not None:
                    loaded.append(tenant)
            with self._lock:
                for tenant in reversed(loaded):  # the newest promotion the last to be dropped
                    self._touch((tenant, kind))
            count += len(loaded)
        return count

    def _by_promotion(self, tenants: list[str], kind: ModelKind) -> list[str]:
        """The tenants with a promoted model of `kind`, the oldest promotion first."""
        found: list[tuple[int, str]] = []
        for tenant in tenants:
            try:
                ptr = self.pointer(tenant, kind)
                if ptr is None:
                    continue
                when = int(ptr["promote_time_ns"])
            except (OSError, ValueError, KeyError, TypeError):
                when = time.time_ns()  # damaged: tried first, loading it records why it does not load
            found.append((when, tenant))
        return [tenant for _, tenant in sorted(found)]
