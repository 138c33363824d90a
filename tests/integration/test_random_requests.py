"""Random requests to every RPC of a real server and sidecar, built from the proto descriptors:
each gets a status a client can act on (never INTERNAL, UNKNOWN or UNAVAILABLE), an
INVALID_ARGUMENT names the field it refuses, no call hangs, and both processes still serve
afterwards.

Requests mix hostile values (NaN, extreme integers and timestamps, unknown enum numbers,
oversized strings and lists, NUL bytes) with ordinary ones, and ids the servers handed out
earlier in the run, so calls also reach past validation into the stores. The seed is fixed:
a failure names the method and prints the request that caused it."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import descriptor, message, symbol_database

from mnemo.ranking.v1 import ranking_service_pb2, ranking_service_pb2_grpc
from mnemo.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    learning_service_pb2,
    learning_service_pb2_grpc,
    memory_service_pb2,
    memory_service_pb2_grpc,
    skill_service_pb2,
    skill_service_pb2_grpc,
)
from tests.conftest import ADMIN_KEY, LiveServer, bearer, error_info, provision

FD = descriptor.FieldDescriptor
ROUNDS = 6
ACTIONABLE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
}
HOSTILE_STRINGS = ["", " ", "x" * 300, "y" * 70_000, "\x00", "e\u0301", "💥" * 10, "../../etc/passwd",
                   "' OR 1=1 --", "%s%n", "-1", "NaN", "*", "\n\t"]  # fmt: skip
PLAIN_STRINGS = ["Alice likes green tea", "the release plan for Q3", "ok", "session", "project", "default"]
SIGNED = {FD.TYPE_INT32: 32, FD.TYPE_SINT32: 32, FD.TYPE_SFIXED32: 32, FD.TYPE_INT64: 64,
          FD.TYPE_SINT64: 64, FD.TYPE_SFIXED64: 64}  # fmt: skip
UNSIGNED = {FD.TYPE_UINT32: 32, FD.TYPE_FIXED32: 32, FD.TYPE_UINT64: 64, FD.TYPE_FIXED64: 64}


class RequestMaker:
    """Random messages for a descriptor; `hostile` picks the value pools per request."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.hostile = False
        self.ids: list[str] = []  # ids the servers returned, reused as any string field

    # Messages and fields are Any: filled through reflection, whatever their generated type.
    def fill(self, msg: Any, depth: int = 0) -> None:
        rng, name = self.rng, msg.DESCRIPTOR.full_name
        if name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
            extremes = [0, -1, 253_402_300_800, -62_135_596_801, 2**62]
            msg.seconds = rng.choice(extremes) if self.hostile else rng.randint(1_600_000_000, 1_800_000_000)
            msg.nanos = rng.choice([0, 999_999_999, 1_000_000_000, -1]) if self.hostile else 0
            return
        if name == "google.protobuf.FieldMask":
            paths = ["content", "importance", "metadata", "tags", "bogus", ""]
            msg.paths.extend(rng.sample(paths, rng.randint(0, 2)))
            return
        if name == "google.protobuf.Struct":
            msg.update({"k": rng.choice(["v", 1, 2.5, None, [1, "a"], {"n": {"m": 1}}])})
            return
        if name.startswith("google.protobuf.") or depth > 4:
            return
        chosen_oneofs: set[str] = set()
        for field in msg.DESCRIPTOR.fields:
            oneof = field.containing_oneof
            if oneof is not None and (oneof.name in chosen_oneofs or rng.random() < 0.5):
                continue
            if rng.random() < (0.35 if self.hostile else 0.6):
                continue
            if oneof is not None:
                chosen_oneofs.add(oneof.name)
            self._fill_field(msg, field, depth)

    def _fill_field(self, msg: Any, field: Any, depth: int) -> None:
        rng = self.rng
        value = getattr(msg, field.name)
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            key_field, value_field = entry.fields_by_name["key"], entry.fields_by_name["value"]
            for _ in range(rng.choice([0, 1, 2, 40])):
                key = self.scalar(key_field)
                if value_field.message_type is not None:
                    self.fill(value[key], depth + 1)
                else:
                    value[key] = self.scalar(value_field)
        elif field.is_repeated:
            sizes = [0, 1, 2, 5, 60, 1200] if self.hostile and depth < 2 else [0, 1, 2]
            for _ in range(rng.choice(sizes)):
                if entry is not None:
                    self.fill(value.add(), depth + 1)
                else:
                    value.append(self.scalar(field))
        elif entry is not None:
            self.fill(value, depth + 1)
        else:
            setattr(msg, field.name, self.scalar(field))

    def scalar(self, field: Any) -> Any:
        rng, kind = self.rng, field.type
        if kind == FD.TYPE_STRING:
            if self.ids and rng.random() < 0.4:
                return rng.choice(self.ids)
            return rng.choice(HOSTILE_STRINGS if self.hostile else PLAIN_STRINGS)
        if kind == FD.TYPE_BYTES:
            return rng.choice([b"", b"\x00" * 10, rng.randbytes(20)])
        if kind == FD.TYPE_BOOL:
            return rng.random() < 0.5
        if kind in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
            if not self.hostile:
                return rng.choice([0.0, 0.25, 0.5, 1.0, -0.5])
            big = 1e308 if kind == FD.TYPE_DOUBLE else 3e38
            return rng.choice([-0.0, 2.0, big, -big, math.inf, -math.inf, math.nan, 1e-40])
        if kind == FD.TYPE_ENUM:
            numbers = [v.number for v in field.enum_type.values]
            return rng.choice([*numbers, 99, -1] if self.hostile else numbers)
        if not self.hostile:
            return rng.choice([0, 1, 2, 5, 10, 50])
        if kind in SIGNED:
            bits = SIGNED[kind]
            return rng.choice([-1, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1, 10**6])
        return rng.choice([2 ** UNSIGNED[kind] - 1, 10**6])

    def harvest(self, msg: message.Message) -> None:
        """Keep the ids a response names, for later requests."""
        for field, value in msg.ListFields():
            if field.message_type is not None:
                if not field.message_type.GetOptions().map_entry:
                    for item in list(value if field.is_repeated else [value])[:20]:
                        self.harvest(item)
            elif field.type == FD.TYPE_STRING and (field.name == "id" or field.name.endswith("_id")):
                values = value if field.is_repeated else [value]
                self.ids.extend(v for v in values if v and v not in self.ids)


