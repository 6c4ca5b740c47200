"""`share-sim timeline`: the trace's timing columns, the JSON schema, the table and the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from share_scheduler.sim import cli
from share_scheduler.sim import engine
from share_scheduler.sim.workload import QOS_PRIORITY
from share_scheduler.sim.workload import WorkloadError
from share_scheduler.sim.workload import load_openb
from share_scheduler.sim.workload import load_yaml

EXAMPLE = Path(engine.__file__).parent / "examples" / "inference-cluster.yaml"
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
CLASS_KEYS = {"pods", "waited_pct", "p50_s", "p99_s", "max_s", "waiting_at_end"}


def write_openb(tmp_path: Path, pods: list[str]) -> tuple[Path, Path]:
    n = tmp_path / "nodes.csv"
    p = tmp_path / "pods.csv"
    n.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,100000,4,T4\nn1,64000,100000,2,T4\n")
    p.write_text(HEADER + "\n" + "\n".join(pods) + "\n")
    return n, p


def test_openb_timing_columns_become_priority_duration_and_creation(tmp_path):
    n, p = write_openb(
        tmp_path,
        [
            "ls,1000,10,1,500,,LS,Running,100,7300,160",
            "be,1000,10,1,1000,,BE,Failed,200,500,250",
            "burst,1000,10,2,1000,,Burstable,Succeeded,300,400,310",
            "pending,1000,10,1,1000,,BE,Pending,400,450,",
            "guaranteed,1000,10,0,0,,Guaranteed,Running,500,900,500",
        ],
    )
    pods = load_openb(n, p).pods
    assert [x.priority for x in pods] == [2, 0, 1, 0, 2]
    assert QOS_PRIORITY["LS"] > QOS_PRIORITY["Burstable"] > QOS_PRIORITY["BE"]
    assert [x.duration for x in pods] == [7140.0, 250.0, 90.0, None, 400.0]
    assert [x.created for x in pods] == [100.0, 200.0, 300.0, 400.0, 500.0]


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ("x,1000,10,1,500,,Urgent,Running,0,10,0", "unknown qos 'Urgent'"),
        ("x,1000,10,1,500,,LS,Running,0,10,20", "deletion_time 10 is before scheduled_time 20"),
        ("x,1000,10,1,500,,LS,Running,0,soon,0", "'deletion_time' is not a number"),
        ("x,1000,10,1,500,,LS,Running,-5,10,0", "'creation_time' must be a finite non-negative"),
    ],
)
def test_bad_timing_columns_name_the_line_and_the_problem(tmp_path, row, error):
    n, p = write_openb(tmp_path, [row])
    with pytest.raises(WorkloadError, match=error) as exc:
        load_openb(n, p)
    assert "pods.csv:2" in str(exc.value)


def test_a_pod_list_without_timing_columns_still_loads(tmp_path):
    n = tmp_path / "nodes.csv"
    p = tmp_path / "pods.csv"
    n.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,100000,4,T4\n")
    p.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\nx,1000,10,1,500,\n")
    (pod,) = load_openb(n, p).pods
    assert (pod.priority, pod.duration, pod.created) == (0, None, None)


def test_yaml_pods_take_duration_and_priority(tmp_path):
    pods = {x.name: x for x in load_yaml(EXAMPLE).pods}
    assert pods["trainer"].duration == 43200 and pods["trainer"].priority == 0
    assert pods["api"].priority == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [{gpus: 1, gpu_memory: 16}]\npods: [{gpu_memory: 4, priority: high}]\n")
    with pytest.raises(WorkloadError, match="'priority' must be an integer"):
        load_yaml(bad)
    bad.write_text("nodes: [{gpus: 1, gpu_memory: 16}]\npods: [{gpu_memory: 4, duration: -3}]\n")
    with pytest.raises(WorkloadError, match="'duration' must be a non-negative number"):
        load_yaml(bad)


def timeline(capsys, *extra: str) -> tuple[int, str, str]:
    rc = cli.main(["timeline", "--yaml", str(EXAMPLE), "--days", "1", "--warmup-days", "0.25", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_last_line_is_one_object_in_the_issues_shape(capsys):
    rc, out, _ = timeline(capsys, "--policy", "bestfit", "--rho", "0.9", "--seeds", "2", "--json")
    assert rc == 0
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["policy"] == "bestfit" and doc["rho"] == 0.9
    assert [s["seed"] for s in doc["seeds"]] == [0, 1]
    mean = doc["mean"]
    assert set(mean["classes"]) == {"share", "whole", "multi", "cpu"}
    for entry in [mean, *doc["seeds"]]:
        assert {"alloc_pct", "classes", "free_while_waiting_pct"} <= set(entry)
        assert set(entry) - {"seed"} == set(mean)
        for figures in entry["classes"].values():
            assert set(figures) == CLASS_KEYS
    assert 0 < mean["alloc_pct"] < 100
    assert mean["alloc_pct"] == pytest.approx(sum(s["alloc_pct"] for s in doc["seeds"]) / 2, abs=0.002)


def test_several_policies_and_loads_print_one_object_a_line_policy_then_load(capsys):
    rc, out, _ = timeline(capsys, "--policy", "binpack,random", "--rho", "0.8,1.2", "--seeds", "1", "--json")
    assert rc == 0
    docs = [json.loads(line) for line in out.strip().splitlines()]
    assert [(d["policy"], d["rho"]) for d in docs] == [
        ("binpack", 0.8),
        ("binpack", 1.2),
        ("random", 0.8),
        ("random", 1.2),
    ]


def test_workers_take_the_costliest_runs_first_and_the_figures_come_back_in_the_tasks_order(capsys):
    """`--jobs 2` submits frag before fgd before the rest (the costliest first, so no worker idles long at
    the end) and still prints policy then load, each row the figures one worker alone gives."""
    from share_scheduler.sim import timeline_cli

    args = ["--policy", "random,frag,bestfit", "--rho", "0.8,1.2", "--seeds", "2", "--json"]
    rc, alone, _ = timeline(capsys, *args)
    assert rc == 0
    submitted = []
    real_pool = timeline_cli.ProcessPoolExecutor

    class Recording(real_pool):
        def submit(self, fn, *a, **kw):
            submitted.append((a[1], a[3]))  # (policy, rho) of run_one's arguments
            return super().submit(fn, *a, **kw)

    timeline_cli.ProcessPoolExecutor = Recording
    try:
        rc, pooled, _ = timeline(capsys, *args, "--jobs", "2")
    finally:
        timeline_cli.ProcessPoolExecutor = real_pool
    assert rc == 0
    assert [p for p, _ in submitted] == ["frag"] * 4 + ["bestfit"] * 4 + ["random"] * 4
    assert submitted[:4] == [("frag", 1.2), ("frag", 1.2), ("frag", 0.8), ("frag", 0.8)]

    def figures(out: str) -> list[dict]:
        docs = [json.loads(line) for line in out.strip().splitlines()]
        for d in docs:
            d.pop("seconds_per_seed")
        return docs

    assert [(d["policy"], d["rho"]) for d in figures(pooled)] == [
        (p, r) for p in ("random", "frag", "bestfit") for r in (0.8, 1.2)
    ]
    assert figures(pooled) == figures(alone)


def test_table_and_plot(capsys, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    png = tmp_path / "timeline.png"
    rc, out, _ = timeline(capsys, "--policy", "bestfit,frag", "--rho", "1.0", "--seeds", "1", "--plot", str(png))
    assert rc == 0
    lines = out.splitlines()
    assert any(line.startswith("bestfit") for line in lines) and any(line.startswith("frag") for line in lines)
    assert f"plot: {png}" in out
    pixels = image.imread(str(png))
    height, width = pixels.shape[:2]
    assert width >= 600 and height >= 400
    rgb = pixels[..., :3]
    assert rgb.min() < 0.5 < rgb.max()  # something was drawn on the white page
    assert (rgb.std(axis=2) > 0.1).mean() > 0.001  # and some of it in colour (the curves)


def test_replay_runs_the_traces_own_arrivals(capsys, tmp_path):
    n, p = write_openb(
        tmp_path,
        [
            "a,1000,10,1,500,,LS,Running,0,3600,0",
            "b,1000,10,2,1000,,BE,Running,60,7200,60",
            "c,1000,10,4,1000,,BE,Running,120,7200,120",
            "d,1000,10,1,1000,,BE,Pending,130,140,",
        ],
    )
    args = ["--replay", "10", "--days", "0.5", "--warmup-days", "0", "--seeds", "1", "--json"]
    rc = cli.main(["timeline", "--nodes", str(n), "--pods", str(p), *args])
    out = capsys.readouterr()
    assert rc == 0
    assert "left out 1 of 4 pods with no duration" in out.err
    doc = json.loads(out.out.strip().splitlines()[-1])
    assert doc["rho"] is None and doc["replay"] == 10
    # Times / 10: a at 0, b at 6, c at 12. Best-fit puts a (half a GPU) on n1 (it leaves less free GPU
    # there), b (2 GPUs) on n0, the only node with 2 whole GPUs; c (4 GPUs) fits only n0, so it waits
    # until b leaves at 6 + 7140 = 7146: a wait of 7134 s.
    assert doc["mean"]["arrivals"] == 3 and doc["mean"]["classes"]["cpu"]["pods"] == 0
    multi = doc["mean"]["classes"]["multi"]
    assert (multi["pods"], multi["waited_pct"], multi["max_s"], multi["p50_s"]) == (2, 50.0, 7134.0, 0.0)
    assert doc["mean"]["classes"]["share"]["waited_pct"] == 0.0


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--rho", "0.9", "--replay", "4"], "not both"),
        (["--rho", "fast"], "--rho must be comma-separated numbers"),
        (["--rho", "0"], "--rho must be positive"),
        (["--warmup-days", "3"], "--warmup-days must be at least 0 and less than --days"),
        (["--policy", "nope"], "unknown policy nope"),
    ],
)
def test_bad_options_are_refused(capsys, args, error):
    with pytest.raises(SystemExit) as exc:
        cli.main(["timeline", "--yaml", str(EXAMPLE), *args])
    assert exc.value.code == 2
    assert error in capsys.readouterr().err


def test_the_atc_invocation_is_unchanged(capsys):
    assert cli.main(["--yaml", str(EXAMPLE), "--policy", "binpack", "--seeds", "1", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["policy"] == "binpack" and "100" in row["unallocated_pct"]
