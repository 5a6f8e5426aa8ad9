"""Config loading: TOML and JSON, ${VAR} substitution, relative paths, inference, validation.

Every test writes its config under ``tmp_path`` and passes an explicit ``environ`` so nothing
depends on the machine's environment or the process's working directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from mcpl_router.config import (
    DEFAULT_ENV_ALLOWLIST,
    AgentConfig,
    ConfigError,
    ReconnectPolicy,
    RouterConfig,
    ServerConfig,
    check_config,
    default_unix_socket_path,
    load_config,
    parse_config,
)
from mcpl_router.routing.refs import ChannelRef

REPO = Path(__file__).resolve().parents[2]
ENV = {"HOME": "/home/op", "XDG_RUNTIME_DIR": "/run/user/1000"}


def write(tmp_path: Path, text: str, name: str = "router.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_toml(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> RouterConfig:
    return load_config(write(tmp_path, text), environ={**ENV, **(environ or {})})


def load_json(tmp_path: Path, data: Any, environ: dict[str, str] | None = None) -> RouterConfig:
    path = write(tmp_path, json.dumps(data), "mcpl-servers.json")
    return load_config(path, environ={**ENV, **(environ or {})})


def errors_of(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_toml(tmp_path, text, environ)
    return caught.value


def parse(data: dict[str, Any], environ: dict[str, str] | None = None) -> RouterConfig:
    return parse_config(
        data, source="conf.toml", base_dir=Path("/etc/mcpl"), environ={**ENV, **(environ or {})}
    )


def parse_error(data: dict[str, Any], environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse(data, environ)
    return caught.value


def server(entry: dict[str, Any], environ: dict[str, str] | None = None) -> ServerConfig:
    return parse({"mcplServers": {"s": entry}}, environ).servers["s"]


def server_error(entry: dict[str, Any], environ: dict[str, str] | None = None) -> ConfigError:
    return parse_error({"mcplServers": {"s": entry}}, environ)


# --- formats and shape -----------------------------------------------------------------------

TOML_CONFIG = """
[mcplServers.discord]
command = "node"
args = ["index.js", "--stdio"]
env = { DISCORD_TOKEN = "t" }
enabledFeatureSets = ["chat"]

[mcplServers.editor]
url = "ws://127.0.0.1:7403/mcpl"
token = "secret"
"""

JSON_CONFIG = {
    "mcplServers": {
        "discord": {
            "command": "node",
            "args": ["index.js", "--stdio"],
            "env": {"DISCORD_TOKEN": "t"},
            "enabledFeatureSets": ["chat"],
        },
        "editor": {"url": "ws://127.0.0.1:7403/mcpl", "token": "secret"},
    }
}


def test_toml_and_json_say_the_same_thing(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "j").mkdir()
    from_toml = load_toml(tmp_path / "t", TOML_CONFIG)
    from_json = load_json(tmp_path / "j", JSON_CONFIG)
    # One intended difference: a .json file holding only mcplServers is connectome-host's
    # mcpl-servers.json, whose servers read the token as ?token= (tokenIn's default there).
    assert from_toml.servers["editor"].token_in == "header"
    assert from_json.servers["editor"].token_in == "query"
    from_json_servers = {**from_json.servers, "editor": attrs.evolve(from_json.servers["editor"], token_in="header")}
    assert {k: v.redacted() for k, v in from_toml.servers.items()} == {
        k: v.redacted() for k, v in from_json_servers.items()
    }
    assert list(from_json.servers) == ["discord", "editor"]
    discord = from_json.servers["discord"]
    assert discord.transport == "stdio"
    assert discord.args == ("index.js", "--stdio")
    assert discord.env == {"DISCORD_TOKEN": "t"}
    assert discord.enabled_feature_sets == ("chat",)
    assert from_json.servers["editor"].transport == "websocket"
    assert from_json.servers["editor"].token == "secret"


def test_a_hosts_mcpl_servers_json_loads_unchanged(tmp_path: Path) -> None:
    """connectome-host's keys: ms durations, reconnect as a bool, host-only keys as warnings."""
    config = load_json(
        tmp_path,
        {
            "mcplServers": {
                "zulip": {
                    "command": "node",
                    "args": ["./zulip/index.js"],
                    "env": {"ZULIP_KEY": "${ZULIP_KEY}"},
                    "inheritEnv": False,
                    "toolPrefix": "zulip_",
                    "reconnect": True,
                    "reconnectIntervalMs": 2000,
                    "reconnectMaxIntervalMs": 60000,
                    "requestTimeoutMs": 5000,
                    "enabledTools": [],
                    "channelSubscription": "auto",
                },
                "world": {
                    "transport": "websocket",
                    "url": "wss://w.example/mcpl",
                    "reconnect": False,
                },
            }
        },
        {"ZULIP_KEY": "k"},
    )
    zulip = config.servers["zulip"]
    assert zulip.reconnect == ReconnectPolicy(initial_delay=2.0, max_delay=60.0)
    assert zulip.request_timeout == 5.0
    assert zulip.tool_prefix == "zulip_"
    assert zulip.enabled_tools is None  # hosts read [] as "every tool"
    assert config.servers["world"].reconnect.max_attempts == 1  # the first connection only
    assert len(config.warnings) == 1
    assert "mcplServers.zulip.channelSubscription" in config.warnings[0]


