"""The gRPC server: servicers behind the API interceptor, plus grpc.health.v1 (per service)
and server reflection. SERVING only once everything is open; NOT_SERVING before draining."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket
import ssl
import sys
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mnemo_server.api.interceptor import ApiInterceptor
from mnemo_server.config import ServerConfig
from mnemo_server.errors import FailedPrecondition

MAX_MESSAGE_BYTES = 32 * 1024 * 1024


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None)
            )
        except OSError:
            return False


def listen_address(host: str, port: int) -> str:
    """host:port as gRPC parses it: an IPv6 literal such as ::1 needs its brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def announce_listening(name: str, host: str, port: int, port_file: Path | None) -> None:
    """Say where a served process (server or sidecar) listens: the port in `port_file`,
    written whole and then renamed so that a launcher never reads half of it, and a line on
    stderr."""
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.replace(port_file)
    print(f"{name} listening on {listen_address(host, port)}", file=sys.stderr, flush=True)


def withdraw_port_file(port_file: Path | None, port: int) -> None:
    """At an orderly stop: remove the port file if it still names this process's port (a
    later start may have written its own). Left behind, it named a port nothing served, and
    a supervisor waiting for the file took it for the next start's (CLI probe)."""
    if port_file is None:
        return
    # Gone already, or unreadable: not this process's to put right as it exits.
    with contextlib.suppress(OSError):
        if port_file.read_text().strip() == str(port):
            port_file.unlink()


def why_not_bound(host: str, port: int) -> str:
    """Why the address cannot be listened on, asked of the OS: grpc says only that it
    failed, and a port in use, a port below 1024 without the privilege and a host that is
    not this machine's all read "the port is in use" before. A plain socket binds each
    address the host resolves to the same way (SO_REUSEADDR, as grpc sets it)."""
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        return f"server.host {host!r} does not resolve ({exc.strerror})"
    failures = [e for family, _, _, _, address in infos if (e := bind_error(family, address))]
    return bind_failure_reason(host, port, failures, len(infos))


def bind_error(family: socket.AddressFamily, address: tuple[Any, ...]) -> OSError | None:
    """What binding a TCP socket to `address` the way grpc does (SO_REUSEADDR) raises."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return exc
    return None


def taken_address(host: str, port: int) -> str | None:
    """For a host name (not an address) and a fixed port: an address the name stands for
    whose port another socket holds, or None. grpc binds a name if any of its addresses
    binds, and it takes `localhost` as ::1 and 127.0.0.1 whatever the hosts file says
    (checked here: with 127.0.0.1's port taken, `localhost` served on ::1 alone), so the
    server would start and a client of 127.0.0.1 would reach the other process."""
    name = host.strip("[]")
    if not port or not name:
        return None
    try:
        ipaddress.ip_address(name)
        return None  # an address: grpc binds it alone, and reports its failure
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return None  # grpc fails it too, and why_not_bound says why
    addresses = [(family, address) for family, _, _, _, address in infos]
    if name == "localhost":
        addresses += [(socket.AF_INET6, ("::1", port, 0, 0)), (socket.AF_INET, ("127.0.0.1", port))]
    for family, address in dict.fromkeys(addresses):  # the resolver may list a loopback too
        exc = bind_error(family, address)
        if exc is not None and exc.errno == errno.EADDRINUSE:
            return str(address[0])
    return None


# Most telling first; errors not named rank between the two groups. grpc fails a name only
# when every address it resolves to fails (`localhost` is ::1 and 127.0.0.1): in a container
# without IPv6, ::1 always fails, and naming that failure hid the one that mattered, a port
# in use on 127.0.0.1.
_TELLING = (errno.EADDRINUSE, errno.EACCES)
_LEAST_TELLING = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


def bind_failure_reason(host: str, port: int, failures: list[OSError], addresses: int) -> str:
    """The reason to report for `failures`, the binds that failed of the `addresses` the
    host resolves to: a port in use or a privilege before an address this machine lacks."""
    if len(failures) < addresses or not failures:
        return "grpc could not bind it (the operating system could)"

    def rank(exc: OSError) -> int:
        if exc.errno in _TELLING:
            return _TELLING.index(exc.errno)
        if exc.errno in _LEAST_TELLING:
            return len(_TELLING) + 1 + _LEAST_TELLING.index(exc.errno)
        return len(_TELLING)

    exc = min(failures, key=rank)  # the first of equals: the resolver's order
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use"
    if exc.errno == errno.EACCES:
        return f"permission denied (port {port} needs privileges, or a policy forbids it)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"server.host {host!r} is not an address of this machine"
    return f"{exc.strerror} ({errno.errorcode.get(exc.errno or 0, exc.errno)})"


def tls_credentials(cfg: ServerConfig) -> grpc.ServerCredentials | None:
    """The server's TLS credentials from its two settings, read and checked when the server
    is made (before any warm-up): None when neither is set. One set alone, a file that
    cannot be read or one that is not PEM, a key that is not the certificate's or is
    encrypted, is a one-line BAD_CONFIG naming the setting (a key alone used to serve
    plaintext; a cert or key grpc could not use was reported as a port in use)."""
    if not cfg.tls_cert_file and not cfg.tls_key_file:
        return None
    if not (cfg.tls_cert_file and cfg.tls_key_file):
        missing = "server.tls_key_file" if cfg.tls_cert_file else "server.tls_cert_file"
        raise FailedPrecondition(
            f"config {missing}: must be set too (TLS needs a certificate and its key), or neither",
            reason="BAD_CONFIG",
        )
    pem = {}
    for setting, path, kind in (
        ("server.tls_cert_file", cfg.tls_cert_file, b"CERTIFICATE"),
        ("server.tls_key_file", cfg.tls_key_file, b"PRIVATE KEY"),
    ):
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise FailedPrecondition(
                f"config {setting}: cannot read {path!r}: {exc.strerror or exc}", reason="BAD_CONFIG"
            ) from None
        if b"-----BEGIN " not in data or kind not in data:
            raise _bad_tls(setting, path, f"is not a PEM {kind.decode().lower()}")
        pem[setting] = data
    _check_key_pair(cfg.tls_cert_file, cfg.tls_key_file)
    return grpc.ssl_server_credentials([(pem["server.tls_key_file"], pem["server.tls_cert_file"])])


class _KeyEncrypted(Exception):
    """The key asked for a passphrase."""


def _no_passphrase() -> str:
    # Without a callback OpenSSL would prompt for it on the terminal, holding start-up.
    raise _KeyEncrypted


def _check_key_pair(cert_file: str, key_file: str) -> None:
    """The certificate reads and the key is its own, unencrypted, as grpc needs them: grpc
    finds out only when binding the port, which the server reported as the port in use."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=cert_file)
    except ssl.SSLError as exc:
        raise _bad_tls(
            "server.tls_cert_file", cert_file, f"is not a certificate that reads ({exc})"
        ) from None
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_passphrase)
    except _KeyEncrypted:
        raise _bad_tls(
            "server.tls_key_file", key_file, "is encrypted: the server needs it without a passphrase"
        ) from None
    except ssl.SSLError as exc:
        problem = (
            "does not belong to the certificate of server.tls_cert_file"
            if exc.reason == "KEY_VALUES_MISMATCH"
            else f"is not a private key that reads ({exc})"
        )
        raise _bad_tls("server.tls_key_file", key_file, problem) from None


