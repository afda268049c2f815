"""Fine-tunes from a model's weights (`run.init_from` a safetensors file), one with its
first layer frozen (`train.freeze`), one with LoRA adapters, and a two-task run (a
mixture of sources): killed at 60% of their steps they resume bit-exact at the same size;
resumed at 2 -> 1 -> 2 processes they train every sample once, in the order (for the
mixture: the sequence of sources and samples) of the same run left alone, to its weights
within 1e-6"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.monitor.store import RunStore
from tests.dist import mix_task, toy_task
from tests.dist.procs import run_ranks
from tests.faults import jobs, resumable

SCRIPT = str(Path(__file__).parent / "scripts" / "resumable_runs.py")
GLOBAL = resumable.GLOBAL
LEGS = [(2, 0.6), (1, 0.8), (2, 1.0)]  # (world size, share of the steps at the leg's end)


def _fit(out: Path, part: str, steps: int, source: str, tag: str) -> None:
    """One run; what this process trained on and the final weights go to `out`."""
    model, seen = resumable.fit(part, str(out), steps, source)
    Path(out, f"seen-{tag}.json").write_text(json.dumps(seen))
    torch.save(model.state_dict(), Path(out, f"final-{tag}.pt"))


def _legs(rank: int, world: int, root: str, source: str, leg: int) -> None:
    """Leg `leg` of every run, in these processes; before the first, each run left alone
    (the reference)."""
    for part, steps in resumable.STEPS.items():
        if leg == 0:
            _fit(Path(root, "clean", part), part, steps, source, f"{rank}")
        _fit(Path(root, "legs", part), part, round(steps * LEGS[leg][1]), source,
             f"{leg}-{rank}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base model's weights; from them, each run left alone at 2 processes, and the
    first (2-process) leg of each."""
    root = tmp_path_factory.mktemp("resume")
    torch.manual_seed(11)
    save_file(toy_task.make_model().state_dict(), str(root / "base.safetensors"))
    for part in resumable.STEPS:
        for folder in ("clean", "legs"):
            (root / folder / part).mkdir(parents=True)
    run_ranks(_legs, 2, str(root), str(root / "base.safetensors"), 0, timeout=150)
    return root


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def _events(run_dir: Path, name: str) -> list[tuple[str, int]]:
    with RunStore(run_dir / "tandem.db") as store:
        return [(e["kind"], e["step"]) for e in store.events(store.run(name)["run_id"])]


@pytest.mark.timeout(300)
def test_runs_killed_at_60_percent_resume_bit_exact(runs: Path) -> None:
    # One job runs the three, one after the other (they share its start-ups): the first is
    # killed at step 6 of 10 in the job's first attempt, the second at step 12 of 20 in
    # its second (which the first, resumed from step 5, never reaches), the third at step
    # 6 of 10 in its third (which the second, resumed from step 10, never reaches).
    assert resumable.STEPS == {"freeze": 10, "lora": 20, "mix": 10}
    kill = [{"rank": 1, "step": step, "phase": "compute", "kind": "kill", "attempt": n}
            for n, step in enumerate((6, 12, 6))]
    job = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", "2",
         "--max-restarts", "3", "--monitor-interval", "0.5", SCRIPT, str(runs / "killed"),
         str(runs / "base.safetensors")],
        cwd=runs, env=jobs.env(kill), capture_output=True, text=True, timeout=260)
    assert job.returncode == 0, job.stderr[-6000:]
    for part, resumed_at in (("freeze", 5), ("lora", 10), ("mix", 5)):
        assert ("resume", resumed_at) in _events(runs / "killed" / part,
                                                 resumable.NAMES[part]), part
    base = load_file(str(runs / "base.safetensors"))
    for part in resumable.STEPS:
        want = _weights(runs / "clean" / part / "final-0.pt")
        got = _weights(runs / "killed" / part / "final.pt")
        assert set(got) == set(want), part
        for name, value in want.items():
            assert torch.equal(got[name], value), (part, name)
        # it trained what it was meant to, and kept the rest at the base's weights
        frozen = {"freeze": ["0.weight", "0.bias"], "lora": list(base), "mix": []}[part]
        for name in frozen:
            assert torch.equal(got[name], base[name]), (part, name)
    assert not torch.equal(_weights(runs / "killed" / "lora" / "final.pt")["2.lora_B.weight"],
                           torch.zeros(3, 2))
    assert not torch.equal(_weights(runs / "killed" / "freeze" / "final.pt")["2.weight"],
                           base["2.weight"])


def _trained(runs: Path, part: str) -> list[list]:
    """The global batches the three legs of `part` trained on, step by step."""
    steps: list[list] = []
    done = 0
    for leg, (world, share_of_steps) in enumerate(LEGS):
        end = round(resumable.STEPS[part] * share_of_steps)
        seen = [json.loads((runs / "legs" / part / f"seen-{leg}-{r}.json").read_text())
                for r in range(world)]
        share = GLOBAL // world
        steps += [[s for r in range(world) for s in seen[r][i * share:(i + 1) * share]]
                  for i in range(end - done)]
        done = end
    return steps


@pytest.mark.timeout(240)
def test_runs_resumed_at_2_1_2_processes_skip_and_repeat_nothing(runs: Path) -> None:
    source = str(runs / "base.safetensors")
    for part, steps in resumable.STEPS.items():  # leg 1, one process: this one
        _fit(runs / "legs" / part, part, round(steps * LEGS[1][1]), source, "1-0")
    run_ranks(_legs, 2, str(runs), source, 2, timeout=150)
    for part, steps in resumable.STEPS.items():
        trained = _trained(runs, part)
        if part == "mix":
            # Within a micro-batch the samples are grouped by source: compare each step's.
            stream = mix_task.stream(5, steps, GLOBAL)
            assert [sorted(map(tuple, b)) for b in trained] == [sorted(b) for b in stream]
        else:
            assert sum(trained, []) == toy_task.reference(steps, GLOBAL)[1], part
        want = _weights(runs / "clean" / part / "final-0.pt")
        got = _weights(runs / "legs" / part / "final-2-0.pt")
        assert set(got) == set(want)
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=f"{part} {name}")
    # the run left alone is the plain-PyTorch mixed run's
    ref, _ = mix_task.reference(5, resumable.STEPS["mix"], GLOBAL)
    got = _weights(runs / "clean" / "mix" / "final-0.pt")
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)
