"""`verify: judge:`: the judge's system prompt and how its verdict is read."""

from __future__ import annotations

JUDGE_SYSTEM = (
    "You are a strict judge of another agent's work. Answer the question about the output you are "
    "shown. Open your reply with PASS, or with FAIL: and the reason in one sentence."
)


def parse_verdict(text: str) -> tuple[bool, str]:
    """PASS, or FAIL: reason, on the first line that says anything; anything else fails."""
    first = next((line.strip() for line in (text or "").splitlines() if line.strip()), "")
    head = first.lstrip("*#_ ").upper()
    if head.startswith("PASS"):
        return True, ""
    if head.startswith("FAIL"):
        reason = first.split(":", 1)[1].strip() if ":" in first else "no reason given"
        return False, reason or "no reason given"
    return False, f"the verdict was neither PASS nor FAIL: {first[:200]!r}"
