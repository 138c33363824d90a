"""The committed TypeScript example, run with Node (@grpc/grpc-js) against a live server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest

from mnemo.v1 import memory_service_pb2 as pb
from tests.conftest import REPO, LiveServer, TenantClient

NODE_DIR = REPO / "clients" / "node"
TSX = NODE_DIR / "node_modules" / ".bin" / "tsx"


@pytest.fixture(scope="module")
def node_ready() -> None:
    assert shutil.which("node"), "node is required (the README's set-up installs it)"
    assert TSX.exists(), "clients/node/node_modules is missing: run `npm ci` in clients/node"


def test_typescript_stubs_typecheck(node_ready: None) -> None:
    out = subprocess.run(
        [str(NODE_DIR / "node_modules" / ".bin" / "tsc"), "--noEmit", "-p", str(NODE_DIR)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _run_typescript(args: list[str], server: LiveServer, tenant: TenantClient, **env_extra: str) -> Any:
    """Run tsx with `args` in clients/node against the server as the tenant (a file, or
    `-e` and a program); the JSON of its last line of output."""
    env = {**os.environ, "MNEMO_ADDR": server.address, "MNEMO_API_KEY": tenant.token, **env_extra}
    out = subprocess.run(
        [str(TSX), *args],
        cwd=NODE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_quickstart_example_against_live_server(
    node_ready: None, server: LiveServer, tenant_a: TenantClient
) -> None:
    result = _run_typescript(["examples/quickstart.ts"], server, tenant_a, MNEMO_PROJECT="ts")
    assert len(result["created"]) == 3
    assert result["topHit"] == "Release 4.2 was rolled back because of a slow migration."
    assert result["topHitScores"]["vectorRank"] >= 1
    assert len(result["firstPage"]) == 2 and result["hasNextPage"] is True
    # The reason a refusal carries in its trailer, decoded by the shipped helper (src/errors.ts).
    refused = {"code": 5, "reason": "MEMORY_NOT_FOUND", "fields": []}
    assert result["refused"] == {**refused, "metadata": {"resource": "memory", "id": "external:nowhere"}}
    # The memories are really there, with the metadata Node sent.
    m = (
        tenant_a.memory()
        .GetMemory(pb.GetMemoryRequest(id="external:node-1"), metadata=tenant_a.md, timeout=5)
        .memory
    )
    assert m.id == result["created"][1] and dict(m.metadata) == {"client": "node", "n": 1.0}
    # Running it again is idempotent (same request ids): no new memories.
    again = _run_typescript(["examples/quickstart.ts"], server, tenant_a, MNEMO_PROJECT="ts")
    assert again["created"] == result["created"]


_ROUND_TRIP = """
import { credentials, Metadata } from "@grpc/grpc-js";
import { CreateMemoryRequest, MemoryServiceClient } from "./src/gen/mnemo/v1/memory_service";

const client = new MemoryServiceClient(process.env.MNEMO_ADDR!, credentials.createInsecure());
const md = new Metadata();
md.set("authorization", `Bearer ${process.env.MNEMO_API_KEY}`);
const eventTime = { seconds: -2, nanos: 500_000_001 }; // 1969-12-31T23:59:58.500000001Z
const memory = { content: "a note from before 1970", eventTime };
const request = CreateMemoryRequest.fromPartial({ memory });
client.createMemory(request, md, (err, res) => {
  if (err) { console.log(JSON.stringify({ error: err.details })); process.exit(0); }
  client.getMemory({ id: res.memory!.id }, md, (err2, got) => {
    if (err2) throw err2;
    const m = got.memory!;
    console.log(JSON.stringify({ id: m.id, eventTime: m.eventTime, createTime: m.createTime }));
    client.close();
  });
});
"""


def test_timestamps_round_trip_from_node_to_the_nanosecond_before_1970(
    node_ready: None, server: LiveServer, tenant_a: TenantClient
) -> None:
    """As Dates, times before 1970 with a fraction went out with negative nanos (refused:
    'nanos must be between 0 and 999,999,999'), and every time lost its sub-milliseconds
    (an export re-imported from Node changed them)."""
    result = _run_typescript(["-e", _ROUND_TRIP], server, tenant_a)
    assert result.get("eventTime") == {"seconds": -2, "nanos": 500_000_001}, result
    m = (
        tenant_a.memory()
        .GetMemory(pb.GetMemoryRequest(id=result["id"]), metadata=tenant_a.md, timeout=5)
        .memory
    )
    assert (m.event_time.seconds, m.event_time.nanos) == (-2, 500_000_001)
    assert (m.create_time.seconds, m.create_time.nanos) == (
        result["createTime"]["seconds"],
        result["createTime"]["nanos"],
    )


_REFUSED_FIELDS = """
import { credentials, Metadata, type ServiceError } from "@grpc/grpc-js";
import { errorDetails } from "./src/errors";
import { CreateMemoryRequest, MemoryServiceClient } from "./src/gen/mnemo/v1/memory_service";

const client = new MemoryServiceClient(process.env.MNEMO_ADDR!, credentials.createInsecure());
const md = new Metadata();
md.set("authorization", `Bearer ${process.env.MNEMO_API_KEY}`);
const request = CreateMemoryRequest.fromPartial({ memory: { content: "" } });
client.createMemory(request, md, (err: ServiceError | null) => {
  console.log(JSON.stringify(err ? { code: err.code, ...errorDetails(err) } : null));
  client.close();
});
"""


def test_a_refusals_fields_are_read_from_node_with_the_shipped_helper(
    node_ready: None, server: LiveServer, tenant_a: TenantClient
) -> None:
    """The stubs held no google.rpc types: a Node caller could not read which field was at
    fault, nor the reason, without writing its own decoder."""
    refused = _run_typescript(["-e", _REFUSED_FIELDS], server, tenant_a)
    assert refused["code"] == 3 and [f["field"] for f in refused["fields"]] == ["memory.content"], refused
