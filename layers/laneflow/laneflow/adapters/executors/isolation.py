"""Where a step's programs run (bash, script tools): the strongest isolation the machine offers,
behind a fence that holds when laneflow itself runs as root.

- `bubblewrap` (Debian's `bwrap`): new namespaces with `--unshare-all` (so no network), its
  own user namespace in which the program is nobody (65534) with every capability dropped
  (`--cap-drop ALL`) and no user namespace of its own to make (`--disable-userns`), so it can
  mount, remount or unmount nothing; a new session (`--new-session`: it cannot push input
  into laneflow's terminal) and `--die-with-parent`. The system's folders are read-only (the
  host's password hashes, sudo rules and SSH host keys masked), `/tmp` is private, and the
  step's scratch copy of the workspace is the only writable place (its agents' definitions
  read-only within it). Its arguments: bubblewrap.py. A step whose agent lists `network:`
  destinations reaches them, and only them, through laneflow's egress proxy (egress_proxy.py).
- `subprocess`: a plain child process. Neither the network nor the file system is fenced;
  the trace says so, and `network_enforce: true` refuses such a step.

Who a program is: sandbox_user.py; what its `size:` allows it: limits.py, and its scratch's
size: scratch.py; running it: programs.py. The names the executors and the tests use from
those (the limits, the sizes, the sandbox's uid, the private scratch) are importable from
here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from laneflow.adapters.executors.bubblewrap import bwrap_works
from laneflow.adapters.executors.limits import GIB, MIB, SIZES, Limits, amount, limits_for
from laneflow.adapters.executors.sandbox_user import NOBODY, sandbox_uid
from laneflow.adapters.executors.scratch import ScratchFence, private_scratch

__all__ = [
    "BUBBLEWRAP",
    "GIB",
    "MIB",
    "NOBODY",
    "SIZES",
    "SUBPROCESS",
    "Isolation",
    "Limits",
    "ScratchFence",
    "amount",
    "bubblewrap_available",
    "choose",
    "detect",
    "limits_for",
    "private_scratch",
    "sandbox_uid",
]


@dataclass(frozen=True)
class Isolation:
    """One level of isolation: its name and whether it fences the network and files."""

    name: str  # "bubblewrap" | "subprocess"
    network_enforced: bool
    files_enforced: bool

    def describe(self, limits: Limits | None = None, scratch: ScratchFence | None = None, network: str = "") -> str:
        """The trace's line: what the step's programs got (who they run as, and the limits
        that bind them, when given; `network`: its `network:` list, when it has one)."""
        if self.network_enforced:
            line = f"isolation: {self.name}, " + (
                f"network only to {network} through laneflow's egress proxy" if network else "no network"
            )
        else:
            through = f" (its egress proxy to {network} is there for programs that use it)" if network else ""
            line = f"isolation: {self.name}, network not enforced{through}, file system not enforced"
        if limits is None:
            return line
        uid = sandbox_uid()
        if self.name == "bubblewrap":
            host = f"uid {uid}" if uid is not None else ("root" if os.geteuid() == 0 else f"laneflow's own uid {os.geteuid()}")
            line += f"; as nobody in its own user namespace ({host} on the host), no capabilities, no mounts"
        else:
            line += (
                f"; as uid {uid}"
                if uid is not None
                else ("; as root" if os.geteuid() == 0 else f"; as laneflow's own uid {os.geteuid()}")
            )
        line += f"; limits: {limits.describe()}"
        if uid is None and os.geteuid() != 0:
            line = line.replace(f"{limits.processes:,} processes", f"{limits.processes:,} processes beside laneflow's own")
        elif uid is None:
            line = line.replace(f"{limits.processes:,} processes, ", "")  # root's processes are not counted
        if scratch is not None:
            line += f", {scratch.describe()}"
        return line


BUBBLEWRAP = Isolation("bubblewrap", network_enforced=True, files_enforced=True)

SUBPROCESS = Isolation("subprocess", network_enforced=False, files_enforced=False)


def detect() -> Isolation:
    """The strongest isolation this machine offers (looked for once per process)."""
    return BUBBLEWRAP if bwrap_works() else SUBPROCESS


def choose(level: str) -> Isolation | None:
    """The isolation a setting names (`LANEFLOW_ISOLATION`): None for `auto` (found when a
    step first runs a program), SUBPROCESS for `subprocess`."""
    return SUBPROCESS if level == "subprocess" else None


def bubblewrap_available() -> bool:
    return bwrap_works()
