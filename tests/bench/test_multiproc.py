"""End to end: 2-3 local gloo ranks spawned by ``hcomm bench``, small sizes."""
import json

import pytest

from hcomm.bench import cli, schema, topo

SMALL = ["-b", "8", "-e", "1K", "-f", "8", "-n", "2", "-w", "1", "--no-progress", "--backends", "gloo"]


def load(path):
    with open(path) as f:
        return json.load(f)


def test_all_reduce_json_plot_markdown(tmp_path, capfd):
    out = tmp_path / "r.json"
    rc = cli.main(["all_reduce", *SMALL, "--nprocs", "2", "--json", str(out), "--plot", str(tmp_path / "r.png"),
                   "--markdown", str(tmp_path / "r.md")])
    assert rc == 0
    doc = load(out)
    assert schema.validate(doc) == []
    assert [r["size_bytes"] for r in doc["records"]] == [8, 64, 512]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["busbw_gbps"] == r["algbw_gbps"] * 1.0
               for r in doc["records"])           # 2 ranks: all_reduce factor 2(n-1)/n = 1
    assert (tmp_path / "r.png").stat().st_size > 1000
    md = (tmp_path / "r.md").read_text()
    assert "## Topology" in md and "# Out of bounds values : 0 OK" in md and doc["versions"]["torch"] in md
    assert "#wrong" in capfd.readouterr().out


def test_injected_corruption_is_counted_and_fails_the_run(tmp_path, monkeypatch):
    # rank 1's input element 0 is wrong in the checked call: every rank's gathered output has it
    monkeypatch.setenv("HCOMM_BENCH_CORRUPT", "1:0")
    out = tmp_path / "c.json"
    rc = cli.main(["all_gather", *SMALL, "--nprocs", "2", "--json", str(out)])
    assert rc == 1
    assert [r["wrong"] for r in load(out)["records"]] == [2, 2, 2]


@pytest.mark.parametrize("op", ["all_to_all_v", "pingpong"])
def test_uneven_and_point_to_point_on_3_ranks(tmp_path, op):
    out = tmp_path / "u.json"
    assert cli.main([op, *SMALL, "--nprocs", "3", "--json", str(out)]) == 0
    doc = load(out)
    assert schema.validate(doc) == [] and all(r["wrong"] == 0 for r in doc["records"])
    if op.endswith("_v"):
        assert all(r["algorithm"].startswith("ref:") for r in doc["records"])


def test_topo_two_ranks(tmp_path, capfd):
    png, js = tmp_path / "t.png", tmp_path / "t.json"
    rc = topo.main(["--nprocs", "2", "--large-bytes", "256K", "--small-iters", "5", "--iters", "2",
                    "--heatmap", str(png), "--json", str(js)])
    assert rc == 0
    text = capfd.readouterr().out
    assert "alpha (us, one-way latency)" in text and "beta (GB/s)" in text and "intra:" in text
    pairs = load(js)["pairs"]
    assert len(pairs) == 1 and pairs[0]["beta_Bps"] > 0 and pairs[0]["alpha_s"] >= 0
    assert png.stat().st_size > 1000
