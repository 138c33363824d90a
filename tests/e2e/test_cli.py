"""The `mnemo` command line against live servers, as a user would run it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mnemo.v1 import common_pb2, memory_pb2
from mnemo.v1 import memory_service_pb2 as pb
from mnemo_client import MnemoClient
from tests.conftest import ADMIN_KEY, LiveServer, TenantClient, provision
from tests.e2e.conftest import MNEMO, Proc, base_env


def run(args: list[str], env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MNEMO, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def test_up_serves_on_loopback_with_reflection_and_memory_commands(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    data = tmp_path / "mnemo-data"
    # A roomy StartSession budget: this checks the sidecar answers, not latency on a busy machine.
    proc = spawn(
        ["up", "--data-dir", str(data), "--port", "0", "--sidecar-port", "0"],
        env=base_env(model_cache, MNEMO_RANKING__START_SESSION_DEADLINE_MS="5000"),
    )
    assert (data / "mnemo.duckdb").exists() and (data / "sidecar" / "pairs.sqlite").exists()
    with grpc.insecure_channel(proc.address) as ch:
        reflect = reflection_pb2_grpc.ServerReflectionStub(ch)
        answer = next(
            iter(
                reflect.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
                )
            )
        )
        names = {s.name for s in answer.list_services_response.service}
    assert {"mnemo.v1.MemoryService", "mnemo.v1.AdminService", "grpc.health.v1.Health"} <= names
    # Once it serves, the process takes what warm-up loaded out of the collector's reach.
    frozen = re.search(r"froze (\d+) objects of the warm heap", proc.log.read_text())
    assert frozen is not None and int(frozen.group(1)) > 10_000

    env = base_env(model_cache, MNEMO_SERVER=proc.address)
    with MnemoClient(proc.address) as client:
        ids = [
            client.create_memory(
                client.new_memory(f"note {i}", category="cli", type="episodic" if i % 2 else "semantic"),
                wait_for_index=True,
            ).memory.id
            for i in range(5)
        ]
    listed = run(["memory", "list", "--json", "--type", "episodic"], env)
    assert listed.returncode == 0, listed.stderr
    assert sorted(json.loads(line)["content"] for line in listed.stdout.splitlines()) == ["note 1", "note 3"]

    status = json.loads(run(["status", "--json"], env).stdout)
    assert status["memory_count"] == "5" and status["embedding_dimension"] == 384
    assert len(status["latency_bucket_upper_ms"]) > 0
    # Without --json each method's time is a line, not its histogram.
    shown = run(["status"], env).stdout
    assert "/mnemo.v1.MemoryService/CreateMemory: 5 calls, 0 failed, p50 " in shown
    assert "wait for the interpreter lock since it started (ms): p50 " in shown
    assert "bucket" not in shown

    export = tmp_path / "export.jsonl"
    assert run(["memory", "export", "-o", str(export)], env).returncode == 0
    assert len(export.read_text().splitlines()) == 5
    cleared = run(["memory", "clear", "--force"], env)
    assert cleared.returncode == 0 and "deleted 5" in cleared.stdout
    assert run(["memory", "list", "--json"], env).stdout == ""
    history = run(["memory", "history", "--json", ids[1]], env)
    assert history.returncode == 0, history.stderr
    entries = [json.loads(line) for line in history.stdout.splitlines()]
    assert [(e["action"], e["reason"], e["details"]) for e in entries] == [
        ("create", "", {"type": "episodic"}),
        ("delete", "purge", {}),
    ]
    shown = run(["memory", "history", ids[1]], env).stdout
    assert "create" in shown and "purge" in shown and '{"type": "episodic"}' in shown
    # A file with a bad line imports nothing, and says which line; an export that fails
    # (no server) leaves the file it would have replaced as it was.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(export.read_text() + "{not json\n")
    refused = run(["memory", "import", str(bad)], env)
    assert refused.returncode == 1 and f"{bad}:6: bad JSON" in refused.stderr
    assert "Traceback" not in refused.stderr and run(["memory", "list", "--json"], env).stdout == ""
    before = export.read_text()
    gone = run(["memory", "export", "-o", str(export)], base_env(model_cache, MNEMO_SERVER="127.0.0.1:1"))
    assert gone.returncode != 0 and "Traceback" not in gone.stderr
    assert export.read_text() == before and not list(tmp_path.glob("*.part"))
    imported = run(["memory", "import", str(export)], env)
    assert imported.returncode == 0 and "imported 5" in imported.stderr
    export2 = tmp_path / "export2.jsonl"
    run(["memory", "export", "-o", str(export2)], env)
    assert _exported(export2) == _exported(export)

    # The sidecar runs as its own process and answers (cold start: no model yet).
    with MnemoClient(proc.address) as client:
        started = client.call(
            client.memory.StartSession, pb.StartSessionRequest(session_id="s", context="note")
        )
    assert started.ranking.fallback_reason == "cold_start" and started.memories

    got = run(["memory", "get", "00000000-0000-0000-0000-000000000000"], env)
    assert got.returncode != 0 and "NOT_FOUND" in got.stderr
    assert proc.terminate() == 0
    # The frozen heap is thawed at the stop: DuckDB's bindings find nothing left over at exit.
    log = proc.log.read_text()
    assert "mnemo stopped" in log and "leaked" not in log


def _exported(path: Path) -> set[str]:
    """An export's memories, ignoring index_state (the re-import may still be indexing)."""
    return {
        json.dumps({k: v for k, v in json.loads(line).items() if k != "index_state"}, sort_keys=True)
        for line in path.read_text().splitlines()
    }


