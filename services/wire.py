"""The verifier's wire protocol: small typed messages that are also the schema, in msgpack.

On the wire a message is one binary WebSocket frame holding a msgpack map
``{"v": VERSION, "type": <class name>, <field>: <value>, ...}``. ``decode`` checks the version,
the type, that every field is present with its declared type and that no unknown field is there,
and raises ``WireError`` naming the problem; it never builds anything but the plain values below:
nothing received is unpickled or evaluated, an extension type is refused while unpacking, and
msgpack's timestamp (the one extension it decodes itself) fails every field's exact type check.

``seq`` is the client's request number, echoed in every reply to that request (a ``Generate``
is answered by a stream of ``Tokens`` with its seq; a hand-over's, with ``max_tokens``, first by a
``Queued`` as it arrives; a ``Withdraw`` drops the last ones asked if not yet started, answered by
``Withdrawn``). ``session`` is the client's id for one
request (prompt) on its connection. Times are seconds, measured on the verifier's clock.
"""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, fields

import msgpack

VERSION = 1
UINT64_MAX = (1 << 64) - 1

# Error codes (Error.code)
MALFORMED = "malformed"  # not msgpack, not a map, truncated
BAD_VERSION = "bad_version"
UNKNOWN_TYPE = "unknown_type"
BAD_FIELD = "bad_field"  # missing, unknown or of the wrong type
OUT_OF_RANGE = "out_of_range"  # well typed but outside the limits
UNKNOWN_SESSION = "unknown_session"
DUPLICATE_SESSION = "duplicate_session"
LIMIT = "limit"  # a limit reached (Error.limit names it): sessions, size, tokens
BUSY = "busy"  # max_inflight_per_connection requests in flight: retry later
UNAUTHORIZED = "unauthorized"  # HTTP 401 body at the WebSocket upgrade, not a frame
IDLE_TIMEOUT = "idle_timeout"
INTERNAL = "internal"
LINK_DOWN = "link_down"  # the edge's own, never sent: its connection to the verifier dropped


