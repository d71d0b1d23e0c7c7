"""The `laneflow` commands that make a workspace to start from: `init` (the starter: an agent
per part, a fan-out, an approval and a question to a person) and `examples` (list the bundled
example workspaces, copy one out).

The examples are the project's `examples/` (`laneflow.paths.project_root`: a checkout's, or
the copy an installed wheel carries), so `pip install` finds them too. A copy never lands on
anything: the destination must be new or an empty folder, and a copy that fails part-way is
taken back.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from laneflow.domain.errors import InvalidInput
from laneflow.entrypoints.cli_base import EXIT_OK, hint, plural

STARTER = "starter"  # the example `laneflow init` copies

LEFT_OUT = {"__pycache__", ".laneflow"}  # caches, and a store a run in the example may have left


@dataclass(frozen=True)
class Example:
    name: str
    path: Path
    flows: list[str]
    description: str

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "flows": self.flows, "path": str(self.path)}


def examples_folder() -> Path:
    from laneflow.paths import project_root

    return project_root() / "examples"


def bundled() -> list[Example]:
    """The example workspaces, by name: each a folder of `examples/` with flows."""
    found = []
    for path in sorted(examples_folder().iterdir()):
        flows = sorted(p.stem for p in (path / "flows").glob("*.yaml")) if path.is_dir() else []
        if flows:
            found.append(Example(path.name, path, flows, _description(path, flows)))
    return found


def _description(path: Path, flows: list[str]) -> str:
    """The first paragraph of its README.md under the title; else its flows' descriptions."""
    readme = path / "README.md"
    if readme.is_file():
        for paragraph in re.split(r"\n\s*\n", readme.read_text(encoding="utf-8")):
            text = " ".join(line.strip() for line in paragraph.splitlines())
            if text and not text.startswith(("#", "```")):
                return text
    said = []
    for flow in flows:
        try:
            data = yaml.safe_load((path / "flows" / f"{flow}.yaml").read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and isinstance(data.get("description"), str):
            said.append(data["description"].strip())
    return " ".join(said)


def _named(name: str) -> Example:
    examples = bundled()
    for example in examples:
        if example.name == name:
            return example
    names = [e.name for e in examples]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    suggestion = f"; did you mean {close[0]!r}?" if close else f" (there are {', '.join(names)})"
    raise InvalidInput(f"no example {name!r}{suggestion}")


def copy_workspace(source: Path, given: str) -> Path:
    """`source` copied to the folder `given` names (made if new; refused unless empty),
    whole or not at all."""
    target = Path(given).expanduser()
    if target.exists() and not target.is_dir():
        raise InvalidInput(f"{given}: is a file, not a folder: give a new or an empty folder")
    existed = target.is_dir()
    if existed and any(target.iterdir()):
        entries = sorted(p.name for p in target.iterdir())
        shown = ", ".join(entries[:5]) + (", …" if len(entries) > 5 else "")
        raise InvalidInput(f"{given}: the folder is not empty ({shown}): give a new or an empty folder")
    try:
        if existed:  # its contents go in; the folder itself stays (it may be the current one)
            shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True, ignore=_left_out)
        else:
            shutil.copytree(source, target, symlinks=True, ignore=_left_out)
    except OSError as exc:
        _take_back(target, existed)
        raise InvalidInput(f"{given}: cannot copy the workspace there ({exc.strerror or exc})") from None
    except BaseException:
        _take_back(target, existed)
        raise
    return target


def _left_out(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n in LEFT_OUT or n.endswith(".pyc")}


def _take_back(target: Path, existed: bool) -> None:
    if not existed:
        shutil.rmtree(target, ignore_errors=True)
        return
    for entry in target.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def next_steps(args: argparse.Namespace, example: Example, given: str) -> list[str]:
    """The commands that check the copy and run each of its flows, as printed (from this
    folder, with this program): a flow whose `input:` schema gives `examples` runs with the
    first of them."""
    lines = [hint(args, "check", given)]
    for flow in example.flows:
        sample = _sample_input(example.path / "flows" / f"{flow}.yaml")
        lines.append(hint(args, "run", given, flow, *(["--input", json.dumps(sample)] if sample is not None else [])))
    return lines


def _sample_input(flow: Path) -> object:
    try:
        data = yaml.safe_load(flow.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    schema = data.get("input") if isinstance(data, dict) else None
    samples = schema.get("examples") if isinstance(schema, dict) else None
    return samples[0] if isinstance(samples, list) and samples else None


def cmd_init(args: argparse.Namespace) -> int:
    example = _named(STARTER)
    target = copy_workspace(example.path, args.folder)
    agents = sorted(p.name for p in (target / "agents").iterdir() if p.is_dir())
    print(
        f"made a workspace in {args.folder}: {plural(len(agents), 'agent')} ({', '.join(agents)}) and"
        f" {plural(len(example.flows), 'flow')} ({', '.join(example.flows)}), on the stub model (no API key needed)"
    )
    print("check it and run its flows, from here:")
    print("\n".join(f"  {line}" for line in next_steps(args, example, args.folder)))
    print("`approval` parks until you approve it (it prints the command); `ask` waits for your answer")
    print(f"(it prints the command, for another terminal). More in {target / 'README.md'}")
    return EXIT_OK


def cmd_examples(args: argparse.Namespace) -> int:
    """`laneflow examples`: the bundled examples; `laneflow examples copy NAME [FOLDER]`."""
    if getattr(args, "examples_command", None) == "copy":
        return _copy(args)
    examples = bundled()
    if args.json:
        print(json.dumps([e.as_dict() for e in examples], ensure_ascii=False))
        return EXIT_OK
    from laneflow.entrypoints.cli_tables import Column, fit, output_width, styled

    columns = [
        Column("NAME", lambda e: e.name, whole=True),
        Column("FLOWS", lambda e: ", ".join(e.flows), min_width=8),
        Column("DESCRIPTION", lambda e: e.description, min_width=20),
    ]
    print("\n".join(fit(columns, examples, output_width(), bold=styled())))
    print(f"copy one out (to a new folder named after it, or one you name after it): {hint(args, 'examples', 'copy', STARTER)}")
    return EXIT_OK


def _copy(args: argparse.Namespace) -> int:
    example = _named(args.name)
    given = args.folder or example.name
    copy_workspace(example.path, given)
    print(f"copied the {example.name} example to {given}; check it and run its flows, from here:")
    print("\n".join(f"  {line}" for line in next_steps(args, example, given)))
    return EXIT_OK
