"""Integrity of the sweep store (issue 27, items 2 and 10): verification decodes the data and
checks a digest bound to the chunk's id, its region and the spec's hash, so substitution
(swapped chunk files, values written through zarr, edited or planted completion marks) is
detected as well as corruption; damaged metadata and bookkeeping (a dtype or shape edited in
``zarr.json``, ``_sweep/done`` removed, ``_sweep/claims`` replaced by a file) is detected and
restored by ``--resume``; non-finite values are recorded ``FAILED`` when written.

Every damage is checked the same way: ``verify`` reports it, ``load`` refuses the store,
``--resume`` repairs it, and the repaired store verifies and equals the undamaged one. The
spec is the tiny one of ``test_store_safety`` (four seeds, one point per chunk: four chunks).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meanfield import sweep
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import store as sweep_store

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

CHUNKS = 4


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    base = tmp_path_factory.mktemp("integrity")
    spec_path = base / "tiny.toml"
    spec_path.write_text(SPEC)
    out = base / "ref.zarr"
    sweep.run_sweep(spec_path, out, memory="1B", quiet=True)
    assert sweep_store.verify(out) == []
    return spec_path, out


def _values(store) -> dict:
    ds = sweep.load(store)
    return {k: np.asarray(ds[k].values) for k in ds.data_vars}


def _assert_same(store, ref_store) -> None:
    a, b = _values(store), _values(ref_store)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _mark(store: Path, cid: int) -> Path:
    return store / "_sweep" / "done" / f"{cid:06d}"


def _chunk_file(store: Path, cid: int, name: str) -> Path:
    rec = json.loads(_mark(store, cid).read_text())
    coords = list(rec["index"]) + [a for a, _ in rec["slices"]]  # the zarr block is one point
    meta = json.loads((store / name / "zarr.json").read_text())
    trailing = len(meta["shape"]) - len(coords)
    return store / name / "c" / "/".join(map(str, coords + [0] * trailing))


# --------------------------------------------------------------------------- damages


def random_bytes_valid_crc(store: Path, cid: int, seed: int) -> None:
    """Random bytes followed by their own valid crc32c: the trailer checks, the data is no chunk."""
    p = _chunk_file(store, cid, "energy")
    body = (
        np.random.default_rng(seed)
        .integers(0, 256, max(p.stat().st_size - 4, 8), dtype=np.uint8)
        .tobytes()
    )
    p.write_bytes(body + google_crc32c.value(body).to_bytes(4, "little"))


def flipped_byte(store: Path, cid: int, seed: int) -> None:
    p = _chunk_file(store, cid, "collapse_gap")
    b = bytearray(p.read_bytes())
    b[seed % len(b)] ^= 1 + seed % 255
    p.write_bytes(bytes(b))


def swapped_chunk_files(store: Path, cid: int, seed: int) -> None:
    """Two valid chunk files of one variable exchanged: each decodes, each is in the wrong place."""
    other = (cid + 1 + seed % (CHUNKS - 1)) % CHUNKS
    a, b = _chunk_file(store, cid, "energy"), _chunk_file(store, other, "energy")
    da, db = a.read_bytes(), b.read_bytes()
    assert da != db
    a.write_bytes(db)
    b.write_bytes(da)


def nan_through_zarr(store: Path, cid: int, seed: int) -> None:
    """A NaN written through zarr into a point whose status is ok (a valid, checksummed file)."""
    rec = json.loads(_mark(store, cid).read_text())
    sel = tuple(rec["index"]) + tuple(slice(a, b) for a, b in rec["slices"])
    arr = zarr.open_group(store, mode="r+", use_consolidated=False)["energy"]
    arr[sel + (seed % arr.shape[-1],)] = np.nan


def mark_moved_chunk_deleted(store: Path, cid: int, seed: int) -> None:
    """Chunk ``cid``'s files deleted and its mark edited to another chunk's region (which is sound)."""
    for name in json.loads((store / "_sweep" / "initialized").read_text())["variables"]:
        _chunk_file(store, cid, name).unlink(missing_ok=True)
    other = (cid + 1 + seed % (CHUNKS - 1)) % CHUNKS
    _mark(store, cid).write_text(_mark(store, other).read_text())


def mark_region_edited(store: Path, cid: int, seed: int) -> None:
    rec = json.loads(_mark(store, cid).read_text())
    rec["slices"][-1] = [
        (rec["slices"][-1][0] + 1) % CHUNKS,
        (rec["slices"][-1][0] + 1) % CHUNKS + 1,
    ]
    _mark(store, cid).write_text(json.dumps(rec))


def planted_mark(store: Path, cid: int, seed: int) -> None:
    """A completion mark of a chunk that does not exist."""
    shutil.copy(_mark(store, cid), _mark(store, CHUNKS + seed % 5))


def dtype_edited(store: Path, cid: int, seed: int) -> None:
    p = store / "energy" / "zarr.json"
    meta = json.loads(p.read_text())
    meta["data_type"] = "float64" if meta["data_type"] != "float64" else "float32"
    p.write_text(json.dumps(meta))


def shape_edited(store: Path, cid: int, seed: int) -> None:
    p = store / "energy" / "zarr.json"
    meta = json.loads(p.read_text())
    meta["shape"][-1] += 1 + seed % 3
    p.write_text(json.dumps(meta))


def consolidated_dtype_edited(store: Path, cid: int, seed: int) -> None:
    """The root's consolidated copy (what xarray reads) of a variable's dtype."""
    p = store / "zarr.json"
    meta = json.loads(p.read_text())
    meta["consolidated_metadata"]["metadata"]["energy"]["data_type"] = "float64"
    p.write_text(json.dumps(meta))


def done_removed(store: Path, cid: int, seed: int) -> None:
    shutil.rmtree(store / "_sweep" / "done")


def claims_replaced_by_file(store: Path, cid: int, seed: int) -> None:
    shutil.rmtree(store / "_sweep" / "claims")
    (store / "_sweep" / "claims").write_text("not a directory")


DAMAGES = {
    f.__name__: f
    for f in (
        random_bytes_valid_crc,
        flipped_byte,
        swapped_chunk_files,
        nan_through_zarr,
        mark_moved_chunk_deleted,
        mark_region_edited,
        planted_mark,
        dtype_edited,
        shape_edited,
        consolidated_dtype_edited,
        done_removed,
        claims_replaced_by_file,
    )
}

#: What ``verify`` says, per damage (a substring of one reason).
REASONS = {
    "random_bytes_valid_crc": "does not decode",
    "flipped_byte": "checksum mismatch",
    "swapped_chunk_files": "digest",
    "nan_through_zarr": "digest",
    "mark_moved_chunk_deleted": "digest",
    "mark_region_edited": "digest",
    "planted_mark": "does not exist",
    "dtype_edited": "data_type",
    "shape_edited": "shape",
    "consolidated_dtype_edited": "consolidated",
    "done_removed": "_sweep/done is missing",
    "claims_replaced_by_file": "_sweep/claims is not a directory",
}


def _check_detected_and_repaired(
    spec_path: Path, ref_store: Path, out: Path, damage: str, cid: int, seed: int
) -> None:
    DAMAGES[damage](out, cid, seed)
    found = sweep_store.verify(out)
    assert found, damage
    assert any(REASONS[damage] in d.reason for d in found), (damage, found)
    with pytest.raises(sweep_store.StoreDamagedError) as info:
        sweep.load(out)
    assert len(str(info.value).splitlines()) == 1
    assert "--resume" in str(info.value)  # every one of these is repairable
    sweep.run_sweep(spec_path, out, resume=True, memory="1B", quiet=True)
    assert sweep_store.verify(out) == []
    ds = sweep.load(out)
    assert ds.attrs["chunks_done"] == ds.attrs["chunks_total"] == CHUNKS
    assert sorted(p.name for p in (out / "_sweep" / "done").iterdir()) == [
        f"{i:06d}" for i in range(CHUNKS)
    ]
    _assert_same(out, ref_store)


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damage_is_detected_and_repaired(ref, tmp_path, damage):
    spec_path, ref_store = ref
    out = tmp_path / "damaged.zarr"
    shutil.copytree(ref_store, out)
    _check_detected_and_repaired(spec_path, ref_store, out, damage, cid=1, seed=3)


@st.composite
def store_damage(draw):
    """One or two damages of the store (kind, chunk, seed of the bytes/offsets)."""
    kinds = draw(st.lists(st.sampled_from(sorted(DAMAGES)), min_size=1, max_size=2, unique=True))
    return [(k, draw(st.integers(0, CHUNKS - 1)), draw(st.integers(0, 2**16))) for k in kinds]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(damages=store_damage())
def test_any_store_damage_is_detected_and_repaired(ref, damages):
    spec_path, ref_store = ref
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "damaged.zarr"
        shutil.copytree(ref_store, out)
        applied = []
        for kind, cid, seed in damages:
            if not (out / "_sweep" / "done").is_dir() and kind in _NEEDS_MARKS:
                continue  # the marks are gone: nothing of that kind left to damage
            if kind == "mark_moved_chunk_deleted" and not _mark(out, cid).exists():
                continue
            if kind == "swapped_chunk_files" and "mark_moved_chunk_deleted" in applied:
                # chunk files are found through the marks: after a moved mark two chunks can name
                # the same file, and exchanging a file with itself damages nothing
                continue
            try:
                DAMAGES[kind](out, cid, seed)
            except RuntimeError:
                # nan_through_zarr after random_bytes_valid_crc on the same chunk: zarr cannot decode the
                # chunk it would write into, so this damage cannot be added to the one already there
                if kind != "nan_through_zarr" or not applied:
                    raise
                continue
            applied.append(kind)
        found = sweep_store.verify(out)
        assert found, applied
        with pytest.raises(sweep_store.StoreDamagedError):
            sweep.load(out)
        sweep.run_sweep(spec_path, out, resume=True, memory="1B", quiet=True)
        assert sweep_store.verify(out) == []
        _assert_same(out, ref_store)


_NEEDS_MARKS = {
    "random_bytes_valid_crc",
    "flipped_byte",
    "swapped_chunk_files",
    "nan_through_zarr",
    "mark_moved_chunk_deleted",
    "mark_region_edited",
    "planted_mark",
}


def test_planted_mark_is_not_counted_as_done(ref, tmp_path, capsys):
    """ "9 of 8 chunks done (-1 not computed)": a mark of a chunk that does not exist is damage,
    never a done chunk."""
    spec_path, ref_store = ref
    out = tmp_path / "planted.zarr"
    shutil.copytree(ref_store, out)
    planted_mark(out, 0, 1)
    assert sweep.load(out, verify=False).attrs["chunks_done"] == CHUNKS
    assert sweep_cli.main(["--verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert (
        "chunk 5, which does not exist (chunks 0 .. 3)" in err
        and "resume the sweep to repair" in err
    )
    assert sweep_cli.main(["--status", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert f"{CHUNKS} of {CHUNKS} chunks done" in captured.out and "does not exist" in captured.err
    assert sweep_cli.main([str(spec_path), "--out", str(out), "--resume", "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: repaired ") and "000005" in err[0]
    assert not _mark(out, 5).exists()
    assert sweep_cli.main(["--verify", str(out)]) == 0
    assert f"sound; {CHUNKS} of {CHUNKS} chunks done" in capsys.readouterr().out


def test_non_finite_values_are_recorded_failed(ref, tmp_path):
    """A result with NaN at a point reported ok is stored with status FAILED (and verifies)."""
    _, ref_store = ref
    out = tmp_path / "nan.zarr"
    shutil.copytree(ref_store, out)
    rec = json.loads(_mark(out, 2).read_text())
    ds = sweep.load(out)
    sel = {
        d: slice(a, b)
        for d, (a, b) in zip(ds.status.dims, [(i, i + 1) for i in rec["index"]] + rec["slices"])
    }
    results = {
        k: np.asarray(ds[k].isel(sel).values).reshape((1,) + ds[k].shape[len(ds.status.dims) :])
        for k in ds.data_vars
    }
    results["energy"] = results["energy"].copy()
    results["energy"][0, -1] = np.inf
    assert results["status"][0] == sweep_store.OK
    sweep_store.write_chunk(
        out, 2, tuple(rec["index"]), tuple(slice(a, b) for a, b in rec["slices"]), results
    )
    assert sweep_store.verify(out) == []
    assert sweep_store.failed_points(out, range(CHUNKS)) == {0: 0, 1: 0, 2: 1, 3: 0}
    assert int((sweep.load(out).status == sweep_store.FAILED).sum()) == 1


def test_infinite_results_are_ok_and_nan_is_failed():
    """``+inf`` is a result in ``INFINITE_RESULTS`` (no merge before t1), a failure elsewhere;
    NaN is a failure everywhere."""
    assert "first_merge_time" in sweep_store.INFINITE_RESULTS
    bad = sweep_store._nonfinite_points
    inf2 = np.array([np.inf, 1.0])
    assert bad({"first_merge_time": inf2}, (2,)).tolist() == [False, False]
    assert bad({"energy": inf2}, (2,)).tolist() == [True, False]
    assert bad({"first_merge_time": np.array([-np.inf, np.nan])}, (2,)).tolist() == [True, True]


def test_earlier_format_is_named(ref, tmp_path):
    _, ref_store = ref
    out = tmp_path / "format2.zarr"
    shutil.copytree(ref_store, out)
    p = out / "_sweep" / "initialized"
    info = json.loads(p.read_text())
    info["format"] = 2
    p.write_text(json.dumps(info))
    with pytest.raises(
        sweep_store.StoreFormatError,
        match=r"earlier meanfield version \(format 2, this version "
        r"reads format 3\)",
    ):
        sweep.load(out)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "meanfield.sweep", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.slow
def test_random_bytes_with_valid_crc_real_processes(ref, tmp_path, capsys):
    """Issue 27.2: a chunk replaced by random bytes plus their valid crc32c passed --verify and
    --status, --resume did nothing and plot crashed with a zstd error (--verify and plot run as
    real processes; the repair in this one)."""
    spec_path, ref_store = ref
    out = tmp_path / "crc.zarr"
    shutil.copytree(ref_store, out)
    random_bytes_valid_crc(out, 2, 7)
    r = _cli("--verify", str(out), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    err = r.stderr.strip().splitlines()
    assert (
        err[0].startswith("damaged: chunk 2: ")
        and "does not decode" in err[0]
        and "Traceback" not in r.stderr
    )
    r = _cli("plot", str(out), "--out", str(tmp_path / "plots"), cwd=tmp_path)
    assert (
        r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "chunk 2" in r.stderr
    ), r.stderr
    assert not (tmp_path / "plots").exists()
    assert sweep_cli.main([str(spec_path), "--out", str(out), "--resume", "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chunk 2" in err[0] and "recomputing" in err[0]
    assert sweep_store.verify(out) == []
    _assert_same(out, ref_store)


@pytest.mark.parametrize("damage", ["dtype_edited", "done_removed", "claims_replaced_by_file"])
def test_status_reports_repairable_damage(ref, tmp_path, damage, capsys):
    """``--status`` lists damaged metadata or bookkeeping (exit 1), it does not crash on it."""
    _, ref_store = ref
    out = tmp_path / "s.zarr"
    shutil.copytree(ref_store, out)
    DAMAGES[damage](out, 0, 0)
    assert sweep_cli.main(["--status", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert f"{REASONS[damage]}" in captured.err and "`--resume` repairs it" in captured.err
    assert "Traceback" not in captured.err


# ------------------------------------------------------------- things that are not files


def chunk_file_is_fifo(store: Path, cid: int, seed: int) -> None:
    """A FIFO in a chunk file's place: reading it would wait for a writer forever."""
    p = _chunk_file(store, cid, "energy")
    p.unlink()
    os.mkfifo(p)


