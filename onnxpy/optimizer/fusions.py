"""Fusions applied at ORT_ENABLE_EXTENDED and above."""

from __future__ import annotations

FUSION_PASSES: list = []
