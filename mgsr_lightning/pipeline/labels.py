"""How result tables name methods and pairs, read from the configs: a method's ``_label_``
(``configs/methods/<method>.yaml``) and a pair's ``_title_`` (``configs/<pair>/base.yaml``)."""

from __future__ import annotations

from mgsr_lightning.cli.config_files import composed_file
from mgsr_lightning.pipeline.paths import CONFIGS, composed_config

TEACHER = "teacher"
TEACHER_LABEL = "Teacher"
# a table's rows: the teacher, the methods in the order of the paper's Table 1, the ablations and analyses
TABLE_ORDER = (
    TEACHER, "sft", "kd", "seqkd", "rkl", "jsd", "tvd", "imitkd", "minillm", "gkd", "distillm", "abkd", "mgsr",
    "mgsr_paper", "mgsr_base", "mgsr_scrg", "mgsr_scrg_dac", "mgsr_scrg3", "mgsr_scrg5", "mgsr_noscrg_adaptive",
    "mgsr_noscrg_mixed", "mgsr_noscrg_on_policy", "mgsr_scrg_mixed", "mgsr_scrg_on_policy",
)


def method_label(method: str) -> str:
    """The row label of ``method`` (its ``_label_``); the name itself for a method without a config or label."""
    if method == TEACHER:
        return TEACHER_LABEL
    path = CONFIGS / "methods" / f"{method}.yaml"
    return str(composed_file(path).get("_label_", method)) if path.is_file() else method


def pair_title(pair: str) -> str:
    """What a table's heading calls ``pair`` (its base's ``_title_``); the name itself without one."""
    return str(composed_config(pair).get("_title_", pair))
