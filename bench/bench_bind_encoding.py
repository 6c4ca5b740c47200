"""CPU per bind, JSON Binding against protobuf Binding, through a real etcd and kube-apiserver.

Issue 11: the API server spends CPU decoding our JSON Binding that it would not spend on the protobuf
one kube-scheduler itself sends. This bench creates N unbound GPU pods (never scheduled: their
scheduler does not exist), then binds each once with share_core.kube's client, the GPU annotations
on the Binding as the extender sends them, in blocks that alternate JSON and protobuf (A B B A ...,
so a drift of the machine over the run falls on both alike). Per encoding it prints CPU ms per bind
of kube-apiserver, etcd and this client (all its threads), from /proc, and the ratios protobuf/JSON.
Then the client's cost of building each body alone (no network).

  python bench/bench_bind_encoding.py                 # 2,000 pods, 8 blocks, 8 binding threads
  python bench/bench_bind_encoding.py --pods 4000 --blocks 16
  python bench/bench_bind_encoding.py --bare          # our annotations against none (kube-scheduler's Binding)
  python bench/bench_bind_encoding.py --pprof /tmp/pp  # also a kube-apiserver CPU profile per encoding
                                                      # (another N pods each; `go tool pprof -top` reads them)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
import timeit
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from share_core import kubeproto  # noqa: E402
from share_core.assignment import Assignment  # noqa: E402
from share_core.kube import ApiServerClient  # noqa: E402
from share_core.kube import binding_json  # noqa: E402
from tests.controlplane.barenodes import create_bare_nodes  # noqa: E402
from tests.controlplane.barenodes import gpu_pod  # noqa: E402
from tests.controlplane.binaries import k8s_bin_dir  # noqa: E402
from tests.controlplane.cluster import ControlPlane  # noqa: E402

NAMESPACE = "bench-bind"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """user + system CPU seconds of one process (all its threads), from /proc/<pid>/stat."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def annotations(i: int) -> dict[str, str]:
    """What the extender puts on a Binding: one GPU of eight, its UUID, memory, assume time."""
    gpu = i % 8
    return Assignment((gpu,), (f"GPU-bench-node-{i % 10:03d}-{gpu}",), 1 + i % 8, time.time_ns()).to_annotations()


@contextlib.contextmanager
def bench_cluster(name: str, profiling: bool) -> Iterator[tuple[ControlPlane, ApiServerClient]]:
    """A control plane of its own in a temporary directory, with namespace `name` and ten bare nodes of
    eight 16 GiB GPUs; its admin client says it is `name`."""
    with (
        tempfile.TemporaryDirectory(prefix=f"{name}-") as work,
        ControlPlane(work, k8s_bin_dir(), profiling=profiling) as cp,
    ):
        admin = ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), component=name)
        admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
        create_bare_nodes(admin, [f"node-{i:03d}" for i in range(10)], gpus=8, mem=16)
        yield cp, admin


def bind_block(client: ApiServerClient, pods: list[tuple[str, str]], threads: int, bare: bool = False) -> None:
    """`bare`: no annotations on the Binding, as kube-scheduler's own binder sends it."""

    def bind(item: tuple[int, tuple[str, str]]) -> None:
        i, (name, uid) = item
        client.bind_pod(NAMESPACE, name, uid, f"node-{i % 10:03d}", {} if bare else annotations(i))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(bind, enumerate(pods)))


def profile_binds(
    cp: ControlPlane, client: ApiServerClient, pods: list[tuple[str, str]], threads: int, out: Path
) -> None:
    """A kube-apiserver CPU profile that spans binding `pods` (the binds start half a second into it)."""
    seconds = len(pods) // 500 + 4  # binds run at ~1,000/s here: the profile outlasts them
    thread = cp.cpu_profile(seconds, out)
    time.sleep(0.5)
    t = time.monotonic()
    bind_block(client, pods, threads)
    took = time.monotonic() - t
    thread.join()
    print(f"# profile {out}: {len(pods)} binds in {took:.1f} s of its {seconds} s", file=sys.stderr)


