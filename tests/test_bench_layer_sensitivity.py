"""bench/layer_sensitivity.py's reading of its measurements (issue 49, section 2): each layer's share of
q4_0's excess KLD, the order of the layers, and the tokens per GiB of a mix. No engine run."""

from __future__ import annotations

import json

import pytest
from bench.layer_sensitivity import report, tokens_vs_q8


def test_a_mix_holds_tokens_by_the_bytes_of_its_layers() -> None:
    assert tokens_vs_q8([100, 100], []) == pytest.approx(34 / 18)  # every layer q4_0: 1.89x q8_0's tokens
    assert tokens_vs_q8([100, 100], [0, 1]) == pytest.approx(1.0)
    # a sliding-window layer holds fewer cells: upgrading it costs less than upgrading a global one
    small, large = tokens_vs_q8([25, 100], [0]), tokens_vs_q8([25, 100], [1])
    assert small == pytest.approx(125 / (25 + 100 * 18 / 34)) and small > large


def test_the_report_orders_layers_by_their_share(tmp_path) -> None:  # noqa: ANN001
    res = {"all": {"kld": 0.05}, "q8_0": {"kld": 0.01}, "l0": {"kld": 0.04}, "l1": {"kld": 0.049},
           "l2": {"kld": 0.03}, "top1": {"kld": 0.03, "layers": [2]},
           "top2": {"kld": 0.021, "layers": [0, 2]}}
    (tmp_path / "smollm2.q4_0.json").write_text(json.dumps(res))
    text = report(["smollm2"], tmp_path, bytes_of=lambda key: [100, 100, 100])
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    # layer 2 takes back half of the 0.04 q4_0 adds, layer 0 a quarter, layer 1 almost nothing
    assert rows == ["| 2 | 0.03000 | +0.500 |", "| 0 | 0.04000 | +0.250 |", "| 1 | 0.04900 | +0.025 |"]
    assert "Shares summed over the 3 layers: 0.78." in text
    assert "| top 2 | 0, 2 | 1.19x | 0.02100 | 2.10x |"  # 300 / (200 + 100 * 18/34) in text
    assert "| q4_0 | - | 1.89x | 0.05000 | 5.00x |" in text


def test_a_model_not_yet_swept_says_so(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "gemma3.q4_0.json").write_text(json.dumps({"all": {"kld": 0.1}, "l0": {"kld": 0.09}}))
    text = report(["gemma3"], tmp_path, bytes_of=lambda key: [10] * 18)
    assert "not measured (1 of 18 layers)" in text
