"""The quantize run's schedule (each fused set's first pass, then its encoding) and its time split."""

from __future__ import annotations

from pathlib import Path

from synth import llama_tensors, write_checkpoint
from weightsmith.api import QuantizeRequest, plan_quantize, quantize
from weightsmith.core.timesplit import PHASES, process_seconds
from weightsmith.quantization.pipeline import _first_passes, _FirstPass, _jobs
from weightsmith.quantization.recipe import Recipe
from weightsmith.schemes import make_scheme

IGNORE = ["lm_head", "model.embed_tokens"]


def _quantize(src: Path, out: Path, scheme: str, workers: int) -> object:
    result = quantize(
        QuantizeRequest(src, out, scheme=scheme, ignore=IGNORE, workers=workers, hash_sources=False, pre_pass=None)
    )
    return result


def test_each_fused_set_is_observed_whole_before_its_rows_are_encoded(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors())
    plan = plan_quantize(QuantizeRequest(src, recipe=Recipe.single(make_scheme("nvfp4a16")), ignore=IGNORE))
    jobs = _jobs(plan)
    items = _first_passes(plan, jobs)
    passes = [item for item in items if isinstance(item, _FirstPass)]
    sets = sorted(sorted(plan.decisions[j.decision_index].module.rsplit(".", 1)[1] for j in p.targets) for p in passes)
    layers = 2  # llama_tensors' config
    assert sets == sorted(
        [["k_proj", "q_proj", "v_proj"], ["gate_proj", "up_proj"], ["o_proj"], ["down_proj"]] * layers
    )
    for p in passes:  # a set's encode jobs are its members' row blocks, all of them, and only those
        members = {j.decision_index for j in p.targets}
        assert {j.decision_index for j in p.then} == members
        assert p.nbytes == sum(plan.decisions[i].nbytes for i in members)
    held_back = [j for p in passes for j in p.then]
    free = [item for item in items if not isinstance(item, _FirstPass)]
    assert sorted(map(id, held_back + free)) == sorted(map(id, jobs))  # every job once


def test_without_a_first_pass_the_jobs_are_the_schedule(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors())
    plan = plan_quantize(QuantizeRequest(src, recipe=Recipe.single(make_scheme("w4a16")), ignore=IGNORE))
    jobs = _jobs(plan)
    assert _first_passes(plan, jobs) == jobs


def test_nvfp4_bytes_do_not_depend_on_the_number_of_workers(tmp_path: Path) -> None:
    """Sets concluded and encoded in whatever order the workers reach them: the same files."""
    src = write_checkpoint(tmp_path / "src", llama_tensors(), shards=3)
    _quantize(src, tmp_path / "one", "nvfp4a16", 1)
    _quantize(src, tmp_path / "three", "nvfp4a16", 3)
    names = sorted(p.name for p in (tmp_path / "one").glob("*.safetensors"))
    assert len(names) == 3
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "three" / name).read_bytes()


def test_time_split_counts_each_phase_of_a_run(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", llama_tensors())
    timing = _quantize(src, tmp_path / "out", "w4a16", 2).timing  # type: ignore[attr-defined]
    for phase in ("read", "kernel", "write"):
        assert timing.wall[phase] > 0 and timing.cpu[phase] >= 0, phase
    assert timing.workers > 0 and timing.before >= 0 and timing.after > 0
    # CPU time within a phase never exceeds its wall time on one thread, summed alike over threads
    assert all(timing.cpu[p] <= timing.wall[p] + 0.01 for p in PHASES)
    split = timing.to_json()
    assert set(split) == {"wall", "cpu", "before", "workers", "after", "first_output"}
    assert set(split["cpu"]) == set(PHASES)
    # the process's age when its first quantized rows were written: within this test's own run
    assert process_seconds() - (timing.before + timing.workers + timing.after) - 0.05 <= timing.first_output
    assert timing.first_output <= process_seconds()
