"""The [scrub] section: defaults, values, every bad key refused naming it (exit 2 at
mount)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scrub.scrubkit import scrub_config
from tests.support.mountutil import run_cli

from ckptfs.config.load import config_from_dict
from ckptfs.config.model import ScrubConfig
from ckptfs.errors import EXIT_USAGE, ConfigError


def test_defaults_and_values() -> None:
    assert config_from_dict({}).scrub == ScrubConfig()
    got = config_from_dict({"scrub": {"rate": "8MiB", "enabled": False, "interval": 3600,
                                      "pause_while_writing": False}}).scrub
    assert got == ScrubConfig(enabled=False, rate=8 << 20, interval_s=3600.0,
                              pause_while_writing=False)


@pytest.mark.parametrize(("scrub", "key"), [
    ({"rates": "1MiB"}, "scrub.rates: unknown key"),
    ({"rate": "fast"}, "scrub.rate"),
    ({"rate": 1000}, "scrub.rate"),  # below 64KiB/s: a pass would never end
    ({"interval": 0}, "scrub.interval"),
    ({"enabled": "yes"}, "scrub.enabled"),
    ({"pause_while_writing": 1}, "scrub.pause_while_writing"),
])
def test_a_bad_value_names_its_key(scrub: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_from_dict({"scrub": scrub})


def test_scrub_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"scrub: expected a table"):
        config_from_dict({"scrub": 5})


def test_mount_refuses_a_bad_key_with_exit_2(tmp_path: Path) -> None:
    cfg = scrub_config(tmp_path / "c.toml", speed=1)
    (tmp_path / "t").mkdir()
    res = run_cli("mount", str(tmp_path / "mnt"), "--state-dir", str(tmp_path / "s"),
                  "--local", str(tmp_path / "t"), "--config", str(cfg))
    assert res.returncode == EXIT_USAGE == 2, res.stderr
    assert "scrub.speed: unknown key" in res.stderr