def test_defaults(tmp_path: Path) -> None:
    config = load_toml(
        tmp_path, '[mcplServers.a]\ncommand = "srv"\n', {"MCPL_ROUTER_STATE_DIR": "/var/lib/r"}
    )
    a = config.servers["a"]
    assert a.tool_prefix == "mcpl--a--"
    assert a.env_allowlist == DEFAULT_ENV_ALLOWLIST
    assert a.enabled_capabilities is None and a.enabled_feature_sets is None
    assert a.disabled_capabilities == () and a.channel_patterns == ()
    assert (a.legacy, a.request_timeout, a.reconnect) == ("auto", 30.0, ReconnectPolicy())
    assert a.cwd is None  # the daemon's own working directory
    assert config.journal.path == Path("/var/lib/r/journal.sqlite3")
    assert config.host.token_file == Path("/var/lib/r/host-token")
    assert config.host.unix_socket == default_unix_socket_path(ENV)
    assert str(config.host.unix_socket).startswith("/run/user/1000/mcpl-router-")
    assert config.host.websocket is not None
    assert (config.host.websocket.bind, config.host.websocket.port) == ("127.0.0.1", 0)
    assert (config.logging.level, config.logging.format) == ("info", "auto")
    assert not config.health.enabled
    assert config.agents == {}


def test_state_dir_defaults_under_home(tmp_path: Path) -> None:
    config = load_toml(tmp_path, "")
    assert config.journal.path == Path("/home/op/.local/state/mcpl-router/journal.sqlite3")
    assert config.servers == {}


def test_an_empty_enabled_list_grants_nothing_and_none_means_default() -> None:
    assert server({"command": "x", "enabledCapabilities": []}).enabled_capabilities == ()
    assert server({"command": "x"}).enabled_capabilities is None


# --- substitution ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "environ", "expected"),
    [
        ("plain", {}, "plain"),
        ("${A}", {"A": "1"}, "1"),
        ("x-${A}-${B}-y", {"A": "1", "B": "2"}, "x-1-2-y"),
        ("${A:-fallback}", {}, "fallback"),
        ("${A:-fallback}", {"A": ""}, "fallback"),  # as in the shell: empty takes the default
        ("${A:-fallback}", {"A": "set"}, "set"),
        ("${A:-}", {}, ""),
        ("${A:-a b:c}", {}, "a b:c"),
        ("${A}", {"A": ""}, ""),
        ("$${A}", {}, "${A}"),
        ("$${A} and ${A}", {"A": "1"}, "${A} and 1"),
        ("cost $5 {x}", {}, "cost $5 {x}"),
        ("$$", {}, "$$"),
    ],
)
def test_substitution(written: str, environ: dict[str, str], expected: str) -> None:
    assert server({"command": "x", "args": [written]}, environ).args == (expected,)


def test_substitution_reaches_nested_tables_and_lists() -> None:
    config = parse(
        {
            "mcplServers": {"s": {"command": "x", "env": {"K": "${V}"}, "args": ["${V}"]}},
            "agents": {"kai": {"wakeTags": ["chat:${V}"]}},
            "logging": {"level": "${LEVEL:-debug}"},
        },
        {"V": "v"},
    )
    assert config.servers["s"].env == {"K": "v"}
    assert config.servers["s"].args == ("v",)
    assert config.agents["kai"].wake_tags == ("chat:v",)
    assert config.logging.level == "debug"


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        (
            {"command": "x", "env": {"DISCORD_TOKEN": "${DISCORD_TOKEN}"}},
            "mcplServers.s.env.DISCORD_TOKEN",
        ),
        ({"command": "x", "args": ["--a", "pre-${DISCORD_TOKEN}"]}, "mcplServers.s.args[1]"),
        ({"url": "${DISCORD_TOKEN}"}, "mcplServers.s.url"),
    ],
)
def test_a_missing_variable_names_itself_and_the_key(entry: dict[str, Any], key: str) -> None:
    error = server_error(entry)
    assert len(error.errors) == 1  # no cascade: the unresolved value is not re-reported
    assert error.key == key
    assert "DISCORD_TOKEN" in error.problem
    assert "${DISCORD_TOKEN:-" in error.fix
    assert str(error).startswith(f"conf.toml: {key}: ")


@pytest.mark.parametrize("written", ["${A", "${1A}", "${A-x}", "${A:-${B}}", "${}"])
def test_a_malformed_reference_is_an_error(written: str) -> None:
    error = server_error({"command": "x", "args": [written]}, {"A": "a", "B": "b"})
    assert error.key == "mcplServers.s.args[0]"
    assert "$${" in error.fix


def test_a_disabled_servers_missing_variable_is_a_warning() -> None:
    entry = {"command": "x", "disabled": True, "env": {"K": "${NOPE}"}}
    config = parse({"mcplServers": {"s": entry}})
    assert config.servers["s"].disabled
    assert config.enabled_servers() == []
    assert "NOPE" in config.warnings[0] and "mcplServers.s.env.K" in config.warnings[0]


# --- relative paths --------------------------------------------------------------------------


