"""Prompt rendering: a task prompt's text -> the token ids the generator samples from and the learner trains on.

With a chat template (`prompt.chat_template: auto` and the tokenizer has one) the text becomes the user turn of
a conversation (after the recipe's system prompt, if any), rendered with the model's own template and an open
assistant turn; the rendered string already holds the template's special tokens, so it is tokenized without
adding more. Without one (`none`, or a model that has none, e.g. the tiny arithmetic model) the text is
tokenized as is, with the tokenizer's own special tokens (BOS).

The ids are computed once, by the generator, and travel with the group (`ScoredGroup.prompt_token_ids`,
`Completion.token_ids`): the learner never re-tokenizes text.
"""

from __future__ import annotations

from typing import Any, Protocol

_PROBE = "\x00scalerl-probe\x00"


class PromptSettings(Protocol):
    """What rendering reads from the recipe's `prompt` section (`scalerl.recipe.PromptConfig`)."""

    chat_template: str
    system_prompt: str | None


def uses_chat_template(tokenizer: Any, cfg: PromptSettings) -> bool:
    return cfg.chat_template == "auto" and bool(getattr(tokenizer, "chat_template", None))


def render_text(tokenizer: Any, text: str, cfg: PromptSettings) -> str:
    """The prompt as the model sees it (for logs and docs; `prompt_token_ids` is what is used)."""
    if not uses_chat_template(tokenizer, cfg):
        return text if cfg.system_prompt is None else f"{cfg.system_prompt}\n{text}"
    messages = [] if cfg.system_prompt is None else [{"role": "system", "content": cfg.system_prompt}]
    messages.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_token_ids(tokenizer: Any, text: str, cfg: PromptSettings) -> list[int]:
    """The prompt's token ids: chat-rendered without extra special tokens, or plain with them."""
    rendered = render_text(tokenizer, text, cfg)
    return list(tokenizer(rendered, add_special_tokens=not uses_chat_template(tokenizer, cfg))["input_ids"])


def end_of_turn_token_ids(tokenizer: Any) -> list[int]:
    """The special token(s) the chat template closes an assistant turn with (e.g. `<|im_end|>`), found by
    rendering a probe reply; [] without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": _PROBE}], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that refuses the probe just adds no stop token
        return []
    tail = rendered.split(_PROBE, 1)[-1] if _PROBE in rendered else ""
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    for token_id in tokenizer(tail, add_special_tokens=False)["input_ids"]:
        if token_id in special:
            return [token_id]
    return []


def stop_token_ids(tokenizer: Any, cfg: PromptSettings) -> list[int]:
    """Token ids that end a completion: EOS, and with a chat template the end-of-turn token."""
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    if uses_chat_template(tokenizer, cfg):
        ids += [t for t in end_of_turn_token_ids(tokenizer) if t not in ids]
    return ids
