"""Unit tests of the s3 tier configuration: [[tier]] kind = "s3", --remote URLs.

Every validation error names the offending key at the start of its message
(``tier[2].bucket: ...``, ``--remote 's3://...': ...``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptfs.config import (
    S3TierConfig,
    TierConfig,
    config_from_dict,
    load_config,
    parse_remote_url,
)
from ckptfs.errors import ConfigError


def s3(**kw: object) -> dict[str, object]:
    t: dict[str, object] = {"name": "remote", "kind": "s3", "bucket": "ckpt-bucket"}
    t.update(kw)
    return t


def local(**kw: object) -> dict[str, object]:
    t: dict[str, object] = {"name": "fast", "kind": "local", "path": "/srv/nvme0"}
    t.update(kw)
    return t


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "ckptfs.toml"
    p.write_text(text)
    return p


# --------------------------------------------------------------------------- [[tier]] s3


def test_s3_tier_defaults() -> None:
    cfg = config_from_dict({"tier": [s3()]})
    assert cfg.tiers == ()
    (t,) = cfg.remote_tiers
    assert t == S3TierConfig(name="remote", bucket="ckpt-bucket")
    assert t.kind == "s3"
    assert t.prefix == ""
    assert t.endpoint_url is None
    assert t.region == "us-east-1"
    assert t.addressing_style == "path"
    assert t.verify_tls is True
    assert t.profile is None
    assert t.location == "remote"
    assert t.weight == 1.0


def test_s3_tier_all_keys_from_toml(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        f"""
state_dir = "{tmp_path / "state"}"

[[tier]]
name = "nvme0"
kind = "local"
path = "{tmp_path / "t0"}"

