"""The local Messages API imitation, through the real anthropic SDK over real HTTP on
127.0.0.1: event order and shapes, usage, the prompt cache's semantics (an entry is readable
only once the response that wrote it has begun), scripted tool turns, errors, stats."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, cast

import anthropic
import pytest
from anthropic import Stream
from helpers import wait_for
from hypothesis import given, settings
from hypothesis import strategies as st

from laneflow_dev.imitation import MessagesImitation, Reply, default_responder

MODEL = "claude-sonnet-4-6"  # minimum cacheable prefix: 2048 tokens
BIG = "x" * 20_000  # 5,000 tokens at 4 chars per token


@pytest.fixture
def server() -> Iterator[MessagesImitation]:
    with MessagesImitation() as s:
        yield s


def client_for(server: MessagesImitation, **kw: Any) -> Any:  # Any: each test knows the blocks it reads
    return anthropic.Anthropic(api_key=kw.pop("api_key", "test"), base_url=server.url, max_retries=0, **kw)


def cached_system(text: str = BIG, **cc: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral", **cc}}]


def ask(client: anthropic.Anthropic, system: Any = None, content: Any = "Hello", model: str = MODEL, **kw: Any) -> Any:
    args: dict[str, Any] = dict(model=model, max_tokens=1024, messages=[{"role": "user", "content": content}])
    args.update(kw)
    if system is not None:
        args["system"] = system
    return client.messages.create(**args)


def raw_events(stream: Stream[Any]) -> list[tuple[str | None, Any]]:
    return [(sse.event, sse.json()) for sse in Stream.raw_events(stream.response)]


# -- shapes -----------------------------------------------------------------------------------


def test_streaming_event_order_and_shapes(server: MessagesImitation) -> None:
    client = client_for(server)
    stream = ask(client, content="Say something long enough to be chunked into several deltas", stream=True)
    events = raw_events(stream)
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert names.count("content_block_delta") >= 2 and names.count("ping") == 1
    for name, data in events:
        assert data["type"] == name
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["role"] == "assistant" and start["model"] == MODEL
    assert start["content"] == [] and start["stop_reason"] is None
    usage = start["usage"]
    assert usage["output_tokens"] == 1
    assert {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"} <= usage.keys()
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [d for n, d in events if n == "content_block_delta"]
    assert all(d["delta"]["type"] == "text_delta" and d["index"] == 0 for d in deltas)
    text = "".join(d["delta"]["text"] for d in deltas)
    assert text == "Reply to: Say something long enough to be chunked into several deltas\nTurn 1."
    end = dict(events)["message_delta"]
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert end["usage"]["output_tokens"] == -(-len(text) // 4)


def test_streaming_through_the_sdk_accumulates_the_message(server: MessagesImitation) -> None:
    client = client_for(server)
    with client.messages.stream(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Hi"}]) as s:
        pieces = list(s.text_stream)
        message = s.get_final_message()
    assert "".join(pieces) == "Reply to: Hi\nTurn 1."
    assert message.content[0].text == "Reply to: Hi\nTurn 1."
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == 5  # 20 chars


def test_non_streaming_message_and_usage(server: MessagesImitation) -> None:
    message = ask(client_for(server), system="Be brief.", content="What is up?\nmore lines")
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert message.model == MODEL and message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.content[0].type == "text" and message.content[0].text == "Reply to: What is up?\nTurn 1."
    u = message.usage
    # "Be brief." = 9 chars -> 3 tokens; the user text 22 chars -> 6 tokens
    assert (u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens) == (9, 0, 0)
    assert u.output_tokens == -(-len(message.content[0].text) // 4)


def test_validation_names_the_missing_field(server: MessagesImitation) -> None:
    client = client_for(server)
    for missing in ("model", "max_tokens", "messages"):
        body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}
        del body[missing]
        with pytest.raises(anthropic.BadRequestError) as exc:
            client.post("/v1/messages", body=body, cast_to=object)
        body_of: Any = exc.value.body  # the error's JSON
        assert body_of["error"]["type"] == "invalid_request_error"
        assert missing in body_of["error"]["message"]


def test_max_tokens_cuts_the_reply(server: MessagesImitation) -> None:
    message = ask(client_for(server), content="a fairly long question to answer here", max_tokens=3)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    assert message.content[0].text == "Reply to: a "


# -- the prompt cache ---------------------------------------------------------------------------


def test_a_cached_system_block_is_written_then_read(server: MessagesImitation) -> None:
    client = client_for(server)
    first = ask(client, system=cached_system()).usage
    assert first.cache_creation_input_tokens == 5000 and first.cache_read_input_tokens == 0
    assert first.input_tokens == 2  # "Hello"
    assert first.cache_creation.ephemeral_5m_input_tokens == 5000
    second = ask(client, system=cached_system(), content="Another question").usage
    assert second.cache_read_input_tokens == 5000 and second.cache_creation_input_tokens == 0
    assert second.input_tokens == 4


def test_a_prefix_below_the_model_minimum_neither_writes_nor_reads(server: MessagesImitation) -> None:
    client = client_for(server)
    small = cached_system("y" * 4000)  # 1,000 tokens < 2,048
    for _ in range(2):
        u = ask(client, system=small).usage
        assert (u.cache_creation_input_tokens, u.cache_read_input_tokens, u.input_tokens) == (0, 0, 1002)
    # 3,000 tokens: cacheable on sonnet 4.6 (2,048) but not on opus 4.6 (4,096)
    mid = cached_system("z" * 12_000)
    assert ask(client, system=mid, model="claude-opus-4-6").usage.cache_creation_input_tokens == 0
    assert ask(client, system=mid).usage.cache_creation_input_tokens == 3000
    assert server.min_cacheable_for("claude-3-5-haiku-20241022") == 2048
    assert server.min_cacheable_for("claude-sonnet-4-5-20250929") == 1024  # dated ids match by prefix
    assert server.min_cacheable_for("claude-opus-4-20250514") == 1024
    assert server.min_cacheable_for("some-other-model") == 1024
    with MessagesImitation(min_cacheable={"claude-sonnet-4-6": 100}) as tuned:
        assert ask(client_for(tuned), system=small).usage.cache_creation_input_tokens == 1000


def test_concurrent_requests_both_write_and_a_later_one_reads_once_the_first_began() -> None:
    with MessagesImitation(ttft_ms=300) as server:
        client = client_for(server)
        usages: list[Any] = [None, None]

        def run(i: int) -> None:
            usages[i] = ask(client, system=cached_system(), content=f"lane {i}").usage

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for u in usages:
            assert u.cache_creation_input_tokens == 5000 and u.cache_read_input_tokens == 0
        server.reset()

        # The lead streams; a sibling sent once the lead's first event arrived reads its prefix.
        lead = ask(client, system=cached_system(), content="lead", stream=True)
        first = next(iter(lead))
        assert first.type == "message_start" and first.message.usage.cache_creation_input_tokens == 5000
        sibling = ask(client, system=cached_system(), content="sibling").usage
        assert sibling.cache_read_input_tokens == 5000 and sibling.cache_creation_input_tokens == 0
        list(lead)
        stats = server.stats()
        assert stats["cache_writes"] == 1 and stats["cache_reads"] == 1


def test_a_shared_prefix_breakpoint_is_cached_on_its_own(server: MessagesImitation) -> None:
    """Siblings share tools + system but differ after: each breakpoint is its own entry."""
    client = client_for(server)
    tail = "t" * 8000  # 2,000 tokens

    def lane(name: str) -> Any:
        content = [{"type": "text", "text": f"{name}: {tail}", "cache_control": {"type": "ephemeral"}}]
        return ask(client, system=cached_system(), content=content).usage

    a = lane("a")
    assert a.cache_creation_input_tokens == 5000 + 2001 and a.cache_read_input_tokens == 0
    b = lane("b")
    assert b.cache_read_input_tokens == 5000 and b.cache_creation_input_tokens == 2001
    again = lane("a")
    assert again.cache_read_input_tokens == 7001 and again.cache_creation_input_tokens == 0


def test_ttl_expiry_writes_again() -> None:
    with MessagesImitation(ttl_s=0.2) as server:
        client = client_for(server)
        assert ask(client, system=cached_system()).usage.cache_creation_input_tokens == 5000
        assert ask(client, system=cached_system()).usage.cache_read_input_tokens == 5000
        time.sleep(0.3)
        u = ask(client, system=cached_system()).usage
        assert u.cache_read_input_tokens == 0 and u.cache_creation_input_tokens == 5000


def test_one_hour_entries_outlive_the_five_minute_ttl() -> None:
    with MessagesImitation(ttl_s=0.2) as server:
        client = client_for(server)
        hour = cached_system(ttl="1h")
        u = ask(client, system=hour).usage
        assert u.cache_creation.ephemeral_1h_input_tokens == 5000 and u.cache_creation.ephemeral_5m_input_tokens == 0
        time.sleep(0.3)
        assert ask(client, system=hour).usage.cache_read_input_tokens == 5000
        five_then_hour = [
            {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "b", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        ]
        with pytest.raises(anthropic.BadRequestError):  # longer TTLs must come first, as in the real API
            ask(client, system=five_then_hour)


def test_more_than_four_breakpoints_is_a_bad_request(server: MessagesImitation) -> None:
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as exc:
        ask(client_for(server), system=blocks)
    assert "maximum of 4" in str(exc.value)
    assert ask(client_for(server), system=blocks[:4]).stop_reason == "end_turn"


def test_a_failed_request_caches_nothing(server: MessagesImitation) -> None:
    client = client_for(server)
    server.fail_next(500)
    with pytest.raises(anthropic.InternalServerError):
        ask(client, system=cached_system())
    assert ask(client, system=cached_system()).usage.cache_creation_input_tokens == 5000


# -- tools and the script ---------------------------------------------------------------------


def test_tool_use_streams_input_json_deltas_that_reassemble() -> None:
    tool_input = {"path": "src/app.py", "lines": [1, 2, 3], "note": "a somewhat long value to split"}

    def responder(body: dict[str, Any]) -> Reply:
        return Reply(text="Let me look.", tool_uses=[{"name": "read_file", "input": tool_input}])

    with MessagesImitation(responder=responder) as server:
        client = client_for(server)
        events = raw_events(ask(client, stream=True))
        starts = [d for n, d in events if n == "content_block_start"]
        assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
        tool = starts[1]["content_block"]
        assert tool["id"].startswith("toolu_") and tool["name"] == "read_file" and tool["input"] == {}
        partial = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta" and d["index"] == 1]
        assert all(d["delta"]["type"] == "input_json_delta" for n, d in events if n == "content_block_delta" and d["index"] == 1)
        assert len(partial) > 2 and json.loads("".join(partial)) == tool_input
        assert dict(events)["message_delta"]["delta"]["stop_reason"] == "tool_use"

        with client.messages.stream(model=MODEL, max_tokens=1024, messages=[{"role": "user", "content": "go"}]) as s:
            message = s.get_final_message()
        assert message.stop_reason == "tool_use"
        block = message.content[1]
        assert block.type == "tool_use" and block.name == "read_file" and block.input == tool_input


def test_the_tool_directive_script_over_two_turns(server: MessagesImitation) -> None:
    client = client_for(server)
    prompt = 'Fix the bug\n[[tool read_file {"path": "a.py"}]]\n[[tool run_tests {}]]'
    messages: list[Any] = [{"role": "user", "content": prompt}]
    seen = []
    for _turn in range(2):
        m = client.messages.create(model=MODEL, max_tokens=1024, messages=messages, stream=False)
        assert m.stop_reason == "tool_use"
        text, call = m.content
        seen.append((text.text, call.name, call.input))
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok"}]})
    assert seen == [("Calling read_file.", "read_file", {"path": "a.py"}), ("Calling run_tests.", "run_tests", {})]
    final = client.messages.create(model=MODEL, max_tokens=1024, messages=messages)
    assert final.stop_reason == "end_turn"
    assert final.content[0].text == "Reply to: Fix the bug\nTurn 3."


def test_a_reply_directive_overrides_the_final_text() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Q\n[[reply Done.\\nAll good.]]"}]}]}
    assert default_responder(body) == Reply(text="Done.\nAll good.")


# -- errors -----------------------------------------------------------------------------------


def test_a_bad_key_is_an_authentication_error() -> None:
    with MessagesImitation(api_keys={"right"}) as server:
        with pytest.raises(anthropic.AuthenticationError) as exc:
            ask(client_for(server, api_key="wrong"))
        assert exc.value.status_code == 401
        assert exc.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
        assert ask(client_for(server, api_key="right")).stop_reason == "end_turn"
        req = urllib.request.Request(server.url + "/v1/messages", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(req)
        assert missing.value.code == 401
        body = json.dumps({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).encode()
        req = urllib.request.Request(server.url + "/v1/messages", data=body, headers={"x-api-key": "right"})
        assert json.load(urllib.request.urlopen(req))["content"][0]["text"].startswith("Reply to: hi")


def test_fail_next_answers_the_real_error_types(server: MessagesImitation) -> None:
    client = client_for(server)
    server.fail_next(529, 429, 401)
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        ask(client)
    assert overloaded.value.status_code == 529
    assert cast(Any, overloaded.value.body)["error"]["type"] == "overloaded_error"
    assert isinstance(overloaded.value, anthropic.OverloadedError)
    with pytest.raises(anthropic.RateLimitError) as limited:
        ask(client, stream=True)
    assert limited.value.response.headers["retry-after"] == "0"
    with pytest.raises(anthropic.AuthenticationError):
        ask(client)
    assert ask(client).stop_reason == "end_turn"


# -- stats ------------------------------------------------------------------------------------


def test_stats_totals_and_reset(server: MessagesImitation) -> None:
    client = client_for(server)
    ask(client, system=cached_system())
    ask(client, system=cached_system(), stream=True).close()
    ask(client, model="claude-haiku-4-5")
    server.fail_next(500)
    with pytest.raises(anthropic.InternalServerError):
        ask(client)
    stats = json.load(urllib.request.urlopen(server.url + "/stats"))
    assert stats == server.stats()
    assert stats["requests"] == 4 and stats["errors"] == 1
    assert stats["cache_write_tokens"] == 5000 and stats["cache_read_tokens"] == 5000
    assert stats["cache_writes"] == 1 and stats["cache_reads"] == 1
    assert stats["input_tokens"] == 2 + 2 + 2
    assert stats["by_model"][MODEL]["requests"] == 3 and stats["by_model"][MODEL]["errors"] == 1
    assert stats["by_model"]["claude-haiku-4-5"]["requests"] == 1
    assert stats["output_tokens"] == sum(m["output_tokens"] for m in stats["by_model"].values())
    reset = json.load(urllib.request.urlopen(urllib.request.Request(server.url + "/stats/reset", data=b"", method="POST")))
    assert reset["requests"] == 0 and reset["by_model"] == {}
    assert ask(client, system=cached_system()).usage.cache_creation_input_tokens == 5000  # the cache went too


def test_many_concurrent_streams() -> None:
    with MessagesImitation(ttft_ms=50, token_ms=1) as server:
        client = client_for(server)
        errors: list[Any] = []

        def run(i: int) -> None:
            try:
                with client.messages.stream(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": f"n{i}"}]) as s:
                    assert s.get_final_message().content[0].text == f"Reply to: n{i}\nTurn 1."
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(120)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and server.stats()["requests"] == 120


def test_the_command_line_serves_until_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "laneflow_dev.imitation", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None  # stdout=PIPE
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        stats = json.load(urllib.request.urlopen(url + "/stats"))
        assert stats["requests"] == 0
    except BaseException:
        proc.kill()  # the test's own failure is the one to see, not the server's exit
        proc.wait()
        raise
    proc.send_signal(__import__("signal").SIGINT)
    assert proc.wait(timeout=5) == 0


def test_a_client_that_closes_the_connection_during_the_prefill_is_counted_as_a_disconnect() -> None:
    """The server side of a stop before the first token: it notices at once, sends nothing."""
    with MessagesImitation(ttft_ms=20_000) as slow:
        stream = ask(client_for(slow), content="think long", stream=True)  # the headers came; no event yet
        stream.response.extensions["network_stream"].get_extra_info("socket").shutdown(2)  # SHUT_RDWR
        stream.close()
        # Counted during the prefill, not when its 20 s ended and a send failed: the wait gives
        # up at half of it
        wait_for(lambda: slow.stats()["disconnects"], "the disconnect counted during the prefill", timeout_s=10)
        assert slow.stats()["disconnects"] == 1
    with MessagesImitation(ttft_ms=50) as quick:  # a stream read to its end is no disconnect
        list(ask(client_for(quick), content="hi", stream=True))
        assert quick.stats()["disconnects"] == 0


# -- held response headers (an overloaded API, a proxy holding the response) ---------------------


@settings(max_examples=6, deadline=None, derandomize=True)
@given(hold_ms=st.integers(min_value=0, max_value=150), stream=st.booleans())
def test_held_response_headers_come_no_sooner_than_the_hold(hold_ms: int, stream: bool) -> None:
    with MessagesImitation(hold_headers_ms=hold_ms) as held:
        started = time.monotonic()
        raw = client_for(held).messages.with_raw_response.create(
            model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=stream
        )
        waited = time.monotonic() - started
        if stream:
            list(raw.parse())
        assert raw.http_response.status_code == 200 and waited >= hold_ms / 1000
        stats = held.stats()
        assert stats["held"] == (1 if hold_ms else 0) and stats["requests"] == 1 and stats["disconnects"] == 0


def test_a_client_that_leaves_while_the_headers_are_held_is_counted_and_sent_nothing() -> None:
    import socket

    with MessagesImitation(hold_headers_ms=20_000) as held:
        body = json.dumps({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode()
        conn = socket.create_connection(("127.0.0.1", held.port), timeout=5)
        conn.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: k\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_for(lambda: held.stats()["held"], "the headers held")
        conn.shutdown(socket.SHUT_RDWR)
        conn.close()
        # Counted while the 20 s hold lasted, not when it ended: the wait gives up at half of it
        wait_for(lambda: held.stats()["disconnects"], "the disconnect counted during the hold", timeout_s=10)
        stats = held.stats()
        assert stats["disconnects"] == 1 and stats["requests"] == 0


def test_the_command_line_holds_response_headers_and_refuses_a_negative_hold() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "laneflow_dev.imitation", "--port", "0", "--hold-headers-ms", "300"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None  # stdout=PIPE
        url = proc.stdout.readline().strip()
        message = anthropic.Anthropic(api_key="k", base_url=url, max_retries=0).messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.content
        # The option reached the server: it held this response's headers
        stats = json.load(urllib.request.urlopen(url + "/stats"))
        assert stats["held"] == 1 and stats["requests"] == 1
    except BaseException:
        proc.kill()  # the test's own failure is the one to see, not the server's exit
        proc.wait()
        raise
    proc.send_signal(__import__("signal").SIGINT)
    assert proc.wait(timeout=5) == 0
    refused = subprocess.run(
        [sys.executable, "-m", "laneflow_dev.imitation", "--hold-headers-ms", "-5"], capture_output=True, text=True, timeout=30
    )
    assert refused.returncode == 2 and "--hold-headers-ms" in refused.stderr
    with pytest.raises(ValueError, match="hold_headers_ms"):
        MessagesImitation(hold_headers_ms=-1)
