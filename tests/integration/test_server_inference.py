"""Server-initiated inference end to end: fixture servers (real processes) ask, a host answers.

Server ``a`` is configured with ``inference = {agent = "kai"}``; server ``b`` advertises the
same capabilities but has no ``inference`` table, so it is never granted them. The host (the
repo's RouterClient on the Unix socket) claims ``kai`` and declares it serves kai's model.
What each server received is read from its own recordings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import dialled_server, running_daemon, wait_ready

pytestmark = pytest.mark.integration

AGENT = "kai"
REQUEST = {"featureSet": "a.inference", "stream": True, "messages": [{"role": "user", "content": "Summarize: x"}],
           "preferences": {"maxTokens": 50}}
RESULT = {"content": "A summary.", "model": "test-model", "finishReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 2}}


@asynccontextmanager
async def two_servers(tmp_path: Path, **inference: Any) -> AsyncIterator[tuple[Daemon, FixtureProcess, FixtureProcess]]:
    """``a`` (inference configured, ``inference`` overriding the defaults) and ``b`` (not)."""
    async with AsyncExitStack() as stack:
        fixtures = {
            name: await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", personality="strict", control_dir=tmp_path, server_name=name, inference=True)
            )
            for name in ("a", "b")
        }
        config = {
            "a": dialled_server(fixtures["a"], inference={"agent": AGENT, **inference}),
            "b": dialled_server(fixtures["b"]),
        }
        daemon = await stack.enter_async_context(running_daemon(tmp_path, config, unix_socket=True))
        for name in fixtures:
            await wait_ready(daemon, name)
        yield daemon, fixtures["a"], fixtures["b"]


@asynccontextmanager
async def serving_host(daemon: Daemon, handlers: dict[str, Callable[[Any], Awaitable[Any]]]) -> AsyncIterator[RouterClient]:
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        # The handlers read the request as the daemon sent it (its params, on the wire).
        if "inference/request" in handlers:
            infer = handlers["inference/request"]
            client.serve_inference(lambda request: infer(
                {"requestId": request.request_id, "agent": request.agent, "serverId": request.server_id,
                 "stream": request.stream, "request": request.request}))
        if "model/info" in handlers:
            info = handlers["model/info"]
            client.serve_model_info(lambda request: info({"requestId": request.request_id, "agent": request.agent, "serverId": request.server_id}))
        hello = await client.call(
            "session/hello",
            {"host": "h", "agents": [{"name": AGENT}], "serves": {"inference": [AGENT], "modelInfo": [AGENT]}},
        )
        assert hello["serves"] == {"inference": [AGENT], "modelInfo": [AGENT]}
        yield client


def chunks_counted(daemon: Daemon, outcome: str) -> float:
    return float(daemon.metrics.inference_chunks.labels(outcome)._value.get())


def requests_counted(daemon: Daemon, outcome: str, method: str = "inference/request", server: str = "a") -> float:
    return float(daemon.metrics.inference_requests.labels(server, method, outcome)._value.get())


async def chunks_of(server: FixtureProcess) -> list[dict[str, Any]]:
    return [entry["params"] for entry in await server.recorded("inference/chunk")]


async def test_streamed_request_reaches_the_serving_host_and_only_the_asking_server_gets_chunks_and_answer(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path) as (daemon, a, b):
            asked: list[Any] = []

            async def answer(params: Any) -> Any:
                asked.append(params)
                for index, delta in enumerate(["A ", "sum", "mary."]):
                    await client.notify("inference/chunk", {"requestId": params["requestId"], "chunk": {"index": index, "delta": delta}})
                return RESULT

            async with serving_host(daemon, {"inference/request": answer}) as client:
                outcome = await a.host_call("inference/request", REQUEST)
                # The chunks were there before the answer: read at once, without waiting.
                streamed = await chunks_of(a)
                assert outcome == {"result": RESULT}
                assert [(c["index"], c["delta"]) for c in streamed] == [(0, "A "), (1, "sum"), (2, "mary.")]
                # Tied to the server's own request by its JSON-RPC id, never the host's routing id.
                assert len({c["requestId"] for c in streamed}) == 1 and isinstance(streamed[0]["requestId"], int)
                (params,) = asked
                assert params["agent"] == AGENT and params["serverId"] == "a" and params["stream"] is True
                assert params["request"] == REQUEST and params["requestId"].startswith("ir-")

                # Not streamed: the host's chunks are dropped (counted), the answer still comes.
                plain = {**REQUEST, "stream": False}
                assert await a.host_call("inference/request", plain) == {"result": RESULT}
                assert asked[1]["stream"] is False and asked[1]["request"] == plain
                assert len(await chunks_of(a)) == 3
                assert chunks_counted(daemon, "not-streaming") == 3
                assert requests_counted(daemon, "answered") == 2

            # Server b saw nothing of a's requests.
            assert await chunks_of(b) == []
            assert [e for e in await b.recorded() if "inference" in str(e.get("method"))] == []


async def test_model_info_is_answered_by_the_serving_host(tmp_path: Path) -> None:
    info = {"id": "test-model", "vendor": "test", "contextWindow": 1000, "capabilities": ["tools"]}
    with trio.fail_after(60):
        async with two_servers(tmp_path) as (daemon, a, _b):
            asked: list[Any] = []

            async def model_info(params: Any) -> Any:
                asked.append(params)
                return info

            async with serving_host(daemon, {"model/info": model_info}):
                assert await a.host_call("model/info", {}) == {"result": info}
            assert asked == [{"requestId": asked[0]["requestId"], "agent": AGENT, "serverId": "a"}]


async def test_a_server_without_inference_config_is_refused_capability_denied(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path) as (daemon, a, b):
            granted_a = (await a.recorded("featureSets/update"))[0]["params"]["effectiveCapabilities"]
            granted_b = (await b.recorded("featureSets/update"))[0]["params"]["effectiveCapabilities"]
            assert {"inferenceRequest", "inferenceRequest.streaming", "modelInfo"} <= set(granted_a)
            assert not {"inferenceRequest", "inferenceRequest.streaming", "modelInfo"} & set(granted_b)

            async def answer(params: Any) -> Any:
                raise AssertionError("b's request must never reach a host")

            async with serving_host(daemon, {"inference/request": answer, "model/info": answer}):
                refused = await b.host_call("inference/request", REQUEST)
                assert refused["error"]["code"] == -32002
                assert refused["error"]["data"] == {"capability": "inferenceRequest"}
                assert (await b.host_call("model/info", {}))["error"]["code"] == -32002
            assert await chunks_of(b) == []


async def test_with_no_host_serving_the_refusal_says_so(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path) as (daemon, a, _b):
            refused = await a.host_call("inference/request", REQUEST)
            assert refused["error"]["code"] == -32060
            assert refused["error"]["data"]["reason"] == "no-host"
            assert "no host serves agent 'kai'" in refused["error"]["message"]
            # A host owning kai but not declaring it serves its model is no server of it either.
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                await client.hello("h", [AGENT])
                assert (await a.host_call("model/info", {}))["error"]["data"]["reason"] == "no-host"
            assert requests_counted(daemon, "no-host") == 1


async def test_the_host_dropping_mid_stream_ends_the_request_with_an_error(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path, timeout=50) as (daemon, a, _b):
            started = trio.Event()

            async def answer(params: Any) -> Any:
                await client.notify("inference/chunk", {"requestId": params["requestId"], "chunk": {"index": 0, "delta": "A "}})
                started.set()
                await trio.sleep_forever()

            outcome: dict[str, Any] = {}
            async with trio.open_nursery() as nursery:

                async def ask() -> None:
                    outcome.update(await a.host_call("inference/request", REQUEST))

                with trio.CancelScope() as host_scope:
                    async with serving_host(daemon, {"inference/request": answer}) as client:
                        nursery.start_soon(ask)
                        await started.wait()
                        await wait_until(lambda: chunks_counted(daemon, "forwarded") == 1)
                        host_scope.cancel()  # the host goes away mid-stream
            assert outcome["error"]["code"] == -32061
            assert outcome["error"]["data"]["reason"] == "host-gone"
            assert len(await chunks_of(a)) == 1
            assert daemon.inference.open_requests() == 0


async def test_the_host_not_answering_in_time_is_a_timeout(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path, timeout=0.5) as (daemon, a, _b):

            async def answer(params: Any) -> Any:
                await trio.sleep_forever()

            async with serving_host(daemon, {"inference/request": answer}):
                outcome = await a.host_call("inference/request", REQUEST)
            assert outcome["error"]["code"] == -32062
            assert outcome["error"]["data"]["reason"] == "timeout"


async def test_a_request_the_daemon_gives_up_on_is_cancelled_in_the_host(tmp_path: Path) -> None:
    """Past the deadline the daemon tells the host ``inference/cancel``: the typed client
    cancels that handler, so a model that hangs doesn't keep abandoned requests running."""
    with trio.fail_after(60):
        async with two_servers(tmp_path, timeout=0.5) as (daemon, a, _b):
            stopped = trio.Event()

            async def answer(params: Any) -> Any:
                try:
                    await trio.sleep_forever()
                finally:
                    stopped.set()

            async with serving_host(daemon, {"inference/request": answer}) as client:
                outcome = await a.host_call("inference/request", REQUEST)
                assert outcome["error"]["data"]["reason"] == "timeout"
                with trio.fail_after(5):
                    await stopped.wait()
                assert client.statistics().requests_cancelled == 1
                assert daemon.inference.open_requests() == 0


