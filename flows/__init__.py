"""Prefect flows (thin sequencing of library code) and the ``webloop`` CLI.

Convention: each stage ships ``flows/<stage>.py`` with one ``@flow`` whose ``@task``s call library
code and hold the retries; its CLI command runs that flow. Without ``PREFECT_API_URL`` a flow
runs against a temporary local Prefect server (see :mod:`flows.prefect_env`).
This is the only package that imports prefect.
"""
