"""Tests of speed/trace_step.py: its op totals from a profile's planes (device ops only, control
flow left out, the costliest first), and its one-line refusal on a CPU, whose trace holds no
device ops."""

import types

from helpers import run_main
from speed import trace_step


def plane(name, lines):
    return types.SimpleNamespace(name=name, lines=[
        types.SimpleNamespace(name=line, events=[types.SimpleNamespace(name=n, duration_ns=d)
                                                 for n, d in events])
        for line, events in lines.items()])


def test_op_totals_add_each_device_ops_runs_and_leave_out_control_flow_and_the_host():
    copy = "%copy.9 = u8[8,32,31250,50]{3,1,2,0} copy(u8[8,32,31250,50]{2,3,1,0} %scatter.1)"
    fusion = "%fusion.2 = f32[8,32]{1,0} fusion(f32[8,32]{1,0} %p), kind=kLoop"
    loop = "%while.1 = (s32[], f32[8]) while((s32[], f32[8]) %tuple), condition=%c, body=%b"
    planes = [
        plane("/device:TPU:0", {
            "XLA Ops": [(loop, 9_000_000), (copy, 3_500_000), (fusion, 1_000_000),
                        (copy, 3_500_000), (fusion, 1_500_000)],
            "XLA Modules": [("jit_update_step(1)", 9_000_000)]}),
        plane("/host:CPU", {"XLA Ops": [(copy, 50_000_000)]})]
    total, rows = trace_step.op_totals(planes, top=5)
    assert total == 9.5
    assert [(r["op"], r["kind"], r["runs"], r["ms"]) for r in rows] == [
        ("%copy.9", "copy", 2, 7.0), ("%fusion.2", "fusion", 2, 2.5)]
    assert rows[0]["hlo"] == copy
    assert [r["op"] for r in trace_step.op_totals(planes, top=1)[1]] == ["%copy.9"]


def test_a_cpu_is_refused_in_one_line(tmp_path):
    result = run_main(trace_step, tmp_path, "--seeds", "2", timeout=120)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip().splitlines() == [
        "error: a CPU's trace holds no device ops: run this where JAX has a TPU or GPU"]
