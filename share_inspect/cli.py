"""`kubectl inspect gpushare`: the thin shell around the pure report and renderers.

It reads two lists (nodes, pods; paginated by the adapter) and, where the cluster serves DRA
(resource.k8s.io/v1), the gpushare.io ResourceSlices and the ResourceClaims; builds the report, and prints.
`main(argv)` returns the exit code, so tests and the end-to-end tier can call it in-process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import TextIO

from share_core.contract import TERMINAL_PHASES
from share_core.contract import MemoryUnit
from share_core.kube import ApiServerClient
from share_core.kube import Forbidden
from share_core.kube import KubeClient
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_core.kube import Unavailable
from share_inspect.dra import DRA_DRIVER
from share_inspect.dra import DraState
from share_inspect.dra import dra_state
from share_inspect.render import Style
from share_inspect.render import render_details
from share_inspect.render import render_json
from share_inspect.render import render_problems
from share_inspect.render import render_summary
from share_inspect.render import render_yaml
from share_inspect.report import Report
from share_inspect.report import build_report

EXIT_OK = 0
EXIT_ERROR = 1  # any other API or configuration failure
EXIT_USAGE = 2  # argparse
EXIT_UNREACHABLE = 3
EXIT_FORBIDDEN = 4
EXIT_NO_NODES = 5

# Finished pods hold no memory: let the API server drop them; build_report filters again regardless.
LIVE_PODS = ",".join(f"status.phase!={p}" for p in sorted(TERMINAL_PHASES))

BAR_WIDTH = 6

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
PAGE = 500


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kubectl inspect gpushare",
        description="Show every shared GPU, the pods using it, and the memory still free.",
    )
    p.add_argument("nodes", nargs="*", metavar="NODE", help="only these nodes")
    p.add_argument("-d", "--details", action="store_true", help="list the pods on each node and GPU")
    p.add_argument("-o", "--output", choices=("json", "yaml"), help="machine-readable output (schema: README.md)")
    p.add_argument("--kubeconfig", help="path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="the kubeconfig context to use")
    p.add_argument("--no-color", action="store_true", help="no ANSI colour (also when NO_COLOR is set)")
    p.add_argument(
        "--memory-unit",
        choices=("auto", "GiB", "MiB"),
        default="auto",
        help="unit of nvidia.com/gpu-mem in this cluster (auto: GiB unless a GPU is too large to be GiB)",
    )
    return p.parse_args(argv)


def style_for(out: TextIO, no_color: bool, env: Mapping[str, str]) -> Style:
    """Bars on a terminal only; colour on a terminal unless --no-color or NO_COLOR (any value) says no."""
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return Style()
    color = not no_color and not env.get("NO_COLOR") and env.get("TERM") != "dumb"
    return Style(color=color, bar_width=BAR_WIDTH)


def _connect(args: argparse.Namespace) -> KubeClient:
    try:
        return ApiServerClient.from_kubeconfig(args.kubeconfig, args.context, component="kubectl-inspect-gpushare")
    except Exception as exc:  # kubernetes.config.ConfigException, OSError, bad YAML: all mean "no usable config"
        raise CliError(f"error: cannot load Kubernetes configuration: {exc}", EXIT_ERROR) from exc


def _api_error(exc: KubeError, verb: str, where: str) -> CliError:
    if isinstance(exc, Forbidden):
        return CliError(
            f"error: permission denied: {verb} (cluster-wide) is not allowed for your user.\n"
            f"Ask an admin for a ClusterRole with the RBAC verb 'list' on '{verb.split()[-1]}'.\n"
            f"  {exc}",
            EXIT_FORBIDDEN,
        )
    if isinstance(exc, Unavailable):
        return CliError(f"error: cannot reach the Kubernetes API server{where}: {exc}", EXIT_UNREACHABLE)
    return CliError(f"error: {verb} failed: {exc}", EXIT_ERROR)


def fetch(client: KubeClient, node_names: Sequence[str]) -> tuple[list[dict], list[dict]]:
    """The two lists the report needs; one node asked for lets the API server filter pods too."""
    where = f" at {client.host}" if isinstance(getattr(client, "host", None), str) else ""
    try:
        nodes = client.list_nodes().items
    except KubeError as exc:
        raise _api_error(exc, "list nodes", where) from exc
    selector = LIVE_PODS
    if len(node_names) == 1:
        selector += f",spec.nodeName={node_names[0]}"
    try:
        pods = client.list_pods(field_selector=selector).items
        if len(node_names) == 1:  # the pods memory is held for wait unbound (gpushare.io/holds)
            pods += client.list_pods(field_selector=f"{LIVE_PODS},spec.nodeName=").items
    except KubeError as exc:
        raise _api_error(exc, "list pods", where) from exc
    return nodes, pods


def _list_all(client: Any, path: str, query: dict[str, str]) -> list[dict]:
    """Every item of a list, page by page (`limit`/`continue`), through the client's generic request."""
    items: list[dict] = []
    cont: str | None = None
    while True:
        page = client.request("GET", path, query={**query, "limit": PAGE, "continue": cont})
        items.extend(page.get("items") or [])
        cont = (page.get("metadata") or {}).get("continue")
        if not cont:
            return items


