"""The Lambda path needs none of what the layer leaves out (moto, jsonpath-ng, rich, the dev
tools): every handler of template.yaml is imported, and the API and reconcile handlers are
called on a DynamoDB store, in a process where importing any of those raises. A local import
inside a function would pass an import-only check and fail in Lambda on its first call, so
the handlers are called too, against moto's server run by this test's process on loopback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import ROOT

from laneflow.adapters.store.provision import init_store

# What pyproject's [tool.laneflow.layer] leave-out keeps out of the layer (boto3 aside: the
# runtime has it), and the dev tools, which the layer never ships.
LEFT_OUT = ("moto", "jsonpath_ng", "rich", "laneflow_dev")

CHILD = textwrap.dedent(
    """
    import importlib.abc, importlib.util, json, sys

    LEFT_OUT = tuple(sys.argv[1].split(","))

    class LeftOut(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in LEFT_OUT:
                raise ModuleNotFoundError(f"No module named {name!r} (left out of the Lambda layer)")
            return None

    sys.meta_path.insert(0, LeftOut())

    class Context:
        function_name = "laneflow-test"
        memory_limit_in_mb = 512
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:laneflow-test"
        aws_request_id = "req-1"
        def get_remaining_time_in_millis(self):
            return 60_000

    handlers = {}
    for path in sys.argv[3:]:
        spec = importlib.util.spec_from_file_location("app_" + path.split("/")[-2], path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        handlers[path.split("/")[-2]] = module.handler
    with open(sys.argv[2] + "/api_list_runs.json") as f:
        listed = handlers["api"](json.load(f), Context())
    with open(sys.argv[2] + "/reconcile.json") as f:
        reconciled = handlers["reconcile"](json.load(f), Context())
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in LEFT_OUT)
    print(json.dumps({"handlers": sorted(handlers), "api": listed["statusCode"], "runs": json.loads(listed["body"]),
                      "reconcile": reconciled, "loaded": loaded}))
    """
)


def _handler_paths() -> list[str]:
    uris = re.findall(r"CodeUri:\s*(functions/[a-z_]+)/", (ROOT / "template.yaml").read_text())
    return sorted({str(ROOT / uri / "app.py") for uri in uris})


@pytest.mark.slow
def test_every_handler_imports_and_answers_without_what_the_layer_leaves_out(tmp_path: Path) -> None:
    from moto.server import ThreadedMotoServer

    paths = _handler_paths()
    assert len(paths) >= 10 and all(os.path.isfile(p) for p in paths)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        aws = {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        store = "dynamodb://layer-runs?bucket=layer-blobs&region=us-east-1"
        saved = {k: os.environ.get(k) for k in aws}
        os.environ.update(aws)
        try:
            init_store(store)
        finally:
            for key, value in saved.items():
                os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            **aws,
            "LANEFLOW_STORE": store,
            "LANEFLOW_WORKSPACES": "s3://layer-blobs/workspaces",
            "POWERTOOLS_SERVICE_NAME": "laneflow",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "layers" / "laneflow")]),
        }
        done = subprocess.run(
            [sys.executable, "-c", CHILD, ",".join(LEFT_OUT), str(ROOT / "events"), *paths],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["handlers"] == sorted(p.split("/")[-2] for p in paths)
    assert answer["api"] == 200 and answer["runs"]["runs"] == []
    assert isinstance(answer["reconcile"], dict)
    assert answer["loaded"] == []
