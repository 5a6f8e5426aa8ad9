"""What ``run`` refuses, ``check-config`` says first (mcpl_router/config/preflight.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mcpl_router.config import check_config, load_config, preflight
from mcpl_router.hosts.listener import SocketSetupError, prepare_socket_path


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "router.toml"
    # Every path this config makes is under tmp_path, so each check has one cause here.
    path.write_text(body + '[journal]\npath = "state/journal.sqlite3"\n[host.websocket]\nenabled = false\n')
    return path


def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}


def test_a_socket_directory_others_can_reach_is_refused_by_check_config_as_by_run(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    path = write(tmp_path, '[host]\nunixSocket = "shared/host.sock"\n')
    ok, text = check_config(path, environ=env(tmp_path))
    assert not ok
    assert text == (
        f"{path}: host.unixSocket: its directory {shared} is mode 755; others could reach the host socket. "
        f"Run: chmod 700 {shared}"
    )
    # The listener refuses with the same words.
    with pytest.raises(SocketSetupError) as refused:
        prepare_socket_path(shared / "host.sock")
    assert "its directory" in str(refused.value) and f"chmod 700 {shared}" in str(refused.value)
    shared.chmod(0o700)
    ok, text = check_config(path, environ=env(tmp_path))
    assert ok, text


def test_a_file_where_the_socket_goes_and_a_journal_directory_that_cant_be_made(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "host.sock").write_text("not a socket")
    (tmp_path / "state").write_text("a file where the journal's directory should be")
    path = write(tmp_path, '[host]\nunixSocket = "run/host.sock"\n')
    checks = preflight(load_config(path, environ=env(tmp_path)))
    assert [refusal.key for refusal in checks.refusals] == ["host.unixSocket", "journal.path"]
    assert "exists and is not a socket" in checks.refusals[0].problem
    assert "is not a directory" in checks.refusals[1].problem
    assert checks.problems == ()


def test_a_dot_slash_argument_and_a_cwd_that_do_not_exist(tmp_path: Path) -> None:
    (tmp_path / "server.py").write_text("")
    path = write(
        tmp_path,
        "[mcplServers.a]\n"
        f'command = "{sys.executable}"\nargs = ["./missing/server.py", "--out", "log.txt"]\n'
        "[mcplServers.b]\n"
        f'command = "{sys.executable}"\nargs = ["./server.py"]\ncwd = "no-such-dir"\n'
        "[mcplServers.c]\n"
        f'command = "{sys.executable}"\nargs = ["../{tmp_path.name}/server.py", "plain/word"]\n'
        '[host]\nunixSocket = "run/host.sock"\n',
    )
    ok, text = check_config(path, environ=env(tmp_path))
    assert not ok
    lines = text.splitlines()
    assert lines == [
        f"{path}: mcplServers.a.args[0]: \"{tmp_path / 'missing' / 'server.py'}\" does not exist (an argument "
        "starting ./ or ../ is read against the config's directory). Fix the path, or create the file.",
        f"{path}: mcplServers.b.cwd: \"{tmp_path / 'no-such-dir'}\" does not exist, so the server can't be "
        "started there. Create it, or fix the path (relative paths are read against the config's directory).",
    ]
    # run starts despite these (logged once each): the server may appear later; the link retries.
    checks = preflight(load_config(path, environ=env(tmp_path)), environ=env(tmp_path))
    assert checks.refusals == () and len(checks.problems) == 2


def test_an_unwritable_place_for_the_socket_directory(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere: the permission can't be taken away")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    path = write(tmp_path, '[host]\nunixSocket = "locked/sub/host.sock"\n')
    ok, text = check_config(path, environ=env(tmp_path))
    assert not ok and "host.unixSocket" in text and f"{locked} is not writable by us" in text
