"""What a viewer of the page of calls costs the calls: ``python -m bench.ui_fanout``."""
