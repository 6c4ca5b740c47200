"""MPS on a real GPU, with the daemon run as the chart's mps-control-daemon container runs it
(`nvidia-cuda-mps-control -f`): the plugin's check finds it (and finds it gone), the pinned limit our Allocate
sets is enforced by the driver, and NVML still names each client process, so the monitor works under MPS."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from share_node.backend import Gpu
from share_node.backend.nvml import NvmlBackend
from share_plugin.mps import control_problem
from tests.gpu.conftest import MIB
from tests.gpu.conftest import SAMPLES
from tests.gpu.conftest import MpsDaemon
from tests.gpu.conftest import holding
from tests.gpu.conftest import run_python
from tests.gpu.conftest import share_env


def test_the_plugin_finds_the_daemon_and_notices_it_gone(mps_daemon: MpsDaemon) -> None:
    control = Path(mps_daemon.pipe_dir) / "control"
    print(f"\n{control}: socket {control.is_socket()}, named pipe {control.is_fifo()}")
    assert control_problem(mps_daemon.pipe_dir) is None
    mps_daemon.quit()
    # in the foreground (-f, as the chart runs it) the daemon logs to its stdout: the container's log
    assert f"Starting control daemon using socket {control}" in mps_daemon.stdout()
    print("log directory:", mps_daemon.log_files())
    assert control.exists()  # the daemon leaves its endpoint behind ...
    problem = control_problem(mps_daemon.pipe_dir)
    assert problem is not None and "no daemon listens" in problem  # ... and the check is not fooled by it


def test_the_plugin_reaches_the_daemon_through_its_read_only_mount(mps_daemon: MpsDaemon, tmp_path: Path) -> None:
    """The chart mounts the MPS directory read-only into the plugin's container: connecting still works."""
    target = tmp_path / "ro"
    target.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", mps_daemon.pipe_dir, str(target)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)
        assert not _writable(target)
        assert control_problem(target) is None
    finally:
        subprocess.run(["umount", str(target)], check=True)


def _writable(d: Path) -> bool:
    try:
        (d / "probe").write_text("")
    except OSError:
        return False
    (d / "probe").unlink()
    return True


def test_the_pinned_limit_refuses_memory_past_the_share(mps_daemon: MpsDaemon, gpu: Gpu) -> None:
    """pytorch_overlimit.py ignores its limit on purpose: without MPS it takes 1 GiB more than its share;
    with the env our Allocate gives under MPS, the driver refuses it before the share is reached."""
    overlimit = [str(SAMPLES / "pytorch_overlimit.py")]
    knobs = {"OVERSHOOT_MIB": "1024", "HOLD_SECONDS": "0"}
    plain = run_python(overlimit, {**share_env(gpu, 2048), **knobs})
    assert plain.returncode == 0 and "over the limit by 1024 MiB" in plain.stdout, plain.stderr[-2000:]

    env = {**share_env(gpu, 2048, mps_pipe_dir=mps_daemon.pipe_dir), **mps_daemon.env()}
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    result = run_python(overlimit, {**env, **knobs})
    print(result.stdout[-1500:], result.stderr[-1500:])
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    refused_at = int(re.search(r"allocation refused at (\d+) MiB \(limit 2048 MiB\)", result.stdout).group(1))
    # the limit covers the whole client, its CUDA context (about 520 MiB) included: the tensors stop short of it
    assert 2048 - 1024 <= refused_at < 2048


def test_within_its_share_a_client_runs_and_nvml_names_it(mps_daemon: MpsDaemon, nvml: NvmlBackend, gpu: Gpu) -> None:
    env = {**share_env(gpu, 4096, mps_pipe_dir=mps_daemon.pipe_dir), **mps_daemon.env()}
    with holding(1024, env) as a, holding(2048, env) as b:
        reading = next(r for r in nvml.readings() if r.uuid == gpu.uuid)
        by_pid = {p.pid: p.used_bytes for p in reading.processes}
        print("\nunder MPS, NVML lists (MiB):", {pid: n // MIB for pid, n in by_pid.items()})
        assert by_pid[a.pid] >= 1024 * MIB and by_pid[b.pid] >= 2048 * MIB
        servers = set(by_pid) - {a.pid, b.pid}
        assert servers, "the MPS server process is listed too"
        assert all(Path(f"/proc/{pid}/comm").read_text().strip().startswith("nvidia-cuda-mps") for pid in servers)
