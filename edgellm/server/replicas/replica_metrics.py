"""One /metrics page from several servers' pages (Prometheus text format): each page's samples may gain a
label (`replica` for Ray Serve's replicas; none for the multi-model router, whose model servers label
theirs with `model_name`), and each metric family keeps one HELP/TYPE header with all pages' samples under
it (the format wants a family's lines together). Parsed and written by prometheus-client, so label values
with quotes, braces or spaces survive."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def families_page(families: Iterable[Metric]) -> str:
    """Metric families as a Prometheus text page."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()


def merge_pages(pages: Mapping[str, str], label: str | None = None) -> str:
    """pages: a page's key -> its /metrics text. With `label`, every sample gains `label="<key>"`."""
    families: dict[str, Metric] = {}
    for key, text in pages.items():
        for fam in text_string_to_metric_families(text):
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                labels = {**s.labels, label: key} if label is not None else s.labels
                merged.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
    return families_page(families.values()) if families else ""


def label_replicas(pages: Mapping[str, str]) -> str:
    """pages: replica id -> that replica's /metrics text. Returns the merged text."""
    return merge_pages(pages, "replica")
