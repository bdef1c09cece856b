"""bench/frontier.py's reading of its measurements (issue 49, section 2): which caches are on the frontier
of tokens per GiB against KLD, and whether any reaches plain q8_0's KLD at 1.5x its tokens. No engine run."""

from __future__ import annotations

from bench.frontier import Cache, FrontierModel, Point, report


def _model(points: dict[str, tuple[int, float]]) -> FrontierModel:
    m = FrontierModel("smollm2", "SmolLM2", f16_kv_bytes=90 << 20)
    for name, (mib, kld) in points.items():
        lazy = name.startswith("ladder")
        cache = Cache(name, "q4_0", "q4_0", 128 if lazy else -1)
        m.points.append(Point(cache, kld, kld / 10, 95.0, mib << 20))
    return m


def test_a_cache_is_on_the_frontier_unless_another_is_smaller_and_no_worse() -> None:
    m = _model({"q8_0": (48, 0.0035), "q5_0": (31, 0.012), "q4_0": (25, 0.055),
                "ladder q4_0, W=128": (28, 0.0075), "K q8_0, V q5_0": (39, 0.006),
                "K q5_0, V q4_0": (29, 0.03)})
    on = {p.cache.name for p in m.points if m.on_frontier(p)}
    # K q5_0 / V q4_0 is larger than q4_0 and worse than the ladder, which is smaller: off
    assert on == {"q8_0", "K q8_0, V q5_0", "ladder q4_0, W=128", "q4_0"}
    # q5_0: the ladder holds more tokens at a lower KLD
    assert not m.on_frontier(m.point("q5_0"))


def test_the_report_says_whether_the_goal_holds() -> None:
    missed = report([_model({"q8_0": (48, 0.0035), "ladder q4_0, W=128": (28, 0.0075), "q4_0": (25, 0.055)})],
                    "a corpus", "frontier.png")
    assert "the lowest KLD is ladder q4_0, W=128's, 2.14x plain q8_0's: the goal does not hold" in missed
    held = report([_model({"q8_0": (48, 0.0035), "ladder q4_0, W=128": (28, 0.0030)})], "a corpus", "f.png")
    assert "0.86x plain q8_0's: the goal holds" in held
    assert "| ladder q4_0, W=128 | " in held and "1.71x" in held


def test_the_saved_measurements_give_the_same_report(tmp_path) -> None:  # noqa: ANN001
    """--report-only writes the report again from frontier.json, as main() saved it."""
    import dataclasses
    import json

    from bench.frontier import load

    m = _model({"q8_0": (48, 0.0035), "ladder q4_0, W=128": (28, 0.0075)})
    path = tmp_path / "frontier.json"
    path.write_text(json.dumps({"corpus": "a corpus", "models": [dataclasses.asdict(m)]}))
    models, corpus = load(path)
    assert models == [m] and corpus == "a corpus"
    assert report(models, corpus, "f.png") == report([m], "a corpus", "f.png")
