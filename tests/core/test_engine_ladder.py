"""The ladder (f16 -> q8_0 -> q4_0) through EngineSession on the real engine: its steps as KvStatus and
StepEvents, a conversation that fills each rung and keeps answering, compacting one step at a time,
a context chosen by memory, and which saved steps restore where (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazykv.core.engine.engine import EngineSession
from lazykv.core.engine.load_spec import LoadSpec
from lazykv.core.engine.memory import MiB, context_for_budget, kv_bytes
from lazykv.core.engine.types import ContextBudgetError, KvRestoreError, SamplingSettings, StepEvent
from lazykv.core.kinds import DEFAULT_KV_SINKS, KvMode, KvPhase, StepStage
from tests.core.test_engine_snapshot import LONG, MEDIUM, SHORT, first_turn, reply

GREEDY = SamplingSettings(temperature=0.0, seed=1)
N_CTX = 1024  # steps: 16-bit 256 cells, 8-bit 512, 4-bit all 1,024
LADDER = (KvPhase.F16, KvPhase.Q8_0, KvPhase.Q4_0)


def _targets(events: list[StepEvent]) -> list[KvPhase]:
    """The rung each step went to, once per step."""
    return [e.target for e in events if e.stage is StepStage.END]


def test_a_ladder_conversation_fills_each_step_and_keeps_answering(model_path: Path) -> None:
    s = EngineSession()
    events: list[StepEvent] = []
    s.set_step_listener(events.append)
    try:
        s.load(LoadSpec(model_path, n_ctx=N_CTX, kv_mode=KvMode.LADDER, kv_recent=0))
        empty = s.kv_status()
        assert (empty.rungs, empty.phase, empty.next_rung) == (LADDER, KvPhase.F16, KvPhase.Q8_0)
        assert (empty.n_cells_capacity, empty.n_cells_next, empty.n_cells_total) == (256, 512, 1024)

        conversation = [{"role": "user", "content": MEDIUM}]  # crosses the 16-bit rung
        text, _ = reply(s, conversation)
        assert text.strip() and _targets(events) == [KvPhase.Q8_0]
        middle = s.kv_status()
        assert (middle.phase, middle.target, middle.next_rung) == (KvPhase.Q8_0, KvPhase.Q8_0, KvPhase.Q4_0)
        assert (middle.n_cells_capacity, middle.n_cells_next) == (512, 1024) and middle.n_steps == 1
        assert 256 < middle.n_cells_used < 512

        conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": MEDIUM}]
        text, reused = reply(s, conversation)  # crosses the 8-bit rung
        assert text.strip() and reused >= middle.n_cells_used - 1
        assert _targets(events) == [KvPhase.Q8_0, KvPhase.Q4_0]
        last = s.kv_status()
        assert (last.phase, last.target, last.next_rung, last.n_steps) == (KvPhase.Q4_0, KvPhase.Q4_0,
                                                                                 None, 2)
        assert last.n_cells_capacity == last.n_cells_next == 1024 and 512 < last.n_cells_used < 1024
        assert last.kv_bytes == empty.kv_bytes  # each step converts in place
        starts = [e for e in events if e.stage is StepStage.START]
        assert [e.target for e in starts] == [KvPhase.Q8_0, KvPhase.Q4_0]
        assert starts[1].n_cells == middle.n_cells_used  # the step took what the 8-bit rung held
        assert not s.step_kv_now()  # the last rung: nothing left to compact
        s.clear_kv()
        emptied = s.kv_status()
        assert (emptied.phase, emptied.n_cells_capacity) == (KvPhase.F16, 256)  # emptied: 16-bit again
    finally:
        s.close()


def _two_turns(model: Path, second: str, compact_between: bool) -> tuple[str, KvPhase]:
    """A list of 70 items (~380 tokens: past the 16-bit rung), its reply, then ``second`` (past the 8-bit
    rung); the last reply and the rung it ended on."""
    s = EngineSession()
    try:
        s.load(LoadSpec(model, n_ctx=N_CTX, kv_mode=KvMode.LADDER, kv_recent=0))
        conversation = [{"role": "user", "content": _items(70)}]
        text, _ = reply(s, conversation)
        conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": second}]
        if compact_between:
            assert s.step_kv_now() and s.kv_status().phase is KvPhase.Q4_0
        text, _ = reply(s, conversation)
        return text, s.kv_status().phase
    finally:
        s.close()


def _items(n: int) -> str:
    return "Here is a list: " + ", ".join(f"item {i}" for i in range(n)) + ". Which item comes first?"


@pytest.mark.parametrize("n_items", [30, 45, 60])  # the 8-bit rung (512 cells) crossed at ~560, ~640, ~720
def test_the_step_a_prompt_takes_answers_as_the_step_taken_just_before_it(
    smollm2_path: Path, n_items: int
) -> None:
    """Crossing the 8-bit rung while a prompt is read converts the cells in place, then reads the prompt on
    the 4-bit rung: the same cells and the same graph as compacting just before the prompt, so the same
    greedy reply (a sensible one: not empty, not from non-finite logits)."""
    inside, before = (_two_turns(smollm2_path, _items(n_items), compact) for compact in (False, True))
    assert before[1] is inside[1] is KvPhase.Q4_0 and before[0].strip()
    assert inside == before


def test_compact_now_goes_one_step_at_a_time(smollm2_path: Path) -> None:
    s = EngineSession()
    events: list[StepEvent] = []
    s.set_step_listener(events.append)
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode=KvMode.LADDER, kv_recent=0))
        conversation = first_turn(s, SHORT)
        assert s.kv_status().phase is KvPhase.F16
        assert s.step_kv_now()
        assert s.kv_status().phase is KvPhase.Q8_0 and _targets(events) == [KvPhase.Q8_0]
        assert s.step_kv_now()
        assert s.kv_status().phase is KvPhase.Q4_0 and _targets(events) == [KvPhase.Q8_0, KvPhase.Q4_0]
        assert not s.step_kv_now()
        progress = [e for e in events if e.stage is StepStage.PROGRESS]
        assert {e.target for e in progress} == {KvPhase.Q8_0, KvPhase.Q4_0} and events[-1].fraction == 1.0
        text, reused = reply(s, conversation)
        assert text.strip() and reused > 0  # the conversation goes on from the 4-bit cache
    finally:
        s.close()


# SmolLM2: 30 layers x 3 KV heads x (64 + 64) values a token: 23,040 bytes f16, 12,240 q8_0, 6,480 q4_0
SMOLLM2_F16_TOKEN = 23_040
@pytest.mark.parametrize(("kv_mode", "budget_mb", "n_ctx"), [(KvMode.LADDER, 4, 512), (KvMode.LAZY, 8, 512),
                                                             (KvMode.F16, 8, 256)])
def test_a_memory_budget_gives_the_context_it_holds(
    smollm2_path: Path, kv_mode: KvMode, budget_mb: int, n_ctx: int
) -> None:
    s = EngineSession()
    try:
        info = s.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode=kv_mode, context_budget=budget_mb * MiB,
                               kv_recent=0, kv_sinks=0))
        assert info.n_ctx == context_for_budget(info.meta, budget_mb * MiB, kv_mode) == n_ctx
        allocated = s.kv_status().kv_bytes
        assert allocated == kv_bytes(info.meta, n_ctx, kv_mode) <= budget_mb * MiB  # the estimate is exact
        assert reply(s, [{"role": "user", "content": SHORT}])[0].strip()
    finally:
        s.close()


def test_the_kv_bytes_a_budget_is_measured_in_are_what_the_engine_allocates(model_path: Path) -> None:
    """Gemma-3's iSWA cache included: the per-token figure the budget divides by is exact, and so is the
    recent window's and the sinks' (each cache of an iSWA pair keeps its own, the lazy modes only)."""
    for kv_mode in KvMode:
        for recent in (0, 128):
            spec = LoadSpec(model_path, n_ctx=N_CTX, kv_mode=kv_mode, kv_recent=recent)  # the app's sinks
            s = EngineSession()
            try:
                info = s.load(spec)
                assert s.kv_status().kv_bytes == kv_bytes(info.meta, N_CTX, kv_mode, spec.window), (
                    kv_mode, recent)
                window = recent + DEFAULT_KV_SINKS if kv_mode.is_lazy else 0
                assert info.plan.recent == spec.window == window
            finally:
                s.close()


def test_a_budget_below_the_smallest_context_is_refused_and_the_model_stays(smollm2_path: Path) -> None:
    s = EngineSession()
    try:
        s.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode=KvMode.LADDER, kv_recent=0))
        with pytest.raises(ContextBudgetError, match="256 tokens need 5.6 MiB"):
            s.load(LoadSpec(smollm2_path, kv_mode=KvMode.F16, context_budget=4 * MiB))
        assert s.model_info().n_ctx == N_CTX and reply(s, [{"role": "user", "content": SHORT}])[0].strip()
    finally:
        s.close()


SAVED_AT = {KvPhase.F16: SHORT, KvPhase.Q8_0: MEDIUM, KvPhase.Q4_0: LONG}  # LONG skips the 8-bit rung
# which saved rung of a ladder each KV mode (loaded fresh) takes back: f16 rows convert on the way in,
# a lazy cache first steps down to a rung that reads the cells, 4-bit cells only go into the ladder
RESTORES = {
    KvPhase.F16: {KvMode.F16, KvMode.Q8_0, KvMode.LAZY, KvMode.LADDER},
    KvPhase.Q8_0: {KvMode.Q8_0, KvMode.LAZY, KvMode.LADDER},
    KvPhase.Q4_0: {KvMode.LADDER},
}


@pytest.mark.parametrize("rung", list(SAVED_AT))
def test_each_saved_rung_restores_where_the_app_says_it_does(smollm2_path: Path, rung: KvPhase) -> None:
    """The engine's check (EngineSession.kv_refusal, which changes nothing) and its restore agree, per KV
    mode, with the matrix the app documents."""
    a = EngineSession()
    a.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode=KvMode.LADDER, kv_recent=0))
    conversation = first_turn(a, SAVED_AT[rung])
    saved = a.capture_kv()
    expected, _ = reply(a, conversation)
    a.close()
    assert saved.layout.lazy_phase == rung and saved.layout.type_k == rung
    for kv_mode in KvMode:
        b = EngineSession()
        try:
            b.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode=kv_mode, kv_recent=0))
            refusal = b.kv_refusal(saved.tokens, saved.state)
            assert (refusal is None) == (kv_mode in RESTORES[rung]), (kv_mode, refusal)
            if refusal is not None:
                assert "mismatch" in refusal, refusal
                with pytest.raises(KvRestoreError, match="mismatch"):
                    b.restore_kv(saved.tokens, saved.state)
                continue
            b.restore_kv(saved.tokens, saved.state)
            got, reused = reply(b, conversation)
            assert reused >= len(saved.tokens) - 1 and got.strip()
            if kv_mode is KvMode.LADDER:
                assert b.kv_status().phase is rung and got == expected  # the same cells: the same reply
        finally:
            b.close()


@pytest.mark.parametrize("rung", [KvPhase.F16, KvPhase.Q8_0])
def test_a_compact_snapshot_resumes_on_the_4bit_rung(smollm2_path: Path, rung: KvPhase) -> None:
    """The "compact snapshots" setting: a ladder still on 16- or 8-bit saves 4-bit cells (a smaller state, a
    4-bit layout in the header), its own cache unchanged; the snapshot resumes on the 4-bit rung and answers
    as the same ladder compacted to 4-bit just before saving would."""
    a = EngineSession()
    try:
        a.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode=KvMode.LADDER, kv_recent=0))
        conversation = first_turn(a, SAVED_AT[rung])
        assert a.kv_status().phase is rung
        full, compact = a.capture_kv(), a.capture_kv(compact=True)
        assert a.kv_status().phase is rung
        assert (compact.layout.type_k, compact.layout.lazy_phase) == ("q4_0", "q4_0")
        assert (full.layout.type_k, full.layout.lazy_phase) == (rung, rung)
        # written on the f16 rung, it also carries the sinks' f16 rows (on q8_0 both have them in the window)
        sinks = DEFAULT_KV_SINKS * SMOLLM2_F16_TOKEN if rung is KvPhase.F16 else 0
        assert len(compact.state) < len(full.state) * (0.35 if rung is KvPhase.F16 else 0.6) + sinks
        llama, _ = a._require()
        assert llama.kv_lazy_convert("q4_0")  # the one step the compact snapshot's cells took
        expected, _ = reply(a, conversation)
    finally:
        a.close()

    b = EngineSession()
    try:
        b.load(LoadSpec(smollm2_path, n_ctx=N_CTX, kv_mode=KvMode.LADDER, kv_recent=0))
        assert b.kv_refusal(compact.tokens, compact.state) is None
        b.restore_kv(compact.tokens, compact.state)
        assert b.kv_status().phase is KvPhase.Q4_0
        got, reused = reply(b, conversation)
        assert reused >= len(compact.tokens) - 1 and got == expected
    finally:
        b.close()