def chunk_file_is_directory(store: Path, cid: int, seed: int) -> None:
    """A directory in a chunk file's place: zarr's rename of the recomputed chunk over it fails."""
    p = _chunk_file(store, cid, "energy")
    p.unlink()
    (p / "x").mkdir(parents=True)


def chunk_file_empty(store: Path, cid: int, seed: int) -> None:
    _chunk_file(store, cid, "energy").write_bytes(b"")


def mark_is_directory(store: Path, cid: int, seed: int) -> None:
    _mark(store, cid).unlink()
    _mark(store, cid).mkdir()


def mark_is_fifo(store: Path, cid: int, seed: int) -> None:
    _mark(store, cid).unlink()
    os.mkfifo(_mark(store, cid))


def mark_not_json(store: Path, cid: int, seed: int) -> None:
    _mark(store, cid).write_text("{not json")


def root_metadata_not_json(store: Path, cid: int, seed: int) -> None:
    """The root ``zarr.json`` (which holds the spec) overwritten: repaired from the creation copy."""
    (store / "zarr.json").write_text("garbage")


def root_metadata_is_fifo(store: Path, cid: int, seed: int) -> None:
    (store / "zarr.json").unlink()
    os.mkfifo(store / "zarr.json")


def array_metadata_not_json(store: Path, cid: int, seed: int) -> None:
    (store / "energy" / "zarr.json").write_text("[1, 2")


