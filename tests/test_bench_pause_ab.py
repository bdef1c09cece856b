"""bench.pause_ab's table: medians of alternating rounds of two engines' ladder step pauses."""

from __future__ import annotations

from bench.pause_ab import table


def test_the_table_gives_each_steps_median_pause_and_both_ratios() -> None:
    def run(engine: str, pause: float) -> dict:
        return {"engine": engine, "steps": {"f16 -> q8_0": [pause, 0.050]}}

    runs = {"base": [run("a", 0.095), run("a", 0.093), run("a", 0.097)],
            "now": [run("b", 0.105), run("b", 0.104), run("b", 0.110)]}
    text = table(runs, "91a673c")
    row = next(line for line in text.splitlines() if line.startswith("| f16 -> q8_0"))
    assert row == "| f16 -> q8_0 | 95.0 (93.0-97.0) | 105.0 (104.0-110.0) | 1.11x | 1.90x | 2.10x |"
    assert "3 alternating rounds" in text and "a (91a673c) and b (now)" in text