def test_relative_paths_are_read_against_the_config_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    monkeypatch.chdir(tmp_path)  # somewhere else: must not matter
    config = load_config(
        write(
            conf_dir,
            """
            [mcplServers.a]
            command = "./bin/server"
            cwd = "../work"
            [mcplServers.b]
            command = "python3"
            args = ["./server.py", "../up.js", "--flag=./as-written", "plain/relative.py"]
            [mcplServers.c]
            command = "~/bin/srv"
            cwd = "/abs/dir"
            [journal]
            path = "state/journal.sqlite3"
            [host]
            unixSocket = "run/host.sock"
            tokenFile = "secrets/../secrets/token"
            """,
        ),
        environ=ENV,
    )
    a, b, c = config.servers["a"], config.servers["b"], config.servers["c"]
    assert a.command == str(conf_dir / "bin" / "server")
    assert a.cwd == tmp_path / "work"
    assert b.command == "python3"  # a bare name is looked up on PATH
    # As connectome-host: only an argument that starts with ./ or ../ is a path to resolve.
    assert b.args == (str(conf_dir / "server.py"), str(tmp_path / "up.js"), "--flag=./as-written", "plain/relative.py")
    assert b.cwd is None
    assert c.command == "/home/op/bin/srv"
    assert c.cwd == Path("/abs/dir")
    assert config.journal.path == conf_dir / "state" / "journal.sqlite3"
    assert config.host.unix_socket == conf_dir / "run" / "host.sock"
    assert config.host.token_file == conf_dir / "secrets" / "token"


def test_relative_config_path_and_parse_config_base_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, '[mcplServers.a]\ncommand = "./srv"\n')
    monkeypatch.chdir(tmp_path)
    config = load_config("router.toml", environ=ENV)
    assert config.source == "router.toml"
    assert config.servers["a"].command == str(tmp_path / "srv")
    demo = parse_config(
        {"mcplServers": {"a": {"command": "./srv"}}}, source="<demo>", base_dir=Path("/opt/d")
    )
    assert demo.servers["a"].command == "/opt/d/srv"


# --- transports ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "transport", "endpoint"),
    [
        ({"command": "node"}, "stdio", "node"),
        ({"url": "ws://h:1/mcpl"}, "websocket", "ws://h:1/mcpl"),
        ({"url": "wss://h/mcpl"}, "websocket", "wss://h/mcpl"),
        ({"url": "tcp://127.0.0.1:7402"}, "tcp", "127.0.0.1:7402"),
        ({"host": "127.0.0.1", "port": 7402}, "tcp", "127.0.0.1:7402"),
        ({"host": "127.0.0.1", "port": "${PORT}"}, "tcp", "127.0.0.1:7402"),
        ({"transport": "tcp", "url": "tcp://h:9"}, "tcp", "h:9"),
        ({"transport": "websocket", "url": "ws://h/"}, "websocket", "ws://h/"),
        ({"transport": "stdio", "command": "x"}, "stdio", "x"),
    ],
)
def test_transport_inference(entry: dict[str, Any], transport: str, endpoint: str) -> None:
    config = server(entry, {"PORT": "7402"})
    assert config.transport == transport
    assert config.endpoint == endpoint


@pytest.mark.parametrize(
    ("entry", "key", "words"),
    [
        ({"transport": "smtp", "command": "x"}, "transport", '"smtp" is not a transport'),
        ({"command": "x", "url": "ws://h/"}, "command", "not both"),
        ({"command": "x", "host": "h", "port": 1}, "command", "not both"),
        ({"url": "http://h/"}, "url", "can dial"),
        ({}, "", "nothing says how to reach"),
        ({"transport": "stdio"}, "command", "needs the program"),
        (
            {"transport": "stdio", "command": "x", "url": "ws://h/"},
            "url",
            "does not apply to a stdio",
        ),
        ({"transport": "websocket", "url": "tcp://h:1"}, "url", "is not a ws:// or wss:// URL"),
        ({"transport": "websocket"}, "url", "needs the URL"),
        ({"url": "ws://h/", "args": ["a"]}, "args", "does not apply to a websocket"),
        ({"url": "ws://h/", "port": 1}, "port", "does not apply to a websocket"),
        ({"command": "x", "token": "t"}, "token", "does not apply to a stdio"),
        ({"url": "tcp://h:1", "token": "t"}, "token", "does not apply to a tcp"),
        ({"transport": "tcp", "url": "ws://h/"}, "url", "is not a tcp:// URL"),
        ({"url": "tcp://h"}, "url", "names no port"),
        ({"url": "tcp://h:1", "port": 2}, "url", "not both"),
        ({"host": "h"}, "port", "needs host and port"),
        ({"port": 7}, "host", "needs host and port"),
        ({"host": "h", "port": 70000}, "port", "out of range"),
        ({"url": "ws://h:99999/"}, "url", "from 1 to 65535"),
        ({"url": "ws://h/", "tokenHeader": "Bad Header"}, "tokenHeader", "HTTP header name"),
    ],
)
def test_transport_conflicts(entry: dict[str, Any], key: str, words: str) -> None:
    error = server_error(entry)
    expected_key = "mcplServers.s" + (f".{key}" if key else "")
    assert (error.key, len(error.errors)) == (expected_key, 1), str(error)
    assert words in error.problem, str(error)


# --- validation ------------------------------------------------------------------------------


def test_the_error_format() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {"mcplServers": {"discord": {"transport": "smtp", "command": "x"}}},
            source="config/example.toml",
            base_dir=Path("/x"),
            environ=ENV,
        )
    error = caught.value
    assert str(error) == (
        'config/example.toml: mcplServers.discord.transport: "smtp" is not a transport. '
        "Use one of: stdio, tcp, websocket."
    )
    assert (error.file, error.key) == ("config/example.toml", "mcplServers.discord.transport")
    assert error.problem == '"smtp" is not a transport.'
    assert error.fix == "Use one of: stdio, tcp, websocket."
    assert error.errors == [error]