def _problem(err: grpc.RpcError) -> str | None:
    code = err.code()
    if code not in ACTIONABLE:
        return f"{code.name}: {err.details()}"
    if code == grpc.StatusCode.INVALID_ARGUMENT and not error_info(err)[1]:
        return f"INVALID_ARGUMENT naming no field: {err.details()}"
    return None


def _call(stub: Any, method: descriptor.MethodDescriptor, request: message.Message, md: Any) -> list[Any]:
    call = getattr(stub, method.name)
    if method.client_streaming:
        return list(call(iter([request]), metadata=md, timeout=30))
    if method.server_streaming:
        return list(call(request, metadata=md, timeout=30))
    return [call(request, metadata=md, timeout=30)]


def test_random_requests_get_actionable_statuses(
    start_server: Callable[..., LiveServer], start_sidecar: Callable[..., Any]
) -> None:
    side = start_sidecar()
    live = start_server(ranking={"sidecar_address": f"127.0.0.1:{side.port}"})
    channel = live.channel()
    side_channel = grpc.insecure_channel(f"127.0.0.1:{side.port}")
    tenant_md = bearer(provision(live, "tenant-a"))
    memory = memory_service_pb2_grpc.MemoryServiceStub(channel)
    ranking = ranking_service_pb2_grpc.RankingServiceStub(side_channel)
    learning = learning_service_pb2_grpc.LearningServiceStub(channel)
    admin = admin_service_pb2_grpc.AdminServiceStub(channel)
    services: list[tuple[Any, str, Any, Any]] = [
        (memory_service_pb2, "MemoryService", memory, tenant_md),
        (learning_service_pb2, "LearningService", learning, tenant_md),
        (skill_service_pb2, "SkillService", skill_service_pb2_grpc.SkillServiceStub(channel), tenant_md),
        (admin_service_pb2, "AdminService", admin, bearer(ADMIN_KEY)),
        (ranking_service_pb2, "RankingService", ranking, ()),
    ]
    maker = RequestMaker(random.Random(20261126))
    symbols = symbol_database.Default()
    problems: list[str] = []
    calls = answered = 0
    try:
        for _ in range(ROUNDS):
            for module, service, stub, md in services:
                for method in module.DESCRIPTOR.services_by_name[service].methods:
                    maker.hostile = maker.rng.random() < 0.4
                    request = symbols.GetSymbol(method.input_type.full_name)()
                    maker.fill(request)
                    calls += 1
                    try:
                        replies = _call(stub, method, request, md)
                    except grpc.RpcError as err:
                        problem = _problem(err)
                        if problem:
                            shown = str(request)[:400]
                            problems.append(f"{service}.{method.name}: {problem}\n  request: {shown}")
                        continue
                    answered += 1
                    for reply in replies:
                        maker.harvest(reply)
        # Both processes still serve.
        memory.GetStatus(memory_service_pb2.GetStatusRequest(), metadata=tenant_md, timeout=10)
        ranking.GetModelStatus(ranking_service_pb2.GetModelStatusRequest(tenant_id="tenant-a"), timeout=10)
    finally:
        side_channel.close()
    # Enough calls got past validation to exercise the stores, not only the validators.
    assert answered > calls // 8, f"{answered} of {calls} calls answered"
    assert maker.ids, "no call returned an id"
    assert not problems, "\n".join(problems)
