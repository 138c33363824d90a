"""Configuration: defaults < TOML file < MNEMO_<SECTION>__<KEY> environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mnemo_server.config import Config, load_config
from mnemo_server.errors import FailedPrecondition


def test_defaults() -> None:
    cfg = load_config(env={})
    assert cfg == Config()
    assert cfg.server.host == "127.0.0.1" and cfg.auth.enabled


def test_file_then_environment(tmp_path: Path) -> None:
    f = tmp_path / "mnemo.toml"
    f.write_text('[server]\nport = 6000\nhost = "0.0.0.0"\n[caps]\nsemantic = 5\n')
    cfg = load_config(f, env={"MNEMO_SERVER__PORT": "7000", "MNEMO_AUTH__ENABLED": "false", "OTHER": "x"})
    assert cfg.server.port == 7000  # env wins over the file
    assert cfg.server.host == "0.0.0.0"  # file wins over the default
    assert cfg.caps.semantic == 5
    assert cfg.auth.enabled is False


def test_config_file_from_env_var(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("[recall]\nleg_min = 7\n")
    assert load_config(env={"MNEMO_CONFIG": str(f)}).recall.leg_min == 7


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MNEMO_SERVER__PORT": "abc"}, "server.port"),
        ({"MNEMO_SERVER__NOPE": "1"}, "unknown key 'nope'"),
        ({"MNEMO_NOPE__X": "1"}, r"unknown section 'nope'"),
        ({"MNEMO_AUTH__ENABLED": "maybe"}, "auth.enabled"),
        ({"MNEMO_SERVER__PORT": "70000"}, r"server\.port: 70000 is outside 0\.\.65535"),
        ({"MNEMO_SERVER__PORT": "-5"}, r"server\.port: -5 is outside"),
        ({"MNEMO_SERVER__PORT": "1.7"}, r"server\.port: expected an integer"),
        ({"MNEMO_SERVER__MAX_WORKERS": "0"}, r"server\.max_workers: 0 is outside"),
        ({"MNEMO_EMBEDDING__BATCH_SIZE": "-3"}, r"embedding\.batch_size: -3 is outside 1\.\.4096"),
        ({"MNEMO_INDEX__GRAPH_DTYPE": "q3"}, r"index\.graph_dtype: expected one of 'i8', 'f16', 'f32'"),
        # Sizes, counts and times are 0 or more, limits 1 or more, and every number finite
        # (probe: each of these started a server that then failed every call, or silently).
        ({"MNEMO_LIMITS__MAX_TOP_K": "-1"}, r"limits\.max_top_k: -1 is outside 1 or more"),
        ({"MNEMO_LIMITS__MAX_CONTENT_CHARS": "0"}, r"limits\.max_content_chars: 0 is outside 1 or more"),
        ({"MNEMO_SERVER__COMPUTE_SLOTS": "-3"}, r"server\.compute_slots: -3 is outside 0 or more"),
        ({"MNEMO_STORAGE__ROW_CACHE_ROWS": "-100"}, r"storage\.row_cache_rows: -100 is outside"),
        ({"MNEMO_STORAGE__GROUP_COMMIT_MAX_MEMORIES": "-1"}, r"storage\.group_commit_max_memories"),
        (
            {"MNEMO_SERVER__SHUTDOWN_GRACE_S": "nan"},
            r"server\.shutdown_grace_s: 'nan' is not a finite number",
        ),
        ({"MNEMO_RANKING__DEADLINE_MARGIN_MS": "-5"}, r"ranking\.deadline_margin_ms: '-5' is not a finite"),
        # Empty, a data_dir put the store in the working directory; a host bound every
        # address, refused after warm-up as a port that could not be bound (CLI probe).
        ({"MNEMO_STORAGE__DATA_DIR": ""}, r"storage\.data_dir: must not be empty"),
        ({"MNEMO_STORAGE__DATA_DIR": "  "}, r"storage\.data_dir: must not be empty"),
        ({"MNEMO_SERVER__HOST": ""}, r"server\.host: must not be empty"),
        # gRPC metadata cannot carry it: every admin call was refused (auth probe).
        ({"MNEMO_AUTH__ADMIN_KEY": "clé-admin"}, r"auth\.admin_key: must be printable ASCII"),
        ({"MNEMO_AUTH__ADMIN_KEY": "admin\tkey"}, r"auth\.admin_key: must be printable ASCII"),
    ],
)
def test_bad_values_are_clear_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(FailedPrecondition, match=message):
        load_config(env=env)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="does not exist"):
        load_config(tmp_path / "absent.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(FailedPrecondition, match=r"bad\.toml"):
        load_config(bad, env={})
    bad.write_bytes(b"\xff\xfe[server]\n")  # not UTF-8
    with pytest.raises(FailedPrecondition, match=r"bad\.toml: 'utf-8' codec"):
        load_config(bad, env={})


@pytest.mark.parametrize(
    ("toml", "message"), [("port = 1.7", "expected an integer"), ("port = true", "expected a number")]
)
def test_a_toml_number_of_the_wrong_kind_is_refused_not_truncated(
    tmp_path: Path, toml: str, message: str
) -> None:
    file = tmp_path / "c.toml"
    file.write_text(f"[server]\n{toml}\n")
    with pytest.raises(FailedPrecondition, match=rf"server\.port: {message}"):
        load_config(file, env={})
    assert load_config(env={"MNEMO_SERVER__PORT": " 8080 "}).server.port == 8080


def test_a_word_outside_a_settings_choices_is_refused_at_start_up() -> None:
    """The sidecar's precisions: a typo would otherwise surface as every fine-tune failing
    to load, long after start-up."""
    from mnemo_sidecar.config import load_sidecar_config

    key = "MNEMO_SIDECAR_CROSS_ENCODER__FINE_TUNE_PRECISION"
    assert load_sidecar_config(env={key: "fp32"}).cross_encoder.fine_tune_precision == "fp32"
    expected = "cross_encoder.fine_tune_precision: expected one of 'fp32', 'int8', got 'int4'"
    with pytest.raises(FailedPrecondition, match=re.escape(expected)):
        load_sidecar_config(env={key: "int4"})
    with pytest.raises(FailedPrecondition, match=r"cross_encoder\.precision"):
        load_sidecar_config(env={"MNEMO_SIDECAR_CROSS_ENCODER__PRECISION": "FP16"})


@pytest.mark.parametrize("toml", ['data_dir = ["a", "b"]', "data_dir = true", "data_dir = {a = 1}"])
def test_a_list_a_table_or_a_boolean_is_no_text_setting(tmp_path: Path, toml: str) -> None:
    file = tmp_path / "c.toml"
    file.write_text(f"[storage]\n{toml}\n")
    with pytest.raises(FailedPrecondition, match=r"storage\.data_dir: expected str"):
        load_config(file, env={})


def test_the_sidecar_refuses_an_empty_data_dir_or_host(tmp_path: Path) -> None:
    from mnemo_sidecar.config import load_sidecar_config

    with pytest.raises(FailedPrecondition, match=r"storage\.data_dir: must not be empty"):
        load_sidecar_config(env={"MNEMO_SIDECAR_STORAGE__DATA_DIR": ""})
    f = tmp_path / "sidecar.toml"
    f.write_text('[server]\nhost = ""\n')
    with pytest.raises(FailedPrecondition, match=r"server\.host: must not be empty"):
        load_sidecar_config(f, env={})


def test_the_sidecar_refuses_an_inference_pool_of_no_slots() -> None:
    from mnemo_sidecar.config import load_sidecar_config

    with pytest.raises(FailedPrecondition, match=r"inference\.max_running: 0 is outside 1\.\.4096"):
        load_sidecar_config(env={"MNEMO_SIDECAR_INFERENCE__MAX_RUNNING": "0"})


def test_a_setting_named_with_one_underscore_where_two_belong_is_refused_not_ignored() -> None:
    """MNEMO_STORAGE_DATA_DIR was silently not read (data went to the default directory)."""
    from mnemo_sidecar.config import load_sidecar_config

    with pytest.raises(
        FailedPrecondition, match=r"MNEMO_STORAGE_DATA_DIR is not read: .* MNEMO_STORAGE__DATA_DIR"
    ):
        load_config(env={"MNEMO_STORAGE_DATA_DIR": "/srv/mnemo"})
    with pytest.raises(FailedPrecondition, match=r"here MNEMO_SIDECAR_SERVER__AUTH_TOKEN"):
        load_sidecar_config(env={"MNEMO_SIDECAR_SERVER_AUTH_TOKEN": "t"})
    # The command line's own variables are no settings, and a server takes the sidecar's as none of its own.
    cli = {"MNEMO_SERVER": "h:1", "MNEMO_API_KEY": "k", "MNEMO_ADMIN_KEY": "a", "MNEMO_TLS_CA": "ca.pem"}
    sidecar = {"MNEMO_SIDECAR_ADDRESS": "h:2", "MNEMO_SIDECAR_CONFIG": ""}
    assert (
        load_config(env={**cli, **sidecar, "MNEMO_STORAGE__DATA_DIR": "/srv/m"}).storage.data_dir == "/srv/m"
    )
    assert load_sidecar_config(env={**cli, **sidecar}).server.port == load_sidecar_config(env={}).server.port


def test_an_admin_key_from_a_secret_file_loses_its_newline(tmp_path: Path) -> None:
    """Callers' bearer tokens are stripped, so a configured key ending in a newline (a
    Kubernetes secret, an env file) matched no call, and the server started without a word
    (auth probe)."""
    assert load_config(env={"MNEMO_AUTH__ADMIN_KEY": "adminkey-0123456789\n"}).auth.admin_key == (
        "adminkey-0123456789"
    )
    f = tmp_path / "mnemo.toml"
    f.write_text('[auth]\nadmin_key = "  adminkey-0123456789 "\n')
    assert load_config(f, env={}).auth.admin_key == "adminkey-0123456789"
    with pytest.raises(FailedPrecondition) as err:
        load_config(env={"MNEMO_AUTH__ADMIN_KEY": "s3cr\u00e9t-never-echoed"})
    assert "never-echoed" not in str(err.value)
