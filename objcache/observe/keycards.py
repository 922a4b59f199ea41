"""Key cards: what a torch cache key was made of, kept so a miss can be explained.

torch builds each FX graph key from named components and hands them to its own lookup as
``debug_lines`` (``FxGraphCache.load_with_key(key, debug_lines, ...)``), one
``[hash] name: value`` string per component: the graph, each example input's metadata, the
fx kwargs, every inductor config flag, the torch version, system info, ... A *card* keeps,
per key, each component's name and hash, and a short redacted value for the components a
person can read (config flags, versions, device, input shapes/dtypes/strides), plus the
environment fingerprint's fields as components ``env:<field>``. It never keeps the graph's
code, a path under a home directory or a value that looks like a secret
(docs/architecture.md, "Key cards").

Writers store a card beside each entry they publish; readers keep the cards of lookups that
missed everywhere; ``objcache explain`` (:mod:`objcache.cli.explain`) diffs the two. Cards read
back from a store are hostile input: :func:`parse` is strict and bounded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("objcache.torch")

FORMAT = 1
#: Kinds of card objects in a store: one per torch cache a card describes.
CARD_KIND = {"fx-graph": "fx-card", "aot-autograd": "aot-card"}
#: Kind of the per-run object holding a run's missed cards.
MISSES_KIND = "miss-cards"
#: Environment-independent namespace holding every writer's cards and every run's misses,
#: so a machine in one environment finds the cards written in another
#: (docs/architecture.md, "Key cards").
CARDS_ENV = "keycards"
#: Largest card accepted (bytes of JSON once decoded).
MAX_CARD_BYTES = 128 << 10
#: Most cards one run records; the rest are counted.
MAX_RUN_CARDS = 64
#: Largest per-run misses object (JSON once decoded).
MAX_MISSES_BYTES = MAX_RUN_CARDS * MAX_CARD_BYTES
#: Most components accepted in one card (torch 2.13 has about 650).
MAX_COMPONENTS = 4096
MAX_NAME = 200
MAX_VALUE = 120
MAX_KEY = 256
#: Characters of torch's base32 component hash kept (65 bits: only ever compared).
HASH_CHARS = 13
#: The graph component: "the same model code traced the same way".
GRAPH = "gm"
ENV_PREFIX = "env:"

_LINE = re.compile(r"\[([a-z0-9]{1,64})\] ([^:\n]{1,400}?): ?(.*)", re.DOTALL)
_BRACKET = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\[([^\]]*)\]$")
_HASH = re.compile(r"[a-z0-9]{1,64}")
_NAME_OK = re.compile(r"[A-Za-z0-9_.:\[\]\-]{1,200}")
#: Components whose values a person can read (matched on the name's head).
_READABLE_HEADS = (
    "inductor_config.",
    "inductor_config_comms.",
    "fx_kwargs.",
    "aot_config.",
    "example_inputs",
    "deterministic_algorithms_settings",
    "cuda_matmul_settings",
    "default_dtype",
    "cpp_runtime_thread_count",
    "provenance_tracking_level",
    "system_info.",
    "precompile_enabled",
    "cache_key_tag",
    "inputs_to_check",
    ENV_PREFIX,
)
#: Value shapes that are never kept: the graph's code, paths under a home, secrets.
HOME_PATH = re.compile(r"(/home/|/Users/|/root\b|~/|[A-Za-z]:\\Users\\)")
#: A component name is secret-looking when one of its words is, or contains, one of these
#: (``inductor_config.api_key``, ``cache_key_tag``, ``some_token``, ``db_password``).
_SECRETISH_WORD = re.compile(r"key|token|passw|secret|credential|auth", re.I)
_SECRETISH_VALUE = re.compile(r"[A-Za-z0-9+/_=\-]{32,}")
#: ``scheme://user:password@`` (or ``://:password@``, ``://token@``) inside a value.
URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s]*@")
#: An absolute path of at least two components (a home, a workspace, a mount), wherever it
#: sits in the value; a URL's own path (after its host) is not one.
_ABS_PATH = re.compile(r"(?<![:/.])/(?:[\w.\-~]+/)+[\w.\-~]*")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S*")
OBJECT_ADDRESS = re.compile(r" at 0x[0-9a-f]+")
_TENSOR = re.compile(
    r"TensorMetadata\(dtype=torch\.(\w+), shape=torch\.Size\(\[([^\]]*)\]\), "
    r"stride=\(([^)]*)\), device=device\(type='(\w+)'(?:, index=(\d+))?\)"
)


class CardError(ValueError):
    """Bytes that are not a valid key card."""


@dataclass(frozen=True)
class Card:
    """One key: ``components`` maps a component's name to (hash, readable value or None)."""

    kind: str
    key: str
    components: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)

    @property
    def graph(self) -> str | None:
        entry = self.components.get(GRAPH)
        return entry[0] if entry else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": self.kind,
            "key": self.key,
            "c": [[n, h, v] for n, (h, v) in self.components.items()],
        }

    def encode(self) -> bytes:
        return json.dumps(self.as_dict(), separators=(",", ":")).encode()

    def digest(self) -> str:
        """Content address of the card (names one card object among a graph's)."""
        return hashlib.blake2b(self.encode(), digest_size=16).hexdigest()


