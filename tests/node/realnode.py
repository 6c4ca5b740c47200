"""A real Kubernetes node for integration tests: containerd v2 + Debian's runc and the upstream kubelet.

The kubelet registers to a `ControlPlane` as `system:node:<name>` and runs real containers from
images we build ourselves (hack/build-node-images.sh; nothing is ever pulled). Our device plugin
registers with it exactly as in production. containerd is the upstream v2 release
hack/build-containerd.sh builds (Debian's 1.6 knows no CDI): CDI specs in `workdir/cdi` are applied to
containers that kubelet asks for CDI devices (DRA claims, device plugins' `cdi_devices`).

Layout (everything under `workdir`, nothing in the host's /var/lib/kubelet or /run/containerd):

* A "holder" process (`unshare --mount`, then `sleep infinity`) owns a private mount namespace in
  which `/var/lib/kubelet/device-plugins` (compiled into kubelet) is a bind mount of
  `workdir/device-plugins`, `/run/containerd` (where containerd puts shim sockets whatever its
  config says) and `/var/log/containers` (kubelet's legacy log symlinks) are private, and the six
  sysctls kubelet would otherwise rewrite on the host read back the values it wants. containerd and
  kubelet are started in that namespace with `nsenter`, so both see the same mounts (kubelet's
  tmpfs volumes must be visible to containerd). The device plugin runs in the host namespace and
  uses `workdir/device-plugins` and `<root-dir>/pod-resources/kubelet.sock` directly: a unix socket
  is found by its inode, so the bind mount is transparent to it. DRA plugins register in
  `<root-dir>/plugins_registry` and serve under `<root-dir>/plugins` (kubelet derives both from
  --root-dir), so they need no bind mount.
* cgroups under a cgroupRoot of our own (`/gpushare-<name>-<random>`) in every hierarchy.
* Pods on the host network just work; the others get eth0 on a bridge of our own (`gps<random>`,
  CNI bridge + host-local, no address on the host side, no masquerading): pods reach each other,
  nothing on the host is routed to them. containerd refuses a loopback-only network.
* kubelet runs with `--cloud-provider=external`: it then keeps the addresses someone else set on
  its Node. We set `InternalIP 127.0.0.1` (kubelet refuses a loopback --node-ip) and lift the
  `node.cloudprovider.kubernetes.io/uninitialized` taint, as a cloud controller would; the API
  server reaches kubelet on 127.0.0.1:<port> for pods/log.

`stop()` ends everything by PID: kubelet, the containers (their tasks), containerd, shims started
for our containerd socket, any process left in our cgroups or our mount namespace, then the
holder; deletes our bridge, removes our cgroups and the runtime state. It is idempotent and safe after a failed start.

One piece: one node's lifecycle (holder namespace, containerd, kubelet, teardown by PID) in start-up order.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from typing import Self

import yaml

from share_core.contract import NODE_LABEL
from share_core.contract import NODE_LABEL_VALUE
from share_core.kube import ApiServerClient
from share_core.kube import KubeError
from share_core.kube import NotFound
from share_core.kube import load_configuration
from tests.controlplane.cluster import LOOPBACK
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.cluster import ControlPlaneError
from tests.controlplane.cluster import ManagedProcess
from tests.controlplane.cluster import StartStop
from tests.controlplane.cluster import free_ports
from tests.controlplane.cluster import tail

from . import host
from .containerd import ContainerdBuildError
from .containerd import containerd_bin_dir
from .images import NodeImages
from .images import node_images

DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"  # kubelet's, compiled in (v1beta1.DevicePluginPath)
DEVICE_CHECKPOINT = "kubelet_internal_checkpoint"  # kubelet's device manager state, in that directory
SHIM_STATE_PATH = "/run/containerd"  # containerd puts shim sockets in /run/containerd/s, always
LEGACY_LOG_PATH = "/var/log/containers"  # kubelet: symlinks to container logs, always
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
POD_SUBNET = "10.244.0.0/24"  # on the node's own bridge only: not routed on the host
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"
# What kubelet's setupKernelTunables wants (pkg/kubelet/cm/container_manager_linux.go). It would write
# these into the host's /proc/sys; in the node's mount namespace each reads back this value instead.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
# containerd, containerd-shim-runc-v2 and ctr come from hack/build-containerd.sh; runc is Debian's.
REQUIRED_COMMANDS = ("runc", "unshare", "nsenter", "mount", "ip")
PLUGINS_REGISTRY = "plugins_registry"  # kubelet's DefaultKubeletPluginsRegistrationDirName, under --root-dir
PLUGINS = "plugins"  # kubelet's DefaultKubeletPluginsDirName, under --root-dir


class RealNodeError(ControlPlaneError):
    """containerd or kubelet did not come up, or the node did not become Ready; has log tails."""


def _which(cmd: str) -> str:
    path = shutil.which(cmd) or shutil.which(cmd, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if not path:
        raise RealNodeError(f"{cmd} not found: run hack/node-deps.sh (installs containerd, runc, CNI plugins)")
    return path


def _poll(check: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """`check()` until truthy (returned) or the timeout (None); KubeError/OSError count as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (KubeError, OSError):
            pass
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def _ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class RealNode(StartStop):
    """containerd + kubelet registered to `cp` as node `name`; see the module docstring."""

    def __init__(
        self,
        cp: ControlPlane,
        name: str,
        workdir: Path | str,
        bin_dir: Path | str | None = None,
        images: NodeImages | None = None,
        status_update_seconds: int = 1,
        pod_subnet: str = POD_SUBNET,
        pod_gateway: bool = False,
        containerd_dir: Path | str | None = None,
    ) -> None:
        self.cp = cp
        self.name = name
        self.workdir = Path(workdir).resolve()
        self.bin_dir = Path(bin_dir).resolve() if bin_dir is not None else cp.bin_dir
        # containerd, containerd-shim-runc-v2, ctr: hack/build-containerd.sh's (found at start()).
        self._containerd_bin = Path(containerd_dir).resolve() if containerd_dir is not None else None
        self._images = images
        self.status_update_seconds = status_update_seconds
        # pod_gateway: the bridge gets the subnet's first address on the host side and pods a default
        # route through it, so kubelet's probes reach pod IPs and pods reach host addresses (no NAT,
        # no iptables: only a connected route to pod_subnet on the host, gone with the bridge).
        self.pod_subnet = pod_subnet
        self.pod_gateway = pod_gateway
        self.log_dir = self.workdir / "logs"
        self.containerd_dir = self.workdir / "containerd"
        self.kubelet_root = self.workdir / "kubelet"
        self.device_plugin_dir = self.workdir / "device-plugins"
        # containerd's only CDI spec directory (cdi_spec_dirs): the host's /etc/cdi and /var/run/cdi
        # are not read, so a test's specs stay its own.
        self.cdi_dir = self.workdir / "cdi"
        self.containerd_socket = self.containerd_dir / "containerd.sock"
        suffix = secrets.token_hex(3)
        self.cgroup_root = f"gpushare-{name}-{suffix}"
        self.bridge = f"gps{suffix}"  # pods' network: a bridge of our own, no IP on the host side
        self.kubelet_port = 0
        self.healthz_port = 0
        self._admin_cfg = load_configuration(str(cp.admin_kubeconfig))
        self.admin = ApiServerClient(self._admin_cfg, component="gpushare-realnode")
        self._holder: ManagedProcess | None = None
        self._mount_ns: str | None = None
        self._containerd: ManagedProcess | None = None
        self._kubelet: ManagedProcess | None = None
        self._mountpoints = host.HostMountpoints([DEVICE_PLUGIN_PATH, SHIM_STATE_PATH, LEGACY_LOG_PATH])
        self._cgroups_created = False
        self._kubelet_log_offset = 0
        self.timings: dict[str, float] = {}

    # ----------------------------------------------------------------- public API

    @property
    def images(self) -> NodeImages:
        if self._images is None:
            self._images = node_images()
        return self._images

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def plugins_registry_dir(self) -> Path:
        """Where kubelet's plugin watcher finds registration sockets (DRA drivers, CSI)."""
        return self.kubelet_root / PLUGINS_REGISTRY

    @property
    def plugins_dir(self) -> Path:
        """kubelet's plugins directory (a DRA driver's service socket goes in `<dir>/<driver>/`)."""
        return self.kubelet_root / PLUGINS

    @property
    def containerd_bin(self) -> Path:
        """The directory of containerd, its runc shim and ctr (hack/build-containerd.sh)."""
        if self._containerd_bin is None:
            try:
                self._containerd_bin = containerd_bin_dir()
            except ContainerdBuildError as exc:
                raise RealNodeError(f"no containerd for node {self.name}: {exc}") from exc
        return self._containerd_bin

    @property
    def kubelet_pid(self) -> int | None:
        return self._kubelet.pid if self._kubelet is not None else None

    @property
    def containerd_pid(self) -> int | None:
        return self._containerd.pid if self._containerd is not None else None

    def start(self, timeout: float = 120.0) -> Self:
        """containerd up, images imported, kubelet up, Node registered, address set, Ready."""
        if os.geteuid() != 0:
            raise RealNodeError("a real node needs root (mount namespace, cgroups, containerd)")
        t0 = time.monotonic()
        try:
            for cmd in REQUIRED_COMMANDS:
                _which(cmd)
            self._cni_bin_dir()
            self.containerd_bin  # noqa: B018 - builds or finds containerd before anything starts
            if not (self.bin_dir / "kubelet").is_file():
                raise RealNodeError(f"no kubelet in {self.bin_dir}; run hack/build-k8s.sh")
            images = self.images
            self._prepare_dirs()
            self._start_holder()
            self._start_containerd(timeout)
            self.timings["containerd"] = time.monotonic() - t0
            t1 = time.monotonic()
            for image in images.all():
                self.ctr("images", "import", str(image.archive))
            listed = self.ctr("images", "ls", "-q").stdout.split()
            missing = [i.ref for i in images.all() if i.ref not in listed]
            if missing:
                raise self._fail(f"images not listed after import: {missing}")
            self.timings["images"] = time.monotonic() - t1
            t2 = time.monotonic()
            self._write_kubelet_config()
            self._start_kubelet(timeout)
            self.timings["kubelet_ready"] = time.monotonic() - t2
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - t0
        return self

    def restart_kubelet(self, timeout: float = 60.0, drop_device_checkpoint: bool = False) -> None:
        """Stop the kubelet process only and start it again; wait until the node is Ready.

        kubelet removes the sockets in its device-plugins directory at start: a device plugin must
        notice and register again, as in production. `drop_device_checkpoint` deletes kubelet's
        device manager checkpoint while it is down (a kubelet that never saw the plugin's resource).
        """
        if self._kubelet is None:
            raise RealNodeError("kubelet is not running")
        self._kubelet.stop()
        self._kubelet = None
        if drop_device_checkpoint:
            (self.device_plugin_dir / DEVICE_CHECKPOINT).unlink(missing_ok=True)
        self._start_kubelet(timeout)

    def stop(self) -> None:
        """Tear everything down; idempotent, and safe however far start() got."""
        errors: list[str] = []
        if self._kubelet is not None:
            self._kubelet.stop()
            self._kubelet = None
        if self._containerd is not None and self._containerd.alive():
            with contextlib.suppress(Exception):
                self._delete_tasks()
        if self._containerd is not None:
            self._containerd.stop()
            self._containerd = None
        # Shims serve our socket only; containers live in our cgroups; the rest of our mount namespace.
        leftovers = host.pids_with_args("-address", str(self.containerd_socket))
        if self._cgroups_created:
            leftovers |= host.cgroup_pids(self.cgroup_root)
        if self._mount_ns is not None:
            holder = self._holder.pid if self._holder is not None else None
            leftovers |= host.pids_in_mount_ns(self._mount_ns) - {holder}
        host.kill_pids(leftovers)
        still = host.wait_gone(leftovers, 10.0)
        if still:
            errors.append(f"processes did not exit: {sorted(still)}")
        if self._holder is not None:
            self._holder.stop(timeout=5.0)
            self._holder = None
        self._mount_ns = None
        if Path(f"/sys/class/net/{self.bridge}").exists():  # its pods' veths went with their netns
            result = subprocess.run([_which("ip"), "link", "del", self.bridge], capture_output=True, text=True)
            if result.returncode != 0:
                errors.append(f"ip link del {self.bridge}: {result.stderr.strip()}")
        if self._cgroups_created:
            left = host.remove_cgroup_root(self.cgroup_root)
            if left:
                errors.append("cgroups left: " + "; ".join(left))
            else:
                self._cgroups_created = False
        self._mountpoints.release()
        for d in (self.containerd_dir, self.kubelet_root, self.cdi_dir):
            shutil.rmtree(d, ignore_errors=True)
        if errors:
            raise RealNodeError(f"node {self.name} cleanup incomplete: " + " | ".join(errors))

    def node(self) -> dict[str, Any]:
        return self.admin.get_node(self.name)

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        node = _poll(lambda: (n := self.node()) and _ready(n) and n, timeout)
        if not node:
            raise self._fail(f"node {self.name} not Ready within {timeout:.0f}s")
        return node

    def logs(self, lines: int = 60) -> str:
        """Tails of kubelet's and containerd's logs (and the holder's), for a failure report."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"--- {path} (last {lines} lines) ---\n{tail(path, lines)}")
        return "\n".join(parts) if parts else f"<no logs in {self.log_dir}>"

    def kubelet_log(self) -> str:
        """What the running kubelet (since its latest start) wrote to its log."""
        path = self.log_dir / "kubelet.log"
        with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
            f.seek(self._kubelet_log_offset)
            return f.read().decode(errors="replace")
        return ""

    def ctr(self, *args: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """`ctr` against our containerd, namespace k8s.io (the CRI's), run in the node's mount namespace
        (its client side makes fifos under /run/containerd)."""
        argv = self._nsenter(
            str(self.containerd_bin / "ctr"), "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args
        )
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise self._fail(f"ctr {' '.join(args)} failed ({result.returncode}): {result.stdout}{result.stderr}")
        return result

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A container's log read through the API server (GET .../pods/<pod>/log): the API server asks
        kubelet, as in production (`kubectl logs`)."""
        try:
            return self.admin.pod_log(namespace, pod, container)
        except KubeError as exc:
            raise RealNodeError(f"log of {namespace}/{pod} {container or ''}: {exc}") from exc

    # ----------------------------------------------------------------- internals

    def _fail(self, message: str) -> RealNodeError:
        return RealNodeError(f"real node {self.name}: {message}\n{self.logs(80)}")

    def _cni_bin_dir(self) -> str:
        for d in CNI_BIN_DIRS:
            if all((Path(d) / plugin).is_file() for plugin in ("bridge", "host-local", "loopback")):
                return d
        raise RealNodeError("no CNI bridge plugin: run hack/node-deps.sh (installs containernetworking-plugins)")

    def _prepare_dirs(self) -> None:
        for d in (self.log_dir, self.containerd_dir, self.kubelet_root, self.device_plugin_dir, self.cdi_dir):
            d.mkdir(parents=True, exist_ok=True)
        for d in ("root", "state", "runc", "opt", "cni/net.d"):
            (self.containerd_dir / d).mkdir(parents=True, exist_ok=True)
        for d in ("pod-logs", "container-logs", "volume-plugins", "pki", "sysctl", PLUGINS_REGISTRY, PLUGINS):
            (self.kubelet_root / d).mkdir(parents=True, exist_ok=True)
        for key, value in KUBELET_SYSCTLS.items():
            (self.kubelet_root / "sysctl" / key.replace("/", ".")).write_text(f"{value}\n")
        host.create_cgroup_root(self.cgroup_root)
        self._cgroups_created = True

    def _start_holder(self) -> None:
        """The process that owns the node's mount namespace (see the module docstring)."""
        self._mountpoints.acquire()
        ready = self.workdir / "mount-ns.ready"
        ready.unlink(missing_ok=True)
        steps = [
            ["mount", "--bind", str(self.device_plugin_dir), DEVICE_PLUGIN_PATH],
            ["mount", "-t", "tmpfs", "-o", "mode=0711,size=64m", "tmpfs", SHIM_STATE_PATH],
            ["mount", "--bind", str(self.kubelet_root / "container-logs"), LEGACY_LOG_PATH],
        ]
        for key in KUBELET_SYSCTLS:
            value_file = self.kubelet_root / "sysctl" / key.replace("/", ".")
            steps.append(["mount", "--bind", str(value_file), f"/proc/sys/{key}"])
        steps.append(["touch", str(ready)])
        script = " && ".join([*(shlex.join(s) for s in steps), "exec sleep infinity"])
        self._holder = ManagedProcess(
            "mount-ns",
            [_which("unshare"), "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", script],
            self.log_dir / "mount-ns.log",
        )
        if not _poll(lambda: ready.exists() or not self._holder.alive(), 10.0, 0.02) or not ready.exists():
            raise self._fail("the mount namespace holder did not set up its mounts")
        self._mount_ns = host.mount_ns(self._holder.pid)
        if self._mount_ns is None or self._mount_ns == host.mount_ns(os.getpid()):
            raise self._fail("the holder is not in a mount namespace of its own")

    def _nsenter(self, *argv: str) -> list[str]:
        if self._holder is None:
            raise RealNodeError(f"node {self.name}: its mount namespace is gone (not started, or stopped)")
        return [_which("nsenter"), f"--mount=/proc/{self._holder.pid}/ns/mnt", "--", *argv]

    def _containerd_config(self) -> str:
        """containerd v2's config, version 3: the CRI plugin split into images, runtime and server parts."""
        c = self.containerd_dir
        images = {
            "snapshotter": "overlayfs",
            "pinned_images": {"sandbox": self.images.pause.ref},  # the pod sandbox (never pulled)
        }
        runtime = {
            # root here may lack CAP_SYS_RESOURCE: without this every sandbox fails to start
            # ("can't get final child's PID from pipe").
            "restrict_oom_score_adj": True,
            "disable_apparmor": True,  # no profile to load on a test host
            "netns_mounts_under_state_dir": True,  # pod netns under our state dir, not /run/netns
            "enable_selinux": False,
            # CDI is always on in containerd 2: the devices kubelet names (DRA claims, a device plugin's
            # cdi_devices) are resolved against the specs in these directories, and a name without a
            # spec fails the container.
            "cdi_spec_dirs": [str(self.cdi_dir)],
            "cni": {"bin_dirs": [self._cni_bin_dir()], "conf_dir": str(c / "cni" / "net.d")},
            "containerd": {
                "default_runtime_name": "runc",
                "runtimes": {
                    "runc": {
                        "runtime_type": "io.containerd.runc.v2",
                        # Debian's runc; the shim is hack/build-containerd.sh's (found on containerd's PATH)
                        "options": {"SystemdCgroup": False, "Root": str(c / "runc"), "BinaryName": _which("runc")},
                    }
                },
            },
        }
        server = {"stream_server_address": LOOPBACK, "stream_server_port": "0"}
        config = {
            "version": 3,
            "root": str(c / "root"),
            "state": str(c / "state"),
            "oom_score": 0,
            "disabled_plugins": [
                "io.containerd.snapshotter.v1.blockfile",
                "io.containerd.snapshotter.v1.erofs",
            ],
            "grpc": {"address": str(self.containerd_socket)},
            "ttrpc": {"address": str(c / "containerd.sock.ttrpc")},
            "plugins": {
                "io.containerd.cri.v1.images": images,
                "io.containerd.cri.v1.runtime": runtime,
                "io.containerd.grpc.v1.cri": server,
            },
        }
        return _toml(config)

    def _start_containerd(self, timeout: float) -> None:
        c = self.containerd_dir
        (c / "config.toml").write_text(self._containerd_config())
        # Pods off the host network get eth0 on a bridge of our own (containerd's CRI wants an eth0
        # with an address). The bridge has no address and there is no masquerading: no route or
        # iptables rule on the host changes, and pods reach only each other.
        bridge = {
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": self.pod_gateway,
            "isDefaultGateway": self.pod_gateway,
            "ipMasq": False,
            "hairpinMode": False,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": self.pod_subnet}]],
                "dataDir": str(c / "cni" / "ipam"),
            },
        }
        conflist = {"cniVersion": "1.0.0", "name": "gpushare-pods", "plugins": [bridge]}
        (c / "cni" / "net.d" / "10-gpushare.conflist").write_text(json.dumps(conflist))
        self._containerd = ManagedProcess(
            "containerd",
            self._nsenter(
                str(self.containerd_bin / "containerd"), "--config", str(c / "config.toml"), "--log-level", "info"
            ),
            self.log_dir / "containerd.log",
            # containerd starts `containerd-shim-runc-v2` from its PATH: ours first, never Debian's 1.6 one.
            env={**os.environ, "PATH": f"{self.containerd_bin}:" + os.environ.get("PATH", "") + ":/usr/sbin:/sbin"},
        )

        def up() -> bool:
            if not self._containerd.alive():
                raise self._fail(f"containerd exited at start ({self._containerd.popen.returncode})")
            return self.ctr("version", check=False, timeout=5).returncode == 0

        if not _poll(up, timeout, 0.1):
            raise self._fail(f"containerd not serving {self.containerd_socket} within {timeout:.0f}s")

    def _write_kubelet_config(self) -> None:
        pki = self.kubelet_root / "pki"
        serving = self.cp.ca.issue_server(
            f"kubelet-{self.name}", f"system:node:{self.name}", ["localhost", self.name], [LOOPBACK]
        )
        shutil.copy(serving.cert, pki / "kubelet.crt")
        shutil.copy(serving.key, pki / "kubelet.key")
        if self.kubelet_port == 0:
            self.kubelet_port, self.healthz_port = free_ports(2)
        off = "0%"  # ignored threshold: a busy test disk never evicts our pods
        resolv = "/etc/resolv.conf" if Path("/etc/resolv.conf").exists() else ""
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": LOOPBACK,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": LOOPBACK,
            "healthzPort": self.healthz_port,
            "tlsCertFile": str(pki / "kubelet.crt"),
            "tlsPrivateKeyFile": str(pki / "kubelet.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cp.ca_cert)},
            },
            "authorization": {"mode": "AlwaysAllow"},  # any client cert of the test CA
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",  # as containerd's runc runtime (SystemdCgroup = false)
            "cgroupRoot": f"/{self.cgroup_root}",
            "failCgroupV1": False,
            "failSwapOn": False,
            "podLogsDir": str(self.kubelet_root / "pod-logs"),
            "volumePluginDir": str(self.kubelet_root / "volume-plugins"),
            "resolvConf": resolv,
            "evictionHard": {
                "memory.available": off,
                "nodefs.available": off,
                "nodefs.inodesFree": off,
                "imagefs.available": off,
                "imagefs.inodesFree": off,
            },
            "imageGCHighThresholdPercent": 100,  # never garbage-collect our (unpullable) images
            "imageGCLowThresholdPercent": 99,
            "makeIPTablesUtilChains": False,  # leave the host's iptables alone
            "oomScoreAdj": 0,
            "nodeStatusUpdateFrequency": f"{self.status_update_seconds}s",
            "registerNode": True,
        }
        if self.cp.feature_gates:  # gates the control plane runs with (e.g. DRAConsumableCapacity before 1.36)
            config["featureGates"] = dict(self.cp.feature_gates)
        (self.kubelet_root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def _start_kubelet(self, timeout: float) -> None:
        kubeconfig = self.cp.kubeconfig_for(f"system:node:{self.name}", ["system:nodes"])
        log = self.log_dir / "kubelet.log"
        self._kubelet_log_offset = log.stat().st_size if log.exists() else 0
        self._kubelet = ManagedProcess(
            "kubelet",
            self._nsenter(
                str(self.bin_dir / "kubelet"),
                f"--config={self.kubelet_root / 'config.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self.kubelet_root / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-labels={NODE_LABEL}={NODE_LABEL_VALUE}",
                # Keep the node addresses we set (kubelet refuses a loopback --node-ip).
                "--cloud-provider=external",
                "--v=2",
            ),
            self.log_dir / "kubelet.log",
            env={**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin"},
        )
        kubelet = self._kubelet

        def registered() -> dict[str, Any] | None:
            # This kubelet (not an earlier one) registered the node, or found it registered.
            if not kubelet.alive():
                raise self._fail(f"kubelet exited at start ({kubelet.popen.returncode})")
            text = self.kubelet_log()
            if "Successfully registered node" not in text and "Node was previously registered" not in text:
                return None
            try:
                return self.node()
            except NotFound:
                return None

        node = _poll(registered, timeout, 0.05)
        if not node:
            raise self._fail(f"node {self.name} not registered within {timeout:.0f}s")
        self._adopt(node)

        def ready() -> bool:
            if not kubelet.alive():
                raise self._fail(f"kubelet exited before the node was Ready ({kubelet.popen.returncode})")
            return self._healthz() and _ready(self.node())

        if not _poll(ready, timeout, 0.05):
            raise self._fail(f"node {self.name} not Ready (kubelet /healthz and Node condition) within {timeout:.0f}s")

    def _healthz(self) -> bool:
        url = f"http://{LOOPBACK}:{self.healthz_port}/healthz"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=2) as resp:
                return resp.status == 200
        except OSError:  # not listening yet, or 500 while a check fails
            return False

    def _delete_tasks(self) -> None:
        """End every container (its processes are in our cgroups) and delete its task, so that
        containerd's shims exit on their own before containerd stops."""
        host.kill_pids(host.cgroup_pids(self.cgroup_root))
        ids = self.ctr("tasks", "ls", "-q", check=False, timeout=15).stdout.split()
        if ids:
            self.ctr("tasks", "delete", "--force", *ids, check=False, timeout=30)

    def _adopt(self, node: dict[str, Any]) -> None:
        """What a cloud controller does for a new node: addresses, and lift the uninitialized taint."""
        addresses = [{"type": "InternalIP", "address": LOOPBACK}, {"type": "Hostname", "address": self.name}]
        if node.get("status", {}).get("addresses") != addresses:
            self.admin.request(
                "PATCH",
                f"/api/v1/nodes/{self.name}/status",
                body={"status": {"addresses": addresses}},
                content_type="application/merge-patch+json",
            )
        for _ in range(10):
            node = self.node()
            taints = node.get("spec", {}).get("taints") or []
            kept = [t for t in taints if t.get("key") != UNINITIALIZED_TAINT]
            if kept == taints:
                return
            try:
                self.admin.request(
                    "PATCH",
                    f"/api/v1/nodes/{self.name}",
                    body={
                        "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                        "spec": {"taints": kept or None},
                    },
                    content_type="application/merge-patch+json",
                )
                return
            except KubeError as exc:
                if exc.status != 409:
                    raise
        raise self._fail("could not remove the uninitialized taint (conflicts)")


def _toml(obj: dict[str, Any]) -> str:
    """The TOML subset containerd's config needs: tables of str, bool, int, list of str."""
    lines: list[str] = []

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"no TOML for {v!r}")

    def table(prefix: list[str], d: dict[str, Any]) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in d.items() if isinstance(v, dict)}
        if prefix:
            lines.append("")
            lines.append("[" + ".".join(json.dumps(p) if "." in p else p for p in prefix) + "]")
        for k, v in scalars.items():
            lines.append(f"{k} = {value(v)}")
        for k, v in tables.items():
            table([*prefix, k], v)

    table([], obj)
    return "\n".join(lines) + "\n"
