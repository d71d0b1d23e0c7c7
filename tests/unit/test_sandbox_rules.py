"""Which steps run in a sandbox worker, unit-tested without any engine: the agent's rule, the
run's record of its sandboxed agents, and the lanes and rescues the planner marks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from laneflow.domain.flow import Entry, Flow, StepSpec
from laneflow.domain.lanes import SANDBOXED, plan_lanes, sandboxed_agents
from laneflow.domain.records import Step
from laneflow.domain.workspace import Agent, AgentSettings


def agent(**settings: Any) -> Agent:
    return Agent(name="a", path="agents/a", settings=AgentSettings(**settings), persona="")


@pytest.mark.parametrize(
    ("settings", "sandboxed"),
    [
        ({}, False),
        ({"tools": ["read_file", "write_file"]}, False),
        ({"sandbox": True}, True),
        ({"tools": ["bash"]}, True),
        ({"tools": ["scripts"]}, True),
        ({"tools": ["read_file", "script_count"]}, True),
    ],
)
def test_an_agent_is_sandboxed_when_it_says_so_or_runs_programs(settings: Any, sandboxed: bool) -> None:
    assert agent(**settings).sandboxed is sandboxed


def test_a_lane_is_sandboxed_when_its_agent_is_and_only_then() -> None:
    flow = Flow(
        name="f", path="flows/f.yaml", entries=[Entry(index=0, kind="steps", steps=[StepSpec(agent="a"), StepSpec(agent="b")])]
    )
    steps = [
        Step(index=0, group=0, entry=0, slot=0, agent="a", model="stub"),
        Step(index=1, group=0, entry=0, slot=1, agent="b", model="stub"),
    ]
    lanes = {lane.agent: lane.sandboxed for lane in plan_lanes(steps, flow, 10, sandboxed={"b"})}
    assert lanes == {"a": False, "b": True}
    assert all(not lane.sandboxed for lane in plan_lanes(steps, flow, 10))


def test_the_runs_record_of_sandboxed_agents_reads_back_and_anything_else_reads_as_none() -> None:
    assert sandboxed_agents({SANDBOXED: ["b", "a"]}) == {"a", "b"}
    assert sandboxed_agents({}) == frozenset()
    assert sandboxed_agents({SANDBOXED: "a"}) == frozenset()  # a hand edit, not a list


def test_a_scratch_copy_of_a_local_workspace_leaves_out_its_secrets_and_history_and_keeps_only_four_folders(
    tmp_path: Path,
) -> None:
    from laneflow.adapters.aws.s3 import checkout

    ws = tmp_path / "ws"
    for sub in ("agents/a/outputs", "knowledge", ".git", "sub"):
        (ws / sub).mkdir(parents=True)
    (ws / ".secrets.env").write_text("TOKEN=abcdefgh12345\n")
    (ws / ".git" / "HEAD").write_text("ref\n")
    (ws / "sub" / ".secrets.env").write_text("only the top folder's is left out\n")
    (ws / "agents" / "a" / "outputs" / "old.md").write_text("old\n")
    copy = checkout(str(ws), scratch=True)
    try:
        assert copy.root != ws and (copy.root / "agents" / "a" / "outputs" / "old.md").is_file()
        assert not (copy.root / ".secrets.env").exists() and not (copy.root / ".git").exists()
        assert (copy.root / "sub" / ".secrets.env").exists()
        (copy.root / "agents" / "a" / "outputs" / "new.md").write_text("new\n")
        (copy.root / "agents" / "a" / "outputs" / "old.md").write_text("changed\n")
        (copy.root / "state").mkdir()
        (copy.root / "state" / "n.json").write_text("1\n")
        (copy.root / "knowledge" / "stray.md").write_text("stray\n")
        changed = copy.changed("agents/a")
        assert changed == ["agents/a/outputs/new.md", "agents/a/outputs/old.md", "state/n.json"]
        copy.keep(changed)
    finally:
        copy.discard()
    assert (ws / "agents" / "a" / "outputs" / "old.md").read_text() == "changed\n"
    assert (ws / "state" / "n.json").read_text() == "1\n" and not (ws / "knowledge" / "stray.md").exists()
    assert not copy.root.exists()
    in_place = checkout(str(ws))  # an unsandboxed attempt still works in the workspace itself
    assert in_place.root == ws and in_place.changed("agents/a") == []


def test_the_worker_reference_comes_from_ecs_task_metadata_in_fargate(monkeypatch: pytest.MonkeyPatch) -> None:
    import http.server
    import json
    import threading

    from laneflow.domain.workers import FargateTask, LocalProcess
    from laneflow.entrypoints.sandbox_worker import worker_of

    arn = "arn:aws:ecs:us-east-1:123456789012:task/laneflow-sandbox/0123456789abcdef"

    class Metadata(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the http.server API
            body = json.dumps({"TaskARN": arn, "Cluster": "laneflow-sandbox"}).encode() if self.path.endswith("/task") else b"{}"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"ECS_CONTAINER_METADATA_URI_V4": f"http://127.0.0.1:{server.server_port}/v4/abc"}
        assert worker_of(env) == FargateTask(task=arn, cluster="laneflow-sandbox")
    finally:
        server.shutdown()
    assert isinstance(worker_of({}), LocalProcess)


def test_a_task_arn_names_its_cluster() -> None:
    from laneflow.adapters.aws.ecs import cluster_of

    assert cluster_of("arn:aws:ecs:us-east-1:1:task/laneflow-sandbox/abc") == "laneflow-sandbox"
    assert cluster_of("arn:aws:ecs:us-east-1:1:task/abc") is None  # the old format: the default cluster
    assert cluster_of("arn:aws:ecs:us-east-1:1:task/x/abc", "given") == "given"


def test_the_relay_socket_fits_a_unix_socket_path_under_a_long_temp_folder_and_only_its_user_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stat
    import tempfile

    from laneflow.adapters.engine.sandbox import Sandboxes

    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    sandboxes = Sandboxes(callbacks=None, environ={})  # type: ignore[arg-type]
    assert sandboxes.path == ""  # a drive with no sandboxed step opens no relay
    try:
        sandboxes.relay.listen()
        assert len(sandboxes.path.encode()) < 108
        assert stat.S_IMODE(Path(sandboxes.path).stat().st_mode) == 0o600
        assert stat.S_IMODE(Path(sandboxes.path).parent.stat().st_mode) == 0o700
    finally:
        sandboxes.close()
    assert not Path(sandboxes.path).exists()
