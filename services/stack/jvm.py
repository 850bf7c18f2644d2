"""How JVM services are launched: one place for the java binary check and common flags."""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache

from services.stack.service import StackError

MIN_JAVA = 17


@cache
def java() -> str:
    binary = shutil.which("java")
    if binary is None:
        raise StackError(f"Java {MIN_JAVA}+ not found: install openjdk-{MIN_JAVA}-jdk-headless (run `make setup`)")
    out = subprocess.run([binary, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < MIN_JAVA:
        raise StackError(f"Java {MIN_JAVA}+ is needed, found: {out.splitlines()[0] if out else 'unknown'}")
    return binary


def command(
    *, heap: str, classpath: list[str], main: str, props: dict[str, str] | None = None, args: list[str] | None = None
) -> list[str]:
    """A foreground java argv with a fixed heap (Xms = Xmx: no surprise growth on a shared machine)."""
    flags = [f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true"]
    flags += [f"-D{key}={value}" for key, value in (props or {}).items()]
    return [java(), *flags, "-cp", ":".join(classpath), main, *(args or [])]
