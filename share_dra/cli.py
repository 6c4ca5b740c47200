"""`share-dra`: gpushare's DRA kubelet plugin (driver `gpushare.io`, resource.k8s.io/v1, Kubernetes 1.34+).

Publishes the node's ResourceSlice (one device per healthy GPU, `memory` shared between claims), serves
kubelet's NodePrepareResources / NodeUnprepareResources with a CDI spec per claim, and registers with kubelet.
"""

from __future__ import annotations

import argparse
import logging
import threading
from pathlib import Path

from share_core.config import parse_args
from share_core.config import start_logging
from share_core.contract import DEFAULT_CDI_DIR
from share_core.contract import DEFAULT_CDI_SPEC_DIRS
from share_core.contract import DEFAULT_DRA_PLUGIN_DIR
from share_core.contract import DEFAULT_PLUGINS_REGISTRY_DIR
from share_core.contract import DRA_DRIVER_NAME
from share_core.contract import DRA_UNHEALTHY_MODES
from share_core.contract import DRA_UNHEALTHY_WITHDRAW
from share_core.contract import MemoryUnit
from share_node.agent import open_agent
from share_node.agent import stop_on_signals
from share_node.backend.options import add_backend_args
from share_node.backend.options import agent_parser
from share_node.backend.options import env_arg
from share_placement import POLICIES

log = logging.getLogger("share_dra")


def build_parser() -> argparse.ArgumentParser:
    p = agent_parser("share-dra", f"DRA kubelet plugin for driver {DRA_DRIVER_NAME}")
    env_arg(
        p,
        "--plugins-registry-dir",
        "GPUSHARE_PLUGINS_REGISTRY_DIR",
        DEFAULT_PLUGINS_REGISTRY_DIR,
        help="kubelet's plugin watcher dir; the registration socket is created there",
    )
    env_arg(
        p,
        "--plugin-dir",
        "GPUSHARE_DRA_PLUGIN_DIR",
        DEFAULT_DRA_PLUGIN_DIR,
        help="the DRA service socket (dra.sock) and the checkpoint live here",
    )
    env_arg(
        p,
        "--endpoint",
        "GPUSHARE_DRA_ENDPOINT",
        "",
        help="the DRA socket's path as kubelet sees it, if not <plugin-dir>/dra.sock",
    )
    env_arg(p, "--cdi-dir", "GPUSHARE_CDI_DIR", DEFAULT_CDI_DIR, help="where claim CDI specs go")
    env_arg(
        p,
        "--cdi-spec-dirs",
        "GPUSHARE_CDI_SPEC_DIRS",
        ",".join(DEFAULT_CDI_SPEC_DIRS),
        help="comma-separated dirs where NVIDIA's CDI spec (nvidia.com/gpu) may be; its devices are referenced",
    )
    add_backend_args(p)
    env_arg(
        p,
        "--memory-unit",
        "MEMORY_UNIT",
        "GiB",
        choices=["GiB", "MiB"],
        help="the step claims consume memory in (the request policy's default, minimum and step)",
    )
    env_arg(
        p,
        "--unhealthy",
        "GPUSHARE_DRA_UNHEALTHY",
        DRA_UNHEALTHY_WITHDRAW,
        choices=list(DRA_UNHEALTHY_MODES),
        help="an unhealthy GPU: withdraw it from the slice (any Kubernetes), or taint it NoSchedule and keep it "
        "listed (needs DRADeviceTaints: Kubernetes 1.36+)",
    )
    env_arg(p, "--device-id-strategy", "DEVICE_ID_STRATEGY", "uuid", choices=["uuid", "index"])
    p.add_argument("--resync", type=float, default=60.0, help="seconds between checks of the published slice")
    env_arg(
        p,
        "--policy",
        "GPUSHARE_POLICY",
        "",
        choices=["", *sorted(POLICIES)],
        help="list the GPUs in this placement policy's order, kept as claims come and go, so kube-scheduler's "
        "first fit takes the GPU the policy would (watches every ResourceClaim); empty (default): index order",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    start_logging(args.log_level)
    if not args.node_name:
        log.error("--node-name (or env NODE_NAME) is required: the slice is published for that node")
        return 2

    from share_dra.driver import CHECKPOINT_NAME
    from share_dra.driver import Checkpoint
    from share_dra.driver import Driver
    from share_dra.kubeapi import ApiServerDraApi
    from share_dra.publisher import SlicePublisher
    from share_dra.server import PluginServers
    from share_dra.server import Sockets

    unit = MemoryUnit.parse(args.memory_unit)
    if (opened := open_agent(args, "gpushare-dra", log)) is None:
        return 1
    backend, client = opened
    api = ApiServerDraApi(client)
    driver_version = str(getattr(backend, "driver_version", "") or "")
    usage = None
    order = None
    if args.policy:
        from share_dra.order import ClaimUsage
        from share_dra.order import policy_order
        from share_placement import make_policy
        from share_placement.draorder import DeviceOrderer

        usage = ClaimUsage(args.node_name, unit, DeviceOrderer(make_policy(args.policy)), lambda: publisher.kick.set())
        order = policy_order(args.node_name, usage, unit)
    publisher = SlicePublisher(api, args.node_name, backend.gpus, unit, driver_version, args.unhealthy, order)
    from share_dra import hardlimit
    from share_node.hardlimit import HardLimitError

    try:
        support, limiter = hardlimit.setup(args.hard_limit, args, args.node_name, backend)
    except HardLimitError as exc:
        log.error("node %s: %s", args.node_name, exc)
        return 1
    hardlimit.publish(support, args.node_name, client)
    try:
        driver = Driver(
            args.node_name,
            backend.gpus,
            api,
            args.cdi_dir,
            Checkpoint(Path(args.plugin_dir) / CHECKPOINT_NAME),
            unit,
            [d for d in args.cdi_spec_dirs.split(",") if d],
            args.device_id_strategy,
            limiter,
        )
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    servers = PluginServers(
        driver,
        Sockets(args.plugins_registry_dir, args.plugin_dir, args.endpoint),
        on_registered=publisher.kick_after_registration,
    )
    try:
        servers.start()
    except (OSError, RuntimeError) as exc:
        log.error("cannot serve the kubelet sockets (%s, %s): %s", args.plugin_dir, args.plugins_registry_dir, exc)
        return 1

    stop = threading.Event()
    stop_on_signals(log, stop, publisher.kick)

    def on_health(uuid: str, healthy: bool, why: str) -> None:
        log.warning("GPU %s is %s (%s): updating the ResourceSlice", uuid, "healthy" if healthy else "UNHEALTHY", why)
        publisher.kick.set()

    if limiter is not None:
        threading.Thread(
            target=hardlimit.run, args=(limiter, driver.pod_limits(), stop), name="hard-limit", daemon=True
        ).start()
    if usage is not None:
        threading.Thread(target=usage.run, args=(client, stop), name="claim-usage", daemon=True).start()
    if args.health_check:
        threading.Thread(target=backend.watch_health, args=(stop, on_health), name="health", daemon=True).start()
    log.info(
        "node %s: %s backend, %d GPUs (%s), memory in steps of 1 %s",
        args.node_name,
        backend.name,
        len(backend.gpus()),
        ", ".join(f"{g.index}: {g.model} {g.memory_mib} MiB" for g in backend.gpus()),
        unit.value,
    )
    publisher.run(stop, resync=args.resync)
    servers.stop()
    backend.close()
    return 0