class WireError(ValueError):
    """A request that cannot be served; becomes an ``Error`` reply."""

    def __init__(
        self,
        code: str,
        message: str,
        field: str | None = None,
        seq: int | None = None,
        session: int | None = None,
        limit: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.field, self.seq, self.session = code, message, field, seq, session
        self.limit = limit

    def reply(self) -> Error:
        return Error(self.seq, self.session, self.code, self.field, self.message, self.limit)


# ---- edge -> verifier ------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    seq: int
    client_id: str


@dataclass(frozen=True)
class Ping:
    seq: int
    t_send_s: float  # the sender's clock, echoed


@dataclass(frozen=True)
class Open:
    """Start a request: the verifier prefills the prompt."""

    seq: int
    session: int
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    top_k: int | None
    seed: int
    stop_at_eos: bool
    top_p: float = 1.0  # nucleus truncation of drafter and target (1: none)
    # the target's features for a feature draft (dsd.features), in this dtype, on the Opened (the
    # prefill's), every Verified and every Tokens of this session; None: no features
    feature_dtype: str | None = None


@dataclass(frozen=True)
class Verify:
    """One draft block (a dsd Proposal). Under sampling the draft's distributions q travel too:
    dense as float32 little-endian bytes [gamma, vocab], or sparse as per-row ids and values."""

    seq: int
    session: int
    start_pos: int
    base_digest: int
    draft_tokens: list[int]
    probs_dense: bytes | None = None
    probs_ids: list[list[int]] | None = None
    probs_values: list[list[float]] | None = None


def probs_encoding(temperature: float, top_k: int | None, top_p: float) -> str:
    """How a Verify carries the draft's q under these sampling settings: "none" (greedy: token ids
    only), "dense" (every row over the whole vocabulary), or "sparse" (a top-k / top-p q is zero
    outside its kept tokens: per row their ids and values). top_k None or 0: no top-k."""
    if temperature == 0:
        return "none"
    return "sparse" if top_k or top_p < 1.0 else "dense"


@dataclass(frozen=True)
class Generate:
    """Run the request on the verifier: a mode of ``dsd.modes.server_modes()`` (cloud AR, co-located SD).
    With ``max_tokens`` (a hand-over, dsd/drive/driver.py) only until that many more tokens are generated
    (a round may overshoot by its accepted drafts); the session stays open for Verify and Generate."""

    seq: int
    session: int
    mode: str
    gamma: int
    max_tokens: int | None = None


@dataclass(frozen=True)
class Withdraw:
    """Drop the session's hand-over segments (Generates with max_tokens) asked after the Generate
    ``keep_through`` (a seq; -1: every one) that have not started: the edge takes the request back.
    A segment being served runs to its end; answered at once."""

    seq: int
    session: int
    keep_through: int = -1


@dataclass(frozen=True)
class Close:
    seq: int
    session: int


# ---- verifier -> edge ------------------------------------------------------------------------


@dataclass(frozen=True)
class Welcome:
    seq: int
    version: int
    target: str
    draft: str
    vocab_size: int
    eos_token_id: int | None
    max_gamma: int
    max_tokens_per_session: int
    max_message_bytes: int


@dataclass(frozen=True)
class Pong:
    seq: int
    t_send_s: float
    t_server_s: float
    # how long the ping waited unread behind a model pass on the verifier's event-loop thread
    # (services.verifier.frame_stamps): not the link's, so the prober subtracts it from the round trip
    held_s: float = 0.0


@dataclass(frozen=True)
class Queued:
    """A hand-over's Generate (with max_tokens) has arrived: sent at once on its arrival, before it
    is served and not behind the session's queue, so its round trip is the link's now (less held_s,
    as a Pong's), where the segment's first Tokens come only after every segment asked before it."""

    seq: int
    session: int
    held_s: float = 0.0


@dataclass(frozen=True)
class Withdrawn:
    """A Withdraw's answer, sent as it arrives: the seqs of the segments dropped (the last ones
    asked, in order; none if every segment had started)."""

    seq: int
    session: int
    segments: list[int]
    held_s: float = 0.0


@dataclass(frozen=True)
class Opened:
    seq: int
    session: int
    prefill_positions: int
    queue_s: float
    compute_s: float
    features: bytes | None = None  # dsd.features.encode: rows 0..len(prompt)-2, if the Open asked


@dataclass(frozen=True)
class Verified:
    """A dsd Verdict plus what it cost on the verifier (stale: no compute, batch size 0)."""

    seq: int
    session: int
    start_pos: int
    proposed: int
    accepted: int
    next_token: int
    stale: bool
    queue_s: float
    compute_s: float
    batch_size: int
    features: bytes | None = None  # dsd.features.encode: the positions this verdict decided, if asked


@dataclass(frozen=True)
class Tokens:
    """One round of a Generate: AR emits one token with proposed = 0; co-located SD emits
    accepted + 1. queue_s and compute_s add up the round's draft and verify passes."""

    seq: int
    session: int
    round_index: int
    proposed: int
    accepted: int
    tokens: list[int]
    done: bool
    queue_s: float
    compute_s: float
    batch_size: int
    features: bytes | None = None  # dsd.features.encode: the positions this round decided, if asked


@dataclass(frozen=True)
class Closed:
    seq: int
    session: int
    generated: int


@dataclass(frozen=True)
class Error:
    seq: int | None
    session: int | None
    code: str
    field: str | None
    message: str
    limit: str | None = None  # codes limit and busy: the limit's name, e.g. "max_sessions"


MESSAGES = {
    cls.__name__: cls
    for cls in (
        Hello,
        Ping,
        Open,
        Verify,
        Generate,
        Withdraw,
        Close,
        Welcome,
        Pong,
        Queued,
        Withdrawn,
        Opened,
        Verified,
        Tokens,
        Closed,
        Error,
    )
}


def encode(message) -> bytes:
    return _SCHEMAS[type(message).__name__].encode(message)


def decode(data: bytes):
    """bytes -> message dataclass, or WireError naming what is wrong."""
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_refuse_ext)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WireError(MALFORMED, f"not a msgpack message: {type(exc).__name__}: {exc}") from None
    if not isinstance(body, dict):
        raise WireError(MALFORMED, f"a message is a map, got {type(body).__name__}")
    seq = _int_or_none(body.get("seq"))
    session = _int_or_none(body.get("session"))
    if body.get("v") != VERSION:
        raise WireError(BAD_VERSION, f"version must be {VERSION}, got {body.get('v')!r}", "v", seq, session)
    name = body.get("type")
    schema = _SCHEMAS.get(name) if isinstance(name, str) else None
    if schema is None:
        raise WireError(UNKNOWN_TYPE, f"unknown message type {name!r}", "type", seq, session)
    if len(body) - 2 > len(schema.names) or not schema.known.issuperset(body):
        field = sorted(map(str, set(body) - schema.known))[0]
        raise WireError(BAD_FIELD, f"{name}: unknown field {field!r}", field, seq, session)
    message = schema.read(body)
    if message is not None:
        return message
    values = {}  # something is wrong: find the first bad field, as documented
    for field, check, required, type_name in schema.fields:
        if field not in body:
            if required:
                raise WireError(BAD_FIELD, f"{name}: missing field {field!r}", field, seq, session)
            continue
        value = body[field]
        if not check(value):
            raise WireError(
                BAD_FIELD, f"{name}.{field}: expected {type_name}, got {_describe(value)}", field, seq, session
            )
        values[field] = float(value) if type_name == "float" else value
    return schema.cls(**values)


