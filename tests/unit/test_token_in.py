"""Where a WebSocket server's token goes by default.

The header unless the file is connectome-host's own ``mcpl-servers.json`` (a JSON file holding
only ``mcplServers``): connectome-host sends the token as ``?token=`` and the servers written
for it read it there, so that file's entries keep working unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from mcpl_router.config import load_config

WORLD = {"url": "ws://127.0.0.1:9/mcpl", "token": "s3cret"}


def _load(path: Path, data: dict[str, object]):
    path.write_text(json.dumps(data))
    return load_config(path, environ={"MCPL_ROUTER_STATE_DIR": str(path.parent), "XDG_RUNTIME_DIR": str(path.parent)})


def test_the_daemons_own_file_sends_the_token_in_the_header(tmp_path: Path) -> None:
    config = _load(tmp_path / "router.json", {"mcplServers": {"w": WORLD}, "journal": {"path": str(tmp_path / "j.sqlite3")}})
    assert config.servers["w"].token_in == "header"
    toml = tmp_path / "router.toml"
    toml.write_text('[mcplServers.w]\nurl = "ws://127.0.0.1:9/mcpl"\ntoken = "s3cret"\n')
    assert load_config(toml, environ={"MCPL_ROUTER_STATE_DIR": str(tmp_path)}).servers["w"].token_in == "header"


def test_connectome_hosts_file_sends_the_token_in_the_query(tmp_path: Path) -> None:
    config = _load(tmp_path / "mcpl-servers.json", {"mcplServers": {"w": WORLD, "plain": {"url": "ws://127.0.0.1:9/x"}}})
    assert config.servers["w"].token_in == "query"
    # No token: nothing to place; the setting stays the daemon's default.
    assert config.servers["plain"].token_in == "header"


def test_an_explicit_token_in_wins_in_either_file(tmp_path: Path) -> None:
    for name, extra in (("mcpl-servers.json", {}), ("router.json", {"journal": {"path": str(tmp_path / "j.sqlite3")}})):
        for place in ("auto", "header", "query"):
            config = _load(tmp_path / name, {"mcplServers": {"w": {**WORLD, "tokenIn": place}}, **extra})
            assert config.servers["w"].token_in == place
