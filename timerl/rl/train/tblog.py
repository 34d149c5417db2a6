"""TensorBoard scalars written with the ``tensorboard`` package alone (no torch needed)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path


def tensorboard_available() -> bool:
    """Event files need the ``tensorboard`` package (the ``train`` extra)."""
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except ValueError:  # a module object without a spec (replaced in sys.modules)
        return False


class ScalarWriter:
    """One event file of scalar summaries, what ``tensorboard --logdir`` reads."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        """``purge_step``: events a previous writer logged at this step or later (a crashed
        run's rows after its checkpoint) are hidden by TensorBoard, as a resumed run logs them
        again."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event = Event
        self._writer = EventFileWriter(str(log_dir))
        if purge_step is not None:
            start = SessionLog(status=SessionLog.START)
            self._writer.add_event(Event(step=purge_step, session_log=start))

    def add_scalars(self, values: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(
            value=[Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]
        )
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
