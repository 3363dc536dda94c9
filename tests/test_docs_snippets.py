"""Every ```python block of README.md and docs/*.md runs as written.

A block that calls ``init_process_group`` runs under plain
``torchrun --standalone --nproc-per-node N`` for N = 2 and 4 (what a reader
would type); any other block runs in one process.  A block that cannot run
here carries ``<!-- snippet: skip (why) -->`` on the line before it; the
test reports each such skip with its reason, so nothing is left out
silently.  Shell blocks: every ``hcomm COMMAND`` they show must name a real
subcommand (a typo there is as wrong as a broken Python line).
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import List

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
SKIP = re.compile(r"<!--\s*snippet:\s*skip\s*\((.+)\)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Block:
    doc: str  # path relative to the repo
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str  # the reason from the marker, "" when the block runs

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(path: str) -> List[Block]:
    out, lines = [], open(path).read().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.search(prev)
        out.append(Block(os.path.relpath(path, REPO), start + 1, lang, "\n".join(lines[start + 1:j]) + "\n",
                         skip.group(1) if skip else ""))
        i = j + 1
    return out


ALL = [b for path in DOCS for b in blocks(path)]
PYTHON = [b for b in ALL if b.lang == "python"]

# After the block, each rank writes every tensor it left behind as
# (numel, sum, min, max), so tests can check exact values, not only exit 0.
_RUNNER = textwrap.dedent("""\
    import json, os, sys, torch
    ns = {"__name__": "__main__"}
    with open(sys.argv[1]) as src:
        code = compile(src.read(), sys.argv[1], "exec")
    exec(code, ns)
    facts = {k: [v.numel(), float(v.sum()), float(v.min()), float(v.max())]
             for k, v in ns.items() if isinstance(v, torch.Tensor) and v.numel()}
    with open(os.path.join(sys.argv[2], f"facts{os.environ.get('RANK', '0')}.json"), "w") as f:
        json.dump(facts, f)
    """)


def _run(block: Block, tmp_path, nprocs: int) -> List[dict]:
    snippet, runner = tmp_path / "snippet.py", tmp_path / "runner.py"
    snippet.write_text(block.code)
    runner.write_text(_RUNNER)
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", PYTHONWARNINGS="default")
    env.pop("HCOMM_COMPRESS", None)
    if nprocs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}",
               str(runner), str(snippet), str(tmp_path)]
    else:
        cmd = [sys.executable, str(runner), str(snippet), str(tmp_path)]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{block.name} failed under {cmd[2:5]}:\n{output[-4000:]}"
    for noise in ("Traceback", "Warning", "err=-3"):
        assert noise not in output, f"{block.name} printed {noise!r}:\n{output[-4000:]}"
    return [json.loads((tmp_path / f"facts{r}.json").read_text()) for r in range(max(nprocs, 1))]


def _params():
    for b in PYTHON:
        if b.skip:  # reported once, with the doc's own reason
            yield pytest.param(b, 0, id=b.name, marks=pytest.mark.skip(reason=f"{b.name}: {b.skip}"))
        elif "init_process_group" in b.code:
            for n in (2, 4):
                yield pytest.param(b, n, id=f"{b.name}-np{n}")
        else:
            yield pytest.param(b, 0, id=b.name)


@pytest.mark.parametrize("block,nprocs", list(_params()))
def test_python_snippet(block, nprocs, tmp_path):
    facts = _run(block, tmp_path, nprocs)
    if "all_gather_v" in block.code:  # README's backend snippet: exact results on every rank
        world = nprocs
        sizes = [1000 * (r + 1) for r in range(world)]
        for f in facts:
            assert f["t"] == [1 << 20, float(world << 20), float(world), float(world)]
            assert f["out"] == [sum(sizes), float(sum(sizes)), 1.0, 1.0]


def test_every_python_block_is_found_and_skips_are_explicit():
    # The README holds two Python blocks; if the parser stops finding them
    # the test above would pass vacuously.
    readme = [b for b in PYTHON if b.doc == "README.md"]
    assert len(readme) == 2
    assert "all_gather_v" in readme[0].code and readme[0].skip == ""
    assert "parallelize(model, plan, groups)" in readme[1].code and readme[1].skip.startswith("a fragment")
    # A marker must sit right before a block: one anywhere else is a typo.
    for path in DOCS:
        lines = open(path).read().splitlines()
        for i, line in enumerate(lines):
            if SKIP.search(line):
                nxt = next((l for l in lines[i + 1:] if l.strip()), "")
                assert nxt.startswith("```"), f"{path}:{i + 1}: skip marker not followed by a code block"


def test_shell_blocks_name_real_subcommands():
    from hcomm.cli import SUBCOMMANDS
    from hcomm.emulate import cli as emulate_cli

    emulate_verbs = set(re.findall(r"\"(\w+)\"", open(emulate_cli.__file__).read()))
    seen = []
    for b in ALL:
        if b.lang not in ("bash", "sh", ""):
            continue
        for line in b.code.splitlines():
            m = re.match(r"\s*hcomm\s+(\S+)(?:\s+(\S+))?", line.split("#")[0])
            if not m:
                continue
            seen.append(m.group(1))
            assert m.group(1) in SUBCOMMANDS, f"{b.name}: unknown command in {line.strip()!r}"
            if m.group(1) == "emulate":
                assert m.group(2) in emulate_verbs, f"{b.name}: unknown emulate verb in {line.strip()!r}"
    assert {"train", "plan", "emulate", "calibrate"} <= set(seen)


def test_emulate_presets_command_runs():
    # The one documented shell command that is cheap and needs no root.
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-m", "hcomm", "emulate", "presets"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "two-islands" in proc.stdout and "Traceback" not in proc.stderr
