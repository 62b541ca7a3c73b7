"""Normal pauses vs hangs: is the rank everybody waits for doing something jobs do?

Every real job stops communicating now and then: rank 0 saves a checkpoint while the
others wait in a barrier, all ranks evaluate, a data loader refills. The wait-for graph
diagnoses these exactly like a hang (the holder is `not_entered`, its stack says where);
this module decides whether that is worth a page. A pause is *normal* when the holder's
stack matches an expected phase (checkpoint save, evaluation, data loading: configurable
patterns, each with a budget) or when this job has paused the same way before (same
holder rank, same stack) and resumed. A normal pause is `info` until it outlasts its
budget, then it is a hang like any other (`critical`).

Pure functions; the learned pauses live in the job's state (`JobState.pauses`), written
by the engine when a pause resolves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..config import COMPILATION, AnalysisConfig, Phase
from ..ingest.state import LearnedPause


@dataclass(frozen=True, slots=True)
class PauseVerdict:
    phase: str  # the phase name, or "learned" / "budget"
    budget_s: float
    age_s: float
    why: str

    @property
    def within_budget(self) -> bool:
        return self.age_s <= self.budget_s


def stack_signature(stack: str, frames: int = 4) -> str:
    """The innermost frames without line numbers: the same pause again has the same signature."""
    lines = [line.strip() for line in stack.strip().splitlines() if line.strip()]
    return "|".join(re.sub(r":\d+ in ", " in ", line) for line in lines[-frames:])


def match_phase(stack: str, phases: tuple[Phase, ...]) -> Phase | None:
    """The expected phase the stack is in (innermost frame first), if any."""
    lines = [line.strip() for line in stack.strip().splitlines() if line.strip()]
    if not lines:
        return None
    eligible = [phase for phase in phases if not phase.innermost or re.search(phase.innermost, lines[-1])]
    for line in reversed(lines):
        for phase in eligible:
            if re.search(phase.pattern, line, flags=re.IGNORECASE) and \
                    not (phase.unless and re.search(phase.unless, line, flags=re.IGNORECASE)):
                return phase
    return None


def reported_phase(compiling: bool, phases: tuple[Phase, ...]) -> Phase | None:
    """The expected phase a rank said it is in: compiling (Dynamo's callbacks) is `compilation`
    whatever its stack shows at that instant, while the configuration keeps that phase."""
    if not compiling:
        return None
    return next((phase for phase in phases if phase.name == COMPILATION), None)


def classify(rank: int, stack: str, age_s: float, learned: dict[tuple[int, str], LearnedPause],
             cfg: AnalysisConfig, compiling: bool = False) -> PauseVerdict | None:
    """Is a hang held by `rank` (alive, outside communication, at `stack`) a normal pause?

    None: it is not (no stack, no expected phase, never seen before, no budget set).
    """
    said = reported_phase(compiling, cfg.phases)
    if said is not None:
        return PauseVerdict(said.name, said.budget_s, age_s,
                            f"rank {rank} is compiling (torch.compile); budget {said.budget_s:g}s")
    if stack.strip():
        phase = match_phase(stack, cfg.phases)
        if phase is not None:
            return PauseVerdict(phase.name, phase.budget_s, age_s,
                                f"rank {rank} is in an expected phase ({phase.name}); budget {phase.budget_s:g}s")
        seen = learned.get((rank, stack_signature(stack)))
        if seen is not None:
            budget = min(max(cfg.learned_pause_min_s, cfg.learned_pause_factor * seen.longest_s),
                         cfg.learned_pause_max_s)
            return PauseVerdict("learned", budget, age_s,
                                f"rank {rank} paused here {seen.times} time(s) before and resumed (longest "
                                f"{seen.longest_s:.1f}s); budget {budget:.1f}s")
    if cfg.pause_budget_s > 0:
        return PauseVerdict("budget", cfg.pause_budget_s, age_s,
                            f"within the configured pause budget of {cfg.pause_budget_s:g}s")
    return None


def learn(learned: dict[tuple[int, str], LearnedPause], rank: int, stack: str, duration_s: float,
          limit: int = 64) -> None:
    """Remember a pause that resolved (the job resumed on its own)."""
    if not stack.strip():
        return
    key = (rank, stack_signature(stack))
    seen = learned.get(key)
    if seen is None:
        if len(learned) >= limit:
            del learned[min(learned, key=lambda k: learned[k].times)]
        learned[key] = LearnedPause(rank, key[1], duration_s, 1)
    else:
        learned[key] = LearnedPause(rank, key[1], max(seen.longest_s, duration_s), seen.times + 1)
