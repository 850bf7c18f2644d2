"""Render the config templates kept beside each service (`${NAME}` placeholders)."""

from __future__ import annotations

import re
from pathlib import Path

_PLACEHOLDER = re.compile(r"\$\{([A-Z0-9_]+)\}")


def render(template: Path, target: Path, values: dict[str, str]) -> Path:
    """Write template with every `${NAME}` replaced; an unknown name is an error, not an empty string."""
    text = template.read_text()
    missing = sorted({name for name in _PLACEHOLDER.findall(text) if name not in values})
    if missing:
        raise KeyError(f"{template} uses placeholders with no value: {', '.join(missing)}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(_PLACEHOLDER.sub(lambda match: values[match.group(1)], text))
    return target
