"""The OpenAI-compatible API's request and response models: a body checked field by field into a
``GenerateRequest`` (a field that fails is a 422 naming it as ``param``), the responses and
stream chunks of /v1/chat/completions and /v1/completions, and ``ApiError``, the API's own error
shape ``{"error": {"message", "type", "param", "code"}}`` with its HTTP status.

Fields that would change the output in ways this edge does not implement (``n`` > 1,
penalties, logprobs, ``logit_bias``, tools) are refused unless they hold their neutral value,
never silently ignored. Extensions: ``dsd: {"mode", "gamma"}`` (this request's decoding mode and
gamma; default: the edge's settings), and vLLM's ``top_k``, ``ignore_eos`` (load generators use
it for fixed output lengths) and ``stream_options.continuous_usage_stats`` (the usage so far in
every chunk: a load generator learns how many tokens the first chunk carried).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dsd.checks import is_int
from dsd.modes import get_mode

CHAT, TEXT = "chat", "text"
ROLES = ("system", "developer", "user", "assistant")
MAX_STOP = 4
# a neutral value of each refused option: the field may be present with it (clients send defaults)
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None,),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "min_tokens": (None, 0),
}
_COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "user",
    "ignore_eos",
    "dsd",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "logit_bias",
    "min_tokens",
}
FIELDS = {
    CHAT: _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "response_format"},
    TEXT: _COMMON | {"prompt", "echo", "best_of", "suffix"},
}


class ApiError(Exception):
    """An error as the API answers it: HTTP ``status`` and the body's type, param and code."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(422, f"{param}: {message}", param=param, code=code)


@dataclass(frozen=True)
class GenerateRequest:
    """One request of either endpoint, checked: ``prompt`` is the text, the token ids or the chat
    messages; ``max_tokens`` None means what the context leaves (up to the edge's default)."""

    kind: str
    model: str
    prompt: str | tuple[int, ...] | tuple[dict, ...]
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage in every chunk
    ignore_eos: bool = False
    mode: str | None = None
    gamma: int | None = None


def parse_request(kind: str, body) -> GenerateRequest:
    """A JSON body of /v1/chat/completions (``CHAT``) or /v1/completions (``TEXT``)."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    unknown = sorted(set(body) - FIELDS[kind])
    if unknown:
        raise invalid(
            unknown[0], f"unknown or unsupported field; supported: {sorted(FIELDS[kind])}", "unsupported_field"
        )
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise invalid(
                name,
                f"only {' or '.join(map(repr, neutral))} is supported here, got {body[name]!r}",
                "unsupported_value",
            )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", f"a model name is required, got {model!r}")
    stream = _optional(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and (
        not stream or not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}
    ):
        raise invalid(
            "stream_options", 'only {"include_usage": bool, "continuous_usage_stats": bool}, and only with stream: true'
        )
    include_usage = _optional(options or {}, "include_usage", bool, False, "stream_options.include_usage")
    continuous_usage = _optional(
        options or {}, "continuous_usage_stats", bool, False, "stream_options.continuous_usage_stats"
    )
    mode, gamma = _dsd(body.get("dsd"))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    return GenerateRequest(
        kind,
        model,
        _messages(body) if kind == CHAT else _prompt(body),
        max_tokens=_whole(max_tokens, param, 1),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=_top_k(body.get("top_k")),
        seed=_whole(body.get("seed"), "seed", 0),
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        ignore_eos=_optional(body, "ignore_eos", bool, False),
        mode=mode,
        gamma=gamma,
    )


def _optional(body: dict, name: str, kind: type, default, param: str | None = None):
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise invalid(param or name, f"expected {kind.__name__}, got {value!r}")
    return value


def _whole(value, param: str, low: int) -> int | None:
    if value is None:
        return None
    if not (is_int(value) and value >= low):
        raise invalid(param, f"expected a whole number >= {low}, got {value!r}")
    return value


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > low if low_open else value >= low)
        and value <= high
    ):
        raise invalid(name, f"expected a number in {'(' if low_open else '['}{low:g}, {high:g}], got {value!r}")
    return float(value)


def _top_k(value) -> int | None:
    if value is None or value == -1 or value == 0:  # vLLM's and others' "no top-k"
        return None
    return _whole(value, "top_k", 1)


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP and all(isinstance(s, str) and s for s in stops)):
        raise invalid("stop", f"expected a non-empty string or a list of up to {MAX_STOP} of them, got {value!r}")
    return tuple(stops)


def _dsd(value) -> tuple[str | None, int | None]:
    if value is None:
        return None, None
    if not isinstance(value, dict) or set(value) - {"mode", "gamma"}:
        raise invalid("dsd", f'expected {{"mode": str, "gamma": int}} (either may be left out), got {value!r}')
    mode = value.get("mode")
    if mode is not None:
        try:
            get_mode(mode)
        except (ValueError, TypeError) as exc:
            raise invalid("dsd.mode", str(exc)) from None
    return mode, _whole(value.get("gamma"), "dsd.gamma", 1)


def _messages(body: dict) -> tuple[dict, ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", f"expected a non-empty list of messages, got {messages!r}")
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise invalid(param, f'expected {{"role": one of {ROLES}, "content": ...}}, got {message!r}')
        if set(message) - {"role", "content", "name"}:
            raise invalid(param, f"only role, content and name are supported, got {sorted(message)}")
        out.append({"role": message["role"], "content": _content(message.get("content"), f"{param}.content")})
    return tuple(out)


def _content(content, param: str) -> str:
    """A message's text: a string, or a list of text parts (images and audio are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise invalid(param, f'expected a string or a list of {{"type": "text", "text": str}} parts, got {content!r}')


def _prompt(body: dict) -> str | tuple[int, ...]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(is_int(t) and t >= 0 for t in prompt):
        return tuple(prompt)
    raise invalid("prompt", f"expected one non-empty string or one list of token ids (a batch of one), got {prompt!r}")


# ---- responses ---------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def response(
    kind: str, id_: str, created: int, model: str, text: str, finish_reason: str, usage_: dict, extension: dict
) -> dict:
    if kind == CHAT:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {
        "id": id_,
        "object": "chat.completion" if kind == CHAT else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_,
        "dsd": extension,
    }


def chunk(
    kind: str,
    id_: str,
    created: int,
    model: str,
    text: str | None,
    finish_reason: str | None = None,
    first: bool = False,
    usage_: dict | None = None,
    with_usage: bool = False,
) -> dict:
    """A stream chunk with a choice: ``text`` the new text (None: none, as in a closing chunk);
    ``first`` carries the chat's role; ``usage_`` the usage so far (continuous_usage_stats), else
    with ``with_usage`` "usage": null, as with include_usage."""
    if kind == CHAT:
        delta = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    out: dict[str, Any] = {
        "id": id_,
        "object": "chat.completion.chunk" if kind == CHAT else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if usage_ is not None or with_usage:
        out["usage"] = usage_
    return out


def usage_chunk(kind: str, id_: str, created: int, model: str, usage_: dict) -> dict:
    """The last chunk with stream_options.include_usage: no choices, the request's usage."""
    return {
        "id": id_,
        "object": "chat.completion.chunk" if kind == CHAT else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def model_list(model: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "dsd-testbed"}]}
