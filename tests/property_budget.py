"""How many examples a property test draws under the loaded Hypothesis profile (tests/conftest.py):
all of them under "ci", as CI runs the tests; fewer under "quick", the README's test command."""

from hypothesis import settings


def examples(full: int, quick: int) -> int:
    return full if settings.get_current_profile_name() == "ci" else quick
