"""The answer check's reference, computed by Hugging Face transformers on CPU: runs inside the lab's
real-vLLM image (its torch and transformers), with the checkpoint mounted read-only, and prints one
JSON line in the format `answers.reference` reads (docs/answers.md).

An implementation other than vLLM, from the same checkpoint files: the model class the checkpoint's
`config.json` names, in float32 (vLLM serves it in BF16), greedy, one full forward pass per
generated token (no KV cache: nothing of vLLM's decode path is imitated). Each prompt's token ids
are the tokenizer's own (chat messages through its chat template), cut at the prompt's `limit`.

    python3 - MODEL_DIR MAX_TOKENS TOP      (the source on stdin after a prelude assigning SPEC)

(No `from __future__` import here: it runs after a prelude.)
"""

import json
import sys
import time

import torch
import transformers


def prompt_ids(tokenizer, prompt: dict) -> list:
    """The prompt's token ids as the tokenizer makes them, cut at its `limit`."""
    if prompt.get("messages"):
        made = tokenizer.apply_chat_template(
            prompt["messages"], add_generation_prompt=True, tokenize=True, enable_thinking=False
        )
        ids = made["input_ids"] if hasattr(made, "keys") else made
    else:
        ids = tokenizer(prompt["text"], add_special_tokens=True)["input_ids"]
    ids = [int(t) for t in ids]
    return ids[: int(prompt["limit"])] if prompt.get("limit") else ids


def greedy(model, tokenizer, ids: list, max_tokens: int, top: int, stop: set) -> dict:
    """Up to `max_tokens` tokens, each the most likely one, with its logprob and the `top` best."""
    tokens, logprobs, alternatives, texts = [], [], [], []
    sequence = list(ids)
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([sequence])).logits[0, -1].float()
        scores = torch.log_softmax(logits, dim=-1)
        values, best = scores.topk(top)
        token = int(best[0])
        tokens.append(token)
        logprobs.append(float(values[0]))
        alternatives.append([[int(i), float(v)] for i, v in zip(best.tolist(), values.tolist(), strict=True)])
        texts.append(tokenizer.decode([token]))
        sequence.append(token)
        if token in stop:
            break
    return {"prompt_ids": ids, "tokens": tokens, "logprobs": logprobs, "alternatives": alternatives,
            "texts": texts}  # fmt: skip


def load(model_dir: str):
    """The tokenizer, the model (the class its config names, float32, eval) and its stop tokens."""
    config = transformers.AutoConfig.from_pretrained(model_dir)
    model_class = getattr(transformers, config.architectures[0])
    model = model_class.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    generation = transformers.GenerationConfig.from_pretrained(model_dir)
    stop = generation.eos_token_id
    stop = set(stop if isinstance(stop, list) else [stop] if stop is not None else [])
    return tokenizer, model, stop


def main(argv: list) -> int:
    model_dir, max_tokens, top = argv[0], int(argv[1]), int(argv[2])
    spec = json.loads(SPEC)  # noqa: F821 (the prelude assigns it)
    started = time.monotonic()
    torch.manual_seed(0)
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    tokenizer, model, stop = load(model_dir)
    prompts = {}
    for prompt in spec["prompts"]:
        ids = prompt_ids(tokenizer, prompt)
        prompts[prompt["id"]] = greedy(model, tokenizer, ids, max_tokens, top, stop)
        print(f"reference: {prompt['id']}: {len(ids)} prompt tokens", file=sys.stderr, flush=True)
    made_by = f"transformers {transformers.__version__}, torch {torch.__version__}, CPU, float32"
    report = {"version": spec["version"], "made_by": made_by, "prompts": prompts,
              "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
