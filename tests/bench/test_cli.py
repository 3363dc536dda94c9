"""Bad arguments: exit status 2 and a message naming the argument and value."""
import pytest

from hcomm.bench import cli, topo
from hcomm.bench.cli import parse_size, sweep_sizes


def run(capsys, argv, main=cli.main):
    rc = main(argv)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["allreduce2"], "hcomm bench: unknown op 'allreduce2' (choose from: all_reduce,"),
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
])
def test_bad_arguments_exit_2_with_a_clear_message(capsys, argv, message):
    rc, err = run(capsys, argv)
    assert rc == 2
    assert message in err
    assert err.startswith("hcomm bench: ")


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
])
def test_topo_bad_arguments(capsys, argv, message):
    rc, err = run(capsys, argv, topo.main)
    assert rc == 2 and message in err and err.startswith("hcomm topo: ")
