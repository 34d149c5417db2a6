"""Training checkpoints as ``.npz`` arrays plus a JSON header: no pickle, ever.

A checkpoint file holds
- ``params/<name>``: each parameter after the checkpointed iteration's update, keyed by the
  parameter's name (``actor.0.weight``): what ``timerl eval`` and ``timerl export`` read;
- ``state/<name>``: every other named recurrence over the iteration dim (optimiser moments
  such as ``adam_m(actor.0.weight)``), keyed the same way (both as the compiled program
  names its carried state: ``Program.carried_state``);
- ``raw/<n>``: the executor's full carried state, which resuming restores bit for bit;
- ``env/<n>``: the arrays of the environments' state;
- ``__header__``: UTF-8 JSON with the format, algorithm, config, iteration, RNG and
  metrics position, and where each array belongs.

``numpy.load`` runs with ``allow_pickle=False``, so opening a file from someone else can only
ever produce arrays and JSON, never run code. Writes go to a temporary file that is renamed,
so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import io
import json
import os
import re
import warnings
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from timerl.errors import CheckpointError

FORMAT = 2
KIND = "timerl-checkpoint"
SUFFIX = ".npz"
DIRNAME = "checkpoints"
BEST = "best.npz"
_PATTERN = re.compile(r"^ckpt-(\d+)\.npz$")


@dataclass
class Checkpoint:
    """A loaded checkpoint: the JSON header and the arrays by key."""

    header: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    path: Path | None = None

    @property
    def iteration(self) -> int:
        return int(self.header["iteration"])

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The trained parameters by name (``actor.0.weight``)."""
        return _prefixed(self.arrays, "params/")

    @property
    def state(self) -> dict[str, np.ndarray]:
        """Other named recurrent state (optimiser moments) by name."""
        return _prefixed(self.arrays, "state/")

    def snapshot(self) -> dict[int, dict[tuple, np.ndarray]]:
        """The executor snapshot this checkpoint was taken from (see ``Executor.restore``)."""
        out: dict[int, dict[tuple, np.ndarray]] = {}
        for key, op_index, point in self.header["raw"]:
            out.setdefault(int(op_index), {})[tuple(point)] = self.arrays[key]
        return out

    def env_state(self) -> Any:
        return _decode(self.header["env_state"], self.arrays)