#: Damages replacing a file by something else (kept out of the random combinations: the other
#: damages read the marks and chunk files they would replace). Reason: a substring of verify's.
NOT_FILES = {
    f.__name__: (f, reason)
    for f, reason in (
        (chunk_file_is_fifo, "a FIFO, not a file"),
        (chunk_file_is_directory, "a directory, not a file"),
        (chunk_file_empty, "truncated (0 bytes)"),
        (mark_is_directory, "completion mark unreadable"),
        (mark_is_fifo, "completion mark unreadable"),
        (mark_not_json, "completion mark unreadable"),
        (root_metadata_not_json, "metadata unreadable"),
        (root_metadata_is_fifo, "a FIFO, not a file"),
        (array_metadata_not_json, "metadata unreadable"),
    )
}


@pytest.mark.parametrize("damage", list(NOT_FILES))
def test_non_file_damage_never_hangs_and_is_repaired(ref, tmp_path, damage, capsys):
    """Verify, ``--status`` and ``--resume`` neither hang on a FIFO nor fail on a directory in a
    file's place; the resumed store equals the undamaged one value for value."""
    spec_path, ref_store = ref
    out = tmp_path / "d.zarr"
    shutil.copytree(ref_store, out)
    fn, reason = NOT_FILES[damage]
    fn(out, 1, 0)
    found = sweep_store.verify(out)
    assert any(reason in d.reason for d in found), found
    assert sweep_cli.main(["--status", "--out", str(out)]) == 1
    assert "--resume" in capsys.readouterr().err
    assert (
        sweep_cli.main([str(spec_path), "--out", str(out), "--resume", "--memory", "1B", "--quiet"])
        == 0
    )
    assert sweep_store.verify(out) == []
    _assert_same(out, ref_store)


