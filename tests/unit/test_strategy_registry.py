"""The strategies' registry: the config schema, validation and the tuner's search space
take their strategy names and combination rules from it, and each class carries its entry."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

import tandem
from tandem.config import PlanConfig, reference, validate
from tandem.parallel import registry
from tandem.tune import space


def _config(**plan: object) -> tandem.Config:
    cfg = tandem.Config()
    for key, value in plan.items():
        setattr(cfg.plan, key, value)
    return cfg


def test_the_schema_allows_exactly_the_choosable_strategies() -> None:
    allowed = typing.get_args(typing.get_type_hints(PlanConfig)["strategy"])
    # The values stored configs hold: they must all still load.
    assert allowed == registry.CHOICES == ("auto", "single", "ddp", "fsdp", "localsgd",
                                           "diloco", "streaming_diloco", "async")
    assert "tp" in registry.REGISTRY and "tp" not in allowed  # chosen by plan.tp
    text = reference()
    for name in registry.CHOICES:
        assert f"{name}: {registry.REGISTRY[name].summary}" in text


def test_validation_follows_the_combination_rules() -> None:
    for name in registry.CHOICES:
        for rule, plan in (("takes_comm_hook", {"comm_hook": "fp16"}),
                           ("takes_tp", {"tp": 2}),
                           ("takes_host_allreduce", {"host_allreduce": "shared_memory"})):
            cfg = _config(strategy=name, **plan)
            if getattr(registry.REGISTRY[name], rule):
                validate(cfg)
            else:
                with pytest.raises(ValueError, match=repr(name)):
                    validate(cfg)
    with pytest.raises(ValueError, match="use 'auto' or 'ddp'"):
        validate(_config(strategy="fsdp", tp=2))


def test_pipeline_stages_combine_with_replicas_or_shards() -> None:
    from tandem.parallel import strategy_name

    for strategy, concrete in (("auto", "pp"), ("ddp", "pp"), ("fsdp", "pp_fsdp")):
        cfg = validate(_config(strategy=strategy, pp=2))
        assert strategy_name(cfg.plan, 4) == concrete
    with pytest.raises(ValueError, match="'localsgd' does not compose with them here: use "
                                         "'auto', 'ddp' or 'fsdp'"):
        validate(_config(strategy="localsgd", pp=2))
    for strategy in ("auto", "ddp", "fsdp"):  # and with tensor parallelism
        validate(_config(strategy=strategy, pp=2, tp=2))
    with pytest.raises(ValueError, match="'diloco' does not compose with them here"):
        validate(_config(strategy="diloco", pp=2, tp=2))


def test_the_search_space_uses_the_registry() -> None:
    assert space.EXACT_STRATEGIES == {s.name for s in registry.REGISTRY.values()
                                      if s.choosable and s.exact}
    for name in registry.CHOICES:
        lossy = space.Candidate({"plan.strategy": name}, "comm", "test").lossy
        assert lossy == (not registry.REGISTRY[name].exact), name
        remedies = space.comm_remedies({"plan.strategy": name}, "test", world=2,
                                       predicted=None)
        assert bool(remedies) == registry.REGISTRY[name].takes_comm_hook, name
    proposed = {c.changes.get("plan.strategy") for c in
                space.comm_remedies({}, "test", 2, None) + space.memory_remedies({}, "", 2)}
    assert proposed - {None} <= set(registry.CHOICES)


def test_each_class_carries_its_entry() -> None:
    for info in registry.REGISTRY.values():
        if not info.path:
            continue
        cls = info.load()
        assert cls.name == info.name
        if info is not registry.SINGLE:
            assert cls.info is info


def test_reading_the_registry_imports_no_strategy() -> None:
    code = ("import sys, tandem.config, tandem.parallel, tandem.tune.space\n"
            "heavy = [m for m in sys.modules if m.startswith(('torch', 'tandem.parallel.'))\n"
            "         and m != 'tandem.parallel.registry']\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