def fetch_dra(client: KubeClient, warnings: list[str]) -> DraState | None:
    """The DRA half: gpushare.io slices, then (only if there are any) the claims. None where the cluster
    has no DRA (no resource.k8s.io/v1: Kubernetes < 1.34) or the client speaks no generic requests.
    A user who may not list them still gets the device-plugin view, with a warning saying what is missing."""
    if not callable(getattr(client, "request", None)):
        return None
    where = f" at {client.host}" if isinstance(getattr(client, "host", None), str) else ""
    try:
        slices = _list_all(client, SLICES_PATH, {"fieldSelector": f"spec.driver={DRA_DRIVER}"})
    except NotFound:
        return None
    except Forbidden:
        warnings.append("cannot list resourceslices.resource.k8s.io: GPUs of nodes in DRA mode are not shown")
        return None
    except KubeError as exc:
        raise _api_error(exc, "list resourceslices", where) from exc
    if not slices:
        return None
    try:
        claims = _list_all(client, CLAIMS_PATH, {})
    except Forbidden:
        warnings.append("cannot list resourceclaims.resource.k8s.io: DRA allocations are not shown (GPUs look free)")
        claims = []
    except KubeError as exc:
        raise _api_error(exc, "list resourceclaims", where) from exc
    return dra_state(slices, claims)


def inspect(args: argparse.Namespace, client: KubeClient, warnings: list[str] | None = None) -> Report:
    nodes, pods = fetch(client, args.nodes)
    dra = fetch_dra(client, warnings if warnings is not None else [])
    unit = None if args.memory_unit == "auto" else MemoryUnit.parse(args.memory_unit)
    report = build_report(nodes, pods, node_names=args.nodes, unit=unit, dra=dra, now=time.time())
    if args.nodes:
        missing = sorted(set(args.nodes) - {n.name for n in report.nodes})
        if missing:
            raise CliError(
                f"error: not a GPU-share node (no gpushare.io/gpus annotation, nvidia.com/gpu-mem capacity or "
                f"gpushare.io ResourceSlice), or no such node: {', '.join(missing)}",
                EXIT_NO_NODES,
            )
    elif not report.nodes:
        raise CliError(
            "error: no GPU-share nodes in this cluster: no node has the gpushare.io/gpus annotation or "
            "nvidia.com/gpu-mem capacity, and no gpushare.io ResourceSlice exists.\nLabel GPU nodes gpushare=true "
            "so the gpushare device plugin (or, in DRA mode, the share-dra plugin) runs there.",
            EXIT_NO_NODES,
        )
    return report


def render(report: Report, args: argparse.Namespace, style: Style) -> str:
    if args.output == "json":
        return render_json(report)
    if args.output == "yaml":
        return render_yaml(report)
    return render_details(report, style) if args.details else render_summary(report, style)


def main(
    argv: Sequence[str] | None = None,
    *,
    client: KubeClient | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run the command; returns the exit code. `client` replaces the kubeconfig connection (tests)."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    warnings: list[str] = []
    try:
        report = inspect(args, client if client is not None else _connect(args), warnings)
        text = render(report, args, style_for(out, args.no_color, os.environ if env is None else env))
    except CliError as exc:
        err.write(f"{exc}\n")
        return exc.code
    try:
        out.write(text)
        out.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        return EXIT_OK
    problems = render_problems(report)
    if problems and not args.output:
        err.write(problems)
    for w in warnings:
        err.write(f"warning: {w}\n")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
