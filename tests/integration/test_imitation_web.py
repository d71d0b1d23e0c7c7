"""The imitation's server tools, through the real anthropic SDK over real HTTP: a scripted
web search is run in the same response (server_tool_use, its result, a text citing it), in
the stream's real shapes; max_uses is honoured a request with the API's error; usage counts
the requests made; a malformed server tool definition is a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from anthropic import Stream

from laneflow_dev.imitation import MessagesImitation, Reply

MODEL = "claude-sonnet-4-6"

SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}

FETCH = {"type": "web_fetch_20250910", "name": "web_fetch", "max_uses": 1, "citations": {"enabled": True}}

FETCH_BETA = "web-fetch-2025-09-10"


@pytest.fixture
def server() -> Iterator[MessagesImitation]:
    with MessagesImitation() as s:
        yield s


def client_for(server: MessagesImitation) -> Any:
    return anthropic.Anthropic(api_key="test", base_url=server.url, max_retries=0)


def script(*lines: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "\n".join(["Look it up.", *lines])}]


def test_a_scripted_search_is_run_in_the_same_response_and_its_page_is_cited(server: MessagesImitation) -> None:
    client = client_for(server)
    messages = script('[[tool web_search {"query": "tides"}]]', "[[reply The tides turn.]]")
    reply = client.messages.create(model=MODEL, max_tokens=1024, messages=messages, tools=[SEARCH])
    assert [b.type for b in reply.content] == ["server_tool_use", "web_search_tool_result", "text"]
    use, result, text = reply.content
    assert use.name == "web_search" and use.input == {"query": "tides"} and use.id.startswith("srvtoolu_")
    assert result.tool_use_id == use.id
    assert [p.url for p in result.content] == [f"https://example.com/search/{n}?q=tides" for n in (1, 2, 3)]
    assert text.text == "The tides turn." and reply.stop_reason == "end_turn"
    [citation] = text.citations
    assert citation.type == "web_search_result_location" and citation.url == result.content[0].url
    assert reply.usage.server_tool_use.web_search_requests == 1
    assert server.stats()["web_search_requests"] == 1


def test_the_stream_carries_the_blocks_in_the_real_shapes(server: MessagesImitation) -> None:
    client = client_for(server)
    messages = script('[[tool web_search {"query": "tides"}]]', "[[reply Cited.]]")
    stream = client.messages.create(model=MODEL, max_tokens=1024, messages=messages, tools=[SEARCH], stream=True)
    events = [(sse.event, sse.json()) for sse in Stream.raw_events(stream.response)]
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [b["type"] for b in starts] == ["server_tool_use", "web_search_tool_result", "text"]
    assert starts[0]["input"] == {} and len(starts[1]["content"]) == 3  # input streamed; a result whole
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta") == '{"query":"tides"}'
    kinds = [d["type"] for d in deltas if d["type"] != "input_json_delta"]
    assert kinds[0] == "citations_delta" and set(kinds[1:]) == {"text_delta"}  # the citation before the text
    [end] = [data for name, data in events if name == "message_delta"]
    assert end["usage"]["server_tool_use"] == {"web_search_requests": 1, "web_fetch_requests": 0}
    [start] = [data for name, data in events if name == "message_start"]
    assert "server_tool_use" not in start["message"]["usage"]  # counted by the end


def test_max_uses_is_honoured_a_request_with_the_apis_error(server: MessagesImitation) -> None:
    client = client_for(server)
    lines = [f'[[tool web_search {{"query": "q{n}"}}]]' for n in range(3)]
    reply = client.messages.create(model=MODEL, max_tokens=1024, messages=script(*lines, "[[reply Done.]]"), tools=[SEARCH])
    results = [b for b in reply.content if b.type == "web_search_tool_result"]
    assert [isinstance(r.content, list) for r in results] == [True, True, False]
    assert results[2].content.type == "web_search_tool_result_error"
    assert results[2].content.error_code == "max_uses_exceeded"
    assert reply.usage.server_tool_use.web_search_requests == 2  # only the searches made


def test_a_fetch_reads_a_url_of_the_conversation_only_and_cites_its_document(server: MessagesImitation) -> None:
    client = client_for(server)
    lines = ['[[tool web_fetch {"url": "https://example.com/tides"}]]', '[[tool web_fetch {"url": "https://example.com/x"}]]']
    messages = script(*lines, "[[reply Read.]]")
    reply = client.beta.messages.create(model=MODEL, max_tokens=1024, messages=messages, tools=[FETCH], betas=[FETCH_BETA])
    results = [b for b in reply.content if b.type == "web_fetch_tool_result"]
    assert results[0].content.type == "web_fetch_result" and results[0].content.url == "https://example.com/tides"
    assert results[0].content.content.title == "Page at https://example.com/tides"
    assert results[1].content.error_code == "max_uses_exceeded"  # max_uses 1
    [citation] = reply.content[-1].citations
    assert citation.type == "char_location" and citation.document_title == "Page at https://example.com/tides"
    assert reply.usage.server_tool_use.web_fetch_requests == 1
    server.responder = lambda body: Reply(
        text="Read.", server_uses=[{"name": "web_fetch", "input": {"url": "https://unseen.example/"}}]
    )
    other = client.beta.messages.create(model=MODEL, max_tokens=1024, messages=script(), tools=[FETCH], betas=[FETCH_BETA])
    [refused] = [b for b in other.content if b.type == "web_fetch_tool_result"]
    assert refused.content.error_code == "url_not_in_prior_context"  # a URL no one gave it
    assert other.usage.server_tool_use.web_fetch_requests == 0


def test_a_client_tool_after_a_search_ends_the_response_with_tool_use(server: MessagesImitation) -> None:
    client = client_for(server)
    read = {"name": "read_file", "description": "reads", "input_schema": {"type": "object"}}
    lines = ['[[tool web_search {"query": "tides"}]]', '[[tool read_file {"path": "a"}]]', "[[reply Done.]]"]
    first = client.messages.create(model=MODEL, max_tokens=1024, messages=script(*lines), tools=[read, SEARCH])
    assert [b.type for b in first.content] == ["server_tool_use", "web_search_tool_result", "text", "tool_use"]
    assert first.stop_reason == "tool_use"
    turn = [b.model_dump(exclude_none=True) for b in first.content]
    then = [
        *script(*lines),
        {"role": "assistant", "content": turn},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[3].id, "content": "x"}]},
    ]
    second = client.messages.create(model=MODEL, max_tokens=1024, messages=then, tools=[read, SEARCH])
    assert [b.type for b in second.content] == ["text"] and second.content[0].text == "Done."


def test_a_search_directive_without_the_tool_in_the_request_is_a_client_tool_use(server: MessagesImitation) -> None:
    client = client_for(server)
    reply = client.messages.create(model=MODEL, max_tokens=1024, messages=script('[[tool web_search {"query": "x"}]]'))
    assert [b.type for b in reply.content] == ["text", "tool_use"]
    assert server.stats()["web_search_requests"] == 0


@pytest.mark.parametrize(
    ("tool", "betas", "says"),
    [
        ({**SEARCH, "max_uses": 0}, [], "tools.0.web_search_20250305.max_uses: Input should be greater than or equal to 1"),
        ({**SEARCH, "max_uses": "5"}, [], "tools.0.web_search_20250305.max_uses: Input should be a valid integer"),
        ({**SEARCH, "name": "search"}, [], "tools.0.web_search_20250305.name: Input should be 'web_search'"),
        ({**SEARCH, "colour": "red"}, [], "tools.0.web_search_20250305.colour: Extra inputs are not permitted"),
        ({**SEARCH, "allowed_domains": ["a.com"], "blocked_domains": ["b.com"]}, [], "cannot be used together"),
        ({"type": "web_search_99990101", "name": "web_search"}, [], "Input tag 'web_search_99990101' found using 'type'"),
        (FETCH, [], f"anthropic-beta: {FETCH_BETA}"),
        ({**FETCH, "citations": {"enabled": "yes"}}, [FETCH_BETA], "citations.enabled: Input should be a valid boolean"),
    ],
)
def test_a_malformed_server_tool_definition_is_a_400_naming_the_field(
    server: MessagesImitation, tool: dict[str, Any], betas: list[str], says: str
) -> None:
    client = client_for(server)
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.beta.messages.create(model=MODEL, max_tokens=64, messages=script(), tools=[tool], betas=betas)
    assert says in str(exc.value)
    assert server.stats()["errors"] == 1