# --- capture -------------------------------------------------------------------------------


def component_name(raw: str) -> str:
    """torch's ``inductor_config[max_autotune]`` as ``inductor_config.max_autotune``; list
    items keep their index (``example_inputs[0]``)."""
    raw = raw.strip()
    match = _BRACKET.match(raw)
    if match and not match.group(2).isdigit():
        return f"{match.group(1)}.{match.group(2)}"
    return raw


def readable(name: str) -> bool:
    return name.startswith(_READABLE_HEADS) or name in ("torch_version",)


def redact(name: str, value: str) -> str | None:
    """The short value kept for ``name``, or None when none is (code, secrets, paths)."""
    if not readable(name):
        return None
    if name == "torch_version" and not value.isprintable():
        return None  # torch hashes its source here: bytes, not a version
    value = OBJECT_ADDRESS.sub("", value).strip()
    tensor = _TENSOR.search(value)
    if tensor:
        dtype, shape, stride, device, index = tensor.groups()
        dev = f"{device}:{index}" if index else device
        value = f"{dtype} shape [{shape}] stride ({stride}) {dev}"
    if not value.isprintable():
        return "<binary>"
    if any(_SECRETISH_WORD.search(word) for word in re.split(r"[^A-Za-z0-9]+", name)):
        return "<redacted>"  # before anything else: a secret's head is never kept
    value = URL_USERINFO.sub(r"\1<redacted>@", value)
    if HOME_PATH.search(value):
        return "<redacted path>"
    value = cut_paths(value)
    if re.fullmatch(r"[0-9a-f]{32,}", value):
        return value[:12] + "…"  # a hash torch shows: its head is enough to compare
    if _SECRETISH_VALUE.search(value):
        return "<redacted>"
    if len(value) > MAX_VALUE:
        value = value[: MAX_VALUE - 1] + "…"
    return value


def cut_paths(value: str) -> str:
    """Every absolute path outside the URLs in ``value`` as ``<path>``."""
    out, pos = [], 0
    for url in _URL.finditer(value):
        out += [_ABS_PATH.sub("<path>", value[pos : url.start()]), url.group()]
        pos = url.end()
    return "".join([*out, _ABS_PATH.sub("<path>", value[pos:])])


def env_hash(value: str) -> str:
    return hashlib.blake2b(value.encode(), digest_size=8).hexdigest()[:HASH_CHARS]


