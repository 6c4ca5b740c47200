"""A real, secured Kubernetes control plane on loopback for integration tests.

etcd + kube-apiserver (client-cert auth, Node,RBAC authorization) + optionally
kube-scheduler and kube-controller-manager, built by hack/build-k8s.sh. No kubelet: tests
create Node objects themselves and patch their status (tests/node adds a real kubelet, which
the API server reaches with a client cert of the test CA). The ServiceAccount admission plugin is
on only for a control plane made with `service_accounts=True`, whose controller manager creates
the default service accounts and publishes kube-root-ca.crt (pods then get projected tokens).
Everything listens on 127.0.0.1 only, every process is ended by its own PID, and anything that fails to come up raises
with its log tail (never skips).

One piece: the processes share one lifecycle, one certificate set and one log-tail-on-failure path; split,
each half would reach into the other's state.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from typing import Self

import yaml

from .certs import CertAuthority
from .certs import CertPair
from .certs import apiserver_sans
from .certs import write_service_account_keys

LOOPBACK = "127.0.0.1"
SCHEDULER_USER = "system:kube-scheduler"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
# The controllers a chart needs to run as in any cluster. Not the node lifecycle controller (stand-in
# nodes never heartbeat), nor the ones for things the tests never make (volumes, jobs, endpoints...).
DEFAULT_CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "disruption-controller",
    "job-controller",  # the chart's uninstall hook is a Job
)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """A binary is missing or a process did not come up; the message has log tails."""


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1, free now (the kernel picks them)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind((LOOPBACK, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One TCP port on 127.0.0.1 that is free right now."""
    return free_ports(1)[0]


def tail(path: Path, lines: int = 60) -> str:
    """The last `lines` lines of a log file, or a note that it does not exist."""
    try:
        text = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return f"<no log at {path}>"
    return "\n".join(text.splitlines()[-lines:])


class StartStop:
    """A harness part that runs between its start() and its stop(): `with Part(...) as part:` does both."""

    def start(self) -> object:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ManagedProcess:
    """A child process, stdout+stderr in one log file, stopped by its own PID only."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"### {' '.join(self.argv)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)

    def fail(self, message: str, lines: int = 80) -> ControlPlaneError:
        """An error naming this process, its state and its log tail."""
        state = "running" if self.alive() else f"exited with {self.popen.returncode}"
        return ControlPlaneError(
            f"{self.name} (pid {self.pid}, {state}): {message}\n"
            f"--- {self.log_path} (last {lines} lines) ---\n{self.log_tail(lines)}"
        )

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        return self.popen.returncode


def wait_until(
    proc: ManagedProcess,
    check: Any,
    timeout: float,
    what: str,
    interval: float = 0.25,
) -> None:
    """Poll `check()` until it is truthy; raise with the log tail on exit or timeout."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            raise proc.fail(f"exited while waiting for {what}")
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError, ValueError) as e:
            last_error = f"{type(e).__name__}: {e}"
        time.sleep(interval)
    raise proc.fail(f"not {what} within {timeout:.0f}s (last error: {last_error or 'none'})")


def _http_get(url: str, context: ssl.SSLContext | None = None, timeout: float = 5.0) -> tuple[int, str]:
    """GET without any proxy from the environment (loopback only)."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")


def http_status(url: str, timeout: float = 2.0) -> int:
    """The HTTP status a GET of `url` answers with, 0 while nothing answers (or answers an error)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except OSError:
        return 0


def _wait_healthz(proc: ManagedProcess, port: int, timeout: float) -> None:
    """Wait for a component's /healthz on 127.0.0.1:<port>, served with its own self-signed cert; one that
    does not get healthy (or an interrupted wait) is stopped."""
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    try:
        wait_until(
            proc, lambda: _http_get(f"https://{LOOPBACK}:{port}/healthz", insecure)[0] == 200, timeout, "healthy"
        )
    except BaseException:
        proc.stop()
        raise


def _b64(path: Path) -> str:
    return base64.b64encode(Path(path).read_bytes()).decode()


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "user"


@dataclass
class SchedulerHandle:
    """A running kube-scheduler: its process, secure port and the files it was given."""

    process: ManagedProcess
    port: int
    config_path: Path
    kubeconfig: Path

    @property
    def pid(self) -> int:
        return self.process.pid