@pytest.mark.parametrize(
    ("data", "key", "suggestion"),
    [
        ({"mcpServers": {}}, "mcpServers", '"mcplServers"'),
        ({"mcplServers": {"s": {"comand": "x"}}}, "mcplServers.s.comand", '"command"'),
        (
            {"mcplServers": {"s": {"command": "x", "request_timeout": 3}}},
            "mcplServers.s.request_timeout",
            '"requestTimeout"',
        ),
        (
            {"mcplServers": {"s": {"command": "x", "reconnect": {"maxDelai": 3}}}},
            "mcplServers.s.reconnect.maxDelai",
            '"maxDelay"',
        ),
        ({"host": {"tokn": "x"}}, "host.tokn", '"token"'),
        ({"host": {"websocket": {"bnd": "::1"}}}, "host.websocket.bnd", '"bind"'),
        ({"logging": {"levl": "info"}}, "logging.levl", '"level"'),
        (
            {"agents": {"kai": {"prose_routing": "named"}}},
            "agents.kai.prose_routing",
            '"proseRouting"',
        ),
        ({"journal": {"zzz": 1}}, "journal.zzz", None),
    ],
)
def test_an_unknown_key_is_named_with_the_closest_valid_one(
    data: dict[str, Any], key: str, suggestion: str | None
) -> None:
    error = parse_error(data)
    assert error.key == key
    assert "Valid keys: " in error.fix
    if suggestion is None:
        assert "Did you mean" not in error.fix
    else:
        assert f"Did you mean {suggestion}?" in error.fix


@pytest.mark.parametrize(
    ("allow", "deny"),
    [
        ("enabledCapabilities", "disabledCapabilities"),
        ("enabledFeatureSets", "disabledFeatureSets"),
    ],
)
def test_allow_and_deny_of_one_path_is_malformed(allow: str, deny: str) -> None:
    error = server_error({"command": "x", allow: ["a.b", "chat"], deny: ["chat"]})
    assert error.key == f"mcplServers.s.{allow}"
    assert allow in error.problem and deny in error.problem
    assert "malformed" in error.problem and "fail closed" in error.problem


@pytest.mark.parametrize(
    "pattern", ["channels.pub*", "channels..publish", "", "channels.**", "a b", "a/b", "*."]
)
def test_a_grant_pattern_is_dotted_segments_with_star_alone(pattern: str) -> None:
    error = server_error({"command": "x", "enabledCapabilities": ["tools", pattern]})
    assert error.key == "mcplServers.s.enabledCapabilities[1]"


def test_good_grant_patterns() -> None:
    s = server(
        {
            "command": "x",
            "enabledCapabilities": ["channels.*", "contextHooks.beforeInference.inject.*", "*"],
            "disabledFeatureSets": ["memory.retrieval", "*.*"],
        }
    )
    assert s.enabled_capabilities == ("channels.*", "contextHooks.beforeInference.inject.*", "*")


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"requestTimeout": 0}, "requestTimeout"),
        ({"requestTimeout": "soon"}, "requestTimeout"),
        ({"requestTimeout": float("inf")}, "requestTimeout"),
        ({"requestTimeout": True}, "requestTimeout"),
        ({"reconnect": {"initialDelay": -1}}, "reconnect.initialDelay"),
        ({"reconnect": {"multiplier": 0.5}}, "reconnect.multiplier"),
        ({"reconnect": {"jitter": 1.5}}, "reconnect.jitter"),
        ({"reconnect": {"maxAttempts": -1}}, "reconnect.maxAttempts"),
        ({"reconnect": {"maxAttempts": 2.5}}, "reconnect.maxAttempts"),
        ({"reconnect": {"initialDelay": 5, "maxDelay": 1}}, "reconnect.maxDelay"),
        ({"reconnect": "often"}, "reconnect"),
        ({"legacy": "sometimes"}, "legacy"),
        ({"disabled": "yes"}, "disabled"),
        ({"args": "--flag"}, "args"),
        ({"args": ["ok", 3]}, "args[1]"),
        ({"env": {"PORT": 8080}}, "env.PORT"),
        ({"env": ["A=1"]}, "env"),
        ({"cwd": ""}, "cwd"),
        ({"channelPatterns": [""]}, "channelPatterns[0]"),
        ({"toolPrefix": 5}, "toolPrefix"),
    ],
)
def test_bad_server_values(entry: dict[str, Any], key: str) -> None:
    error = server_error({"command": "x", **entry})
    assert (error.key, len(error.errors)) == (f"mcplServers.s.{key}", 1), str(error)


def test_numbers_and_booleans_may_come_from_substitution() -> None:
    s = server(
        {
            "command": "x",
            "requestTimeout": "${T}",
            "disabled": "${OFF:-false}",
            "reconnect": {"maxAttempts": "${N}"},
        },
        {"T": "2.5", "N": "3"},
    )
    assert (s.request_timeout, s.disabled, s.reconnect.max_attempts) == (2.5, False, 3)


def test_error_text_never_echoes_a_secret() -> None:
    error = server_error({"command": "x", "env": {"API_KEY": 123456789}})
    assert "123456789" not in str(error)


@pytest.mark.parametrize("server_id", ["a:b", "discord:acme:general", "a.b", "ünï"])
def test_server_ids_may_hold_colons_and_more(server_id: str) -> None:
    config = parse({"mcplServers": {server_id: {"command": "x"}}})
    assert config.servers[server_id].id == server_id
    assert config.servers[server_id].tool_prefix == f"mcpl--{server_id}--"


