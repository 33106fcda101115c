"""What people read, drawn from data the rest of gpuval returns: the accept run's console tables, JUnit
XML and HTML report, the inventory, the monitor's dashboard, a fine-tune's evaluation. With gpuval.cli, the
only place rich is imported (tests/test_structure.py)."""
