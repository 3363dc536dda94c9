"""The JSON schema validator, the shipped schema, and the table layout."""
import copy

from hcomm.bench import schema, table
from hcomm.bench.runner import algorithm_of, merge_tiers


def record(**over):
    r = {"op": "all_reduce", "backend": "gloo", "nranks": 2, "size_bytes": 1024, "count": 256,
         "dtype": "float", "redop": "sum", "root": -1, "iters": 5, "warmup": 1, "device": "cpu",
         "time_us": 100.0, "algbw_gbps": 0.01024, "busbw_factor": 1.0, "busbw_gbps": 0.01024, "wrong": 0,
         "ratio": 1.0, "algorithm": None, "chunk_bytes": None, "algo_requested": None,
         "algo_matched": None, "tiers": []}
    r.update(over)
    return r


def doc(records):
    return {"schema": "hcomm-bench/1", "created": "2026-12-02T10:00:00+00:00", "command": "hcomm bench all_reduce",
            "warnings": [], "machine": {"hostname": "h", "cpu_model": "c", "nproc": 2, "memory_bytes": 1,
                                        "platform": "p", "gpus": []},
            "versions": {"python": "3", "torch": "2", "hcomm": "0", "hcomm_git": "abc", "cuda": None, "nccl": None},
            "topology": {"nranks": 2, "ranks": [{"rank": 0, "host": "h", "island": None, "device": "cpu"}],
                         "hcomm": None},
            "config": {"op": "all_reduce", "dtype": "float", "redop": "sum", "root": 0, "iters": 5, "warmup": 1,
                       "backends": ["gloo"], "algo": None, "device": "cpu"},
            "records": records}


def test_valid_document_has_no_errors():
    tiers = [{"tier": "intra", "bytes": 10, "seconds": 1e-6, "gbps": 0.01}]
    assert schema.validate(doc([record(), record(backend="hcomm", algorithm="ring", tiers=tiers)])) == []


def test_validator_reports_each_kind_of_violation():
    bad = doc([record(wrong=-1, time_us="fast", extra_column=1), record(device="tpu")])
    del bad["machine"]
    bad["schema"] = "hcomm-bench/0"
    errors = "\n".join(schema.validate(bad))
    assert "$: missing required key 'machine'" in errors
    assert "$.schema: expected 'hcomm-bench/1'" in errors
    assert "$.records[0].wrong: -1 is below the minimum 0" in errors
    assert "$.records[0].time_us: expected number, got str" in errors
    assert "$.records[0]: unexpected key 'extra_column'" in errors
    assert "$.records[1].device: 'tpu' is not one of" in errors


def test_booleans_are_not_integers():
    assert schema.validate(doc([record(count=True)]))


def test_shipped_schema_uses_only_what_the_validator_implements():
    assert schema.keywords_used(schema.load_schema()) <= schema.SUPPORTED_KEYWORDS


def test_schema_records_list_every_column_the_runner_writes():
    props = schema.load_schema()["properties"]["records"]["items"]
    assert set(props["required"]) == set(record())


def test_row_lines_up_with_nccl_tests_columns():
    row = table.row(record(size_bytes=8, count=2, time_us=12.5, algbw_gbps=0.0, busbw_gbps=0.0))
    cols = row.split()
    assert cols[:9] == ["8", "2", "float", "sum", "-1", "gloo", "12.50", "0.000", "0.000"]
    assert cols[9:] == ["0", "1.00x", "-"]
    header = table.header("gloo")[0]
    # each right-aligned value ends where its header label ends
    for label, value in (("size", "8"), ("busbw", "0.000"), ("#wrong", "0")):
        end = header.index(label) + len(label)
        assert row[:end].endswith(value) or row[:end].rstrip().endswith(value), label


def test_tier_line_and_summary():
    tiers = [{"tier": "intra", "bytes": 3 << 20, "seconds": 1e-3, "gbps": 3.145728},
             {"tier": "inter", "bytes": 1 << 20, "seconds": 2e-3, "gbps": None}]
    line = table.tier_line(record(tiers=tiers))
    assert line == "#        tiers: intra 3.00 MB in 1000.0 us = 3.146 GB/s | inter 1.00 MB in 2000.0 us = -"
    recs = [record(), record(backend="hcomm", ratio=2.0), record(size_bytes=2048),
            record(size_bytes=2048, backend="hcomm", ratio=0.5)]
    text = "\n".join(table.summary(recs, ["gloo", "hcomm"]))
    assert "# Out of bounds values : 0 OK" in text
    assert "hcomm/gloo busbw ratio: geomean 1.00x, min 0.50x at 2.00 KB, max 2.00x at 1.00 KB" in text


def test_merge_tiers_takes_busiest_bytes_and_slowest_rate():
    per_rank = [{"algorithm": "hier", "tiers": [{"tier": "intra", "bytes": 100, "seconds": 1e-6},
                                                 {"tier": "inter", "bytes": 50, "seconds": 1e-5}]},
                {"algorithm": "hier", "tiers": [{"tier": "intra", "bytes": 200, "seconds": 1e-6}]},
                None]
    merged = {t["tier"]: t for t in merge_tiers(per_rank)}
    assert merged["intra"]["bytes"] == 200 and merged["intra"]["seconds"] == 1e-6
    assert merged["intra"]["gbps"] == 0.1          # rank 0: 100 B / 1 us, slower than rank 1
    assert merged["inter"]["gbps"] == 50 / 1e-5 / 1e9
    assert algorithm_of(per_rank) == "hier"
    assert algorithm_of([{"algorithm": "ring"}, {"algorithm": "tree"}]) == "ring/tree"
    assert algorithm_of([None, None]) is None
    assert merge_tiers([None, {}]) == []


def test_document_is_deep_copy_safe():
    d = doc([record()])
    assert schema.validate(copy.deepcopy(d)) == []
