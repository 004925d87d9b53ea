"""Bundled local websites with server-side state, and task suites (rubrics, checkers, references).

Built by the bundled-web issue; imports nothing from webloop but ``warehouse`` records.
"""
