"""What rank 0 has measured while a job goes, kept for the job's end whatever that end is: `commprof run` and
`commprof profile` keep their results one way.

    kept = Kept(cfg.out.json, document, show=print_it)   # rank 0, once its group exists
    rank.on_failure(kept.abandon)                         # a failure: the last document, said, marked incomplete
    ... each iteration: kept.update()                     # the --json file, marked incomplete, as it grows

While the job runs, the --json file holds rank 0's document so far, marked incomplete ("reason": "running"),
from its first measured iteration on, rewritten at most every SAVE_S and in at most SHARE of a core. A thread
of its own builds and writes it: the training thread only says an iteration ended (a document's first build
takes ~10 ms, and a rank 0 that late into the next iteration waits that much less for a straggler, which a
short job's findings then miss). A rank 0 that is killed leaves that file, which the launcher then marks
with the job's verdict (base/files.py mark_incomplete). A failure that rank 0 lives through — a dead peer,
the script's exception, Ctrl-C — writes the document once more with its reason and shows it (`show`: the
tables, marked incomplete). `close` ends the writes before the finished job's report replaces the file.
Exercised by: `pytest tests/test_failures.py -k killed_mid_way` and `pytest tests/test_profile_failures.py`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from commprof.base import files


class Kept:
    """Rank 0's document while the job goes: written as it grows, and once more, with its reason, on failure."""

    SAVE_S = 0.25
    """The least time between two writes while the job runs: a rank 0 killed loses at most this much."""
    SHARE = 0.02
    """The most of a core the writes take: a document that takes 10 ms to build and write waits 0.5 s."""

    def __init__(self, path: str | None, document: Callable[[str], dict],
                 show: Callable[[dict, str], None] | None = None) -> None:
        self.path = path
        """The --json file; None: nothing written, the document only shown on failure."""
        self.document = document
        """The document so far, marked incomplete with the reason given (read from the writer's thread: it
        copies what the training thread appends to)."""
        self.show = show
        """Called with the last document and the reason when the job fails with this rank alive."""
        self._due = threading.Event()
        self._closed = False
        self._writing = threading.Lock()
        """Held while a snapshot is written: close() waits for it, so that no snapshot lands after the end."""
        self._thread: threading.Thread | None = None
        self._writes = 0

    def update(self) -> None:
        """An iteration has ended: the writer is told (the first one starts it)."""
        if self.path is None or self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="commprof-kept", daemon=True)
            self._thread.start()
        self._due.set()

    def _run(self) -> None:
        while True:
            self._due.wait()
            with self._writing:
                if self._closed:
                    return
                self._due.clear()
                start = time.monotonic()
                try:
                    files.write_result(self.path, self.document("running"), snapshot=True)
                except Exception:  # a full disk: the job goes on, and its end says the file's fate
                    self._closed = True
                    return
                took, self._writes = time.monotonic() - start, self._writes + 1
            # the first build pays the imports and caches of every later one (10 ms and more): not their pace
            time.sleep(self.SAVE_S if self._writes == 1 else max(self.SAVE_S, took / self.SHARE))

    def close(self) -> None:
        """No more snapshots: the finished job's report is next (one being written is waited for)."""
        with self._writing:
            self._closed = True
        self._due.set()

    def abandon(self, code: int, message: str) -> None:
        """The job fails (`code`, `message`): the document once more, with its reason, shown and written."""
        self.close()
        doc = self.document(message)
        if self.show is not None:
            self.show(doc, message)
        if self.path is not None:
            files.write_result(self.path, doc)
