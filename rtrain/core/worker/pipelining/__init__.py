"""rtrain.core.worker.pipelining: ReCycle for torch.distributed.pipelining users.

    stage = recycle_stage(my_stage_module)          # or your own PipelineStage
    schedule = ScheduleReCycle(stage, n_microbatches=8, loss_fn=loss_fn)
    schedule.step(x, target=y, batch_of=load_batch_of_replica)
    optimizer.step(); optimizer.zero_grad()

Under rtrain.repairable (repair in place), read the plan and build the stage and the
schedule inside the repairable function: they hold the generation's plan and groups,
and one of an earlier generation is refused (PlanMismatch). Keep each stage's module
and optimizer outside it, by stage: a survivor keeps its position, or moves to a stage
that lost every worker.

Imports torch (unlike rtrain.core itself): import it from the training script.
"""

from .plan_checks import PlanMismatch
from .schedule import OpTiming, ScheduleReCycle, recycle_stage
from .wire import WireError

__all__ = ["OpTiming", "PlanMismatch", "ScheduleReCycle", "WireError", "recycle_stage"]
