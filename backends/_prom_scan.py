"""The samples of a few named series in Prometheus text, with prometheus-client's numbers: what the
adapters read from every engine at every scrape.

Why: a hundred engines read every 0.2 s are 500 scrapes a second, and prometheus-client's parser builds
each sample label by label, character by character: about 0.2 ms for the few samples vLLM selects (most
of it its 40-label `vllm:cache_config_info`), 0.3 ms for the adapter's lines of its whole 55 KB /metrics.
An adapter reads four to eight series. Here one regular-expression pass finds the lines those names start,
only those are parsed, and the label sets (the same at every scrape) are read once: 15-25x less CPU
(bench/tools/scrape_scale/).

The numbers are prometheus-client's on every text it accepts: a line in the usual form
`name{label="value",...} value [timestamp]` is read here under the same rules (escapes, NaN/Inf, integers
through int()); any other line naming a wanted series (spaces before `{`, exemplars, a name given inside the
braces) is handed to prometheus-client's parser alone; and a text with a TYPE comment that declares a
counter whose family may hold a wanted name is parsed whole by it, since it renames every sample of such a
family to `<sample name>_total`. Lines of other series are not read, so a malformed one there goes unnoticed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]

_NUMBER = r"[0-9a-zA-Z.+-]+"  # what float() reads; anything else goes to prometheus-client
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")  # a metric name as the usual form writes it
# after the name: {labels} value [timestamp], single spaces, to the line's end (whitespace aside): the form every
# engine writes (the labels checked apart)
_USUAL = rf"(?:\{{(?P<labels>[^\n]*)\}})? (?P<value>{_NUMBER})(?: (?P<stamp>{_NUMBER}))?[^\S\n]*(?=\n|\Z)"
_LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*(?:\\.[^"\\]*)*)"'
_LABELS = re.compile(rf"(?:{_LABEL}(?:,{_LABEL})*,?)?", re.DOTALL)  # label="value",... (a trailing comma)
_LABEL_PAIR = re.compile(_LABEL, re.DOTALL)
_ESCAPE = re.compile(r'\\[\\n"]')  # prometheus-client's own: other backslashes stay as they are
_ESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_CACHED_LABELS_LENGTH = 4096  # at most 1024 label sets this long are kept: 4 MB


def samples_named(text: str, names: Iterable[str]) -> Samples:
    """The samples called `names` in `text`, grouped by name in text order: each a (labels, value) pair,
    exactly as prometheus-client's parser of the whole text gives them. Names without samples are absent.
    Raises ValueError where a wanted line is malformed."""
    wanted = tuple(dict.fromkeys(names))
    finder = _finder(wanted)
    found: Samples = {}
    for match in finder.lines(text):
        name, labels_text, value, stamp = match.group("name", "labels", "value", "stamp")
        if value is not None and name in finder.plain:  # the usual form, taken apart by the finder itself
            labels = _labels(labels_text) if labels_text else {}
            if labels is not None:
                number = _number(value)
                if stamp is not None:
                    _number(stamp)  # a timestamp: checked, as prometheus-client does, not kept
                found.setdefault(name, []).append((dict(labels), number))
                continue
        line = match.group(0).strip()
        if name is None and line.startswith("#"):  # a counter TYPE: prometheus-client renames its family
            return whole_text_samples(text, wanted)
        for sample_name, sample in _parsed_alone(line, wanted):  # prometheus-client reads any other line
            found.setdefault(sample_name, []).append(sample)
    return found


def whole_text_samples(text: str, names: Iterable[str] | None = None) -> Samples:
    """prometheus-client's parse of the whole text, grouped by sample name (only `names`, when given)."""
    keep = None if names is None else set(names)
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if keep is None or sample.name in keep:
                found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return found


