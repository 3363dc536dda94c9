"""Bad arguments: exit status 2 and a message naming the argument and value."""
import sys

import pytest

from hcomm.bench import cli, topo
from hcomm.bench.cli import parse_size, sweep_sizes


def run(capsys, argv, main=cli.main):
    rc = main(argv)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["allreduce2"], "hcomm bench: error: unknown op 'allreduce2' (choose from: all_reduce,"),
    (["all_reduce", "--min-bytes", "8", "--max-bytes", "4"], "--max-bytes (4) is smaller than --min-bytes (8)"),
    (["all_reduce", "-b", "abc"], "--min-bytes: cannot parse 'abc' as a size"),
    (["all_reduce", "-b", "0"], "--min-bytes (0) must be at least 1"),
    (["all_reduce", "-f", "1"], "--step-factor (1) must be at least 2"),
    (["all_reduce", "-n", "0"], "--iters (0) must be at least 1"),
    (["all_reduce", "-w", "-1"], "--warmup (-1) must not be negative"),
    (["all_reduce", "-d", "float7"], "unknown dtype 'float7'"),
    (["all_reduce", "-d", "bool", "-o", "avg"], "dtype bool cannot be used with op avg"),
    (["reduce_scatter", "-d", "int32", "-o", "avg"], "dtype int32 cannot be used with op avg"),
    (["all_reduce", "-o", "xor"], "unknown --op 'xor'"),
    (["pingpong", "--nprocs", "1"], "pingpong needs at least 2 ranks, got 1"),
    (["broadcast", "--root", "5", "--nprocs", "2"], "--root (5) must be a rank in 0..1"),
    (["all_reduce", "--backends", "gloo,gloo"], "names a backend twice"),
    (["all_reduce", "--backends", "carrier-pigeon"], "backend 'carrier-pigeon' is not available here"),
    (["all_reduce", "--backends", "gloo", "--algo", "ring"], "--algo ring applies to backend hcomm"),
    (["all_reduce", "--json", "/nonexistent-dir/x.json"], "--json: directory '/nonexistent-dir' does not exist"),
    (["all_reduce", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["all_reduce", "--algo", "rign"], "--algo 'rign' is not an algorithm (choose from: native, hier, "),
])
def test_bad_arguments_exit_2_with_a_clear_message(capsys, argv, message):
    rc, err = run(capsys, argv)
    assert rc == 2
    assert message in err
    assert err.startswith("hcomm bench: error: ")


def test_help_exits_0(capsys):
    assert cli.main(["--help"]) == 0
    assert "all_to_all_v" in capsys.readouterr().out


def test_dtype_aliases_are_accepted():
    cfg, _ = cli.config_from_args(["all_reduce", "-d", "fp16", "-b", "8", "-e", "64", "--backends", "gloo"])
    assert cfg.dtype == "half" and cfg.sizes == [8, 16, 32, 64]


@pytest.mark.parametrize("text,value", [("8", 8), ("64K", 65536), ("128M", 128 << 20), ("1G", 1 << 30),
                                        ("4MB", 4 << 20), ("2kib", 2048)])
def test_parse_size(text, value):
    assert parse_size(text, "--x") == value


def test_sweep_sizes():
    assert sweep_sizes(8, 100, 2) == [8, 16, 32, 64]
    assert sweep_sizes(8, 8, 2) == [8]


@pytest.mark.parametrize("argv,message", [
    (["--nprocs", "1"], "--nprocs (1) must be at least 2"),
    (["--small-bytes", "1M", "--large-bytes", "4K"], "--large-bytes (4096) must be larger than --small-bytes"),
    (["--budget-s", "0"], "--budget-s (0.0) must be positive"),
    (["--heatmap", "/nonexistent-dir/t.png"], "--heatmap: directory '/nonexistent-dir' does not exist"),
])
def test_topo_bad_arguments(capsys, argv, message):
    rc, err = run(capsys, argv, topo.main)
    assert rc == 2 and message in err and err.startswith("hcomm topo: error: ")


def test_unknown_hcomm_algo_in_the_environment_fails_up_front(capsys, monkeypatch):
    monkeypatch.setenv("HCOMM_ALGO", "rign")
    rc, err = run(capsys, ["all_reduce", "--nprocs", "2"])
    assert rc == 2
    assert err.startswith("hcomm bench: error: HCOMM_ALGO='rign' is not an algorithm (choose from: native, ")
    assert "ring" in err and "pairwise" in err


def test_known_algorithm_is_accepted_even_where_some_ops_lack_it():
    cfg, _ = cli.config_from_args(["all_reduce", "--algo", "pairwise", "-e", "64", "--backends", "gloo,hcomm"])
    assert cfg.algo == "pairwise"


def test_topo_writes_no_picture_unless_asked():
    a = topo.parse(["--nprocs", "2"])
    assert a.heatmap is None
    assert topo.parse(["--nprocs", "2", "--heatmap", "t.png"]).heatmap == "t.png"


def test_header_names_the_emulated_node_and_device(monkeypatch):
    import torch

    from hcomm.bench.environment import rank_info

    monkeypatch.setenv("HCOMM_EMU_NODE", "b0")
    monkeypatch.setenv("HCOMM_EMU_DEVICE", "910B")
    monkeypatch.setenv("HCOMM_EMU_ISLAND", "b")
    info = rank_info(3, torch.device("cpu"))
    assert info == {"rank": 3, "host": "b0 (emulated)", "island": "b", "device": "910B (emulated on cpu)"}


def test_piped_progress_prints_a_flushed_line_per_case(capsys, monkeypatch):
    from types import SimpleNamespace

    from hcomm.bench.runner import Sweep

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    me = SimpleNamespace(rank=0, cfg=SimpleNamespace(progress=True, op="all_reduce"))
    Sweep._announce(me, None, 0, 4, "hcomm", 1024)
    assert capsys.readouterr().err == "# progress: case 1/4: all_reduce hcomm count 1024\n"
    Sweep._announce(SimpleNamespace(rank=1, cfg=me.cfg), None, 0, 4, "hcomm", 1024)  # rank 0 only
    me.cfg.progress = False  # --no-progress
    Sweep._announce(me, None, 0, 4, "hcomm", 1024)
    assert capsys.readouterr().err == ""