def test_tenant_and_key_commands_against_an_authenticated_server(
    server: LiveServer, model_cache: Path
) -> None:
    env = base_env(model_cache, MNEMO_SERVER=server.address, MNEMO_ADMIN_KEY=ADMIN_KEY)
    assert run(["tenant", "create", "acme", "--name", "ACME"], env).returncode == 0
    issued = run(["key", "create", "acme", "--description", "ci"], env)
    assert issued.returncode == 0, issued.stderr
    secret = issued.stdout.strip()
    assert secret.startswith("mnemo_")
    tenant_env = {**env, "MNEMO_API_KEY": secret}
    tenant_env.pop("MNEMO_ADMIN_KEY")
    assert run(["memory", "list"], tenant_env).returncode == 0
    no_key = {k: v for k, v in tenant_env.items() if k != "MNEMO_API_KEY"}
    denied = run(["memory", "list"], no_key)
    assert denied.returncode != 0 and "UNAUTHENTICATED" in denied.stderr
    keys = run(["key", "list", "acme"], env).stdout.split()
    key_id = keys[0]
    assert run(["key", "revoke", key_id], env).returncode == 0
    assert "UNAUTHENTICATED" in run(["memory", "list"], tenant_env).stderr


def test_bad_config_is_a_clear_error(tmp_path: Path, model_cache: Path) -> None:
    env = base_env(model_cache, MNEMO_SERVER__PORT="not-a-port")
    out = run(["serve", "--data-dir", str(tmp_path / "d")], env)
    assert out.returncode == 2 and "server.port" in out.stderr and "Traceback" not in out.stderr
    # A data directory that cannot be one, or a store that is not a database: the path named.
    (tmp_path / "a-file").write_text("")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "mnemo.duckdb").write_text("not a database")
    for data_dir, said in ((tmp_path / "a-file" / "sub", "Not a directory"), (junk, "cannot be opened")):
        out = run(["serve", "--data-dir", str(data_dir), "--port", "0"], base_env(model_cache))
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr


