"""Playwright browser environment, action grammar + parser, prompt builder, policies, async engine.

Built by the live-rollouts issue; imports only ``warehouse``.
"""
