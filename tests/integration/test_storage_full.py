"""A full disk under a real server (its data directory on a small tmpfs): writes fail with
RESOURCE_EXHAUSTED / STORAGE_FULL rather than INTERNAL, leave nothing half-written, reads
go on, GetStatus says why memories are not searchable yet, and writes and indexing resume
once space is freed, without a restart."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import LiveServer, TenantClient, error_info, provision


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)],
        check=False,
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def _free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _batch(n: int, start: int) -> pb.BatchCreateMemoriesRequest:
    return pb.BatchCreateMemoriesRequest(
        requests=[
            pb.CreateMemoryRequest(
                memory=memory_pb2.Memory(content=f"memory {start + i}: " + "the release notes say " * 150)
            )
            for i in range(n)
        ]
    )


def test_a_full_disk_is_storage_full_and_writes_resume_once_space_is_freed(
    small_disk: Path, start_server: Callable[..., LiveServer]
) -> None:
    live = start_server(data_dir=small_disk / "data")
    t = TenantClient(provision(live, "acme"), live.channel())
    stub = t.memory()
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (_free_bytes(small_disk) - (2 << 20)))  # leave 2 MB
    acknowledged = 0
    failure: grpc.RpcError | None = None
    for _ in range(200):
        try:
            stub.BatchCreateMemories(_batch(20, acknowledged), metadata=t.md, timeout=30)
            acknowledged += 20
        except grpc.RpcError as err:
            failure = err
            break
    assert failure is not None, f"2 MB took {acknowledged} memories of 3 KB"
    assert failure.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, failure.details()
    assert error_info(failure)[0] == "STORAGE_FULL" and "storage is full" in (failure.details() or "")

    def status() -> pb.GetStatusResponse:
        answer: pb.GetStatusResponse = stub.GetStatus(pb.GetStatusRequest(), metadata=t.md, timeout=10)
        return answer

    full = status()
    assert full.memory_count == acknowledged  # the failed batch left nothing behind
    listed = stub.ListMemories(pb.ListMemoriesRequest(page_size=5), metadata=t.md, timeout=10)
    assert len(listed.memories) == 5  # reads go on
    # Embedding is far slower than inserting (~100 against thousands a second here), so
    # acknowledged memories wait for the index, which cannot write them either: that shows.
    assert full.pending_index_count > 0
    wait_for(lambda: status().index_last_failure_reason == "STORAGE_FULL")
    assert status().index_failed_batches > 0 and status().HasField("index_last_failure_time")

    filler.unlink()
    stub.BatchCreateMemories(_batch(20, acknowledged), metadata=t.md, timeout=30)
    assert status().memory_count == acknowledged + 20
    # The index catches up on its own (its retries are at most 30 s apart).
    wait_for(lambda: status().pending_index_count == 0, timeout=60)
    hits = stub.Recall(
        pb.RecallRequest(query=f"memory {acknowledged + 19}", top_k=3), metadata=t.md, timeout=10
    )
    assert hits.hits
