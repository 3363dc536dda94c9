"""``hcomm emulate {run,check,show,up,down,presets}``.

  run   [--cluster SPEC|PRESET] [--unshaped] -- CMD ARGS   CMD on every rank
  check [--cluster ...] [--record FILE.md]                  measure vs. spec
  show  [--cluster ...] [--out FILE.png]                    topology + picture
  up    [--cluster ...]                                     hold a cluster up
                                                            until Ctrl-C
  down  [--id RUNID]                                        remove leftovers of
                                                            dead runs (or one run)
  presets                                                   list built-in specs
  fault --id RUNID ACTION TARGET [ARG]                      inject a fault into a
                                                            live run (cut, restore,
                                                            slow, kill, stop, cont)
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import List

from hcomm.emulate import catalog, state
from hcomm.emulate.cluster import Cluster, EmulatorUnavailable
from hcomm.emulate.netns import EmulatorSetupError
from hcomm.emulate.spec import SpecError, load_spec


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hcomm emulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    cluster_help = f"spec file or preset ({', '.join(catalog.presets())}); default {catalog.DEFAULT_PRESET}"
    r = sub.add_parser("run", help="run a command on every rank of an emulated cluster")
    r.add_argument("--cluster", default=None, help=cluster_help)
    r.add_argument("--unshaped", action="store_true",
                   help="run all nodes on localhost without namespaces, tc or cgroups "
                        "(NOTHING is emulated but the rank layout and HCOMM_EMU_* variables)")
    r.add_argument("--fault", action="append", default=[], metavar="WHEN:ACTION:TARGET[:ARG]",
                   help="fault schedule, repeatable, e.g. 5s:cut:n1 8s:restore:n1 3s:kill:2")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS")
    c = sub.add_parser("check", help="measure links, speeds and memory limits against the spec")
    c.add_argument("--cluster", default=None, help=cluster_help)
    c.add_argument("--record", default=None, help="also write the table as markdown to this file")
    s = sub.add_parser("show", help="print the topology and draw it as a PNG")
    s.add_argument("--cluster", default=None, help=cluster_help)
    s.add_argument("--out", default="hcomm-cluster.png", help="PNG path (default %(default)s)")
    u = sub.add_parser("up", help="bring a cluster up and hold it until Ctrl-C")
    u.add_argument("--cluster", default=None, help=cluster_help)
    d = sub.add_parser("down", help="remove what dead runs left behind")
    d.add_argument("--id", default=None, help="tear down this run even if its launcher lives")
    sub.add_parser("presets", help="list the built-in presets")
    f = sub.add_parser("fault", help="inject a fault into a live run (see docs/emulate.md)")
    f.add_argument("--id", required=True, help="the run id (printed by up; in /run/hcomm-emulate)")
    f.add_argument("action", choices=["cut", "restore", "slow", "kill", "stop", "cont"])
    f.add_argument("target", help="node name/index (cut, restore, slow) or global rank")
    f.add_argument("arg", nargs="?", default="", help="slow: latency=5ms,bandwidth=1Gbit")
    return p


def _run(args) -> int:
    from hcomm.emulate.launch import run

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("hcomm emulate run: no command given (usage: hcomm emulate run -- python "
              "train.py ARGS)", file=sys.stderr)
        return 2
    if args.fault:
        from hcomm.emulate import faults
        from hcomm.emulate.launch import run_on

        try:  # a bad schedule fails before anything is brought up
            steps = [faults.parse_step(t) for t in args.fault]
        except faults.FaultError as exc:
            print(f"hcomm emulate run: {exc}", file=sys.stderr)
            return 2
        with Cluster(args.cluster, unshaped=args.unshaped) as cluster:
            faults.run_schedule(cluster.run_id, steps)
            return run_on(cluster, command)
    return run(args.cluster, command, unshaped=args.unshaped)


def _fault(args) -> int:
    from hcomm.emulate import faults

    try:
        faults.Faults(args.id).apply(args.action, args.target, args.arg)
    except faults.FaultError as exc:
        print(f"hcomm emulate fault: {exc}", file=sys.stderr)
        return 2
    return 0


def _check(args) -> int:
    from hcomm.emulate import check

    spec = load_spec(args.cluster)
    rows, scale = check.run_check(spec)
    print(f"cluster {spec.name}: {scale}")
    print(check.table(rows))
    if args.record:
        with open(args.record, "w") as f:
            f.write(check.markdown(spec, rows, scale))
        print(f"wrote {args.record}")
    bad = [r for r in rows if not r.ok]
    if bad:
        print(f"hcomm emulate check: {len(bad)} of {len(rows)} checks outside tolerance: "
              + "; ".join(r.what for r in bad), file=sys.stderr)
        return 1
    return 0


def _show(args) -> int:
    from hcomm.emulate import show

    spec = load_spec(args.cluster)
    print(show.describe(spec))
    print(f"picture: {show.draw(spec, args.out)}")
    return 0


def _up(args) -> int:
    with Cluster(args.cluster) as c:
        print(f"cluster {c.spec.name} is up as run {c.run_id}: {c.cpu_plan.describe()}")
        for node in c.spec.nodes:
            print(f"  node {node.name}: ip netns exec {c.netns(node.index)} ... "
                  f"({c.ip(node.index)} on {c.ifname(node.index)})")
        print("Ctrl-C to tear it down.", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def _down(args) -> int:
    removed = state.teardown(args.id) if args.id else state.reap_dead()
    for item in removed:
        print(f"removed {item}")
    live = [i for i in state.known_run_ids()
            if (st := state.read_state(i)) is not None and state.is_live(st)]
    if live:
        print(f"left alone (launcher alive): {', '.join(live)}; use --id to force")
    if not removed:
        print("nothing to clean up")
    return 0


def main(argv: List[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "presets":
            for name in catalog.presets():
                print(f"{name}{' (default)' if name == catalog.DEFAULT_PRESET else ''}: "
                      f"{load_spec(name).description}")
            return 0
        return {"run": _run, "check": _check, "show": _show, "up": _up, "down": _down,
                "fault": _fault}[args.cmd](args)
    except SpecError as exc:
        print(f"hcomm emulate: bad cluster spec: {exc}", file=sys.stderr)
        return 2
    except EmulatorUnavailable as exc:
        print(exc, file=sys.stderr)
        return 3
    except EmulatorSetupError as exc:
        print(f"hcomm emulate: setting up the cluster failed: {exc}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        return 130
