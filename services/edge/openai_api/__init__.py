"""The edge as an OpenAI-compatible server, a thin layer over the edge's own client: ``config``
(ServeConfig, the serving settings), ``protocol`` (request and response models, the API's error
shape), ``text`` (committed tokens to text, stop strings), ``serving`` (admission, the channel to
the verifier, one Generation per request, its rows), ``routes`` (HTTP). See docs/openai-api.md."""

from services.edge.openai_api.config import ServeConfig
from services.edge.openai_api.protocol import ApiError, GenerateRequest, parse_request
from services.edge.openai_api.text import TextStream

__all__ = ["ApiError", "GenerateRequest", "ServeConfig", "TextStream", "parse_request"]
