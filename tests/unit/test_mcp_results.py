"""An MCP tool's result as the model reads it (`result_text`): its text blocks as they are,
every other block described in a line, the structured content when there is nothing else."""

from __future__ import annotations

import mcp_types

from laneflow.adapters.executors.mcp_tools import result_text


def test_each_kind_of_block_reads_as_text() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(text="first"),
            mcp_types.ImageContent(data="aGVsbG8=", mime_type="image/png"),
            mcp_types.EmbeddedResource(resource=mcp_types.TextResourceContents(uri="file:///notes.md", text="a note")),
            mcp_types.EmbeddedResource(resource=mcp_types.BlobResourceContents(uri="file:///b.bin", blob="AAAA")),
            mcp_types.ResourceLink(uri="https://example.com/doc", name="doc"),
        ]
    )
    assert result_text(result).splitlines() == [
        "first",
        "[image: image/png, 8 characters of base64]",
        "[resource file:///notes.md]",
        "a note",
        "[resource file:///b.bin]",
        "[binary, 4 characters of base64]",
        "[resource link https://example.com/doc]",
    ]


def test_structured_content_stands_in_when_there_is_no_block() -> None:
    assert result_text(mcp_types.CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'
    assert result_text(mcp_types.CallToolResult(content=[])) == ""
