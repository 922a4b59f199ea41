"""One vLLM start (run by ``bench/vllm_start.py`` in the vLLM venv): build an ``LLM`` for the
tiny model in ``argv[1]`` and generate greedily from token ids; print the token ids and the
wall-clock time the first token was out (``RESULT {json}``). Not imported by objcache."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=sys.argv[1], skip_tokenizer_init=True, seed=0)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    out = llm.generate([{"prompt_token_ids": [1, 15, 27, 300, 42, 7]}], params, use_tqdm=False)
    result = {"first_token_at": time.time(), "tokens": list(out[0].outputs[0].token_ids)}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