class ControlPlane(StartStop):
    """etcd + kube-apiserver (+ kube-scheduler on demand) on 127.0.0.1."""

    _serving: CertPair
    _front_proxy_ca: CertAuthority
    _sa_keys: CertPair

    def __init__(
        self,
        workdir: Path | str,
        bin_dir: Path | str,
        service_accounts: bool = False,
        feature_gates: Mapping[str, bool] | None = None,
        profiling: bool = False,
        apiserver_args: Sequence[str] = (),
    ) -> None:
        self.workdir = Path(workdir).resolve()
        # More kube-apiserver flags, e.g. --enable-aggregator-routing=true: a webhook behind a Service is
        # then called on an endpoint's pod IP (no kube-proxy in these clusters routes a ClusterIP).
        self.apiserver_args = list(apiserver_args)
        self.service_accounts = service_accounts
        self.profiling = profiling  # kube-apiserver's /debug/pprof (bench/ reads it; off in tests)
        # Gates still off by default in the release under test that a test needs (e.g. DRAConsumableCapacity
        # before 1.36): passed to kube-apiserver, kube-scheduler and kube-controller-manager alike.
        self.feature_gates = dict(feature_gates or {})
        self.bin_dir = Path(bin_dir).resolve()
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        self.kubeconfig_dir = self.workdir / "kubeconfigs"
        self.etcd_port = 0
        self.apiserver_port = 0
        self._etcd_peer_port = 0
        self.admin_kubeconfig = self.kubeconfig_dir / "admin.kubeconfig"
        self._ca: CertAuthority | None = None
        self._etcd: ManagedProcess | None = None
        self._apiserver: ManagedProcess | None = None
        self._scheduler: SchedulerHandle | None = None
        self._controller_manager: ManagedProcess | None = None
        self.controller_manager_port = 0
        self._kubeconfigs: dict[tuple[str, tuple[str, ...]], Path] = {}
        self._admin_cert: CertPair | None = None
        self._kubelet_client_cert: CertPair | None = None

    # ----------------------------------------------------------------- lifecycle

    def binary(self, name: str) -> Path:
        """Path of a built binary; raises if hack/build-k8s.sh did not produce it."""
        path = self.bin_dir / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ControlPlaneError(f"binary {path} is missing or not executable; run hack/build-k8s.sh")
        return path

    @property
    def server(self) -> str:
        """The API server URL (https://127.0.0.1:<port>)."""
        return f"https://{LOOPBACK}:{self.apiserver_port}"

    @property
    def ca_cert(self) -> Path:
        return self._require_ca().cert_path

    @property
    def ca(self) -> CertAuthority:
        """The test CA: the API server trusts client certs it issues, and it trusts kubelets' serving certs."""
        return self._require_ca()

    def start(self, etcd_timeout: float = 60.0, apiserver_timeout: float = 120.0) -> None:
        """Start etcd and kube-apiserver, wait for /readyz, write admin kubeconfig."""
        for name in ("etcd", "kube-apiserver"):
            self.binary(name)
        for d in (self.pki_dir, self.log_dir, self.kubeconfig_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.etcd_port, self._etcd_peer_port, self.apiserver_port = free_ports(3)
        try:
            self._write_pki()
            self._start_etcd(etcd_timeout)
            self._start_apiserver(apiserver_timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop scheduler, controller manager, API server and etcd, each by its own PID; idempotent."""
        self.stop_scheduler()
        self.stop_controller_manager()
        for attr in ("_apiserver", "_etcd"):
            proc: ManagedProcess | None = getattr(self, attr)
            if proc is not None:
                proc.stop()
                setattr(self, attr, None)

    def processes(self) -> list[ManagedProcess]:
        procs = [
            self._etcd,
            self._apiserver,
            self._scheduler.process if self._scheduler else None,
            self._controller_manager,
        ]
        return [p for p in procs if p is not None]

    def logs(self, lines: int = 40) -> str:
        """Tails of every log in the log dir, for a failed test's report."""
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            parts.append(f"--- {path} (last {lines} lines) ---\n{tail(path, lines)}")
        return "\n".join(parts) if parts else f"<no logs in {self.log_dir}>"

    def feature_gate_args(self) -> list[str]:
        """`--feature-gates=...` for a control plane component, or nothing when no gate is set."""
        if not self.feature_gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))]

    def version(self) -> tuple[int, int]:
        """The (major, minor) of the built kube-apiserver (`--version`: "Kubernetes v1.37.2")."""
        out = subprocess.run(
            [str(self.binary("kube-apiserver")), "--version"], capture_output=True, text=True, check=True
        ).stdout
        m = re.search(r"v(\d+)\.(\d+)", out)
        if not m:
            raise ControlPlaneError(f"kube-apiserver --version printed no version: {out!r}")
        return int(m.group(1)), int(m.group(2))

    # ----------------------------------------------------------------- identities

    def kubeconfig_for(self, user: str, groups: Iterable[str] = ()) -> Path:
        """A kubeconfig that authenticates as `user` in `groups` (client cert)."""
        key = (user, tuple(groups))
        if key in self._kubeconfigs:
            return self._kubeconfigs[key]
        stem = _safe_name("-".join([user, *key[1]]))
        pair = self._require_ca().issue_client(f"client-{stem}", user, key[1])
        path = self.kubeconfig_dir / f"{stem}.kubeconfig"
        self._write_kubeconfig(path, user, pair)
        self._kubeconfigs[key] = path
        return path

    def token_kubeconfig(self, namespace: str, service_account: str, expiration_s: int = 86400) -> Path:
        """A kubeconfig with a token of the service account (a TokenRequest) and no client certificate:
        what a pod's in-cluster config gives a program. The API server caches a verified token (10 s,
        its TokenSuccessCacheTTL default), where it verifies a client certificate on every request."""
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={expiration_s}s"
        ).stdout.strip()
        if not token:
            raise ControlPlaneError(f"kubectl create token {namespace}/{service_account} printed no token")
        user = f"system:serviceaccount:{namespace}:{service_account}"
        path = self.kubeconfig_dir / f"{_safe_name(user)}-token.kubeconfig"
        self._write_kubeconfig(path, user, None, token=token)
        return path

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (admin identity unless `kubeconfig` is given)."""
        argv = [
            str(self.binary("kubectl")),
            f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
            *args,
        ]
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )
        return result

    # ----------------------------------------------------------------- scheduler

    def start_scheduler(
        self, config_yaml_text: str, timeout: float = 90.0, kubeconfig: Path | None = None
    ) -> SchedulerHandle:
        """Start kube-scheduler with the caller's KubeSchedulerConfiguration.

        `clientConnection.kubeconfig` is set to `kubeconfig`, by default one for system:kube-scheduler
        (the identity the built-in RBAC grants scheduling rights). Leader election is
        off unless the config sets `leaderElection`, so a restart takes over at once.
        """
        if self._scheduler is not None:
            raise ControlPlaneError("kube-scheduler already running; call stop_scheduler() first")
        self._scheduler = self.launch_scheduler(config_yaml_text, "kube-scheduler", timeout, kubeconfig)
        return self._scheduler

    def launch_scheduler(
        self,
        config_yaml_text: str,
        name: str,
        timeout: float = 90.0,
        kubeconfig: Path | None = None,
        hostname: str | None = None,
    ) -> SchedulerHandle:
        """Start one more kube-scheduler (e.g. a standby replica); the caller stops it (`.process.stop()`).

        Its config and certificates are kept apart by `name`; its log is logs/<name>.log. `hostname`: run it
        in a UTS namespace of its own under that host name, as each replica's pod has one: kube-scheduler
        names itself in the leader Lease by os.Hostname() + "_" + a UUID (cmd/kube-scheduler/app/options,
        makeLeaderElectionConfig), so two replicas on one machine are told
        apart by their extenders as two pods' would be. `unshare` execs in place: the PID stays the
        scheduler's."""
        binary = self.binary("kube-scheduler")
        config = yaml.safe_load(config_yaml_text) or {}
        if not isinstance(config, dict):
            raise ControlPlaneError("scheduler config must be a YAML mapping")
        config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
        config.setdefault("kind", "KubeSchedulerConfiguration")
        kubeconfig = kubeconfig or self.kubeconfig_for(SCHEDULER_USER)
        client = config.get("clientConnection") or {}
        client["kubeconfig"] = str(kubeconfig)
        config["clientConnection"] = client
        config.setdefault("leaderElection", {"leaderElect": False})
        suffix = "" if name == "kube-scheduler" else f"-{_safe_name(name)}"
        config_path = self.workdir / f"scheduler-config{suffix}.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        own_host = []
        if hostname is not None:
            own_host = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", hostname]
        proc = ManagedProcess(
            name,
            [
                *own_host,
                binary,
                f"--config={config_path}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--cert-dir={self.workdir / f'scheduler-certs{suffix}'}",
                *self.feature_gate_args(),
                "--v=2",
            ],
            self.log_dir / f"{name}.log",
        )
        _wait_healthz(proc, port, timeout)
        return SchedulerHandle(proc, port, config_path, kubeconfig)

    def stop_scheduler(self) -> None:
        """Stop kube-scheduler if one runs (by its PID)."""
        if self._scheduler is not None:
            self._scheduler.process.stop()
            self._scheduler = None

    @property
    def scheduler(self) -> SchedulerHandle | None:
        return self._scheduler

    # ----------------------------------------------------------------- controller manager

    def start_controller_manager(
        self, controllers: Sequence[str] = DEFAULT_CONTROLLERS, timeout: float = 90.0
    ) -> ManagedProcess:
        """Start kube-controller-manager as system:kube-controller-manager (client cert of the test
        CA; the built-in RBAC grants it), each controller with its own service account's credentials
        (`--use-service-account-credentials`, as kubeadm runs it), tokens signed with the key the API
        server verifies, the test CA published as kube-root-ca.crt. Waits for /healthz."""
        if self._controller_manager is not None:
            raise ControlPlaneError("kube-controller-manager already running")
        kubeconfig = self.kubeconfig_for(CONTROLLER_MANAGER_USER)
        self.controller_manager_port = free_port()
        proc = ManagedProcess(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={self.controller_manager_port}",
                f"--cert-dir={self.workdir / 'controller-manager-certs'}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self._sa_keys.key}",
                f"--root-ca-file={self.ca_cert}",
                f"--controllers={','.join(controllers)}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--leader-elect=false",
                "--concurrent-deployment-syncs=2",
                "--concurrent-replicaset-syncs=2",
                *self.feature_gate_args(),
                "--v=2",
            ],
            self.log_dir / "kube-controller-manager.log",
        )
        _wait_healthz(proc, self.controller_manager_port, timeout)
        self._controller_manager = proc
        return proc

    def stop_controller_manager(self) -> None:
        if self._controller_manager is not None:
            self._controller_manager.stop()
            self._controller_manager = None

    @property
    def controller_manager(self) -> ManagedProcess | None:
        return self._controller_manager

    # ----------------------------------------------------------------- internals

    def _require_ca(self) -> CertAuthority:
        if self._ca is None:
            raise ControlPlaneError("control plane not started")
        return self._ca

    def _write_pki(self) -> None:
        self._ca = CertAuthority(self.pki_dir)
        self._front_proxy_ca = CertAuthority(self.pki_dir / "front-proxy", "front-proxy-ca")
        dns, ips = apiserver_sans()
        self._serving = self._ca.issue_server("apiserver", "kube-apiserver", dns, ips)
        self._sa_keys = write_service_account_keys(self.pki_dir)
        self._admin_cert = self._ca.issue_client("client-admin", "admin", ["system:masters"])
        self._write_kubeconfig(self.admin_kubeconfig, "admin", self._admin_cert)
        # How the API server authenticates to a real kubelet (pods/log, exec); kubelets serve certs of this CA.
        self._kubelet_client_cert = self._ca.issue_client(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"]
        )
        self._kubeconfigs[("admin", ("system:masters",))] = self.admin_kubeconfig

    def _write_kubeconfig(self, path: Path, user: str, pair: CertPair | None, token: str | None = None) -> None:
        credentials = (
            {"token": token}
            if pair is None
            else {"client-certificate-data": _b64(pair.cert), "client-key-data": _b64(pair.key)}
        )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpushare-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": credentials,
                }
            ],
            "contexts": [
                {
                    "name": "default",
                    "context": {"cluster": "gpushare-test", "user": user},
                }
            ],
            "current-context": "default",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        # JSON is YAML: every kubeconfig reader accepts it.
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    def _start_etcd(self, timeout: float) -> None:
        peer_port = self._etcd_peer_port
        client_url = f"http://{LOOPBACK}:{self.etcd_port}"
        peer_url = f"http://{LOOPBACK}:{peer_port}"
        self._etcd = ManagedProcess(
            "etcd",
            [
                self.binary("etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",  # test data only: skip fsync for speed
                "--log-level=warn",
            ],
            self.log_dir / "etcd.log",
        )
        wait_until(
            self._etcd,
            lambda: json.loads(_http_get(f"{client_url}/health")[1]).get("health") == "true",
            timeout,
            "healthy",
        )

    def admin_context(self, verify_server: bool = True) -> ssl.SSLContext:
        """TLS as the cluster admin: the test CA's client certificate; `verify_server=False` for
        components whose serving certificate is self-signed (kube-scheduler's)."""
        assert self._admin_cert is not None
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if not verify_server:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        context.load_cert_chain(str(self._admin_cert.cert), str(self._admin_cert.key))
        return context

    def cpu_profile(self, seconds: int, out: Path) -> threading.Thread:
        """Start a kube-apiserver CPU profile of `seconds` (Go's pprof endpoint), written to `out`; join the
        thread for the file."""
        context = self.admin_context(verify_server=False)

        def fetch() -> None:
            url = f"{self.server}/debug/pprof/profile?seconds={seconds}"
            with urllib.request.urlopen(url, context=context, timeout=seconds + 30) as resp:
                out.write_bytes(resp.read())

        thread = threading.Thread(target=fetch)
        thread.start()
        return thread

    def _start_apiserver(self, timeout: float) -> None:
        assert self._kubelet_client_cert is not None
        self._apiserver = ManagedProcess(
            "kube-apiserver",
            [
                self.binary("kube-apiserver"),
                f"--etcd-servers=http://{LOOPBACK}:{self.etcd_port}",
                f"--bind-address={LOOPBACK}",
                f"--advertise-address={LOOPBACK}",
                f"--secure-port={self.apiserver_port}",
                f"--tls-cert-file={self._serving.cert}",
                f"--tls-private-key-file={self._serving.key}",
                f"--client-ca-file={self.ca_cert}",
                "--authorization-mode=Node,RBAC",
                # A real kubelet (tests/node) is reached on its node's InternalIP (127.0.0.1), its
                # serving cert checked against the test CA; the client cert is the test CA's too.
                f"--kubelet-client-certificate={self._kubelet_client_cert.cert}",
                f"--kubelet-client-key={self._kubelet_client_cert.key}",
                f"--kubelet-certificate-authority={self.ca_cert}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={self._sa_keys.cert}",
                f"--service-account-signing-key-file={self._sa_keys.key}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # Unless `service_accounts`, no controller-manager creates the default
                # ServiceAccount, so pods must not need it; and no node lifecycle controller would
                # ever lift the not-ready taint TaintNodesByCondition puts on new Nodes, so nodes
                # start untainted.
                "--disable-admission-plugins="
                + ("TaintNodesByCondition" if self.service_accounts else "ServiceAccount,TaintNodesByCondition"),
                # A kubelet (system:node:<name>) may change only its own Node and its pods' status.
                "--enable-admission-plugins=NodeRestriction",
                # The `kubernetes` Service endpoint may not be loopback: don't maintain it.
                "--endpoint-reconciler-type=none",
                # Aggregation-layer CA (never used to sign a client): delegated authn in
                # kube-scheduler wants it in extension-apiserver-authentication.
                f"--requestheader-client-ca-file={self._front_proxy_ca.cert_path}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--allow-privileged=true",
                f"--profiling={str(self.profiling).lower()}",
                f"--cert-dir={self.pki_dir / 'apiserver-generated'}",
                *self.feature_gate_args(),
                *self.apiserver_args,
                "--v=1",
            ],
            self.log_dir / "kube-apiserver.log",
        )
        context = self.admin_context()
        wait_until(
            self._apiserver,
            lambda: _http_get(f"{self.server}/readyz", context)[0] == 200,
            timeout,
            "ready (/readyz)",
            interval=0.5,
        )
