"""Reading engine metrics: the samples of one scrape, and the TPOT rate between scrapes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from backends._prom_scan import samples_named
from backends._prom_scan import whole_text_samples as whole_text_samples  # public: the bench times the scan


def selected_metrics(metrics_url: str, names: Iterable[str]) -> tuple[str, list[tuple[str, str]]]:
    """URL and query that ask an engine for only the samples called `names`: Prometheus' own `name[]`
    selection, which prometheus-client's exposition app honours. vLLM mounts that app at `/metrics/`
    (trailing slash); its bare `/metrics` route ignores the selection and writes all ~50 KB."""
    return metrics_url.rstrip("/") + "/", [("name[]", name) for name in names]


@dataclass(frozen=True, slots=True)
class MetricSamples:
    """Samples of one scrape, grouped by sample name (`x_total`, `x_sum`, `x_bucket`, ...)."""

    by_name: dict[str, list[tuple[dict[str, str], float]]]

    @classmethod
    def parse(cls, text: str, names: tuple[str, ...] | None = None) -> MetricSamples:
        """Parse Prometheus text exposition format. Raises ValueError on malformed text.

        With `names`, only the samples so called are read (`backends._prom_scan`: the lines those names
        start, found by string search, with prometheus-client's numbers): a hundred engines are read
        hundreds of times a second, and prometheus-client's parser spends ~0.3 ms on vLLM's few selected
        samples and ~7 ms on its whole /metrics. Without, prometheus-client parses everything.
        """
        if names is None:
            return cls(whole_text_samples(text))
        return cls(samples_named(text, names))

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of the samples called `name` whose labels include `labels` (vLLM: sum over `engine`).

        None when no such sample exists, so callers can tell "0" from "not exposed".
        """
        matched = self._values(name, labels)
        return sum(matched) if matched else None

    def labels(self, name: str) -> list[dict[str, str]]:
        """The label sets of the samples called `name` (info gauges carry their facts as labels)."""
        return [sample_labels for sample_labels, _ in self.by_name.get(name, [])]

    def has(self, name: str) -> bool:
        """Whether the scrape contains a sample called `name`."""
        return name in self.by_name

    def maximum(self, name: str, **labels: str) -> float | None:
        """Largest matching sample (for ratios such as KV-cache usage, which must not be summed)."""
        matched = self._values(name, labels)
        return max(matched) if matched else None

    def _values(self, name: str, labels: dict[str, str]) -> list[float]:
        """The values of the samples called `name` whose labels include `labels`, in text order (a subset
        test of the items views: done in C, a scrape reads five or six such sums)."""
        wanted = labels.items()
        return [value for sample_labels, value in self.by_name.get(name, ()) if wanted <= sample_labels.items()]


class RateTracker:
    """delta(sum) / delta(count) of a cumulative histogram or counter pair between two scrapes.

    The current time per output token is the mean over the last interval, not since the engine started.
    A counter that went backwards (engine restarted) resets the baseline.
    """

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None
        self.value: float | None = None

    def update(self, total: float | None, count: float | None) -> float | None:
        if total is None or count is None:
            self._last = None
            self.value = None
            return None
        last, self._last = self._last, (total, count)
        if last is None or count <= last[1] or total < last[0]:
            # no baseline, an engine restart, or no new observations (an idle engine is not slow)
            self.value = None
        else:
            self.value = (total - last[0]) / (count - last[1])
        return self.value
