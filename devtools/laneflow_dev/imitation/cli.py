"""``python -m laneflow_dev.imitation``: serve the imitation until interrupted."""

from __future__ import annotations

import argparse
import math
import sys
import time

from laneflow_dev.imitation.cache import CacheClock
from laneflow_dev.imitation.server import HOST, MessagesImitation


def milliseconds(text: str) -> int:
    """A whole number of milliseconds, 0 or more (argparse names the option when it is not)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def positive(text: str) -> float:
    """A finite number above 0 (argparse names the option when it is not)."""
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m laneflow_dev.imitation",
        description="Serve a local imitation of the Anthropic Messages API (with prompt-cache semantics) on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, default=8765, help="port (0: any free one); default 8765")
    parser.add_argument("--ttft-ms", type=int, default=0, help="time to first token (the prefill), ms")
    parser.add_argument("--token-ms", type=float, default=0.0, help="time per output token, ms")
    parser.add_argument(
        "--hold-headers-ms",
        type=milliseconds,
        default=0,
        help="how long an accepted request waits before its response's headers are sent, ms",
    )
    parser.add_argument("--ttl-s", type=float, default=300.0, help="TTL of 5m cache entries, s")
    parser.add_argument(
        "--clock-rate",
        type=positive,
        default=None,
        help="the cache clock runs this many times as fast (from --clock-epoch); "
        "neither given: LANEFLOW_CACHE_CLOCK=RATE@EPOCH, else the wall clock",
    )
    parser.add_argument("--clock-epoch", type=float, default=None, help="where the fast cache clock starts, epoch seconds")
    parser.add_argument("--chars-per-token", type=int, default=4)
    parser.add_argument("--api-key", action="append", default=None, help="accepted x-api-key (repeatable); default any")
    args = parser.parse_args(argv)
    try:
        clock = CacheClock.of(args.clock_rate, args.clock_epoch)
    except ValueError as e:  # LANEFLOW_CACHE_CLOCK is not RATE@EPOCH
        parser.error(str(e))
    server = MessagesImitation(
        port=args.port,
        ttft_ms=args.ttft_ms,
        token_ms=args.token_ms,
        hold_headers_ms=args.hold_headers_ms,
        ttl_s=args.ttl_s,
        chars_per_token=args.chars_per_token,
        api_keys=set(args.api_key) if args.api_key else None,
        clock_rate=clock.rate,
        clock_epoch=clock.epoch,
    )
    try:
        server.start()
    except OSError as e:
        print(f"imitation: cannot listen on {HOST}:{args.port}: {e}", file=sys.stderr)
        return 1
    try:  # from the moment the address is told, Ctrl-C stops the server cleanly
        print(server.url, flush=True)
        print(f"# export ANTHROPIC_BASE_URL={server.url}  (Ctrl-C to stop)", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
