"""Readers of the Prometheus text format for tests and tools: scrape a daemon's
``/metrics`` (the address from its ``STATE_DIR/metrics.addr``) and pick values out of it."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from ..metrics.address import read_address


def parse_exposition(text: str) -> dict[str, float]:
    """``{'name{label="v",...}': value}`` from a scrape."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def sample(samples: dict[str, float], name: str, **labels: str) -> float:
    """One value out of ``parse_exposition``'s result (labels in any order)."""
    want = {f'{k}="{v}"' for k, v in labels.items()}
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        got = set(_split_labels(rest.rstrip("}"))) if rest else set()
        if want <= got:
            return value
    raise KeyError(f"{name}{labels}")


def total(samples: dict[str, float], name: str) -> float:
    """The sum of every series of ``name`` (all label values)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def families(text: str) -> set[str]:
    """The metric families a scrape declares (``# TYPE`` lines), counters without
    ``_total``."""
    return {re.sub(r"_total$", "", n) for n in re.findall(r"^# TYPE (\S+) ", text, re.M)}


def metrics_url(state_dir: Path) -> str:
    """The ``/metrics`` URL of the daemon serving ``state_dir`` (KeyError: it serves none)."""
    address = read_address(state_dir)
    if address is None:
        raise KeyError(f"no metrics address in {state_dir}")
    return f"http://{address}/metrics"


def scrape_text(state_dir: Path, timeout: float = 10.0) -> str:
    """One scrape of the daemon serving ``state_dir``, as text."""
    with urllib.request.urlopen(metrics_url(state_dir), timeout=timeout) as r:
        if r.status != 200:
            raise OSError(f"/metrics answered {r.status}")
        return str(r.read().decode())


def scrape(state_dir: Path, timeout: float = 10.0) -> dict[str, float]:
    """One scrape of the daemon serving ``state_dir``, parsed (``parse_exposition``)."""
    return parse_exposition(scrape_text(state_dir, timeout))


def _split_labels(text: str) -> Iterable[str]:
    part, quoted = "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            yield part
            part = ""
        else:
            part += ch
    if part:
        yield part
