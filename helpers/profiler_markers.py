"""torch.profiler without libkineto's profiler_start/profiler_stop lines on stderr (chapter 3)."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

#: The two lines libkineto, the tracer inside torch.profiler, writes to stderr around every trace
#: (torch 2.13 does): "USDT:<date> <time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52]
#: profiler_start", and the same with profiler_stop. They are markers for system tracers
#: (USDT probes), not messages: libkineto logs them at its own severity USDT, one above ERROR,
#: so torch's default threshold (ERROR) lets them through, and the only switch that hides them,
#: KINETO_LOG_LEVEL=6, hides kineto's errors too and is read once, when the first profiler starts.
PROFILER_MARKER = re.compile(rb"USDT:[^\n]*\] profiler_(start|stop)\r?\n?")


@contextmanager
def without_profiler_markers() -> Iterator[None]:
    """Run the block with the process's stderr (fd 2) in a file, then write back all of it but
    libkineto's profiler_start/profiler_stop markers (chapter 3)."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to redirect (e.g. pythonw): nothing would be shown anyway
        yield
        return
    with tempfile.TemporaryFile() as caught:
        for stream in (sys.stderr, sys.__stderr__):
            if stream is not None:
                stream.flush()
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            for stream in (sys.stderr, sys.__stderr__):
                if stream is not None:
                    stream.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = PROFILER_MARKER.sub(b"", caught.read())
            while rest:
                rest = rest[os.write(2, rest) :]