@pytest.mark.parametrize(
    ("server_id", "key"), [("", 'mcplServers.""'), ("a b", 'mcplServers."a b"')]
)
def test_server_ids_are_non_empty_without_whitespace(server_id: str, key: str) -> None:
    error = parse_error({"mcplServers": {server_id: {"command": "x"}}})
    assert error.key == key


def test_a_dotted_id_is_quoted_in_key_paths() -> None:
    error = parse_error({"mcplServers": {"a.b": {"command": 5}}})
    assert error.key == 'mcplServers."a.b".command'


@pytest.mark.parametrize(
    ("host", "ok", "key"),
    [
        ({"websocket": {"bind": "0.0.0.0"}}, False, "host.websocket.bind"),
        (
            {"websocket": {"bind": "0.0.0.0"}, "allowNonLoopback": True},
            False,
            "host.websocket.bind",
        ),
        ({"websocket": {"bind": "0.0.0.0"}, "allowNonLoopback": True, "tokenFile": "t"}, True, ""),
        (
            {"websocket": {"bind": "::", "port": 7420}, "allowNonLoopback": True, "token": "x"},
            True,
            "",
        ),
        ({"websocket": {"bind": "localhost"}}, True, ""),
        ({"websocket": {"bind": "::1"}}, True, ""),
        ({"websocket": {"bind": "10.0.0.1"}, "tokenFile": "t"}, False, "host.websocket.bind"),
        ({"websocket": False, "unixSocket": False}, True, ""),
        ({"websocket": {"enabled": False, "bind": "0.0.0.0"}}, True, ""),
        ({"websocket": {"path": "rpc"}}, False, "host.websocket.path"),
        ({"websocket": {"port": -1}}, False, "host.websocket.port"),
        ({"websocket": "on"}, False, "host.websocket"),
        ({"token": "a", "tokenFile": "b"}, False, "host.token"),
        ({"unixSocket": "/" + "x" * 120}, False, "host.unixSocket"),
        ({"unixSocket": 3}, False, "host.unixSocket"),
    ],
)
def test_host_validation(host: dict[str, Any], ok: bool, key: str) -> None:
    if ok:
        parse({"host": host})
    else:
        assert parse_error({"host": host}).key == key


def test_host_listeners_off_and_on() -> None:
    off = parse({"host": {"websocket": False, "unixSocket": False}}).host
    assert (off.websocket, off.unix_socket) == (None, None)
    on = parse({"host": {"websocket": {"port": 7420, "path": "/rpc"}, "token": "x"}}).host
    assert on.websocket is not None and (on.websocket.port, on.websocket.path) == (7420, "/rpc")
    assert on.token_file is None  # an inline token needs no file


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"logging": {"level": "loud"}}, "logging.level"),
        ({"logging": {"format": "xml"}}, "logging.format"),
        ({"health": {"port": 100000}}, "health.port"),
        ({"journal": {"path": 5}}, "journal.path"),
        ({"journal": "here"}, "journal"),
        ({"journal": {"backend": "mysql"}}, "journal.backend"),
        ({"journal": {"backend": "postgres"}}, "journal.dsn"),
        ({"journal": {"dsn": "host=db"}}, "journal.dsn"),
        ({"journal": {"passwordFile": "pw"}}, "journal.passwordFile"),
        ({"mcplServers": []}, "mcplServers"),
        ({"mcplServers": {"s": "node"}}, "mcplServers.s"),
    ],
)
def test_bad_sections(section: dict[str, Any], key: str) -> None:
    assert parse_error(section).key == key


def test_a_postgres_journal_reads_its_dsn_from_the_environment_and_never_shows_its_password(tmp_path: Path) -> None:
    config = load_toml(
        tmp_path,
        """
        [journal]
        backend = "postgres"
        dsn = "host=db1,db2 dbname=mcpl user=router password=${PG_SECRET} target_session_attrs=read-write"
        passwordFile = "pg-password"
        """,
        environ={"PG_SECRET": "hunter2"},
    )
    journal = config.journal
    assert journal.backend == "postgres" and journal.dsn is not None and "password=hunter2" in journal.dsn
    assert journal.password_file == tmp_path / "pg-password"
    assert journal.described == "postgres: host=db1,db2 dbname=mcpl user=router target_session_attrs=read-write"
    assert "hunter2" not in config.summary() and "hunter2" not in repr(config)


def test_multiple_errors_are_reported_together(tmp_path: Path) -> None:
    error = errors_of(
        tmp_path,
        """
        [mcplServers.discord]
        transport = "smtp"
        command = "x"
        [mcplServers.slack]
        url = "tcp://h:1"
        requestTimeout = -3
        tokn = "x"
        [mcplServers.editor]
        url = "ws://h/"
        token = "${EDITOR_TOKEN}"
        [logging]
        level = "loud"
        """,
    )
    keys = [e.key for e in error.errors]
    # In the file's order, though substitution, keys and values are checked in separate passes.
    assert keys == [
        "mcplServers.discord.transport",
        "mcplServers.slack.requestTimeout",
        "mcplServers.slack.tokn",
        "mcplServers.editor.token",
        "logging.level",
    ]
    lines = str(error).splitlines()
    assert len(lines) == 5
    assert all(line.startswith(str(tmp_path / "router.toml") + ": ") for line in lines)
    assert error.key == keys[0]


# --- secrets ---------------------------------------------------------------------------------


