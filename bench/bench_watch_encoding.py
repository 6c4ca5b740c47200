"""kube-apiserver CPU per pod of the extender's pod watch, in JSON against protobuf, beside a protobuf one.

Issue 11: kube-scheduler's informer watches pods in protobuf; the API server's watch cache encodes
each event once per encoding (CachingObject, k8s.io/apiserver pkg/storage/cacher), so a JSON watcher
beside it makes it encode every pod event a second time, in JSON. This bench keeps one protobuf
watcher open all along (kube-scheduler's stand-in), and in blocks that alternate (A B B A ...) opens
a second watcher, JSON or protobuf (the extender's), then creates and binds a block of pods (the
GPU annotations on each Binding, as the extender sends them) and waits until the second watcher has
seen every event. Prints kube-apiserver and etcd CPU ms per pod per encoding of the second watch
(the watchers' readers only count bytes), and with --pprof a kube-apiserver profile per encoding.

  python bench/bench_watch_encoding.py                 # 2,000 pods, 8 blocks
  python bench/bench_watch_encoding.py --pprof /tmp/pp
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_bind_encoding import annotations  # noqa: E402
from bench_bind_encoding import bench_cluster  # noqa: E402
from bench_bind_encoding import cpu_s  # noqa: E402

from share_core.kube import ApiServerClient  # noqa: E402
from tests.controlplane.barenodes import gpu_pod  # noqa: E402

NAMESPACE = "bench-watch"
JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf;stream=watch"


class Watcher:
    """One pod watch read on a thread; counts events (JSON: lines; protobuf: length-prefixed frames)."""

    def __init__(self, client: ApiServerClient, accept: str, rv: str) -> None:
        headers = client._headers()
        headers["Accept"] = accept
        url = f"{client.host}/api/v1/pods?watch=true&resourceVersion={rv}&timeoutSeconds=600"
        self.resp = client._pool.request("GET", url, headers=headers, preload_content=False)
        self.protobuf = accept != JSON
        self.events = 0
        self.done = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        buf = b""
        try:
            for chunk in self.resp.stream(65536):
                buf += chunk
                if self.protobuf:
                    while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                        buf = buf[4 + int.from_bytes(buf[:4], "big") :]
                        self.events += 1
                else:
                    self.events += buf.count(b"\n")
                    buf = buf[buf.rfind(b"\n") + 1 :]
        except Exception:
            pass
        self.done = True

    def close(self) -> None:
        # Shut the socket down first: closing the response under a blocked reader would wait for it.
        sock = getattr(self.resp.connection, "sock", None)
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(5)
        self.resp.close()


def list_rv(client: ApiServerClient) -> str:
    return client.request("GET", "/api/v1/pods", query={"limit": 1})["metadata"]["resourceVersion"]


def run_block(admin: ApiServerClient, start: int, count: int, threads: int) -> None:
    """Create `count` pods and bind each (ADDED then MODIFIED at every watcher)."""

    def one(i: int) -> None:
        name = f"p{i:06d}"
        pod = admin.request(
            "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=gpu_pod(NAMESPACE, name, "nobody", 1 + i % 8)
        )
        admin.bind_pod(NAMESPACE, name, pod["metadata"]["uid"], f"node-{i % 10:03d}", annotations(i))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(start, start + count)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--pprof", type=Path, help="also a kube-apiserver profile over one more block per encoding")
    args = ap.parse_args()
    blocks = max(2, args.blocks - args.blocks % 2)
    size = args.pods // blocks
    with bench_cluster(NAMESPACE, profiling=args.pprof is not None) as (cp, admin):
        apiserver, etcd = cp._apiserver, cp._etcd
        assert apiserver is not None and etcd is not None
        scheduler_like = Watcher(admin, PROTOBUF, list_rv(admin))
        totals: dict[str, dict[str, Any]] = {
            k: {"apiserver": 0.0, "etcd": 0.0, "pods": 0} for k in ("json", "protobuf")
        }
        plan = [("json" if b % 4 in (0, 3) else "protobuf", b * size) for b in range(blocks)]
        for kind, start in plan:
            second = Watcher(admin, JSON if kind == "json" else PROTOBUF, list_rv(admin))
            time.sleep(0.3)
            a0, e0 = cpu_s(apiserver.pid), cpu_s(etcd.pid)
            run_block(admin, start, size, args.threads)
            deadline = time.monotonic() + 30
            while second.events < 2 * size and time.monotonic() < deadline:
                time.sleep(0.01)
            totals[kind]["apiserver"] += cpu_s(apiserver.pid) - a0
            totals[kind]["etcd"] += cpu_s(etcd.pid) - e0
            totals[kind]["pods"] += size
            print(f"# {kind:8s} block: {second.events} events at the second watcher", file=sys.stderr)
            second.close()
        if args.pprof:
            args.pprof.mkdir(parents=True, exist_ok=True)
            start = blocks * size
            for kind in ("json", "protobuf"):
                second = Watcher(admin, JSON if kind == "json" else PROTOBUF, list_rv(admin))
                time.sleep(0.3)
                seconds = size // 150 + 3  # creates and binds run at ~250 pods/s here: the profile outlasts them
                thread = cp.cpu_profile(seconds, args.pprof / f"apiserver-watch-{kind}.pb.gz")
                time.sleep(0.5)
                t = time.monotonic()
                run_block(admin, start, size, args.threads)
                print(
                    f"# profile {kind}: {size} pods in {time.monotonic() - t:.1f} s of its {seconds} s", file=sys.stderr
                )
                start += size
                thread.join()
                second.close()
        scheduler_like.close()
    print(f"pods {args.pods}, blocks {blocks} (A B B A), threads {args.threads}; a protobuf watcher all along")
    print(f"{'2nd watch':10s} {'pods':>6s} {'apiserver ms/pod':>17s} {'etcd ms/pod':>12s}")
    per = {}
    for kind, tot in totals.items():
        per[kind] = {k: tot[k] / tot["pods"] * 1000 for k in ("apiserver", "etcd")}
        print(f"{kind:10s} {tot['pods']:6d} {per[kind]['apiserver']:17.3f} {per[kind]['etcd']:12.3f}")
    d = per["json"]["apiserver"] - per["protobuf"]["apiserver"]
    ratio = per["protobuf"]["apiserver"] / per["json"]["apiserver"]
    print(f"protobuf/json apiserver {ratio:.3f} ({d:+.3f} ms per pod saved)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
