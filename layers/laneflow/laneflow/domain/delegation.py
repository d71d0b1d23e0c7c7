"""Delegation's rules: agent.md `delegates: [AGENT, ...]` grants the `delegate` tool, whose
call runs the named agent's own model loop inside the calling step's attempt.

- A chain of delegations is at most MAX_DEPTH deep below the step's own agent (the step's
  agent delegates to B, B to C; C cannot delegate further), because each level multiplies a
  step's possible spend and time and a deeper tree is better written as a flow.
- An agent never delegates to itself or to an agent above it in the chain (a cycle would
  only end at the depth limit, having spent each level's turns for nothing).
- What a step's agent may reach by delegating (`reach`) is fixed as its run starts: those
  agents' folders join the step's scratch copy, their secrets the run's masking, and a step
  is sandboxed when any of them runs programs.

A refused call is an `is_error` result naming why; the step goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

DELEGATE = "delegate"  # the tool an agent's `delegates:` grants

MAX_DEPTH = 2  # delegations below the step's own agent

DELEGATES = "delegates"  # the run option: agent -> the agents its steps may reach by delegating


class DelegationRefused(ValueError):
    """A `delegate` call that cannot run (an agent not granted, itself, one above it, past
    MAX_DEPTH, an empty task): the tool's own failure, an `is_error` result naming why."""


def reach(name: str, delegates_of: Callable[[str], Sequence[str]]) -> list[str]:
    """The agents `name` may reach in at most MAX_DEPTH delegations (never itself), in the
    order first met. `delegates_of(agent)` is that agent's `delegates:`."""
    found: dict[str, None] = {}
    level = [name]
    for _ in range(MAX_DEPTH):
        following = []
        for agent in level:
            for target in delegates_of(agent):
                if target != name and target not in found:
                    found[target] = None
                    following.append(target)
        level = following
    return list(found)


def refusal(chain: Sequence[str], target: str, granted: Sequence[str]) -> str | None:
    """Why the agent at the end of `chain` (the step's agent first) may not delegate to
    `target`, or None if it may."""
    caller = chain[-1]
    if target not in granted:
        listed = ", ".join(granted) or "none"
        return f"{caller} may delegate only to the agents its delegates: names ({listed}), not {target!r}"
    if target == caller:
        return f"{caller} cannot delegate to itself"
    if target in chain:
        return f"{target} is above {caller} in this delegation ({' -> '.join(chain)}): a delegate never calls back up"
    if len(chain) > MAX_DEPTH:
        return (
            f"delegation is at most {MAX_DEPTH} deep ({' -> '.join(chain)} is already {len(chain) - 1}): "
            f"{caller} does the task itself"
        )
    return None


def reach_options(agents: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """The run option DELEGATES for agents whose `delegates:` are given by `agents` (every
    agent the run may reach): each agent that delegates, with what it reaches."""
    return {name: reach(name, lambda a: agents.get(a, ())) for name, own in agents.items() if own}
