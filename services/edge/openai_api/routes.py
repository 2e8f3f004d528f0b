"""The OpenAI-compatible API's HTTP side, beside the edge's control API:

    POST /v1/chat/completions    messages rendered with the pair's chat template
    POST /v1/completions         a text (or token ids)
    GET  /v1/models              the one model this edge serves
    GET  /openai, PUT /openai    the serving settings (control API: ServeConfig's fields)

Both completions stream with ``stream: true``: server-sent events, one ``data: {chunk}`` per
arrival of committed tokens that completes text (services/edge/openai_api/text.py), then a
closing chunk with ``finish_reason``, the usage chunk if asked, and ``data: [DONE]``. The
headers go out with the first tokens, so whatever fails before them (the verifier's refusal, a
link down) still gets its own HTTP status; a failure after them is an ``error`` event before
``[DONE]``. Every error is ``{"error": {"message", "type", "param", "code"}}``
(protocol.ApiError). With a token set (--token-file), /v1/ requires it as ``Authorization:
Bearer`` (what clients send as their API key).
"""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web

from services import access
from services.edge.openai_api.config import ServeConfig
from services.edge.openai_api.protocol import (
    CHAT,
    TEXT,
    ApiError,
    GenerateRequest,
    chunk,
    invalid,
    model_list,
    parse_request,
    response,
    usage,
    usage_chunk,
)
from services.edge.openai_api.serving import Generation, OpenAIServing
from services.edge.openai_api.text import TextStream
from dsd.text import encode_prompt

log = logging.getLogger("services.edge")
DISCONNECTED = "disconnect: the HTTP client went away mid-stream"
STOPPED = "stop: the text reached a stop string"


def add_routes(app: web.Application, serving: OpenAIServing, token: str | None) -> None:
    api = OpenAIRoutes(serving, token)
    v1 = web.Application(middlewares=[api.errors])
    v1.router.add_get("/models", api.models)
    v1.router.add_post("/chat/completions", api.chat)
    v1.router.add_post("/completions", api.completions)
    app.add_subapp("/v1/", v1)
    app.router.add_get("/openai", api.get_settings)
    app.router.add_put("/openai", api.put_settings)


