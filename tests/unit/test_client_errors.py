"""The Python client's MnemoError crosses process boundaries, and says which refusals pass
if the call is sent again shortly (clients/python/mnemo_client/client.py)."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import grpc
import pytest

from mnemo_client import MnemoError


def _refused_in_a_worker() -> None:
    error = MnemoError(grpc.StatusCode.NOT_FOUND, "memory 'x' not found", "MEMORY_NOT_FOUND", ["id"])
    error.request_id = "r-1"
    raise error


def test_an_error_survives_pickling_and_a_process_pool() -> None:
    """Unpickling called __init__ with the one formatted string and failed, so a
    ProcessPoolExecutor whose worker raised one broke (BrokenProcessPool)."""
    # Spawned: LanceDB, loaded by other tests in this process, is not fork-safe.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool, pytest.raises(MnemoError) as err:
        pool.submit(_refused_in_a_worker).result(timeout=60)
    e = err.value
    assert (e.code, e.message, e.reason, e.fields, e.request_id) == (
        grpc.StatusCode.NOT_FOUND,
        "memory 'x' not found",
        "MEMORY_NOT_FOUND",
        ["id"],
        "r-1",
    )
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) == "NOT_FOUND: memory 'x' not found"


@pytest.mark.parametrize(
    ("reason", "transient"),
    [("TOO_MANY_STREAMS", True), ("COMPUTE_QUEUE_FULL", True), ("STORAGE_FULL", False), ("", False)],
)
def test_load_shedding_refusals_are_transient_and_others_are_not(reason: str, transient: bool) -> None:
    """A stream refused while others of the tenant run passes once one ends, yet was not
    transient (an export sent again 0.3 s later succeeded: client probe)."""
    assert MnemoError(grpc.StatusCode.RESOURCE_EXHAUSTED, "refused", reason).transient is transient


@pytest.mark.parametrize(
    ("code", "transient"),
    [
        (grpc.StatusCode.CANCELLED, True),
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.INVALID_ARGUMENT, False),
        (grpc.StatusCode.DEADLINE_EXCEEDED, False),
    ],
)
def test_a_call_a_stopping_server_cancelled_is_transient(code: grpc.StatusCode, transient: bool) -> None:
    """A server that stops ends the calls not yet handed to a handler with CANCELLED (gRPC
    core); this client never cancels a unary call itself, so it is retried like
    UNAVAILABLE (shutdown probe: 10 errors at one restart under load)."""
    assert MnemoError(code, "x").transient is transient