@dataclass(frozen=True)
class _Schema:
    cls: type
    names: tuple[str, ...]
    known: frozenset
    fields: tuple  # (name, check, required, type name) per field
    read: typing.Callable  # body -> the message, or None if a field is missing or mistyped
    encode: typing.Callable  # message -> bytes


def _checker(tp):
    """A fast predicate for values of type tp, built once per field."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = [_checker(arg) for arg in typing.get_args(tp)]
        return lambda v: any(check(v) for check in options)
    if origin is list:
        (item,) = typing.get_args(tp)
        if item is int:
            return lambda v: type(v) is list and all(type(x) is int for x in v)
        check_item = _checker(item)
        return lambda v: type(v) is list and all(check_item(x) for x in v)
    if tp is type(None):
        return lambda v: v is None
    if tp is float:
        return lambda v: type(v) is float or type(v) is int
    # int, bool, str, bytes: exact types (a bool is not an int here)
    return lambda v: type(v) is tp


def _schema(cls) -> _Schema:
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in fields(cls))
    checks = tuple(
        (f.name, _checker(hints[f.name]), f.default is MISSING, _type_name(hints[f.name])) for f in fields(cls)
    )
    return _Schema(
        cls, names, frozenset(names) | {"v", "type"}, checks, _reader(cls, checks, hints), _encoder(cls.__name__, names)
    )


_ABSENT = object()


def _check_source(tp, namespace: dict, check) -> str:
    """A Python expression true when ``v`` has type tp (as ``_checker(tp)`` says), inline where
    it is simple: the per-field calls of the checker cost more than the unpacking itself."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return "(" + " or ".join(_check_source(arg, namespace, _checker(arg)) for arg in typing.get_args(tp)) + ")"
    if tp is type(None):
        return "v is None"
    if tp is float:
        return "(type(v) is float or type(v) is int)"
    if origin is list and typing.get_args(tp) == (int,):
        return "(type(v) is list and all([type(x) is int for x in v]))"
    if origin is None and tp in (int, str, bytes, bool):
        return f"type(v) is {tp.__name__}"
    name = f"_check{len(namespace)}"
    namespace[name] = check
    return f"{name}(v)"


def _reader(cls, checks: tuple, hints: dict):
    """decode's fast path for one message type, generated once: each field's presence and type
    checked inline, in order, and the message built from them (an absent optional field: its
    default); None at the first problem (decode then names it)."""
    namespace = {"_ABSENT": _ABSENT, "_cls": cls}
    lines = [f"def read_{cls.__name__}(body):"]
    for i, (field, check, required, type_name) in enumerate(checks):
        lines.append(f"    v = body.get({field!r}, _ABSENT)")
        test = _check_source(hints[field], namespace, check)
        value = "float(v)" if type_name == "float" else "v"
        if required:
            lines += ["    if v is _ABSENT or not " + test + ":", "        return None", f"    v{i} = {value}"]
        else:
            namespace[f"_default{i}"] = cls.__dataclass_fields__[field].default
            lines += [
                "    if v is _ABSENT:",
                f"        v{i} = _default{i}",
                "    elif not " + test + ":",
                "        return None",
                "    else:",
                f"        v{i} = {value}",
            ]
    lines.append("    return _cls(" + ", ".join(f"v{i}" for i in range(len(checks))) + ")")
    exec("\n".join(lines), namespace)  # noqa: S102 -- our own schema's source, no input in it
    return namespace[f"read_{cls.__name__}"]


def _encoder(name: str, names: tuple[str, ...]):
    """encode for one message type, generated once: the map as one literal (the same keys in the
    same order as a loop over the fields would give; right after a model pass every step of
    Python costs several times its usual time, so fewer is faster)."""
    namespace = {"_packb": msgpack.packb}
    items = ", ".join([f'"v": {VERSION}', f'"type": {name!r}'] + [f"{n!r}: m.{n}" for n in names])
    exec(f"def encode_{name}(m):\n    return _packb({{{items}}}, use_bin_type=True)", namespace)  # noqa: S102
    return namespace[f"encode_{name}"]


def _refuse_ext(code: int, _data: bytes):
    raise WireError(MALFORMED, f"msgpack extension type {code}: extension types are refused")


def _int_or_none(value) -> int | None:
    return value if type(value) is int else None


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


_SCHEMAS = {name: _schema(cls) for name, cls in MESSAGES.items()}
