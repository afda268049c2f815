"""Submission (command line and HTTP API) and the command every attempt runs."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tandem.config import parse_args
from tandem.sched.backends.backend import LaunchPlan, job_command
from tandem.sched.service.api import Api, is_loopback
from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.submit import SubmitRequest, make_record, parse_procs, split_argv, submit


def test_own_options_anywhere_script_flags_kept_in_order(tmp_path: Path) -> None:
    request = split_argv(["train.py", "--train.steps", "5", "--procs", "1:2", "--plan", "p.toml",
                          "--priority=3", "--adaptive-batch", "--train.global_batch=64",
                          "--env", "A=b=c", "--name", "mine"])
    assert request.script == "train.py"
    assert request.args == ["--train.steps", "5", "--plan", "p.toml",
                            "--train.global_batch=64"]
    assert (request.procs, request.priority, request.adaptive_batch, request.name) == (
        "1:2", 3, True, "mine")
    assert request.env == {"A": "b=c"}
    with pytest.raises(ValueError, match="a script to run is needed"):
        split_argv(["--procs", "2"])
    with pytest.raises(ValueError, match="--priority: 'x' is not an integer"):
        split_argv(["t.py", "--priority", "x"])


@pytest.mark.parametrize(("text", "expected"), [("2", (2, 2)), ("1:4", (1, 4))])
def test_procs(text: str, expected: tuple[int, int]) -> None:
    assert parse_procs(text) == expected


@pytest.mark.parametrize("text", ["0", "3:2", "a:b", "1:"])
def test_bad_procs(text: str) -> None:
    with pytest.raises(ValueError, match="--procs"):
        parse_procs(text)


def test_record_and_the_attempt_command(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    store = (tmp_path / "runs" / "tandem.db").resolve()
    request = split_argv(["train.py", "--run.allow_changes", "plan.tp", "--procs", "1:2",
                          "--train.global_batch", "32"])
    request.cwd = str(tmp_path)
    record = make_record(request, store)
    assert record.run_dir == str(store.parent) and record.script == str(tmp_path / "train.py")
    with SchedStore(store) as sched:
        job = sched.submit(record)
    plan = LaunchPlan(job=job, attempt=2, procs=2, batch=64, store=store,
                      job_dir=tmp_path / "sched" / job.job_id)
    cmd = job_command(plan)
    assert cmd[:4] == [sys.executable, "-m", "tandem.cli", "run"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    flags = parse_args(cmd[cmd.index(job.script) + 1:]).overrides  # as the script reads them
    assert flags == {"run.allow_changes": "plan.tp,train.global_batch", "run.name": "train-j1",
                     "run.dir": str(store.parent), "monitor.store": str(store),
                     "train.global_batch": "64"}
    request.args = ["--monitor.store", "elsewhere.db"]
    with pytest.raises(ValueError, match="is not the scheduler's store"):
        make_record(request, store)


def _call(url: str, body: dict | None = None, token: str | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers,
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.timeout(30)
def test_api_submits_lists_cancels_and_checks_its_token(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    store = tmp_path / "tandem.db"
    submit(SubmitRequest(script="train.py", procs="2", cwd=str(tmp_path)), store)
    api = Api(store, "127.0.0.1", 0, token="s3cret")
    api.start()
    try:
        assert api.url.startswith("http://127.0.0.1:")
        assert _call(api.url + "/v1/jobs")[0] == 401
        code, jobs = _call(api.url + "/v1/jobs", token="s3cret")
        assert code == 200 and [j["job_id"] for j in jobs] == ["j1"]
        code, made = _call(api.url + "/v1/jobs", {"script": "train.py", "cwd": str(tmp_path),
                                                  "procs": "1:2", "name": "viaapi"}, "s3cret")
        assert code == 201 and made["job_id"] == "j2"
        code, bad = _call(api.url + "/v1/jobs", {"script": "missing.py", "cwd": str(tmp_path)},
                          "s3cret")
        assert code == 400 and "does not exist" in bad["error"]
        code, _ = _call(api.url + "/v1/jobs/j2/cancel", {}, "s3cret")
        assert code == 200
    finally:
        api.close()
    with SchedStore(store) as sched:
        assert [(j.name, j.state, j.max_procs) for j in sched.jobs()] == [
            ("train", "queued", 2), ("viaapi", "cancelled", 2)]
    exposed = Api(store, "0.0.0.0", 0)  # not loopback: a token is made when none is given
    try:
        assert exposed.token
    finally:
        exposed.server.server_close()
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")
