"""The page of calls at ``/ui/``: what is in flight, each task's turns and their cache
misses, the calls, the models and their servers. Read-only; it shows what the call log
holds and never a key, a header value or a message."""