async def test_more_than_max_concurrent_requests_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path, maxConcurrent=2) as (daemon, a, _b):
            release = trio.Event()
            in_host: list[str] = []

            async def answer(params: Any) -> Any:
                in_host.append(params["requestId"])
                await release.wait()
                return RESULT

            outcomes: list[dict[str, Any]] = []
            async with serving_host(daemon, {"inference/request": answer}):
                async with trio.open_nursery() as nursery:

                    async def ask() -> None:
                        outcomes.append(await a.host_call("inference/request", REQUEST))

                    for _ in range(3):
                        nursery.start_soon(ask)
                    await wait_until(lambda: len(in_host) == 2 and len(outcomes) == 1)
                    release.set()
            refused = [o for o in outcomes if "error" in o]
            assert len(refused) == 1 and len(outcomes) == 3 and len(in_host) == 2
            assert refused[0]["error"]["code"] == -32063
            assert refused[0]["error"]["data"]["reason"] == "too-many-concurrent"
            # Slots come back: one more now is answered.
            async with serving_host(daemon, {"inference/request": answer}):
                assert await a.host_call("inference/request", REQUEST) == {"result": RESULT}


async def test_more_than_per_minute_requests_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path, perMinute=2) as (daemon, a, _b):

            async def answer(params: Any) -> Any:
                return RESULT

            async with serving_host(daemon, {"inference/request": answer}):
                plain = {**REQUEST, "stream": False}
                assert await a.host_call("inference/request", plain) == {"result": RESULT}
                assert await a.host_call("inference/request", plain) == {"result": RESULT}
                refused = await a.host_call("inference/request", plain)
            assert refused["error"]["code"] == -32064
            assert refused["error"]["data"]["reason"] == "rate-limited"
            assert 0 < refused["error"]["data"]["retryAfter"] <= 60


