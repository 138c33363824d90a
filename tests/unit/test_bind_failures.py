"""Why a server (or the sidecar, which uses the same GrpcServer) cannot listen is asked of
the operating system: grpc reports only that binding failed, and a port in use, an address
of another machine and a host that does not resolve all said "the port is in use"."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace

import pytest

from mnemo_server.api.interceptor import ApiInterceptor
from mnemo_server.api.server import GrpcServer
from mnemo_server.config import ServerConfig
from mnemo_server.errors import FailedPrecondition, Unauthenticated
from mnemo_server.tenancy.tenants import Principal


def _refuse(_token: str) -> Principal:
    raise Unauthenticated("no callers in this test")


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _start(host: str, port: int) -> str:
    server = GrpcServer(replace(ServerConfig(), host=host, port=port), ApiInterceptor(_refuse))
    try:
        with pytest.raises(FailedPrecondition) as err:
            server.start()
    finally:
        server.stop(0)
    assert err.value.reason == "BIND_FAILED"
    return err.value.message


def test_a_port_in_use_says_so(taken_port: int) -> None:
    assert _start("127.0.0.1", taken_port) == f"cannot listen on 127.0.0.1:{taken_port}: the port is in use"


def test_an_address_of_another_machine_says_so() -> None:
    # 192.0.2.0/24 is reserved for documentation (RFC 5737): no machine has it.
    assert _start("192.0.2.1", 0) == (
        "cannot listen on 192.0.2.1:0: server.host '192.0.2.1' is not an address of this machine"
    )


def test_a_host_that_does_not_resolve_says_so() -> None:
    message = _start("mnemo.invalid", 0)  # .invalid never resolves (RFC 2606)
    assert message.startswith(
        "cannot listen on mnemo.invalid:0: server.host 'mnemo.invalid' does not resolve ("
    )


def test_the_same_port_on_another_loopback_family_is_free(taken_port: int) -> None:
    """Taken on 127.0.0.1, the port is free on ::1: a server there starts (IPv6 allowing)."""
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    server = GrpcServer(replace(ServerConfig(), host="::1", port=taken_port), ApiInterceptor(_refuse))
    try:
        assert server.start() == taken_port
    finally:
        server.stop(0)
