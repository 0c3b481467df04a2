"""Fixtures of the pipeline tests: a user's own data (see ``user_data.py``)."""

from __future__ import annotations

import pytest
from user_data import write_user_data


@pytest.fixture
def user_data(tmp_path):
    """``tmp_path/my_data/{train,validation,test}.jsonl`` (48/8/8 rows)."""
    return write_user_data(tmp_path / "my_data")