class OpenAIRoutes:
    def __init__(self, serving: OpenAIServing, token: str | None) -> None:
        self.serving, self.token = serving, token
        self.created = int(time.time())  # the model's

    @web.middleware
    async def errors(self, request: web.Request, handler):
        """The token, and every error in the API's own shape (a wrong path or method too)."""
        try:
            if self.token is not None and not access.bearer_matches(request.headers.get("Authorization"), self.token):
                reason = "no Authorization header" if "Authorization" not in request.headers else "wrong API key"
                log.warning("refused %s %s from %s: %s", request.method, request.path, request.remote, reason)
                raise ApiError(
                    401,
                    f"{reason}: this edge requires 'Authorization: Bearer <token>'",
                    "authentication_error",
                    None,
                    "invalid_api_key",
                )
            return await handler(request)
        except ApiError as error:
            headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}
            if error.status == 429:
                headers["Retry-After"] = "1"
            return web.json_response(error.body(), status=error.status, headers=headers)
        except web.HTTPException as error:  # no such path or method
            if error.status < 400:
                raise
            kind = "not_found" if error.status == 404 else "method_not_allowed" if error.status == 405 else None
            return web.json_response(
                ApiError(
                    error.status,
                    f"{request.method} {request.path}: {error.reason}",
                    "invalid_request_error",
                    None,
                    kind,
                ).body(),
                status=error.status,
            )

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response(model_list(self.serving.model, self.created))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, CHAT)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, TEXT)

    async def _complete(self, request: web.Request, kind: str) -> web.StreamResponse:
        t_start_s = time.perf_counter()  # the request's start in its row: its TTFT as the client sees it
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not JSON: {exc}", code="invalid_json") from None
        generate = parse_request(kind, body)
        self.serving.check_model(generate.model)
        prompt = self._prompt_ids(generate)
        generation = await self.serving.generate(generate, prompt, t_start_s, request.headers.get("X-Request-ID", ""))
        end = ""
        try:
            if generate.stream:
                response, end = await self._stream(request, generate, generation, len(prompt), int(time.time()))
                return response
            return await self._whole(generate, generation, len(prompt), int(time.time()))
        finally:
            await generation.close(end)

    def _prompt_ids(self, generate: GenerateRequest) -> list[int]:
        param = "messages" if generate.kind == CHAT else "prompt"
        if isinstance(generate.prompt, tuple) and generate.prompt and isinstance(generate.prompt[0], int):
            vocab = self.serving.draft.vocab_size
            if max(generate.prompt) >= vocab:
                raise invalid(param, f"token id {max(generate.prompt)} is outside the vocabulary [0, {vocab})")
            return list(generate.prompt)
        try:
            prompt = generate.prompt
            return encode_prompt(
                self.serving.tokenizer,
                prompt if isinstance(prompt, str) else [message for message in prompt if isinstance(message, dict)],
            )
        except Exception as exc:  # the chat template's own checks (roles, order) raise what they like
            raise invalid(param, f"cannot render it with the pair's chat template: {exc}") from None

    async def _whole(
        self, generate: GenerateRequest, generation: Generation, prompt_tokens: int, created: int
    ) -> web.Response:
        text = TextStream(self.serving.tokenizer, generate.stop)
        async for tokens in generation.arrivals():
            text.add(tokens)
            if text.stopped:
                await generation.close(STOPPED)
                break
        text.finish()
        return web.json_response(
            response(
                generate.kind,
                self._id(generate, generation),
                created,
                self.serving.model,
                text.text,
                "stop" if text.stopped else generation.finish_reason,
                usage(prompt_tokens, len(generation.tokens)),
                self._extension(generation),
            )
        )

    async def _stream(
        self, request: web.Request, generate: GenerateRequest, generation: Generation, prompt_tokens: int, created: int
    ) -> tuple[web.StreamResponse, str]:
        """(the response, why it ended early or "")."""
        text = TextStream(self.serving.tokenizer, generate.stop)
        id_, model = self._id(generate, generation), self.serving.model
        response: web.StreamResponse | None = None
        first = True

        def event(kind_text: str | None, finish_reason: str | None = None) -> dict:
            so_far = usage(prompt_tokens, len(generation.tokens)) if generate.continuous_usage else None
            return chunk(
                generate.kind, id_, created, model, kind_text, finish_reason, first, so_far, generate.include_usage
            )

        try:
            try:
                async for tokens in generation.arrivals():
                    delta = text.add(tokens)
                    if response is None:
                        response = await self._open_stream(request, generation)
                    if delta:
                        await _send(response, event(delta))
                        first = False
                    if text.stopped:
                        await generation.close(STOPPED)
                        break
            except ApiError as error:
                if response is None:
                    raise  # nothing sent yet: its own status says it
                await _send(response, error.body())
                await response.write(b"data: [DONE]\n\n")
                return response, ""
            if response is None:
                response = await self._open_stream(request, generation)
            rest = text.finish()
            if rest:
                await _send(response, event(rest))
                first = False
            await _send(response, event(None, "stop" if text.stopped else generation.finish_reason))
            if generate.include_usage:
                await _send(
                    response,
                    usage_chunk(generate.kind, id_, created, model, usage(prompt_tokens, len(generation.tokens))),
                )
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response, ""
        except ConnectionError:  # the client went away: the generation is given up
            return response or web.Response(status=499), DISCONNECTED

    async def _open_stream(self, request: web.Request, generation: Generation) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **self._dsd_headers(generation),
            }
        )
        await response.prepare(request)
        return response

    @staticmethod
    def _id(generate: GenerateRequest, generation: Generation) -> str:
        prefix = "chatcmpl" if generate.kind == CHAT else "cmpl"
        return f"{prefix}-{generation.record.config.run_id}-{generation.index}"

    @staticmethod
    def _extension(generation: Generation) -> dict:
        """What this request decoded with, and its row (run_id, request_index)."""
        c = generation.record.config
        return {"mode": c.mode, "gamma": c.gamma, "run_id": c.run_id, "request_index": generation.index}

    def _dsd_headers(self, generation: Generation) -> dict:
        return {
            f"X-DSD-{key.title().replace('_', '-')}": str(value) for key, value in self._extension(generation).items()
        }

    async def get_settings(self, _request: web.Request) -> web.Response:
        return web.json_response(self.serving.status())

    async def put_settings(self, request: web.Request) -> web.Response:
        try:
            config = ServeConfig.from_json(await request.json())
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        try:
            await self.serving.configure(config)
        except RuntimeError as exc:
            return web.json_response({"error": str(exc)}, status=409)
        return web.json_response(self.serving.status())


async def _send(response: web.StreamResponse, data: dict) -> None:
    await response.write(b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")
