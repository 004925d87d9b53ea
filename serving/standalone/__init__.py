"""Modules that import nothing but the standard library, so that an engine running from its
own environment can load them too: the supervisor puts this folder (alone) on vLLM's import
path. ``devguard``: the guard of the weight-reload endpoints (:mod:`serving.standalone.devguard`).
"""
