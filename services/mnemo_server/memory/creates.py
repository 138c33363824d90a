"""Writing new memories: dedup, external ids, per-type caps and the idempotency record, in one
transaction per group of concurrent creates (store/group_commit.py says why groups).

A group is written as the requests would have been one after another: a request that
repeats a request_id written earlier in the group replays it, content already written by
an earlier request deduplicates to it, an external id is owned by the first request that
wrote it. If any request fails, GroupCommit writes each request again alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import duckdb

from mnemo_server.config import CapsConfig
from mnemo_server.errors import AlreadyExists, InvalidArgument, NotFound
from mnemo_server.memory.live_counts import LiveCounts
from mnemo_server.memory.model import CreateResult, IdempotencyKey, Memory, MemoryDraft, MemoryType, Scope
from mnemo_server.memory.normalize import normalize_content
from mnemo_server.memory.paging import memory_bytes
from mnemo_server.store import idempotency_repo, memory_repo
from mnemo_server.store.database import Cursor, Database, WriteDomain
from mnemo_server.store.group_commit import GroupCommit, GroupStats


def require_same_memory(holder: Memory, scope: Scope, content_hash: str, field: str) -> None:
    """A write naming the external id `holder` holds is a retry of that memory when its
    scope and content are the same; anything else under the name is a conflict."""
    if holder.scope != scope or holder.content_hash != content_hash:
        raise AlreadyExists(
            f"{field}: {holder.external_id!r} is already used by memory {holder.id}",
            reason="EXTERNAL_ID_TAKEN",
            metadata={"memory_id": holder.id},
        )


@dataclass(frozen=True)
class CreateRequest:
    """One CreateMemory or BatchCreateMemories call, validated and prepared."""

    tenant_id: str
    drafts: Sequence[MemoryDraft]
    prefixes: Sequence[str]  # each draft's field path, for errors
    key: IdempotencyKey | None
    # The largest answer the caller can be sent (its memories, estimated), 0 for any: one
    # past it is refused before COMMIT, not written and then unsendable (answer_fits).
    answer_bytes: int = 0


@dataclass(frozen=True)
class CreateWritten:
    results: list[CreateResult]
    new_ids: list[str]  # inserted by this request: to index
    pruned: list[str]  # tombstoned by the caps: to drop from the index


@contextmanager
def counted_write(
    db: Database, live_counts: LiveCounts, tenant_ids: Iterable[str], defers: bool = False
) -> Iterator[Cursor]:
    """A memories write transaction; if it fails, the tenants' cached live counts are
    dropped (they may have been changed by the part that rolled back)."""
    try:
        with db.transaction(WriteDomain.MEMORIES, defers=defers) as cur:
            yield cur
    except BaseException:
        for t in set(tenant_ids):
            live_counts.forget(t)
        raise


def answer_fits(request: CreateRequest, results: Sequence[CreateResult]) -> None:
    """Refuse (INVALID_ARGUMENT) a request whose answer, the memories it created or found,
    would pass what the caller can be sent. Within every limit a batch of 500 memories
    can be ~40 MB; one of 419 emoji-filled memories (33.5 MB) was written and its answer
    refused by gRPC (RESOURCE_EXHAUSTED), and the retry replayed the same answer (probe).
    Raised inside the transaction, it rolls the write back (a group's other requests are
    written again without it). A duplicate answers with the stored memory, whose metadata
    may be larger than the request's, so the answer is measured here, not from the request."""
    if not request.answer_bytes:
        return
    size = sum(memory_bytes(r.memory) for r in results)
    if size > request.answer_bytes:
        raise InvalidArgument(
            "requests",
            f"the answer would carry ~{size:,} bytes of memories, over the {request.answer_bytes:,} "
            "a message may hold: send these memories in smaller batches",
            reason="ANSWER_TOO_LARGE",
        )


