"""On-disk store of a sweep: an xarray Dataset in a zarr store, filled chunk by chunk,
resumable, checksummed, safe for several writers.

The store knows nothing of specs and plans: ``create`` receives the layout as plain data
(``meanfield.sweep.plan.store_layout``) and writes everything later readers need into
the store itself (the spec's text, normalised JSON and hash in the attributes; the
chunking, the chunk count and the variables in ``_sweep/initialized``).

Layout of ``STORE.zarr``::

    zarr.json, <variables>/, <coordinates>/    the Dataset (xarray, zarr format 3)
    _sweep/zarr.json                            a zarr group holding the bookkeeping:
    _sweep/initialized                          format, chunking, chunk count, variables, the
                                                metadata as created (JSON)
    _sweep/done/000017                          completion mark of chunk 17 (its region and the
                                                digest of its data, JSON)
    _sweep/claims/000017                        lock file of chunk 17 (``fcntl.flock``)
    _sweep/parts                                the split between job-array parts, if any (JSON)

Creation is atomic and exclusive: the whole skeleton (every point pending) is built in a
hidden directory beside ``STORE.zarr`` and renamed into place; the rename fails when the
path exists and is not empty, so of two writers creating the same new store exactly one
succeeds and the other gets ``FileExistsError`` (nobody overwrites another's store).

Every array carries zarr's ``crc32c`` codec (after ``zstd``): a truncated, overwritten or
bit-flipped chunk file fails its checksum when read. A checksum detects corruption, not
substitution (two valid chunk files swapped, values written through zarr later), so each
completion mark also records a digest: sha256 over the spec's hash, the chunk's id, its
region and every variable's values there (``write_chunk``, which also records a point
holding NaN or inf as ``FAILED``). ``verify`` checks every chunk marked done: each of its
zarr chunk files exists (a missing file would read back as the fill value, NaN or
``PENDING``), has a matching checksum and decodes, the digest of the decoded values equals
the mark's, and no point of it is ``PENDING``; marks of chunks that do not exist, missing
bookkeeping directories and array metadata that differs from the copy recorded at creation
are ``repairable`` damage that ``repair`` (run by ``--resume``) restores. ``load`` verifies
by default and raises ``StoreDamagedError`` (the chunk and the file) on the first damage.

Writers: each sweep chunk covers whole zarr chunks of every variable (the zarr chunking is
the smallest chunk block; larger blocks are unions of it) and zarr writes each chunk file
atomically (temporary file and rename). A chunk's completion mark is written (atomically,
by rename) after all its data. A writer computes a chunk only while it holds the chunk's
claim, an exclusive ``fcntl.flock`` on ``_sweep/claims/<chunk>`` (``claim``): no lock is
held for a whole run, so several processes fill disjoint chunks of one store at once, and
a claim dies with its process (``SIGKILL`` included), so a crashed writer never blocks the
others. A sweep killed at any moment therefore leaves complete chunks marked and the rest
unmarked; ``--resume`` recomputes exactly the unmarked (and the damaged) chunks and
overwrites any partial files they left, so the store ends with the data of an
uninterrupted run.

Backends: a store of a kind with a ``backend`` option records, at creation, the evaluation
path of each group (``"native"`` or ``"xla"``: ``model.backend = "auto"`` decided once, see
``meanfield.sweep.run``) in ``_sweep/initialized`` and in the attribute ``backends``, and binds
it into every chunk's digest: every chunk, resumed ones included, runs the recorded path, an
attribute that differs from the record is repairable damage, and a record edited in both places
fails every chunk's digest (``recorded_backends``, ``verify``).

Dimensions: ``model`` (when ``kind`` is a list), ``n``, ``d`` (when a list),
``beta`` or ``beta_factor`` (then ``beta`` is a coordinate over ``(n, [d], beta_factor)``),
swept model parameters, ``seed``, and ``time`` or ``rank``. ``status``: ``PENDING`` (0),
``OK`` (1), ``FAILED`` (2: the state went non-finite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import stat
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from ._diff import key_differences

#: A store's path: a string or a path-like object.
_StorePath = str | os.PathLike[str]

__all__ = [
    "create",
    "INFINITE_RESULTS",
    "stored_attributes",
    "check_resumable",
    "done_chunks",
    "is_done",
    "write_chunk",
    "discard",
    "claim",
    "is_claimed",
    "record_parts",
    "recorded_parts",
    "recorded_backends",
    "BACKEND_PATHS",
    "failed_points",
    "verify",
    "repair",
    "load",
    "Damage",
    "StoreError",
    "StoreFormatError",
    "StoreDamagedError",
    "FORMAT",
    "PENDING",
    "OK",
    "FAILED",
]

#: Variables where ``+inf`` is a result, not a failure: ``first_merge_time`` is ``inf`` when
#: nothing merged before ``t1`` (``mf.metastability.first_merge_time``). NaN is a failure everywhere.
INFINITE_RESULTS = frozenset({"first_merge_time"})

#: Values of the ``status`` variable (CF ``flag_values``/``flag_meanings``).
PENDING, OK, FAILED = 0, 1, 2

#: Format of the store (``_sweep/initialized["format"]``): 3 = checksummed chunks, completion
#: marks that record their region and a digest of their data bound to the chunk and the spec,
#: and a copy of the array metadata. Format 2 (checksums without digests) and format 1 (no
#: checksums) were written by earlier meanfield versions.
FORMAT = 3

_META = "_sweep"


class StoreError(ValueError):
    """A path that is not a usable sweep store (a ``ValueError``: the CLI reports one line)."""


class StoreFormatError(StoreError):
    """A store written by an earlier meanfield version (no checksums): it cannot be verified
    or resumed; ``load(store, verify=False)`` still reads it."""


@dataclasses.dataclass(frozen=True)
class Damage:
    """One damaged piece of a store: sweep chunk ``chunk`` (``None``: a coordinate or the
    metadata), the file and what is wrong with it. ``repairable``: damage of the bookkeeping
    or of the array metadata that ``repair`` (run by ``--resume``) restores; damage of a chunk
    (``chunk`` not None) is repaired by recomputing the chunk."""

    chunk: int | None
    path: Path
    reason: str
    repairable: bool = False

    def __str__(self) -> str:
        where = f"chunk {self.chunk}" if self.chunk is not None else "metadata"
        return f"{where}: {self.path}: {self.reason}"


class StoreDamagedError(StoreError):
    """A store with damaged chunks (``damages``; ``chunk`` and ``path`` of the first).

    The message is one line naming the first damaged chunk and file and how many more.
    """

    def __init__(self, store: _StorePath, damages: Iterable[Damage]) -> None:
        self.store = Path(store)
        self.damages = tuple(damages)
        first = self.damages[0]
        self.chunk, self.path = first.chunk, first.path
        chunks = {d.chunk for d in self.damages}
        more = f" ({len(chunks)} damaged chunks in all)" if len(chunks) > 1 else ""
        repair = (
            "`meanfield sweep SPEC --out STORE --resume` recomputes it"
            if all(d.chunk is not None for d in self.damages)
            else "`meanfield sweep SPEC --out STORE --resume` repairs it"
            if all(d.chunk is not None or d.repairable for d in self.damages)
            else "a damaged coordinate or metadata file cannot be recomputed: run the sweep into a new store"
        )
        super().__init__(f"store {self.store} is damaged: {first}{more}; {repair}")


def _quiet_zarr() -> warnings.catch_warnings:
    """Silence zarr's notice that consolidated metadata is not in the v3 spec (xarray uses it)."""
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.filterwarnings("ignore", message=".*[Cc]onsolidated metadata.*")
    warnings.filterwarnings(
        "ignore", message=".*not recognized as a component of a Zarr hierarchy.*"
    )
    return ctx


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a uniquely named temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _read_regular(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path`` when it is a regular file: opened without blocking, so a FIFO, a
    device or a directory put in a file's place is an ``OSError`` (never a read that waits for a
    writer forever), as is a file of more than ``max_bytes``. ``FileNotFoundError`` when absent."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(mode)
                else "a FIFO"
                if stat.S_ISFIFO(mode)
                else "not a regular file"
            )
            raise OSError(errno.EINVAL, f"{kind}, not a file", str(path))
        if max_bytes is not None and st.st_size > max_bytes:
            raise OSError(
                errno.EFBIG,
                f"{st.st_size} bytes, more than the {max_bytes} a chunk's file can hold",
                str(path),
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _read_text(path: Path) -> str:
    return _read_regular(path).decode()


def _coord(value: Any) -> Any:
    """A coordinate of the layout as xarray takes it (strings variable-length: zarr v3 "string")."""
    if isinstance(value, tuple):
        dims, vals = value
        return (list(dims), _coord(vals))
    arr = np.asarray(value)
    return arr.astype(object) if arr.dtype.kind == "U" else arr


def _codecs() -> list:
    """Bytes-to-bytes codecs of every array: zstd, then the crc32c checksum of the result."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    return [ZstdCodec(), Crc32cCodec()]


def _skeleton(layout: dict) -> tuple[Any, dict, list[str]]:
    """The Dataset with every point pending (NaN / 0), and its zarr encoding."""
    import xarray as xr

    dims = list(layout["dims"])
    coords = {k: _coord(v) for k, v in layout["coords"].items()}
    sizes = {k: (len(v[1]) if isinstance(v, tuple) else len(v)) for k, v in coords.items()}
    grid_shape = tuple(sizes[d] for d in dims)
    zblock = tuple(layout["chunks"])
    data_vars, encoding = {}, {}
    variables = dict(layout["variables"])
    variables["status"] = {
        "dims": [],
        "dtype": "int8",
        "description": f"{PENDING} pending, {OK} ok, {FAILED} failed (non-finite state)",
    }
    for name, var in variables.items():
        trailing = list(var["dims"])
        shape = grid_shape + tuple(sizes[t] for t in trailing)
        dtype = np.dtype(var["dtype"])
        # broadcast views: the skeleton's chunks are all fill values, which zarr does not write
        arr = np.broadcast_to(np.asarray(np.nan if dtype.kind == "f" else PENDING, dtype), shape)
        attrs = {"description": var["description"]}
        if name == "status":
            attrs.update(flag_values=[PENDING, OK, FAILED], flag_meanings="pending ok failed")
        data_vars[name] = (dims + trailing, arr, attrs)
        encoding[name] = {"chunks": zblock + tuple(shape[len(dims) :]), "compressors": _codecs()}
    for name in coords:
        encoding[name] = {"compressors": _codecs()}
    attrs = {**layout["attrs"], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if layout.get("backends") is not None:  # JSON text, as spec_json: any reader's attrs hold it
        attrs["backends"] = json.dumps(layout["backends"], sort_keys=True)
    return xr.Dataset(data_vars, coords=coords, attrs=attrs), encoding, list(variables)


def create(out: _StorePath, layout: dict) -> None:
    """Create the store (all points pending), atomically and exclusively.

    The skeleton is built in a hidden directory beside ``out`` and renamed to ``out``: a
    concurrent reader sees either no store or a complete one, and when ``out`` already
    exists (and is not an empty directory) nothing is written and ``FileExistsError`` is
    raised, also when another process created it in the meantime.

    ``layout`` is plain data (``meanfield.sweep.plan.store_layout``): ``dims``, ``coords``,
    ``variables``, ``chunks``, ``attrs`` (with ``spec_json`` and ``spec_hash``), ``blocks``,
    ``chunks_total`` and, for a kind with a ``backend`` option, ``backends``: the evaluation
    path of each group (``{"usa n=24 d=3": "native", ...}``), recorded in the bookkeeping and
    in the attribute ``backends`` (JSON) and bound into every chunk's digest
    (``recorded_backends``). Other file system errors (a parent that is a file, no write
    permission, a read-only file system) propagate as ``OSError``.
    """
    out = Path(out)
    for i, part in enumerate(out.parts):
        if (
            part == ".." and i and not Path(*out.parts[:i]).is_dir()
        ):  # "a/../x": "a" would be created, x not
            raise FileNotFoundError(
                f"cannot create store {out}: {Path(*out.parts[:i])} does not exist "
                "(a path through '..' is resolved from existing directories)"
            )
    above = out.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise NotADirectoryError(f"cannot create store {out}: {above} is a file, not a directory")
    tmp = out.parent / f".{out.name}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(tmp)
    except OSError as e:
        raise type(e)(
            f"cannot create store {out}: {e.strerror or e} ({e.filename or out.parent})"
        ) from None
    try:
        _build(tmp, layout)
        try:
            os.rename(tmp, out)
        except OSError as e:
            if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(
                    f"store {out} already exists (created by another process)"
                ) from None
            if e.errno == errno.ENOTDIR:
                raise FileExistsError(
                    f"{out} exists and is not a directory (a zarr store); use another path"
                ) from None
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _build(path: Path, layout: dict) -> None:
    import zarr

    ds, encoding, variables = _skeleton(layout)
    ctx = _quiet_zarr()
    try:
        ds.to_zarr(path, mode="w-", encoding=encoding, consolidated=True)
        zarr.open_group(path / _META, mode="w")
    finally:
        ctx.__exit__(None, None, None)
    (path / _META / "done").mkdir(parents=True, exist_ok=True)
    (path / _META / "claims").mkdir(parents=True, exist_ok=True)
    info = {
        "format": FORMAT,
        "blocks": [list(b) for b in layout["blocks"]],
        "zarr_block": list(layout["chunks"]),
        "spec_hash": layout["attrs"]["spec_hash"],
        "chunks_total": int(layout["chunks_total"]),
        "grid_ndim": len(layout["dims"]),
        "variables": variables,
        **({} if layout.get("backends") is None else {"backends": dict(layout["backends"])}),
        # the metadata as created: ``verify`` compares the store's with it, ``repair`` restores it
        "metadata": {
            str(f.relative_to(path)): json.loads(f.read_text()) for f in _metadata_files(path)
        },
    }
    _atomic_write(path / _META / "initialized", json.dumps(info))


def _metadata_files(path: Path) -> list[Path]:
    """The zarr metadata of the Dataset: the root ``zarr.json`` (with the consolidated copy of
    every array's) and each array's ``zarr.json``."""
    return [path / "zarr.json"] + sorted(
        f for f in path.glob("*/zarr.json") if f.parent.name != _META
    )


#: The fields of an array's metadata that decide how its chunk files are read.
_ARRAY_FIELDS = (
    "node_type",
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "codecs",
    "fill_value",
    "dimension_names",
)


def _structure(meta: Any) -> Any:
    """What of a metadata document must not change after creation: an array's shape, dtype,
    chunking and codecs; a group's consolidated copy of them and the spec it was made from."""
    if not isinstance(meta, dict):
        return meta
    if meta.get("node_type") == "array":
        return {k: meta.get(k) for k in _ARRAY_FIELDS}
    consolidated = meta.get("consolidated_metadata")
    arrays = consolidated.get("metadata") if isinstance(consolidated, dict) else consolidated
    attrs = meta.get("attributes")
    attrs = attrs if isinstance(attrs, dict) else {}
    return {
        "node_type": meta.get("node_type"),
        "consolidated": {k: _structure(v) for k, v in arrays.items()}
        if isinstance(arrays, dict)
        else arrays,
        "spec_hash": attrs.get("spec_hash"),
        "spec_json": attrs.get("spec_json"),
        "backends": attrs.get("backends"),
    }


def _info(out: Path, *, legacy_ok: bool = False) -> dict:
    """``_sweep/initialized`` of a store (``StoreError`` when absent or unreadable,
    ``StoreFormatError`` for a store of format 1 unless ``legacy_ok``)."""
    mark = out / _META / "initialized"
    try:
        info = json.loads(_read_text(mark))
        if not isinstance(info, dict) or "blocks" not in info:
            raise ValueError("no chunking")
    except FileNotFoundError:
        raise StoreError(
            f"{out} is not a complete sweep store (no {_META}/initialized: its creation was interrupted "
            "by an earlier meanfield version); remove it or use another path"
        ) from None
    except (OSError, ValueError) as e:
        raise StoreError(f"{out}: {mark} is unreadable ({e}); the store cannot be used") from None
    if info.get("format") != FORMAT and not legacy_ok:
        what = (
            "no checksums"
            if "format" not in info
            else f"format {info['format']}, this version reads format {FORMAT}"
        )
        raise StoreFormatError(
            f"store {out} was written by an earlier meanfield version ({what}): it cannot be "
            "verified or resumed; run the sweep into a new store (it still reads with "
            "sweep.load(store, verify=False) or `meanfield plot --no-verify`)"
        )
    return info


def stored_attributes(out: _StorePath) -> dict:
    """The root attributes of the store (``spec``, ``spec_json``, ``spec_hash``, ...): from its
    ``zarr.json`` or, when that is unreadable or lost its spec (damage that ``repair`` restores),
    from the copy recorded at creation in ``_sweep/initialized``. Empty when neither has them."""
    out = Path(out)
    try:
        attrs = json.loads(_read_text(out / "zarr.json")).get("attributes", {})
    except (OSError, ValueError, AttributeError):
        attrs = {}
    if isinstance(attrs, dict) and "spec_json" in attrs:
        return attrs
    try:
        copy = json.loads(_read_text(out / _META / "initialized"))["metadata"]["zarr.json"][
            "attributes"
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return copy if isinstance(copy, dict) else {}


def check_resumable(out: _StorePath, spec_json: dict) -> dict | None:
    """Check that ``out`` is a store of the normalised spec ``spec_json``; return its
    bookkeeping (``blocks``: the stored chunking, ``chunks_total``, ...), or None for an
    empty directory (the store is still to be created).

    Raises ``StoreError`` (a ``ValueError``) naming the differing keys when the spec
    differs, for a directory that is not a sweep store and for a store of an earlier
    format; ``FileExistsError`` when ``out`` is not a directory.
    """
    out = Path(out)
    if not out.is_dir():
        raise FileExistsError(
            f"{out} exists and is not a directory (a zarr store); use another path"
        )
    root = out / "zarr.json"
    if not root.exists():
        if any(out.iterdir()):
            raise StoreError(f"{out} is not a sweep store (no zarr.json); use another path")
        return None
    attrs = stored_attributes(out)
    if "spec_json" not in attrs:
        raise StoreError(
            f"{out} is not a sweep store (no spec in its attributes); use another path"
        )
    info = _info(out)
    stored = json.loads(attrs["spec_json"])
    given = json.loads(json.dumps(spec_json, sort_keys=True))  # as it would be stored
    if stored != given:
        diffs = key_differences(stored, given)
        raise StoreError(
            f"cannot resume: store {out} was made from a different spec (differing keys: "
            f"{', '.join(diffs)}); use the same spec or another path"
        )
    return info


def done_chunks(out: _StorePath, total: int | None = None) -> set[int]:
    """Ids of the chunks whose completion mark exists (below ``total``, when given: a mark of a
    chunk that does not exist is damage, reported by ``verify``, not a done chunk)."""
    d = Path(out) / _META / "done"
    if not d.is_dir():
        return set()
    ids = {int(p.name) for p in d.iterdir() if p.name.isascii() and p.name.isdigit()}
    return ids if total is None else {i for i in ids if i < total}


def _mark(out: Path, cid: int) -> Path:
    return out / _META / "done" / f"{cid:06d}"


def is_done(out: _StorePath, cid: int) -> bool:
    """Whether chunk ``cid`` carries its completion mark."""
    return _mark(Path(out), cid).exists()


@contextlib.contextmanager
def claim(out: _StorePath, cid: int, *, wait: bool = False) -> Iterator[bool]:
    """Hold the claim of chunk ``cid`` (an exclusive ``fcntl.flock`` on its lock file).

    Yields True when the claim is held (with ``wait``, after the current holder, if any,
    releases it), False when another writer holds it (``wait=False``). The claim is
    released on exit and when the process dies. Lock files are never deleted (deleting a
    lock file others may be waiting on would let two writers hold "the" claim).
    """
    path = Path(out) / _META / "claims" / f"{cid:06d}"
    path.parent.mkdir(exist_ok=True)
    fd = os.open(
        path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o666
    )  # a FIFO put here never blocks
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            got = True
        except BlockingIOError:
            got = False
        yield got
    finally:
        os.close(fd)  # releases the lock


def is_claimed(out: _StorePath, cid: int) -> bool:
    """Whether another writer holds the claim of chunk ``cid`` now (it is being computed).

    Tests the lock without waiting (and releases it at once); a chunk never claimed has no
    lock file and is not claimed.
    """
    path = Path(out) / _META / "claims" / f"{cid:06d}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put here never blocks
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _parts_path(out: Path) -> Path:
    return out / _META / "parts"


def recorded_parts(out: _StorePath) -> int | None:
    """The number of job-array parts the store is split into (``record_parts``), or None."""
    try:
        return int(json.loads(_read_text(_parts_path(Path(out))))["parts"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{out}: {_parts_path(Path(out))} is unreadable ({e})") from None


#: The evaluation paths a store may record for its groups (``recorded_backends``).
BACKEND_PATHS = ("native", "xla")


def recorded_backends(out: _StorePath) -> dict[str, str] | None:
    """The evaluation path of each group (``"native"`` or ``"xla"``, keyed ``"MODEL n=N d=D"``)
    recorded when the store was created, what every chunk of it ran and every resumed chunk
    runs; ``None`` for a store without the record (a kind without a ``backend`` option, or a
    store of an earlier meanfield version). ``StoreError`` when the record is malformed or
    disagrees with the spec's explicit ``model.backend`` (``_backend_damage``)."""
    out = Path(out)
    info = _info(out)
    problem = _backend_damage(out, info)
    if problem is not None:
        raise StoreError(f"store {out}: {problem.reason}; run the sweep into a new store")
    return None if "backends" not in info else dict(info["backends"])


def _backend_damage(out: Path, info: dict) -> Damage | None:
    """What is wrong with the record of the backends (``None``: nothing): not a mapping of group
    to ``BACKEND_PATHS``, or a path other than the spec's explicit ``model.backend``. Not
    repairable: the chunks are bound to it (their digests)."""
    if "backends" not in info:
        return None
    rec = info["backends"]
    where = out / _META / "initialized"
    if not (
        isinstance(rec, dict)
        and all(isinstance(k, str) and v in BACKEND_PATHS for k, v in rec.items())
    ):
        return Damage(
            None, where, f"the record of the backends is malformed ({json.dumps(rec)[:200]})"
        )
    try:
        model = json.loads(stored_attributes(out).get("spec_json", "{}")).get("model", {})
        given = model.get("backend") if isinstance(model, dict) else None
    except (ValueError, AttributeError):
        given = None
    if given in BACKEND_PATHS and any(v != given for v in rec.values()):
        return Damage(
            None,
            where,
            f"the record of the backends ({json.dumps(rec, sort_keys=True)}) disagrees with the "
            f"spec's model.backend = {given!r}",
        )
    return None


def record_parts(out: _StorePath, parts: int) -> None:
    """Record that the store is split into ``parts`` job-array parts (the first part to run
    records it: an exclusive hard link of a complete temporary file, so concurrent parts
    race safely); ``StoreError`` when it was split another way."""
    out = Path(out)
    path = _parts_path(out)
    if recorded_parts(out) is None:
        tmp = path.with_name(f".parts.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_text(json.dumps({"parts": int(parts)}))
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # fails when another part recorded first: then compare
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    have = recorded_parts(out)
    if have != int(parts):
        raise StoreError(
            f"store {out} is split into {have} parts (--part I/{have}), not {parts}: every part of "
            f"one store uses the same N (or run `--resume` without --part to complete it all)"
        )


def failed_points(out: _StorePath, cids: Iterable[int]) -> dict[int, int]:
    """Points with status ``FAILED`` in each chunk of ``cids`` that is marked done (its region
    from its completion mark; one read of the ``status`` array)."""
    import zarr

    out = Path(out)
    ids = sorted(set(cids) & done_chunks(out))
    if not ids:
        return {}
    ctx = _quiet_zarr()
    try:
        status = np.asarray(
            cast(Any, zarr.open_group(out, mode="r", use_consolidated=False)["status"])[...]
        )
    finally:
        ctx.__exit__(None, None, None)
    counts = {}
    for cid in ids:
        try:
            rec = json.loads(_read_text(_mark(out, cid)))
        except (OSError, ValueError):
            continue  # unmarked meanwhile or unreadable (``verify`` reports the latter)
        sel = tuple(slice(int(i), int(i) + 1) for i in rec["index"]) + tuple(
            slice(int(a), int(b)) for a, b in rec["slices"]
        )
        counts[cid] = int(np.count_nonzero(status[sel] == FAILED))
    return counts


def _digest(
    spec_hash: str,
    cid: int,
    region: list[tuple[int, int]],
    values: dict[str, np.ndarray],
    backends: dict | None = None,
) -> str:
    """sha256 over the spec's hash, the chunk's id and region, the store's record of its backends
    (when it has one) and each variable's values in the region (name, dtype, shape, bytes;
    variables by name): the data of this chunk of this sweep on these paths. A chunk file
    swapped with another's, values written into the region afterwards, or an edited record of
    the backends change it."""
    h = hashlib.sha256()
    head: dict = {"spec_hash": spec_hash, "chunk": int(cid), "region": [list(r) for r in region]}
    if backends is not None:
        head["backends"] = backends
    h.update(json.dumps(head, sort_keys=backends is not None).encode())
    for name in sorted(values):
        v = np.ascontiguousarray(values[name])
        h.update(json.dumps([name, v.dtype.str, list(v.shape)]).encode())
        h.update(v.tobytes())
    return h.hexdigest()


def _nonfinite_points(values: dict[str, np.ndarray], npoints_shape: tuple) -> np.ndarray:
    """Points (over the grid region, shape ``npoints_shape``) where a floating variable is NaN or
    infinite (``+inf`` is a result in the variables of ``INFINITE_RESULTS``)."""
    bad = np.zeros(npoints_shape, bool)
    k = len(npoints_shape)
    for name, v in values.items():
        if name != "status" and v.dtype.kind in "fc":
            ok = (np.isfinite(v) | (v == np.inf)) if name in INFINITE_RESULTS else np.isfinite(v)
            bad |= ~ok.reshape(v.shape[:k] + (-1,)).all(axis=-1)
    return bad


def write_chunk(out: _StorePath, cid: int, index: tuple, slices: tuple, results: dict) -> None:
    """Write one chunk's results then its completion mark (the chunk's region and a digest of
    its data, JSON).

    ``index``: integer positions along the leading grid dimensions (model, n, d);
    ``slices``: the chunk's block along the remaining grid dimensions; ``results``:
    name -> array flat over the block (row-major), with the variable's trailing axes, for
    every variable of the store. A point with status ``OK`` whose values are not all finite is
    recorded ``FAILED`` (a NaN is never stored as an ok result). Every zarr chunk file of the
    region is written, fill values included (a missing file then always means damage). The
    mark records ``digest``: sha256 of (the spec's hash, ``cid``, the region, every
    variable's values), which ``verify`` recomputes from the decoded files. Call it while
    holding ``claim(out, cid)``.
    """
    import zarr

    out = Path(out)
    info = _info(out)
    missing = sorted(set(info["variables"]) - set(results))
    if missing:
        raise ValueError(
            f"write_chunk: results of chunk {cid} lack the variable(s) {', '.join(missing)}"
        )
    block_shape = tuple(s.stop - s.start for s in slices)
    region = [(int(i), int(i) + 1) for i in index] + [(int(s.start), int(s.stop)) for s in slices]
    lead = (1,) * len(index)
    ctx = _quiet_zarr()
    try:
        root = zarr.open_group(out, mode="r+", use_consolidated=False)
        arrays: dict[str, Any] = {name: root[name] for name in info["variables"]}
        values = {}
        for name in info["variables"]:
            value = np.asarray(results[name])
            values[name] = value.reshape(lead + block_shape + value.shape[1:]).astype(
                arrays[name].dtype
            )
        bad = _nonfinite_points(values, lead + block_shape)
        if bad.any():
            values["status"] = np.where(
                bad & (values["status"] == OK), np.int8(FAILED), values["status"]
            )
        for name, value in values.items():
            _clear_non_files(out, name, arrays[name], region)
            arr = arrays[name].with_config({"write_empty_chunks": True})  # type: ignore[union-attr]
            arr[tuple(slice(a, b) for a, b in region)] = value
    finally:
        ctx.__exit__(None, None, None)
    record = {
        "index": [int(i) for i in index],
        "slices": [[int(s.start), int(s.stop)] for s in slices],
        "digest": _digest(info["spec_hash"], cid, region, values, info.get("backends")),
    }
    _atomic_write(_mark(out, cid), json.dumps(record))


def _clear_non_files(out: Path, name: str, arr: Any, region: list[tuple[int, int]]) -> None:
    """Remove what is not a regular file (a directory, a FIFO, a socket) at the chunk files of
    ``region``: zarr writes a chunk by renaming a new file over the old one, which a directory
    refuses (a damaged chunk could never be recomputed)."""
    for c in _block_coords(arr.shape, arr.chunks, region):
        path = out / name / arr.metadata.encode_chunk_key(c)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            shutil.rmtree(path, ignore_errors=True)
        elif not stat.S_ISREG(mode):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def discard(out: _StorePath, cid: int) -> None:
    """Remove the completion mark of chunk ``cid`` (it will be recomputed); a directory put in its
    place is removed too."""
    mark = _mark(Path(out), cid)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(mark).st_mode):
            shutil.rmtree(mark, ignore_errors=True)
        else:
            os.unlink(mark)


def _block_coords(shape: tuple, chunks: tuple, region: list[tuple[int, int]]) -> Iterator[tuple]:
    """Coordinates of the zarr chunks (of shape ``chunks``) that the region touches."""
    ranges = [range(lo // c, math.ceil(hi / c)) for (lo, hi), c in zip(region, chunks)]
    ranges += [range(math.ceil(s / c)) for s, c in zip(shape[len(region) :], chunks[len(region) :])]
    yield from (
        tuple(int(r[i]) for r, i in zip(ranges, idx))
        for idx in np.ndindex(*[len(r) for r in ranges])
    )


def _bookkeeping_damage(out: Path, info: dict, *, marks: bool) -> list[Damage]:
    """Damage that ``repair`` restores: the bookkeeping directories, the array metadata (compared
    with the copy recorded at creation) and, with ``marks``, completion marks of chunks that do
    not exist."""
    found = []
    for sub in ("done", "claims"):
        d = out / _META / sub
        if not d.is_dir():
            what = "missing" if not d.exists() else "not a directory"
            lost = (
                "; the completion marks are lost: every chunk is recomputed"
                if sub == "done"
                else ""
            )
            found.append(Damage(None, d, f"{_META}/{sub} is {what}{lost}", repairable=True))
    recorded = info.get("metadata", {})
    for rel, meta in recorded.items():
        f = out / rel
        try:
            now = json.loads(_read_text(f))
        except (OSError, ValueError) as e:
            found.append(Damage(None, f, f"metadata unreadable ({_reason(e)})", repairable=True))
            continue
        if _structure(now) != _structure(meta):
            diff = sorted(key_differences(_structure(meta), _structure(now)))
            found.append(
                Damage(
                    None,
                    f,
                    f"metadata differs from the store's creation ({', '.join(diff)})",
                    repairable=True,
                )
            )
    if (
        not found
    ):  # each file as recorded: the root's consolidated copy (what readers use) must match them
        try:
            root = json.loads(_read_text(out / "zarr.json"))
            consolidated = root["consolidated_metadata"]["metadata"]
            for rel in recorded:
                name = str(Path(rel).parent)
                if name != "." and _structure(consolidated.get(name)) != _structure(
                    json.loads(_read_text(out / rel))
                ):
                    found.append(
                        Damage(
                            None,
                            out / rel,
                            f"metadata differs from the root's consolidated copy of "
                            f"{name!r} (the record of the store's creation was edited too)",
                        )
                    )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            found.append(
                Damage(None, out / "zarr.json", f"consolidated metadata unreadable ({_reason(e)})")
            )
    if marks and (out / _META / "done").is_dir():
        total = int(info["chunks_total"])
        for cid in sorted(done_chunks(out) - done_chunks(out, total)):
            found.append(
                Damage(
                    None,
                    _mark(out, cid),
                    f"completion mark of chunk {cid}, which does not exist (chunks 0 .. {total - 1})",
                    repairable=True,
                )
            )
    return found


def repair(out: _StorePath) -> list[Damage]:
    """Restore what ``verify`` reports ``repairable``: recreate ``_sweep/done`` and
    ``_sweep/claims`` (a file in their place is removed), rewrite array metadata that differs
    from the copy recorded at creation, remove completion marks of chunks that do not exist.
    Returns what it repaired (chunk damage is left to recomputation: ``--resume``).

    Idempotent and safe while other writers run: every restored file is written atomically
    with the content it had at creation.
    """
    out = Path(out)
    info = _info(out)
    fixed = [d for d in _bookkeeping_damage(out, info, marks=True) if d.repairable]
    recorded = info.get("metadata", {})
    for d in fixed:
        if d.path.parent == out / _META:  # done/ or claims/
            if d.path.exists() and not d.path.is_dir():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(d.path)
            d.path.mkdir(exist_ok=True)
        elif d.path.parent == out / _META / "done":
            discard(out, int(d.path.name))
        else:
            _atomic_write(d.path, json.dumps(recorded[str(d.path.relative_to(out))]))
    return fixed


def verify(out: _StorePath, chunks: Iterable[int] | None = None) -> list[Damage]:
    """Check the chunks marked done (all of them, or those of ``chunks`` that are marked);
    return what is damaged (empty: sound).

    A done chunk is sound when its completion mark is readable, every zarr chunk file of its
    region exists as a regular file no larger than a chunk can be (a FIFO, a device or a
    directory in its place is damage, never read) and ends with the ``crc32c`` checksum of the
    rest, the region decodes, the
    digest of the decoded values (bound to the chunk's id, region and the spec's hash:
    ``write_chunk``) equals the mark's, no point of its ``status`` is ``PENDING`` and no point
    with status ``OK`` holds a NaN or infinite value. The bookkeeping directories and the
    array metadata (against the copy recorded at creation) are checked first (damage there is
    ``repairable``; the chunks are checked once the metadata is sound), then each array's
    metadata against the root's consolidated copy (a disagreement there means the record was
    edited too: not repairable). With ``chunks=None``
    the coordinates are read too, and completion marks of chunks that do not exist are
    reported. Raises ``StoreError`` when ``out`` is not a sweep store of this format.
    """
    import zarr

    out = Path(out)
    info = _info(out)
    full = chunks is None
    damages = _bookkeeping_damage(out, info, marks=full)
    problem = _backend_damage(out, info)
    if problem is not None:
        damages.append(problem)
    if any(d.path.name == "zarr.json" for d in damages):
        return damages  # the chunks read through the metadata: check them once it is restored
    marked = done_chunks(out, int(info["chunks_total"]))
    ids = sorted(marked if chunks is None else set(chunks) & marked)
    ctx = _quiet_zarr()
    try:
        try:
            root = zarr.open_group(out, mode="r", use_consolidated=False)
            arrays: dict[str, Any] = {name: root[name] for name in info["variables"]}
        except Exception as e:  # noqa: BLE001 - any failure to open the metadata is damage
            return damages + [Damage(None, out / "zarr.json", f"metadata unreadable: {_reason(e)}")]
        if full:
            # the coordinates are the arrays recorded at creation (listing the directory would read
            # whatever else was put there); each file is checked to be a regular one before zarr reads it
            recorded = {
                str(Path(rel).parent)
                for rel in info.get("metadata", {})
                if Path(rel).parent != Path(".")
            }
            for name in sorted(recorded - set(arrays)):
                try:
                    coord = cast(Any, root[name])
                    for c in _block_coords(coord.shape, coord.chunks, []):
                        path = out / name / coord.metadata.encode_chunk_key(c)
                        with contextlib.suppress(FileNotFoundError):
                            _read_regular(path)
                    coord[...]  # coordinates: small, read whole
                except Exception as e:  # noqa: BLE001 - any decoding failure is damage
                    damages.append(Damage(None, out / name, f"coordinate unreadable: {_reason(e)}"))
        ndim = int(info["grid_ndim"])
        decoders = {name: _decoder(arr) for name, arr in arrays.items()}
        for cid in ids:
            damages += _verify_chunk(
                out, cid, arrays, ndim, decoders, info["spec_hash"], info.get("backends")
            )
    finally:
        ctx.__exit__(None, None, None)
    return damages


_verify_store = verify  # ``load``'s argument ``verify`` shadows the function


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _file_bytes(path: Path, max_bytes: int | None = None) -> tuple[bytes | None, str | None]:
    """The content of one chunk file and what is wrong with it (None: nothing): the file holds the
    encoded chunk followed by the little-endian crc32c of it (zarr's ``crc32c`` codec, the last
    of the pipeline)."""
    import google_crc32c  # zarr's own dependency, the implementation of its crc32c codec

    try:
        data = _read_regular(path, max_bytes)
    except FileNotFoundError:
        return None, "chunk file missing"
    except OSError as e:
        return None, f"unreadable ({e.strerror or e})"
    if len(data) < 5:
        return None, f"truncated ({len(data)} bytes)"
    if google_crc32c.value(data[:-4]).to_bytes(4, "little") != data[-4:]:
        return None, "checksum mismatch (crc32c): the file was truncated, overwritten or altered"
    return data, None


def _max_file_bytes(arr: Any) -> int | None:
    """The largest file a chunk of ``arr`` can be: zstd's bound on its compressed size
    (``ZSTD_COMPRESSBOUND``: n + n / 256 + a margin; taken generously) and the 4-byte crc32c.
    None (no bound) for a dtype of variable size."""
    dtype = np.dtype(arr.dtype)
    if dtype.kind not in "biuf":
        return None
    raw = math.prod(arr.chunks) * dtype.itemsize
    return raw + raw // 128 + 4096 + 4


def _file_damage(path: Path) -> str | None:
    """What is wrong with one chunk file (its checksum), or None."""
    return _file_bytes(path)[1]


def _decoder(arr: Any) -> Callable[[bytes], np.ndarray] | None:
    """``bytes -> array of the chunk's shape`` for the pipeline every store array has (little-endian
    bytes, zstd, crc32c: ``_codecs``), or None for another pipeline (then zarr decodes)."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

    codecs = tuple(arr.metadata.codecs)
    if len(codecs) != 3 or not (
        isinstance(codecs[0], BytesCodec)
        and isinstance(codecs[1], ZstdCodec)
        and isinstance(codecs[2], Crc32cCodec)
    ):
        return None
    endian = getattr(codecs[0].endian, "value", codecs[0].endian)
    dtype = np.dtype(arr.dtype).newbyteorder("<" if endian in (None, "little") else ">")
    zstd, shape = codecs[1]._zstd_codec, tuple(arr.chunks)
    size = math.prod(shape) * dtype.itemsize

    def decode(data: bytes) -> np.ndarray:
        raw = bytes(zstd.decode(data[:-4]))
        if len(raw) != size:
            raise ValueError(
                f"decodes to {len(raw)} bytes, a chunk of {shape} {dtype.name} has {size}"
            )
        return np.frombuffer(raw, dtype).reshape(shape).astype(arr.dtype)

    return decode


def _verify_chunk(
    out: Path,
    cid: int,
    arrays: dict,
    ndim: int,
    decoders: dict,
    spec_hash: str,
    backends: dict | None = None,
) -> list[Damage]:
    mark = _mark(out, cid)
    try:
        rec = json.loads(_read_text(mark))
        region = [(int(i), int(i) + 1) for i in rec["index"]] + [
            (int(a), int(b)) for a, b in rec["slices"]
        ]
        if len(region) != ndim:
            raise ValueError(f"{len(region)} dimensions, the grid has {ndim}")
        shape = arrays["status"].shape
        if any(not 0 <= a < b <= s for (a, b), s in zip(region, shape)):
            raise ValueError(f"region {region} outside the grid {list(shape)}")
        digest = rec["digest"]
        if not isinstance(digest, str):
            raise TypeError(f"digest {digest!r} is not a string")
    except FileNotFoundError:
        return []  # unmarked meanwhile (being recomputed): not done, nothing to verify
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [Damage(cid, mark, f"completion mark unreadable ({e})")]
    found = []
    values = {}
    for name, arr in arrays.items():
        files, bad = {}, []
        for c in _block_coords(arr.shape, arr.chunks, region):
            path = out / name / arr.metadata.encode_chunk_key(c)
            data, reason = _file_bytes(path, _max_file_bytes(arr))
            if reason:
                bad.append(Damage(cid, path, reason))
            files[c] = (path, data)
        found += bad
        if bad:
            continue
        # decode: a file with a valid checksum over bytes that are no chunk fails here
        full = region + [(0, s) for s in arr.shape[len(region) :]]
        decode = decoders.get(name)
        if decode is None:
            try:
                values[name] = np.asarray(arr[tuple(slice(a, b) for a, b in region)])
            except Exception as e:  # noqa: BLE001 - a chunk that passes its checksum yet fails to decode
                found.append(Damage(cid, out / name, f"chunk does not decode ({_reason(e)})"))
            continue
        result = np.empty([b - a for a, b in full], arr.dtype)
        for c, (path, data) in files.items():
            try:
                block = decode(data)
            except Exception as e:  # noqa: BLE001 - any decoding failure is damage
                found.append(Damage(cid, path, f"chunk does not decode ({_reason(e)})"))
                break
            lo = [ci * ch for ci, ch in zip(c, arr.chunks)]
            src = tuple(
                slice(max(a, l0) - l0, min(b, l0 + ch) - l0)
                for (a, b), l0, ch in zip(full, lo, arr.chunks)
            )
            dst = tuple(
                slice(max(a, l0) - a, min(b, l0 + ch) - a)
                for (a, b), l0, ch in zip(full, lo, arr.chunks)
            )
            result[dst] = block[src]
        else:
            values[name] = result
    if found:
        return found
    status = values["status"]
    if np.any(status == PENDING):
        return [Damage(cid, out / "status", "points still pending in a chunk marked done")]
    if _digest(spec_hash, cid, region, values, backends) != digest:
        return [
            Damage(
                cid,
                out / next(iter(arrays)),
                "data differ from the digest of its completion mark (chunk files swapped, replaced or "
                "written over, or the mark edited)",
            )
        ]
    nonfinite = _nonfinite_points(values, status.shape) & (status == OK)
    if nonfinite.any():  # only reachable with a forged digest: written data never hold these
        return [
            Damage(
                cid,
                out / "status",
                f"{int(nonfinite.sum())} point(s) with status ok hold NaN or inf",
            )
        ]
    return found


def load(store: _StorePath, *, verify: bool = True) -> Any:
    """Open a sweep store as an ``xarray.Dataset`` (lazy arrays), verified first.

    A run's store (``meanfield simulate --out DIR`` writes ``DIR/run.zarr``: a store of one
    point, ``meanfield._labelled.write_run``) opens the same way, from its path or from ``DIR``,
    as the Dataset of ``Trajectory.to_xarray`` (coordinates ``time``, ``token``, ``dim``).

    ``attrs["chunks_done"]``/``attrs["chunks_total"]`` say how complete it is;
    ``status`` marks pending (0), ok (1) and failed (2) points.

    Args:
        store: path of the store (or the ``--out`` directory of ``meanfield simulate``).
        verify: read every chunk marked done and check it (``verify``) before opening;
            ``False`` opens lazily without reading (a large store, or one written by an
            earlier meanfield version without checksums).

    Raises:
        FileNotFoundError: no store at ``store``.
        StoreDamagedError: a damaged chunk (``.chunk``, ``.path``; ``--resume`` recomputes it).
        StoreFormatError: with ``verify``, a store of an earlier format (no checksums).
        StoreError: not a sweep store.
    """
    import xarray as xr

    store = Path(store)
    if not (store / "zarr.json").exists() and (store / "run.zarr" / "zarr.json").exists():
        store = store / "run.zarr"  # the --out directory of `meanfield simulate`: its run
    if not (store / "zarr.json").exists():
        raise FileNotFoundError(f"sweep store not found: {store}")
    info: dict | None
    if verify:
        info = _info(store)
        damages = _verify_store(store)
        if damages:
            raise StoreDamagedError(store, damages)
    else:
        try:
            info = _info(store, legacy_ok=True)
        except StoreError:
            info = None
    ctx = _quiet_zarr()
    try:
        ds = xr.open_zarr(store, consolidated=True)
    except Exception as e:  # noqa: BLE001 - unreadable metadata: one typed error
        raise StoreError(f"{store} cannot be opened as a sweep store ({_reason(e)})") from None
    finally:
        ctx.__exit__(None, None, None)
    total = int(info["chunks_total"]) if info is not None and "chunks_total" in info else None
    if total is not None:
        ds.attrs["chunks_total"] = total
    ds.attrs["chunks_done"] = len(done_chunks(store, total))
    return ds
