"""Third-party warnings and logging go to the run's log file, one per rank, and not to the console."""

from __future__ import annotations

import logging
import subprocess
import sys

from gpuval.quiet import _LOGGERS


def test_warnings_and_library_logging_land_in_the_file_not_on_stderr(tmp_path):
    script = (
        "import logging, sys, warnings\n"
        "from gpuval.quiet import route_third_party_output\n"
        f"path = route_third_party_output({str(tmp_path)!r}, rank=int(sys.argv[1]))\n"
        "warnings.warn('old API, use the new one', FutureWarning)\n"
        "logging.getLogger('transformers.modeling_utils').warning('Some weights were not initialized')\n"
        "print('gpuval line', file=sys.stderr)\n"
        "print(path)\n"
    )
    for rank, name in ((0, "third_party.log"), (3, "third_party.rank3.log")):
        proc = subprocess.run([sys.executable, "-c", script, str(rank)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.strip() == "gpuval line"  # nothing else reached the console
        assert proc.stdout.strip() == str(tmp_path / name)
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert "FutureWarning: old API, use the new one" in text
        assert "transformers.modeling_utils WARNING: Some weights were not initialized" in text


def test_transformers_loaded_after_the_routing_is_quiet_too_and_not_loaded_by_it(tmp_path):
    """accept and bench ranks route before anything loads transformers, and most never load it: the routing
    must not load it (a second of CPU per rank), yet its handler and bars must follow once something does."""
    script = (
        "import sys\n"
        "from gpuval.quiet import route_third_party_output\n"
        f"route_third_party_output({str(tmp_path)!r})\n"
        "assert 'transformers' not in sys.modules and 'huggingface_hub' not in sys.modules\n"
        "from transformers.utils import logging\n"
        "logging.get_logger('transformers.modeling_utils').warning('Some weights were not initialized')\n"
        "for _ in logging.tqdm(range(3), desc='Loading weights'):\n"
        "    pass\n"
        "print('gpuval line', file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "gpuval line"  # no warning, no loading bar on the console
    text = (tmp_path / "third_party.log").read_text(encoding="utf-8")
    assert "transformers.modeling_utils WARNING: Some weights were not initialized" in text


def test_a_second_call_moves_the_output_without_doubling_it(tmp_path):
    from gpuval.quiet import route_third_party_output

    try:
        route_third_party_output(tmp_path / "a")
        route_third_party_output(tmp_path / "b")
        logging.getLogger("peft").warning("once")
        for handler in logging.getLogger("peft").handlers:
            handler.flush()
        assert not (tmp_path / "a" / "third_party.log").exists()
        assert (tmp_path / "b" / "third_party.log").read_text(encoding="utf-8").count("once") == 1
    finally:
        logging.captureWarnings(False)
        for name in _LOGGERS:
            logger = logging.getLogger(name)
            for handler in [h for h in logger.handlers if h.get_name() == "gpuval-third-party"]:
                logger.removeHandler(handler)
                handler.close()
            logger.propagate = True


def test_a_lookup_before_the_import_does_not_use_up_the_after_import_hook(tmp_path):
    """transformers asks `importlib.util.find_spec("peft")` (is_peft_available) long before anything imports
    peft, and accelerate does the same for DeepSpeed: the quiet switch must still run when the module is
    really imported, once, and the finder must leave sys.meta_path then."""
    package = tmp_path / "gpuval_probe_target"
    package.mkdir()
    (package / "__init__.py").write_text("LOADS = globals().get('LOADS', 0) + 1\n", encoding="utf-8")
    script = (
        "import importlib, importlib.util, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from gpuval.quiet import _AfterImport, _after_import\n"
        "calls = []\n"
        "loads = lambda: sys.modules['gpuval_probe_target'].LOADS\n"
        "_after_import('gpuval_probe_target', lambda: calls.append(loads()))\n"
        "_after_import('gpuval_probe_target', lambda: calls.append('twice'))  # asked again: still once\n"
        "assert importlib.util.find_spec('gpuval_probe_target') is not None  # a lookup, no import\n"
        "assert calls == [] and 'gpuval_probe_target' not in sys.modules, calls\n"
        "import gpuval_probe_target\n"
        "assert calls == [1], calls\n"
        "assert not any(isinstance(f, _AfterImport) for f in sys.meta_path)\n"
        "del sys.modules['gpuval_probe_target']\n"
        "import gpuval_probe_target\n"
        "assert calls == [1], calls\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
