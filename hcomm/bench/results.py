"""What rank 0 does with a finished sweep: JSON, plot and dated markdown results.

``--markdown FILE`` writes the file that goes into ``benchmarks/results/``
straight from the run (date, command, machine, versions, topology, the
table), so a recorded result is reproducible by rerunning its command.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

from hcomm.bench import environment, schema, table


def _topology_lines(ranks: List[Dict[str, Any]]) -> List[str]:
    lines = ["| rank | host | island | device |", "| --- | --- | --- | --- |"]
    for r in ranks:
        lines.append(f"| {r['rank']} | {r['host']} | {r['island'] or '-'} | {r['device']} |")
    return lines


def markdown(doc: Dict[str, Any], text_table: str) -> str:
    m, v, cfg = doc["machine"], doc["versions"], doc["config"]
    out = [
        f"# hcomm bench {cfg['op']}: {', '.join(cfg['backends'])}, {doc['topology']['nranks']} ranks",
        "",
        f"- date: {doc['created']}",
        f"- command: `{doc['command']}`",
        f"- machine: {m['cpu_model']}, {m['nproc']} CPUs, {m['memory_bytes'] / 2 ** 30:.1f} GiB"
        + (f", GPUs: {', '.join(m['gpus'])}" if m["gpus"] else ", no GPU") + f" ({m['platform']})",
        f"- versions: python {v['python']}, torch {v['torch']}, hcomm {v['hcomm']} (git {v['hcomm_git']})"
        + (f", CUDA {v['cuda']}, NCCL {v['nccl']}" if v.get("cuda") else ""),
        f"- settings: dtype {cfg['dtype']}, op {cfg['redop']}, iters {cfg['iters']}, warmup {cfg['warmup']}"
        + (f", HCOMM_ALGO={cfg['algo']}" if cfg.get("algo") else ""),
        "",
        "## Topology",
        "",
        *_topology_lines(doc["topology"]["ranks"]),
        "",
        "## Results",
        "",
        "```",
        text_table,
        "```",
    ]
    if doc.get("warnings"):
        out += ["", "## Warnings", ""] + [f"- {w}" for w in doc["warnings"]]
    return "\n".join(out) + "\n"


def write_all(cfg, result) -> Dict[str, Any]:
    doc = schema.document(cfg, result, environment.machine(), environment.versions(), environment.now(),
                          environment.command_line(cfg.argv))
    if cfg.json_path:
        with open(cfg.json_path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if cfg.plot_path:
        from hcomm.bench import plot

        plot.plot(result.records, cfg.backends, cfg.plot_path,
                  f"{cfg.op} {cfg.dtype}, {len(result.ranks)} ranks")
    if cfg.markdown_path:
        with open(cfg.markdown_path, "w") as f:
            f.write(markdown(doc, table.render(result.records, cfg.backends)))
    return doc
