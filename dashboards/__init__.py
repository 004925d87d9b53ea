"""Streamlit multipage app: pages are UI only, data comes through warehouse queries.

Imports only ``warehouse`` (and pure helpers); the only package that imports streamlit.
"""