def from_debug_lines(
    kind: str, key: str, debug_lines: Iterable[Any], env: Mapping[str, str] | None = None
) -> Card:
    """The card of ``key`` from torch's own ``debug_lines`` (one ``[hash] name: value`` per
    component) and this process's environment fields. Lines that do not parse are skipped."""
    components: dict[str, tuple[str, str | None]] = {}
    for line in debug_lines:
        if not isinstance(line, str):
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        digest, raw_name, value = match.groups()
        name = component_name(raw_name)
        if not _NAME_OK.fullmatch(name) or name in components:
            continue
        components[name] = (digest[:HASH_CHARS], redact(name, value))
        if len(components) >= MAX_COMPONENTS - 64:
            break
    for fname, fvalue in sorted((env or {}).items()):
        name = f"{ENV_PREFIX}{fname}"
        if _NAME_OK.fullmatch(name):
            components[name] = (env_hash(str(fvalue)), redact(name, str(fvalue)))
    return Card(kind, key[:MAX_KEY], components)


# --- strict parsing ------------------------------------------------------------------------


def _short(value: Any, limit: int, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise CardError(f"{what}: not a short string")
    return value


def from_dict(body: Any) -> Card:
    """A validated card from decoded JSON, or :class:`CardError`."""
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CardError(f"not a key card of format {FORMAT}")
    kind = _short(body.get("kind"), 32, "kind")
    if kind not in CARD_KIND:
        raise CardError("kind: not a carded kind")
    key = _short(body.get("key"), MAX_KEY, "key")
    if not key.isprintable():
        raise CardError("key: not printable")
    rows = body.get("c")
    if not isinstance(rows, list) or len(rows) > MAX_COMPONENTS:
        raise CardError(f"components: not a list of at most {MAX_COMPONENTS}")
    components: dict[str, tuple[str, str | None]] = {}
    for row in rows:
        if not isinstance(row, list) or len(row) != 3:
            raise CardError("component: not [name, hash, value]")
        name, digest, value = row
        if not isinstance(name, str) or not _NAME_OK.fullmatch(name) or name in components:
            raise CardError("component name: bad or repeated")
        if not isinstance(digest, str) or not _HASH.fullmatch(digest):
            raise CardError("component hash: bad")
        if value is not None and (not isinstance(value, str) or len(value) > MAX_VALUE):
            raise CardError("component value: not a short string")
        components[name] = (digest, value)
    return Card(kind, key, components)


def _loads(data: bytes, limit: int) -> Any:
    if len(data) > limit:
        raise CardError(f"{len(data)} bytes, more than {limit}")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise CardError("not JSON") from None


def parse(data: bytes) -> Card:
    """A validated card from its stored bytes (decoded by the codec), or :class:`CardError`."""
    return from_dict(_loads(data, MAX_CARD_BYTES))


# --- a run's misses --------------------------------------------------------------------------


def encode_misses(job: str, run: str, host: str, cards: list[Card], dropped: int) -> bytes:
    """The object holding a run's missed cards (at most :data:`MAX_RUN_CARDS`)."""
    body = {
        "format": FORMAT,
        "job": job,
        "run": run,
        "host": host,
        "dropped": dropped,
        "cards": [c.as_dict() for c in cards[:MAX_RUN_CARDS]],
    }
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass
class Misses:
    job: str
    run: str
    host: str
    dropped: int
    cards: list[Card]
    #: cards of the object that did not validate
    invalid: int = 0


def parse_misses(data: bytes) -> Misses:
    """A run's misses; one invalid card inside is skipped and counted, not fatal."""
    body = _loads(data, MAX_MISSES_BYTES)
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CardError(f"not a misses object of format {FORMAT}")
    job = _short(body.get("job"), 512, "job")
    run = _short(body.get("run"), 512, "run")
    host = _short(body.get("host"), 512, "host")
    dropped = body.get("dropped")
    if not isinstance(dropped, int) or isinstance(dropped, bool) or not 0 <= dropped <= 10**12:
        raise CardError("dropped: not a count")
    raw = body.get("cards")
    if not isinstance(raw, list) or len(raw) > MAX_RUN_CARDS:
        raise CardError(f"cards: not a list of at most {MAX_RUN_CARDS}")
    misses = Misses(job, run, host, dropped, [])
    for item in raw:
        try:
            misses.cards.append(from_dict(item))
        except CardError:
            misses.invalid += 1
    return misses


# --- diff ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One component that differs: its value in the written card and in the missed one."""

    name: str
    written: tuple[str, str | None] | None
    missed: tuple[str, str | None] | None

    def describe(self) -> str:
        """``inductor_config.max_autotune: False → True``, ``env: cpu_isa avx512 → avx2``,
        ``example_inputs[0]: shape [4, 8] → [6, 8]``; code shows its hashes only."""
        before = _side(self.written)
        after = _side(self.missed)
        label = f"{self.name}:"
        if self.name.startswith(ENV_PREFIX):
            label = f"env: {self.name[len(ENV_PREFIX) :]}"
        if self.name.startswith("example_inputs") and self.written and self.missed:
            before, after = _tensor_delta(self.written[1], self.missed[1], before, after)
        return f"{label} {before} → {after}"


def _side(entry: tuple[str, str | None] | None) -> str:
    if entry is None:
        return "(absent)"
    digest, value = entry
    return value if value is not None else f"<hash {digest}>"


def _tensor_delta(a: str | None, b: str | None, before: str, after: str) -> tuple[str, str]:
    """Only the parts of two tensor descriptions that differ (``shape [4, 8] → [6, 8]``)."""
    parse_a, parse_b = _tensor_parts(a), _tensor_parts(b)
    if parse_a is None or parse_b is None:
        return before, after
    changed = [k for k in parse_a if parse_a[k] != parse_b.get(k)]
    # a contiguous tensor's strides follow from its shape: name the shape only
    if {"shape", "stride"} <= set(changed) and _contiguous(parse_a) and _contiguous(parse_b):
        changed.remove("stride")
    if not changed:
        return before, after
    left = " ".join(f"{k} {parse_a[k]}" for k in changed)
    right = (
        " ".join(parse_b[k] for k in changed)
        if len(changed) == 1
        else " ".join(f"{k} {parse_b[k]}" for k in changed)
    )
    return left, right


def _contiguous(parts: dict[str, str]) -> bool:
    try:
        shape = [int(x) for x in parts["shape"].strip("[]").split(",") if x.strip()]
        stride = [int(x) for x in parts["stride"].strip("()").split(",") if x.strip()]
    except ValueError:
        return False
    expected, step = [], 1
    for size in reversed(shape):
        expected.append(step)
        step *= max(size, 1)
    return stride == expected[::-1]


def _tensor_parts(value: str | None) -> dict[str, str] | None:
    if value is None:
        return None
    match = re.fullmatch(r"(\w+) shape (\[[^\]]*\]) stride (\([^)]*\)) (\S+)", value)
    if match is None:
        return None
    dtype, shape, stride, device = match.groups()
    return {"dtype": dtype, "shape": shape, "stride": stride, "device": device}


def diff(written: Card, missed: Card) -> list[Difference]:
    """Every component whose hash differs (or that one side lacks), in the missed card's
    order, then the written card's extras."""
    out: list[Difference] = []
    for name, entry in missed.components.items():
        other = written.components.get(name)
        if other is None or other[0] != entry[0]:
            out.append(Difference(name, other, entry))
    for name, entry in written.components.items():
        if name not in missed.components:
            out.append(Difference(name, entry, None))
    return out


def equal_components(a: Card, b: Card) -> int:
    return sum(1 for n, e in a.components.items() if (o := b.components.get(n)) and o[0] == e[0])


# --- written cards -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """A card as a writer stored it, with who wrote it."""

    card: Card
    job: str
    run: str
    host: str


def encode_written(card: Card, job: str, run: str, host: str) -> bytes:
    body = {"format": FORMAT, "job": job, "run": run, "host": host, "card": card.as_dict()}
    return json.dumps(body, separators=(",", ":")).encode()


def parse_written(data: bytes) -> Written:
    """A stored card with its writer, validated, or :class:`CardError`."""
    body = _loads(data, MAX_CARD_BYTES)
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise CardError(f"not a stored key card of format {FORMAT}")
    return Written(
        from_dict(body.get("card")),
        _short(body.get("job"), 512, "job"),
        _short(body.get("run"), 512, "run"),
        _short(body.get("host"), 512, "host"),
    )


def written_key(card: Card, run: str) -> tuple[str, str]:
    """``(graph, digest)``: a stored card lives in its graph's folder
    (``v1/keycards/<kind>/<shard>/<graph>!/<digest>``), one object per card and writing run."""
    graph = card.graph or "nograph"
    digest = hashlib.blake2b(card.encode() + run.encode(), digest_size=16).hexdigest()
    return graph, digest


# --- this process: cards of misses and of published entries -----------------------------------

#: Cards of lookups that missed, waiting for the put of their entry (kind, key) -> card.
_pending: OrderedDict[tuple[str, str], Card] = OrderedDict()
_MAX_PENDING = 256
#: Cards of this run's lookups that missed everywhere (at most MAX_RUN_CARDS), and the rest.
_missed: list[Card] = []
_dropped = [0]
_state_lock = threading.Lock()
#: ``captured:<kind>``, ``missed:<kind>``, ``stored:<kind>``, ``too_large``, ``errors:<where>``.
counters: Counter[str] = Counter()


#: Reads ``OBJCACHE_KEY_CARDS`` of the process-wide client: handed in by the client layer
#: (:func:`configure`), as observe never calls up into the client (docs/architecture.md,
#: "Layers"). Until then, no cards are kept.
_switch: list[Callable[[], bool]] = [lambda: False]


def configure(switch: Callable[[], bool]) -> None:
    """Ask ``switch`` from now on whether the process-wide client keeps cards."""
    _switch[0] = switch


def enabled() -> bool:
    """Whether the process-wide client keeps cards (``OBJCACHE_KEY_CARDS``)."""
    try:
        return bool(_switch[0]())
    except Exception as exc:
        failed("config", exc)
        return False


def record_miss(card: Card) -> None:
    """A lookup of ``card.key`` missed everywhere: keep its card for the run and for the put
    of the entry this process is about to compile."""
    with _state_lock:
        counters[f"missed:{card.kind}"] += 1
        _pending[(card.kind, card.key)] = card
        while len(_pending) > _MAX_PENDING:
            _pending.popitem(last=False)
        if any(c.key == card.key and c.kind == card.kind for c in _missed):
            return
        if len(_missed) < MAX_RUN_CARDS:
            _missed.append(card)
        else:
            _dropped[0] += 1


def take_pending(kind: str, key: str) -> Card | None:
    with _state_lock:
        return _pending.pop((kind, key), None)


def missed() -> tuple[list[Card], int]:
    with _state_lock:
        return list(_missed), _dropped[0]


def reset() -> None:
    """Forget this process's cards (tests, and a forked child)."""
    with _state_lock:
        _pending.clear()
        _missed.clear()
        _dropped[0] = 0
        counters.clear()


if hasattr(os, "register_at_fork"):  # a forked child's run has missed nothing yet
    os.register_at_fork(after_in_child=reset)


def host() -> str:
    try:
        return socket.gethostname() or "unknown"
    except Exception:
        return "unknown"


def failed(where: str, exc: BaseException) -> None:
    counters[f"errors:{where}"] += 1
    if counters[f"errors:{where}"] == 1:
        log.warning("objcache: key card %s failed; the compile goes on without it: %r", where, exc)


def misses_object(job: str, run: str) -> tuple[str, bytes] | None:
    """This run's missed cards as ``(object key, payload)``, written at exit beside its
    summary (by the caller: to the remote tiers, or to the summaries location), or None
    when no lookup missed."""
    cards, dropped = missed()
    if not cards:
        return None
    from objcache.entry.layout import Namespace

    payload = encode_misses(job, run, host(), cards, dropped)
    return Namespace(CARDS_ENV).object_key(MISSES_KIND, f"{job}/{run}"), payload
