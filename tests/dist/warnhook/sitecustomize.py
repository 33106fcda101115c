"""Test hook, put on PYTHONPATH by tests/conftest.py's tiny_cpu_run only: a library that warns.

Where GPUVAL_TEST_LIBRARY_WARNING=1, peft's get_peft_model raises a FutureWarning and logs a warning through
peft's logger each time it is called, as libraries do for a deprecated argument: the run's console must
show neither and its third_party.log must hold both (tests/finetune/test_finetune_quiet.py). The real
libraries' own warnings come and go with their releases (peft 0.21 raised one through transformers, 0.22
none), so the test makes its own. Anywhere else it imports nothing.
"""

import os

if os.environ.get("GPUVAL_TEST_LIBRARY_WARNING") == "1":
    import importlib.abc
    import importlib.machinery
    import sys

    MESSAGE = "get_peft_model's old argument is deprecated (raised by tests/dist/warnhook)"

    def _patch(peft):
        original = peft.get_peft_model

        def get_peft_model(*args, **kwargs):
            import logging
            import warnings

            warnings.warn(MESSAGE, FutureWarning, stacklevel=2)
            logging.getLogger("peft").warning("peft logger: %s", MESSAGE)
            return original(*args, **kwargs)

        peft.get_peft_model = get_peft_model

    class _Loader(importlib.abc.Loader):
        def __init__(self, inner):
            self.inner = inner

        def create_module(self, spec):
            return self.inner.create_module(spec)

        def exec_module(self, module):
            self.inner.exec_module(module)
            _patch(module)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != "peft":
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
            return spec

    sys.meta_path.insert(0, _Finder())
