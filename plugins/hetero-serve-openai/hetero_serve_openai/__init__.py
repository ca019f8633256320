"""hetero-infer's OpenAI-compatible HTTP server:
the ``serve`` command and the ``local_engine`` and ``command_bridge`` backends.

The web stack loads only when a server (or a backend) is built: ``hetero-infer``
loads this plugin for every engine it builds.
"""