@pytest.mark.slow
def test_fifo_chunk_file_verify_real_process(ref, tmp_path):
    """A real process: ``--verify`` of a store with a FIFO for a chunk file answers (exit 1, one
    line naming the file) instead of waiting for a writer."""
    _, ref_store = ref
    out = tmp_path / "fifo.zarr"
    shutil.copytree(ref_store, out)
    chunk_file_is_fifo(out, 2, 0)
    r = _cli("--verify", str(out), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    first = r.stderr.strip().splitlines()[0]
    assert (
        first.startswith("damaged: chunk 2: ")
        and "a FIFO, not a file" in first
        and "Traceback" not in r.stderr
    )


def test_plot_no_verify_of_undecodable_chunk_is_one_line(ref, tmp_path, capsys):
    """``meanfield plot --no-verify`` skips the verification; a chunk that does not decode then
    surfaced as a zstd traceback: one line naming the store and ``--verify``, exit 2."""
    _, ref_store = ref
    out = tmp_path / "crc.zarr"
    shutil.copytree(ref_store, out)
    random_bytes_valid_crc(out, 1, 5)
    assert sweep_cli.plot_main([str(out), "--out", str(tmp_path / "plots"), "--no-verify"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"meanfield plot: error: {out}: data do not decode (")
    assert err[0].endswith(f"`meanfield sweep --verify {out}` names the chunk")


def test_oversized_chunk_file_is_damage_not_read(ref, tmp_path):
    """A chunk file grown to 20 GiB (sparse) was read whole into memory: its size alone is
    damage, reported without reading it, and recomputed by ``--resume``."""
    spec_path, ref_store = ref
    out = tmp_path / "big.zarr"
    shutil.copytree(ref_store, out)
    p = _chunk_file(out, 3, "collapse_gap")
    os.truncate(p, 20 * 2**30)
    found = sweep_store.verify(out)
    assert len(found) == 1 and found[0].chunk == 3 and found[0].path == p
    assert found[0].reason.startswith(f"unreadable ({20 * 2**30} bytes, more than the ")
    sweep.run_sweep(spec_path, out, resume=True, memory="1B", quiet=True)
    assert sweep_store.verify(out) == []
    _assert_same(out, ref_store)


def test_metadata_and_its_record_both_edited_is_not_sound(ref, tmp_path, capsys):
    """An array's dtype edited in its ``zarr.json`` and in the creation record alike: verify
    read the chunks with the edited dtype and, after the recomputation, called the store sound
    while ``load`` (the root's consolidated copy) crashed in a reshape. The copies disagree:
    damage that no repair can settle (a new store), one line, exit 2."""
    spec_path, ref_store = ref
    out = tmp_path / "both.zarr"
    shutil.copytree(ref_store, out)
    dtype_edited(out, 0, 0)
    p = out / "_sweep" / "initialized"
    info = json.loads(p.read_text())
    info["metadata"]["energy/zarr.json"]["data_type"] = "float64"
    p.write_text(json.dumps(info))
    found = sweep_store.verify(out)
    assert [d.reason for d in found] == [
        "metadata differs from the root's consolidated copy of 'energy' (the "
        "record of the store's creation was edited too)"
    ]
    assert not found[0].repairable
    assert sweep_cli.main([str(spec_path), "--out", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        "cannot be recomputed: run the sweep into a new store"
    ), err
    with pytest.raises(sweep_store.StoreDamagedError, match="run the sweep into a new store"):
        sweep.load(out)
