"""Workload variants (share-sim --variant) and the paper's arrival order."""

from __future__ import annotations

from pathlib import Path

import pytest

from share_scheduler.sim import cli
from share_scheduler.sim import variants
from share_scheduler.sim.engine import run_policy
from share_scheduler.sim.workload import load_openb

OPENB = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "openb"


@pytest.fixture(scope="module")
def trace():
    assert (OPENB / "openb_pod_list_default.csv").exists(), f"openb trace not found under {OPENB}"
    return load_openb(OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv")


def test_trace_mix(trace):
    m = variants.mix(trace)
    assert (m.pods, m.cpu_only, m.gpu_pods) == (8152, 1088, 7064)
    assert m.share_pct == pytest.approx(100 * 3078 / 7064)
    assert m.multi_demand_pct == pytest.approx(100 * 444000 / (1731800 + 3911000 + 444000))
    assert m.restricted_pct == 0.0


@pytest.mark.parametrize("share", [20, 60, 100])
def test_gpushare_sets_the_share_of_sharing_pods(trace, share):
    v = variants.derive(trace, f"gpushare={share}", seed=0)
    m = variants.mix(v)
    assert m.gpu_pods == 7064 and m.cpu_only == 1088
    assert m.share_pct == pytest.approx(share, abs=0.01)
    assert set(v.pods) <= set(trace.pods)  # only pods the trace really has


@pytest.mark.parametrize("share", [20, 30, 50])
def test_multigpu_sets_the_share_of_gpu_demand(trace, share):
    m = variants.mix(variants.derive(trace, f"multigpu={share}", seed=0))
    assert share <= m.multi_demand_pct < share + 0.2  # one 8-GPU pod is ~0.1 % of the demand
    assert m.cpu_only == 1088


@pytest.mark.parametrize("share", [5, 20, 33])
def test_gpuspec_restricts_that_share_of_gpu_pods_to_models_that_can_serve_them(trace, share):
    v = variants.derive(trace, f"gpuspec={share}", seed=0)
    m = variants.mix(v)
    assert m.restricted_pct == pytest.approx(share, abs=0.05)
    models = {n.model.lower() for n in trace.nodes}
    for pod in v.pods:
        if pod.models:
            assert set(pod.models) <= models
            assert any(
                n.model.lower() in pod.models
                and sum(1 for g in n.gpus if g >= pod.per_gpu) >= pod.count
                and n.cpu >= pod.cpu
                for n in trace.nodes
            ), pod


@pytest.mark.parametrize("factor", [0, 0.5, 3])
def test_cpu_scales_the_cpu_demand_of_cpu_only_pods(trace, factor):
    base = variants.mix(trace).cpu_only_cpu
    m = variants.mix(variants.derive(trace, f"cpu={factor}", seed=0))
    assert m.gpu_pods == 7064
    biggest = max(p.cpu for p in trace.pods if p.count == 0)
    assert factor * base <= m.cpu_only_cpu < factor * base + biggest
    assert (m.cpu_only == 0) == (factor == 0)


def test_variants_are_seeded(trace):
    a = variants.derive(trace, "gpushare=60", seed=1)
    assert a == variants.derive(trace, "gpushare=60", seed=1)
    assert a != variants.derive(trace, "gpushare=60", seed=2)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope=3", "FAMILY=VALUE"),
        ("gpushare", "FAMILY=VALUE"),
        ("gpushare=lots", "not a number"),
        ("cpu=11", "between"),
    ],
)
def test_bad_variants_are_clear_errors(trace, spec, message):
    with pytest.raises(variants.VariantError, match=message):
        variants.derive(trace, spec)


def test_cli_prints_the_mix_and_one_row_per_variant(capsys, tmp_path):
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,100000,4,T4\nn1,64000,100000,4,G2\n")
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "a,1000,10,1,500,,LS,Running,0,1,0\nb,1000,10,1,1000,,LS,Running,0,1,0\n"
        "c,1000,10,2,1000,,LS,Running,0,1,0\nd,2000,10,0,0,,LS,Running,0,1,0\n"
    )
    args = ["--nodes", str(nodes), "--pods", str(pods), "--policy", "binpack,fgd", "--seeds", "1"]
    assert cli.main([*args, "--variant", "gpushare=50,cpu=2"]) == 0
    out, err = capsys.readouterr()
    assert "trace: 4 pods: 1 CPU-only" in err and "variant gpushare=50 (seed 0)" in err and "variant cpu=2" in err
    rows = [line.split() for line in out.splitlines() if line.startswith(("gpushare", "cpu"))]
    assert [r[0] for r in rows] == ["gpushare=50", "cpu=2"] and all(r[-1] in ("binpack", "fgd") for r in rows)
    assert cli.main([*args, "--variant", "gpushare=50"]) == 0
    assert "binpack" in capsys.readouterr().out
    assert cli.main([*args, "--variant", "multigpu=99"]) == 2
    assert "between" in capsys.readouterr().err
    assert cli.variant_specs("doc")[0] == "gpushare=20" and len(cli.variant_specs("doc")) == 12


def test_every_trace_pod_arrives_once_before_any_is_drawn_again(tmp_path):
    # The paper's simulator shuffles the trace and only then appends draws with replacement. With a
    # 600 and a 400 pod on one 1000-unit GPU, both arrive first, so nothing fails by arrived 100 %;
    # drawing with replacement from the start sometimes draws the 600 twice.
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,100000,1,T4\n")
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "a,1000,10,1,600,,LS,Running,0,1,0\nb,1000,10,1,400,,LS,Running,0,1,0\n"
    )
    w = load_openb(nodes, pods)
    assert all(run_policy(w, "binpack", s, tune=1.0).unallocated_pct["100"] == 0 for s in range(8))
    again = [run_policy(w, "binpack", s, tune=1.0, draw="replacement").unallocated_pct["100"] for s in range(8)]
    assert any(u > 0 for u in again)
    with pytest.raises(ValueError, match="unknown draw"):
        run_policy(w, "binpack", 0, draw="nope")
