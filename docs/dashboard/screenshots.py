"""Make the dashboard screenshots in this folder.

    python docs/dashboard/screenshots.py [--steps 300] [--reuse DIR]
    python docs/dashboard/screenshots.py --multitask      # multitask.png alone

Two real runs of examples/mnist1d_cnn.py on 2 processes (the first one resumed once, so
it has two segments; the second with fp16 gradient compression), a real `tandem tune`
session on the tuner's test job, a scheduler's history written through SchedStore (jobs
whose runs are the two above; times made up, records in the shape the service writes), then
Chromium's screenshots of the Runs, Run, Compare, Tuner and Scheduler pages. With
`--multitask`: a run of examples/mnist1d_multitask.py and its Run page's curves (the
loss and the accuracy of each task).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))

from tandem.dashboard.server import DashboardServer  # noqa: E402
from tandem.monitor.store import RunStore  # noqa: E402
from tandem.sched.service.jobstore import SchedStore  # noqa: E402
from tandem.sched.service.records import Attempt, JobRecord  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def train(cwd: Path, name: str, steps: int, *flags: str,
          script: str = "mnist1d_cnn.py") -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    subprocess.run([sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", "2",
                    str(ROOT / "examples" / script), "--train.steps", str(steps),
                    "--run.name", name, "--monitor.progress", "off", "--monitor.log_every", "10",
                    *flags], cwd=cwd, env=env, check=True, capture_output=True)


def tune_session(cwd: Path, store: Path) -> None:
    """A real `tandem tune` session (the tuner's test job with 32 needless accumulation
    passes a step, on 2 processes) recorded in `store`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"),
               TUNE_TASK_SLEEP_MS="0")
    subprocess.run([sys.executable, "-m", "tandem.cli", "tune", "--nproc-per-node", "2",
                    "--max-trials", "1", "--budget", "10m", "--steps", "120", "--log-every",
                    "10", "--placebo-pairs", "2", "--max-pairs", "4", "--store", str(store),
                    "--work-dir", str(cwd / "trials"), "--out", str(cwd / "plan.toml"),
                    str(ROOT / "tests" / "dist" / "scripts" / "tune_task.py"),
                    "--train.global_batch", "128", "--train.micro_batch", "2"],
                   cwd=cwd, env=env, check=True, capture_output=True)


