"""Prefect only: ``@flow``/``@task`` wrappers that call the stages (:mod:`stages`), the
deployments, Dask scale-out and the Prefect settings.

Importing this package configures Prefect for offline use (:func:`flows.prefect_env.configure`)
and tells the stages how to name the Prefect flow run a stage runs in. It is the only package
that imports prefect; the CLI imports it only in the commands that run flows.
"""

from flows import prefect_env as _prefect_env
from flows.artifacts import flow_run_id as _flow_run_id
from stages import runs as _runs

_prefect_env.configure()
_runs.orchestrator_run = _flow_run_id
