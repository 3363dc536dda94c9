"""The ``hcomm`` command's one error path, and the settings table (issue #18)."""
import subprocess
import sys

import pytest

from hcomm import cli


def run(capsys, argv):
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_demo_unknown_cluster_is_one_line_not_a_traceback(capsys):
    rc, _, err = run(capsys, ["demo", "--cluster", "nosuch"])
    assert rc == 2
    assert err.startswith("hcomm demo: error: --cluster 'nosuch': neither a file nor a preset (presets: ")
    assert "Traceback" not in err and err.count("\n") == 1


def test_demo_takes_sizes_as_bench_does():
    from hcomm import demo

    assert demo._parse(["--max-bytes", "64M"]).max_bytes == 64 << 20
    assert demo._parse([]).max_bytes == 16 << 20
    with pytest.raises(SystemExit) as exc:
        demo._parse(["--max-bytes", "64Q"])
    assert exc.value.code == 2


def test_user_errors_print_one_line_and_exit_2(capsys, monkeypatch):
    import hcomm.demo

    def boom(argv):
        raise FileNotFoundError("no such file: 'x.yaml'")

    monkeypatch.setattr(hcomm.demo, "main", boom)
    rc, _, err = run(capsys, ["demo"])
    assert (rc, err) == (2, "hcomm demo: error: no such file: 'x.yaml'\n")


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    import hcomm.demo

    def boom(argv):
        raise KeyError("bug")

    monkeypatch.setattr(hcomm.demo, "main", boom)
    with pytest.raises(KeyError):
        cli.main(["demo"])


def test_settings_help_prints_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["settings", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hcomm settings [-h]") and "| `HCOMM_ALGO` |" not in out


def test_settings_shows_the_value_in_effect(capsys, monkeypatch):
    monkeypatch.setenv("HCOMM_ALGO", "ring")
    monkeypatch.delenv("HCOMM_DEBUG", raising=False)
    rc, out, _ = run(capsys, ["settings"])
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "| setting | in effect | default | meaning |"
    algo = next(line for line in lines if line.startswith("| `HCOMM_ALGO` |"))
    assert algo.startswith("| `HCOMM_ALGO` | `ring` (set) | (unset) | force one algorithm")
    debug = next(line for line in lines if line.startswith("| `HCOMM_DEBUG` |"))
    assert debug.startswith("| `HCOMM_DEBUG` | `False` | `False` |")


def test_readme_table_shows_defaults_not_this_environment(monkeypatch):
    from hcomm.settings import markdown_table

    monkeypatch.setenv("HCOMM_ALGO", "ring")
    row = next(line for line in markdown_table().splitlines() if line.startswith("| `HCOMM_ALGO` |"))
    assert row.startswith("| `HCOMM_ALGO` | (unset) | force one algorithm")


def test_unknown_hcomm_algo_raises_naming_variable_and_choices(monkeypatch):
    from hcomm._backend import forced_algorithm
    from hcomm.errors import HCommValueError

    monkeypatch.setenv("HCOMM_ALGO", "rign")
    with pytest.raises(HCommValueError) as err:
        forced_algorithm()
    assert str(err.value).startswith("HCOMM_ALGO='rign' is not an algorithm (choose from: native, hier, ")
    monkeypatch.setenv("HCOMM_ALGO", "pairwise")  # known, though only all-to-all runs it
    assert forced_algorithm() == "pairwise"
    monkeypatch.setenv("HCOMM_ALGO", "")
    assert forced_algorithm() == ""


def test_command_line_demo_error_has_no_traceback():
    p = subprocess.run([sys.executable, "-m", "hcomm", "demo", "--cluster", "nosuch"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.startswith("hcomm demo: error: --cluster 'nosuch'") and "Traceback" not in p.stderr
