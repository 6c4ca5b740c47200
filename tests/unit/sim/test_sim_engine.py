"""The simulator: protocol on tiny traces, inputs, CLI, and that it runs the extender's policy code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import share_placement as placement
from share_placement import BinpackPolicy
from share_placement import Demand
from share_placement import GpuSlot
from share_placement import NodeState
from share_placement import node_view
from share_scheduler.sim import cli
from share_scheduler.sim import engine
from share_scheduler.sim.engine import build_policy
from share_scheduler.sim.engine import run_policy
from share_scheduler.sim.engine import simulate
from share_scheduler.sim.workload import Workload
from share_scheduler.sim.workload import WorkloadError
from share_scheduler.sim.workload import load_openb
from share_scheduler.sim.workload import load_yaml

EXAMPLE = Path(engine.__file__).parent / "examples" / "inference-cluster.yaml"
OPENB = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "openb"


def write_openb(tmp_path: Path, nodes: list[str], pods: list[str]) -> tuple[Path, Path]:
    n = tmp_path / "nodes.csv"
    p = tmp_path / "pods.csv"
    n.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "\n".join(nodes) + "\n")
    p.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        + "\n".join(pods)
        + "\n"
    )
    return n, p


def test_protocol_on_a_tiny_trace(tmp_path):
    # One node, 2 GPUs (2000 units); every pod asks 600 of one GPU. Draws: 600, 1200 placed (one per
    # GPU: 400 left on each), then 1800, 2400, 3000 fail; stop at >= 1.3 x 2000 = 2600.
    n, p = write_openb(tmp_path, ["n0,8000,1000,2,T4"], ["p0,1000,10,1,600,,LS,Running,0,1,0"])
    w = load_openb(n, p)
    assert w.gpu_capacity == 2000 and w.gpu_count == 2
    r = run_policy(w, "binpack", seed=0)
    assert (r.arrivals, r.placed, r.failed) == (5, 2, 3)
    assert r.unallocated_pct == {"90": pytest.approx(40), "95": pytest.approx(40), "100": pytest.approx(40), "130": 40}
    assert sorted(f for _, f in r.final[0][0]) == [400, 400]
    assert r.final[0][1] == 6000  # CPU taken by the two placed pods


def test_multi_gpu_whole_gpus_model_constraint_and_cpu_only(tmp_path):
    n, p = write_openb(
        tmp_path,
        ["a,64000,100000,4,V100M16", "b,64000,100000,2,T4"],
        [
            "multi,1000,10,4,1000,V100M16|V100M32,LS,Running,0,1,0",  # whole GPUs, V100 only
            "cpu,1000,10,0,0,,LS,Running,0,1,0",  # CPU only: asks no GPU
        ],
    )
    w = load_openb(n, p)
    multi, cpu = w.pods
    assert (multi.per_gpu, multi.count, multi.models) == (1000, 4, ("v100m16", "v100m32"))
    assert (cpu.per_gpu, cpu.count, cpu.gpu_request) == (0, 0, 0)
    for name in placement.POLICIES:
        r = run_policy(w, name, seed=1)
        a, b = r.final
        assert [f for _, f in b[0]] == [1000, 1000]  # the T4 node never gets the V100 pod
        assert [f for _, f in a[0]] == [0, 0, 0, 0]  # it took all four V100s
        assert r.unallocated_pct["100"] == pytest.approx(100 * 2000 / 6000)
        used_cpu = (64000 - a[1]) + (64000 - b[1])
        assert used_cpu == 1000 * r.placed  # CPU-only pods placed too


def test_cpu_fit_is_enforced(tmp_path):
    # Two GPUs but CPU for only one pod on the node.
    n, p = write_openb(tmp_path, ["n0,10000,100000,2,G2"], ["p0,6000,10,1,1000,,LS,Running,0,1,0"])
    r = run_policy(load_openb(n, p), "frag", seed=0)
    assert r.placed == 1 and r.unallocated_pct["100"] == pytest.approx(50)


def test_bestfit_breaks_ties_at_random_like_kube_scheduler(tmp_path):
    # Four identical empty nodes: every node ties for the first pod. binpack takes the first node;
    # bestfit picks one uniformly at random (seeded; the arrival order is the same stream either way).
    n, p = write_openb(tmp_path, [f"n{i},8000,1000,2,T4" for i in range(4)], ["p0,1000,10,1,600,,LS,Running,0,1,0"])
    w = load_openb(n, p)
    first = {}
    for seed in range(12):
        r = simulate(w, build_policy("bestfit", seed, w), seed, tune=600 / w.gpu_capacity)
        assert r.arrivals == 1
        (taken,) = [k for k, v in enumerate(r.final) if v[1] != 8000]
        first[seed] = taken
        assert simulate(w, build_policy("binpack", seed, w), seed, tune=600 / w.gpu_capacity).final[0][1] == 7000
    assert len(set(first.values())) > 1
    again = simulate(w, build_policy("bestfit", 5, w), 5, tune=600 / w.gpu_capacity)
    assert [k for k, v in enumerate(again.final) if v[1] != 8000] == [first[5]]
    # Later pods still go to the best score: the half-used node (tighter) beats the empty ones.
    r = simulate(w, build_policy("bestfit", 0, w), 0, tune=1200 / w.gpu_capacity)
    assert sum(1 for v in r.final if v[1] != 8000) == 1


def test_bestfit_normalises_by_the_largest_node():
    # The paper's constants are the openb cluster's largest node: 128 cores, 8 GPUs x 1000 units.
    w = load_openb(OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv")
    policy = build_policy("bestfit", 0, w)
    assert (policy.cpu_spec, policy.gpu_spec) == (placement.BestFitPolicy.CPU_SPEC, placement.BestFitPolicy.GPU_SPEC)
    y = load_yaml(EXAMPLE)  # GiB: 8 x 80 GiB, 96 cores
    policy = build_policy("bestfit", 0, y)
    assert policy.gpu_spec == 640 and policy.cpu_spec == max(n.cpu for n in y.nodes)


def test_seeds_are_reproducible_and_differ(tmp_path):
    w = load_yaml(EXAMPLE)
    a = run_policy(w, "frag", seed=3)
    b = run_policy(w, "frag", seed=3)
    c = run_policy(w, "frag", seed=4)
    assert a.unallocated_pct == b.unallocated_pct and a.curve == b.curve
    assert (a.arrivals, a.curve) != (c.arrivals, c.curve)


def test_simulator_resolves_policies_through_placement_registry(monkeypatch):
    """The simulator builds policies with placement.make_policy/POLICIES and decides with their evaluate()."""
    calls: list[tuple] = []
    made: list[object] = []

    class Spy(BinpackPolicy):
        def __init__(self) -> None:
            made.append(self)

        def evaluate(self, view, demand):
            calls.append((view, demand))
            return super().evaluate(view, demand)

    monkeypatch.setitem(placement.POLICIES, "binpack", Spy)
    w = load_yaml(EXAMPLE)
    r = run_policy(w, "binpack", seed=0)
    assert len(made) == 1 and calls
    assert all(isinstance(d, Demand) for _, d in calls)
    assert r.placed > 0


def test_simulator_decisions_match_the_extender_api():
    """Replaying one sim step through NodeState + Policy.score/choose (what the extender calls) agrees."""
    w = load_yaml(EXAMPLE)
    policy = build_policy("frag", 0, w)
    demand = w.pods[0].demand()
    views = [(tuple((n.model, g) for g in n.gpus), n.cpu, n.memory) for n in w.nodes]
    states = [
        NodeState(
            n.name,
            tuple(GpuSlot(i, m, t, f) for i, ((m, f), t) in enumerate(zip(v[0], n.gpus, strict=True))),
            v[1],
            v[2],
        )
        for n, v in zip(w.nodes, views, strict=True)
    ]
    best = placement.best_node(states, demand, policy)
    assert best is not None
    i = states.index(best)
    ev = policy.evaluate(views[i], demand)
    assert ev is not None and policy.score(best, demand) == ev[0]
    assert policy.choose(best, demand) == tuple(node_view(best)[1][p] for p in ev[1])
    # and the simulator, taking one pod of that demand, picks the same node and GPUs
    one = Workload(w.nodes, (w.pods[0],), unit="GiB")
    r = simulate(one, policy, seed=0, tune=demand.per_gpu / one.gpu_capacity)
    assert r.arrivals == 1
    changed = [k for k, v in enumerate(r.final) if v != views[k]]
    assert changed == [i]
    assert [p for p, (a, b) in enumerate(zip(r.final[i][0], views[i][0], strict=True)) if a != b] == list(ev[1])


def test_yaml_example_loads():
    w = load_yaml(EXAMPLE)
    assert w.unit == "GiB"
    assert len(w.nodes) == 6 and w.gpu_count == 36
    assert w.nodes[0].gpus == (80,) * 8 and w.nodes[0].cpu == 96000 and w.nodes[0].memory == 1024 * 1024
    kinds = {p.name: p for p in w.pods}
    assert kinds["trainer"].count == 4 and kinds["trainer"].per_gpu == 80
    assert kinds["embedder"].models == ("l4",)
    assert kinds["api"].count == 0
    assert sum(1 for p in w.pods if p.name == "chat-small") == 6  # weight


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: []\npods: []\n", "at least one node"),
        ("- a\n", "expected a mapping"),
        ("nodes: [{gpus: 2}]\npods: [{gpu_memory: 1}]\n", "'gpu_memory' is required"),
        ("nodes: [{gpus: 1, gpu_memory: 8}]\npods: [{gpu_memory: -1}]\n", "non-negative"),
        ("nodes: [{gpus: 1, gpu_memory: 8}]\npods: [{gpu_memory: 1.5}]\n", "whole number"),
        ("nodes: [\n", "not valid YAML"),
    ],
)
def test_yaml_errors_name_the_problem(tmp_path, text, message):
    f = tmp_path / "w.yaml"
    f.write_text(text)
    with pytest.raises(WorkloadError, match=message):
        load_yaml(f)


def test_csv_errors_name_the_problem(tmp_path):
    n, p = write_openb(tmp_path, ["n0,x,1,2,T4"], ["p0,1,1,1,100,,LS,Running,0,1,0"])
    with pytest.raises(WorkloadError, match=r"nodes.csv:2: column 'cpu_milli'"):
        load_openb(n, p)


def test_cli_json_schema(capsys):
    assert cli.main(["--yaml", str(EXAMPLE), "--policy", "binpack,frag", "--seeds", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["policy"] for row in out] == ["binpack", "frag"]
    for row in out:
        assert row["seeds"] == 2
        assert set(row["unallocated_pct"]) == {"90", "95", "100", "130"}
        assert all(isinstance(v, float) and 0 <= v <= 100 for v in row["unallocated_pct"].values())


def test_cli_table_and_csv_input(tmp_path, capsys):
    n, p = write_openb(tmp_path, ["n0,8000,1000,2,T4"], ["p0,1000,10,1,600,,LS,Running,0,1,0"])
    assert cli.main(["--nodes", str(n), "--pods", str(p), "--policy", "spread", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "policy" in out and "100%" in out
    assert any(line.startswith("spread") and "40.00" in line for line in out.splitlines())


def test_cli_bad_usage(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--yaml", str(EXAMPLE), "--policy", "nope"])
    assert e.value.code == 2 and "unknown policy nope" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--nodes", "x.csv"])
    assert cli.main(["--nodes", str(tmp_path / "missing.csv"), "--pods", str(tmp_path / "p.csv")]) == 2
    assert "missing.csv" in capsys.readouterr().err


def test_cli_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit, match="pip install"):
        cli.main(["--yaml", str(EXAMPLE), "--policy", "binpack", "--seeds", "1", "--plot", str(tmp_path / "a.png")])


def test_cli_plot_writes_png(tmp_path, capsys):
    import matplotlib  # noqa: F401  (a test dependency: the plot must really be drawn)

    out = tmp_path / "a.png"
    assert cli.main(["--yaml", str(EXAMPLE), "--policy", "binpack,frag", "--seeds", "1", "--plot", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_openb_trace_one_seed_sanity():
    # The trace ships in ../shared beside every checkout, CI's included: missing data fails, never skips.
    assert (OPENB / "openb_pod_list_default.csv").exists(), f"openb trace not found under {OPENB}"
    w = load_openb(OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv")
    assert (len(w.nodes), w.gpu_count, len(w.pods)) == (1213, 6212, 8152)
    assert sum(1 for p in w.pods if p.count == 0) == 1088
    r = run_policy(w, "binpack", seed=0, tune=1.0)
    assert 3.0 < r.unallocated_pct["100"] < 9.0
    assert r.unallocated_pct["130"] is None  # not reached with --tune 1.0
