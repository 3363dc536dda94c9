"""A correct emulated run prints only what the job prints (issue #18).

Each of these lines once came with every emulated run:
- ``[c10d] The hostname of the client socket cannot be retrieved. err=-3``:
  torch's TCPStore looked up each client's name and no resolver answers
  inside a namespace (fixed by the run's hosts file, netns.write_hosts);
- ``<frozen runpy>:128: RuntimeWarning: 'hcomm.emulate.rankwrap' found in
  sys.modules``: the package imported rankwrap before ``-m`` ran it;
- under ``--unshaped``, a C++ stack trace (``recvVector failed``) at exit.
"""
import os
import sys

from helpers import REPO, hcomm_cli, leftovers

SMALL = os.path.join(REPO, "tests/emulate/small.yaml")
JOB = [sys.executable, os.path.join(REPO, "tests/emulate/quietcheck.py")]
NOISE = ("cannot be retrieved", "err=-3", "RuntimeWarning", "Warning", "Traceback", "recvVector",
         "Exception raised from", "frame #")


def _quiet_lines(out):
    return sorted(l for l in out.stdout.splitlines() if "QUIET" in l)


def _assert_no_noise(out):
    combined = out.stdout + out.stderr
    for noise in NOISE:
        assert noise not in combined, f"{noise!r} in the output:\n{combined[-4000:]}"


def test_emulated_run_output_is_only_the_jobs(emulator):
    out = hcomm_cli("run", "--cluster", SMALL, "--", *JOB, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert _quiet_lines(out) == ["[p0 r0] QUIET 0 2", "[q0 r1] QUIET 1 2"]
    assert out.stderr == ""
    _assert_no_noise(out)


def test_unshaped_run_output_is_only_the_jobs_and_the_banner(emulator):
    out = hcomm_cli("run", "--unshaped", "--cluster", SMALL, "--", *JOB, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert _quiet_lines(out) == ["[p0 r0] QUIET 0 2", "[q0 r1] QUIET 1 2"]
    assert [l for l in out.stderr.splitlines() if not l.startswith("!!")] == []
    _assert_no_noise(out)


def test_hosts_file_is_bind_mounted_in_the_node_and_goes_with_the_run(emulator):
    import socket
    import subprocess

    from hcomm.emulate import netns
    from hcomm.emulate.cluster import Cluster

    code = "import socket; print(socket.getnameinfo(('::ffff:10.77.0.101', 1), 0)[0])"
    with open("/etc/hosts") as f:
        host_before = f.read()
    with Cluster(SMALL) as cluster:
        run_id = cluster.run_id
        hosts = netns.hosts_path(run_id)
        proc = subprocess.run([sys.executable, "-c", code], preexec_fn=cluster.preexec(0),
                              capture_output=True, text=True, timeout=30)
        assert proc.stdout == "q0\n", proc.stdout + proc.stderr
        with open("/etc/hosts") as f:
            assert f.read() == host_before  # the host's own file is untouched
    assert not os.path.exists(hosts)
    assert leftovers(run_id) == []
    assert socket.gethostname()  # the host's resolver still works after teardown


def test_the_agents_shutdown_chatter_after_a_good_run_is_dropped(tmp_path):
    """``launch._pump`` (no emulator needed): a node's agent lines while its ranks run are shown; what it
    says after every rank of the node left an exit record of 0 is held, dropped when the agent then exits 0
    (its rendezvous shutdown racing node 0's, which hosts the store) and shown when it does not."""
    import io
    import json

    from hcomm.emulate.launch import _pump, _ranks_succeeded

    class Agent:
        def __init__(self, code):
            self.code = code

        def wait(self):
            return self.code

    def pump(code, lines_after):
        out = io.StringIO()
        for r in (0, 1):
            (tmp_path / f"rank{r}.exit.json").unlink(missing_ok=True)
        stream = iter(["agent starting\n", "[n0 r0] step 1\n", None, *lines_after, ""])

        def readline():
            line = next(stream)
            if line is None:   # both ranks end: their exit records appear
                for r in (0, 1):
                    (tmp_path / f"rank{r}.exit.json").write_text(json.dumps({"returncode": 0}))
                line = next(stream)
            return line
        _pump(type("S", (), {"readline": staticmethod(readline)}), "n0", out, Agent(code),
              lambda: _ranks_succeeded(str(tmp_path), [0, 1]))
        return out.getvalue()

    chatter = ["[W] TCPStore.cpp:115] [c10d] recvVector failed\n", "failed to shutdown the rendezvous\n"]
    assert pump(0, chatter) == "[n0 torchrun] agent starting\n[n0 r0] step 1\n"
    assert pump(1, chatter) == ("[n0 torchrun] agent starting\n[n0 r0] step 1\n"
                                "[n0 torchrun] [W] TCPStore.cpp:115] [c10d] recvVector failed\n"
                                "[n0 torchrun] failed to shutdown the rendezvous\n")
    (tmp_path / "rank1.exit.json").write_text(json.dumps({"returncode": 3}))
    assert not _ranks_succeeded(str(tmp_path), [0, 1]) and not _ranks_succeeded(str(tmp_path), [0, 1, 2])
