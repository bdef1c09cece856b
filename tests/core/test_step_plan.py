"""The rungs of a lazy cache and the tokens each holds: one computation (memory.rung_cells) for the
Settings estimate and the memory panel, which shows what the engine reports (issue 30, defect 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import plan_context, rung_cells
from lazykv.core.engine.model_meta import read_model_meta
from lazykv.core.kinds import KvMode, KvPhase

F16, Q8, Q4 = KvPhase.F16, KvPhase.Q8_0, KvPhase.Q4_0


def test_the_steps_are_laid_out_as_the_engine_lays_them_out() -> None:
    # a step holds what its rows fit in the cache's memory, down to 256s from 256 on
    assert rung_cells(512, KvMode.LADDER) == ((F16, 144), (Q8, 256), (Q4, 512))
    assert rung_cells(1024, KvMode.LADDER) == ((F16, 256), (Q8, 512), (Q4, 1024))
    assert rung_cells(4096, KvMode.LAZY) == ((F16, 2048), (Q8, 4096))
    assert rung_cells(256, KvMode.LAZY) == ((F16, 136), (Q8, 256))
    assert rung_cells(4096, KvMode.F16) == rung_cells(4096, KvMode.Q8_0) == ()


@pytest.mark.parametrize(("kv_mode", "n_ctx"),
                         [(KvMode.LADDER, 512), (KvMode.LAZY, 512), (KvMode.LADDER, 1280)])
def test_the_planner_s_steps_are_the_ones_the_loaded_cache_reports(
    smollm2_path: Path, kv_mode: KvMode, n_ctx: int
) -> None:
    plan = plan_context(read_model_meta(smollm2_path), n_ctx, kv_mode)
    s = EngineSession()
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=n_ctx, kv_mode=kv_mode, kv_recent=0))
        status = s.kv_status()
    finally:
        s.close()
    assert tuple(phase for phase, _ in plan.rungs) == status.rungs
    assert plan.rungs[0][1] == status.n_cells_capacity  # the 16-bit rung the memory panel shows
    assert plan.rungs[1][1] == status.n_cells_next
    assert plan.rungs[-1][1] == status.n_cells_total
