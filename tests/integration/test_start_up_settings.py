"""Settings that cannot work are one error naming the setting when the server starts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mnemo_server.errors import FailedPrecondition
from tests.conftest import LiveServer


def test_a_model_cache_that_cannot_be_made_names_its_setting(
    start_server: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """It was a failed export's three tracebacks, ending in advice to set embedding.precision."""
    with pytest.raises(FailedPrecondition) as err:
        start_server(tmp_path / "d", embedding={"cache_dir": "/proc/no-such-dir"})
    assert err.value.reason == "BAD_CONFIG"
    assert str(err.value).startswith("embedding.cache_dir '/proc/no-such-dir' cannot be made: ")
    assert start_server(tmp_path / "d").server.core.db is not None  # the store was closed, not left locked
