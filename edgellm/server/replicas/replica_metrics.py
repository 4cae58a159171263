"""One /metrics page from several replicas' pages (Prometheus text format): every sample gains a
`replica` label, and each metric family keeps one HELP/TYPE header with all replicas' samples under it
(the format wants a family's lines together)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class _Family:
    header: list[str] = field(default_factory=list)  # its "# HELP" and "# TYPE" lines
    samples: list[str] = field(default_factory=list)


def _with_label(sample: str, label: str) -> str:
    brace, space = sample.find("{"), sample.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        close = sample.index("}", brace)
        inner = sample[brace + 1 : close]
        return f"{sample[: brace + 1]}{inner + ',' if inner else ''}{label}{sample[close:]}"
    return f"{sample[:space]}{{{label}}}{sample[space:]}"


def label_replicas(pages: Mapping[str, str]) -> str:
    """pages: replica id -> that replica's /metrics text. Returns the merged text."""
    families: dict[str, _Family] = {}
    for replica, text in pages.items():
        label = f'replica="{replica}"'
        current: _Family | None = None
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                current = families.setdefault(name, _Family())
                if line not in current.header:
                    current.header.append(line)
            elif not line.startswith("#"):
                if current is None:  # a sample without a header: a family of its own
                    current = families.setdefault(line.split("{", 1)[0].split(" ", 1)[0], _Family())
                current.samples.append(_with_label(line, label))
    lines: list[str] = []
    for fam in families.values():
        lines += fam.header + fam.samples
    return "\n".join(lines) + "\n" if lines else ""
