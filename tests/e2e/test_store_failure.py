"""A server whose store failed for good (DuckDB invalidated its database after a fatal
error) stops answering and exits with status 70, so that it is restarted, instead of
failing every call INTERNAL while it stays up; a restart serves what was acknowledged."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc

from mnemo.v1 import memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo.v1 import memory_service_pb2_grpc as pb_grpc
from mnemo_server.cli.serve import EXIT_STORE_FAILED
from tests.conftest import ADMIN_KEY, bearer

# The server as `mnemo serve` runs it (run_until_signalled), with the one thing a test cannot
# make DuckDB do on demand: a transaction that fails with its FatalException, once the test
# has written (and been acknowledged) a memory.
_SERVER = """
import sys, threading, duckdb
from pathlib import Path
from tests.conftest import make_config
from mnemo_server.app import MnemoServer
from mnemo_server.cli.serve import run_until_signalled

data, cache, port_file, go = (Path(a) for a in sys.argv[1:5])
server = MnemoServer(make_config(data, cache, auth={"enabled": False}))

def fail_when_told():
    while not go.exists():
        threading.Event().wait(0.05)
    try:
        with server.core.db.transaction():
            raise duckdb.FatalException("FATAL Error: database has been invalidated (test)")
    except duckdb.FatalException:
        pass

threading.Thread(target=fail_when_told, daemon=True).start()
run_until_signalled(server, port_file)
"""


def _start(tmp_path: Path, model_cache: Path, name: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    """The server script as a process (its log in `<name>.log`), once it serves."""
    port_file, go = tmp_path / f"{name}.port", tmp_path / f"{name}.go"
    args = [sys.executable, "-c", _SERVER, str(tmp_path / "data"), str(model_cache), str(port_file), str(go)]
    with (tmp_path / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(args, cwd=Path(__file__).resolve().parents[2], stderr=log)
    deadline = time.monotonic() + 90
    while not port_file.exists():
        assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return proc, f"127.0.0.1:{port_file.read_text()}", go


def test_a_failed_store_ends_the_process_for_a_restart(tmp_path: Path, model_cache: Path) -> None:
    proc, address, go = _start(tmp_path, model_cache, "first")
    try:
        stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(address))
        md = bearer(ADMIN_KEY)
        kept = stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content="written before the failure")),
            metadata=md,
            timeout=30,
        ).memory
        go.touch()
        assert proc.wait(timeout=60) == EXIT_STORE_FAILED
    finally:
        proc.kill()
    assert "the store failed and this process cannot use it again" in (tmp_path / "first.log").read_text()
    again, address, _ = _start(tmp_path, model_cache, "second")
    try:
        stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(address))
        got = stub.GetMemory(pb.GetMemoryRequest(id=kept.id), metadata=bearer(ADMIN_KEY), timeout=30).memory
        assert got.content == "written before the failure"
    finally:
        again.terminate()
        again.wait(timeout=60)