class _Finder:
    """One regular expression that finds, in one pass, the lines that matter for `names`: those a wanted
    name starts, those that start with `{` (a name given as a label), and TYPE comments that declare a
    counter of a family that may hold a wanted name (`_families`). Lines split at `\n` only, as
    prometheus-client reads them. The pattern starts with a newline, which the regex engine looks for at
    memchr speed: `str.find` per name, or a `^` in multiline mode, costs several times more on a 50 KB text.

    A line of a wanted name in the usual form (`_USUAL`) comes out taken apart: its labels, value and
    timestamp as groups, so it costs no second match. `plain`: the wanted names that are metric names as
    the usual form writes them (`_NAME`); a line of any other, or in any other form, comes out whole."""

    def __init__(self, names: tuple[str, ...]) -> None:
        alternatives = "|".join(re.escape(name) for name in names)
        families = sorted({family for name in names for family in _families(name)})
        stems = "|".join(re.escape(family) for family in families)
        self.plain = frozenset(name for name in names if _NAME.fullmatch(name))
        line = (
            rf"[^\S\n]*(?:(?P<name>{alternatives})(?![a-zA-Z0-9_:])(?:{_USUAL}|[^\n]*)|\{{[^\n]*"
            rf'|#[^\S\n]*TYPE[^\S\n]+"?(?:{stems})"?[^\S\n]+counter[^\n]*)'
        )
        self._first = re.compile(line)
        self._rest = re.compile(r"\n" + line)

    def lines(self, text: str) -> Iterator[re.Match[str]]:
        first = self._first.match(text)
        if first is not None:
            yield first
        yield from self._rest.finditer(text)


def _families(name: str) -> set[str]:
    """The families whose `# TYPE <family> counter` makes prometheus-client rename a sample to or from `name`.

    A family holds the samples its type allows (`f`; a histogram's `f_bucket`, `f_sum`, `f_count`; a
    summary's `f`, `f_sum`, `f_count`), also those taken in under an earlier TYPE of the same name; a counter
    family not itself called `..._total` has every one renamed to `<sample name>_total`."""
    samples = {name, name[:-6]} if name.endswith("_total") else {name}
    families = set(samples)
    for sample in samples:
        for suffix in ("_bucket", "_sum", "_count"):
            if sample.endswith(suffix):
                families.add(sample.removesuffix(suffix))
    return {family for family in families if family and not family.endswith("_total")}


@functools.lru_cache(maxsize=64)
def _finder(names: tuple[str, ...]) -> _Finder:
    return _Finder(names)


def _labels(text: str) -> dict[str, str] | None:
    """The labels between a sample's braces; None when they are not plainly `label="value",...` (then
    prometheus-client reads the line). Callers copy the dict. Cached: an engine writes the same label sets
    at every scrape, and vLLM's `cache_config_info` alone has 40 (an odd engine's long ones are not kept)."""
    return _cached_labels(text) if len(text) <= _CACHED_LABELS_LENGTH else _read_labels(text)


def _read_labels(text: str) -> dict[str, str] | None:
    if _LABELS.fullmatch(text) is None:
        return None
    labels: dict[str, str] = {}
    pairs = _LABEL_PAIR.findall(text)
    for label, value in pairs:
        if label.startswith("__"):  # reserved, or the name given twice: prometheus-client's call
            return None
        labels[label] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
    if len(labels) != len(pairs):
        return None  # a label given twice: prometheus-client's error
    return labels


_cached_labels = functools.lru_cache(maxsize=1024)(_read_labels)


def _parsed_alone(line: str, wanted: tuple[str, ...]) -> list[tuple[str, tuple[dict[str, str], float]]]:
    return [
        (sample_name, sample) for sample_name, samples in whole_text_samples(line, wanted).items() for sample in samples
    ]


def _unescape(match: re.Match[str]) -> str:
    return _ESCAPED[match.group(0)]


def _number(token: str) -> float:
    """A sample value as prometheus-client reads it: int() first (so "-0" is 0.0), else float()."""
    if token.lstrip("+-").isdigit():
        try:
            integer = int(token)
        except ValueError:  # "+-1", or more digits than int() reads from text
            return float(token)
        try:
            return float(integer)
        except OverflowError as exc:
            raise ValueError(f"sample value {token[:40]}... is too large") from exc
    return float(token)
