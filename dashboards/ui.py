"""Small UI helpers shared by the pages: error boundaries and the "nothing yet" states.

Page content (instructions, answers, page text, model output) is untrusted: it is shown with
``st.text`` / ``st.code`` / ``st.dataframe``, never as markdown or HTML.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import duckdb
import streamlit as st

from dashboards import data
from warehouse.blobs import BlobError
from warehouse.connection import NoWarehouseError, WarehouseError

_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+\-.!<>|~$])")


def md_escape(text: object) -> str:
    """``text`` with Markdown's special characters escaped, for messages (``st.error`` and
    friends render Markdown) that quote ids, paths or errors."""
    return _MARKDOWN.sub(r"\\\1", str(text))


@contextlib.contextmanager
def guarded(what: str) -> Iterator[None]:
    """Show a failure inside the block as a message on the page (never a traceback): no
    warehouse yet, a warehouse or query error, a blob that cannot be read."""
    try:
        yield
    except NoWarehouseError as exc:
        st.info(f"No warehouse yet. {md_escape(exc)}")
    except (WarehouseError, duckdb.Error, BlobError, OSError, ValueError) as exc:
        st.error(f"{what} could not be shown: {type(exc).__name__}: {md_escape(exc)}")


def require_warehouse() -> int:
    """The current snapshot id; stops the page with a message when there is no warehouse."""
    try:
        return data.snapshot()
    except NoWarehouseError as exc:
        st.info(f"No warehouse yet. {md_escape(exc)}")
        st.stop()
    except (WarehouseError, duckdb.Error) as exc:
        st.error(f"The warehouse cannot be read: {md_escape(exc)}")
        st.stop()
    raise AssertionError("unreachable")


def nothing_yet(what: str, how: str) -> None:
    """The empty state of a stage: what is missing and the command that makes it."""
    st.info(f"No {what} yet. {how}")


def set_param(name: str, value: object | None) -> None:
    """Keep a deep-link query parameter in step with the page (None removes it); a value the
    page set itself is not taken for a new deep link on the next run (:func:`deep_link`)."""
    if value is None:
        if name in st.query_params:
            del st.query_params[name]
        st.session_state.pop(f"_linked_{name}", None)
        return
    st.session_state[f"_linked_{name}"] = str(value)
    if st.query_params.get(name) != str(value):
        st.query_params[name] = str(value)


def deep_link(name: str, options: list[str], state_key: str) -> tuple[list[str], bool]:
    """Select the option named by query parameter ``name`` when it is a new deep link (not the
    value the page set itself): it is added to ``options`` if a filter left it out, and put in
    ``st.session_state[state_key]``. Otherwise keep the current selection if it is still an
    option, else select the first. Returns (options, whether a new link was followed)."""
    wanted = st.query_params.get(name)
    new = wanted is not None and wanted != st.session_state.get(f"_linked_{name}")
    if new:
        st.session_state[f"_linked_{name}"] = wanted
        if wanted not in options:
            options = [wanted, *options]
        st.session_state[state_key] = wanted
    elif options and st.session_state.get(state_key) not in options:
        st.session_state[state_key] = options[0]
    return options, new
