"""A local imitation of the Anthropic Messages API, for tests and benchmarks.

Point the real SDK at it (``anthropic.Anthropic(base_url=server.url)`` or
``ANTHROPIC_BASE_URL=http://127.0.0.1:8765``) and it answers ``POST /v1/messages`` with the
real shapes: a whole Message, or server-sent events in the real order (``message_start``,
per block ``content_block_start`` / ``content_block_delta`` / ``content_block_stop``, a
``ping`` after the first block start, ``message_delta``, ``message_stop``).

Its point is the prompt cache, reproduced with the semantics that make laneflow's warm gate
matter: a cache entry is created when a request arrives, but it becomes readable only once
the response that wrote it has begun (when its ``message_start`` is sent, after the
``ttft_ms`` "prefill"). A request for the same prefix that arrives before that moment does
not read it: it writes it again and pays another cache write, as with the real API.

Approximations (documented, deterministic):

* Tokens of a text are ``ceil(len(text) / chars_per_token)``, counted per block: a tool
  definition is its canonical JSON, a text block its text, a ``tool_use`` its name plus the
  JSON of its input, a ``tool_result`` its content (text blocks' texts), anything else
  (images, documents...) its canonical JSON. The prompt is tools, then system, then the
  messages' content blocks, in order.
* Only explicit ``cache_control`` breakpoints are cache positions (the real API's automatic
  look-back over earlier block boundaries is not imitated). A request reads the longest
  readable, unexpired breakpoint prefix, and writes an entry at every breakpoint longer than
  what it read (billed once: ``cache_creation_input_tokens`` = the longest written prefix's
  tokens minus the read ones), so a shared prefix (tools + system) is cached on its own.
* A breakpoint's ``cache_control.ttl`` ("5m", the default, or "1h") is its entry's TTL
  (``ttl_s``, ``ttl_1h_s``); the usage splits the write by TTL in ``cache_creation``
  (``ephemeral_5m_input_tokens``, ``ephemeral_1h_input_tokens``) as the API does, and the
  stats count the writes by TTL and the cold prefixes (requests that wrote and read nothing).
* The cache's clock is the wall clock, or a fast one (``clock_rate`` times as fast from
  ``clock_epoch``; neither given: ``LANEFLOW_CACHE_CLOCK="RATE@EPOCH"``, the clock laneflow's
  prefix registry reads), so TTLs of minutes pass in seconds; ``now()`` reads it. The
  prefill and the output's pace stay in real time.
* Output tokens are counted the same way over the reply's text and tool-use inputs; a
  reply longer than ``max_tokens`` is cut there with ``stop_reason: "max_tokens"``.

Server tools: a request carrying ``web_search_20250305`` or ``web_fetch_20250910`` (checked
as the API checks a definition: a 400 naming the field) has the uses its script asks for run
here, in the same response: ``server_tool_use`` and its result block, pretend pages naming the
query or URL, a text citing them, ``max_uses`` honoured with ``max_uses_exceeded``, and
``usage.server_tool_use`` counting the requests made (web.py).

Auth: the key comes in ``x-api-key`` or, as SDK 2.x sends ``api_key``, in
``Authorization: Bearer``; a missing key (or one not in ``api_keys``) is a 401.

Stdlib only. Loopback only (binds 127.0.0.1). Run it standalone with
``python -m laneflow_dev.imitation --port 8765 --ttft-ms 400 --token-ms 5``.
"""

from laneflow_dev.imitation.cli import main
from laneflow_dev.imitation.prompt import (
    DEFAULT_MIN_CACHEABLE,
    RequestError,
    analyze_prompt,
    validate_body,
)
from laneflow_dev.imitation.replies import Reply, Responder, default_responder
from laneflow_dev.imitation.server import HOST, MessagesImitation

__all__ = [
    "Reply",
    "Responder",
    "MessagesImitation",
    "default_responder",
    "DEFAULT_MIN_CACHEABLE",
    "main",
    "HOST",
    "RequestError",
    "analyze_prompt",
    "validate_body",
]