async def test_a_request_over_max_request_bytes_is_refused_before_any_host_sees_it(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path, maxRequestBytes=500) as (daemon, a, _b):
            asked: list[Any] = []

            async def answer(params: Any) -> Any:
                asked.append(params)
                return RESULT

            async with serving_host(daemon, {"inference/request": answer}):
                big = {**REQUEST, "messages": [{"role": "user", "content": "x" * 600}]}
                refused = await a.host_call("inference/request", big)
                assert await a.host_call("inference/request", REQUEST) == {"result": RESULT}
            assert refused["error"]["code"] == -32065
            assert refused["error"]["data"]["reason"] == "too-large" and refused["error"]["data"]["limit"] == 500
            assert len(asked) == 1


async def test_a_chunk_from_a_connection_that_was_not_asked_or_for_no_open_request_is_dropped(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers(tmp_path) as (daemon, a, _b):
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as other:
                await other.hello("other", ["eve"])

                async def answer(params: Any) -> Any:
                    # Another connection, knowing the id, tries to speak into this stream.
                    await other.notify("inference/chunk", {"requestId": params["requestId"], "chunk": {"index": 0, "delta": "spoof"}})
                    await wait_until(lambda: chunks_counted(daemon, "not-asked") == 1)
                    return RESULT

                async with serving_host(daemon, {"inference/request": answer}) as client:
                    assert await a.host_call("inference/request", REQUEST) == {"result": RESULT}
                    await client.notify("inference/chunk", {"requestId": "ir-999-none", "chunk": {"index": 0, "delta": "late"}})
                    await wait_until(lambda: chunks_counted(daemon, "unknown-request") == 1)
            assert await chunks_of(a) == []


async def test_hello_refuses_serving_an_agent_the_connection_does_not_own(tmp_path: Path) -> None:
    from mcpl_router.jsonrpc import RpcError

    with trio.fail_after(30):
        async with running_daemon(tmp_path, {}, unix_socket=True) as daemon:
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                with pytest.raises(RpcError) as refused:
                    await client.call("session/hello", {"host": "h", "agents": [{"name": AGENT}], "serves": {"inference": ["zed"]}})
                assert refused.value.code == -32602 and "'zed'" in refused.value.message
                assert refused.value.data == {"field": "serves.inference", "agent": "zed"}
                # Nothing was claimed by the refused hello.
                assert daemon.sessions.owner_of(AGENT) is None
                hello = await client.call("session/hello", {"host": "h", "agents": [{"name": AGENT}]})
                assert hello["serves"] == {"inference": [], "modelInfo": []}
                # A later hello may declare an agent the connection already owns.
                hello = await client.call("session/hello", {"host": "h", "serves": {"modelInfo": [AGENT]}})
                assert hello["serves"] == {"inference": [], "modelInfo": [AGENT]}


async def test_a_reload_that_adds_the_inference_table_grants_it_live(tmp_path: Path) -> None:
    from .conftest import daemon_config

    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", personality="strict", control_dir=tmp_path, server_name="a", inference=True) as a:
            async with running_daemon(tmp_path, {"a": dialled_server(a)}, unix_socket=True) as daemon:
                await wait_ready(daemon, "a")
                assert (await a.host_call("inference/request", REQUEST))["error"]["code"] == -32002

                async def answer(params: Any) -> Any:
                    return RESULT

                async with serving_host(daemon, {"inference/request": answer}):
                    applied = await daemon.reload(
                        daemon_config(tmp_path, {"a": dialled_server(a, inference={"agent": AGENT})}, unix_socket=True)
                    )
                    assert applied["regranted"] == ["a"] and applied["reconnected"] == []
                    await wait_until(lambda: daemon.links["a"].grant.allows("inferenceRequest"))
                    assert await a.host_call("inference/request", {**REQUEST, "stream": False}) == {"result": RESULT}
