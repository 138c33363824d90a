"""The memory domain: create, read, update, delete, purge, export and import.

Writes are raw-first: validated and normalised, committed to DuckDB in one short
transaction (with dedup, caps and the idempotency record), acknowledged, and only then
embedded and indexed by the IndexWorker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from mnemo_server.config import CapsConfig, IndexConfig
from mnemo_server.errors import AlreadyExists, FieldViolation, InvalidArgument, NotFound
from mnemo_server.index.indexer import IndexWorker
from mnemo_server.index.lance_index import NO_CACHE_USE, CacheUse
from mnemo_server.index.residency import ResidencyStats
from mnemo_server.memory.creates import CreateRequest, CreateWriter, counted_write, require_same_memory
from mnemo_server.memory.live_counts import LiveCounts
from mnemo_server.memory.model import (
    DEFAULT_CONFIDENCE,
    DEFAULT_IMPORTANCE,
    CreateResult,
    HistoryEntry,
    IdempotencyKey,
    Memory,
    MemoryDraft,
    MemoryFilter,
    Scope,
    ScopeKind,
    now_ns,
)
from mnemo_server.memory.normalize import normalize_content, sanitize_category
from mnemo_server.memory.paging import (
    decode_token,
    encode_token,
    fitting,
    largest_memory_bytes,
    memory_bytes,
    query_fingerprint,
)
from mnemo_server.memory.purge_snapshot import snapshot_token, through_seq
from mnemo_server.memory.purges import UNTIL_DONE, Patience, PurgeCount, Purger
from mnemo_server.memory.validation import Validator, raise_if
from mnemo_server.retrieval.query_analysis import speaker_of
from mnemo_server.store import idempotency_repo, memory_repo
from mnemo_server.store.database import Cursor, Database

EXTERNAL_PREFIX = "external:"
UPDATABLE_PATHS = ("importance", "confidence", "pinned", "category", "metadata", "event_time", "content")


@dataclass(frozen=True)
class MemoryPatch:
    """New values for an update; only the paths named in the mask are read."""

    importance: float = 0.5
    confidence: float = 1.0
    pinned: bool = False
    category: str = ""
    metadata: dict[str, Any] | None = None
    event_time_ns: int | None = None
    content: str = ""


@dataclass(frozen=True)
class TenantStatus:
    live: int
    deleted: int
    pending_index: int
    oldest_pending_ns: int | None
    by_type: dict[str, int]
    search_index_lag: int = 0
    cache_use: CacheUse = NO_CACHE_USE
    # The index worker's failed batches since start-up (all tenants), and the last one's
    # reason and time (IndexerStats).
    index_failed_batches: int = 0
    index_last_failure_reason: str = ""
    index_last_failure_ns: int = 0
    # Tables whose rows are still to be compared with the store's since start-up (all tenants).
    index_tables_to_check: int = 0
    # The server's tenants with indices in memory (all tenants), and whether this one's are.
    index_residency: ResidencyStats | None = None
    index_loaded: bool = False


def _is_seq(position: Any) -> bool:
    return type(position) is int and 0 <= position < 2**63


def _is_history_position(position: Any) -> bool:
    """[time_ns, entries at that instant already returned]."""
    return isinstance(position, list) and len(position) == 2 and all(_is_seq(p) for p in position)


def _is_canonical_uuid(text: str) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


class MemoryService:
    def __init__(
        self,
        db: Database,
        indexer: IndexWorker,
        validator: Validator,
        caps: CapsConfig,
        index_cfg: IndexConfig,
        embedding_model: str,
        clock: Callable[[], int] = now_ns,
        group_commit_max_memories: int = 0,
        purge_batch: int = 1_000,
    ):
        self.db = db
        self.indexer = indexer
        self.validator = validator
        self._largest = largest_memory_bytes(validator.limits)  # a memory in an answer, at most
        self.index_cfg = index_cfg
        self.embedding_model = embedding_model
        self.clock = clock
        self.live_counts = LiveCounts()
        self.creates = CreateWriter(
            db, caps, self.live_counts, embedding_model, clock, group_commit_max_memories
        )
        self.purger = Purger(db, indexer, self.live_counts, self._write, clock, purge_batch)

    @contextmanager
    def _write(self, tenant_id: str) -> Iterator[Cursor]:
        with counted_write(self.db, self.live_counts, [tenant_id]) as cur:
            yield cur

    # --- create ------------------------------------------------------------------------

    def create(
        self,
        tenant_id: str,
        draft: MemoryDraft,
        *,
        key: IdempotencyKey | None = None,
        wait_for_index: bool = False,
        wait_timeout_s: float = 0.0,
        field_prefix: str = "memory",
    ) -> CreateResult:
        return self.batch_create(
            tenant_id,
            [draft],
            key=key,
            wait_for_index=wait_for_index,
            wait_timeout_s=wait_timeout_s,
            field_prefixes=[field_prefix],
        )[0]

    def batch_create(
        self,
        tenant_id: str,
        drafts: Sequence[MemoryDraft],
        *,
        key: IdempotencyKey | None = None,
        wait_for_index: bool = False,
        wait_timeout_s: float = 0.0,
        field_prefixes: Sequence[str] | None = None,
        answer_bytes: int = 0,
    ) -> list[CreateResult]:
        """Write the drafts atomically. answer_bytes: the largest answer the caller can be
        sent (0 for any); a batch whose memories would pass it is refused, not written."""
        prefixes = list(field_prefixes or [f"requests[{i}].memory" for i in range(len(drafts))])
        if not drafts:
            raise InvalidArgument("requests", "must hold at least one memory")
        if len(drafts) > self.validator.limits.max_batch_size:
            raise InvalidArgument(
                "requests",
                f"holds {len(drafts)} memories; the limit is {self.validator.limits.max_batch_size}",
            )
        # Every entry is checked before any error is raised: a client fixing a batch learns
        # of all its bad fields at once (the status lists the first 20: api/errors.py).
        violations: list[FieldViolation] = []
        prepared = [self._prepare(d, p, violations) for d, p in zip(drafts, prefixes, strict=True)]
        seen_external: dict[str, str] = {}
        for d, p in zip(prepared, prefixes, strict=True):
            if d.external_id:
                if d.external_id in seen_external:
                    violations.append(
                        FieldViolation(f"{p}.external_id", "repeats another entry of this batch")
                    )
                seen_external[d.external_id] = p
        raise_if(violations)

        if answer_bytes and len(prepared) * self._largest <= answer_bytes:
            answer_bytes = 0  # cannot pass it: not measured
        written = self.creates.write(CreateRequest(tenant_id, prepared, prefixes, key, answer_bytes))
        results = written.results
        if written.new_ids or written.pruned:
            self.indexer.submit(tenant_id, [*written.new_ids, *written.pruned])
        if wait_for_index:
            ids = [r.memory.id for r in results]
            if self.indexer.wait_indexed(tenant_id, ids, self._wait_budget(wait_timeout_s)):
                fresh = memory_repo.get_many(self.db.reader(), tenant_id, ids)
                results = [CreateResult(fresh.get(r.memory.id, r.memory), r.deduplicated) for r in results]
        return results

    def _wait_budget(self, requested_s: float) -> float:
        limit = self.index_cfg.max_wait_for_index_s
        return limit if requested_s <= 0 else min(requested_s, limit)

    def _prepare(self, d: MemoryDraft, prefix: str, violations: list[FieldViolation]) -> MemoryDraft:
        """The draft as it is written; what is wrong with it goes to `violations`."""
        scope = d.scope
        if scope.kind is ScopeKind.WORKSPACE and not scope.id:
            scope = Scope.workspace()
        violations.extend(self.validator.draft(replace(d, scope=scope), prefix))
        return replace(d, scope=scope, category=sanitize_category(d.category))

    # --- read --------------------------------------------------------------------------

    def get(self, tenant_id: str, ident: str, *, field: str = "id") -> Memory:
        if not ident:
            raise InvalidArgument(field, "is required")
        cur = self.db.reader()
        if ident.startswith(EXTERNAL_PREFIX):
            m = memory_repo.get_by_external_id(cur, tenant_id, ident[len(EXTERNAL_PREFIX) :])
        else:
            m = memory_repo.read_many(cur, self.db.rows, tenant_id, [ident]).get(ident)
        if m is None:
            raise NotFound("memory", ident)
        return m

    def list_memories(
        self, tenant_id: str, f: MemoryFilter, *, page_size: int, page_token: str, show_deleted: bool
    ) -> tuple[list[Memory], str]:
        size = self.validator.page_size(page_size)
        raise_if(self.validator.filter(f))
        fingerprint = query_fingerprint("list", tenant_id, f, show_deleted)
        before = decode_token(page_token, fingerprint, _is_seq)
        cur = self.db.reader()
        if before is None and not show_deleted and f.scopes and f.scopes_only:
            # A first page of live memories by scope: each scope's newest ids are kept in
            # memory (store/recent_ids.py), so DuckDB's top-N over the table is not needed.
            rows = memory_repo.newest_in_scopes(
                cur, self.db.recent, self.db.stored, self.db.rows, tenant_id, f.scopes, size + 1
            )
        else:
            rows = memory_repo.list_page(
                cur,
                tenant_id,
                f,
                include_deleted=show_deleted,
                before_seq=before,
                limit=size + 1,
                cache=self.db.rows,
            )
        fits = fitting(rows[:size], memory_bytes, self._largest)
        if fits < min(size, len(rows)):  # cut to what a client takes in one message
            return rows[:fits], encode_token(rows[fits - 1].seq, fingerprint)
        next_token = encode_token(rows[size - 1].seq, fingerprint) if len(rows) > size else ""
        return rows[:size], next_token

    def history(
        self, tenant_id: str, ident: str, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[str, list[HistoryEntry], str]:
        """A memory's audit history, oldest first, a page at a time: (its id, the entries, the
        next page's token or ""). Also a deleted memory's, and by id a purged one's while its
        history is kept."""
        size = self.validator.page_size(page_size)
        cur = self.db.reader()
        try:
            memory_id = self.get(tenant_id, ident).id
        except NotFound:
            if ident.startswith(EXTERNAL_PREFIX) or not memory_repo.has_history(cur, tenant_id, ident):
                raise
            memory_id = ident
        fingerprint = query_fingerprint("history", tenant_id, memory_id)
        position = decode_token(page_token, fingerprint, _is_history_position)
        from_ns, skip = position if position is not None else (0, 0)
        entries = memory_repo.history(cur, tenant_id, memory_id, from_ns=from_ns, skip=skip, limit=size + 1)
        page = entries[:size]
        if len(entries) <= size:
            return memory_id, page, ""
        # The next page starts past this one's entries at its last instant, and past those
        # earlier pages returned at that instant too when this page began there.
        last_ns = page[-1].time_ns
        at_last = sum(1 for e in page if e.time_ns == last_ns) + (skip if last_ns == from_ns else 0)
        return memory_id, page, encode_token([last_ns, at_last], fingerprint)

    # --- update / delete ---------------------------------------------------------------

    def update(
        self,
        tenant_id: str,
        memory_id: str,
        patch: MemoryPatch,
        paths: Sequence[str],
        *,
        key: IdempotencyKey | None = None,
        wait_for_index: bool = False,
        wait_timeout_s: float = 0.0,
    ) -> Memory:
        if not memory_id:
            raise InvalidArgument("memory.id", "is required")
        changes = self._changes(patch, paths)
        answer: Memory | None = None  # the memory as this update (or a retry's first call) left it
        with self._write(tenant_id) as cur:
            # Read under the write lock: a time read before it could be older than one a
            # write that took the lock first has stored, and the history would misorder them.
            now = self.clock()
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None and replay.get("row"):
                answer = memory_repo.decode_row(replay["row"])
            if replay is None:
                current = memory_repo.get(cur, tenant_id, memory_id)
                if current is None or current.deleted:
                    raise NotFound("memory", memory_id)
                if "event_time_ns" in changes and changes["event_time_ns"] is None:
                    # Named and unset: what CreateMemory gives a memory without one.
                    changes["event_time_ns"] = current.create_time_ns
                # A named memory may share its content with others, as CreateMemory lets two
                # names hold "thanks!"; an unnamed one may not (a create would return the other).
                changed = "content_hash" in changes and changes["content_hash"] != current.content_hash
                if changed and not current.external_id:
                    dup = memory_repo.find_live_duplicates(
                        cur, self.db.stored.hashes, tenant_id, [changes["content_hash"]]
                    ).get((current.scope.key, changes["content_hash"]))
                    if dup is not None and dup.id != memory_id:
                        raise AlreadyExists(
                            f"memory.content: the same content already exists in this scope as "
                            f"memory {dup.id}",
                            reason="DUPLICATE_CONTENT",
                            metadata={"memory_id": dup.id},
                        )
                memory_repo.update_columns(cur, self.db.stored, tenant_id, memory_id, changes, now)
                memory_repo.record_history(
                    cur, [(tenant_id, memory_id, "update", "api", "", {"paths": sorted(paths)})], now
                )
                # The row as this update left it: the answer, not a read after the commit,
                # which could show a concurrent caller's write; and a retry's (README: a retry
                # returns the first result), even after later writes changed the memory.
                row = memory_repo.get_row(cur, tenant_id, memory_id)
                assert row is not None  # updated just now, under the write lock
                answer = memory_repo.decode_row(row)
                idempotency_repo.record(
                    cur, self.db.stored.requests, tenant_id, key, {"ids": [memory_id], "row": row}, now
                )
        self.indexer.submit(tenant_id, [memory_id])
        if wait_for_index:
            self.indexer.wait_indexed(tenant_id, [memory_id], self._wait_budget(wait_timeout_s))
        elif replay is None and answer is not None:
            return answer  # read in its transaction; a read now could only show a later write
        return self._as_left(tenant_id, memory_id, answer)

    def _as_left(self, tenant_id: str, memory_id: str, answer: Memory | None) -> Memory:
        """A retried or waited-for write's answer: the memory as the write left it, with its
        index state now if no later write changed it (a record from before rows were kept:
        as it is now)."""
        latest = memory_repo.read_many(self.db.reader(), self.db.rows, tenant_id, [memory_id]).get(memory_id)
        if latest is None:
            # Purged since (tombstones included are read): "no call returns it", a retried
            # update's or delete's kept answer neither (it did, for the record's 24 h).
            raise NotFound("memory", memory_id)
        if answer is None:
            return latest
        if latest is not None and (latest.revision, latest.update_time_ns) == (
            answer.revision,
            answer.update_time_ns,
        ):
            return latest
        return answer

    def _changes(self, patch: MemoryPatch, paths: Sequence[str]) -> dict[str, Any]:
        if not paths:
            raise InvalidArgument("update_mask", f"must name at least one of {', '.join(UPDATABLE_PATHS)}")
        unknown = [p for p in paths if p not in UPDATABLE_PATHS]
        if unknown:
            raise InvalidArgument(
                "update_mask", f"cannot update {', '.join(unknown)}; updatable: {', '.join(UPDATABLE_PATHS)}"
            )
        probe = MemoryDraft(
            content=patch.content if "content" in paths else "x",
            category=patch.category if "category" in paths else "general",  # unmasked: ignored
            importance=patch.importance if "importance" in paths else DEFAULT_IMPORTANCE,
            confidence=patch.confidence if "confidence" in paths else DEFAULT_CONFIDENCE,
            metadata=(patch.metadata or {}) if "metadata" in paths else {},
        )
        raise_if(self.validator.draft(probe, "memory"))
        changes: dict[str, Any] = {}
        for path in paths:
            if path == "content":
                norm = normalize_content(patch.content)
                changes.update(
                    content=norm.storage,
                    normalized_content=norm.normalized,
                    content_hash=norm.hash,
                    speaker=speaker_of(norm.storage),
                )
            elif path == "category":
                changes["category"] = sanitize_category(patch.category)
            elif path == "metadata":
                changes["metadata"] = patch.metadata or {}
            elif path == "event_time":
                changes["event_time_ns"] = patch.event_time_ns  # None: the create time (update())
            else:
                changes[path] = getattr(patch, path)
        return changes

    def delete(self, tenant_id: str, memory_id: str, *, key: IdempotencyKey | None = None) -> Memory:
        if not memory_id:
            raise InvalidArgument("id", "is required")
        answer: Memory | None = None
        with self._write(tenant_id) as cur:
            now = self.clock()  # under the write lock (see update)
            replay = idempotency_repo.lookup(cur, self.db.stored.requests, tenant_id, key)
            if replay is not None and replay.get("row"):
                answer = memory_repo.decode_row(replay["row"])
            if replay is None:
                current = memory_repo.get(cur, tenant_id, memory_id)
                if current is None or current.deleted:
                    raise NotFound("memory", memory_id)
                memory_repo.tombstone(cur, tenant_id, [memory_id], now)
                self.live_counts.removed(self.live_counts.key(tenant_id, current.scope, current.type), 1)
                memory_repo.record_history(cur, [(tenant_id, memory_id, "delete", "api", "", {})], now)
                # The tombstone as this call left it, for a retry: an import may restore the
                # memory later, and the retry still answers with what the delete did.
                row = memory_repo.get_row(cur, tenant_id, memory_id)
                assert row is not None
                answer = memory_repo.decode_row(row)
                idempotency_repo.record(
                    cur, self.db.stored.requests, tenant_id, key, {"ids": [memory_id], "row": row}, now
                )
        self.indexer.submit(tenant_id, [memory_id])
        return (
            answer if replay is None and answer is not None else self._as_left(tenant_id, memory_id, answer)
        )

    def purge(
        self,
        tenant_id: str,
        f: MemoryFilter,
        *,
        force: bool,
        all_memories: bool,
        snapshot: str = "",
        key: IdempotencyKey | None = None,
        patience: Patience = UNTIL_DONE,
    ) -> PurgeCount:
        """Without force, a count and the snapshot token that bounds a purge to it; with
        force, tombstones the matches (only those stored by snapshot's count, if given).
        patience: how long a copy of a keyed purge still running waits for it."""
        raise_if(self.validator.filter(f))
        through = through_seq(snapshot)
        if f.is_empty and not all_memories:
            raise InvalidArgument("filter", "must name at least one criterion (or set all_memories)")
        if all_memories and not f.is_empty:
            # Which one was meant, every memory or the filtered ones? Guessing either is wrong.
            raise InvalidArgument("all_memories", "must not be set together with a filter")
        if not force:
            n, last = memory_repo.count_live_through(self.db.reader(), tenant_id, f, through)
            return PurgeCount(n, snapshot_token(last if through is None else min(last, through)))
        return PurgeCount(self.purger.purge(tenant_id, f, through, key, patience))

    # --- export / import ---------------------------------------------------------------

    def export(
        self,
        tenant_id: str,
        f: MemoryFilter,
        *,
        include_deleted: bool,
        batch_size: int = 500,
    ) -> Iterator[tuple[list[Memory], int, int]]:
        """Batches in insertion order with (exported so far, total): the memories stored when
        the export starts. Read up to no bound, a memory an import restored meanwhile (a
        tombstone given a new number) was exported twice, and the file could not be
        imported again (probe)."""
        raise_if(self.validator.filter(f))
        total, through = memory_repo.count_through(
            self.db.reader(), tenant_id, f, include_deleted=include_deleted
        )
        done, after = 0, 0
        while True:
            rows, last = memory_repo.scan(
                self.db.reader(),
                tenant_id,
                f,
                include_deleted=include_deleted,
                after_seq=after,
                through_seq=through,
                limit=batch_size,
            )
            if last == after:  # no row left
                if done == 0:
                    yield [], 0, total
                return
            after = last
            while rows:  # in messages a client takes
                fits = fitting(rows, memory_bytes, self._largest)
                done += fits
                yield rows[:fits], done, max(total, done)
                rows = rows[fits:]

    def import_batch(
        self,
        tenant_id: str,
        memories: Sequence[Memory],
        *,
        field_prefix: str = "memories",
    ) -> tuple[int, int]:
        """Restore exported memories as they were. Returns (imported, skipped): ids that are
        live already, or whose content is already live in the scope, are skipped; a
        tombstoned id is restored as the import has it (so an export restores what a purge
        tombstoned), unless it is skipped for its content, when it stays a tombstone. The
        type caps apply as to creates: imported memories count, and the oldest unpinned
        ones past a cap are pruned (imported ones included, counted as imported)."""
        if len(memories) > self.validator.limits.max_batch_size:
            raise InvalidArgument(field_prefix, f"at most {self.validator.limits.max_batch_size} per message")
        raise_if(self._import_violations(memories, field_prefix))
        imported: list[str] = []
        with self._write(tenant_id) as cur:
            now = self.clock()  # under the write lock (see update)
            existing = memory_repo.get_many(cur, tenant_id, [m.id for m in memories])
            normalized = {m.id: normalize_content(m.content) for m in memories}
            dups = memory_repo.find_live_duplicates(
                cur, self.db.stored.hashes, tenant_id, [n.hash for n in normalized.values()]
            )
            owners = memory_repo.live_by_external_ids(
                cur,
                tenant_id,
                [m.external_id for m in memories if m.external_id and m.delete_time_ns is None],
            )
            rows: list[tuple[Memory, str]] = []
            seen: set[str] = set()
            for k, m in enumerate(memories):
                norm = normalized[m.id]
                if (m.id in existing and not existing[m.id].deleted) or m.id in seen:
                    continue
                if m.delete_time_ns is None and self._held_elsewhere(
                    m, norm.hash, owners, dups, field_prefix, k
                ):
                    continue
                seen.add(m.id)
                if m.delete_time_ns is None and not m.external_id:
                    # Later entries of this message with the same content in the scope are
                    # duplicates of this one, as a batch create's are of its first.
                    dups[(m.scope.key, norm.hash)] = m
                rows.append(
                    (
                        replace(
                            m,
                            tenant_id=tenant_id,
                            content=norm.storage,
                            content_hash=norm.hash,
                            category=sanitize_category(m.category),
                            # Past the tombstone's: the index worker marks a row indexed
                            # by (id, revision), and a restored revision 1 took the mark of
                            # the deleted text being indexed, for good (probe).
                            revision=existing[m.id].revision + 1 if m.id in existing else 1,
                            embedding_model=self.embedding_model,
                            update_time_ns=m.update_time_ns or m.create_time_ns,
                            event_time_ns=m.event_time_ns,
                        ),
                        norm.normalized,
                    )
                )
            # A tombstone gives way to the imported memory only once it is known to be
            # imported: one skipped (its content live under another id) keeps its tombstone.
            revive = [m.id for m, _ in rows if m.id in existing]
            if revive:
                memory_repo.delete_rows(cur, tenant_id, revive)
            seqs = self.db.memory_seqs.take(len(rows))
            rows = [(replace(m, seq=s), n) for (m, n), s in zip(rows, seqs, strict=True)]
            memory_repo.insert_many(cur, rows, self.db.stored)
            memory_repo.record_history(
                cur, [(tenant_id, m.id, "import", "api", "", {}) for m, _ in rows], now
            )
            imported = [m.id for m, _ in rows]
            # Keeps the live counts in step as a create does (a revived tombstone was not
            # counted; an imported one is not either), so each batch counts no scope again.
            pruned = self.creates.enforce_caps(cur, tenant_id, [m for m, _ in rows], now)
        self.indexer.submit(tenant_id, [*imported, *pruned])
        return len(imported), len(memories) - len(imported)

    def _import_violations(self, memories: Sequence[Memory], field_prefix: str) -> list[FieldViolation]:
        """What is wrong with an import message's entries, each named by its field."""
        violations: list[FieldViolation] = []
        named: set[str] = set()
        ids: set[str] = set()
        for k, m in enumerate(memories):
            p = f"{field_prefix}[{k}]"
            if m.id in ids:
                # Which entry is meant? Taken as given, the first one's fields were stored
                # with the second one's content (memory probe).
                violations.append(FieldViolation(f"{p}.id", "repeats another entry of this message"))
            ids.add(m.id)
            if not _is_canonical_uuid(m.id):
                # Other spellings of a stored id ({...}, upper case, urn:uuid:) would be
                # stored as new ids beside it, so only the form exports carry is taken.
                violations.append(
                    FieldViolation(
                        f"{p}.id", "must be the memory's id from an export (a lower-case hyphenated UUID)"
                    )
                )
            for link, linked in (
                ("supersedes_id", m.supersedes_id),
                ("superseded_by_id", m.superseded_by_id),
            ):
                # Stored as given, they were any text: a million characters or a NUL made
                # every listing of the scope too large for a client to read (memory probe).
                if linked and not _is_canonical_uuid(linked):
                    violations.append(
                        FieldViolation(
                            f"{p}.{link}", "must be empty or a memory id (a lower-case hyphenated UUID)"
                        )
                    )
            if m.external_id and m.delete_time_ns is None:
                if m.external_id in named:
                    violations.append(
                        FieldViolation(f"{p}.external_id", "repeats another live entry of this message")
                    )
                named.add(m.external_id)
            draft = MemoryDraft(
                content=m.content,
                scope=m.scope,
                type=m.type,
                category=m.category,
                external_id=m.external_id,
                importance=m.importance,
                confidence=m.confidence,
                metadata=m.metadata,
                source=m.source,
            )
            violations.extend(self.validator.draft(draft, p))
        return violations

    @staticmethod
    def _held_elsewhere(
        m: Memory,
        content_hash: str,
        owners: dict[str, Memory],
        dups: dict[tuple[str, str], Memory],
        field_prefix: str,
        k: int,
    ) -> bool:
        """Whether a live imported memory is already stored under another id, by the rules
        CreateMemory applies: a named memory by its external id (the same scope and content
        is the same memory; anything else under that name is a conflict, which fails the
        message), an unnamed one by its content in the scope."""
        if not m.external_id:
            dup = dups.get((m.scope.key, content_hash))
            return dup is not None and dup.id != m.id
        owner = owners.get(m.external_id)
        if owner is None or owner.id == m.id:
            return False
        require_same_memory(owner, m.scope, content_hash, f"{field_prefix}[{k}].external_id")
        return True

    def status(self, tenant_id: str) -> TenantStatus:
        s = memory_repo.tenant_stats(self.db.reader(), tenant_id, self.embedding_model)
        return TenantStatus(
            live=s["live"],
            deleted=s["deleted"],
            pending_index=s["pending"],
            oldest_pending_ns=s["oldest_pending_ns"],
            by_type=s["by_type"],
            search_index_lag=self.indexer.index.unindexed_rows(tenant_id),
            cache_use=self.indexer.index.cache_use(tenant_id),
            index_failed_batches=self.indexer.stats.failed_batches,
            index_last_failure_reason=self.indexer.stats.last_failure_reason,
            index_last_failure_ns=self.indexer.stats.last_failure_ns,
            index_tables_to_check=self.indexer.stats.tables_to_check,
            index_residency=self.indexer.index.residency(),
            index_loaded=self.indexer.index.is_kept(tenant_id),
        )
