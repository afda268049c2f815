"""Fine-tunes from a model's weights (`run.init_from` a safetensors file), one with its
first layer frozen (`train.freeze`), one with LoRA adapters: killed at 60% of their steps
they resume bit-exact at the same size; resumed at 2 -> 1 -> 2 processes they train every
sample once, in order, to the weights of the same run left alone (within 1e-6)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tandem
from tandem.monitor.store import RunStore
from tests.dist import toy_task
from tests.dist.procs import run_ranks
from tests.faults import jobs

SCRIPT = str(Path(__file__).parent / "scripts" / "toy_finetune.py")
PARTS = sorted(toy_task.FINE_TUNES)
GLOBAL = 20
LEGS = [(2, 0.6), (1, 0.8), (2, 1.0)]  # (world size, share of the steps at the leg's end)


def _fit(out: Path, part: str, steps: int, source: str, tag: str) -> None:
    """One fine-tune; what this process trained on and the final weights go to `out`."""
    toy_task.SEEN.clear()
    result = tandem.fit(toy_task.task(),
                        config=toy_task.fine_tune_config(str(out), steps, source, part))
    Path(out, f"seen-{tag}.json").write_text(json.dumps(toy_task.SEEN))
    torch.save(result.model.state_dict(), Path(out, f"final-{tag}.pt"))


def _legs(rank: int, world: int, root: str, source: str, leg: int) -> None:
    """Leg `leg` of every fine-tune, in these processes; before the first, each fine-tune
    left alone (the reference)."""
    for part in PARTS:
        steps = toy_task.FINE_TUNE_STEPS[part]
        if leg == 0:
            _fit(Path(root, "clean", part), part, steps, source, f"{rank}")
        _fit(Path(root, "legs", part), part, round(steps * LEGS[leg][1]), source,
             f"{leg}-{rank}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base model's weights; from them, each fine-tune left alone at 2 processes, and
    the first (2-process) leg of each."""
    root = tmp_path_factory.mktemp("finetune")
    torch.manual_seed(11)
    save_file(toy_task.make_model().state_dict(), str(root / "base.safetensors"))
    for part in PARTS:
        for folder in ("clean", "legs"):
            (root / folder / part).mkdir(parents=True)
    run_ranks(_legs, 2, str(root), str(root / "base.safetensors"), 0, timeout=150)
    return root


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def _events(run_dir: Path) -> list[tuple[str, int]]:
    with RunStore(run_dir / "tandem.db") as store:
        return [(e["kind"], e["step"]) for e in store.events(store.run("toy")["run_id"])]


@pytest.mark.timeout(240)
def test_fine_tunes_killed_at_60_percent_resume_bit_exact(runs: Path) -> None:
    # One job runs both fine-tunes, one after the other (they share its start-ups): the
    # first is killed at step 6 of 10 in the job's first attempt, the second at step 12
    # of 20 in its second (which the first, resumed from step 5, never reaches).
    assert PARTS == ["freeze", "lora"] and toy_task.FINE_TUNE_STEPS == {"freeze": 10,
                                                                       "lora": 20}
    kill = [{"rank": 1, "step": 6, "phase": "compute", "kind": "kill", "attempt": 0},
            {"rank": 1, "step": 12, "phase": "compute", "kind": "kill", "attempt": 1}]
    job = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", "2",
         "--max-restarts", "2", "--monitor-interval", "0.5", SCRIPT, str(runs / "killed"),
         str(runs / "base.safetensors")],
        cwd=runs, env=jobs.env(kill), capture_output=True, text=True, timeout=200)
    assert job.returncode == 0, job.stderr[-6000:]
    assert ("resume", 5) in _events(runs / "killed" / "freeze")
    assert ("resume", 10) in _events(runs / "killed" / "lora")
    base = load_file(str(runs / "base.safetensors"))
    for part in PARTS:
        want = _weights(runs / "clean" / part / "final-0.pt")
        got = _weights(runs / "killed" / part / "final.pt")
        assert set(got) == set(want), part
        for name, value in want.items():
            assert torch.equal(got[name], value), (part, name)
        # it trained what it was meant to, and kept the rest at the base's weights
        frozen = {"freeze": ["0.weight", "0.bias"], "lora": list(base)}[part]
        for name in frozen:
            assert torch.equal(got[name], base[name]), (part, name)
    assert not torch.equal(got["2.lora_B.weight"], torch.zeros(3, 2))
    assert not torch.equal(_weights(runs / "killed" / "freeze" / "final.pt")["2.weight"],
                           base["2.weight"])


@pytest.mark.timeout(240)
def test_fine_tunes_resumed_at_2_1_2_processes_skip_and_repeat_nothing(runs: Path) -> None:
    source = str(runs / "base.safetensors")
    for part in PARTS:  # leg 1, one process: this one
        steps = round(toy_task.FINE_TUNE_STEPS[part] * LEGS[1][1])
        _fit(runs / "legs" / part, part, steps, source, "1-0")
    run_ranks(_legs, 2, str(runs), source, 2, timeout=150)
    for part in PARTS:
        trained: list[int] = []
        done = 0
        for leg, (world, share_of_steps) in enumerate(LEGS):
            steps = round(toy_task.FINE_TUNE_STEPS[part] * share_of_steps)
            seen = [json.loads((runs / "legs" / part / f"seen-{leg}-{r}.json").read_text())
                    for r in range(world)]
            trained += toy_task.global_order(seen, GLOBAL, steps - done)
            done = steps
        assert trained == toy_task.reference(done, GLOBAL)[1], part
        want = _weights(runs / "clean" / part / "final-0.pt")
        got = _weights(runs / "legs" / part / "final-2-0.pt")
        assert set(got) == set(want)
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=f"{part} {name}")
