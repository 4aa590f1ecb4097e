"""The user's own prompts, for `profile` (and the quantize guardrail's `--prompts`).

Two file shapes:
  JSONL     one JSON object per line: `prompt` (a string) or chat `messages` (a list of
            {"role", "content"}), optional `category` (a string; default "default");
            blank lines are skipped.
  ShareGPT  a JSON array of {"conversations": [{"from": "system" | "human" | "gpt", "value"}],
            optional "category"}: the prompt is the conversation up to its first human turn,
            as chat messages (the completion the model writes is its own).
A file that cannot be read, or an entry that is neither, stops with one line naming the file
and the line (JSONL) or entry (ShareGPT), and what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtllm_dflash.errors import UserError

DEFAULT_CATEGORY = "default"
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
CHAT_ROLES = ("system", "developer", "user", "assistant")

# Chat prompts of a tokenizer without a chat template (the embedded tiny pair's): one "role: content"
# line per message, then "assistant:". The OpenAI server, `profile` and the quantize guardrail render chat alike.
FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


def chat_prompt_ids(tok, messages: list[dict], template: str | None = None) -> list[int]:
    """Token ids of chat `messages` with the generation prompt: `template`, else the tokenizer's
    chat template, else FALLBACK_CHAT_TEMPLATE. The template writes the special tokens itself."""
    template = template or getattr(tok, "chat_template", None) or FALLBACK_CHAT_TEMPLATE
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class UserPrompt:
    text: str | None  # a plain prompt, or None for chat
    messages: tuple[dict, ...] | None  # chat messages ({"role", "content"} strings), or None
    category: str
    where: str  # "FILE:LINE" (JSONL) or "FILE: entry N" (ShareGPT), for messages about this prompt


def load_user_prompts(path: Path) -> list[UserPrompt]:
    """Every prompt of a JSONL or ShareGPT JSON file, in file order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"--prompts {path}: file not found") from None
    except (IsADirectoryError, UnicodeDecodeError) as e:
        raise UserError(f"--prompts {path}: not a UTF-8 text file ({type(e).__name__})") from None
    out = _sharegpt(path, text) if text.lstrip().startswith("[") else _jsonl(path, text)
    if not out:
        raise UserError(f"--prompts {path}: no prompts (expected JSONL lines with 'prompt' or 'messages', or a "
                        "ShareGPT JSON array)")
    return out


def prompt_token_ids(prompts: list[UserPrompt], tok) -> list[list[int]]:
    """Token ids of each prompt: plain text with the tokenizer's special tokens, chat through
    `chat_prompt_ids`. An empty encoding is refused naming the prompt's line."""
    out = []
    for p in prompts:
        ids = tok(p.text)["input_ids"] if p.text is not None else chat_prompt_ids(tok, list(p.messages))
        if not ids:
            raise UserError(f"--prompts {p.where}: the prompt encodes to zero tokens")
        out.append(ids)
    return out


def _jsonl(path: Path, text: str) -> list[UserPrompt]:
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"--prompts {where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"--prompts {where}: expected a JSON object with 'prompt' or 'messages'")
        out.append(_entry(row, where))
    return out


def _entry(row: dict, where: str) -> UserPrompt:
    category = _category(row, where)
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise UserError(f"--prompts {where}: prompt must be a non-empty string")
        return UserPrompt(row["prompt"], None, category, where)
    if "messages" not in row:
        raise UserError(f"--prompts {where}: no 'prompt' or 'messages' field")
    msgs = row["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise UserError(f"--prompts {where}: messages must be a non-empty list")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise UserError(f"--prompts {where}: messages.{i} must be {{'role': one of {', '.join(CHAT_ROLES)}, "
                            "'content': a string}")
    return UserPrompt(None, tuple({"role": m["role"], "content": m["content"]} for m in msgs), category, where)


def _category(row: dict, where: str) -> str:
    category = row.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category:
        raise UserError(f"--prompts {where}: category must be a non-empty string")
    return category


def _sharegpt(path: Path, text: str) -> list[UserPrompt]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"--prompts {path}:{e.lineno}: not valid JSON ({e.msg})") from None
    out = []
    for n, row in enumerate(rows):
        where = f"{path}: entry {n}"
        turns = row.get("conversations") if isinstance(row, dict) else None
        if not isinstance(turns, list):
            raise UserError(f"--prompts {where}: expected an object with a 'conversations' list (ShareGPT)")
        messages = []
        for i, t in enumerate(turns):
            role = SHAREGPT_ROLES.get(t.get("from")) if isinstance(t, dict) else None
            if role is None or not isinstance(t.get("value"), str):
                raise UserError(f"--prompts {where}: conversations.{i} must be {{'from': one of "
                                f"{', '.join(SHAREGPT_ROLES)}, 'value': a string}}")
            messages.append({"role": role, "content": t["value"]})
            if role == "user":
                break
        if not messages or messages[-1]["role"] != "user":
            raise UserError(f"--prompts {where}: the conversation has no human turn")
        out.append(UserPrompt(None, tuple(messages), _category(row, where), where))
    return out