def encode_cost_us(reps: int = 20000) -> dict[str, float]:
    """Microseconds to build one request body (no network): orjson of the dict vs the hand encoder."""
    ann = annotations(3)
    json_us = min(
        timeit.repeat(lambda: orjson.dumps(binding_json("ns", "p000001", "uid-1", "node-001", ann)), number=reps)
    )
    proto_us = min(
        timeit.repeat(lambda: kubeproto.binding_body("ns", "p000001", "uid-1", "node-001", ann), number=reps)
    )
    return {"json": json_us / reps * 1e6, "protobuf": proto_us / reps * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=8, help="alternating blocks, A B B A ... (even)")
    ap.add_argument("--threads", type=int, default=8, help="binds in flight at once")
    ap.add_argument("--pprof", type=Path, help="also profile kube-apiserver over N more binds per encoding, here")
    ap.add_argument(
        "--bare",
        action="store_true",
        help="compare protobuf Bindings with our annotations against "
        "protobuf ones without (kube-scheduler's own Binding), instead of JSON against protobuf",
    )
    args = ap.parse_args()
    blocks = max(2, args.blocks - args.blocks % 2)
    with bench_cluster(NAMESPACE, profiling=args.pprof is not None) as (cp, admin):

        def create(i: int) -> tuple[str, str]:
            name = f"p{i:06d}"
            pod = admin.request(
                "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=gpu_pod(NAMESPACE, name, "nobody", 1 + i % 8)
            )
            return name, pod["metadata"]["uid"]

        t = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            pods = list(pool.map(create, range(args.pods * (3 if args.pprof else 1))))
        pods, extra = pods[: args.pods], pods[args.pods :]
        print(f"# {len(pods)} unbound pods created in {time.monotonic() - t:.1f} s", file=sys.stderr)
        time.sleep(2.0)  # let the API server settle after the creates
        apiserver, etcd = cp._apiserver, cp._etcd
        assert apiserver is not None and etcd is not None
        first = "bare" if args.bare else "json"  # A: bare (no annotations) or json; B: protobuf, as the extender binds
        clients = {
            first: ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), protobuf_binding=args.bare),
            "protobuf": ApiServerClient.from_kubeconfig(str(cp.admin_kubeconfig), protobuf_binding=True),
        }
        for c in clients.values():  # open the connections (TLS) outside the measure
            c.request("GET", "/version")
        totals = {k: {"apiserver": 0.0, "etcd": 0.0, "client": 0.0, "wall": 0.0, "binds": 0} for k in clients}
        size = len(pods) // blocks
        for b in range(blocks):
            kind = first if b % 4 in (0, 3) else "protobuf"  # A B B A A B B A ...
            block = pods[b * size : (b + 1) * size]
            a0, e0, c0, w0 = cpu_s(apiserver.pid), cpu_s(etcd.pid), self_cpu_s(), time.monotonic()
            bind_block(clients[kind], block, args.threads, bare=kind == "bare")
            tot = totals[kind]
            tot["apiserver"] += cpu_s(apiserver.pid) - a0
            tot["etcd"] += cpu_s(etcd.pid) - e0
            tot["client"] += self_cpu_s() - c0
            tot["wall"] += time.monotonic() - w0
            tot["binds"] += len(block)
            print(
                f"# block {b} {kind:8s} {len(block)} binds: apiserver {(cpu_s(apiserver.pid) - a0):.2f} s",
                file=sys.stderr,
            )
        if args.pprof:
            args.pprof.mkdir(parents=True, exist_ok=True)
            half = len(extra) // 2
            for kind, part in ((first, extra[:half]), ("protobuf", extra[half:])):
                profile_binds(cp, clients[kind], part, args.threads, args.pprof / f"apiserver-{kind}.pb.gz")
        assert clients["protobuf"].protobuf_binding, "the API server refused protobuf: nothing was compared"
        listed = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
        bound = sum(1 for p in listed if p["spec"].get("nodeName") and (p["metadata"].get("annotations") or {}))
        plain = sum(1 for p in listed if p["spec"].get("nodeName") and not (p["metadata"].get("annotations") or {}))
    print(
        f"pods {args.pods}, blocks {blocks} (A B B A), threads {args.threads}, bound with annotations: {bound}, "
        f"without: {plain}"
    )
    print(f"{'encoding':10s} {'binds':>6s} {'apiserver ms':>13s} {'etcd ms':>8s} {'client ms':>10s} {'binds/s':>8s}")
    per = {}
    for kind, tot in totals.items():
        n = tot["binds"]
        per[kind] = {k: tot[k] / n * 1000 for k in ("apiserver", "etcd", "client")}
        print(
            f"{kind:10s} {n:6d} {per[kind]['apiserver']:13.3f} {per[kind]['etcd']:8.3f} {per[kind]['client']:10.3f}"
            f" {n / tot['wall']:8.0f}"
        )
    sums = {k: sum(v.values()) for k, v in per.items()}
    print(
        "protobuf/{}: apiserver {:.3f}, etcd {:.3f}, client {:.3f}, all three {:.3f} ({:+.3f} ms per bind)".format(
            first,
            *(per["protobuf"][k] / per[first][k] for k in ("apiserver", "etcd", "client")),
            sums["protobuf"] / sums[first],
            sums["protobuf"] - sums[first],
        )
    )
    enc = encode_cost_us()
    print(f"body alone (no network): json {enc['json']:.2f} us, protobuf {enc['protobuf']:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
