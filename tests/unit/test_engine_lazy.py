"""moto's Batch integration stands in until a definition names Batch (adapters/engine/moto_lazy.py):
the factory still imports it by the name the stand-in has, builds it only when a definition
names Batch, and the stand-in then gives moto's own; an engine that drives laneflow's own
definition never imports moto's Batch or EC2 models. If moto moves the import, these fail
instead of the engine silently paying EC2's import again or losing Batch."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

from laneflow.adapters.engine import moto_lazy


def _source(module: str) -> ast.Module:
    """moto's source of one of its integrations' modules, from its file (whether the module
    is imported, or stood in for, or neither)."""
    package = importlib.util.find_spec(moto_lazy.SERVICES)
    assert package is not None and package.submodule_search_locations, moto_lazy.SERVICES
    path = Path(list(package.submodule_search_locations)[0]) / f"{module.rsplit('.', 1)[1]}.py"
    return ast.parse(path.read_text(encoding="utf-8"))


def test_the_factory_imports_the_batch_integration_by_the_name_the_stand_in_has_and_builds_it_only_for_batch() -> None:
    tree = _source(moto_lazy.FACTORY)
    imports = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == moto_lazy.BATCH]
    assert [alias.name for node in imports for alias in node.names] == ["StateTaskServiceBatch"]
    # the one use of it: a construction, with no argument, in the factory's function for a service name
    factory = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "state_task_service_for")
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "StateTaskServiceBatch"]
    calls = [n for n in ast.walk(factory) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "StateTaskServiceBatch"]
    assert len(uses) == 1 and len(calls) == 1 and not calls[0].args and not calls[0].keywords
    # and the integration itself still imports moto's Batch model (what the stand-in keeps out)
    batch = _source(moto_lazy.BATCH)
    assert any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("moto.batch") for n in batch.body)


# Run in a fresh interpreter: this one may have imported moto's interpreter (and so Batch) already.
DRIVE = """
import json, sys
from laneflow.adapters.store import open_store
from laneflow.settings import Settings
from laneflow.usecases.start_run import create_run
from laneflow.wiring import for_store, local_engine

store_url, ws, captures = sys.argv[1:]
svc = for_store(open_store(store_url), Settings(capture_dir=captures))
run = create_run(svc, ws, "one", {})
result = local_engine(svc).drive(run.tenant, run.id, tick_s=0.02)
stand_in = type(sys.modules.get("moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_batch"))
print(json.dumps({
    "status": str(result.run.status),
    "moto": sorted({m.split(".")[1] for m in sys.modules if m.startswith("moto.")}),
    "stand_in": stand_in.__module__ + "." + stand_in.__qualname__,
}))
"""


def test_a_drive_of_laneflow_s_definition_imports_neither_moto_s_batch_nor_its_ec2_model(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "agents" / "writer").mkdir(parents=True)
    (ws / "flows").mkdir()
    (ws / "AGENTS.md").write_text("---\nmodel: stub\n---\nWrite plainly.\n")
    (ws / "agents" / "writer" / "agent.md").write_text("---\ndescription: The writer.\n---\nYou write.\n")
    (ws / "flows" / "one.yaml").write_text("steps:\n  - agent: writer\n    instruction: Write one line.\n")
    done = subprocess.run(
        [sys.executable, "-c", DRIVE, f"sqlite:///{tmp_path / 'lf.db'}", str(ws), str(tmp_path / "captures")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["status"] == "completed"
    assert "stepfunctions" in seen["moto"]  # the interpreter ran
    assert not {"batch", "ec2", "ecs", "iam"} & set(seen["moto"]), seen["moto"]
    assert seen["stand_in"] == "laneflow.adapters.engine.moto_lazy._StandIn"


BATCH_DEFINITION = """
import json, sys
from laneflow.adapters.engine import moto_lazy
from laneflow.adapters.engine.hooks import install_interpreter_hook

install_interpreter_hook()
assert isinstance(sys.modules[moto_lazy.BATCH], moto_lazy._StandIn)
from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

definition = json.dumps({"StartAt": "B", "States": {"B": {
    "Type": "Task", "Resource": "arn:aws:states:::batch:submitJob.sync",
    "Parameters": {"JobName": "j", "JobQueue": "q", "JobDefinition": "d"}, "End": True}}})
program, _ = AmazonStateLanguageParser.parse(definition)
service = program.states.states["B"]
real = sys.modules[moto_lazy.BATCH]
print(json.dumps({
    "real": not isinstance(real, moto_lazy._StandIn),
    "is_moto_s": type(service).__qualname__ == "StateTaskServiceBatch" and type(service).__module__ == moto_lazy.BATCH,
    "same_class": isinstance(service, real.StateTaskServiceBatch),
    "installed_again": moto_lazy.install(),
}))
"""


def test_a_definition_that_names_batch_gets_moto_s_own_integration_through_the_stand_in() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BATCH_DEFINITION], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "real": True,
        "is_moto_s": True,
        "same_class": True,
        "installed_again": False,  # moto's own module is in place now: nothing is changed
    }


def test_the_stand_in_is_not_put_in_once_moto_s_factory_is_imported() -> None:
    importlib.import_module(moto_lazy.FACTORY)  # this process's interpreter, as a test that used it left it
    before = sys.modules.get(moto_lazy.BATCH)
    assert moto_lazy.install() is isinstance(before, moto_lazy._StandIn)
    assert sys.modules.get(moto_lazy.BATCH) is before
