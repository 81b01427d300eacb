"""Job arrays without collectives: ``meanfield sweep SPEC --out STORE --part I/N`` runs part I of
N of the plan's chunks into one shared store; ``--status`` reports the parts.

The spec is a tiny USA grid (2 n x 2 beta x 2 seeds, t1 = 0.5) run one point per chunk
(``--memory 1B``): eight chunks. Results are compared with a single uninterrupted run of the
same chunking, value for value (a fixed chunking is bit-reproducible, docs/sweeps.md). The model's
backend is pinned to XLA: with ``backend = "auto"`` each process takes the native kernel or XLA by
the crossover it measured (timings, so load-dependent), and the reference runs in a subprocess with
its own cache while some parts run in this process: the two paths agree only to rounding (1 ulp
seen in CI under load).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meanfield import sweep
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import run as sweep_run
from meanfield.sweep import store as sweep_store

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
name = "parts"
[model]
kind = "usa"
backend = "xla"
[grid]
n = [6, 8]
beta = [1.0, 2.0]
seeds = 2
[time]
t1 = 0.5
dt = 0.1
save = 3
"""

CHUNKS = 8


def _values(store) -> dict:
    ds = sweep.load(store)
    return {k: np.asarray(ds[k].values) for k in ds.data_vars}


def _assert_same(store, ref) -> None:
    a, b = _values(store), _values(ref)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _cli(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "meanfield", "sweep", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Subprocess environment: one thread per process, a private native-kernel cache for the module."""
    cache = tmp_path_factory.mktemp("cache")
    return dict(os.environ, OMP_NUM_THREADS="1", MEANFIELD_CACHE_DIR=str(cache))


@pytest.fixture(scope="module")
def ref(tmp_path_factory, env):
    """The sweep run once, uninterrupted, in a fresh process like the parts (one point per chunk)."""
    base = tmp_path_factory.mktemp("parts")
    spec_path = base / "parts.toml"
    spec_path.write_text(SPEC)
    out = base / "ref.zarr"
    p = _cli(spec_path, "--out", out, "--memory", "1B", "--quiet", env=env)
    _, err = p.communicate(timeout=300)  # reads while waiting: a full pipe never blocks the process
    assert p.returncode == 0, err
    assert sweep.load(out).attrs["chunks_total"] == CHUNKS
    return spec_path, out


# --------------------------------------------------------------------------- assignment


def _plan(text=SPEC, memory="1B"):
    return sweep.make_plan(sweep.parse_spec(text), memory, devices=1)


@pytest.mark.parametrize("parts", [1, 2, 3, 5, 8, 11])
def test_assignment_covers_every_chunk_once_in_contiguous_runs(parts):
    plan = _plan()
    owner = sweep_run.assign_parts(plan, parts)
    assert len(owner) == plan.num_chunks == CHUNKS
    assert owner == sorted(owner) and set(owner) <= set(range(1, parts + 1))
    # work of each chunk: its points times its group's estimated work per point
    work = [
        math.prod(s.stop - s.start for s in sl) * plan.cost(plan.groups[gi], 1).work
        for _, gi, sl in plan.chunks
    ]
    shares = [sum(w for w, o in zip(work, owner) if o == p) for p in range(1, parts + 1)]
    # the midpoint rule: each share is within one chunk's work of the even share
    assert all(abs(sh - sum(work) / parts) <= max(work) * (1 + 1e-9) for sh in shares), shares
    if parts <= CHUNKS:
        assert min(shares) > 0  # nobody idle while there are chunks enough
    # deterministic, and the same whatever the devices or the memory budget of the machine
    assert sweep_run.assign_parts(_plan(), parts) == owner
    blocks = [list(g.block) for g in plan.groups]
    other = sweep.make_plan(sweep.parse_spec(SPEC), "1B", devices=4, blocks=blocks)
    assert sweep_run.assign_parts(other, parts) == owner


def test_assignment_balances_unequal_groups_by_work():
    """Two groups whose points cost 4x apart (estimate of n = 16 and 256): each part gets about
    half the work, not half the chunks (nothing runs: only the plan)."""
    text = SPEC.replace("n = [6, 8]", "n = [16, 256]").replace("seeds = 2", "seeds = 4")
    plan = _plan(text)
    owner = sweep_run.assign_parts(plan, 2)
    per = {g.n: plan.cost(g, 1).work for g in plan.groups}
    assert per[256] > 3 * per[16]
    work = [per[plan.groups[gi].n] for _, gi, _ in plan.chunks]
    share1 = sum(w for w, o in zip(work, owner) if o == 1)
    assert abs(share1 / sum(work) - 0.5) <= max(work) / sum(work)
    assert owner.count(1) > owner.count(2)  # part 1: the cheap chunks and a few dear ones


@pytest.mark.parametrize(
    "part, exc, match",
    [
        ("0/3", ValueError, "between 1 and N"),
        ("4/3", ValueError, "between 1 and N"),
        ("1/0", ValueError, "between 1 and N"),
        ("a/3", ValueError, "I/N with integers"),
        ("2", ValueError, "I/N with integers"),
        ("-1/3", ValueError, "I/N with integers"),
        ("1/2/3", ValueError, "I/N with integers"),
        ((1, 2.0), TypeError, "pair"),
        (2, TypeError, "pair"),
    ],
)
def test_bad_part(part, exc, match):
    with pytest.raises(exc, match=match):
        sweep_run.parse_part(part)


def test_part_parses():
    assert sweep_run.parse_part("2/3") == (2, 3)
    assert sweep_run.parse_part((1, 1)) == (1, 1)


def test_cli_usage_errors_are_one_line_exit_2(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    out = str(tmp_path / "o.zarr")
    cases = [
        ([str(spec), "--out", out, "--part", "0/2"], "between 1 and N"),
        ([str(spec), "--out", out, "--part", "x"], "I/N"),
        (
            [
                str(spec),
                "--out",
                out,
                "--part",
                "1/2",
                "--coordinator",
                "localhost:1",
                "--num-processes",
                "2",
                "--process-id",
                "0",
            ],
            "does not combine",
        ),
        ([str(spec), "--out", out, "--status", "--resume"], "--status takes only"),
        ([str(spec), "--status"], "--status needs --out"),
        (["--out", out, "--status"], "sweep store not found"),
        ([str(spec), "--out", out, "--coordinator", "localhost:1"], "go together"),
        (
            [
                str(spec),
                "--out",
                out,
                "--coordinator",
                "localhost",
                "--num-processes",
                "2",
                "--process-id",
                "0",
            ],
            "HOST:PORT",
        ),
        (
            [
                str(spec),
                "--out",
                out,
                "--coordinator",
                "localhost:1",
                "--num-processes",
                "2",
                "--process-id",
                "2",
            ],
            "--process-id must be in 0 .. 1",
        ),
        ([str(spec), "--out", out, "--num-processes", "x"], "invalid int value"),
        (["--verify", out, "--part", "1/2"], "--verify STORE takes no"),
    ]
    for argv, match in cases:
        assert sweep_cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and match in err[0], (argv, err)
    assert not Path(out).exists()


# --------------------------------------------------------------------------- parts in one process


def test_parts_in_turn_fill_the_store_and_status_follows(ref, tmp_path, capsys):
    """Parts 1..3 run one after the other: each computes only its share (the others stay
    pending), `--status` counts them per part, a rerun computes nothing, and the store ends
    equal to the single run."""
    spec_path, ref_store = ref
    out = tmp_path / "turns.zarr"
    plan = _plan()
    owner = sweep_run.assign_parts(plan, 3)
    for i in (1, 2, 3):
        sweep.run_sweep(spec_path, out, memory="1B", quiet=True, part=f"{i}/3")
        mine = {cid for (cid, _, _), p in zip(plan.chunks, owner) if p <= i}
        assert sweep_store.done_chunks(out) == mine
        st = sweep_run.sweep_status(out, spec_path)
        assert st["parts"] == 3
        for row, p in zip(st["rows"], (1, 2, 3)):
            assert row["part"] == f"{p}/3"
            assert row["chunks"] == owner.count(p)
            assert row["done"] == (owner.count(p) if p <= i else 0)
            assert row["pending"] == (0 if p <= i else owner.count(p))
            assert row["running"] == row["damaged"] == row["failed_points"] == 0
    assert json.loads((out / "_sweep" / "parts").read_text()) == {"parts": 3}
    _assert_same(out, ref_store)

    # a rerun of a finished part computes nothing (its chunks' marks are untouched)
    marks = {p.name: p.stat().st_mtime_ns for p in (out / "_sweep" / "done").iterdir()}
    sweep.run_sweep(
        spec_path, out, memory="2GB", quiet=True, part="2/3"
    )  # the stored chunking is kept
    assert {p.name: p.stat().st_mtime_ns for p in (out / "_sweep" / "done").iterdir()} == marks

    # the CLI: a summary line and a table; without SPEC the stored spec is used
    capsys.readouterr()
    assert sweep_cli.main(["--out", str(out), "--status"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == (
        f"{out}: split into 3 parts; {CHUNKS} of {CHUNKS} chunks done, 0 running, 0 pending, "
        "0 damaged; 0 failed points"
    )
    assert lines[1].split() == [
        "part",
        "chunks",
        "done",
        "running",
        "pending",
        "damaged",
        "failed_points",
    ]
    assert [ln.split() for ln in lines[2:]] == [
        [f"{p}/3", str(owner.count(p)), str(owner.count(p)), "0", "0", "0", "0"] for p in (1, 2, 3)
    ]

    # another split of the same store is refused, one line naming the recorded one
    with pytest.raises(sweep_store.StoreError, match=r"split into 3 parts \(--part I/3\), not 4"):
        sweep.run_sweep(spec_path, out, memory="1B", quiet=True, part="1/4")


def test_a_part_repairs_its_own_damage_only_and_resume_completes_all(ref, tmp_path, capsys):
    spec_path, ref_store = ref
    out = tmp_path / "partial.zarr"
    sweep.run_sweep(spec_path, out, memory="1B", quiet=True, part="1/2")
    owner = sweep_run.assign_parts(_plan(), 2)
    first, second = owner.index(1), owner.index(2)
    # damage part 1's first chunk: the status reports it (exit 1), part 2 leaves it alone
    mark = json.loads((out / "_sweep" / "done" / f"{first:06d}").read_text())
    energy = (
        out
        / "energy"
        / "c"
        / "/".join(map(str, [*mark["index"], mark["slices"][0][0], mark["slices"][1][0], 0]))
    )
    energy.write_bytes(energy.read_bytes()[:-3])
    capsys.readouterr()
    assert sweep_cli.main([str(spec_path), "--out", str(out), "--status"]) == 1
    captured = capsys.readouterr()
    assert "1 damaged" in captured.out and "recomputes them" in captured.err
    sweep.run_sweep(spec_path, out, memory="1B", quiet=True, part="2/2")
    assert [d.chunk for d in sweep_store.verify(out)] == [first]
    assert second in sweep_store.done_chunks(out)
    # part 1 again: recomputes its damaged chunk, says so in one line
    assert sweep_cli.main([str(spec_path), "--out", str(out), "--part", "1/2", "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"chunk {first} of" in err[0] and "recomputing" in err[0]
    assert sweep_store.verify(out) == []
    _assert_same(out, ref_store)

    # --resume without --part completes every pending chunk, whoever's
    out2 = tmp_path / "resume.zarr"
    sweep.run_sweep(spec_path, out2, memory="1B", quiet=True, part="2/2")
    assert sweep_store.done_chunks(out2) == {c for c, o in enumerate(owner) if o == 2}
    sweep.run_sweep(spec_path, out2, quiet=True, resume=True)
    assert sweep_store.done_chunks(out2) == set(range(CHUNKS))
    _assert_same(out2, ref_store)


def test_status_counts_running_and_failed(ref, tmp_path):
    """A chunk whose claim is held by a live writer is `running`; a failed point (beta past
    the float32 overflow) is counted in its part."""
    spec_path, _ = ref
    text = SPEC.replace("beta = [1.0, 2.0]", "beta = [1.0, 200.0]")
    out = tmp_path / "failing.zarr"
    sweep.run_sweep(text, out, memory="1B", quiet=True, part="2/2")
    owner = sweep_run.assign_parts(_plan(text), 2)
    plan = _plan(text)
    failing = [cid for (cid, gi, sl), o in zip(plan.chunks, owner) if o == 2 and sl[0].start == 1]
    with sweep_store.claim(out, owner.index(1)) as got:
        assert got
        st = sweep_run.sweep_status(out)
    r1, r2 = st["rows"]
    assert (r1["running"], r1["pending"], r1["done"]) == (1, owner.count(1) - 1, 0)
    assert (r2["done"], r2["pending"], r2["failed_points"]) == (owner.count(2), 0, len(failing))
    assert (
        st["total"]["failed_points"]
        == int((sweep.load(out).status == sweep.FAILED).sum())
        == len(failing)
    )
    assert sweep_run.sweep_status(out)["rows"][0]["running"] == 0  # released with the claim


# --------------------------------------------------------------------------- real concurrent jobs


@pytest.mark.slow
def test_three_parts_at_once_equal_a_single_run(ref, tmp_path, env):
    """Three `meanfield sweep --part i/3` processes started at once on a new store (they race on
    its creation): all exit 0, the store verifies and equals the single run value for value;
    `--status` then reports every part done."""
    spec_path, ref_store = ref
    out = tmp_path / "array.zarr"
    procs = [
        _cli(spec_path, "--out", out, "--memory", "1B", "--part", f"{i}/3", "--quiet", env=env)
        for i in (1, 2, 3)
    ]
    try:
        outs = [(p.returncode, err) for p in procs for _, err in [p.communicate(timeout=300)]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [rc for rc, _ in outs] == [0, 0, 0], outs
    assert not [p for p in tmp_path.iterdir() if ".creating-" in p.name]
    assert sweep_store.verify(out) == []
    _assert_same(out, ref_store)
    p = _cli("--out", out, "--status", env=env)
    text, _ = p.communicate(timeout=300)
    assert p.returncode == 0
    assert f"{CHUNKS} of {CHUNKS} chunks done, 0 running, 0 pending, 0 damaged" in text
    shutil.rmtree(out)
