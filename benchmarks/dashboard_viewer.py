"""A dashboard page on another machine, as the server sees it (`benchmarks/dashboard.py
overhead --client remote`)."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request


class RemoteViewer:
    """What the server sees of a run page open on another machine: the page's data, its
    event stream read as it comes, its diagnosis asked at load and then every
    `REDIAGNOSE_S` while rows arrive, or less often where a diagnosis cost more than
    `DIAGNOSIS_SHARE` of that (as `static/run.js` does); nothing is drawn.

    `resume`, what close() returned for an earlier viewer of the same run, makes this one
    the same page shown again: no diagnosis at load, the next one when the earlier
    viewer's was due, counting only the time a viewer was open. A page opened and closed
    in blocks then asks for its diagnosis as often, over its open time, as one left open.
    """

    REDIAGNOSE_S, DIAGNOSIS_SHARE = 30.0, 0.001

    def __init__(self, base: str, run_id: str, resume: dict[str, float] | None = None) -> None:
        self.get = lambda path: urllib.request.urlopen(base + path, timeout=60)
        run = urllib.parse.quote(run_id)
        self.findings = f"/api/run/{run}/findings"
        self.diagnoses = 0
        with self.get(f"/api/run/{run}") as resp:
            cursor = urllib.parse.urlencode(json.loads(resp.read())["cursor"])
        if resume is None:
            self.wait_s = self._diagnose()
        else:  # as if asked (wait - left) seconds ago
            self.wait_s = resume["wait_s"]
            self.asked = time.monotonic() - (self.wait_s - resume["left_s"])
        self.stream = self.get(f"/stream/run/{run}?cursor=" + urllib.parse.quote(cursor))
        self.stopped = False
        self.messages = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.stream:
            if self.stopped:
                return
            if line.startswith(b"data:"):
                self.messages += 1
                if time.monotonic() - self.asked > self.wait_s:
                    self.wait_s = self._diagnose()

    def _diagnose(self) -> float:
        """Ask for the diagnosis; how long to wait before asking again."""
        self.asked = time.monotonic()
        self.diagnoses += 1
        with self.get(self.findings) as resp:
            cost = json.loads(resp.read()).get("cost_s") or 0.0
        return max(self.REDIAGNOSE_S, cost / self.DIAGNOSIS_SHARE)

    def close(self) -> dict[str, float]:
        """Stop reading; what a later viewer of this page resumes from (`resume`)."""
        self.stopped = True
        self.thread.join(5)  # the stream sends at least every 0.7 s while the run logs
        self.stream.close()
        return {"wait_s": self.wait_s,
                "left_s": max(0.0, self.asked + self.wait_s - time.monotonic())}
