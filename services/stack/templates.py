"""Fill `${NAME}` placeholders in the config templates kept beside each service.

Only upper-case names are placeholders; `${env:X}` and `${file:...}` are Kafka
Connect config-provider references and pass through untouched.
"""

from __future__ import annotations

import re
from pathlib import Path

_PLACEHOLDER = re.compile(r"\$\{([A-Z0-9_]+)\}")


def substitute(text: str, values: dict[str, str], source: str = "template") -> str:
    """Replace every placeholder; an unknown name is an error, not an empty string."""
    missing = sorted({name for name in _PLACEHOLDER.findall(text) if name not in values})
    if missing:
        raise KeyError(f"{source} uses placeholders with no value: {', '.join(missing)}")
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], text)


def render(template: Path, target: Path, values: dict[str, str]) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(substitute(template.read_text(), values, str(template)))
    return target
