"""Render charts/gpushare with the real helm binary (built by hack/build-k8s.sh) and read the result.

Reusable by any test: `render_chart(values_files, set_values)` returns the rendered objects as dicts.
helm is never optional: when it cannot be found or built, these helpers raise (tests fail, not skip).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import TypedDict
from typing import Unpack

import yaml

from tests.controlplane.binaries import k8s_bin_dir

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART_DIR = REPO_ROOT / "charts" / "gpushare"
ALL_OPTIONS = Path(__file__).resolve().parent / "all-options.yaml"

DEFAULT_RELEASE = "gpushare"
DEFAULT_NAMESPACE = "gpushare-system"
# The Prometheus operator's API: passed to `helm template` to render the optional ServiceMonitor.
MONITORING_API = "monitoring.coreos.com/v1"

Obj = dict[str, Any]


class HelmError(RuntimeError):
    """helm is missing, or a helm command failed; the message carries its output."""


@functools.cache
def helm_binary() -> Path:
    path = k8s_bin_dir() / "helm"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise HelmError(f"helm is missing at {path}: hack/build-k8s.sh should have built it")
    return path


def run_helm(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run helm with a private, empty home (no user repos or plugins leak in); raise on failure."""
    home = REPO_ROOT / ".pytest_cache" / "helm-home"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    env.pop("KUBECONFIG", None)
    result = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if result.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result


def _value_args(
    values_files: Iterable[str | os.PathLike[str]] = (),
    set_values: Mapping[str, Any] | None = None,
) -> list[str]:
    args: list[str] = []
    for f in values_files:
        args += ["--values", str(f)]
    for key, value in (set_values or {}).items():
        # --set-json keeps types exact: True stays a boolean, "2" stays a string.
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def lint(
    values_files: Iterable[str | os.PathLike[str]] = (),
    set_values: Mapping[str, Any] | None = None,
    chart_dir: Path = CHART_DIR,
) -> str:
    """`helm lint --strict`; returns its output, raises HelmError on any error or warning."""
    return run_helm("lint", "--strict", str(chart_dir), *_value_args(values_files, set_values)).stdout


class RenderOptions(TypedDict, total=False):
    """What `render_chart` passes on to `template` (but show_notes: NOTES.txt is no object)."""

    release: str
    namespace: str
    kube_version: str | None
    api_versions: Sequence[str]
    chart_dir: Path


def template(
    values_files: Iterable[str | os.PathLike[str]] = (),
    set_values: Mapping[str, Any] | None = None,
    *,
    release: str = DEFAULT_RELEASE,
    namespace: str = DEFAULT_NAMESPACE,
    kube_version: str | None = None,
    api_versions: Sequence[str] = (),
    chart_dir: Path = CHART_DIR,
    show_notes: bool = False,
) -> str:
    """`helm template` output (multi-document YAML)."""
    args = ["template", release, str(chart_dir), "--namespace", namespace]
    if kube_version:
        args += ["--kube-version", kube_version]
    for api in api_versions:
        args += ["--api-versions", api]
    if show_notes:
        args.append("--show-only=templates/NOTES.txt")
    return run_helm(*args, *_value_args(values_files, set_values)).stdout


def render_chart(
    values_files: Iterable[str | os.PathLike[str]] = (),
    set_values: Mapping[str, Any] | None = None,
    **options: Unpack[RenderOptions],
) -> list[Obj]:
    """The chart's objects as dicts, in helm's order; empty documents dropped. `options` are template's.

    `set_values` maps helm value paths to Python values, e.g. {"scheduler.replicas": 1,
    "devicePlugin.backend": "sim"}. `kube_version` (e.g. "v1.36.3") is what
    .Capabilities.KubeVersion reports, which picks the kube-scheduler image tag by default.
    """
    text = template(values_files, set_values, **options)
    return [d for d in yaml.safe_load_all(text) if d]


# ---------------------------------------------------------------------------- reading the objects


def objects(docs: Iterable[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    """The single object of `kind` (and `name`); raises if there are none or several."""
    found = objects(docs, kind, name)
    if len(found) != 1:
        names = [d["metadata"]["name"] for d in objects(docs, kind)]
        raise LookupError(f"expected one {kind}{' ' + name if name else ''}, found {len(found)} among {names}")
    return found[0]


def component(docs: Iterable[Obj], kind: str, name_of_component: str) -> Obj:
    """The object of `kind` labelled app.kubernetes.io/component=<name_of_component>."""
    found = [
        d
        for d in objects(docs, kind)
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == name_of_component
    ]
    if len(found) != 1:
        raise LookupError(f"expected one {kind} of component {name_of_component}, found {len(found)}")
    return found[0]


def container(workload: Obj, name: str) -> Obj:
    for c in workload["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise LookupError(f"no container {name} in {workload['kind']} {workload['metadata']['name']}")


def scheduler_config(docs: Iterable[Obj]) -> Obj:
    """The KubeSchedulerConfiguration in the scheduler's ConfigMap, parsed."""
    cm = component([d for d in docs if d.get("kind") == "ConfigMap"], "ConfigMap", "scheduler")
    return yaml.safe_load(cm["data"]["scheduler-config.yaml"])


def cluster_role_rules(docs: Iterable[Obj], name_of_component: str) -> list[Obj]:
    """The rules of the chart's own ClusterRole for a component: "device-plugin" or "scheduler"
    (the extender's). Integration tests can grant exactly these to the process they start."""
    docs = list(docs)
    roles = [
        d
        for d in objects(docs, "ClusterRole")
        if (d["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == name_of_component
    ]
    if len(roles) != 1:
        raise LookupError(f"expected one ClusterRole of component {name_of_component}, found {len(roles)}")
    return roles[0]["rules"]


def program_args(docs: Iterable[Obj], workload: Obj, container_name: str, parser: Any) -> Any:
    """A container's settings as its program (the one `parser` parses for) resolves them: the chart's
    configuration ConfigMap, as the container mounts it, read through `--config` (share_core.config), then
    the container's own args.

    The container must run that program, and the ConfigMap must be the one its mount names, at the path its
    `--config` gives: a chart that mounted another (or none) fails here, not on a node."""
    import tempfile

    from share_core.config import parse_args

    c = container(workload, container_name)
    assert c["command"] == [parser.prog], f"{container_name} runs {c['command']}, not {parser.prog}"
    args = list(c.get("args") or [])
    given = [a for a in args if a.startswith("--config=")]
    assert len(given) == 1, f"{container_name}: exactly one --config=, got {args}"
    path = given[0].split("=", 1)[1]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts") or []}
    volume_name = mounts[os.path.dirname(path)]
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    cm_name = volumes[volume_name]["configMap"]["name"]
    data = one(docs, "ConfigMap", cm_name)["data"][os.path.basename(path)]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(data)
    try:
        return parse_args(parser, [f"--config={f.name}" if a == given[0] else a for a in args])
    finally:
        os.unlink(f.name)
