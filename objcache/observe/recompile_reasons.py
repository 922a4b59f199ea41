"""Recompile reasons as the fleet may read them (docs/security.md, "Recompile reasons").

torch records, per recompile, the guard that failed (``recompile_reason``): the compile id,
then either the source of a check Dynamo built (``len(L['past_key_values']) == 2``,
``___check_obj_id(L['self'].fn, 140...)``, ``L['cfg']['db']['pw'] == 'hunter2-prod'``;
torch 2.13 writes ``L['x']`` as ``x`` and adds the user's source line as a comment and a
user stack trace on the lines after) or a sentence of its own (``tensor 'x' size mismatch
at index 0. expected 2, actual 3``). Run summaries keep these, so the structure of a guard
is kept and only literal values that may be secrets are hidden, each as ``<redacted>``:

* a literal (string or number) compared with a source path naming something secret-looking
  (a name along the path containing passw, secret, token, key, credential, auth, cookie or
  session, or the word pw, pwd, cred or creds), unless the compared side is structural
  (``len()``, a type or id check, sizes, strides, dtype, device): ``L['cfg']['db']['pw'] ==
  <redacted>``, while ``len(L['past_key_values']) == 2`` is kept;
* a string literal that looks like a credential by itself (``AKIA...``, ``ghp_...``,
  ``Bearer ...``, a JWT, a private key, a long high-entropy token), wherever it is;
* inside the string literals kept, URL credentials (``scheme://<redacted>@``) and absolute
  paths (``<path>``).

``None``, ``True`` and ``False`` are kept (``L['past_key_values'] is None``). The user's
source line (which can quote anything) and the stack trace are dropped; the guard's place
(``model.py:6 in forward``) is kept. Memory addresses are cut.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from objcache.observe.keycards import HOME_PATH, OBJECT_ADDRESS, URL_USERINFO, cut_paths

HIDDEN = "<redacted>"
#: Characters of a reason kept.
MAX_REASON = 300

#: A Python string literal (as ``repr`` writes it), not one inside a word (``doesn't``).
_LITERAL = re.compile(r"""(?<![\w'"])[bB]?(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?!\w)")
_OP_BEFORE = re.compile(r"(?:==|!=|<=|>=|<|>|\bis not|\bis|\bnot in|\bin)\s*$")
_OP_AFTER = re.compile(r"^\s*(?:==|!=|<=|>=|<|>|is not\b|is\b|not in\b|in\b)")
#: A compared side that is the structure of a value, not the value.
_STRUCTURAL = re.compile(
    r"^(?:len|type|id|hasattr|isinstance|callable|___\w+)\("
    r"|\.(?:size|stride|shape|dtype|device|storage_offset|ndim|dim|numel|layout)\b"
)
_SECRET_PART = re.compile(r"passw|secret|token|key|credential|auth|cookie|session", re.I)
_SECRET_WORDS = frozenset({"pw", "pwd", "cred", "creds"})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_CREDENTIAL = re.compile(
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_\w{20,}"
    r"|\bxox[abposr]-[\w-]{10,}|\bsk-[\w-]{20,}|\beyJ[\w-]{8,}\.[\w-]{8,}|-----BEGIN"
    r"|(?i:\b(?:bearer|basic|token)\s+[\w.~+/=-]{8,})"
)
_WORDISH = re.compile(r"[A-Z]?[a-z]+\d*|[A-Z]{1,6}\d*|\d+[A-Za-z]{0,2}")
_RUN = re.compile(r"[A-Za-z0-9+/=_\-.~]{20,}")
#: Where torch 2.13 says a guard came from, at the end of its comment.
_PLACE = re.compile(r"#\s*([^\s#]+):(\d+) in ([\w.<>]+)\s*$")


def secretish(name: str) -> bool:
    """Whether a name along a source path (a key, an attribute) looks like a secret's."""
    if _SECRET_PART.search(name):
        return True
    return any(w.lower() in _SECRET_WORDS for w in _WORD.findall(name))


def looks_like_credential(value: str) -> bool:
    """A string that is a secret by its looks: a known token format or a long random run."""
    if _CREDENTIAL.search(value):
        return True
    for run in _RUN.findall(value):
        if re.fullmatch(r"[0-9a-fA-F]{20,}", run):
            return True
        if all(_WORDISH.fullmatch(part) for part in re.split(r"[_\-./~]+", run) if part):
            continue  # words and numbers: resnet50_imagenet_v2_final
        if len(run) >= 32:
            return True
        if re.search(r"[A-Za-z]", run) and re.search(r"\d", run) and _entropy(run) >= 3.5:
            return True
    return False


def _entropy(value: str) -> float:
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())


def redact_reason(value: str, limit: int = MAX_REASON) -> str:
    """``value`` (torch's ``recompile_reason``, or a frame's name) as a run may keep it."""
    line = OBJECT_ADDRESS.sub("", value.split("\n", 1)[0]).strip()
    if not line.isprintable():
        return "<binary>"
    literals = list(_LITERAL.finditer(line))
    masked = _mask(line, literals)
    comment = masked.find("#")
    place = ""
    if comment >= 0:
        found = _PLACE.search(line[comment:])
        if found:
            file, lineno, fn = found.groups()
            place = f"  # {file.rsplit('/', 1)[-1]}:{lineno} in {fn}"
        line, masked = line[:comment].rstrip(), masked[:comment].rstrip()
        literals = [m for m in literals if m.end() <= len(line)]
    hide: list[tuple[int, int, str]] = []
    for m in literals:
        text = m.group()
        if looks_like_credential(text[1:-1]) or _compared_with_secret(line, masked, m.span()):
            hide.append((m.start(), m.end(), HIDDEN))
        else:
            hide.append((m.start(), m.end(), _clean_literal(text)))
    for m in _NUMBER.finditer(masked):
        if _compared_with_secret(line, masked, m.span()):
            hide.append((m.start(), m.end(), HIDDEN))
    out, pos = [], 0
    for start, end, text in sorted(hide):
        out += [_clean_code(line[pos:start]), text]
        pos = end
    shown = "".join([*out, _clean_code(line[pos:])]) + place
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _mask(line: str, literals: list[re.Match[str]]) -> str:
    """``line`` with every literal's content as ``_``: brackets and ``#`` in a literal are
    not code."""
    chars = list(line)
    for m in literals:
        start, end = m.start(), m.end()
        body = start + 1 + (line[start] in "bB")
        chars[body : end - 1] = "_" * (end - 1 - body)
    return "".join(chars)


def _clean_literal(text: str) -> str:
    """A kept string literal without URL credentials or paths."""
    quote = 2 if text[0] in "bB" else 1
    body = cut_paths(URL_USERINFO.sub(rf"\1{HIDDEN}@", text[quote:-1]))
    if HOME_PATH.search(body):
        body = "<path>"
    return text[:quote] + body + text[-1]


def _clean_code(text: str) -> str:
    """Code or torch's prose between literals: credential-shaped tokens hidden, paths cut."""
    return cut_paths(_CREDENTIAL.sub(HIDDEN, text))


def _compared_with_secret(line: str, masked: str, span: tuple[int, int]) -> bool:
    """Whether the literal at ``span`` is compared with a non-structural secret-looking side."""
    start, end = span
    start, end = _container(masked, start, end)
    before = _OP_BEFORE.search(masked[:start])
    if before:
        side = _side_before(masked, before.start())
    else:
        after = _OP_AFTER.match(masked[end:])
        if not after:
            return False
        side = _side_after(masked, end + after.end())
    lo, hi = side
    if lo == hi or _STRUCTURAL.search(masked[lo:hi]):
        return False
    names = _IDENT.findall(masked[lo:hi])
    names += [m.group()[1:-1] for m in _LITERAL.finditer(line[lo:hi])]
    return any(secretish(n) for n in names if n not in ("L", "G"))


def _container(masked: str, start: int, end: int) -> tuple[int, int]:
    """The span of the tuple, list or set literal holding ``start:end`` (``L['x'] ==
    ('a', 'b')``), or ``start:end`` itself where it is in none or in a call's arguments."""
    i = _walk(masked, start, -1, atom=False)
    if i == 0 or (i > 1 and (masked[i - 2].isalnum() or masked[i - 2] in "_)]")):
        return start, end  # outside brackets, or a call's argument or a subscript
    closing = _walk(masked, i, 1, atom=False)
    return (i - 1, closing + 1) if closing < len(masked) else (start, end)


def _side_before(masked: str, end: int) -> tuple[int, int]:
    """The operand ending at ``end``: a name with attributes, subscripts and calls."""
    stop = len(masked[:end].rstrip(" "))
    return _walk(masked, stop, -1, atom=True), stop


def _side_after(masked: str, start: int) -> tuple[int, int]:
    """The operand starting at ``start`` (after spaces)."""
    begin = start + len(masked[start:]) - len(masked[start:].lstrip(" "))
    return begin, _walk(masked, begin, 1, atom=True)


def _walk(masked: str, i: int, step: int, atom: bool) -> int:
    """From ``i``, forward (``step`` 1) or back (-1) over balanced brackets, to the first
    unmatched bracket; with ``atom``, also to the first character that is no part of a
    name, an attribute or a number outside brackets."""
    opens, closes = ("([{", ")]}") if step > 0 else (")]}", "([{")
    depth = 0
    while 0 <= i + min(step, 0) < len(masked):
        c = masked[i + min(step, 0)]
        if c in opens:
            depth += 1
        elif c in closes:
            if depth == 0:
                break
            depth -= 1
        elif atom and depth == 0 and not (c.isalnum() or c in "_."):
            break
        i += step
    return i
