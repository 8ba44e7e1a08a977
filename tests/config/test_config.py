"""The one settings path: precedence, validation wherever a Config is built, what derives from it, one
home per default, and docs/CONFIG.md kept to the settings."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import pytest

from tsproxy import cli, config, defaults
from tsproxy.cache.reader import ChunkReader
from tsproxy.config import Config
from tsproxy.errors import ConfigError
from tsproxy.format import TransformSettings
from tsproxy.jobs.options import JobOptions
from tsproxy.spark.options import parse_read_options

ROOT = Path(__file__).resolve().parent.parent.parent
REMOTE = {"TSPROXY_ACCESS_KEY": "ak", "TSPROXY_SECRET_KEY": "sk-value"}


def _load(
    tmp_path: Path, toml: str | None = None, env: dict[str, str] | None = None, **cli: object
) -> Config:
    path = None
    if toml is not None:
        path = tmp_path / "tsproxy.toml"
        path.write_text(toml)
    values = {"backend": f"file://{tmp_path / 'data'}", **cli}
    return config.load(values, env={**REMOTE, **(env or {})}, config_file=path)


def test_flags_beat_environment_beat_toml_beat_defaults(tmp_path: Path) -> None:
    assert _load(tmp_path).chunk_size == defaults.CHUNK_SIZE
    assert _load(tmp_path, 'chunk_size = "1MiB"').chunk_size == 1 << 20
    env = {"TSPROXY_CHUNK_SIZE": "2MiB"}
    assert _load(tmp_path, 'chunk_size = "1MiB"', env).chunk_size == 2 << 20
    assert _load(tmp_path, 'chunk_size = "1MiB"', env, chunk_size="512KiB").chunk_size == 512 << 10
    # None from the command line means "not given".
    assert _load(tmp_path, 'chunk_size = "1MiB"', env, chunk_size=None).chunk_size == 2 << 20


def test_cache_direct_io_is_auto_true_or_false(tmp_path: Path) -> None:
    assert _load(tmp_path).cache_direct_io == "auto"
    assert _load(tmp_path, 'cache_direct_io = "AUTO"').cache_direct_io == "auto"
    assert _load(tmp_path, "cache_direct_io = true").cache_direct_io is True
    assert _load(tmp_path, env={"TSPROXY_CACHE_DIRECT_IO": "false"}).cache_direct_io is False
    assert config.show("cache_direct_io") == "auto"
    assert config.show("cache_direct_io", True) == "true"
    assert _load(tmp_path, "cache_direct_io = false").cache_settings().direct_io is False


def test_environment_names_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "other.toml").write_text('compression_level = 7\nregion = "eu-west-1"\n')
    cfg = config.load(
        {"backend": f"file://{tmp_path}"}, env={"TSPROXY_CONFIG": str(tmp_path / "other.toml"), **REMOTE}
    )
    assert (cfg.compression_level, cfg.region) == (7, "eu-west-1")


@pytest.mark.parametrize(
    ("toml", "env", "flags", "message"),
    [
        ("chunk_size = 1", {}, {}, r"chunk_size \(.*tsproxy\.toml\): must be between 64KiB and 64MiB"),
        (None, {"TSPROXY_COMPRESSION_LEVEL": "23"}, {}, r"compression_level \(\$TSPROXY_COMPRESSION_LEVEL\)"),
        (None, {}, {"compression": "zip"}, r"compression \(--compression\): 'zip' is not one of"),
        (None, {}, {"memory_cache_size": "5GiB"}, r"memory_cache_size \(--memory-cache-size\): .*4GiB"),
        (None, {}, {"cache_size": "1MiB"}, r"cache_size \(--cache-size\): must hold at least 4 chunks"),
        (None, {}, {"prefetch": "lots"}, r"prefetch \(--prefetch\): 'lots' is not a size"),
        (
            None,
            {"TSPROXY_CACHE_DIRECT_IO": "sometimes"},
            {},
            r"cache_direct_io \(\$TSPROXY_CACHE_DIRECT_IO\): 'sometimes' is not auto, true or false",
        ),
        ("no_such = 1", {}, {}, r"unknown setting 'no_such'"),
    ],
)
def test_a_bad_value_names_the_setting_and_where_it_came_from(
    tmp_path: Path, toml: str | None, env: dict[str, str], flags: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, toml, env, **flags)


def test_a_config_built_directly_is_validated_too() -> None:
    assert Config().compression_level == defaults.COMPRESSION_LEVEL
    with pytest.raises(ConfigError, match=r"chunk_size \(default\): must be between"):
        Config(chunk_size=1000)
    with pytest.raises(ConfigError, match="backend_access_key and backend_secret_key go together"):
        Config().replace(backend_access_key="ak")
    assert Config().replace(compression_level=9).compression_level == 9


def test_remote_backend_needs_credentials_and_a_key_ring(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="credentials"):
        config.load({"backend": "http://127.0.0.1:1"}, env={})
    with pytest.raises(ConfigError, match="key_ring: required"):
        config.load({"backend": "http://127.0.0.1:1"}, env=REMOTE)
    plain = config.load({"backend": "http://127.0.0.1:1", "encryption": "false"}, env=REMOTE)
    assert plain.key_ring is None and not plain.dev_mode
    dev = config.load({"backend": f"file://{tmp_path / 'data'}"}, env={})
    assert dev.dev_mode and dev.credentials[0].access_key == config.DEV_ACCESS_KEY
    assert dev.key_ring == tmp_path / "data-dev-keyring.json"


def test_transform_backend_and_cache_settings_derive_from_the_config(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        'compression = "on"\ncompression_level = 6\nmemory_cache_size = "8MiB"\nprefetch = "2MiB"\n',
        backend="http://127.0.0.1:1",
        key_ring=str(tmp_path / "ring.json"),
        backend_access_key="bk",
        backend_secret_key="backend-secret",
        backend_bucket="all",
        backend_prefix="p/",
    )
    assert cfg.transform_settings() == TransformSettings(
        chunk_size=defaults.CHUNK_SIZE, compression="on", level=6, encryption=True
    )
    backend = cfg.backend_settings()
    assert (backend.url, backend.access_key, backend.bucket, backend.prefix) == (
        "http://127.0.0.1:1",
        "bk",
        "all",
        "p/",
    )
    assert not backend.local and "backend-secret" not in repr(backend) + repr(cfg)
    cache = cfg.cache_settings()
    assert (cache.memory_bytes, cache.prefetch_bytes, cache.size) == (8 << 20, 2 << 20, defaults.CACHE_SIZE)
    local = Config(backend="file://./relative-data").backend_settings()
    assert local.local and local.url == "file://" + str(Path("relative-data").resolve())


def test_every_default_has_one_value() -> None:
    # What format and cache callers get without saying is what the server uses.
    assert TransformSettings() == Config().transform_settings()
    reader = inspect.signature(ChunkReader).parameters
    assert reader["memory_bytes"].default == Config().memory_cache_size == 32 << 20
    assert reader["prefetch_bytes"].default == Config().prefetch
    assert TransformSettings().level == Config().compression_level == 1
    store = parse_read_options({"bucket": "b", "topics": "t"}).store
    assert (store.region, store.path_style) == (Config().region, Config().backend_path_style)


def test_jobs_hold_the_same_settings(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "compression_level = 5\n", chunk_size="1MiB")
    options = JobOptions.from_config(cfg, "bucket", rate=10.0)
    assert options.settings.compression_level == 5
    assert options.transform() == cfg.transform_settings()
    assert options.settings.backend == cfg.backend_settings().url  # absolute, for executors elsewhere
    assert options.replace(task_slots=2).task_rate == 5.0
    changed = options.replace(compression_level=7, concurrency=3)
    assert (changed.settings.compression_level, changed.concurrency, changed.chunk_size) == (7, 3, 1 << 20)
    with pytest.raises(ConfigError, match="chunk_size"):
        options.replace(chunk_size=1)
    # The jobs' defaults are the server's: a job built without a level writes like the server.
    bare = JobOptions.from_config(Config(backend=f"file://{tmp_path}"), "bucket")
    assert bare.transform().level == defaults.COMPRESSION_LEVEL


def _serve_flags() -> dict[str, str]:
    parser = cli.build_parser(["serve"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    return {a.dest: a.option_strings[0] for a in serve._actions if a.option_strings and a.dest != "help"}


def _doc_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (ROOT / "docs" / "CONFIG.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for key in re.findall(r"`([a-z_]+)`", cells[0]):
                rows[key] = cells
    return rows


def test_docs_list_every_setting_with_its_variable_flag_and_default() -> None:
    rows = _doc_rows()
    flags = _serve_flags()
    assert set(config.SETTINGS) | {"credentials"} == set(rows)
    for name in config.SETTINGS:
        _, env, flag, default, _ = rows[name][:5]
        assert f"`TSPROXY_{name.upper()}`" in env, name
        if name in flags:
            assert f"`{flags[name]}`" in flag, name
        else:
            assert flag == "", name
        value = config.DEFAULTS[name]
        if value is not None and value not in ((), 0, ""):
            assert f"`{config.show(name)}`" in default, name


def test_no_module_but_config_reads_the_environment() -> None:
    readers = re.compile(r"os\.environ|os\.getenv|getenv\(|environ\.get|from os import .*environ")
    found = []
    for path in sorted((ROOT / "tsproxy").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if readers.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}")
    # config.load reads TSPROXY_*; the Spark session sets its workers' interpreter and asks whether
    # pyspark's own gateway variable is set (pyspark's state, not a tsproxy setting).
    assert sorted({f.rsplit(":", 1)[0] for f in found}) == ["tsproxy/config.py", "tsproxy/spark/session.py"]