def _bad_tls(setting: str, path: str, problem: str) -> FailedPrecondition:
    return FailedPrecondition(f"config {setting}: {path!r} {problem}", reason="BAD_CONFIG")


class GrpcServer:
    def __init__(self, cfg: ServerConfig, interceptor: ApiInterceptor):
        self.cfg = cfg
        self.interceptor = interceptor
        self.credentials = tls_credentials(cfg)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.max_workers, thread_name_prefix="mnemo-rpc"),
            interceptors=[interceptor],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        self.health = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names: list[str] = []
        self.port = 0

    def add(self, add_fn: Any, servicer: Any, full_name: str) -> None:
        add_fn(servicer, self.server)
        self.service_names.append(full_name)

    def start(self) -> int:
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        address = listen_address(self.cfg.host, self.cfg.port)
        if taken := taken_address(self.cfg.host, self.cfg.port):
            raise FailedPrecondition(
                f"cannot listen on {address}: the port is in use on {taken}, one of the addresses "
                f"{self.cfg.host!r} stands for (a client of that address would reach the other process)",
                reason="BIND_FAILED",
            )
        try:
            if self.credentials is not None:
                self.port = self.server.add_secure_port(address, self.credentials)
            else:
                self.port = self.server.add_insecure_port(address)
        except RuntimeError:  # a port in use: grpcio raises where older versions returned 0
            self.port = 0
        if self.port == 0:
            raise FailedPrecondition(
                f"cannot listen on {address}: {why_not_bound(self.cfg.host, self.cfg.port)}",
                reason="BIND_FAILED",
            )
        self.server.start()
        self.set_serving(True)
        return self.port

    def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self.service_names]:
            self.health.set(name, status)

    def stop(self, grace_s: float, on_calls_cancelled: Callable[[], object] | None = None) -> None:
        """NOT_SERVING, refuse new calls, let in-flight ones finish within the grace period,
        then wait (a little longer) for handlers of cancelled calls to return, once
        `on_calls_cancelled` has told what they may be waiting on to let them go."""
        self.set_serving(False)
        self.server.stop(grace_s).wait(grace_s + 1.0)
        if on_calls_cancelled is not None:
            on_calls_cancelled()
        self.interceptor.wait_idle(grace_s + 5.0)