def _as_bound_by_permissions() -> list[str]:
    """A command prefix under which file permissions bind the process: root passes over them
    (CAP_DAC_OVERRIDE) unless setpriv drops the capability."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, and setpriv is needed to make a directory unwritable to it")
    dropped = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={dropped}", f"--inh-caps={dropped}", "--"]


def test_an_index_directory_that_cannot_be_written_is_one_error_line(
    tmp_path: Path, model_cache: Path
) -> None:
    """A read-only lance/ was a traceback from start-up's index check (its seal not written)."""
    lance = tmp_path / "d" / "lance"
    lance.mkdir(parents=True)
    lance.chmod(0o555)
    try:
        out = subprocess.run(
            [*_as_bound_by_permissions(), *MNEMO, "serve", "--data-dir", str(tmp_path / "d"), "--port", "0"],
            env=base_env(model_cache, MNEMO_AUTH__ENABLED="false"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        lance.chmod(0o755)
    assert out.returncode == 2, out.stderr
    assert f"error: index directory {lance} is not writable: Permission denied" in out.stderr
    assert "Traceback" not in out.stderr and "nanobind" not in out.stderr, out.stderr


def test_up_does_not_take_a_port_file_left_by_an_earlier_run(tmp_path: Path, model_cache: Path) -> None:
    """A kept data directory may hold sidecar.port from a run before: it named the old port
    to the server, and hid a sidecar that failed to start."""
    import socket

    data = tmp_path / "d"
    data.mkdir()
    (data / "sidecar.port").write_text("59999")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        out = run(
            ["up", "--data-dir", str(data), "--port", "0", "--sidecar-port", str(taken)],
            base_env(model_cache),
        )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "sidecar failed to start" in out.stderr and f"cannot listen on 127.0.0.1:{taken}" in out.stderr
    assert not (data / "sidecar.port").exists() and not (data / "server.port").exists()


def test_bench_score_measures_score_idle_and_while_the_sidecar_trains(
    tmp_path: Path, model_cache: Path
) -> None:
    out_json = tmp_path / "score.json"
    out = subprocess.run(
        [sys.executable, "-m", "mnemo_sidecar.cli", "bench-score", "--quick", "--json-out", str(out_json)],
        env=base_env(model_cache),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out_json.read_text())
    assert result["sessions"] == 200 and result["deadline_ms"] == 120.0
    assert result["first_training"]["promoted"], result["first_training"]  # Score ran a model
    assert result["training"]["seconds"] > 0
    for phase in ("idle", "while_training"):
        s = result[phase]
        assert s["count"] > 0 and 0 < s["p50_ms"] <= s["p99_ms"] <= s["max_ms"], (phase, s)
        # Only the deadline may cut a call short; anything else is a fault of the sidecar.
        assert set(s["failures"]) <= {"DEADLINE_EXCEEDED"}, (phase, s)
    assert "while_training" in out.stdout and "the ranker's training took" in out.stdout


def test_memory_clear_deletes_what_it_counted_not_what_came_while_it_asked(
    server: LiveServer, model_cache: Path
) -> None:
    """The prompt names a count; memories stored while it waits are not deleted with them
    (probe: 5 confirmed, 105 deleted), an import dated before the count included (a bound by
    create_time deleted it)."""
    env = base_env(model_cache, MNEMO_SERVER=server.address, MNEMO_ADMIN_KEY=ADMIN_KEY)
    assert run(["tenant", "create", "acme"], env).returncode == 0
    secret = run(["key", "create", "acme"], env).stdout.strip()
    tenant_env = {k: v for k, v in env.items() if k != "MNEMO_ADMIN_KEY"} | {"MNEMO_API_KEY": secret}
    with MnemoClient(server.address, secret) as client:
        for i in range(5):
            client.create_memory(client.new_memory(f"counted note {i}"))
        proc = subprocess.Popen(
            [*MNEMO, "memory", "clear"],
            env=tenant_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            asked, deadline = "", time.monotonic() + 60
            while "delete 5 memories?" not in asked:  # the prompt ends without a newline
                assert time.monotonic() < deadline and proc.poll() is None, asked
                asked += os.read(proc.stdout.fileno(), 256).decode()
            for i in range(3):
                client.create_memory(client.new_memory(f"late note {i}"))
            dated = client.new_memory("late import, dated a day back")
            dated.id = str(uuid.uuid4())
            dated.create_time.FromNanoseconds(time.time_ns() - 86_400 * 10**9)
            dated.update_time.CopyFrom(dated.create_time)
            assert list(client.import_memories([[dated]]))[-1].imported_count == 1
            out, err = proc.communicate("y\n", timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0 and "deleted 5 memories" in out, (out, err)
        left = sorted(m.content for m in client.list_memories(limit=100))
    assert left == ["late import, dated a day back", *[f"late note {i}" for i in range(3)]]
    declined = run(["memory", "clear"], tenant_env, stdin="n\n")
    assert declined.returncode == 1 and "not confirmed: nothing deleted" in declined.stderr, declined
    with MnemoClient(server.address, secret) as client:
        assert len(list(client.list_memories(limit=100))) == 4


def test_memory_clear_deletes_what_it_counted_created_later_than_this_machines_clock(
    server: LiveServer, model_cache: Path
) -> None:
    """A confirmed clear bounded its purge by this machine's clock: a memory created later
    (here imported from a machine whose clock ran 5 minutes ahead) was counted, confirmed and
    left behind, where --force deleted it."""
    secret = provision(server, "acme")
    env = base_env(model_cache, MNEMO_SERVER=server.address, MNEMO_API_KEY=secret)
    with MnemoClient(server.address, secret) as client:
        client.batch_create_memories([client.new_memory(f"note {i}") for i in range(3)])
        ahead = client.new_memory("written where the clock runs ahead")
        ahead.id = str(uuid.uuid4())
        ahead.create_time.FromNanoseconds(time.time_ns() + 300 * 10**9)
        ahead.update_time.CopyFrom(ahead.create_time)
        assert list(client.import_memories([[ahead]]))[-1].imported_count == 1
        cleared = run(["memory", "clear"], env, stdin="y\n")
        assert cleared.returncode == 0 and "delete 4 memories?" in cleared.stdout, cleared
        assert "deleted 4 memories" in cleared.stdout
        assert client.status().memory_count == 0


def test_export_writes_into_a_fifo_or_an_inherited_pipe_and_names_a_path_it_cannot_open(
    server: LiveServer, tmp_path: Path, model_cache: Path
) -> None:
    """-o PATH was always written as PATH.part and renamed over PATH: a FIFO was replaced by a
    regular file (its reader got nothing), and a shell's /dev/fd/N (`-o >(gzip > x.gz)`) or
    a path that could not be opened was a traceback."""
    secret = provision(server, "acme")
    env = base_env(model_cache, MNEMO_SERVER=server.address, MNEMO_API_KEY=secret)
    with MnemoClient(server.address, secret) as client:
        client.batch_create_memories([client.new_memory(f"note {i}") for i in range(3)])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # Both ends held here: the export's open does not wait for a reader, and the reader
    # sees no end of file before the export has written (3 short lines fit the pipe).
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    exported = run(["memory", "export", "-o", str(fifo)], env)
    os.close(writer)
    os.set_blocking(reader, True)
    with os.fdopen(reader) as fifo_out:
        assert exported.returncode == 0 and len(fifo_out.read().splitlines()) == 3, exported.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode)

    read_end, write_end = os.pipe()
    with subprocess.Popen(
        [*MNEMO, "memory", "export", "-o", f"/dev/fd/{write_end}"],
        env=env,
        pass_fds=(write_end,),
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        os.close(write_end)
        with os.fdopen(read_end) as piped:
            lines = piped.read().splitlines()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and len(lines) == 3, err

    too_long = tmp_path / ("x" * 300)
    refused = run(["memory", "export", "-o", str(too_long)], env)
    assert refused.returncode == 2 and f"{too_long}: File name too long" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_remote_commands_refuse_a_timeout_no_call_could_keep(model_cache: Path) -> None:
    """0, a negative, nan, inf or a value past ~7e9 s made every call fail at once with
    DEADLINE_EXCEEDED, blaming the server: refused before any call (no server here)."""
    env = base_env(model_cache, MNEMO_SERVER="127.0.0.1:1")
    refused = [["status", "--timeout", v] for v in ("0", "-1", "nan", "inf", "1e10")]
    for args in [*refused, ["memory", "--timeout", "0", "list"]]:
        out = run(args, env)
        assert out.returncode == 2 and "Invalid value for '--timeout'" in out.stderr, (args, out.stderr)
    kept = run(["status", "--timeout", "0.5"], env)
    assert kept.returncode == 1 and "UNAVAILABLE" in kept.stderr, kept.stderr
    for command in ("status", "train"):  # the sidecar's commands take the same type
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "mnemo_sidecar.cli",
                command,
                "--sidecar",
                "127.0.0.1:1",
                "--timeout",
                "inf",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 2 and "Invalid value for '--timeout'" in out.stderr, (command, out.stderr)


def test_offline_commands_and_paths_are_refused_before_anything_is_made(
    tmp_path: Path, model_cache: Path
) -> None:
    """reindex/reembed on a directory with no store (a mistyped --data-dir made a fresh empty
    one and reported success), a port file or an export in a directory that does not exist
    (a traceback once serving, or after the export)."""
    env = base_env(model_cache, MNEMO_AUTH__ENABLED="false")
    for command in ("reindex", "reembed"):
        typo = tmp_path / f"typo-{command}"
        out = run([command, "--data-dir", str(typo)], env)
        assert out.returncode == 2 and "is not a Mnemo data directory" in out.stderr, out.stderr
        assert not typo.exists() and "Traceback" not in out.stderr
    missing = tmp_path / "missing"
    out = run(
        ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--port-file", str(missing / "p")], env
    )
    assert out.returncode == 2 and "--port-file" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "d").exists()  # refused before the store was opened
    out = run(["memory", "--server", "127.0.0.1:1", "export", "-o", str(missing / "x.jsonl")], env)
    assert out.returncode == 2 and "--output" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_serve_writes_its_port_file_into_the_data_directory_it_makes(
    tmp_path: Path, model_cache: Path
) -> None:
    """--port-file D/port was refused ("D is not a directory") when D was yet to be made: the
    check came before the server made its data directory. A directory below D is still
    refused, before anything is made."""
    env = base_env(model_cache, MNEMO_AUTH__ENABLED="false")
    data = tmp_path / "fresh"
    serve = ["serve", "--data-dir", str(data), "--port", "0", "--port-file"]
    deeper = run([*serve, str(data / "run" / "port")], env)
    assert deeper.returncode == 2 and "--port-file" in deeper.stderr and not data.exists(), deeper.stderr
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*MNEMO, *serve, str(data / "port")], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 120
        while not (data / "port").exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with MnemoClient(f"127.0.0.1:{(data / 'port').read_text()}") as client:
            assert client.status().memory_count == 0
    finally:
        proc.kill()
        proc.wait(30)


def test_export_and_import_give_up_on_a_server_that_stops_answering(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """--timeout bounds each wait for the server in a streamed export or import (they had no
    deadline at all: a stopped server held them for good)."""
    env = base_env(model_cache, MNEMO_AUTH__ENABLED="false")
    server = spawn(["serve", "--data-dir", str(tmp_path / "d"), "--port", "0"], env=env)
    client_env = {**env, "MNEMO_SERVER": server.address}
    dump = tmp_path / "one.jsonl"
    with MnemoClient(server.address, None) as client:
        client.create_memory(client.new_memory("a note to export"))
    assert run(["memory", "export", "-o", str(dump)], client_env).returncode == 0
    # From a pipe, read once (it was read twice, the second time as empty: nothing imported).
    piped = run(["memory", "import", "/dev/stdin"], client_env, stdin=dump.read_text())
    assert piped.returncode == 0 and "imported 0 memories, skipped 1" in piped.stdout + piped.stderr, piped
    os.kill(server.popen.pid, signal.SIGSTOP)
    try:
        for args in (["export", "-o", str(tmp_path / "x.jsonl")], ["import", str(dump)]):
            started = time.monotonic()
            out = run(["memory", "--timeout", "2", *args], client_env)
            took = time.monotonic() - started
            assert out.returncode == 1 and "DEADLINE_EXCEEDED" in out.stderr, (args, out.stderr)
            assert took < 15, took  # 2 s without a message, not forever
    finally:
        os.kill(server.popen.pid, signal.SIGCONT)


def test_up_takes_its_data_directory_from_the_environment_as_serve_does(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """Without --data-dir, `up` used ./mnemo-data whatever MNEMO_STORAGE__DATA_DIR said."""
    data = tmp_path / "from-env"
    proc = spawn(
        ["up", "--port", "0", "--no-sidecar"], env=base_env(model_cache, MNEMO_STORAGE__DATA_DIR=str(data))
    )
    assert proc.popen.poll() is None and (data / "mnemo.duckdb").exists()


def test_up_takes_its_port_from_the_config_file_then_the_environment_then_the_flag(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """--port defaulted to 50051 and overrode server.port of --config and MNEMO_SERVER__PORT;
    a host that is not loopback was replaced by 127.0.0.1 without a word (up has no keys)."""

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    in_file, in_env = free_port(), free_port()
    config = tmp_path / "mnemo.toml"
    config.write_text(f"[server]\nport = {in_file}\n")
    up = ["up", "--no-sidecar", "--config", str(config)]

    def bound(data: str, env: dict[str, str] | None = None, *flags: str) -> int:
        proc = spawn([*up, "--data-dir", str(tmp_path / data), *flags], env=env)
        proc.kill9()  # one server at a time; its data is not used again
        return proc.port

    assert bound("a") == in_file
    env = base_env(model_cache, MNEMO_SERVER__PORT=str(in_env))
    assert bound("b", env) == in_env
    assert bound("c", env, "--port", "0") not in (in_file, in_env)
    config.write_text('[server]\nhost = "0.0.0.0"\n')
    refused = run([*up, "--data-dir", str(tmp_path / "d"), "--port", "0"], base_env(model_cache))
    assert refused.returncode == 2 and "not server.host = '0.0.0.0'" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "d").exists()


def test_serve_on_a_port_in_use_is_one_error_line_and_an_ipv6_host_needs_no_brackets(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """A port in use printed its error and then ~45 lines of leaked DuckDB objects (the stores
    were left open); server.host = "::1" was "cannot listen on ::1:0 (in use?)"."""
    env = base_env(model_cache, MNEMO_AUTH__ENABLED="false")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = run(["serve", "--data-dir", str(tmp_path / "d"), "--port", str(port)], env)
    assert refused.returncode == 2, refused.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}: the port is in use" in refused.stderr
    assert "nanobind" not in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    ipv6 = spawn(
        ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0"], env={**env, "MNEMO_SERVER__HOST": "::1"}
    )
    deadline = time.monotonic() + 10  # the line follows the port file
    while f"mnemo listening on [::1]:{ipv6.port}" not in ipv6.log.read_text():
        assert time.monotonic() < deadline, ipv6.log.read_text()
        time.sleep(0.05)
    with MnemoClient(f"[::1]:{ipv6.port}") as client:
        assert client.status().memory_count == 0


def test_a_second_up_on_a_running_instances_directory_starts_nothing(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """It is refused before a second sidecar starts on the first one's sidecar data (which
    overwrote its log and deleted its port file)."""
    data = tmp_path / "d"
    env = base_env(model_cache, MNEMO_RANKING__START_SESSION_DEADLINE_MS="5000")
    spawn(["up", "--data-dir", str(data), "--port", "0", "--sidecar-port", "0"], env=env)
    port_file, log = data / "sidecar.port", data / "sidecar.log"
    before = (port_file.read_text(), log.read_text())
    second = run(["up", "--data-dir", str(data), "--port", "0", "--sidecar-port", "0"], env)
    assert second.returncode == 2 and "is in use by another process" in second.stderr, second.stderr
    assert "sidecar on" not in second.stderr and "Traceback" not in second.stderr
    assert (port_file.read_text(), log.read_text()[: len(before[1])]) == before


def test_import_names_the_line_a_server_refuses_and_takes_a_batch_size(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """A refusal part-way names the file's line and what was imported before it (it named a
    position in the command's own batching); --batch-size fits a server that takes fewer
    memories a message than the 200 sent by default (every batch was refused)."""
    env = base_env(
        model_cache,
        MNEMO_AUTH__ENABLED="false",
        MNEMO_LIMITS__MAX_BATCH_SIZE="20",
        MNEMO_LIMITS__MAX_CONTENT_CHARS="100",
    )
    server = spawn(["serve", "--data-dir", str(tmp_path / "d"), "--port", "0"], env=env)
    client_env = {**env, "MNEMO_SERVER": server.address}

    def exported(content: str) -> str:
        return json.dumps(
            {"id": str(uuid.uuid4()), "content": content, "create_time": "2026-01-01T00:00:00Z"}
        )

    lines = [exported(f"imported memory number {i}") for i in range(50)]
    lines[44] = exported("x" * 150)  # line 45: over the server's limit
    dump = tmp_path / "in.jsonl"
    dump.write_text("\n".join(lines) + "\n")
    too_big = run(["memory", "import", str(dump)], client_env)
    assert too_big.returncode == 1 and "at most 20" in too_big.stderr, too_big.stderr
    refused = run(["memory", "import", "--batch-size", "20", str(dump)], client_env)
    assert refused.returncode == 1 and f"{dump}:45: INVALID_ARGUMENT" in refused.stderr, refused.stderr
    assert "(40 imported before it, 0 skipped)" in refused.stderr, refused.stderr
    del lines[44]
    dump.write_text("\n".join(lines) + "\n")
    rest = run(["memory", "import", "--batch-size", "20", str(dump)], client_env)
    assert rest.returncode == 0 and "imported 9 memories, skipped 40" in rest.stdout + rest.stderr, rest


def _live_children(pid: int, marker: str) -> list[int]:
    """The processes pid started whose command line holds marker, not yet ended (zombies
    left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z" and marker in cmdline:
            found.append(int(entry.name))
    return found


def test_up_starts_its_sidecar_again_on_the_same_port_after_it_is_killed(
    spawn: Callable[..., Proc], tmp_path: Path, model_cache: Path
) -> None:
    """A sidecar that died stayed dead (a defunct child of `mnemo up`): every session was
    ordered by the baseline until `mnemo up` was restarted."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    data = tmp_path / "mnemo-data"
    proc = spawn(
        ["up", "--data-dir", str(data), "--port", "0", "--sidecar-port", "0"],
        env=base_env(
            model_cache,
            MNEMO_RANKING__START_SESSION_DEADLINE_MS="5000",
            MNEMO_RANKING__BREAKER_COOLDOWN_S="0.5",
        ),
    )
    port = int((data / "sidecar.port").read_text())
    [first] = _live_children(proc.pid, "mnemo_sidecar.cli")
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, proc.log.read_text()[-3000:]
        again = _live_children(proc.pid, "mnemo_sidecar.cli")
        if again and again != [first] and "the sidecar serves again" in proc.log.read_text():
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                try:
                    status = (
                        health_pb2_grpc.HealthStub(ch)
                        .Check(health_pb2.HealthCheckRequest(), timeout=2)
                        .status
                    )
                except grpc.RpcError:
                    status = None
            if status == health_pb2.HealthCheckResponse.SERVING:
                break
        time.sleep(0.2)
    log = proc.log.read_text()
    assert "the sidecar stopped (killed by SIGKILL); starting it again in 1 s" in log
    assert f"the sidecar serves again on 127.0.0.1:{port}" in log
    # The server orders sessions through it again: answered by the sidecar (a cold start, no
    # model yet), not a fallback for want of one.
    reasons = []
    with MnemoClient(proc.address) as client:
        client.create_memory(client.new_memory("the sidecar is back"), wait_for_index=True)
        while time.monotonic() < deadline:
            started = client.call(
                client.memory.StartSession,
                pb.StartSessionRequest(session_id=f"s{len(reasons)}", context="sidecar"),
            )
            reasons.append(started.ranking.fallback_reason)
            if reasons[-1] == "cold_start":
                break
            time.sleep(0.5)
    assert reasons[-1] == "cold_start", reasons
    port_file = tmp_path / "procs" / "mnemo1.port"
    assert port_file.read_text() == str(proc.port)
    # Ctrl-C reaches the whole process group: the sidecar that ends of it is not started
    # again while the server drains (shutdown probe: it was, 3 times of 3).
    said_before = len(proc.log.read_text())
    os.kill(again[0], signal.SIGINT)
    os.kill(proc.pid, signal.SIGINT)
    assert proc.popen.wait(60) == 0
    assert "starting it again" not in proc.log.read_text()[said_before:]
    assert not Path(f"/proc/{again[0]}").exists()  # stopped with it, and reaped
    # An orderly stop takes back its port file: left, it named a port nothing served.
    assert not port_file.exists()


def test_up_refuses_one_port_for_the_server_and_its_sidecar_before_starting_either(
    tmp_path: Path, model_cache: Path
) -> None:
    """It warmed up for ~24 s, then said the port was in use, its own sidecar holding it."""
    data = tmp_path / "d"
    started = time.monotonic()
    out = run(
        ["up", "--data-dir", str(data), "--port", "50999", "--sidecar-port", "50999"], base_env(model_cache)
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "Invalid value for --sidecar-port: 50999 is the server's port too" in out.stderr, out.stderr
    assert not data.exists() and time.monotonic() - started < 20


def test_listings_print_memories_and_history_as_stored_not_as_markup(
    server: LiveServer, tenant_a: TenantClient, model_cache: Path
) -> None:
    """The table took text as rich markup: "use [/] to close a tag" crashed `memory list`
    with a traceback, "[red]x[/red]" lost its brackets, and an actor "[/]" crashed
    `memory history` (maintenance probe)."""
    stub = tenant_a.memory()
    texts = ["use [/] to close a tag", "[red]x[/red] and [t_a] stay"]
    for text in texts:
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=memory_pb2.Memory(content=text)), metadata=tenant_a.md, timeout=10
        )
    odd = stub.CreateMemory(
        pb.CreateMemoryRequest(
            memory=memory_pb2.Memory(content="plain", source=common_pb2.Source(who="[/]"))
        ),
        metadata=tenant_a.md,
        timeout=10,
    ).memory
    env = base_env(model_cache, MNEMO_SERVER=server.address, MNEMO_API_KEY=tenant_a.token, COLUMNS="200")
    listed = run(["memory", "list"], env)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert all(text in listed.stdout for text in texts), listed.stdout
    history = run(["memory", "history", odd.id], env)
    assert history.returncode == 0 and "Traceback" not in history.stderr, history.stderr
    assert "[/]" in history.stdout


def test_an_interrupt_while_a_launched_server_warms_up_ends_it(model_cache: Path) -> None:
    """A Ctrl-C or SIGTERM to eval or bench while the server it started was warming up
    left that server running (it was not yet among the launcher's processes), writing into
    the temporary directory removed meanwhile (eval probe)."""
    import _thread
    import threading

    from mnemo_server.launcher import Launcher, stopped_after

    launcher = Launcher()
    timer = threading.Timer(0.5, _thread.interrupt_main)  # while the server loads its model
    timer.start()
    with pytest.raises(KeyboardInterrupt), stopped_after(launcher, lambda _said: None):
        launcher.start_server({"MNEMO_EMBEDDING__CACHE_DIR": str(model_cache), "HF_HUB_OFFLINE": "1"})
    timer.join()
    port_file_arg = str(launcher.root / "server.port").encode()
    assert [p for p in Path("/proc").iterdir() if p.name.isdigit() and port_file_arg in _cmdline(p)] == []
    time.sleep(1.0)
    assert not launcher.root.exists()  # nothing wrote into it again


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_server_stopped_while_it_warms_up_never_serves_and_drops_a_stale_port_file(
    tmp_path: Path, model_cache: Path
) -> None:
    """A SIGTERM during warm-up was answered by binding the port, reporting SERVING and
    writing the port file, then stopping; and the port file a kill -9 left named a dead
    port all through the next start (shutdown probe)."""
    port_file = tmp_path / "port"
    port_file.write_text("41975")  # what a server killed -9 left
    proc = subprocess.Popen(
        [*MNEMO, "serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--port-file", str(port_file)],
        env=base_env(model_cache, MNEMO_AUTH__ENABLED="false"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while port_file.exists():  # withdrawn before warm-up
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopped before serving" in err and "serving on" not in err, err
    assert not port_file.exists()
