"""A step's layered system prompt.

Layers are computed in a fixed order and assembled stable-first: layers that change between
runs (`dynamic`) go after the cache breakpoint, so the model's prompt cache keeps the agent's
stable half across steps and runs. Each step records every layer's name, size, a sha256
prefix and whether it is dynamic, so a reader can tell which layer changed between two steps.

Paths in layers are relative to the workspace: a prompt never carries a local path (it would
leak the machine's layout and break the cache across machines).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass

from laneflow.domain.records import PromptLayer
from laneflow.domain.workspace import Agent, Doc, Workspace

# The order layers are computed in (a fixed order); `dynamic` marks those that change
# between runs. Layers with nothing to say are left out.
LAYER_ORDER: tuple[tuple[str, bool], ...] = (
    ("persona", False),
    ("locale", False),
    ("where", False),
    ("agents.md", False),
    ("skills", False),
    ("memory", True),
    ("knowledge", False),
    ("scripts", False),
    ("state", True),
    ("apis", False),
    ("clock", True),
    ("script-tools", False),
    ("web", False),
    ("secrets", False),
    ("rules", False),
    ("ask", False),
    ("finding", False),
)

_DYNAMIC = dict(LAYER_ORDER)

SHA_PREFIX = 12



@dataclass(frozen=True)
class Layer:
    name: str
    text: str
    dynamic: bool

    def record(self) -> PromptLayer:
        digest = hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:SHA_PREFIX]
        return PromptLayer(name=self.name, chars=len(self.text), sha256=digest, dynamic=self.dynamic)



@dataclass(frozen=True)
class SystemPrompt:
    layers: tuple[Layer, ...]  # in assembly order: stable first, then dynamic

    @property
    def stable(self) -> str:
        return "\n\n".join(layer.text for layer in self.layers if not layer.dynamic)

    @property
    def dynamic(self) -> str:
        return "\n\n".join(layer.text for layer in self.layers if layer.dynamic)

    def records(self) -> list[PromptLayer]:
        return [layer.record() for layer in self.layers]



def _docs(title: str, docs: list[Doc]) -> str:
    if not docs:
        return ""
    parts = [f"# {title}"]
    for doc in docs:
        parts.append(f"## {doc.path}\n{doc.text.strip()}")
    return "\n\n".join(parts)



def _compute(ws: Workspace, agent: Agent, *, secrets: list[str], now: _dt.datetime) -> dict[str, str]:
    folder = agent.path
    layers: dict[str, str] = {}
    layers["persona"] = agent.persona.strip()
    if ws.settings.locale:
        layers["locale"] = f"Write in this locale unless asked otherwise: {ws.settings.locale}."
    layers["where"] = (
        f"You are the agent `{agent.name}` of the workspace `{ws.name}`. "
        f"Your own folder is `{folder}/`: your skills, memory, knowledge and scripts are there. "
        "The workspace's shared folders are `knowledge/` and `memory/` (shared with every agent), "
        "`state/` (what runs carry between runs) and `storage/` (deliverables for people)."
    )
    shared = "\n\n".join(doc.text.strip() for doc in ws.instructions if doc.text.strip())
    if shared:
        layers["agents.md"] = f"# Shared instructions\n\n{shared}"
    if agent.skills:
        lines = [f"- {s.name}: {s.description} ({s.path})" for s in agent.skills]
        layers["skills"] = "# Skills (read a skill's file before you use it)\n" + "\n".join(lines)
    layers["memory"] = _docs("Memory", agent.memory + ws.memory)
    layers["knowledge"] = _docs("Knowledge", agent.knowledge + ws.knowledge)
    if agent.scripts:
        layers["scripts"] = "# Scripts you can run\n" + "\n".join(f"- {path}" for path in agent.scripts)
    layers["state"] = _docs("State carried between runs", ws.state)
    zone = now.tzname() or "UTC"
    layers["clock"] = f"Today is {now.strftime('%A %Y-%m-%d')} ({zone})."
    if secrets:
        layers["secrets"] = (
            "# Secrets\nThese are set as environment variables for your scripts and API tools: "
            + ", ".join(sorted(secrets))
            + ". Never write their values anywhere."
        )
    layers["rules"] = (
        "# Rules\n"
        f"- Put working text for later steps in `{folder}/outputs/`, deliverables for people in `storage/`.\n"
        "- Open your reply with a one-sentence outcome."
    )
    return layers



def build_system_prompt(
    ws: Workspace, agent: Agent, *, secrets: list[str] | None = None, now: _dt.datetime | None = None
) -> SystemPrompt:
    """The step's system prompt: layers in LAYER_ORDER, stable ones first."""
    now = now or _dt.datetime.now().astimezone()
    texts = _compute(ws, agent, secrets=list(secrets or agent.settings.secrets), now=now)
    ordered = [Layer(name, texts[name], dynamic) for name, dynamic in LAYER_ORDER if texts.get(name)]
    stable = [layer for layer in ordered if not layer.dynamic]
    dynamic = [layer for layer in ordered if layer.dynamic]
    return SystemPrompt(layers=tuple(stable + dynamic))
