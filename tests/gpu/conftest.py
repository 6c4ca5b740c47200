"""The GPU tier: our code against a real NVIDIA GPU, its driver (NVML), CUDA processes and the MPS daemon.

Runs as root on a GPU machine (`make gpu-test`). What a container runtime would do is done by hand, and
said where: a process is moved into a cgroup shaped as kubelet's systemd driver and containerd name it,
and CUDA_VISIBLE_DEVICES=<uuid> stands for the NVIDIA runtime's NVIDIA_VISIBLE_DEVICES. CUDA work runs in
child processes of `GPUSHARE_GPU_PYTHON` (default: this interpreter), which must have PyTorch.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import pytest

from share_core.assignment import Assignment
from share_core.contract import RESOURCE_MEM
from share_core.contract import SCHEDULER_NAME
from share_core.contract import MemoryUnit
from share_node.backend import BackendError
from share_node.backend import Gpu
from share_node.backend.nvml import NvmlBackend
from share_node.env import gpu_env
from share_plugin.mps import control_problem

PYTHON = os.environ.get("GPUSHARE_GPU_PYTHON", sys.executable)
SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "programs"
CGROUP_ROOT = Path("/sys/fs/cgroup")
NODE = "gpu-node"
MIB = 1024**2
GIB = 1024**3

# Holds `argv[1]` MiB of GPU memory through PyTorch's allocator, says so, and keeps it until stdin closes.
HOLD = """
import os, sys, torch
x = torch.empty(int(sys.argv[1]) * 1024 * 1024, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("READY", os.getpid(), flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="session")
def nvml() -> Iterator[NvmlBackend]:
    try:
        backend = NvmlBackend()
    except BackendError as exc:
        pytest.fail(f"the GPU tier needs an NVIDIA GPU and its driver: {exc}")
    if not backend.gpus():
        pytest.fail("NVML initialised but lists no GPU")
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def gpu(nvml: NvmlBackend) -> Gpu:
    """The first whole GPU (not a MIG instance): the tests share it, one at a time."""
    whole = [g for g in nvml.gpus() if not g.parent_uuid]
    if not whole:
        pytest.fail("every GPU is in MIG mode: the GPU tier needs one whole GPU")
    return whole[0]


def share_env(gpu: Gpu, limit_mib: int, *, mps_pipe_dir: str | None = None) -> dict[str, str]:
    """What our Allocate gives a container with `limit_mib` of `gpu` (gpu_env, the plugin's own), plus what the
    NVIDIA runtime would do with its NVIDIA_VISIBLE_DEVICES: show the process that GPU alone."""
    env = gpu_env(
        [gpu],
        limit_mib=limit_mib,
        container_units=limit_mib // 1024,
        pod_units=limit_mib // 1024,
        unit=MemoryUnit.GiB,
        mps=mps_pipe_dir is not None,
        mps_pipe_dir=mps_pipe_dir or "",
    )
    return {**env, "CUDA_VISIBLE_DEVICES": gpu.uuid}


def child_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """`env` over a copy of ours without MPS variables: a child is an MPS client only when a test says so."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}, **(env or {})}


def run_python(
    args: list[str], env: Mapping[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """A CUDA program, to its end."""
    return subprocess.run(
        [PYTHON, *args], env=child_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )


@dataclass
class CudaProcess:
    proc: subprocess.Popen
    output: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_exit(self, timeout: float = 15) -> int:
        return self.proc.wait(timeout)


@contextmanager
def holding(
    mib: int, env: Mapping[str, str] | None = None, before_cuda: Callable[[int], None] | None = None
) -> Iterator[CudaProcess]:
    """A process holding `mib` MiB on the GPU until the block ends; `before_cuda(pid)` runs before it
    touches CUDA (it is still importing), e.g. to move it into a pod's cgroup."""
    with running(["-c", HOLD, str(mib)], "READY", env, before_cuda) as proc:
        yield proc


@contextmanager
def running(
    args: list[str],
    ready: str,
    env: Mapping[str, str] | None = None,
    before_cuda: Callable[[int], None] | None = None,
) -> Iterator[CudaProcess]:
    """A CUDA program, from the line of output that starts with `ready` to the end of the block (then killed)."""
    proc = subprocess.Popen(
        [PYTHON, *args],
        env=child_env(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    held = CudaProcess(proc)
    try:
        if before_cuda is not None:
            before_cuda(proc.pid)
        held.output = _wait_ready(proc, ready, 120)
        yield held
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _wait_ready(proc: subprocess.Popen, ready: str, timeout: float) -> str:
    """The program's output up to and including its `ready` line."""
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        readable, _, _ = select.select([proc.stdout], [], [], 1.0)
        if readable:
            line = proc.stdout.readline()
            seen.append(line)
            if line.startswith(ready):
                return "".join(seen)
            if not line and proc.poll() is not None:
                break
    err = proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
    raise AssertionError(f"no {ready!r} line in {timeout:.0f}s: {''.join(seen)[-1000:]} {err[-2000:]}")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 20, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- pods' cgroups, as kubelet (systemd driver) and containerd name them --------------------------------------


@dataclass
class PodCgroups:
    """Cgroups under /sys/fs/cgroup/kubepods.slice, the cgroup v2 layout of kubelet's systemd driver with
    containerd (`…/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`), made and removed here."""

    made: list[Path] = field(default_factory=list)

    def container(self, pod_uid: str, container_id: str) -> Path:
        qos = CGROUP_ROOT / "kubepods.slice" / "kubepods-burstable.slice"
        pod = qos / f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice"
        leaf = pod / f"cri-containerd-{container_id}.scope"
        for d in (qos.parent, qos, pod, leaf):
            if not d.exists():
                d.mkdir()
                self.made.append(d)
        return leaf

    @staticmethod
    def move(pid: int, cgroup: Path) -> None:
        (cgroup / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for d in reversed(self.made):
            procs = (d / "cgroup.procs").read_text().split()
            for pid in procs:  # a process the test left behind: back to the root, then the cgroup can go
                (CGROUP_ROOT / "cgroup.procs").write_text(pid)
            d.rmdir()
        self.made.clear()


@pytest.fixture
def pod_cgroups() -> Iterator[PodCgroups]:
    if os.geteuid() != 0 or not (CGROUP_ROOT / "cgroup.controllers").exists():
        pytest.fail("the GPU tier runs as root on a cgroup v2 host (it makes pods' cgroups under /sys/fs/cgroup)")
    cgroups = PodCgroups()
    try:
        yield cgroups
    finally:
        cgroups.remove()


def running_pod(name: str, containers: list[tuple[str, int, str]], gpu: Gpu) -> dict[str, Any]:
    """A Running pod on NODE assigned `gpu`; containers as (name, gpu-mem GiB, containerd ID)."""
    total = sum(gib for _, gib, _ in containers)
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "uid": str(uuid.uuid4()),
            "annotations": Assignment((gpu.index,), (gpu.uuid,), total, 1, assigned=True).to_annotations(),
        },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "nodeName": NODE,
            "containers": [
                {"name": n, "image": "x", "resources": {"limits": {RESOURCE_MEM: str(gib)}}} for n, gib, _ in containers
            ],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": n, "containerID": f"containerd://{cid}"} for n, _, cid in containers],
        },
    }


def container_id() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


# -- the MPS control daemon, as the chart's mps-control-daemon container runs it ------------------------------


def mps_env(root: Path) -> dict[str, str]:
    """The chart's mps-control-daemon env, under `root` instead of mpsRoot; its clients need the same."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}


@dataclass
class MpsDaemon:
    root: Path
    proc: subprocess.Popen

    @property
    def pipe_dir(self) -> str:
        return str(self.root / "pipe")

    def env(self) -> dict[str, str]:
        return mps_env(self.root)

    def quit(self) -> None:
        """`quit` through the control command, as an operator would; the daemon ends its servers and exits."""
        subprocess.run(
            ["nvidia-cuda-mps-control"], input="quit\n", env={**os.environ, **self.env()}, text=True, timeout=30
        )
        self.proc.wait(30)

    def stdout(self) -> str:
        return (self.root / "stdout").read_text(errors="replace")

    def log_files(self) -> list[str]:
        return sorted(p.name for p in (self.root / "log").iterdir())


@pytest.fixture
def mps_daemon() -> Iterator[MpsDaemon]:
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        pytest.fail("nvidia-cuda-mps-control is not on PATH: the driver's MPS binaries are needed")
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))  # short: unix socket paths are limited
    (root / "pipe").mkdir()
    (root / "log").mkdir()
    env = mps_env(root)
    with (root / "stdout").open("wb") as out:  # what `kubectl logs -c mps-control-daemon` would show
        proc = subprocess.Popen([binary, "-f"], env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
    daemon = MpsDaemon(root, proc)
    try:
        wait_for("the MPS control daemon", lambda: control_problem(daemon.pipe_dir) is None, 15)
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            daemon.quit()
        shutil.rmtree(root, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Tests that could not run their check (XFAIL, e.g. the hard limit on a driver before R615) are named with
    their reason at the end of the run: a result to read, not a pass."""
    for report in terminalreporter.stats.get("xfailed", []):
        reason = getattr(report, "wasxfail", "") or ""
        terminalreporter.write_line(f"NOT CHECKED {report.nodeid}: {reason}", yellow=True, bold=True)
