"""Steps without a model: a plan run as if by the runner (every chunk
computed, a token sampled where asked), and its result applied by the
scheduler's update."""

from __future__ import annotations

from llmctl.runtime.engine.plan import Sampled, StepOutput, StepPlan, StepResult
from llmctl.runtime.engine.scheduler import Scheduler


def run_plan(s: Scheduler, plan: StepPlan, token: int = 7) -> StepOutput:
    result = StepResult()
    for w in plan:
        r = result.of(w.seq)
        r.computed += len(w.tokens)
        if w.sample:
            r.sampled.append(Sampled(token, b"x", False))
    return s.update(plan, result)