def test_a_token_never_appears_in_repr_or_redacted(tmp_path: Path) -> None:
    secret = "s3cr3t-token-value"
    config = load_toml(
        tmp_path,
        f"""
        [mcplServers.editor]
        url = "wss://user:hunter2@editor.example/mcpl"
        token = "${{EDITOR_TOKEN}}"
        [mcplServers.discord]
        command = "node"
        env = {{ DISCORD_TOKEN = "{secret}-env" }}
        [host]
        token = "{secret}-host"
        """,
        {"EDITOR_TOKEN": secret},
    )
    editor = config.servers["editor"]
    assert editor.token == secret
    for text in (
        repr(config),
        repr(editor),
        repr(config.host),
        json.dumps(editor.redacted()),
        json.dumps(config.servers["discord"].redacted()),
        json.dumps(config.host.redacted()),
        config.summary(),
    ):
        assert secret not in text
        assert "hunter2" not in text
    assert editor.redacted()["token"] == "set"
    assert config.host.redacted()["token"] == "set"
    assert config.servers["discord"].redacted()["env"] == {"DISCORD_TOKEN": "set"}
    assert "token" not in server({"url": "ws://h/"}).redacted()


# --- helpers on the values -------------------------------------------------------------------


def test_spawn_env_is_the_allowlist_plus_env() -> None:
    daemon_env = {"PATH": "/bin", "HOME": "/h", "AWS_SECRET_ACCESS_KEY": "no", "EXTRA": "e"}
    s = server({"command": "x", "env": {"TOKEN": "t", "PATH": "/override"}})
    assert s.spawn_env(daemon_env) == {"PATH": "/override", "HOME": "/h", "TOKEN": "t"}
    narrow = server({"command": "x", "envAllowlist": ["EXTRA"]})
    assert narrow.spawn_env(daemon_env) == {"EXTRA": "e"}
    everything = server({"command": "x", "inheritEnv": True, "env": {"A": "1"}})
    assert everything.spawn_env(daemon_env) == {**daemon_env, "A": "1"}


def test_channel_patterns_and_tool_globs() -> None:
    s = server(
        {
            "command": "x",
            "channelPatterns": ["discord:acme:*", "discord:dm:*"],
            "enabledTools": ["send_*", "fetch_history", "delete_message"],
            "disabledTools": ["delete_*"],
        }
    )
    assert s.channel_permitted("discord:acme:general")
    assert not s.channel_permitted("discord:other:general")
    assert server({"command": "x"}).channel_permitted("anything")
    assert s.tool_offered("send_message") and s.tool_offered("fetch_history")
    assert not s.tool_offered("delete_message") and not s.tool_offered("react")


# --- agents ----------------------------------------------------------------------------------


def test_agents() -> None:
    config = parse(
        {
            "mcplServers": {"discord": {"command": "x"}, "a:b": {"command": "y"}},
            "agents": {
                "kai": {
                    "proseRouting": "hybrid",
                    "allowedTools": ["channel_*"],
                    "homeChannel": {"serverId": "a:b", "channelId": "general"},
                    "wakeChannels": ["general"],
                    "wakeServers": ["discord"],
                    "wakeTags": ["chat:addressed"],
                },
                "quiet": {},
            },
        }
    )
    assert config.agents["kai"] == AgentConfig(
        name="kai",
        prose_routing="hybrid",
        allowed_tools=("channel_*",),
        home_channel=ChannelRef("a:b", "general"),
        wake_channels=("general",),
        wake_servers=("discord",),
        wake_tags=("chat:addressed",),
    )
    assert config.agents["quiet"] == AgentConfig(name="quiet")


@pytest.mark.parametrize(
    ("agent", "key", "words"),
    [
        (
            {"proseRouting": "loud"},
            "agents.kai.proseRouting",
            "disabled, locus, hybrid, explicit, named",
        ),
        (
            {"homeChannel": {"serverId": "discrod", "channelId": "g"}},
            "agents.kai.homeChannel.serverId",
            'Did you mean "discord"?',
        ),
        (
            {"homeChannel": {"serverId": "discord"}},
            "agents.kai.homeChannel.channelId",
            "serverId and a channelId",
        ),
        ({"homeChannel": "discord:general"}, "agents.kai.homeChannel", "serverId"),
        (
            {"wakeServers": ["discord", "slak"]},
            "agents.kai.wakeServers[1]",
            "Configured servers: discord",
        ),
        ({"wakeTags": ["addressed"]}, "agents.kai.wakeTags[0]", "namespace:value"),
        ({"allowedTools": "all"}, "agents.kai.allowedTools", '["all"]'),
    ],
)
def test_bad_agents(agent: dict[str, Any], key: str, words: str) -> None:
    error = parse_error({"mcplServers": {"discord": {"command": "x"}}, "agents": {"kai": agent}})
    assert (error.key, len(error.errors)) == (key, 1), str(error)
    assert words in str(error)


def test_an_agent_naming_a_broken_server_gets_one_error_not_two() -> None:
    error = parse_error(
        {"mcplServers": {"d": {}}, "agents": {"kai": {"wakeServers": ["d"]}}}
    )
    assert [e.key for e in error.errors] == ["mcplServers.d"]


