"""bench/frontier.py's reading of its measurements (issue 49, section 2): which caches are on the frontier
of tokens per GiB against KLD, and whether any reaches plain q8_0's KLD at 1.5x its tokens. No engine run."""

from __future__ import annotations

from bench.frontier import DEFAULT_NAME, Cache, FrontierModel, Point, merge, report


def _model(points: dict[str, tuple[int, float]]) -> FrontierModel:
    m = FrontierModel("smollm2", "SmolLM2", f16_kv_bytes=90 << 20)
    for name, (mib, kld) in points.items():
        lazy = name.startswith(("ladder", "lazy"))
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


def test_the_report_says_where_the_apps_default_sits() -> None:
    on = report([_model({"q8_0": (48, 0.0035), DEFAULT_NAME: (51, 0.0021), "q4_0": (25, 0.055)})], "c",
                "f.png")
    assert "- The app's default, lazy q8_0, W=128, S=4: 0.94x q8_0's tokens per GiB at 0.60x its KLD, on " \
           "the frontier." in on
    off = report([_model({"q8_0": (48, 0.0035), DEFAULT_NAME: (51, 0.0040)})], "c", "f.png")
    assert "at 1.14x its KLD, off the frontier." in off


def test_caches_measured_again_replace_their_stored_points_only() -> None:
    """--cache NAME measures one cache: the model keeps its other stored points, another model all of
    its own."""
    stored = [_model({"q8_0": (48, 0.0035), "q4_0": (25, 0.055)}), _model({"q8_0": (16, 0.007)})]
    stored[1].key = "gemma3"
    again = _model({"q4_0": (25, 0.050), DEFAULT_NAME: (51, 0.0021)})
    merged = merge(stored, [again])
    assert [m.key for m in merged] == ["smollm2", "gemma3"]
    klds = {p.cache.name: p.kld for p in merged[0].points}
    assert klds == {"q8_0": 0.0035, "q4_0": 0.050, DEFAULT_NAME: 0.0021}
    assert merged[1] is stored[1]


def test_a_longer_context_is_a_section_of_its_own() -> None:
    """--ctx 16384: the model's points at 4096 stay; the report titles the new section with its context."""
    short = _model({"q8_0": (48, 0.0035)})
    long = _model({"q8_0": (100, 0.005)})
    long.n_ctx, long.chunks = 16384, 2
    merged = merge([short], [long])
    assert merged == [short, long]
    text = report(merged, "c", "f.png")
    assert "## SmolLM2\n" in text and "## SmolLM2 at n_ctx 16384, 2 chunks\n" in text
    # tokens per GiB at that context: 16384 tokens in 100 MiB
    assert "| q8_0 | 167,772 | 1.00x |" in text


def test_the_sinks_table_sets_each_cache_against_the_same_without_sinks() -> None:
    m = _model({"q8_0": (48, 0.0035), "ladder q4_0, W=128": (28, 0.0075)})
    with_sinks = Cache("ladder q4_0, W=128, S=4", "q4_0", "q4_0", 128, 4)
    m.points.append(Point(with_sinks, 0.006, 0.0001, 95.0, 28 * 2**20 + 4096))
    text = report([m], "c", "f.png")
    assert "| ladder q4_0, W=128, S=4 | 0.00750 | 0.00600 | -20.0% | 0.9999 |" in text
    assert "with 4 attention sinks as well: 1.71x q8_0's tokens at 1.71x its KLD" in text


def test_sinks_are_weighed_against_the_same_cache_without_them() -> None:
    """A cache with sinks is compared with the one of the same K and V types and window without them: a
    ladder of K q8_0 and V q4_0 with sinks has no such point here, so it is in no row of that table."""
    from bench.frontier import sinks_section

    m = FrontierModel("smollm2", "SmolLM2", f16_kv_bytes=90 << 20)
    for cache, kld in ((Cache("lazy q8_0, W=128", "q8_0", "q8_0", 128), 0.0040),
                       (Cache("lazy q8_0, W=128, S=4", "q8_0", "q8_0", 128, 4), 0.0036),
                       (Cache("ladder K q8_0, V q4_0, W=128, S=4", "q8_0", "q4_0", 128, 4), 0.0039)):
        m.points.append(Point(cache, kld, kld / 10, 95.0, 40 << 20))
    rows = [line for line in "\n".join(sinks_section([m])).splitlines() if line.startswith("| SmolLM2")]
    assert rows == ["| SmolLM2 | lazy q8_0, W=128, S=4 | 0.00400 | 0.00360 | -10.0% | 1.0000 |"]
