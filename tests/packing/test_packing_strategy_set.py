"""Strategy sets: normalization, metrics by hand, JSON round trip, the invariant check; the CLI."""

import json

import numpy as np
import pytest

import packing
from packing import __main__ as cli
from packing import report


def make(strategies, max_len=10, max_depth=3):
    return packing.StrategySet(strategies, max_len, max_depth, "hand", "abc")


def test_normalizes_and_computes_metrics_by_hand():
    s = make([((6, 4), 2), ((4, 6), 1), ((3,), 1), ((5, 5), 0)])
    assert s.strategies == [((3,), 1), ((4, 6), 3)]
    m = s.metrics()
    # 7 sequences, 4 packs, 3 + 30 = 33 tokens of 40; ceil(33 / 10) = 4 packs at best.
    assert (m.sequences, m.packs, m.real_tokens, m.padding_tokens) == (7, 4, 33, 7)
    assert m.efficiency == pytest.approx(82.5)
    assert m.packing_factor == pytest.approx(7 / 4) and m.max_packing_factor == pytest.approx(7 / 4)
    assert (m.mean_depth, m.max_depth_used) == (1.75, 2)
    np.testing.assert_array_equal(s.histogram(), [0, 0, 0, 1, 3, 0, 3, 0, 0, 0, 0])


def test_json_round_trip(tmp_path, squad_histogram):
    s = packing.pack_histogram(squad_histogram, 384, "lp", 3)
    s.save(tmp_path / "s.json")
    loaded = packing.StrategySet.load(tmp_path / "s.json")
    assert loaded == s
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["histogram_checksum"] == packing.histogram.histogram_checksum(squad_histogram)
    assert data["metrics"]["packs"] == s.num_packs
    loaded.check(squad_histogram)


@pytest.mark.parametrize(
    ("strategies", "hist", "message"),
    [
        ([((6, 6), 1)], [0] * 6 + [2], "holds 12 > max_len=10"),
        ([((1, 1, 1, 1), 1)], [0, 4], "holds 4 > max_depth=3"),
        ([((2, 3), 1)], [0, 0, 1, 2], "consume 1 sequences of length 3 but the histogram has 2"),
    ],
)
def test_check_names_the_violation(strategies, hist, message):
    with pytest.raises(ValueError, match=message):
        make(strategies).check(hist)


def test_rejects_bad_strategies():
    with pytest.raises(ValueError, match="negative count"):
        make([((1,), -1)])
    with pytest.raises(ValueError, match=r"outside 1\.\.10"):
        make([((11,), 1)]).histogram()
    with pytest.raises(ValueError, match="missing keys"):
        packing.StrategySet.from_json({"max_len": 3})


def test_cli_json_lines_have_exactly_the_documented_keys(tmp_path, capsys):
    path = tmp_path / "h.txt"
    packing.save_histogram(packing.synthetic.wikipedia_like_histogram(10_000, 64), path)
    out, plot = tmp_path / "s.json", tmp_path / "r.png"
    args = [str(path), "--max-len", "64", "--algorithm", "all", "--max-depth", "3"]
    assert cli.main([*args, "--json", "--out", str(out), "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["algorithm"] for r in records] == ["spfhp", "lpfhp", "nnlshp", "lp"]
    assert all(tuple(r) == report.JSON_KEYS for r in records)
    assert all(r["sequences"] == 10_000 and r["max_depth"] == 3 for r in records)
    saved = packing.StrategySet.load(out)
    assert saved.num_packs == min(r["packs"] for r in records)
    assert plot.stat().st_size > 10_000
    assert cli.main([*args[:-4], "--algorithm", "lpfhp", "--max-depth", "0"]) == 0
    table = capsys.readouterr().out
    assert "lpfhp" in table and "unlimited" in table and "efficiency" in table


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("0\n1\n-2\n", [], "must be >= 0"),
        ("1\n1\n", [], "histogram\\[0\\]"),
        ("0\n0\n0\n0\n0\n1\n", [], "longer than max_len=4"),
        ("0\n1\n", ["--max-depth", "-1"], "max-depth must be >= 0"),
        ("0\n1\n", ["--algorithm", "nnlshp", "--max-depth", "0"], "needs a finite max_depth"),
    ],
)
def test_cli_reports_bad_input(tmp_path, content, args, message):
    path = tmp_path / "h.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):  # one line, exit status 2: test_bad_input
        cli.main([str(path), "--max-len", "4", *args])


def test_cli_rejects_unknown_algorithm(tmp_path):
    with pytest.raises(SystemExit):
        cli.main([str(tmp_path / "h.txt"), "--max-len", "4", "--algorithm", "magic"])
