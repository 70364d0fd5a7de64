"""What rank 0 has measured while a job goes, kept for the job's end whatever that end is: `commprof run` and
`commprof profile` keep their results one way.

    kept = Kept(cfg.out.json, document, show=print_it)   # rank 0, once its group exists
    rank.on_failure(kept.abandon)                         # a failure: the last document, said, marked incomplete
    ... each iteration: kept.update()                     # the --json file, marked incomplete, as it grows

While the job runs, the --json file holds rank 0's document so far, marked incomplete ("reason": "running"),
from its first measured iteration on, rewritten at most every SAVE_S and in at most SHARE of the rank's time
(the writes run on the training thread):
a rank 0 that is killed leaves that file, which the launcher then marks with the job's verdict
(report/files.py mark_incomplete). A failure that rank 0 lives through — a dead peer, the script's exception,
Ctrl-C — writes the document once more with its reason and shows it (`show`: the tables, marked incomplete).
The finished job's report replaces the file.
Exercised by: `pytest tests/test_failures.py -k killed_mid_way` and `pytest tests/test_profile_failures.py`.
"""

from __future__ import annotations

import time
from typing import Callable

from commprof.report import files


class Kept:
    """Rank 0's document while the job goes: written as it grows, and once more, with its reason, on failure."""

    SAVE_S = 1.0
    """The least time between two writes while the job runs."""
    SHARE = 0.01
    """The most of the rank's time the writes take: a document that takes 5 ms to write waits 0.5 s or more."""

    def __init__(self, path: str | None, document: Callable[[str], dict],
                 show: Callable[[dict, str], None] | None = None) -> None:
        self.path = path
        """The --json file; None: nothing written, the document only shown on failure."""
        self.document = document
        """The document so far, marked incomplete with the reason given."""
        self.show = show
        """Called with the last document and the reason when the job fails with this rank alive."""
        self._next = 0.0
        """When the next write may be: the first measured iteration is written at once, so that a job killed
        at any point after it leaves a file."""

    def update(self) -> None:
        """An iteration has ended: the file rewritten when SAVE_S has passed and the last write's share allows."""
        if self.path is None:
            return
        now = time.monotonic()
        if now < self._next:
            return
        files.write_result(self.path, self.document("running"), snapshot=True)
        took = time.monotonic() - now
        self._next = now + max(self.SAVE_S, took / self.SHARE)

    def abandon(self, code: int, message: str) -> None:
        """The job fails (`code`, `message`): the document once more, with its reason, shown and written."""
        doc = self.document(message)
        if self.show is not None:
            self.show(doc, message)
        if self.path is not None:
            files.write_result(self.path, doc)