def _prefixed(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


# --- env state: nested Python values with arrays ---------------------------------------------
def _encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """A JSON tree for ``value``, its arrays moved into ``arrays`` under ``env/<n>``."""
    if isinstance(value, np.ndarray):
        key = f"env/{len([k for k in arrays if k.startswith('env/')])}"
        arrays[key] = value
        return {"__array__": key}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, arrays) for v in value]}
    if isinstance(value, list):
        return [_encode(v, arrays) for v in value]
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise CheckpointError(f"cannot store state with non-string keys {bad[:3]}")
        return {k: _encode(v, arrays) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise CheckpointError(f"cannot store a {type(value).__name__} in a checkpoint")


def _decode(tree: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(tree, list):
        return [_decode(v, arrays) for v in tree]
    if isinstance(tree, dict):
        if set(tree) == {"__array__"}:
            return arrays[tree["__array__"]].copy()
        if set(tree) == {"__tuple__"}:
            return tuple(_decode(v, arrays) for v in tree["__tuple__"])
        return {k: _decode(v, arrays) for k, v in tree.items()}
    return tree


# --- files -------------------------------------------------------------------------------------
def save_checkpoint(
    path: Path,
    header: dict[str, Any],
    *,
    params: Mapping[str, np.ndarray],
    state: Mapping[str, np.ndarray],
    snapshot: Mapping[int, Mapping[tuple, np.ndarray]],
    env_state: Any,
) -> None:
    """Write one checkpoint file atomically (temporary file, fsync, rename)."""
    arrays: dict[str, np.ndarray] = {}
    for name, value in params.items():
        arrays[f"params/{name}"] = np.asarray(value)
    for name, value in state.items():
        arrays[f"state/{name}"] = np.asarray(value)
    raw = []
    for op_index, points in snapshot.items():
        for point, value in points.items():
            key = f"raw/{len(raw)}"
            arrays[key] = np.asarray(value)
            raw.append([key, int(op_index), [int(x) for x in point]])
    head = {
        **header,
        "kind": KIND,
        "format": FORMAT,
        "raw": raw,
        "env_state": _encode(env_state, arrays),
    }
    arrays["__header__"] = np.frombuffer(json.dumps(head).encode(), dtype=np.uint8)
    write_atomically(path, lambda fh: np.savez(fh, **arrays))


def write_atomically(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """``write(file)`` into a temporary file beside ``path``, flushed to disk, then renamed
    over ``path``: a crash at any moment leaves either the old file or the new one whole,
    never a part of one (a rename within one directory is atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_dir(path.parent)


def _sync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform can open a directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a checkpoint file; anything else is a CheckpointError that says what the file is:
    not a timerl checkpoint at all, or a damaged one (truncated, corrupt). A directory is read
    as a run directory: its newest intact checkpoint (:func:`load_latest`)."""
    path = Path(path)
    if path.is_dir():
        return load_latest(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err.strerror or err}") from None
    if not data:
        raise DamagedCheckpoint(f"checkpoint {path} is damaged: the file is empty")
    if not data.startswith(_ZIP_MAGIC):
        raise NotACheckpoint(
            f"{path} is not a timerl checkpoint: timerl checkpoints are NumPy .npz archives "
            f"written by timerl train, and this file is not one ({_what_it_is(data)})"
        )
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except ValueError as err:
        if "pickle" in str(err).lower():  # an object array: only a pickle could read it
            raise NotACheckpoint(
                f"{path} is not a timerl checkpoint: it holds Python objects (pickled data), "
                "and timerl never loads pickles (they can run code)"
            ) from None
        raise DamagedCheckpoint(
            f"checkpoint {path} is damaged (truncated or corrupt): {err}"
        ) from None
    except (OSError, zipfile.BadZipFile, EOFError, KeyError, zlib.error) as err:
        raise DamagedCheckpoint(
            f"checkpoint {path} is damaged (truncated or corrupt): {type(err).__name__}: {err}"
        ) from None
    raw_header = arrays.pop("__header__", None)
    if raw_header is None:
        raise NotACheckpoint(
            f"{path} is not a timerl checkpoint: an .npz archive without timerl's header "
            f"(it holds {', '.join(sorted(arrays)[:5]) or 'no arrays'})"
        )
    try:
        header = json.loads(bytes(raw_header).decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedCheckpoint(f"checkpoint {path} has a corrupt header: {err}") from None
    if not isinstance(header, dict) or header.get("kind") != KIND:
        raise NotACheckpoint(f"{path} is not a timerl checkpoint (no timerl header)")
    if header.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} has checkpoint format {header.get('format')}; this timerl reads format "
            f"{FORMAT}"
        )
    missing = [key for key, _, _ in header.get("raw", []) if key not in arrays]
    if missing:
        raise DamagedCheckpoint(f"checkpoint {path} is damaged: arrays {missing[:3]} are missing")
    return Checkpoint(header, arrays, path)


class DamagedCheckpoint(CheckpointError):
    """A timerl checkpoint that cannot be read whole: truncated, corrupt, empty."""


class NotACheckpoint(CheckpointError):
    """A file that is not a timerl checkpoint at all."""


_ZIP_MAGIC = b"PK"  # every .npz is a zip archive


def _what_it_is(data: bytes) -> str:
    """A hint at what a file that is not an .npz archive holds."""
    if data.startswith(b"\x93NUMPY"):
        return "a single NumPy .npy array"
    if data[:1] == b"\x80" or data.startswith((b"(dp", b"(lp", b"ccopy_reg")):
        return "it looks like a pickle, which timerl never loads"
    chunk = data[:512]
    try:
        text: str | None = chunk.decode("utf-8")
    except UnicodeDecodeError as err:  # text, unless the fault is a character cut at the end
        text = chunk[: err.start].decode("utf-8") if err.start > len(chunk) - 4 else None
    if text is None or not all(c.isprintable() or c.isspace() for c in text):
        return f"binary data starting with {data[:8]!r}"
    first = text.strip().splitlines()[0][:40] if text.strip() else ""
    return f"a text file starting with {first!r}" if first else "a text file"


def load_latest(
    run_dir: str | Path,
    notice: Callable[[str], None] | None = None,
    set_aside: bool = False,
) -> Checkpoint:
    """The newest checkpoint of a run directory that reads whole.

    A damaged newer one (a crash of the disk, a copy cut short) is passed over for the next
    older one, then ``best.npz``, and ``notice`` is told which was used instead of which
    (``warnings.warn`` when None). ``set_aside``: rename each one passed over to
    ``<name>.damaged``, so that a resumed run writing newer checkpoints beside it never takes
    it for the latest again (the file is kept, for a look at what went wrong)."""
    run_dir = Path(run_dir)
    candidates = [path for _, path in reversed(checkpoint_files(run_dir))]
    best = checkpoint_dir(run_dir) / BEST
    if best.exists():
        candidates.append(best)
    if not candidates:
        latest_checkpoint(run_dir)  # raises the error that says what is missing
    failed: list[tuple[Path, CheckpointError]] = []
    for path in candidates:
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError as err:
            failed.append((path, err))
            continue
        if failed:
            _report_fallback(failed, ckpt, notice, set_aside)
        return ckpt
    reasons = "; ".join(str(err) for _, err in failed)
    raise CheckpointError(f"no intact checkpoint in {checkpoint_dir(run_dir)}: {reasons}")


def _report_fallback(
    failed: list[tuple[Path, CheckpointError]],
    used: Checkpoint,
    notice: Callable[[str], None] | None,
    set_aside: bool,
) -> None:
    names = []
    for path, _ in failed:
        if set_aside and path.name != BEST:
            path.replace(path.with_name(path.name + ".damaged"))
            names.append(f"{path.name} (renamed {path.name}.damaged)")
        else:
            names.append(path.name)
    newest = failed[0][1]
    text = f"{newest}; using {used.path}, the newest intact checkpoint (iteration {used.iteration})"
    if len(failed) > 1:
        text += f"; also unreadable: {', '.join(names[1:])}"
    elif set_aside:
        text += f"; the damaged file is kept as {failed[0][0].name}.damaged"
    if notice is None:
        warnings.warn(text, stacklevel=3)
    else:
        notice(f"warning: {text}")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / DIRNAME


def checkpoint_files(run_dir: str | Path) -> list[tuple[int, Path]]:
    """The numbered checkpoints of a run, oldest first."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    found = []
    for entry in folder.iterdir():
        m = _PATTERN.match(entry.name)
        if m:
            found.append((int(m.group(1)), entry))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest numbered checkpoint of a run directory."""
    run_dir = Path(run_dir)
    files = checkpoint_files(run_dir)
    if not files:
        legacy = run_dir / "checkpoint.pkl"
        if legacy.exists():
            raise CheckpointError(
                f"{legacy} is a pickle checkpoint from an older timerl; pickles are never loaded "
                "(they can run code): start a new run"
            )
        raise CheckpointError(f"no checkpoint in {checkpoint_dir(run_dir)}")
    return files[-1][1]


class CheckpointKeeper:
    """Numbered checkpoints in ``RUN/checkpoints``: the last ``keep`` and the best by score."""

    def __init__(self, run_dir: Path, keep: int = 3, best_score: float | None = None) -> None:
        if keep < 1:
            raise CheckpointError(f"--keep-checkpoints must be at least 1, got {keep}")
        self.folder = checkpoint_dir(run_dir)
        self.run_dir = run_dir
        self.keep = keep
        self.best_score = best_score

    def path_for(self, iteration: int) -> Path:
        return self.folder / f"ckpt-{iteration:07d}{SUFFIX}"

    def save(self, iteration: int, score: float | None, **parts: Any) -> Path:
        """Write iteration's checkpoint; copy it to ``best.npz`` when its score is the best."""
        path = self.path_for(iteration)
        better = score is not None and (self.best_score is None or score > self.best_score)
        header = dict(parts.pop("header"))
        if better:
            header["best_score"] = score
        else:
            header["best_score"] = self.best_score
        save_checkpoint(path, header, **parts)
        if better:
            self.best_score = score
            data = path.read_bytes()
            write_atomically(self.folder / BEST, lambda fh: fh.write(data))
        for _, old in checkpoint_files(self.run_dir)[: -self.keep]:
            old.unlink(missing_ok=True)
        return path
