"""Commands that talk to a running server over gRPC, like any client."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import click
from google.protobuf import json_format
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from mnemo.v1 import memory_pb2
from mnemo_client.client import MEMORY_TYPES, TYPE_NAMES, MnemoClient, MnemoError
from mnemo_server.cli.common import F, Seconds
from mnemo_server.cli.export_output import export_output
from mnemo_server.jsonl import json_lines

_console = Console(stderr=True)


_TLS_CA = "mnemo.tls_ca"  # where --tls-ca's certificates are kept, in the context's meta


def _connect(ctx: click.Context) -> MnemoClient:
    obj: dict[str, Any] = ctx.obj
    return _client(obj["server"], obj["key"], obj["timeout"])


def _client(server: str, key: str | None, timeout: float) -> MnemoClient:
    """A client of the server, over TLS when --tls-ca named its certificate authority."""
    ca = click.get_current_context().meta.get(_TLS_CA)
    try:
        return MnemoClient(server, key, timeout_s=timeout, root_certificates=ca)
    except ValueError as exc:  # a key that cannot be sent
        raise click.UsageError(str(exc)) from None


def _read_ca(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        try:
            ctx.meta[_TLS_CA] = value.read_bytes()
        except OSError as exc:
            raise click.BadParameter(f"{value}: {exc.strerror or exc}") from None


def server_options(group: F) -> F:
    group = click.option(
        "--server",
        envvar="MNEMO_SERVER",
        default="127.0.0.1:50051",
        show_default=True,
        help="host:port (env: MNEMO_SERVER).",
    )(group)
    group = click.option(
        "--tls-ca",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        envvar="MNEMO_TLS_CA",
        expose_value=False,
        callback=_read_ca,
        help="PEM certificate(s) to trust: connect over TLS to a server with server.tls_cert_file "
        "(env: MNEMO_TLS_CA).",
    )(group)
    return click.option(
        "--timeout", type=Seconds(), default=30.0, show_default=True, help="Per-call deadline in seconds."
    )(group)


def _fail(err: MnemoError) -> None:
    raise click.ClickException(f"{err.code.name}: {err.message}")


# --- tenants and keys (admin key) ------------------------------------------------------


@click.group()
@server_options
@click.option("--admin-key", envvar="MNEMO_ADMIN_KEY", help="The server's admin key (env: MNEMO_ADMIN_KEY).")
@click.pass_context
def tenant(ctx: click.Context, server: str, timeout: float, admin_key: str | None) -> None:
    """Manage tenants (needs the admin key, or a local-mode server)."""
    ctx.obj = {"server": server, "key": admin_key, "timeout": timeout}


@tenant.command("create")
@click.argument("tenant_id")
@click.option("--name", default="", help="Display name.")
@click.pass_context
def tenant_create(ctx: click.Context, tenant_id: str, name: str) -> None:
    with _connect(ctx) as client:
        try:
            t = client.create_tenant(tenant_id, name)
        except MnemoError as err:
            _fail(err)
    click.echo(f"created tenant {t.id}")


@click.group()
@server_options
@click.option("--admin-key", envvar="MNEMO_ADMIN_KEY", help="The server's admin key (env: MNEMO_ADMIN_KEY).")
@click.pass_context
def key(ctx: click.Context, server: str, timeout: float, admin_key: str | None) -> None:
    """Manage API keys (needs the admin key, or a local-mode server)."""
    ctx.obj = {"server": server, "key": admin_key, "timeout": timeout}


@key.command("create")
@click.argument("tenant_id")
@click.option("--description", default="")
@click.pass_context
def key_create(ctx: click.Context, tenant_id: str, description: str) -> None:
    """Issue a key; the secret is printed once (stdout), the key id on stderr."""
    with _connect(ctx) as client:
        try:
            resp = client.create_api_key(tenant_id, description)
        except MnemoError as err:
            _fail(err)
    click.echo(
        f"key {resp.api_key.id} for tenant {tenant_id} (store the secret now; it is not shown again)",
        err=True,
    )
    click.echo(resp.secret)


@key.command("list")
@click.argument("tenant_id")
@click.pass_context
def key_list(ctx: click.Context, tenant_id: str) -> None:
    with _connect(ctx) as client:
        try:
            keys = client.list_api_keys(tenant_id)
        except MnemoError as err:
            _fail(err)
    for k in keys:
        state = "revoked" if k.HasField("revoke_time") else "active"
        click.echo(f"{k.id}\t{state}\t{k.description}")


@key.command("revoke")
@click.argument("key_id")
@click.pass_context
def key_revoke(ctx: click.Context, key_id: str) -> None:
    with _connect(ctx) as client:
        try:
            client.revoke_api_key(key_id)
        except MnemoError as err:
            _fail(err)
    click.echo(f"revoked {key_id}")


# --- memories (tenant key) ---------------------------------------------------------------


@click.group()
@server_options
@click.option("--api-key", envvar="MNEMO_API_KEY", help="Tenant API key (env: MNEMO_API_KEY).")
@click.pass_context
def memory(ctx: click.Context, server: str, timeout: float, api_key: str | None) -> None:
    """List, inspect, export, import and clear memories."""
    ctx.obj = {"server": server, "key": api_key, "timeout": timeout}


def _filter(mtype: str | None, category: str | None) -> memory_pb2.MemoryFilter:
    f = memory_pb2.MemoryFilter()
    if mtype:
        f.types.append(MEMORY_TYPES[mtype])
    if category:
        f.categories.append(category)
    return f


_TYPE_CHOICE = click.Choice(sorted(MEMORY_TYPES))


@memory.command("list")
@click.option("--type", "mtype", type=_TYPE_CHOICE)
@click.option("--category")
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="Memories to list at most."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def memory_list(
    ctx: click.Context, mtype: str | None, category: str | None, limit: int, as_json: bool
) -> None:
    with _connect(ctx) as client:
        try:
            rows = list(
                client.list_memories(_filter(mtype, category), page_size=min(limit, 1000), limit=limit)
            )
        except MnemoError as err:
            _fail(err)
    if as_json:
        for m in rows:
            click.echo(json_format.MessageToJson(m, preserving_proto_field_name=True, indent=None))
        return
    table = Table("id", "type", "category", "created", "content")
    for m in rows:
        # Text, not markup: "use [/] to close" crashed the listing, "[red]x[/red]" lost its
        # brackets (probe).
        table.add_row(
            m.id[:8],
            TYPE_NAMES[m.type],
            Text(m.category),
            m.create_time.ToDatetime().isoformat(" ", "seconds"),
            Text(m.content if len(m.content) < 80 else m.content[:77] + "..."),
        )
    Console().print(table)


@memory.command("get")
@click.argument("memory_id")
@click.pass_context
def memory_get(ctx: click.Context, memory_id: str) -> None:
    """Print one memory as JSON (id, or external:<id>)."""
    with _connect(ctx) as client:
        try:
            m = client.get_memory(memory_id)
        except MnemoError as err:
            _fail(err)
    click.echo(json_format.MessageToJson(m, preserving_proto_field_name=True))


@memory.command("history")
@click.argument("memory_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def memory_history(ctx: click.Context, memory_id: str, as_json: bool) -> None:
    """What happened to a memory and why, oldest first (id, or external:<id> of a live one)."""
    with _connect(ctx) as client:
        try:
            entries = list(client.memory_history(memory_id))
        except MnemoError as err:
            _fail(err)
    if as_json:
        for e in entries:  # every field, empty ones too: one shape a line
            line = json_format.MessageToJson(
                e, preserving_proto_field_name=True, indent=None, always_print_fields_with_no_presence=True
            )
            click.echo(line)
        return
    table = Table("time", "action", "actor", "reason", "details")
    for e in entries:
        details = json_format.MessageToDict(e.details)
        table.add_row(
            e.time.ToDatetime().isoformat(" ", "seconds"),
            e.action,
            Text(e.actor),
            Text(e.reason),
            Text(json.dumps(details, sort_keys=True) if details else ""),
        )
    Console().print(table)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_console,
    )


@memory.command("export")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="JSONL file, one memory per line ('-' for stdout).",
)
@click.option("--include-deleted", is_flag=True, help="Also export tombstoned memories.")
@click.pass_context
def memory_export(ctx: click.Context, output: Path, include_deleted: bool) -> None:
    """Export memories as JSONL (everything needed to restore them with `import`)."""
    with export_output(output) as out:
        n = _export(ctx, out, include_deleted)
    _console.print(f"exported {n} memories")


def _export(ctx: click.Context, out: TextIO, include_deleted: bool) -> int:
    """Write the memories to out, one JSON object a line; how many were exported."""
    n = 0
    try:
        with _connect(ctx) as client, _progress() as bar:
            task = bar.add_task("exporting", total=None)
            # --timeout bounds each wait for the server, not the whole export.
            for batch in client.export_memories(
                include_deleted=include_deleted, idle_timeout_s=ctx.obj["timeout"]
            ):
                for m in batch.memories:
                    out.write(
                        json_format.MessageToJson(m, preserving_proto_field_name=True, indent=None) + "\n"
                    )
                n = batch.exported_count
                bar.update(task, completed=batch.exported_count, total=batch.total_count)
    except MnemoError as err:
        _fail(err)
    return n


def _memories(path: Path) -> Iterator[tuple[int, memory_pb2.Memory]]:
    """The file's memories with their line numbers; a line that is not one is a one-line
    error naming it."""
    for lineno, value in json_lines(path, click.ClickException):
        if not isinstance(value, dict):
            # ParseDict takes any JSON value: a number, null or true ended in a traceback.
            raise click.ClickException(
                f"{path}:{lineno}: not an exported memory (a JSON {_json_kind(value)}, not an object)"
            )
        try:
            yield lineno, json_format.ParseDict(value, memory_pb2.Memory())
        except json_format.ParseError as exc:
            raise click.ClickException(f"{path}:{lineno}: not an exported memory ({exc})") from None


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "number"
    return "string" if isinstance(value, str) else "array"


def _batches(
    memories: Iterable[tuple[int, memory_pb2.Memory]], size: int
) -> Iterator[list[memory_pb2.Memory]]:
    batch: list[memory_pb2.Memory] = []
    for _, m in memories:
        batch.append(m)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


_IN_STREAM = re.compile(r"^messages\[(\d+)\]\.memories\[(\d+)\]")


def _refused_line(err: MnemoError, lines: list[int], batch_size: int) -> int | None:
    """The file line of the memory a refusal names (messages[i].memories[j]), if it names one."""
    for f in err.fields:
        found = _IN_STREAM.match(f)
        if found:
            at = int(found.group(1)) * batch_size + int(found.group(2))
            return lines[at] if at < len(lines) else None
    return None


@memory.command("import")
@click.argument("path", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=200,
    show_default=True,
    help="Memories per message (at most the server's limits.max_batch_size).",
)
@click.pass_context
def memory_import(ctx: click.Context, path: Path, batch_size: int) -> None:
    """Restore memories from an export (already-present ids are skipped, so re-running is safe)."""
    # The whole file is read once before anything is sent: a bad line fails the command
    # with nothing imported, not after the batches before it. It is parsed again as it is
    # sent rather than kept: an export of 100k memories would otherwise sit in memory whole.
    batches: Iterable[list[memory_pb2.Memory]]
    if path.is_file():
        lines = [n for n, _ in _memories(path)]
        batches = _batches(_memories(path), batch_size)
    else:  # a pipe (export -o - | import /dev/stdin) reads once: it read as empty the second time
        kept = list(_memories(path))
        lines = [n for n, _ in kept]
        batches = _batches(kept, batch_size)
    last = None
    try:
        with _connect(ctx) as client, _progress() as bar:
            task = bar.add_task("importing", total=len(lines))
            for last in client.import_memories(batches, idle_timeout_s=ctx.obj["timeout"]):
                bar.update(task, completed=last.received_count)
    except MnemoError as err:
        # Name the file's line, and what the messages before it did (each is applied as it
        # comes: a re-run skips them).
        line = _refused_line(err, lines, batch_size)
        where = f"{path}:{line}: " if line is not None else ""
        done = f" ({last.imported_count} imported before it, {last.skipped_count} skipped)" if last else ""
        raise click.ClickException(f"{where}{err.code.name}: {err.message}{done}") from None
    imported, skipped = (last.imported_count, last.skipped_count) if last else (0, 0)
    _console.print(f"imported {imported} memories, skipped {skipped}")


def _purge_confirmed(client: MnemoClient, f: memory_pb2.MemoryFilter, all_memories: bool) -> int:
    """Count, ask, and delete what was counted, not what came while the prompt waited (probe:
    5 confirmed, 105 deleted). The purge passes back the count's snapshot token, so it
    deletes only memories already stored at the count, whatever their create_time (a bound
    by create_time, this machine's clock, kept imports dated before it and deleted them)."""
    counted = client.count_purge(f, all_memories=all_memories)
    n = counted.purge_count
    if n:
        if not click.confirm(f"delete {n} memories?"):
            # Said, and exit 1: a declined prompt ended as an interrupt would, exit 130 with
            # nothing printed (probe).
            raise click.ClickException("not confirmed: nothing deleted")
        n = client.purge_memories(
            f, force=True, all_memories=all_memories, snapshot_token=counted.snapshot_token
        )
    return n


@memory.command("clear")
@click.option("--type", "mtype", type=_TYPE_CHOICE, help="Only this type.")
@click.option("--category", help="Only this category.")
@click.option("--force", is_flag=True, help="Skip the confirmation prompt.")
@click.pass_context
def memory_clear(ctx: click.Context, mtype: str | None, category: str | None, force: bool) -> None:
    """Delete memories (all, or of one type/category). They are tombstoned, then purged
    after the retention window."""
    f = _filter(mtype, category)
    with _connect(ctx) as client:
        try:
            if force:
                n = client.purge_memories(f, force=True, all_memories=not (mtype or category))
            else:
                n = _purge_confirmed(client, f, all_memories=not (mtype or category))
        except MnemoError as err:
            _fail(err)
    click.echo(f"deleted {n} memories")


@click.command()
@server_options
@click.option("--api-key", envvar="MNEMO_API_KEY")
@click.option("--json", "as_json", is_flag=True)
def status(server: str, timeout: float, api_key: str | None, as_json: bool) -> None:
    """Counts, index lag and model identity for your tenant."""
    with _client(server, api_key, timeout) as client:
        try:
            s = client.status()
        except MnemoError as err:
            _fail(err)
    data = json_format.MessageToDict(
        s, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    # The histograms are for programs (the JSON has them); people get each method's figures.
    data.pop("latency_bucket_upper_ms", None)
    data.pop("method_latencies", None)
    data.pop("interpreter_lock_wait", None)
    for k, v in data.items():
        click.echo(f"{k}: {v}")
    w = s.interpreter_lock_wait
    if w.samples:
        click.echo(
            f"wait for the interpreter lock since it started (ms): p50 {w.p50_ms:.2f}, "
            f"p99 {w.p99_ms:.2f}, max {w.max_ms:.1f} ({w.samples} wake-ups, one every {w.interval_ms:g} ms)"
        )
    if s.method_latencies:
        click.echo("time inside the server per method since it started (ms):")
        for m in s.method_latencies:
            click.echo(
                f"  {m.method}: {m.calls} calls, {m.failed} failed, "
                f"p50 {m.p50_ms:.1f}, p99 {m.p99_ms:.1f}, max {m.max_ms:.1f}"
            )


@click.command()
@server_options
@click.option("--service", default="", help="A service name; empty checks the whole server.")
def health(server: str, timeout: float, service: str) -> None:
    """Exit 0 when the server reports SERVING (for container health checks)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with _client(server, None, timeout) as client:  # its channel: plaintext, or TLS with --tls-ca
        # The typing stubs for grpc_health declare HealthStub without its methods.
        stub: Any = health_pb2_grpc.HealthStub(client.channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            raise click.ClickException(f"{err.code().name}: {err.details()}") from None
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    click.echo(name)
    if resp.status != health_pb2.HealthCheckResponse.SERVING:
        raise SystemExit(1)
