"""Test hook, put on PYTHONPATH by tests/test_verdict_last.py and tests/test_soak.py: trouble or delay while
rank 0 writes reports.

Active only in rank 0 (or a process without RANK) and only where the test sets one of:
- GPUVAL_TEST_HOLD_REPORT=FILE: write_html writes this process's pid to FILE, then sleeps (the test kills it);
- GPUVAL_TEST_FAIL_REPORT=1: write_html fails as a full disk does (OSError ENOSPC);
- GPUVAL_TEST_FAIL_HISTORY=1: recording the run fails as a read-only database does (sqlite3.OperationalError);
- GPUVAL_TEST_SLOW_SOAK_SUMMARY=SECONDS: write_html of a soak's summary (a result holding inventory.soak)
  takes SECONDS longer, as the figures of a soak of many series do (or any report on a loaded machine).
Anywhere else it imports nothing.
"""

import os

_hold = os.environ.get("GPUVAL_TEST_HOLD_REPORT")
_fail_report = os.environ.get("GPUVAL_TEST_FAIL_REPORT") == "1"
_fail_history = os.environ.get("GPUVAL_TEST_FAIL_HISTORY") == "1"

if os.environ.get("RANK", "0") == "0" and (_hold or _fail_report):
    import errno
    import time

    import gpuval.report.html as _html

    def _write_html(result, path):
        if _fail_report:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        with open(_hold, "w") as marker:
            marker.write(str(os.getpid()))
        time.sleep(600)

    _html.write_html = _write_html

if os.environ.get("RANK", "0") == "0" and _fail_history:
    import sqlite3

    import gpuval.history as _history

    def _record(path, result):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    _history.record = _record

_slow_summary = os.environ.get("GPUVAL_TEST_SLOW_SOAK_SUMMARY")
if os.environ.get("RANK", "0") == "0" and _slow_summary:
    import time

    import gpuval.report.html as _html

    _write_html_now = _html.write_html

    def _write_html_slowly(result, path):
        if "soak" in result.inventory:
            time.sleep(float(_slow_summary))
        return _write_html_now(result, path)

    _html.write_html = _write_html_slowly
