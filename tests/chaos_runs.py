"""A chaos profile run from a test: the seed random unless TIDE_CHAOS_SEED is set, and the whole log
returned as the story a failing assertion shows (with how to replay the seed)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from services.chaos.profiles import PROFILES
from services.chaos.run import Report, run
from services.settings import StackSettings


def run_profile(settings: StackSettings, profile: str, work_dir: Path) -> tuple[Report, str]:
    seed = int(os.environ.get("TIDE_CHAOS_SEED") or random.SystemRandom().randrange(1, 1_000_000))
    log: list[str] = []
    report = run(settings, PROFILES[profile], seed, work_dir, say=log.append)
    story = "\n".join([*log, *report.failures, f"seed {seed}: replay with TIDE_CHAOS_SEED={seed}"])
    print(story)  # shown with -s
    return report, story
