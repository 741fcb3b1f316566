"""YAML whose small mappings are single-line JSON: written by :func:`dump`, read fast by
:func:`parse`.

A large plan is thousands of entries. Parsed as YAML, each costs a third of a millisecond
or more even with libyaml (PyYAML builds a Python node per scalar); parsed as JSON, about
fifteen microseconds.
JSON is a subset of YAML, so the writer keeps the outer structure as block YAML and puts
every mapping that holds no list of mappings (a plan entry, a device) on one line as a
JSON object::

    schema: dnnctl-plan/1
    sections:
    - device: {"backend": "numpy", "name": "AMD EPYC", ...}
      kernels_digest: "sha256:..."
      entries:
      - {"op": "conv2d", "key": {"n": 2, ...}, "choice": {...}, ...}

Any YAML reader gets the same values (the writer spells what YAML 1.1 reads differently
from JSON the way both read alike: floats with a dot and a signed exponent, characters
YAML may not hold raw as ``\\uXXXX``). :func:`parse` reads the lines ``- {...}`` with
``json`` and the rest, with each such line replaced by a placeholder, with the strict YAML
loader. It gives exactly what the YAML loader would, or says it cannot
(:data:`NOT_THIS_FORM`) and the caller parses the whole text as YAML: a hand-written or
older file, or one whose ``- {...}`` lines are not all single-line nodes. A line that JSON
does not take (YAML flow syntax, a duplicate or merge key, a spelling JSON and YAML read
differently) is parsed as YAML on its own, with its own line number, so its error or value
is the one the whole file would give.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

NOT_THIS_FORM = object()

# What a YAML 1.1 reader does not take raw in a double-quoted scalar: characters outside
# YAML's printable set (C0 and C1 controls, DEL, surrogates, U+FFFE/U+FFFF) and the line
# breaks it folds (NEL, LS, PS). JSON escapes C0 controls itself.
_YAML_RAW_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
# The same, for a whole file: anything a YAML reader refuses or reads as a line break
_NOT_PLAIN_TEXT = re.compile(
    "[^\x0a\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# A JSON number with an exponent but no '.' (1e-05): YAML 1.1 reads it as text
_BARE_EXPONENT = re.compile(r"([ \[:,-][0-9]+)(?=[eE])")  # on the text after a space
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(\.\d*)?(?:[eE]([-+]?)\d+)?')
# YAML 1.1's float spellings among JSON's (a dot, a signed exponent)
_YAML_FLOAT = re.compile(r"-?\d+\.\d*(?:[eE][-+]\d+)?\Z")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abAB]")
_LONG_KEY = re.compile(r'"(?:[^"\\]|\\.){1000,}"\s*:')  # YAML's simple keys: < 1024 chars
_ITEM_LINE = re.compile(r"^ *- \{", re.M)
_MAX_YAML_LINES = 64  # more '- {' lines than this that JSON cannot read: parse it all as YAML


# ----------------------------------------------------------------------------- writing


def dump(data: Mapping[str, Any], header: str = "") -> str:
    """YAML text of ``data`` in the fast-reading form (see the module doc), keys in the
    caller's order. ValueError for what JSON cannot hold exactly (a non-text key, a float
    that is not finite, a value that is not plain data)."""
    lines: list[str] = []
    _mapping(data, "", "", lines)
    body = "\n".join(lines or ["{}"]) + "\n"
    if _YAML_RAW_UNSAFE.search(body):
        body = _YAML_RAW_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", body)
    return header + body


def _mapping(data: Mapping[str, Any], first: str, indent: str, lines: list[str]) -> None:
    """A block mapping; ``first`` prefixes its first line (a sequence item's '- ')."""
    for i, (k, v) in enumerate(data.items()):
        head = f"{first if i == 0 else indent}{_key(k)}:"
        if not _block(v):
            lines.append(f"{head} {flow(v)}")
        elif isinstance(v, list):
            lines.append(head)
            _sequence(v, indent, lines)
        else:
            lines.append(head)
            _mapping(v, indent + "  ", indent + "  ", lines)


def _sequence(items: list[Any], indent: str, lines: list[str]) -> None:
    for item in items:
        # a plan section (its entries right there) is seen without writing it as JSON;
        # for an entry the JSON, which it needs anyway, says whether to look further
        if isinstance(item, Mapping) and any(
                isinstance(x, list) and x and isinstance(x[0], Mapping) for x in item.values()):
            _mapping(item, indent + "- ", indent + "  ", lines)
            continue
        text = flow(item)
        if isinstance(item, Mapping) and _block(item, text):
            _mapping(item, indent + "- ", indent + "  ", lines)
        else:
            lines.append(f"{indent}- {text}")


def _block(v: Any, text: str | None = None) -> bool:
    """Whether ``v`` (as JSON: ``text``, when known) holds a list of mappings somewhere:
    then it is written in block style; anything else is one line of JSON."""
    if not v or not isinstance(v, (list, Mapping)):
        return False
    if text is not None and "[{" not in text and ", {" not in text:
        return False  # how JSON writes a mapping in a list
    stack = [v]
    while stack:
        node = stack.pop()
        in_list = isinstance(node, list)
        for x in node if in_list else node.values():
            if type(x) in _SCALARS:
                continue
            if isinstance(x, (dict, Mapping)):
                if in_list:
                    return True
                stack.append(x)
            elif isinstance(x, list):
                stack.append(x)
    return False


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _key(k: Any) -> str:
    if not isinstance(k, str):
        raise ValueError(f"mapping key {k!r} is not text")
    if _PLAIN_KEY.match(k) and k.lower() not in _YAML_WORDS:
        return k
    return json.dumps(k, ensure_ascii=False)


def flow(value: Any) -> str:
    """One line of JSON that YAML 1.1 reads as the same value. ValueError when JSON does not
    give ``value`` back exactly (a key that is not text, a tuple, an infinite float)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, default=_refuse)
    except TypeError as exc:  # e.g. a tuple key
        raise ValueError(str(exc)) from None
    if _BARE_EXPONENT.search(" " + text):
        # 1e-05 -> 1.0e-05, which YAML 1.1 reads as a float too; quick and blind to
        # strings, so checked below, and done token by token when a string had such text
        quick = _BARE_EXPONENT.sub(r"\1.0", " " + text)[1:]
        text = quick if json.loads(quick) == value else _JSON_TOKEN.sub(_dotted, text)
    if json.loads(text) != value:  # json.dumps turns 1 / True / None keys into text
        raise ValueError("not plain data with text keys")
    return text


def _refuse(value: Any) -> Any:
    raise ValueError(f"{type(value).__name__} is not plain data")


def _dotted(m: re.Match[str]) -> str:
    token = m.group(0)
    if token[0] == '"' or m.group(2) is None:
        return token  # a string, or a number without an exponent
    mantissa, _, exponent = token.replace("E", "e").partition("e")
    if m.group(1) is None:
        mantissa += ".0"
    return f"{mantissa}e{'' if m.group(2) else '+'}{exponent}"


# ----------------------------------------------------------------------------- reading


class _NotJson(Exception):
    """A line JSON reads, but not as YAML would (a duplicate or merge key)."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs) or "<<" in d:
        raise _NotJson
    return d


def _float(text: str) -> Any:
    if ("e" in text or "E" in text) and not _YAML_FLOAT.match(text):
        return text  # YAML 1.1 reads 1e-05 or 1.5e5 as text, and so do we
    return float(text)


def _loads(text: str) -> Any:
    # NaN / Infinity: YAML reads those words as text
    return json.loads(text, object_pairs_hook=_pairs, parse_float=_float, parse_constant=str)


def parse(text: str, yaml_parse: Callable[[str, int | None], Any]) -> Any:
    """The data of ``text`` if it is in the fast-reading form, else :data:`NOT_THIS_FORM`.

    ``yaml_parse(text, index)`` is the strict YAML parser, its errors naming the line; it
    reads the outer structure (``index`` None) and any line JSON cannot (the line's
    0-based ``index`` in the file). The result is what it would give for the whole text,
    or its error.
    """
    if not _ITEM_LINE.search(text):
        return NOT_THIS_FORM
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if _NOT_PLAIN_TEXT.search(text):  # tabs, controls, other line breaks: YAML decides
        return NOT_THIS_FORM
    split = _Split(text)
    if not split.bodies:
        return NOT_THIS_FORM
    # the outline first: only when every placeholder is a list item are the lines nodes
    # (not, say, lines of a block scalar), and only then is a line's error the file's
    try:
        outline = yaml_parse(split.outline, None)
    except Exception:  # noqa: BLE001 - a placeholder where no node ends: YAML decides
        return NOT_THIS_FORM
    if _count_slots(outline, split.slots) != len(split.slots):
        return NOT_THIS_FORM  # a placeholder inside text, or not at all
    try:
        values = _entries(split.bodies, split.where, yaml_parse)
    except _LineFailed as bad:
        # neither JSON nor YAML reads the line alone: it is broken, or (valid but odd) a
        # node going on over the next lines. Only the whole file can tell; a syntax check
        # of it is quick with libyaml, and the broken line is what the error names
        if _syntax_ok(text):
            return NOT_THIS_FORM
        yaml_parse(bad.body, bad.index)  # raises, naming that line of the file
        return NOT_THIS_FORM
    if values is NOT_THIS_FORM:
        return NOT_THIS_FORM
    _fill(outline, {k: values[a:b] for k, (a, b) in split.slots.items()})
    return outline


class _Split:
    """``text`` as its '- {...}' lines (``bodies`` from the '{', ``where``: line indexes)
    and the ``outline``: the rest, with a placeholder for each run of such lines (one
    line, so every line keeps its number); ``slots``: placeholder -> its bodies' range."""

    def __init__(self, text: str):
        lines = text.split("\n")
        nonce = os.urandom(8).hex()  # not in the text, so no value of it is a placeholder
        self.bodies: list[str] = []
        self.where: list[int] = []
        starts: list[int] = []
        run_indent = ""
        for i, line in enumerate(lines):
            item = line.lstrip(" ")
            if not item.startswith("- {"):
                continue
            indent = line[: len(line) - len(item)]
            # consecutive '- {' lines of one indent are items of one sequence: one
            # placeholder for the run (the YAML loader then sees a few lines, not thousands)
            if self.where and self.where[-1] == i - 1 and indent == run_indent:
                lines[i] = ""
            else:
                lines[i] = f'{indent}- "{nonce}:{len(starts)}"'
                starts.append(len(self.bodies))
                run_indent = indent
            self.bodies.append(item[2:])
            self.where.append(i)
        self.outline = "\n".join(lines)
        ends = [*starts[1:], len(self.bodies)]
        self.slots = {f"{nonce}:{r}": (a, b) for r, (a, b) in enumerate(zip(starts, ends))}


class _LineFailed(Exception):
    def __init__(self, index: int, body: str):
        super().__init__(index)
        self.index = index
        self.body = body


def _syntax_ok(text: str) -> bool:
    """Whether YAML's parser (events only, no values) gets through ``text``."""
    parser = getattr(yaml, "CSafeLoader", None)  # libyaml's parser (its loader unused)
    if parser is None:
        return True  # the whole-file parse decides, at its own pace
    try:
        for _ in yaml.parse(text, Loader=parser):
            pass
    except yaml.YAMLError:
        return False
    return True


def _entries(bodies: list[str], where: list[int],
             yaml_parse: Callable[[str, int | None], Any]) -> Any:
    """The values of the '- {...}' lines: all at once with JSON, else line by line.
    :class:`_LineFailed` for the first line that neither JSON nor YAML reads alone."""
    joined = "[" + ",\n".join(bodies) + "]"
    odd = _SURROGATE_ESCAPE.search(joined) is not None  # JSON pairs them, YAML does not
    odd = odd or any(len(b) > 1000 and _LONG_KEY.search(b) for b in bodies)
    if not odd:
        try:
            return _loads(joined)
        except (ValueError, _NotJson, RecursionError):
            pass
    values: list[Any] = []
    by_yaml = 0
    for body, i in zip(bodies, where):
        try:
            if odd and (_SURROGATE_ESCAPE.search(body) or (
                    len(body) > 1000 and _LONG_KEY.search(body))):
                raise _NotJson
            values.append(_loads(body))
            continue
        except (ValueError, _NotJson, RecursionError):
            pass
        by_yaml += 1
        if by_yaml > _MAX_YAML_LINES:
            return NOT_THIS_FORM
        try:
            values.append(yaml_parse(body, i))
        except Exception:  # noqa: BLE001 - judged by the caller
            if _is_duplicate_or_merge(body):
                yaml_parse(body, i)  # a whole node: raises, naming this line
            raise _LineFailed(i, body) from None
    return values


def _is_duplicate_or_merge(body: str) -> bool:
    """Whether JSON reads ``body`` but a key repeats (or is '<<'): then the line is a whole
    node, and YAML's error on it is the file's."""
    try:
        json.loads(body)  # the whole line is JSON (the hook fails on a first bad object)
    except (ValueError, RecursionError):
        return False
    try:
        _loads(body)
    except _NotJson:
        return True
    except (ValueError, RecursionError):
        return False
    return False


def _count_slots(node: Any, slots: dict[str, Any]) -> int:
    """How many distinct placeholders are items of some list in ``node``."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            for x in item:
                if isinstance(x, str):
                    if x in slots:
                        found.add(x)
                elif isinstance(x, (list, dict)):
                    stack.append(x)
        elif isinstance(item, dict):
            stack.extend(v for v in item.values() if isinstance(v, (list, dict)))
    return len(found)


def _fill(node: Any, slots: dict[str, list[Any]]) -> int:
    """Splice each placeholder's values into the list that holds it; the count spliced."""
    n = 0
    if isinstance(node, list):
        i = 0
        while i < len(node):
            item = node[i]
            if isinstance(item, str) and item in slots:
                run = slots[item]
                node[i:i + 1] = run
                i += len(run)
                n += 1
                continue
            if isinstance(item, (list, dict)):
                n += _fill(item, slots)
            i += 1
    elif isinstance(node, dict):
        for v in node.values():
            if isinstance(v, (list, dict)):
                n += _fill(v, slots)
    return n
