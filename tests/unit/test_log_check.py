"""The daemon-log check of tests/conftest.py: what it fails a test on, and that it sees
every log registered through mountutil (also one whose state dir the test deleted), and
the records of the ``ckptfs`` loggers in the test's own process (in-process daemons).

The inner tests run in a pytest subprocess that loads tests/conftest.py; they write log
lines in the daemon's format instead of starting a daemon.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.mountutil import DAEMON_LOGS, disallowed_log_lines

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

WARN = "2026-12-01 14:00:00,001 WARNING ckptfs.store: local tiers have room again"
ERR = "2026-12-01 14:00:00,002 ERROR ckptfs.upload: upload of chunk ab failed"
INFO = "2026-12-01 14:00:00,003 INFO ckptfs.mount: mounted (a WARNING in a message is fine)"


def test_disallowed_lines_follow_the_markers() -> None:
    lines = [INFO, WARN, ERR, "Traceback (most recent call last):"]
    assert disallowed_log_lines(lines, False, None) == lines[1:]
    assert disallowed_log_lines(lines, True, None) == [WARN]
    assert disallowed_log_lines(lines, True, ()) == []
    assert disallowed_log_lines(lines, True, ("have room again",)) == []
    assert disallowed_log_lines(lines, True, ("something else",)) == [WARN]
    assert disallowed_log_lines(lines, False, ("have room again",)) == [ERR, lines[3]]


def test_registry_returns_new_whole_lines_and_keeps_deleted_logs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    DAEMON_LOGS.register(state)
    log = state / "ckptfs.log"
    log.write_text(f"{INFO}\n{WARN}\npartial")
    assert DAEMON_LOGS.take_new()[log] == [INFO, WARN]
    with open(log, "a") as f:
        f.write(" line\n")
    assert DAEMON_LOGS.take_new()[log] == ["partial line"]
    assert log not in DAEMON_LOGS.take_new()  # nothing new
    with open(log, "a") as f:
        f.write(f"{ERR}\n")
    DAEMON_LOGS.snapshot(state)  # as Mount.stop() does, before a test deletes the node
    log.unlink()
    assert DAEMON_LOGS.take_new()[log] == [ERR]
    assert log not in DAEMON_LOGS.take_new()


INNER = f'''
import logging
import shutil
import pytest
from tests.support import mountutil

def log(tmp_path, line):
    mountutil.DAEMON_LOGS.register(tmp_path / "state")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "ckptfs.log").write_text(line + "\\n")

def test_clean(tmp_path):
    log(tmp_path, {INFO!r})

def test_warning(tmp_path):
    log(tmp_path, {WARN!r})

@pytest.mark.allow_log_warnings("room again")
def test_expected_warning(tmp_path):
    log(tmp_path, {WARN!r})

@pytest.mark.allow_log_warnings("another warning")
def test_other_warning(tmp_path):
    log(tmp_path, {WARN!r})

@pytest.mark.allow_log_warnings("another warning")
def test_markers_add_up(tmp_path, request):
    request.node.add_marker(pytest.mark.allow_log_warnings("room again"))
    log(tmp_path, {WARN!r})

def test_error_in_a_deleted_state_dir(tmp_path):
    log(tmp_path, {ERR!r})
    mountutil.DAEMON_LOGS.snapshot(tmp_path / "state")
    shutil.rmtree(tmp_path / "state")

@pytest.mark.allow_log_errors
def test_expected_error(tmp_path):
    log(tmp_path, {ERR!r})

def test_a_mount_object_registers(tmp_path):
    # A daemon the test starts another way (the mount(8) helper) and wraps in a Mount.
    mountutil.Mount(tmp_path / "mnt", tmp_path / "s", [])
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "ckptfs.log").write_text({ERR!r} + "\\n")

def test_command_line_registers(tmp_path):
    mountutil.ckptfs_cmd("mount", str(tmp_path / "mnt"), "--state-dir", str(tmp_path / "s"))
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "ckptfs.log").write_text({ERR!r} + "\\n")

# Daemons built in the test process (make_daemon, make_fs, daemon.build) log to the loggers.
def test_in_process_error():
    logging.getLogger("ckptfs.upload").error("upload of chunk cd failed")

@pytest.mark.allow_log_errors
def test_expected_in_process_error():
    logging.getLogger("ckptfs.upload").error("upload of chunk cd failed")

def test_in_process_traceback():
    try:
        raise ValueError("boom in a worker")
    except ValueError:
        logging.getLogger("ckptfs.vfs").info("retrying", exc_info=True)

@pytest.mark.allow_log_warnings("room again")
def test_expected_in_process_warning():
    logging.getLogger("ckptfs.chunks").warning("local tiers have room again")

def test_in_process_warning():
    logging.getLogger("ckptfs.chunks").warning("local tiers are full")

def test_other_loggers_are_not_ours():
    logging.getLogger("botocore").error("not a ckptfs line")
'''

# The outer session's conftest, as a plugin of the inner one (whose own is "conftest").
INNER_CONFTEST = 'pytest_plugins = ["tests.conftest"]\n'


def test_every_test_is_checked_by_its_markers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The inner pytest imports the package tests from this repository: its environment only.
    path = [str(REPO), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(test_inner=INNER)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rE")
    out = res.stdout.str()
    outcomes = res.parseoutcomes()
    assert outcomes.get("passed") == 15 and outcomes.get("errors") == 8, out
    for name in ("test_warning", "test_other_warning", "test_error_in_a_deleted_state_dir",
                 "test_a_mount_object_registers", "test_command_line_registers",
                 "test_in_process_error", "test_in_process_traceback",
                 "test_in_process_warning"):
        assert f"ERROR at teardown of {name}" in out, out
    for name in ("test_clean", "test_expected_warning", "test_markers_add_up",
                 "test_expected_error", "test_expected_in_process_error",
                 "test_expected_in_process_warning", "test_other_loggers_are_not_ours"):
        assert f"of {name} " not in out, out
    assert "state/ckptfs.log" in out and "local tiers have room again" in out, out
    assert "in-process ckptfs loggers" in out and "ERROR ckptfs.upload: upload of chunk cd" in out
    assert "ValueError: boom in a worker" in out and "local tiers are full" in out, out
