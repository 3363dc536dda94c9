"""Cases for the calibration tests, run on every rank of a bare pool."""
import torch.distributed as dist

from tests.parallel.dp_cases import _init


def case_discover(ctx, islands, window: float):
    """The view every rank builds with calibration on: its ratios, and the curves' values at the
    calibration sizes next to the uncorrected model's."""
    from hcomm.parallel import calibration
    from hcomm.parallel.cluster import discover, interpolated, sample_allreduce, sample_sharded

    groups = _init(ctx, islands)
    try:
        view = discover(groups.default, groups.hcomm, groups.island, profiles=[None] * ctx.world,
                        optimizer_s=[0.0] * ctx.world, calibrate_s=window, baseline=True)
        sizes = calibration.CALIBRATION_BYTES
        model = {"all_reduce": interpolated(sample_allreduce(groups.hcomm)),
                 "all_gather_v": interpolated(sample_sharded(groups.hcomm, "all_gather_v")),
                 "reduce_scatter_v": interpolated(sample_sharded(groups.hcomm, "reduce_scatter_v")),
                 calibration.BASELINE_OP: interpolated(sample_allreduce(groups.hcomm, "ring"))}
        curves = {"all_reduce": view.allreduce_s, "all_gather_v": view.gather_s,
                  "reduce_scatter_v": view.reduce_scatter_s, calibration.BASELINE_OP: view.baseline_allreduce_s}
        values = {op: [(curves[op](n), model[op](n)) for n in sizes] for op in model}
        plain = discover(groups.default, groups.hcomm, groups.island, profiles=[None] * ctx.world,
                         optimizer_s=[0.0] * ctx.world, calibrate_s=0.0)
        return (view.calibration, values, plain.calibration,
                ([plain.allreduce_s(n) for n in sizes], [plain.baseline_allreduce_s(n) for n in sizes]),
                (view.island_meeting_s, plain.island_meeting_s), (view.cpu_share, plain.cpu_share))
    finally:
        dist.destroy_process_group()