# --- files -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("router.yaml", "a: 1", "format is unknown"),
        ("router.toml", "[mcplServers.a\n", "is not valid TOML"),
        ("router.json", '{"mcplServers": {},}', "is not valid JSON"),
        ("router.json", "[1, 2]", "not a table of settings"),
        (
            "router.json",
            '{"mcplServers": {"a": {"command": "x", "command": "y"}}}',
            "given more than once",
        ),
    ],
)
def test_unreadable_files(tmp_path: Path, name: str, text: str, words: str) -> None:
    path = write(tmp_path, text, name)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=ENV)
    assert str(caught.value).startswith(str(path) + ": ")
    assert words in str(caught.value)


def test_a_missing_file(tmp_path: Path) -> None:
    ok, text = check_config(tmp_path / "nope.toml", environ=ENV)
    assert not ok
    assert text == f"{tmp_path / 'nope.toml'}: does not exist. Check the path."


def test_check_config_summarises(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[mcplServers.a]\ncommand = "sh"\n[mcplServers.b]\nurl = "ws://h/"\n'
        '[agents.kai]\nproseRouting = "named"\n',
    )
    # The state directory and socket where this test may make them (check-config checks both).
    ok, text = check_config(path, environ={"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path / "run")})
    assert ok, text
    assert text.splitlines()[0] == "OK: 2 servers (a: stdio, b: websocket), 1 agent (kai: named)"
    bad = write(tmp_path, '[mcplServers.a]\nurl = "ftp://h"\n')
    bad_ok, bad_text = check_config(bad, environ=ENV)
    assert not bad_ok and "ftp://h" in bad_text


# --- the example files -----------------------------------------------------------------------

EXAMPLE_ENV = {**ENV, "DISCORD_TOKEN": "discord-secret", "EDITOR_TOKEN": "editor-secret"}


def test_the_example_toml_loads() -> None:
    config = load_config(REPO / "config" / "example.toml", environ=EXAMPLE_ENV)
    assert {s.id: s.transport for s in config.servers.values()} == {
        "discord": "stdio",
        "slack": "tcp",
        "editor": "websocket",
        "heartbeat": "stdio",
        "telegram:personal": "stdio",
    }
    assert [s.id for s in config.enabled_servers()] == ["discord", "slack", "editor", "heartbeat"]
    assert config.servers["discord"].env == {
        "DISCORD_TOKEN": "discord-secret",
        "DISCORD_GUILD": "acme",
    }
    assert config.servers["discord"].cwd == REPO / "servers" / "discord-mcpl"
    assert config.servers["editor"].token == "editor-secret"
    assert config.agents["kai"].home_channel == ChannelRef("discord", "discord:acme:general")
    assert config.host.token_file == REPO / "config" / "secrets" / "host-token"
    assert "editor-secret" not in repr(config) and "discord-secret" not in repr(config)


def test_the_example_mcpl_servers_json_loads() -> None:
    config = load_config(REPO / "config" / "mcpl-servers.example.json", environ=EXAMPLE_ENV)
    assert list(config.servers) == ["discord", "heartbeat", "editor", "slack"]
    assert config.servers["heartbeat"].command == str(
        REPO / "config" / "heartbeat-mcpl" / "bin" / "heartbeat"
    )
    assert config.warnings == ()


def test_the_example_names_its_missing_secret() -> None:
    ok, text = check_config(REPO / "config" / "example.toml", environ=ENV)
    assert not ok
    assert "DISCORD_TOKEN" in text and "mcplServers.discord.env.DISCORD_TOKEN" in text
    assert "EDITOR_TOKEN" in text and "mcplServers.editor.token" in text


def test_check_config_never_prints_a_secret(tmp_path) -> None:
    from mcpl_router.config import check_config

    program = tmp_path / "discord-mcpl"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    path = tmp_path / "servers.json"
    path.write_text(
        '{"mcplServers": {"d": {"command": "./discord-mcpl", "args": ["--token", "${DISCORD_TOKEN}"]},'
        ' "w": {"url": "wss://ghp_USERTOKEN@example.test/mcpl?token=QUERYSECRET"},'
        ' "p": {"url": "wss://user:PASSWORD@example.test/mcpl"}}}'
    )
    ok, text = check_config(path, environ={"DISCORD_TOKEN": "xoxb-ENVSECRET", "HOME": str(tmp_path)})
    assert ok, text
    for secret in ("xoxb-ENVSECRET", "ghp_USERTOKEN", "QUERYSECRET", "PASSWORD"):
        assert secret not in text
    assert "discord-mcpl (+2 args)" in text


def test_check_config_checks_what_would_fail_at_run_time(tmp_path: Path) -> None:
    """A command not on the child's PATH, a cwd that doesn't exist, a token file others can read."""
    token = tmp_path / "host-token"
    token.write_text("secret\n")
    token.chmod(0o644)
    path = write(
        tmp_path,
        '[mcplServers.a]\ncommand = "no-such-mcpl-server"\n'
        '[mcplServers.b]\ncommand = "sh"\ncwd = "missing-dir"\n'
        '[mcplServers.c]\ncommand = "./not-here"\n'
        '[mcplServers.d]\ncommand = "also-missing"\ndisabled = true\n'
        f'[host]\ntokenFile = "{token}"\n',
    )
    ok, text = check_config(path, environ={**ENV, "PATH": "/usr/bin:/bin"})
    assert not ok
    lines = text.splitlines()
    assert any("mcplServers.a.command" in line and "no-such-mcpl-server" in line and "PATH" in line for line in lines)
    assert any("mcplServers.b.cwd" in line and "does not exist" in line for line in lines)
    assert any("mcplServers.c.command" in line and "does not exist" in line for line in lines)
    assert not any("mcplServers.d" in line for line in lines)  # disabled: its program need not exist here
    assert any("host.tokenFile" in line and f"chmod 600 {token}" in line for line in lines)
    assert "secret" not in text
    token.chmod(0o600)
    (tmp_path / "missing-dir").mkdir()
    ok, text = check_config(path, environ={**ENV, "PATH": f"/usr/bin:/bin:{tmp_path}"})
    assert not ok and "mcplServers.b" not in text and "host.tokenFile" not in text


def test_locate_daemon_reads_only_what_finds_the_daemon(tmp_path: Path) -> None:
    from mcpl_router.config import locate_daemon

    path = write(
        tmp_path,
        '[mcplServers.discord]\ncommand = "node"\nenv = { DISCORD_TOKEN = "${DISCORD_TOKEN}" }\n'
        '[mcplServers.bad]\ntransport = "smtp"\n'
        '[host]\ntoken = "${HOST_TOKEN}"\nunixSocket = "run/host.sock"\n'
        '[health]\nbind = "0.0.0.0"\nport = 9464\n',
    )
    location = locate_daemon(path, environ=ENV)
    assert location.unix_socket == tmp_path / "run" / "host.sock"
    assert location.health_url == "http://127.0.0.1:9464"
    # A PostgreSQL journal's DSN may hold a secret the query commands' shell doesn't have.
    on_postgres = write(
        tmp_path,
        '[host]\nunixSocket = "run/host.sock"\n[journal]\nbackend = "postgres"\ndsn = "host=db password=${PG_SECRET}"\n',
    )
    assert locate_daemon(on_postgres, environ=ENV).unix_socket == tmp_path / "run" / "host.sock"
    broken = write(tmp_path, '[host]\nunixSocket = "${SOCKET_DIR}/host.sock"\n')
    with pytest.raises(ConfigError) as caught:
        locate_daemon(broken, environ=ENV)
    assert caught.value.key == "host.unixSocket" and "SOCKET_DIR" in str(caught.value)


def test_an_agent_can_be_declared_the_subconscious_of_another(tmp_path) -> None:
    from mcpl_router.config import parse_config

    config = parse_config(
        {"agents": {"kai": {}, "kai-sub": {"subconsciousFor": "kai"}}}, source="<t>", base_dir=tmp_path, environ={}
    )
    assert config.agents["kai-sub"].subconscious_for == "kai"
    assert config.agents["kai"].subconscious_for is None


def test_the_container_and_deploy_configs_load_and_agree() -> None:
    """config/container.toml (the image's) and deploy/router.toml keep everything in the state
    volume, on the documented ports; compose's health check is the Dockerfile's."""
    for path in (REPO / "config" / "container.toml", REPO / "deploy" / "router.toml"):
        config = load_config(path, environ=ENV)
        assert config.host.unix_socket == Path("/var/lib/mcpl-router/host.sock")
        assert config.host.token_file == Path("/var/lib/mcpl-router/host-token")
        assert config.journal.path == Path("/var/lib/mcpl-router/journal.sqlite3")
        assert config.host.websocket is not None and config.host.websocket.port == 7420
        assert (config.health.bind, config.health.port) == ("0.0.0.0", 9464)
    compose = (REPO / "deploy" / "compose.yaml").read_text()
    assert 'test: ["CMD", "mcpl-router", "health", "--config", "/etc/mcpl-router/config.toml"]' in compose
    assert 'CMD ["mcpl-router", "health", "--config", "/etc/mcpl-router/config.toml"]' in (REPO / "Dockerfile").read_text()


# --- connectome-host's mcpl-servers.json, unchanged (issue 11) ---------------------------------


def test_a_tombstone_is_a_disabled_server_with_nothing_to_reach() -> None:
    config = parse({"mcplServers": {"gone": {"disabled": True}, "live": {"command": "srv"}}})
    assert config.servers["gone"].disabled and config.servers["gone"].transport == "none"
    assert [s.id for s in config.enabled_servers()] == ["live"]
    assert "gone: none, disabled" in config.summary()


def test_disabled_with_an_endpoint_is_still_checked_as_that_transport() -> None:
    error = server_error({"disabled": True, "url": "smtp://x"})
    assert "mcplServers.s.url" in str(error)


def test_protocol_legacy_is_what_the_daemon_speaks_and_modern_is_refused() -> None:
    assert server({"command": "srv", "protocol": "legacy"}).command == "srv"
    error = server_error({"command": "srv", "protocol": "modern"})
    assert "mcplServers.s.protocol" in str(error) and "2026-07-28" in str(error) and '"legacy"' in str(error)
    # As connectome-host: a URL server takes its family from the scheme.
    assert "does not apply to a websocket server" in str(server_error({"url": "ws://127.0.0.1:1/mcpl", "protocol": "legacy"}))


@pytest.mark.parametrize(("written", "place"), [(None, "header"), ("auto", "auto"), ("header", "header"), ("query", "query")])
def test_token_in(written: str | None, place: str) -> None:
    entry: dict[str, Any] = {"url": "ws://127.0.0.1:1/mcpl", "token": "t"}
    if written is not None:
        entry["tokenIn"] = written
    assert server(entry).token_in == place


def test_token_in_refuses_another_place() -> None:
    error = server_error({"url": "ws://127.0.0.1:1/mcpl", "token": "t", "tokenIn": "body"})
    assert "mcplServers.s.tokenIn" in str(error) and "auto, header, query" in str(error)
