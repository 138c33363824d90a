"""TLS is a configuration switch: with a certificate configured the server speaks only TLS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from mnemo_client import MnemoClient, MnemoError
from mnemo_server.errors import FailedPrecondition
from tests.conftest import ADMIN_KEY, LiveServer


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    return _self_signed(tmp_path)


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and its key, in folder."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_tls_server_accepts_tls_clients_only(
    start_server: Callable[..., LiveServer], certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    live = start_server(server={"tls_cert_file": str(cert), "tls_key_file": str(key)})
    port = live.address.rsplit(":", 1)[1]
    with MnemoClient(f"localhost:{port}", ADMIN_KEY, root_certificates=cert.read_bytes(), timeout_s=10) as c:
        assert c.create_tenant("secure").id == "secure"
    with MnemoClient(f"127.0.0.1:{port}", ADMIN_KEY, timeout_s=2) as plain, pytest.raises(MnemoError) as err:
        plain.create_tenant("nope")
    assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_the_command_line_reaches_a_tls_server_with_its_certificate(
    start_server: Callable[..., LiveServer], certificate: tuple[Path, Path]
) -> None:
    """`mnemo health`, `tenant`, `status`... spoke plaintext only: a TLS server was out of
    reach (and compose's health check would call it unhealthy). --tls-ca names the CA."""
    cert, key = certificate
    live = start_server(server={"tls_cert_file": str(cert), "tls_key_file": str(key)})
    server = f"localhost:{live.address.rsplit(':', 1)[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEMO_")}

    def mnemo(command: str, *rest: str, ca: bool = True) -> subprocess.CompletedProcess[str]:
        tls = ["--tls-ca", str(cert)] if ca else []
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "mnemo_server.cli.main",
                command,
                "--server",
                server,
                "--timeout",
                "5",
                *tls,
                *rest,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    healthy = mnemo("health")
    assert healthy.returncode == 0 and healthy.stdout.strip() == "SERVING", healthy.stderr
    made = mnemo("tenant", "--admin-key", ADMIN_KEY, "create", "secure")
    assert made.returncode == 0, made.stderr
    plain = mnemo("health", ca=False)
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr


def test_tls_settings_are_checked_before_the_server_starts(
    start_server: Callable[..., LiveServer], certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    """Each is one line naming the setting, before any warm-up. A key alone used to serve
    plaintext; a missing file was a traceback; a file that is not PEM was 'port in use?'."""
    cert, key = certificate
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate")
    cases = [
        ({"tls_key_file": str(key)}, "server.tls_cert_file: must be set too"),
        ({"tls_cert_file": str(cert)}, "server.tls_key_file: must be set too"),
        (
            {"tls_cert_file": "/nonexistent/cert.pem", "tls_key_file": str(key)},
            "server.tls_cert_file: cannot read",
        ),
        ({"tls_cert_file": str(not_pem), "tls_key_file": str(key)}, "is not a PEM certificate"),
        ({"tls_cert_file": str(cert), "tls_key_file": str(cert)}, "is not a PEM private key"),
    ]
    for settings, message in cases:
        with pytest.raises(FailedPrecondition) as err:
            start_server(server=settings)
        assert err.value.reason == "BAD_CONFIG" and message in str(err.value), (settings, str(err.value))


def test_a_key_that_is_not_the_certificates_own_is_refused_before_the_server_starts(
    start_server: Callable[..., LiveServer], certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    """A PEM key of another certificate, or one encrypted with a passphrase, passed the PEM
    check: the server warmed up, then grpc failed to bind and it said 'cannot listen on
    127.0.0.1:0: the port is in use'."""
    cert, key = certificate
    (tmp_path / "other").mkdir()
    _, other_key = _self_signed(tmp_path / "other")
    encrypted = tmp_path / "encrypted.pem"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:x", "-out", str(encrypted)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    for wrong_key, problem in (
        (other_key, "does not belong to the certificate"),
        (encrypted, "is encrypted"),
    ):
        data = tmp_path / f"data-{wrong_key.parent.name}-{wrong_key.stem}"
        with pytest.raises(FailedPrecondition) as err:
            start_server(data_dir=data, server={"tls_cert_file": str(cert), "tls_key_file": str(wrong_key)})
        assert err.value.reason == "BAD_CONFIG"
        assert f"config server.tls_key_file: {str(wrong_key)!r} {problem}" in str(err.value), str(err.value)
        assert not data.exists()  # refused before the store was opened, let alone warmed up
