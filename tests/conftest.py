"""Shared by the test suite: the `slow` and `model` markers (`model` loads the real Gemma 3 270M); hypothesis
derandomized (the same examples on every run, so a random failure never blocks a landing;
`HYPOTHESIS_PROFILE=explore` draws fresh examples by hand); and, at the end of a run, one line per group of skipped
tests saying why and what went untested."""
import os
from collections import defaultdict

try:
    from hypothesis import settings as _hyp_settings
except ImportError: _hyp_settings = None      # hypothesis is a dev requirement; the suites that use it need it
else:
    _hyp_settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
    _hyp_settings.register_profile("explore", derandomize=False)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))   # derandomized unless asked otherwise

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "model: loads the real default model (Gemma 3 270M, converted on first use)")

def _skip_reason(report)->str:
    "The reason pytest recorded for a skipped test (`pytest.skip`'s 'Skipped: ' prefix dropped)."
    lr = report.longrepr
    reason = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason

def pytest_terminal_summary(terminalreporter, exitstatus, config):
    "One line per group of skipped tests (same file, same reason): how many, the reason, which tests."
    groups = defaultdict(list)
    for rep in terminalreporter.stats.get("skipped", []):
        path = rep.nodeid.split("::")[0] or (rep.longrepr[0] if isinstance(rep.longrepr, tuple) else "?")
        name = rep.nodeid.split("::", 1)[1] if "::" in rep.nodeid else "(the whole module)"
        groups[(path, _skip_reason(rep))].append(name)
    if not groups: return
    terminalreporter.section("skipped: why, and what was not tested", sep="-")
    for (path, reason), names in sorted(groups.items()):
        shown = ", ".join(names[:3]) + (f", ... ({len(names) - 3} more)" if len(names) > 3 else "")
        terminalreporter.write_line(f"{len(names)} skipped in {path}: {reason} [{shown}]")