def sched_history(store: Path) -> None:
    """Four jobs on 4 slots over the last ~10 minutes: one resized 4 -> 2 to let another
    in, one preempted back to the queue, one waiting."""
    t0 = time.time() - 600

    def launch(s: SchedStore, job_id: str, number: int, procs: int, at: float) -> Attempt:
        attempt = Attempt(job_id=job_id, attempt=number, backend="local", procs=procs,
                          launched=t0 + at)
        s.open_attempt(job_id, attempt, procs, None)
        return attempt

    def resized(s: SchedStore, job_id: str, attempt: Attempt, kind: str, to: int,
                at: float, ended: float, again: float | None, steps: tuple) -> None:
        s.request_stop(job_id, attempt.attempt, kind, to, None, t0 + at)
        s.close_attempt(job_id, attempt.attempt, 75, "stopped", t0 + ended)
        s.update_job(job_id, state="stopping" if to else "queued", procs=0)
        s.record_resize({"job_id": job_id, "attempt": attempt.attempt, "kind": kind,
                         "decided": t0 + at, "from_procs": attempt.procs, "to_procs": to,
                         "stopped": t0 + ended, "stopped_step": steps[0],
                         "resumed_step": steps[1], "steps_redone": steps[0] - steps[1]
                         if steps[1] is not None else None,
                         "training_again": None if again is None else t0 + again,
                         "closed": int(again is not None)})

    with SchedStore(store) as s:
        s.set_service_value("service", "pid 81234 on demo, backend local (1 x 4 slots), "
                                       "policy goodput")
        for name, run, at, procs, priority in (
                ("cnn", "mnist1d_cnn", 0, (1, 4), 0), ("fp16", "mnist1d_fp16", 60, (2, 2), 0),
                ("sweep-a", "", 120, (1, 2), 0), ("sweep-b", "", 300, (1, 1), 1)):
            s.submit(JobRecord(name=name, script=str(ROOT / "examples" / "mnist1d_cnn.py"),
                               cwd=str(store.parent.parent), min_procs=procs[0],
                               max_procs=procs[1], priority=priority, run_name=run,
                               run_dir=str(store.parent), submitted=t0 + at))
        first = launch(s, "j1", 1, 4, 2)
        s.record_decision("goodput", "local", {"j1": 2, "j2": 2}, {"j1": "resize 4 -> 2",
                                                                   "j2": "start on 2"})
        resized(s, "j1", first, "resize", 2, 61, 66, 79, (150, 150))
        launch(s, "j1", 2, 2, 68)
        launch(s, "j2", 1, 2, 68)
        s.close_attempt("j2", 1, 0, "completed", t0 + 330)
        s.update_job("j2", state="completed", procs=0, finished=t0 + 330)
        sweep = launch(s, "j3", 1, 2, 331)
        s.record_decision("goodput", "local", {"j1": 2, "j3": 0, "j4": 1},
                          {"j3": "preempt 2 -> 0", "j4": "start on 1"})
        resized(s, "j3", sweep, "preempt", 0, 480, 484, None, (40, None))
        launch(s, "j4", 1, 1, 486)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--reuse", default=None,
                        help="a folder this script filled before: only take the pictures")
    parser.add_argument("--multitask", action="store_true",
                        help="only the multi-task run's curves (multitask.png)")
    args = parser.parse_args()
    if args.multitask:
        multitask(Path(args.reuse or tempfile.mkdtemp(prefix="tandem-shots-")), args.reuse)
        return
    from playwright.sync_api import sync_playwright

    cwd = Path(args.reuse or tempfile.mkdtemp(prefix="tandem-shots-"))
    store = cwd / "runs" / "tandem.db"
    if not args.reuse:
        train(cwd, "mnist1d_cnn", args.steps // 2)
        # continues the same run (a second segment), its schedule stretched on purpose
        train(cwd, "mnist1d_cnn", args.steps, "--run.allow_changes", "train.steps")
        train(cwd, "mnist1d_fp16", args.steps, "--plan.comm_hook", "fp16")
        tune_session(cwd, store)
        sched_history(store)
    with RunStore(store) as s:
        ids = {r["name"]: r["run_id"] for r in s.runs()}
    pages = {"runs": "/runs", "run": f"/run/{ids['mnist1d_cnn']}",
             "compare": f"/compare?runs={ids['mnist1d_cnn']},{ids['mnist1d_fp16']}",
             "tuner": "/tuner", "sched": "/sched"}
    with DashboardServer(store) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        for name, path in pages.items():
            page.goto(server.url(path, local=True))
            page.wait_for_selector("body[data-ready='1']")
            if name == "run":
                page.wait_for_selector("#findings .finding, #findings p")
            page.wait_for_timeout(500)
            # The run page is long: the picture keeps its top (diagnosis to rank heatmaps).
            clip = {"x": 0, "y": 0, "width": 1400, "height": 2300} if name == "run" else None
            page.screenshot(path=str(OUT / f"{name}.png"), full_page=True, clip=clip)
            print(f"wrote {OUT / f'{name}.png'}")
        browser.close()


def multitask(cwd: Path, reuse: str | None) -> None:
    """The Run page's curves of a multi-task run: each task's loss and accuracy."""
    from playwright.sync_api import sync_playwright

    if not reuse:
        train(cwd, "mnist1d_multitask", 150, "--train.eval_every", "10",
              script="mnist1d_multitask.py")
    store = cwd / "runs" / "tandem.db"
    with RunStore(store) as s:
        (run,) = [r["run_id"] for r in s.runs() if r["name"] == "mnist1d_multitask"]
    with DashboardServer(store) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(server.url(f"/run/{run}", local=True))
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_timeout(500)
        box = page.locator("#curves").bounding_box()
        # The first two rows: the loss, each task's losses and accuracies.
        page.screenshot(path=str(OUT / "multitask.png"), full_page=True,
                        clip={"x": box["x"], "y": box["y"], "width": box["width"],
                              "height": min(box["height"], 620)})
        print(f"wrote {OUT / 'multitask.png'}")
        browser.close()


if __name__ == "__main__":
    main()
