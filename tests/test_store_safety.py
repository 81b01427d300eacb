"""Safety of the sweep store (issue 17): exclusive atomic creation, concurrent writers,
checksummed chunks that every reader verifies, repair by ``--resume``.

The spec is the audit's tiny one (usa, n = [8], beta = [1.0], t1 = 0.5, dt = 0.1, save = 3)
with four seeds, run one point per chunk (``--memory 1B``): four chunks. Concurrency runs
the real ``run_sweep`` in threads (claims are ``flock`` locks of separate open files, which
exclude threads as they exclude processes) for 20 rounds, and real CLI processes once.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from meanfield import sweep
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import store as sweep_store

ROOT = Path(__file__).resolve().parents[1]

SPEC = """
[model]
kind = "usa"
[grid]
n = [8]
beta = [1.0]
seeds = 4
[time]
t1 = 0.5
dt = 0.1
save = 3
"""

ROUNDS = 20


def _values(store) -> dict:
    ds = sweep.load(store)
    return {k: np.asarray(ds[k].values) for k in ds.data_vars}


def _assert_same(store, ref) -> None:
    a, b = _values(store), _values(ref)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """The sweep run once, uninterrupted, one point per chunk (four chunks)."""
    base = tmp_path_factory.mktemp("safety")
    spec_path = base / "ok.toml"
    spec_path.write_text(SPEC)
    out = base / "ref.zarr"
    sweep.run_sweep(spec_path, out, memory="1B", quiet=True)
    ds = sweep.load(out)
    assert ds.attrs["chunks_done"] == ds.attrs["chunks_total"] == 4
    assert bool((ds.status == sweep.OK).all())
    return spec_path, out


def _chunk_file(store: Path, cid: int, name: str) -> Path:
    """The zarr chunk file of variable ``name`` in sweep chunk ``cid`` (from its completion mark)."""
    rec = json.loads((store / "_sweep" / "done" / f"{cid:06d}").read_text())
    coords = list(rec["index"]) + [a for a, _ in rec["slices"]]  # the zarr block is one point
    meta = json.loads((store / name / "zarr.json").read_text())
    trailing = len(meta["shape"]) - len(coords)
    return store / name / "c" / "/".join(map(str, coords + [0] * trailing))


def _in_threads(*fns):
    """Run the callables at the same moment in threads; return what each returned or raised."""
    barrier = threading.Barrier(len(fns))
    results: list = [None] * len(fns)

    def go(i, fn):
        barrier.wait()
        try:
            results[i] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - the outcome is what the test inspects
            results[i] = ("error", e)

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    return results


# --------------------------------------------------------------------------- creation


def test_concurrent_creators_exactly_one_wins(ref, tmp_path):
    """Two sweeps started at once on the same new --out: one creates and fills it, the other
    gets one line (FileExistsError), 20 rounds; no temporary directory is left behind."""
    spec_path, ref_store = ref
    for r in range(ROUNDS):
        out = tmp_path / f"race{r}.zarr"
        run = functools.partial(sweep.run_sweep, spec_path, out, memory="1B", quiet=True)
        results = _in_threads(run, run)
        ok = [x for kind, x in results if kind == "ok"]
        errors = [x for kind, x in results if kind == "error"]
        assert len(ok) == 1 and len(errors) == 1, results
        e = errors[0]
        assert isinstance(e, FileExistsError), repr(e)
        assert len(str(e).splitlines()) == 1 and "--resume" in str(e)
        _assert_same(out, ref_store)
    assert not [p for p in tmp_path.iterdir() if ".creating-" in p.name]


def test_creation_is_atomic_and_never_overwrites(ref, tmp_path):
    spec_path, _ = ref
    out = tmp_path / "x.zarr"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="use --resume or another path"):
        sweep.run_sweep(spec_path, out, quiet=True)
    # the store's own creation refuses a non-empty target even when asked directly
    plan = sweep.make_plan(sweep.load_spec(spec_path), "1B", devices=1)
    from meanfield.sweep.plan import store_layout

    with pytest.raises(FileExistsError, match="already exists"):
        sweep_store.create(out, store_layout(plan))
    assert (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.zarr"]


def test_resume_on_a_new_path_joins_the_other_writer(ref, tmp_path):
    """Two `--resume` on the same new path: one creates, the other joins; both finish, and
    the store equals the uninterrupted run."""
    spec_path, ref_store = ref
    for r in range(3):
        out = tmp_path / f"join{r}.zarr"
        run = functools.partial(
            sweep.run_sweep, spec_path, out, memory="1B", quiet=True, resume=True
        )
        results = _in_threads(run, run)
        assert all(kind == "ok" for kind, _ in results), results
        _assert_same(out, ref_store)


# --------------------------------------------------------------------------- concurrent resumers


def _make_partial(ref_store: Path, out: Path, missing=(1, 2, 3)) -> None:
    """A copy of the reference store with chunks ``missing`` never computed (no mark, no data)."""
    shutil.copytree(ref_store, out)
    for cid in missing:
        for name in ("collapse_gap", "energy", "stop_time", "num_steps", "status"):
            _chunk_file(out, cid, name).unlink()
        sweep_store.discard(out, cid)


def test_two_concurrent_resumers_cooperate(ref, tmp_path):
    """Two `--resume` at once on a partial store, 20 rounds: both finish, the store verifies
    and equals the uninterrupted run bit for bit."""
    spec_path, ref_store = ref
    for r in range(ROUNDS):
        out = tmp_path / f"resume{r}.zarr"
        _make_partial(ref_store, out)
        assert sweep.load(out, verify=False).attrs["chunks_done"] == 1
        run = functools.partial(
            sweep.run_sweep, spec_path, out, memory="1B", quiet=True, resume=True
        )
        results = _in_threads(run, run)
        assert all(kind == "ok" for kind, _ in results), results
        assert sweep_store.verify(out) == []
        assert sweep.load(out).attrs["chunks_done"] == 4
        _assert_same(out, ref_store)


def test_claims_exclude_and_die_with_their_holder(ref, tmp_path):
    _, ref_store = ref
    out = tmp_path / "claims.zarr"
    shutil.copytree(ref_store, out)
    with sweep_store.claim(out, 2) as first:
        assert first
        with sweep_store.claim(out, 2) as second:
            assert not second  # held by another open file, in this process or another
        with sweep_store.claim(out, 3) as other:
            assert other  # per chunk: other chunks stay free
    with sweep_store.claim(out, 2) as again:
        assert again  # released on exit


# --------------------------------------------------------------------------- damage


def _truncate(p: Path) -> None:
    b = p.read_bytes()
    p.write_bytes(b[: len(b) // 2])


def _random_bytes(p: Path) -> None:
    p.write_bytes(
        np.random.default_rng(0).integers(0, 256, p.stat().st_size, dtype=np.uint8).tobytes()
    )


def _flip_bit(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x04
    p.write_bytes(bytes(b))


DAMAGE = {
    "truncated": lambda s: [_truncate(_chunk_file(s, 1, "energy"))],
    "random-bytes": lambda s: [_random_bytes(_chunk_file(s, 1, "energy"))],
    "flipped-bit": lambda s: [_flip_bit(_chunk_file(s, 1, "energy"))],
    "deleted": lambda s: [_chunk_file(s, 1, "energy").unlink()],
    "deleted-data-and-status": lambda s: [
        _chunk_file(s, 1, "energy").unlink(),
        _chunk_file(s, 1, "status").unlink(),
    ],
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_chunk_is_detected_everywhere_and_repaired_by_resume(ref, tmp_path, damage, capsys):
    spec_path, ref_store = ref
    out = tmp_path / "damaged.zarr"
    shutil.copytree(ref_store, out)
    energy = _chunk_file(out, 1, "energy")
    DAMAGE[damage](out)

    # verify: the chunk and the file
    found = sweep_store.verify(out)
    assert found and {d.chunk for d in found} == {1}
    assert energy in {d.path for d in found}

    # load: a typed one-line error naming the chunk and the file (no NaN read as ok)
    with pytest.raises(sweep_store.StoreDamagedError) as info:
        sweep.load(out)
    assert info.value.chunk == 1 and info.value.path in {d.path for d in found}
    assert len(str(info.value).splitlines()) == 1 and "chunk 1" in str(info.value)

    # meanfield sweep --verify: exit 1, one line per damaged chunk and a summary
    capsys.readouterr()
    assert sweep_cli.main(["--verify", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("damaged: chunk 1: ") and "1 damaged chunk" in err[1]

    # meanfield plot: one line, exit 2, nothing drawn
    assert sweep_cli.plot_main([str(out), "--out", str(tmp_path / "plots")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chunk 1" in err[0] and "damaged" in err[0]
    assert not (tmp_path / "plots").exists()

    # --resume: says so, recomputes the chunk; the store verifies and equals the reference
    assert sweep_cli.main([str(spec_path), "--out", str(out), "--resume", "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chunk 1" in err[0] and "recomputing" in err[0]
    assert sweep_cli.main(["--verify", str(out)]) == 0
    assert "sound; 4 of 4 chunks done" in capsys.readouterr().out
    _assert_same(out, ref_store)


def test_sound_store_resume_computes_nothing(ref, tmp_path, capsys):
    spec_path, ref_store = ref
    out = tmp_path / "sound.zarr"
    shutil.copytree(ref_store, out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("c/*")}
    assert sweep_cli.main([str(spec_path), "--out", str(out), "--resume", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert {p: p.stat().st_mtime_ns for p in out.rglob("c/*")} == before


def test_damaged_coordinate_cannot_be_resumed(ref, tmp_path, capsys):
    spec_path, ref_store = ref
    out = tmp_path / "coord.zarr"
    shutil.copytree(ref_store, out)
    _flip_bit(out / "seed" / "c" / "0")
    with pytest.raises(sweep_store.StoreDamagedError, match="cannot be recomputed") as info:
        sweep.load(out)
    assert info.value.chunk is None
    assert sweep_cli.main([str(spec_path), "--out", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed" in err[0]


def test_store_of_an_earlier_version_gives_a_clear_message(ref, tmp_path, capsys):
    """A store without checksums or format (meanfield before issue 17): one line everywhere,
    and it still reads unverified."""
    spec_path, ref_store = ref
    out = tmp_path / "old.zarr"
    shutil.copytree(ref_store, out)
    mark = out / "_sweep" / "initialized"
    info = json.loads(mark.read_text())
    for key in ("format", "chunks_total", "variables", "grid_ndim"):
        info.pop(key)
    mark.write_text(json.dumps(info))
    with pytest.raises(sweep_store.StoreFormatError, match="earlier meanfield version"):
        sweep.load(out)
    ds = sweep.load(out, verify=False)
    assert "chunks_total" not in ds.attrs and ds.attrs["chunks_done"] == 4
    for argv, entry in (
        ([str(spec_path), "--out", str(out), "--resume", "--quiet"], sweep_cli.main),
        (["--verify", str(out)], sweep_cli.main),
        ([str(out), "--out", str(tmp_path / "p")], sweep_cli.plot_main),
    ):
        assert entry(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "earlier meanfield version" in err[0], err
    assert sweep_cli.plot_main([str(out), "--out", str(tmp_path / "p"), "--no-verify"]) == 0


def test_not_a_store(tmp_path, capsys):
    junk = tmp_path / "junk.zarr"
    junk.mkdir()
    (junk / "zarr.json").write_text("{}")
    assert sweep_cli.main(["--verify", str(junk)]) == 2
    assert "not a complete sweep store" in capsys.readouterr().err
    assert sweep_cli.main(["--verify", str(tmp_path / "nothing.zarr")]) == 2
    assert "sweep store not found" in capsys.readouterr().err


# --------------------------------------------------------------------------- real processes


def _cli(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "meanfield.sweep", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


@pytest.mark.slow
def test_real_processes_create_and_resume_concurrently(ref, tmp_path):
    """The same races between two `meanfield sweep` processes: on a new path exactly one
    exits 0 and the other prints one line (status 2); two `--resume` on a partial store
    both exit 0 and leave the store of an uninterrupted run."""
    spec_path, ref_store = ref
    out = tmp_path / "proc.zarr"
    procs = [_cli(spec_path, "--out", out, "--memory", "1B", "--quiet") for _ in range(2)]
    outs = [(p.wait(300), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    codes = sorted(rc for rc, _ in outs)
    assert codes == [0, 2], outs
    loser = next(err for rc, err in outs if rc == 2)
    assert (
        len(loser.strip().splitlines()) == 1 and "already exists" in loser or "meanwhile" in loser
    )
    _assert_same(out, ref_store)

    part = tmp_path / "partial.zarr"
    _make_partial(ref_store, part)
    procs = [_cli(spec_path, "--out", part, "--resume", "--quiet") for _ in range(2)]
    outs = [(p.wait(300), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
    assert [rc for rc, _ in outs] == [0, 0], outs
    _assert_same(part, ref_store)