[[tier]]
name = "s3-a"
kind = "s3"
bucket = "ckpt.bucket-1"
prefix = "runs/llama/"
endpoint_url = "https://s3.example.com:9000"
region = "eu-central-1"
addressing_style = "virtual"
verify_tls = false
profile = "training"
location = "dc2"
weight = 3
""",
    )
    cfg = load_config(p)
    assert [t.name for t in cfg.tiers] == ["nvme0"]
    assert cfg.tiers[0] == TierConfig("nvme0", "local", tmp_path / "t0")
    (r,) = cfg.remote_tiers
    assert r == S3TierConfig(
        name="s3-a",
        bucket="ckpt.bucket-1",
        prefix="runs/llama",  # the trailing slash is dropped
        endpoint_url="https://s3.example.com:9000",
        region="eu-central-1",
        addressing_style="virtual",
        verify_tls=False,
        profile="training",
        location="dc2",
        weight=3.0,
    )


def test_only_remote_tiers_still_get_the_default_local_tier(tmp_path: Path) -> None:
    p = write(tmp_path, '[[tier]]\nname = "r"\nkind = "s3"\nbucket = "ckpt"\n')
    cfg = load_config(p, state_dir=tmp_path / "st")
    assert [t.name for t in cfg.tiers] == ["local0"]
    assert cfg.tiers[0].path == tmp_path / "st" / "tiers" / "local0"
    assert [t.name for t in cfg.remote_tiers] == ["r"]


def test_local_tiers_unchanged_by_remote_support(tmp_path: Path) -> None:
    cfg = load_config(state_dir=tmp_path, local_dirs=[str(tmp_path / "a")])
    assert cfg.tiers == (TierConfig("local0", "local", tmp_path / "a"),)
    assert cfg.remote_tiers == ()


S3_ERRORS = [
    ([{"name": "r", "kind": "s3"}], "tier[0].bucket"),  # missing
    ([s3(bucket="")], "tier[0].bucket"),
    ([s3(bucket=5)], "tier[0].bucket"),
    ([s3(bucket="Upper")], "tier[0].bucket"),
    ([s3(bucket="ab")], "tier[0].bucket"),
    ([s3(bucket="a" * 64)], "tier[0].bucket"),
    ([s3(bucket="-dash")], "tier[0].bucket"),
    ([s3(bucket="under_score")], "tier[0].bucket"),
    ([s3(bucket="two..dots")], "tier[0].bucket"),
    ([s3(prefix=3)], "tier[0].prefix"),
    ([s3(prefix="/abs")], "tier[0].prefix"),
    ([s3(prefix="a//b")], "tier[0].prefix"),
    ([s3(prefix="a/../b")], "tier[0].prefix"),
    ([s3(prefix="a\nb")], "tier[0].prefix"),
    ([s3(prefix="x" * 600)], "tier[0].prefix"),
    ([s3(endpoint_url="")], "tier[0].endpoint_url"),
    ([s3(endpoint_url="127.0.0.1:8333")], "tier[0].endpoint_url"),
    ([s3(endpoint_url="ftp://host")], "tier[0].endpoint_url"),
    ([s3(endpoint_url="http://")], "tier[0].endpoint_url"),
    ([s3(endpoint_url="http://host:99999")], "tier[0].endpoint_url"),
    ([s3(endpoint_url="http://user:pw@host")], "tier[0].endpoint_url"),
    ([s3(endpoint_url="http://host/?x=1")], "tier[0].endpoint_url"),
    ([s3(endpoint_url=8333)], "tier[0].endpoint_url"),
    ([s3(region="")], "tier[0].region"),
    ([s3(region="us east")], "tier[0].region"),
    ([s3(addressing_style="dns")], "tier[0].addressing_style"),
    ([s3(verify_tls="no")], "tier[0].verify_tls"),
    ([s3(verify_tls=0)], "tier[0].verify_tls"),
    ([s3(profile="")], "tier[0].profile"),
    ([s3(location="")], "tier[0].location"),
    ([s3(weight=0)], "tier[0].weight"),
    ([s3(weight="x")], "tier[0].weight"),
    # Local-only keys on an s3 tier, s3-only keys on a local tier.
    ([s3(path="/srv/x")], "tier[0].path"),
    ([s3(capacity="1GiB")], "tier[0].capacity"),
    ([local(bucket="b-1")], "tier[0].bucket"),
    ([local(endpoint_url="http://h")], "tier[0].endpoint_url"),
    ([local(prefix="p")], "tier[0].prefix"),
    ([local(region="r")], "tier[0].region"),
    ([local(addressing_style="path")], "tier[0].addressing_style"),
    ([local(verify_tls=True)], "tier[0].verify_tls"),
    ([local(profile="p")], "tier[0].profile"),
    ([s3(colour="red")], "tier[0].colour"),
    ([s3(kind="tape")], "tier[0].kind"),
    ([local(), local(name="x", path="/srv/1"), s3(name="x")], "tier[2].name"),  # duplicate
    ([local(name="same"), s3(name="same")], "tier[1].name"),
    ([{"name": "r", "bucket": "ckpt"}], "tier[0].kind"),
]


@pytest.mark.parametrize(("tiers", "key"), S3_ERRORS)
def test_s3_validation_error_names_key(tiers: list[object], key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"tier": tiers})
    msg = str(ei.value)
    assert msg.startswith(key), msg
    assert msg[len(key)] in ":. ", msg


def test_missing_bucket_message_matches_the_documented_form() -> None:
    with pytest.raises(ConfigError, match=r"^tier\[2\]\.bucket: missing required key$"):
        config_from_dict({"tier": [local(), local(name="b", path="/b"), {"name": "r", "kind": "s3"}]})


def test_kind_mismatch_message_lists_allowed_keys() -> None:
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"tier": [s3(path="/srv/x")]})
    assert "not allowed for a tier of kind 's3'" in str(ei.value)
    assert "bucket" in str(ei.value) and "endpoint_url" in str(ei.value)


@pytest.mark.parametrize("prefix", ["", "/"])
def test_empty_prefix_means_bucket_root(prefix: str) -> None:
    (t,) = config_from_dict({"tier": [s3(prefix=prefix)]}).remote_tiers
    assert t.prefix == ""


# --------------------------------------------------------------------------- --remote URLs


def test_parse_remote_url_full() -> None:
    t = parse_remote_url(
        "s3://ckpt-bucket/runs/a/?endpoint=http://127.0.0.1:8333&region=eu-west-1"
        "&addressing=virtual&verify_tls=false&profile=p1&location=dc9&weight=2.5",
        name="remote3",
    )
    assert t == S3TierConfig(
        name="remote3",
        bucket="ckpt-bucket",
        prefix="runs/a",
        endpoint_url="http://127.0.0.1:8333",
        region="eu-west-1",
        addressing_style="virtual",
        verify_tls=False,
        profile="p1",
        location="dc9",
        weight=2.5,
    )


def test_parse_remote_url_minimal() -> None:
    t = parse_remote_url("s3://ckpt-bucket")
    assert t == S3TierConfig(name="remote0", bucket="ckpt-bucket")
    assert parse_remote_url("s3://ckpt-bucket/").prefix == ""
    assert parse_remote_url("s3://ckpt-bucket/a%20b").prefix == "a b"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://ckpt-bucket/x", "expected s3://"),
        ("ckpt-bucket/x", "expected s3://"),
        ("s3:///prefix", "missing bucket"),
        ("s3://", "missing bucket"),
        ("s3://key:secret@ckpt-bucket/x", "credentials do not belong"),
        ("s3://ckpt-bucket/x#frag", "fragment"),
        ("s3://ckpt-bucket?colour=red", "unknown parameter 'colour'"),
        ("s3://ckpt-bucket?region=a&region=b", "given twice"),
        ("s3://ckpt-bucket?endpoint", "malformed query"),
        ("s3://Bad_Bucket/x", "bucket:"),
        ("s3://ckpt-bucket?endpoint=ftp://h", "endpoint (endpoint_url):"),
        ("s3://ckpt-bucket?addressing=dns", "addressing (addressing_style):"),
        ("s3://ckpt-bucket?verify_tls=maybe", "verify_tls:"),
        ("s3://ckpt-bucket?weight=-1", "weight:"),
        ("s3://ckpt-bucket?weight=heavy", "weight:"),
        ("s3://ckpt-bucket?region=", "region:"),
        ("s3://ckpt-bucket/a//b", "prefix:"),
    ],
)
def test_parse_remote_url_errors_name_remote(url: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_remote_url(url)
    msg = str(ei.value)
    assert msg.startswith("--remote"), msg
    assert fragment in msg, msg


def test_load_config_adds_remote_urls_as_remote0_remote1(tmp_path: Path) -> None:
    cfg = load_config(
        state_dir=tmp_path,
        remote_urls=[
            "s3://ckpt-a?endpoint=http://127.0.0.1:8333",
            "s3://ckpt-b/p?endpoint=http://127.0.0.1:8334",
        ],
    )
    assert [t.name for t in cfg.remote_tiers] == ["remote0", "remote1"]
    assert [t.bucket for t in cfg.remote_tiers] == ["ckpt-a", "ckpt-b"]
    assert cfg.remote_tiers[1].prefix == "p"
    assert [t.name for t in cfg.tiers] == ["local0"]  # the local default stays


def test_remote_urls_come_after_file_tiers_without_name_clash(tmp_path: Path) -> None:
    p = write(tmp_path, '[[tier]]\nname = "remote0"\nkind = "s3"\nbucket = "from-file"\n')
    cfg = load_config(p, state_dir=tmp_path / "st", remote_urls=["s3://from-cli"])
    assert [(t.name, t.bucket) for t in cfg.remote_tiers] == [
        ("remote0", "from-file"),
        ("remote1", "from-cli"),
    ]


def test_bad_remote_url_through_load_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(state_dir=tmp_path, remote_urls=["s3://ok-bucket", "gs://nope"])
    assert str(ei.value).startswith("--remote 'gs://nope'")


def test_s3_tier_config_is_frozen() -> None:
    t = parse_remote_url("s3://ckpt-bucket")
    with pytest.raises(AttributeError):
        t.bucket = "other"  # type: ignore[misc]