class CreateWriter:
    def __init__(
        self,
        db: Database,
        caps: CapsConfig,
        live_counts: LiveCounts,
        embedding_model: str,
        clock: Callable[[], int],
        group_max_memories: int,
    ):
        self.db = db
        self.caps = caps
        self.live_counts = live_counts
        self.embedding_model = embedding_model
        self.clock = clock
        # max 0: every create is its own transaction. Tenants take turns in the queue.
        self._groups: GroupCommit[CreateRequest, CreateWritten] = GroupCommit(
            self._write_together,
            self._write_alone,
            group_max_memories,
            size_of=lambda r: len(r.drafts),
            tenant_of=lambda r: r.tenant_id,
        )

    def write(self, request: CreateRequest) -> CreateWritten:
        return self._groups.submit(request)

    @property
    def group_stats(self) -> GroupStats:
        """Create calls written and the transactions they took."""
        return self._groups.stats

    @property
    def waiting(self) -> int:
        """Creates queued for the next group."""
        return self._groups.waiting

    @property
    def writing(self) -> int:
        """Creates of the group being written now."""
        return self._groups.writing

    def _write_together(self, requests: Sequence[CreateRequest]) -> list[CreateWritten]:
        # On failure GroupCommit writes each request again alone, which says whose error it is.
        return self._write(requests, defers=True)

    def _write_alone(self, request: CreateRequest) -> CreateWritten:
        try:
            return self._write([request], defers=True)[0]
        except duckdb.Error:
            # A deferred insert's error is raised by whichever statement carried it (a reused
            # request_id's, for one, by COMMIT), so the write is tried again (the first attempt
            # rolled back) one statement at a time, whose error is the one it would have had.
            pass
        return self._write([request], defers=False)[0]

    def _write(self, requests: Sequence[CreateRequest], defers: bool) -> list[CreateWritten]:
        with counted_write(self.db, self.live_counts, [r.tenant_id for r in requests], defers) as cur:
            return self._write_in(cur, requests, self.clock())

    def _write_in(self, cur: Cursor, requests: Sequence[CreateRequest], now: int) -> list[CreateWritten]:
        written: dict[int, CreateWritten] = {}
        fresh: dict[str, list[int]] = {}  # tenant -> indices of requests to insert, in order
        keyed: dict[tuple[str, str], int] = {}  # (tenant, request_id) -> its first request here
        repeats: dict[int, int] = {}  # a retry sent while its first copy was in this group
        for i, r in enumerate(requests):
            if r.key is not None:
                first = keyed.setdefault((r.tenant_id, r.key.request_id), i)
                if first != i:
                    if requests[first].key != r.key:
                        # The same request_id for another request: written alone, it fails.
                        raise RuntimeError("a request_id is repeated in the group by another request")
                    repeats[i] = first
                    continue
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, r.tenant_id, r.key)
            if replay is None:
                fresh.setdefault(r.tenant_id, []).append(i)
                continue
            stored = memory_repo.get_many(cur, r.tenant_id, replay["ids"])
            if gone := [m for m in replay["ids"] if m not in stored]:
                # Deleted and purged for good since (a tombstone window shorter than the
                # request_id's): there is nothing left to answer with.
                raise NotFound("memory", gone[0], field="request_id")
            results = [
                CreateResult(stored[m], bool(dd))
                for m, dd in zip(replay["ids"], replay["dedup"], strict=True)
            ]
            written[i] = CreateWritten(results, [], [])
        for tenant_id, indices in fresh.items():
            # One insert for all of a tenant's requests; _insert treats its drafts in order,
            # as if each request had been written after the ones before it.
            drafts = [d for i in indices for d in requests[i].drafts]
            prefixes = [p for i in indices for p in requests[i].prefixes]
            results, _, pruned = self._insert(cur, tenant_id, drafts, prefixes, now)
            at = 0
            outcomes: list[tuple[IdempotencyKey | None, dict[str, Any]]] = []
            for k, i in enumerate(indices):
                r = requests[i]
                mine = results[at : at + len(r.drafts)]
                at += len(r.drafts)
                answer_fits(r, mine)
                ids = [c.memory.id for c in mine]
                outcomes.append((r.key, {"ids": ids, "dedup": [c.deduplicated for c in mine]}))
                new_ids = [c.memory.id for c in mine if not c.deduplicated]
                written[i] = CreateWritten(mine, new_ids, pruned if k == 0 else [])
            idempotency_repo.record_many(cur, self.db.stored.requests, tenant_id, outcomes, now)
        for i, first in repeats.items():
            written[i] = CreateWritten(written[first].results, [], [])  # a replay of the first
        return [written[i] for i in range(len(requests))]

    def _insert(
        self, cur: Cursor, tenant_id: str, drafts: Sequence[MemoryDraft], prefixes: Sequence[str], now: int
    ) -> tuple[list[CreateResult], list[str], list[str]]:
        normalized = [normalize_content(d.content) for d in drafts]
        existing = memory_repo.find_live_duplicates(
            cur,
            self.db.stored.hashes,
            tenant_id,
            [n.hash for d, n in zip(drafts, normalized, strict=True) if not d.external_id],
        )
        owners = memory_repo.live_by_external_ids(
            cur, tenant_id, [d.external_id for d in drafts if d.external_id]
        )
        results: list[CreateResult] = []
        to_insert: list[tuple[Memory, str]] = []
        seqs = iter(self.db.memory_seqs.take(len(drafts)))  # gaps are harmless; order is what counts
        batch_seen: dict[tuple[str, str], Memory] = {}
        for k, (d, norm) in enumerate(zip(drafts, normalized, strict=True)):
            dedup_key = (d.scope.key, norm.hash)
            if d.external_id:
                # The caller names the memory: the same name with the same content is a
                # retry (deduplicated); the same name with other content is a conflict; the
                # same content under another name is a distinct memory (two chat turns may
                # both say "thanks!").
                owner = owners.get(d.external_id)
                if owner is not None:
                    require_same_memory(owner, d.scope, norm.hash, f"{prefixes[k]}.external_id")
                    results.append(CreateResult(owner, True))
                    continue
            else:
                dup = existing.get(dedup_key) or batch_seen.get(dedup_key)
                if dup is not None:
                    results.append(CreateResult(dup, True))
                    continue
            m = Memory(
                id=str(uuid.uuid4()),
                tenant_id=tenant_id,
                seq=next(seqs),
                external_id=d.external_id,
                scope=d.scope,
                type=d.type,
                category=d.category,
                content=norm.storage,
                content_hash=norm.hash,
                importance=d.importance,
                confidence=d.confidence,
                pinned=d.pinned,
                source=d.source,
                metadata=d.metadata,
                event_time_ns=d.event_time_ns if d.event_time_ns is not None else now,
                create_time_ns=now,
                update_time_ns=now,
                revision=1,
                embedding_model=self.embedding_model,
            )
            to_insert.append((m, norm.normalized))
            batch_seen.setdefault(dedup_key, m)
            if m.external_id:
                owners[m.external_id] = m
            results.append(CreateResult(m, False))
        memory_repo.insert_many(cur, to_insert, self.db.stored)
        memory_repo.record_history(
            cur,
            [
                (tenant_id, m.id, "create", m.source.who or "api", m.source.why, {"type": m.type.value})
                for m, _ in to_insert
            ],
            now,
        )
        pruned = self.enforce_caps(cur, tenant_id, [m for m, _ in to_insert], now)
        if pruned:
            # The caps may prune what this very write answers with: a memory it inserted (a
            # batch larger than the room left) or the one a duplicate names (the scope's
            # oldest); the answer says so, as GetMemory would.
            gone = set(pruned)
            results = [
                CreateResult(memory_repo.tombstoned(r.memory, now), r.deduplicated)
                if r.memory.id in gone
                else r
                for r in results
            ]
        return results, [m.id for m, _ in to_insert], pruned

    def _cap_for(self, mtype: MemoryType) -> int:
        cap: int = getattr(self.caps, mtype.value)
        return cap

    def enforce_caps(self, cur: Cursor, tenant_id: str, inserted: Sequence[Memory], now: int) -> list[str]:
        """Prune the oldest unpinned memories of every (scope, type) the insert pushed over its
        cap (live `inserted` rows only count). Returns the ids tombstoned."""
        groups: dict[tuple[str, str, MemoryType], tuple[Scope, int]] = {}
        for m in inserted:
            if m.deleted:
                continue
            k = self.live_counts.key(tenant_id, m.scope, m.type)
            scope, n = groups.get(k, (m.scope, 0))
            groups[k] = (scope, n + 1)
        pruned: list[str] = []
        for key in sorted(groups):
            scope, n = groups[key]
            mtype = key[2]
            live = self.live_counts.after_insert(
                key, n, partial(memory_repo.count_live_in, cur, tenant_id, scope, mtype)
            )
            cap = self._cap_for(mtype)
            if cap <= 0 or live <= cap:
                continue
            victims = memory_repo.oldest_unpinned(cur, tenant_id, scope, mtype, live - cap)
            memory_repo.tombstone(cur, tenant_id, victims, now)
            memory_repo.record_history(
                cur,
                [(tenant_id, v, "prune", "mnemo", f"{mtype.value} cap {cap} reached", {}) for v in victims],
                now,
            )
            self.live_counts.removed(key, len(victims))
            pruned.extend(victims)
        return pruned
