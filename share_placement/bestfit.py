"""The FGD paper's Best-fit baseline, scored as its simulator scores it."""

from __future__ import annotations

from share_placement.binpack import best_fit
from share_placement.model import Demand
from share_placement.model import Evaluation
from share_placement.model import NodeView
from share_placement.model import ViewPolicy
from share_placement.model import eligible_positions


class BestFitPolicy(ViewPolicy):
    """The FGD paper's Best-fit baseline: the node left with the least weighted free CPU and GPU.

    Node score, as in the paper's simulator (kubernetes-scheduler-simulator, ``BestFitScore``):
    ``100 * (1 - (0.5 * cpu_left / cpu_spec + 0.5 * gpu_left / gpu_spec))`` truncated to an integer,
    where ``*_left`` is the node's free CPU and total free GPU after the pod and ``cpu_spec``/``gpu_spec``
    are the largest node's (128 cores and 8 GPUs of 1000 units in the paper). The integer score leaves
    many ties, which kube-scheduler breaks uniformly at random (``random_ties``): the simulator does the
    same, and in the extender kube-scheduler does it itself. GPUs on the node: the one left with the
    least room for a share pod, the lowest-indexed free ones for whole-GPU pods (lowest index on ties).

    Without CPU information (``cpu_free`` None, as in the extender) the score is the GPU term alone,
    unquantised: the node left with the least free GPU, in whatever unit the caller counts.
    """

    name = "bestfit"
    # Equal scores are broken uniformly at random by the caller (kube-scheduler's selectHost).
    random_ties = True
    # The paper's normalisers (millicores, milli-GPU) and weights.
    CPU_SPEC = 128_000
    GPU_SPEC = 8_000

    def __init__(
        self, cpu_spec: int = CPU_SPEC, gpu_spec: int = GPU_SPEC, cpu_weight: float = 0.5, levels: int = 100
    ) -> None:
        if cpu_spec <= 0 or gpu_spec <= 0 or not 0.0 <= cpu_weight <= 1.0 or levels <= 0:
            raise ValueError("bestfit: cpu_spec, gpu_spec and levels must be positive, cpu_weight in [0, 1]")
        self.cpu_spec = cpu_spec
        self.gpu_spec = gpu_spec
        self.cpu_weight = cpu_weight
        self.levels = levels

    def evaluate(self, view: NodeView, demand: Demand) -> Evaluation:
        elig = eligible_positions(view, demand)
        if elig is None:
            return None
        gpus, cpu_free, _ = view
        chosen = best_fit(view, elig, demand.count)
        gpu_left = sum(f for _, f in gpus) - demand.per_gpu * demand.count
        if cpu_free is None:
            return -float(gpu_left), chosen
        # Same operations in the same order as the paper's Go code, so truncation agrees at the edges.
        left = (cpu_free - demand.cpu) / self.cpu_spec * self.cpu_weight
        left += gpu_left / self.gpu_spec * (1.0 - self.cpu_weight)
        return float(int((1.0 - left) * self.levels)), chosen
