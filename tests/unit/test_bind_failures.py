"""Why a server (or the sidecar, which uses the same GrpcServer) cannot listen is asked of
the operating system: grpc reports only that binding failed, and a port in use, an address
of another machine and a host that does not resolve all said "the port is in use"."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from dataclasses import replace

import pytest

from mnemo_server.api.interceptor import ApiInterceptor
from mnemo_server.api.server import GrpcServer, bind_failure_reason
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


def _bind_error(address: tuple[str, int]) -> OSError:
    with socket.socket() as probe:
        try:
            probe.bind(address)
        except OSError as exc:
            return exc
    raise AssertionError(f"{address} was free")


def test_a_port_in_use_is_named_before_an_address_this_machine_lacks(taken_port: int) -> None:
    """grpc fails a name only when all its addresses fail: `localhost` in a container
    without IPv6 fails on ::1 whatever else happens, so that failure must not hide a port
    in use on 127.0.0.1 (it was named first, as the resolver lists ::1 first)."""
    in_use = _bind_error(("127.0.0.1", taken_port))
    not_here = _bind_error(("192.0.2.1", taken_port))
    no_ipv6 = OSError(errno.EAFNOSUPPORT, os.strerror(errno.EAFNOSUPPORT))
    assert (in_use.errno, not_here.errno) == (errno.EADDRINUSE, errno.EADDRNOTAVAIL)
    for failures in ([not_here, in_use], [no_ipv6, in_use], [in_use, not_here]):
        assert bind_failure_reason("localhost", taken_port, failures, 2) == "the port is in use"
    assert bind_failure_reason("localhost", 80, [no_ipv6, not_here], 2) == (
        "server.host 'localhost' is not an address of this machine"
    )
    assert bind_failure_reason("localhost", 80, [no_ipv6], 1) == (
        f"{os.strerror(errno.EAFNOSUPPORT)} (EAFNOSUPPORT)"
    )


def test_an_address_that_binds_leaves_the_failure_to_grpc(taken_port: int) -> None:
    """One address of two binding means grpc's failure is not one the OS shows."""
    in_use = _bind_error(("127.0.0.1", taken_port))
    assert bind_failure_reason("localhost", taken_port, [in_use], 2) == (
        "grpc could not bind it (the operating system could)"
    )


def test_a_name_one_of_whose_addresses_has_the_port_taken_is_refused(taken_port: int) -> None:
    """grpc binds a name when any of its addresses binds: `localhost` with 127.0.0.1's port
    taken served on ::1 alone, and a client of 127.0.0.1 reached the other process."""
    assert _start("localhost", taken_port) == (
        f"cannot listen on localhost:{taken_port}: the port is in use on 127.0.0.1, one of the "
        "addresses 'localhost' stands for (a client of that address would reach the other process)"
    )


def test_a_name_whose_addresses_are_free_is_served() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = GrpcServer(replace(ServerConfig(), host="localhost", port=port), ApiInterceptor(_refuse))
    try:
        assert server.start() == port
    finally:
        server.stop(0)
