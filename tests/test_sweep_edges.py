"""Job-array and CLI edges of the sweep (issue 27, item 8): an absurd or non-ASCII ``--part``, a
split with more parts than chunks, a prompt count the model refuses, grid values that are one
number in the sweep's dtype, a spec path that is a directory, an empty ``--out``. Each is a
one-line error (Python: ``ValueError`` naming the value; CLI: one line on stderr, exit 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meanfield import sweep
from meanfield.sweep import cli as sweep_cli
from meanfield.sweep import parse_spec
from meanfield.sweep import run as sweep_run
from meanfield.sweep import store as sweep_store

SPEC = """
[model]
kind = "usa"
[grid]
n = [8]
beta = [1.0, 2.0]
seeds = 2
[time]
t1 = 0.5
dt = 0.1
save = 3
"""


def _one_line_error(capsys, argv: list[str]) -> str:
    assert sweep_cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("meanfield sweep: error: "), err
    return err[0]


@pytest.mark.parametrize(
    "part, message",
    [
        ("1/1000000000", "N must be <= 1000000"),
        (
            "\u00b2/3",
            "part must be I/N with integers",
        ),  # a superscript two: isdigit() but no integer
        ("1/\u0663", "part must be I/N with integers"),  # an Arabic-Indic three
        ("0/3", "I must be between 1 and N"),
    ],
)
def test_bad_part_is_refused(part, message, capsys, tmp_path):
    with pytest.raises(ValueError, match=message):
        sweep_run.parse_part(part)
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    line = _one_line_error(capsys, [str(spec), "--out", str(tmp_path / "o.zarr"), "--part", part])
    assert message in line
    assert not (tmp_path / "o.zarr").exists()


@settings(max_examples=25, deadline=None)
@given(st.text(max_size=12))
def test_part_parser_only_raises_value_errors(text):
    try:
        i, n = sweep_run.parse_part(text)
    except ValueError as e:
        assert "part" in str(e) and "\n" not in str(e)
    else:
        assert text.strip().count("/") == 1 and 1 <= i <= n <= sweep_run.MAX_CHUNKS


def test_more_parts_than_chunks_is_refused_before_the_store_exists(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)  # 4 points
    with pytest.raises(
        ValueError, match=r"part 1/5: N = 5 is more than the 4 chunk\(s\) of this sweep; use N <= 4"
    ):
        sweep.run_sweep(spec, tmp_path / "o.zarr", memory="1B", part="1/5", quiet=True)
    assert not (tmp_path / "o.zarr").exists()
    line = _one_line_error(
        capsys, [str(spec), "--out", str(tmp_path / "o.zarr"), "--memory", "1B", "--part", "3/1000"]
    )
    assert "N = 1000 is more than the 4 chunk(s)" in line


@pytest.mark.slow
def test_status_refuses_an_impossible_recorded_split(tmp_path, capsys):
    """``--status`` built one row per recorded part: a split edited to 10^9 parts is an error, not
    a billion rows."""
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    out = tmp_path / "o.zarr"
    sweep.run_sweep(spec, out, memory="1B", part="1/2", quiet=True)
    assert sweep_store.recorded_parts(out) == 2
    (out / "_sweep" / "parts").write_text(json.dumps({"parts": 10**9}))
    line = _one_line_error(capsys, ["--status", "--out", str(out)])
    assert "split into 1000000000 parts is impossible for 4 chunk(s)" in line


def test_prompts_beyond_n_are_refused_as_simulate_does(tmp_path, capsys):
    text = SPEC.replace('kind = "usa"', 'kind = "prompt"\nprompts = 100')
    with pytest.raises(ValueError, match=r"model.prompts must be <= grid.n = 8 .*got 100"):
        parse_spec(text)
    assert parse_spec(text.replace("prompts = 100", "prompts = 8")).params["prompts"] == 8
    spec = tmp_path / "p.toml"
    spec.write_text(text)
    assert "model.prompts must be <= grid.n = 8" in _one_line_error(
        capsys, [str(spec), "--out", str(tmp_path / "o.zarr")]
    )


@pytest.mark.parametrize(
    "dtype, values, ok",
    [
        ("float32", "[1.0, 1.00000001]", False),
        (
            "float32",
            "[0.5, 1.0, 1.0000000596]",
            False,
        ),  # half an ulp of float32 at 1.0: rounds to 1.0
        ("float64", "[1.0, 1.00000001]", True),
        ("float32", "[1.0, 1.0000002]", True),  # more than half an ulp apart: two float32 numbers
    ],
)
def test_grid_values_must_differ_in_the_sweep_dtype(dtype, values, ok):
    text = f'dtype = "{dtype}"\n' + SPEC.replace("beta = [1.0, 2.0]", f"beta = {values}")
    if ok:
        assert len(parse_spec(text).axes["beta"]) == len(json.loads(values))
    else:
        with pytest.raises(
            ValueError, match=rf"grid.beta values 1.0 and 1.0000000\d* are the same {dtype} number"
        ):
            parse_spec(text)


def test_swept_model_parameter_must_differ_in_dtype():
    text = SPEC.replace('kind = "usa"', 'kind = "gauge"\namplitude = [0.3, 0.30000000001]')
    with pytest.raises(
        ValueError, match="model.amplitude values 0.3 and 0.30000000001 are the same float32"
    ):
        parse_spec(text)


def test_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="out must be the path of the store, got ''"):
        sweep.run_sweep(spec, "", quiet=True)
    assert _one_line_error(capsys, [str(spec), "--out", ""]).endswith(
        "--out must be a path, got ''"
    )
    assert _one_line_error(capsys, ["--status", "--out", " "]).endswith(
        "--out must be a path, got ' '"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]


@pytest.mark.slow
def test_spec_path_that_is_a_directory_real_process(tmp_path):
    """A real process: one line naming the directory, exit 2, no traceback."""
    (tmp_path / "spec.toml").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory, not a TOML file"):
        sweep.load_spec(tmp_path / "spec.toml")
    r = subprocess.run(
        [sys.executable, "-m", "meanfield", "sweep", "spec.toml", "--out", "o.zarr"],
        cwd=tmp_path,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert (
        r.stderr.strip()
        == "meanfield sweep: error: sweep spec spec.toml is a directory, not a TOML file"
    )
    assert not Path(tmp_path / "o.zarr").exists()


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda p: os.mkfifo(p),
            "is not a regular file (a FIFO, socket or device), not a TOML file",
        ),
        (
            lambda p: p.write_bytes(b"\xff\xfe[model]"),
            "is not UTF-8 text (byte 0: invalid start byte), not a TOML file",
        ),
    ],
)
def test_spec_path_that_is_a_fifo_or_not_text(tmp_path, capsys, make, message):
    """A FIFO was "not found" (and reading it would wait for a writer); bytes that are not UTF-8
    gave a bare codec error naming no file."""
    spec = tmp_path / "spec.toml"
    make(spec)
    with pytest.raises(ValueError, match=re.escape(message)):
        sweep.load_spec(spec)
    line = _one_line_error(capsys, [str(spec), "--out", str(tmp_path / "o.zarr")])
    assert line == f"meanfield sweep: error: sweep spec {spec} {message}"
    assert not (tmp_path / "o.zarr").exists()


def test_out_through_a_missing_directory_and_dotdot(tmp_path, capsys, monkeypatch):
    """``--out missing/../o.zarr`` created ``missing`` and then said the store "was created by
    another process meanwhile": one line naming the missing directory, nothing created."""
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    line = _one_line_error(
        capsys, [str(spec), "--out", "missing/../o.zarr", "--memory", "1B", "--quiet"]
    )
    assert line.endswith(
        "cannot create store missing/../o.zarr: missing does not exist "
        "(a path through '..' is resolved from existing directories)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.toml"]
